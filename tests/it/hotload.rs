//! Hot load: swapping plugin versions under a running pipeline, at batch boundaries,
//! with state migration, refusal of versions that cannot read the state, rollback of a
//! version that fails its first batch, and the file watcher (the admin endpoint is
//! `admin.rs`'s).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use groupstate::config::{PipelineConfig, Stream};
use groupstate::{Candidate, ManualClock, Pipeline};
use groupstate_tests::{cache_dir, plugins};

/// A pipeline of the counter plugin over a file the test appends to.
pub(crate) struct Harness {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) pipeline: Pipeline,
    pub(crate) sent: HashMap<String, u64>,
    next_line: u64,
}

impl Harness {
    pub(crate) fn new(plugin: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("in.jsonl"), "").unwrap();
        let mut config = PipelineConfig::new(
            PathBuf::from(plugin),
            Stream::File(dir.path().join("in.jsonl")),
            Stream::File(dir.path().join("out.jsonl")),
            dir.path().join("state"),
            "k".into(),
        );
        config.batch_events_max = 40;
        config.durable_commits = false;
        config.cache_dir = Some(cache_dir());
        let pipeline = Pipeline::open(config, Arc::new(ManualClock::new(1_000))).unwrap();
        Self { dir, pipeline, sent: HashMap::new(), next_line: 0 }
    }

    /// Appends `n` events over 7 keys, with `extra` JSON fields.
    pub(crate) fn feed(&mut self, n: u64, extra: &str) {
        let mut text = String::new();
        for _ in 0..n {
            let key = format!("k{}", (self.next_line * 5 + self.next_line / 3) % 7);
            text.push_str(&format!("{{\"k\":\"{key}\",\"n\":{}{extra}}}\n", self.next_line));
            *self.sent.entry(key).or_default() += 1;
            self.next_line += 1;
        }
        let mut file = std::fs::OpenOptions::new().append(true).open(self.dir.path().join("in.jsonl")).unwrap();
        file.write_all(text.as_bytes()).unwrap();
    }

    /// Runs batches until the input is consumed; returns how many.
    pub(crate) fn drain(&mut self) -> u64 {
        let mut batches = 0;
        while self.pipeline.next_batch().unwrap().is_some() {
            batches += 1;
        }
        batches
    }

    fn offer(&self, plugin: &str) {
        let runtime = self.pipeline.runtime().unwrap();
        let loaded = runtime.load(Path::new(plugin), &[]).unwrap();
        self.pipeline.swap_sender().send(Candidate { plugin: Box::new(loaded), origin: plugin.into() }).unwrap();
    }

    pub(crate) fn outputs(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.dir.path().join("out.jsonl")).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// The last count each key reported (v1's `count` or v2's `total`).
    pub(crate) fn last_counts(&self) -> HashMap<String, u64> {
        let mut last = HashMap::new();
        for v in self.outputs() {
            let n = v.get("count").or_else(|| v.get("total")).and_then(serde_json::Value::as_u64).unwrap();
            last.insert(v["key"].as_str().unwrap().to_owned(), n);
        }
        last
    }
}

#[test]
fn swap_v1_to_v2_migrates_state_and_switches_at_one_boundary_then_refuses_v3() {
    let mut h = Harness::new(plugins::COUNTER_V1);
    h.feed(200, "");
    assert_eq!(h.drain(), 5);
    let v1_lines = h.outputs().len();
    let swap_batch = 5;

    h.offer(plugins::COUNTER_V2);
    h.feed(160, ""); // input keeps flowing while the swap waits for the boundary
    assert_eq!(h.drain(), 4);
    let outputs = h.outputs();
    assert!(outputs[..v1_lines].iter().all(|v| v["v"] == 1), "v1 lines before the boundary");
    assert!(outputs[v1_lines..].iter().all(|v| v["version"] == 2), "only v2 lines after it");
    // Migrated state: v2 continues v1's counts, so every event is counted exactly once.
    assert_eq!(h.last_counts(), h.sent);
    let status = h.pipeline.plugin_status().lock().unwrap().clone();
    assert_eq!(status.swaps.len(), 1);
    assert_eq!(status.swaps[0].0, swap_batch);
    assert!(status.running.contains("counter 2.0.0"), "{status:?}");
    assert!(h.pipeline.store().iter_keys().all(|e| e.unwrap().1.schema_version == 2));

    // v3 has a new state schema and no migration: refused, v2 keeps running.
    h.offer(plugins::COUNTER_V3);
    h.feed(40, "");
    assert_eq!(h.drain(), 1);
    let status = h.pipeline.plugin_status().lock().unwrap().clone();
    assert!(status.running.contains("counter 2.0.0"), "{status:?}");
    let refusal = status.last_refusal.unwrap_or_default();
    assert!(refusal.contains("refused") && refusal.contains("state schema 2"), "{refusal}");
    assert!(h.outputs().last().unwrap()["version"] == 2);
    assert_eq!(h.last_counts(), h.sent);
}

#[test]
fn a_version_that_traps_on_its_first_batch_is_rolled_back() {
    let mut h = Harness::new(plugins::COUNTER_V1);
    h.feed(40, "");
    h.drain();
    // The probe plugin panics on these events: under --on-error fail the swap is rolled
    // back and the same batch runs again with v1; nothing is lost or doubled.
    h.offer(plugins::PROBE);
    h.feed(40, r#","ops":["panic"]"#);
    assert_eq!(h.drain(), 1);
    let status = h.pipeline.plugin_status().lock().unwrap().clone();
    assert!(status.running.contains("counter 1.0.0"), "{status:?}");
    assert!(status.last_refusal.unwrap_or_default().contains("rolled back"));
    assert!(h.outputs().iter().all(|v| v["v"] == 1), "no output of the failed version");
    assert_eq!(h.last_counts(), h.sent);
}

#[test]
fn fifty_swaps_under_load_lose_nothing() {
    let mut h = Harness::new(plugins::COUNTER_V1);
    for i in 0..50 {
        h.offer(if i % 2 == 0 { plugins::COUNTER_V2 } else { plugins::COUNTER_V1 });
        h.feed(60, "");
        assert_eq!(h.drain(), 2);
        assert_eq!(h.last_counts(), h.sent, "after swap {}", i + 1);
    }
    let status = h.pipeline.plugin_status().lock().unwrap().clone();
    assert_eq!(status.swaps.len(), 50);
    assert_eq!(status.last_refusal, None);
}

#[test]
fn watcher_reloads_when_the_plugin_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plugin.wasm");
    std::fs::copy(plugins::COUNTER_V1, &path).unwrap();
    let mut h = Harness::new(path.to_str().unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let v1 = std::fs::read(&path).unwrap();
    groupstate::reload::watch(
        path.clone(),
        Vec::new(),
        h.pipeline.runtime().unwrap(),
        h.pipeline.swap_sender(),
        groupstate::plugin::sha256_hex(&v1),
        10,
        stop.clone(),
    )
    .unwrap();
    h.feed(40, "");
    h.drain();
    std::fs::copy(plugins::COUNTER_V2, &path).unwrap();
    let mut swapped = false;
    for _ in 0..500 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        h.feed(1, "");
        h.drain();
        if h.pipeline.plugin_status().lock().unwrap().running.contains("2.0.0") {
            swapped = true;
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(swapped, "the watcher did not swap in the new file");
    h.feed(10, "");
    h.drain();
    assert_eq!(h.outputs().last().unwrap()["version"], 2);
    assert_eq!(h.last_counts(), h.sent);
}
