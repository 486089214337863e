//! 0.2 TTL through the pipeline, against a plain reimplementation of the WIT's TTL rules:
//! a random script over the keyed-probe's TTL variables (processing time and event
//! time, values, list elements and map entries), run in steps with the clock moved on
//! and the state dir reopened between them. Every call's view of its variables must
//! be the oracle's, and at the end the store must hold exactly the oracle's live
//! entries, each with one expiry index entry, and nothing expired.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use groupstate::keyed::unpack_entry;
use groupstate::state_keys::{self as sk, Entry};
use groupstate::{PipelineConfig, Stream, TimeoutKind};
use groupstate_tests::{cache_dir, plugins, run_and_inspect, store_contents};
use serde_json::{Value, json};

const NOW: i64 = 1_800_000_000_000;
/// The keyed-probe's TTL.
const TTL_MS: i64 = 1000;
const DELAY_MS: i64 = 500;

/// A small deterministic generator (the test must not depend on a seed source).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// One variable's entries in the oracle: value, list elements or map entries, each
/// with its expiry.
#[derive(Default, Clone)]
struct KeyModel {
    tv: Option<(String, i64)>,
    tl: Vec<(String, i64)>,
    tm: BTreeMap<String, (String, i64)>,
    pl: Vec<(String, i64)>,
    pm: BTreeMap<String, (String, i64)>,
}

/// A stored TTL entry as the test names it: (entry, value, (event time, expiry)).
type TtlEntry = (String, String, (bool, i64));

/// The oracle: the WIT's rules, written out plainly.
struct Oracle {
    keys: BTreeMap<String, KeyModel>,
    watermark: i64,
    max_ts: Option<i64>,
}

impl Oracle {
    fn live<T: Clone>(items: impl Iterator<Item = (T, i64)>, threshold: i64) -> Vec<T> {
        items.filter(|(_, expiry)| *expiry > threshold).map(|(t, _)| t).collect()
    }

    /// One batch of one line at processing time `now`: the report the probe must
    /// give, or `None` for a late record.
    fn batch(&mut self, now: i64, line: &Value) -> Option<Value> {
        let ts = line["ts"].as_i64().unwrap();
        let w = self.watermark;
        let result = if ts < w {
            None
        } else {
            let model = self.keys.entry(line["k"].as_str().unwrap().to_owned()).or_default();
            let event_write = ts.max(w);
            for op in line["ops"].as_array().unwrap() {
                let op = op.as_str().unwrap();
                let (name, arg) = op.split_once(':').unwrap_or((op, ""));
                let (k, v) = arg.split_once('=').unwrap_or((arg, ""));
                match name {
                    "tset" => model.tv = Some((arg.to_owned(), now + TTL_MS)),
                    "tclear" => model.tv = None,
                    "tappend" => model.tl.push((arg.to_owned(), event_write + TTL_MS)),
                    "tclearlist" => model.tl.clear(),
                    "tput" => drop(model.tm.insert(k.to_owned(), (v.to_owned(), event_write + TTL_MS))),
                    "tdel" => drop(model.tm.remove(arg)),
                    "pappend" => model.pl.push((arg.to_owned(), now + TTL_MS)),
                    "pput" => drop(model.pm.insert(k.to_owned(), (v.to_owned(), now + TTL_MS))),
                    other => panic!("the script has no op {other}"),
                }
            }
            let tl = Self::live(model.tl.iter().cloned(), w);
            Some(json!({
                "key": line["k"],
                "tv": model.tv.clone().filter(|(_, e)| *e > now).map(|(v, _)| v),
                "tl_len": tl.len(),
                "tl": tl,
                "tm": Self::live(model.tm.iter().map(|(k, (v, e))| ((k.clone(), v.clone()), *e)), w),
                "pl": Self::live(model.pl.iter().cloned(), now),
                "pm": Self::live(model.pm.iter().map(|(k, (v, e))| ((k.clone(), v.clone()), *e)), now),
            }))
        };
        if result.is_some() {
            // A late record moves nothing.
            self.max_ts = self.max_ts.max(Some(ts));
        }
        if let Some(max) = self.max_ts {
            self.watermark = self.watermark.max(max - DELAY_MS);
        }
        result
    }

    /// The store entries the oracle expects once every entry expired at `now` and the
    /// watermark is removed: (store key, value, expiry).
    fn stored(&self, now: i64) -> Vec<TtlEntry> {
        let w = self.watermark;
        let mut out = Vec::new();
        for (key, m) in &self.keys {
            if let Some((v, e)) = m.tv.clone().filter(|(_, e)| *e > now) {
                out.push((sk::value_key(key, "tv"), v, (false, e)));
            }
            for (name, list, event_time, threshold) in [("tl", &m.tl, true, w), ("pl", &m.pl, false, now)] {
                // Named by position among the live elements, as `ttl_entries` names them.
                for (i, (v, e)) in list.iter().filter(|(_, e)| *e > threshold).enumerate() {
                    out.push((format!("{name}#{i}@{key}"), v.clone(), (event_time, *e)));
                }
            }
            for (name, map, event_time, threshold) in [("tm", &m.tm, true, w), ("pm", &m.pm, false, now)] {
                for (k, (v, e)) in map {
                    if *e > threshold {
                        out.push((sk::map_entry_key(key, name, k.as_bytes()), v.clone(), (event_time, *e)));
                    }
                }
            }
        }
        out.sort();
        out
    }
}

fn script(seed: u64, lines: usize) -> Vec<Value> {
    let mut rng = Lcg(seed);
    let mut ts = NOW - 5_000;
    let ops = ["tset", "tclear", "tappend", "tclearlist", "tput", "tdel", "pappend", "pput"];
    (0..lines)
        .map(|i| {
            // Mostly forward in steps of up to 400 ms, sometimes behind (late or within
            // the delay).
            ts += rng.below(400) as i64;
            let at = if rng.below(8) == 0 { ts - rng.below(900) as i64 } else { ts };
            let n = 1 + rng.below(3);
            let ops: Vec<String> = (0..n)
                .map(|j| {
                    let op = ops[rng.below(ops.len() as u64) as usize];
                    let map_key = ["x", "y", "z"][rng.below(3) as usize];
                    match op {
                        "tput" | "pput" => format!("{op}:{map_key}={i}.{j}"),
                        "tdel" => format!("{op}:{map_key}"),
                        "tclear" | "tclearlist" => op.to_owned(),
                        _ => format!("{op}:{i}.{j}"),
                    }
                })
                .collect();
            let key = ["a", "b", "c"][rng.below(3) as usize];
            json!({"k": key, "ts": at, "ops": ops})
        })
        .collect()
}

fn config(dir: &Path, removals_max: usize) -> PipelineConfig {
    let mut config = PipelineConfig::new(
        PathBuf::from(plugins::KEYED_PROBE),
        Stream::File(dir.join("in.jsonl")),
        Stream::File(dir.join("out.jsonl")),
        dir.join("state"),
        "k".into(),
    );
    config.time_field = Some("ts".into());
    config.timeout = TimeoutKind::None;
    config.watermark_delay_ms = DELAY_MS;
    config.batch_events_max = 1;
    config.durable_commits = false;
    config.cache_dir = Some(cache_dir());
    config.limits.ttl_expirations_per_batch_max = removals_max;
    config
}

/// The TTL entries of a store: (value or list or map entry, its value, expiry), with
/// list elements named by position among the list's stored elements, as the oracle
/// names them, and the expiry index entries.
fn ttl_entries(records: &[(String, groupstate::store::KeyRecord)]) -> (Vec<TtlEntry>, Vec<String>) {
    let mut entries = Vec::new();
    let mut index = Vec::new();
    let mut position: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (key, record) in records {
        if let Some((event_time, at, entry)) = sk::parse_expiry_index(key) {
            index.push(sk::expiry_index_key(event_time, at, entry));
            continue;
        }
        let Some((group, entry)) = sk::parse(key) else { panic!("{key:?} is no 0.2 key") };
        let name = match &entry {
            Entry::Value(n) | Entry::ListElement(n, _) | Entry::MapEntry(n, _) => n.clone(),
            _ => continue,
        };
        if !["tv", "tl", "tm", "pl", "pm"].contains(&name.as_str()) {
            continue;
        }
        let stored = record.value.as_deref().unwrap();
        let (expiry, bytes) = unpack_entry(key, stored).unwrap();
        let expiry = expiry.unwrap_or_else(|| panic!("{key:?} of a TTL variable has no expiry"));
        let value: String = groupstate_sdk_decode(bytes);
        let name_key = match entry {
            Entry::ListElement(..) => {
                let p = position.entry((group.clone(), name.clone())).or_default();
                *p += 1;
                format!("{name}#{}@{group}", *p - 1)
            }
            _ => key.clone(),
        };
        entries.push((name_key, value, (expiry.event_time, expiry.at_ms)));
        index.push(format!("want:{}", sk::expiry_index_key(expiry.event_time, expiry.at_ms, key)));
    }
    entries.sort();
    (entries, index)
}

/// The SDK's encoding of a `String` (bincode 2, variable-length length prefix).
fn groupstate_sdk_decode(bytes: &[u8]) -> String {
    let (len, rest) = match bytes.split_first() {
        Some((&n, rest)) if n < 251 => (n as usize, rest),
        Some((&251, rest)) => (u16::from_le_bytes([rest[0], rest[1]]) as usize, &rest[2..]),
        other => panic!("not a short string: {other:?}"),
    };
    assert_eq!(rest.len(), len, "a string's bytes");
    String::from_utf8(rest.to_vec()).unwrap()
}

fn check(seed: u64, removals_max: usize) {
    let dir = tempfile::tempdir().unwrap();
    let lines = script(seed, 120);
    let mut oracle = Oracle { keys: BTreeMap::new(), watermark: 0, max_ts: None };
    let mut want = Vec::new();
    let mut input = String::new();
    let mut now = NOW;
    let mut last_check = None;
    for (step, chunk) in lines.chunks(20).enumerate() {
        // The clock moves on by up to 1.5 TTLs between steps, and the state dir is
        // reopened for each.
        now += 300 * step as i64 + 200;
        for line in chunk {
            input.push_str(&format!("{line}\n"));
            want.extend(oracle.batch(now, line));
        }
        std::fs::write(dir.path().join("in.jsonl"), &input).unwrap();
        let expected = oracle.stored(now);
        run_and_inspect(config(dir.path(), removals_max), now, |store| {
            let (records, _) = store_contents(store);
            last_check = Some((ttl_entries(&records), expected));
        });
    }
    let got: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            let o = v.as_object_mut().unwrap();
            o.retain(|k, _| ["key", "tv", "tl", "tl_len", "tm", "pl", "pm"].contains(&k.as_str()));
            v
        })
        .collect();
    assert_eq!(got.len(), want.len(), "one output per record not late");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "call {i} (seed {seed})");
    }
    let ((entries, index), expected) = last_check.unwrap();
    assert_eq!(entries, expected, "the store holds the live TTL entries only (seed {seed})");
    let (wanted, held): (Vec<String>, Vec<String>) = index.into_iter().partition(|k| k.starts_with("want:"));
    let mut wanted: Vec<String> = wanted.into_iter().map(|k| k["want:".len()..].to_owned()).collect();
    wanted.sort();
    let mut held = held;
    held.sort();
    assert_eq!(held, wanted, "one expiry index entry per TTL entry, none left behind (seed {seed})");
}

#[test]
fn ttl_entries_expire_by_the_rules_across_restarts() {
    for seed in [1, 2, 3] {
        check(seed, 100_000);
    }
}

#[test]
fn expired_entries_over_the_removal_limit_stay_invisible() {
    // One removal per batch: most expired entries are read before they go.
    check(4, 1);
}

#[test]
fn an_event_time_ttl_needs_a_time_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.jsonl"), "").unwrap();
    let mut config = config(dir.path(), 10);
    config.time_field = None;
    let clock = std::sync::Arc::new(groupstate::ManualClock::new(NOW));
    let why = match groupstate::Pipeline::open(config, clock) {
        Ok(_) => panic!("a pipeline without a time field took an event-time TTL"),
        Err(e) => e.to_string(),
    };
    assert!(why.contains("\"tl\"") && why.contains("event-time TTL") && why.contains("--time-field"), "{why}");
    assert!(!dir.path().join("state").exists(), "no state dir is made for a pipeline that cannot run");
}

/// `groupstate run` of the keyed-probe over `input` into `dir` (event-time TTL ops
/// only, so the outputs do not depend on the real clock of the runs).
fn crash_run_args(input: &Path, dir: &Path) -> Vec<String> {
    let p = |name: &str| dir.join(name).display().to_string();
    let cache = cache_dir().display().to_string();
    let input = input.display().to_string();
    let (out, state) = (p("out.jsonl"), p("state"));
    [
        "run",
        "--plugin",
        plugins::KEYED_PROBE,
        "--input",
        &input,
        "--output",
        &out,
        "--state-dir",
        &state,
        "--key-field",
        "k",
        "--time-field",
        "ts",
        "--watermark-delay-ms",
        "500",
        "--batch-events",
        "400",
        "--cache-dir",
        &cache,
        "--quiet",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn ttl_expiry_replays_the_same_after_kill_9() {
    use std::process::{Command, Stdio};

    use crate::cli::groupstate_bin;

    let dir = tempfile::tempdir().unwrap();
    let mut rng = Lcg(11);
    let mut ts = NOW - 1_000_000;
    let mut text = String::new();
    for i in 0..150_000u64 {
        ts += rng.below(20) as i64;
        let at = if rng.below(10) == 0 { ts - rng.below(700) as i64 } else { ts };
        let op = match rng.below(6) {
            0 | 1 => format!("tappend:{i}"),
            2 | 3 => format!("tput:{}={i}", rng.below(5)),
            4 => format!("tdel:{}", rng.below(5)),
            _ => "tclearlist".to_owned(),
        };
        text.push_str(&format!("{}\n", json!({"k": format!("u{}", rng.below(200)), "ts": at, "ops": [op]})));
    }
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, text).unwrap();
    let reference = dir.path().join("reference");
    let clock = groupstate::SystemClock;
    let started = groupstate::Clock::monotonic_ns(&clock);
    let status = Command::new(groupstate_bin()).args(crash_run_args(&input, &reference)).status().unwrap();
    assert!(status.success(), "reference run failed");
    let reference_ms = (groupstate::Clock::monotonic_ns(&clock) - started) / 1_000_000;

    let crashed = dir.path().join("crashed");
    let mut kills = 0;
    for attempt in 0..200 {
        let mut child = Command::new(groupstate_bin())
            .args(crash_run_args(&input, &crashed))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if kills < 8 {
            // Short against the reference run, so that the run cannot finish within the
            // kills and most of them land inside batches.
            std::thread::sleep(std::time::Duration::from_millis(5 + rng.below(reference_ms / 10 + 20)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap();
                child.wait().unwrap();
                kills += 1;
                continue;
            }
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "restart {attempt} failed: {}", String::from_utf8_lossy(&out.stderr));
        break;
    }
    assert!(kills >= 3, "only {kills} kills landed inside the run (reference run {reference_ms} ms)");
    println!("ttl crash test: {kills} kills, reference run {reference_ms} ms");
    for name in ["out.jsonl", "state/late.jsonl"] {
        let (want, got) = (std::fs::read(reference.join(name)).unwrap(), std::fs::read(crashed.join(name)).unwrap());
        assert!(got == want, "{name} differs from the uninterrupted run ({} vs {} bytes)", got.len(), want.len());
    }
    let open =
        |dir: &Path| groupstate::store::Store::open(&dir.join("state/store"), 1 << 20, 1 << 20, 1 << 20).unwrap();
    let (want, got) = (open(&reference), open(&crashed));
    let (want, got) = (store_contents(&want), store_contents(&got));
    assert!(got == want, "the state (entries, expiry index, timers) differs from the uninterrupted run");
    // Entries did expire along the way: the store holds fewer than were written.
    assert!(want.0.len() < 150_000, "{} entries left", want.0.len());
}
