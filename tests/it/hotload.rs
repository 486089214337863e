//! Hot load: swapping plugin versions under a running pipeline, at batch boundaries,
//! with state migration, refusal of versions that cannot read the state, rollback of a
//! version that fails its first batch, and the file watcher (the admin endpoint is
//! `admin.rs`'s).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use groupstate::config::{PipelineConfig, Stream};
use groupstate::{Candidate, Clock, ManualClock, Pipeline, PluginStatus, SystemClock};
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
        Self::with_clock(plugin, Arc::new(ManualClock::new(1_000)), |_| {})
    }

    /// A harness whose pipeline runs on `clock`, its configuration changed by `adjust`.
    fn with_clock(plugin: &str, clock: Arc<dyn Clock>, adjust: impl FnOnce(&mut PipelineConfig)) -> Self {
        Self::opened_by(plugin, adjust, |config| Pipeline::open(config, clock).unwrap())
    }

    /// A harness whose pipeline `open` opens from its configuration (of `plugin`,
    /// changed by `adjust`).
    fn opened_by(
        plugin: &str,
        adjust: impl FnOnce(&mut PipelineConfig),
        open: impl FnOnce(PipelineConfig) -> Pipeline,
    ) -> Self {
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
        // The tests append to the input while the pipeline reads it. Followed, a line
        // read half-written waits for the rest; a file read to its end takes its last
        // line as it is, and a write that the reader meets half-done (one crossing a
        // page of the page cache) would be a bad record.
        config.follow = true;
        config.durable_commits = false;
        config.cache_dir = Some(cache_dir());
        adjust(&mut config);
        let pipeline = open(config);
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

    /// Runs batches until everything fed is committed; returns how many ran.
    pub(crate) fn drain(&mut self) -> u64 {
        drain(&mut self.pipeline, &self.dir.path().join("in.jsonl"))
    }

    fn offer(&self, plugin: &str) {
        self.offer_with(plugin, &[]);
    }

    fn offer_with(&self, plugin: &str, params: &[(&str, &str)]) {
        let runtime = self.pipeline.runtime().unwrap();
        let params: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let loaded = runtime.load(Path::new(plugin), &params).unwrap();
        self.pipeline.swap_sender().send(Candidate { plugin: Box::new(loaded), origin: plugin.into() }).unwrap();
    }

    fn status(&self) -> PluginStatus {
        self.pipeline.plugin_status().lock().unwrap().clone()
    }

    fn settle(&mut self) {
        settle(&mut self.pipeline);
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

/// Runs batches until the committed input offset reaches the end of `input` as it is
/// now; returns how many ran. The input is read ahead on a thread of its own, so a
/// boundary can find nothing new yet while lines are still on their way.
pub(crate) fn drain(pipeline: &mut Pipeline, input: &Path) -> u64 {
    let fed = std::fs::metadata(input).unwrap().len();
    let mut batches = 0;
    let mut idle = 0;
    while pipeline.checkpoint().input_offset < fed {
        if pipeline.next_batch().unwrap().is_some() {
            batches += 1;
            idle = 0;
        } else {
            idle += 1;
            assert!(idle < 10_000, "no batch took the input past byte {} of {fed}", pipeline.checkpoint().input_offset);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    batches
}

/// Polls batch boundaries (running any batch that has input) until no candidate is
/// queued or under its migration check: the check runs on a thread of its own.
pub(crate) fn settle(pipeline: &mut Pipeline) {
    let checking = |p: &Pipeline| p.plugin_status().lock().unwrap().checking.is_some();
    for _ in 0..60_000 {
        pipeline.next_batch().unwrap();
        if !checking(pipeline) {
            // A candidate still in the queue is taken at this boundary.
            pipeline.next_batch().unwrap();
            if !checking(pipeline) {
                return;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("the migration check did not end within a minute");
}

#[test]
fn swap_v1_to_v2_migrates_state_and_switches_at_one_boundary_then_refuses_v3() {
    let mut h = Harness::new(plugins::COUNTER_V1);
    h.feed(200, "");
    assert_eq!(h.drain(), 5);
    let v1_lines = h.outputs().len();
    let swap_batch = 5;

    h.offer(plugins::COUNTER_V2);
    // v2 must migrate the stored counts: it is checked off the processing path and
    // swapped in at the first boundary after its check passed.
    h.settle();
    h.feed(160, "");
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
    h.settle();
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
    // The swap and its rollback, as the next batch's report (and so the swap metric)
    // counts them.
    assert_eq!(status.swaps.len(), 2, "{:?}", status.swaps);
    h.feed(10, "");
    let report = loop {
        if let Some(report) = h.pipeline.next_batch().unwrap() {
            break report;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert_eq!(report.plugin_swaps, 2);
}

#[test]
fn fifty_swaps_under_load_lose_nothing() {
    let mut h = Harness::new(plugins::COUNTER_V1);
    for i in 0..50 {
        h.offer(if i % 2 == 0 { plugins::COUNTER_V2 } else { plugins::COUNTER_V1 });
        h.feed(60, "");
        assert_eq!(h.drain(), 2);
        h.settle();
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
    let v1 = std::fs::read(&path).unwrap();
    let watcher = groupstate::reload::watch(
        path.clone(),
        Arc::new(h.pipeline.swap_target().unwrap()),
        groupstate::plugin::sha256_hex(&v1),
        10,
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
    drop(watcher);
    assert!(swapped, "the watcher did not swap in the new file");
    h.feed(10, "");
    h.drain();
    assert_eq!(h.outputs().last().unwrap()["version"], 2);
    assert_eq!(h.last_counts(), h.sent);
}

/// Makes each migration of counter-v2 take tens of milliseconds (far under the CPU
/// limit of a call).
const MIGRATE_SPIN: &str = "150000000";

/// What a hot swap to a counter-v2 whose migrations are slow cost the pipeline, while
/// the test keeps feeding it and running batches.
#[derive(Debug)]
struct SwapTimes {
    /// From the offer to the swap.
    until_swap_ns: u64,
    /// Batches that ran meanwhile, with the old version.
    batches_meanwhile: u64,
    /// The longest of those batches (boundary included).
    longest_meanwhile_ns: u64,
    /// The batch that swapped: v2 migrates the keys it touches on first touch.
    swap_batch_ns: u64,
}

fn swap_with_a_slow_migration(h: &mut Harness, clock: &SystemClock) -> SwapTimes {
    h.offer_with(plugins::COUNTER_V2, &[("migrate_spin", MIGRATE_SPIN)]);
    let started = clock.monotonic_ns();
    let (mut longest_meanwhile_ns, mut batches_meanwhile) = (0, 0);
    loop {
        assert!(clock.monotonic_ns() - started < 60_000_000_000, "no swap within a minute: {:?}", h.status());
        h.feed(7, "");
        let before = clock.monotonic_ns();
        let ran = h.pipeline.next_batch().unwrap().is_some();
        let took = clock.monotonic_ns() - before;
        assert!(h.status().last_refusal.is_none(), "{:?}", h.status());
        if h.status().running.contains("2.0.0") {
            let until_swap_ns = clock.monotonic_ns() - started;
            // The input thread may have read ahead before this feed: then the first
            // batch of v2 is the next one.
            let swap_batch_ns = if ran { took } else { time_next_batch(h, clock) };
            return SwapTimes { until_swap_ns, batches_meanwhile, longest_meanwhile_ns, swap_batch_ns };
        }
        batches_meanwhile += u64::from(ran);
        longest_meanwhile_ns = longest_meanwhile_ns.max(took);
    }
}

/// How long the next batch that has input takes.
fn time_next_batch(h: &mut Harness, clock: &SystemClock) -> u64 {
    h.feed(7, "");
    loop {
        let before = clock.monotonic_ns();
        if h.pipeline.next_batch().unwrap().is_some() {
            return clock.monotonic_ns() - before;
        }
    }
}

#[test]
fn the_running_version_offered_again_is_not_swapped_in_over_itself() {
    let mut h = Harness::new(plugins::COUNTER_V1);
    h.feed(200, "");
    h.drain();
    let slow = [("migrate_spin", MIGRATE_SPIN)];
    h.offer_with(plugins::COUNTER_V2, &slow);
    // The check starts at the next boundary, on a thread of its own.
    h.pipeline.next_batch().unwrap();
    assert!(h.status().checking.is_some(), "{:?}", h.status());
    // Offered again meanwhile, as a retry after `OfferError::Busy` does where the
    // version was still under its check.
    h.offer_with(plugins::COUNTER_V2, &slow);
    h.settle();
    let status = h.status();
    assert!(status.running.contains("counter 2.0.0"), "{status:?}");
    assert_eq!(status.swaps.len(), 1, "swapped in once, not again over itself: {status:?}");
    // The same component with other parameters is another version: it is swapped in.
    h.offer_with(plugins::COUNTER_V2, &[("migrate_spin", "1")]);
    h.settle();
    assert_eq!(h.status().swaps.len(), 2, "{:?}", h.status());
    h.feed(40, "");
    h.drain();
    assert_eq!(h.last_counts(), h.sent);
}

#[test]
fn a_slow_migration_is_checked_while_the_batches_go_on() {
    let clock = SystemClock;
    let mut h = Harness::with_clock(plugins::COUNTER_V1, Arc::new(clock), |_| {});
    h.feed(200, "");
    h.drain();
    let times = swap_with_a_slow_migration(&mut h, &clock);
    let ms = |ns: u64| ns / 1_000_000;
    eprintln!(
        "swap with a slow migration: {} ms until swapped, {} batches meanwhile, the longest {} ms; the swap batch {} ms",
        ms(times.until_swap_ns),
        times.batches_meanwhile,
        ms(times.longest_meanwhile_ns),
        ms(times.swap_batch_ns)
    );
    assert!(times.batches_meanwhile >= 3, "the batches stopped during the check: {times:?}");
    assert!(times.longest_meanwhile_ns * 4 < times.until_swap_ns, "a batch waited for the check: {times:?}");
    h.drain();
    assert_eq!(h.last_counts(), h.sent);
}

#[test]
fn a_migration_over_the_time_budget_is_refused() {
    let clock = SystemClock;
    let mut h = Harness::with_clock(plugins::COUNTER_V1, Arc::new(clock), |c| c.limits.migration_check_ms_max = 1);
    h.feed(200, "");
    h.drain();
    h.offer_with(plugins::COUNTER_V2, &[("migrate_spin", MIGRATE_SPIN)]);
    h.settle();
    let status = h.status();
    assert!(status.running.contains("counter 1.0.0"), "{status:?}");
    let refusal = status.last_refusal.unwrap_or_default();
    assert!(refusal.contains("over migration_check_ms_max (1 ms)"), "{refusal}");
    h.feed(7, "");
    h.drain();
    assert_eq!(h.last_counts(), h.sent);
}

/// A Kafka run's plugin versions without a broker: `PartitionPlugins` over file
/// pipelines that stand for partitions. A version offered is queued at every running
/// partition, each swapping at a boundary of its own after its own check; a partition
/// opened later opens with the newest version; a stopped one is offered nothing; a
/// component that does not load is refused everywhere; and a partition that runs the
/// offered version already is not offered it again.
#[test]
fn partition_plugins_reach_every_running_partition_and_open_later_ones_with_the_newest() {
    use groupstate::partitions::PartitionPlugins;
    use groupstate::{OfferError, SwapTarget, TargetStatus};

    let dir = tempfile::tempdir().unwrap();
    let mut config = PipelineConfig::new(
        PathBuf::from(plugins::COUNTER_V1),
        Stream::File(dir.path().join("unused.jsonl")),
        Stream::File(dir.path().join("unused-out.jsonl")),
        dir.path().join("unused-state"),
        "k".into(),
    );
    config.cache_dir = Some(cache_dir());
    let versions = Arc::new(PartitionPlugins::new(&config).unwrap());
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_000));
    let open = |partition: i32| {
        let mut membership = None;
        let h = Harness::opened_by(
            plugins::COUNTER_V1,
            |_| {},
            |config| {
                let (pipeline, m) = versions.open_pipeline(partition, config, clock.clone()).unwrap();
                membership = Some(m);
                pipeline
            },
        );
        (h, membership.unwrap())
    };
    let running = |versions: &PartitionPlugins| -> Vec<(i32, String)> {
        let TargetStatus::Partitions { partitions, .. } = versions.status() else { panic!("not partitions") };
        partitions.into_iter().map(|(p, s)| (p, s.running)).collect()
    };
    let (mut h0, _m0) = open(0);
    let (mut h1, m1) = open(1);
    for h in [&mut h0, &mut h1] {
        h.feed(80, "");
        h.drain();
    }

    let offered = versions.offer(Path::new(plugins::COUNTER_V2), "v2 for the test").unwrap();
    assert_eq!(offered.partitions, Some(vec![0, 1]));
    assert_eq!(offered.info.version, "2.0.0");
    // Partition 0 swaps at its boundary; partition 1, which has run no boundary since,
    // still runs v1.
    h0.settle();
    assert!(h0.status().running.contains("counter 2.0.0"), "{:?}", h0.status());
    assert!(h1.status().running.contains("counter 1.0.0"), "{:?}", h1.status());
    h1.settle();
    assert!(h1.status().running.contains("counter 2.0.0"), "{:?}", h1.status());

    // A partition opened now opens with v2 (swapping nothing).
    let (mut h2, _m2) = open(2);
    assert!(h2.status().running.contains("counter 2.0.0") && h2.status().swaps.is_empty(), "{:?}", h2.status());
    assert_eq!(running(&versions).len(), 3);

    // A stopped partition is offered nothing.
    drop(m1);
    let offered = versions.offer(Path::new(plugins::COUNTER_V1), "v1 again").unwrap();
    assert_eq!(offered.partitions, Some(vec![0, 2]));
    let TargetStatus::Partitions { newest, .. } = versions.status() else { panic!("not partitions") };
    assert_eq!(newest, "v1 again");

    // A component that does not load is refused, and queued nowhere.
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"not wasm").unwrap();
    let refused = versions.offer(&garbage, "garbage").unwrap_err();
    assert!(matches!(&refused, OfferError::Refused(why) if why.contains("not a WebAssembly file")), "{refused}");
    for h in [&mut h0, &mut h2] {
        h.settle();
        h.feed(40, "");
        h.drain();
        assert!(h.status().running.contains("counter 1.0.0"), "{:?}", h.status());
        assert_eq!(h.last_counts(), h.sent);
    }
    // v1 runs everywhere: offered again, it is queued nowhere.
    let offered = versions.offer(Path::new(plugins::COUNTER_V1), "v1 once more").unwrap();
    assert_eq!(offered.partitions, Some(vec![]));
    assert_eq!(h0.status().swaps.len(), 2);
}
