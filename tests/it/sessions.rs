//! The sessions plugins (the 0.2 state API: map state, a timer per open session), in
//! Rust, Python and JavaScript, through the whole pipeline, against the oracle, at several batch
//! sizes and across a restart.

use std::path::{Path, PathBuf};

use groupstate::state_keys::{self, Entry};
use groupstate::{PipelineConfig, Stream, TimeoutKind};
use groupstate_tests::{cache_dir, oracle, plugins, run, run_and_inspect};

const NOW_MS: i64 = 1_800_000_000_000;
const GAP_MS: i64 = 30 * 60 * 1000;
pub const DELAY_MS: i64 = 10 * 60 * 1000;

/// `events` views of `users` users, time moving on by up to 20 s a view, each view up
/// to half the watermark delay earlier than that (out of order, never late).
pub fn views(events: usize, users: u64, seed: u64) -> Vec<(String, i64, String)> {
    let mut state = seed;
    let mut next = move |n: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let mut t = 1_700_000_000_000i64;
    (0..events)
        .map(|_| {
            t += next(20_000) as i64;
            let ts = t - next(DELAY_MS as u64 / 2) as i64;
            (format!("u{}", next(users)), ts, format!("/p{}", next(7)))
        })
        .collect()
}

pub fn write_input(dir: &Path, views: &[(String, i64, String)]) -> PathBuf {
    let path = dir.join("views.jsonl");
    let lines: Vec<String> =
        views.iter().map(|(u, ts, p)| serde_json::json!({"user": u, "ts": ts, "page": p}).to_string()).collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn config(plugin: &str, input: &Path, dir: &Path, batch_events: usize) -> PipelineConfig {
    let mut config = PipelineConfig::new(
        PathBuf::from(plugin),
        Stream::File(input.to_owned()),
        Stream::File(dir.join("out.jsonl")),
        dir.join("state"),
        "user".into(),
    );
    config.time_field = Some("ts".into());
    config.timeout = TimeoutKind::EventTime;
    config.watermark_delay_ms = DELAY_MS;
    config.batch_events_max = batch_events;
    config.durable_commits = false;
    config.cache_dir = Some(cache_dir());
    // The Python and JavaScript plugins are interpreted, and the suite runs its tests in
    // parallel on small machines: a call with a whole batch of one user's views must not
    // trip the default 1 s CPU limit there (sandbox.rs tests the limit itself).
    config.limits.call_cpu_ms_max = 10_000;
    config
}

fn closed(dir: &Path) -> Vec<oracle::Session> {
    let text = std::fs::read_to_string(dir.join("out.jsonl")).unwrap();
    let mut got: Vec<oracle::Session> = text
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let int = |f: &str| v[f].as_i64().unwrap_or_else(|| panic!("{f} in {line}"));
            (
                v["user"].as_str().unwrap().to_owned(),
                int("start"),
                int("end"),
                int("events") as u64,
                int("pages") as usize,
            )
        })
        .collect();
    got.sort();
    got
}

/// The open sessions and timers the store holds: (user, session start) of each map
/// entry, (user, expiry, name) of each timer.
type Open = (Vec<(String, i64)>, Vec<(String, i64, Option<String>)>);

fn open_state(store: &groupstate::store::Store) -> Open {
    store.check_consistency().unwrap();
    let (mut entries, mut timers) = (Vec::new(), Vec::new());
    for entry in store.iter_keys() {
        let (key, record) = entry.unwrap();
        match state_keys::parse(&key) {
            Some((user, Entry::MapEntry(name, start))) => {
                assert_eq!(name, "sessions");
                assert!(record.value.is_some());
                let start = i64::from_be_bytes(start.try_into().unwrap()) ^ i64::MIN;
                entries.push((user, start));
            }
            Some((user, Entry::Timer(expiry, name))) => {
                assert_eq!(record.timeout_ms, Some(expiry), "a timer's record carries its expiry");
                timers.push((user, expiry, name));
            }
            other => panic!("unexpected store entry {key:?}: {other:?}"),
        }
    }
    (entries, timers)
}

#[test]
fn sessions_match_the_oracle_at_every_batch_size_and_across_a_restart() {
    check_sessions(plugins::SESSIONS);
}

/// The Python plugin (`plugins/sessions-py`, the Python SDK's 0.2 layer) under the same
/// checks: the same outputs, map entries (its `IntKey` writes the Rust SDK's `i64`
/// bytes) and timers.
#[test]
fn python_sessions_match_the_oracle_at_every_batch_size_and_across_a_restart() {
    check_sessions(plugins::SESSIONS_PY);
}

/// The JavaScript plugin (`plugins/sessions-js`, the JavaScript SDK's 0.2 layer).
#[test]
fn js_sessions_match_the_oracle_at_every_batch_size_and_across_a_restart() {
    check_sessions(plugins::SESSIONS_JS);
}

/// The Python SDK's `KeyedDriver` is a model of the host: over the same input, split
/// into the same batches, it gives the Python plugin the same calls, so its outputs are
/// the host's line for line, in order (the oracle test above compares sorted sets).
#[test]
fn the_python_driver_gives_the_hosts_outputs_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let views = views(3_000, 150, 21);
    let input = write_input(dir.path(), &views);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned();
    for batch_events in [1_000, 37] {
        let run_dir = dir.path().join(format!("b{batch_events}"));
        run(config(plugins::SESSIONS_PY, &input, &run_dir, batch_events), NOW_MS);
        let host = std::fs::read_to_string(run_dir.join("out.jsonl")).unwrap();
        assert!(host.lines().count() > 50, "the workload should close many sessions");
        let driver = std::process::Command::new("python3")
            .arg(root.join("tests/python_driver.py"))
            .arg(root.join("plugins/sessions-py"))
            .args(["sessions", "Sessions"])
            .arg(&input)
            .args([batch_events.to_string(), DELAY_MS.to_string(), "user".into(), "ts".into()])
            .env("PYTHONPATH", root.join("guest-sdk/python"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .expect("run python3 (tests/setup.sh installs it)");
        assert!(driver.status.success(), "{}", String::from_utf8_lossy(&driver.stderr));
        assert_eq!(String::from_utf8(driver.stdout).unwrap(), host, "batch size {batch_events}");
    }
}

fn check_sessions(plugin: &str) {
    let dir = tempfile::tempdir().unwrap();
    let views = views(12_000, 150, 5);
    let input = write_input(dir.path(), &views);
    let max_ts = views.iter().map(|v| v.1).max().unwrap();
    let want = oracle::sessions(&views, GAP_MS, max_ts - DELAY_MS);
    assert!(want.len() > 500, "the workload should close many sessions, got {}", want.len());
    assert!(want.iter().any(|s| s.3 > 3), "some sessions should have several views");
    let open_users: usize = {
        let all = oracle::sessions(&views, GAP_MS, i64::MAX);
        all.len() - want.len()
    };
    assert!(open_users > 0, "some sessions should stay open at the end");

    let mut first_open: Option<Open> = None;
    for batch_events in [100_000, 997, 61] {
        let run_dir = dir.path().join(format!("b{batch_events}"));
        let summary = run_and_inspect(config(plugin, &input, &run_dir, batch_events), NOW_MS, |store| {
            let (entries, timers) = open_state(store);
            assert_eq!(entries.len(), open_users, "one map entry per open session");
            // One timer per open session, at its end plus the gap, named by its start,
            // none of them expired.
            assert_eq!(timers.len(), entries.len());
            for (user, expiry, name) in &timers {
                let start: i64 = name.as_deref().unwrap().parse().unwrap();
                assert!(entries.contains(&(user.clone(), start)), "timer of a session not held: {user} {start}");
                assert!(*expiry > max_ts - DELAY_MS, "an expired timer was left: {user} {expiry}");
            }
            match &first_open {
                None => first_open = Some((entries, timers)),
                Some(first) => assert_eq!(&(entries, timers), first, "batch size {batch_events} left other state"),
            }
        });
        assert_eq!(summary.total.late, 0, "the input is out of order within the delay only");
        assert_eq!(summary.total.events, views.len() as u64);
        assert_eq!(summary.total.timeout_calls, want.len() as u64, "one timer call per closed session");
        assert_eq!(closed(&run_dir), want, "batch size {batch_events}");
    }

    // Stopped after a few batches and resumed over the same state dir.
    let resumed = dir.path().join("resumed");
    let mut config = config(plugin, &input, &resumed, 443);
    config.batches_max = Some(9);
    let first = run(config.clone(), NOW_MS);
    assert_eq!(first.batches, 9);
    config.batches_max = None;
    run(config.clone(), NOW_MS + 1000);
    assert_eq!(closed(&resumed), want, "after a restart");
    // A rerun after the end changes nothing.
    let before = std::fs::read(resumed.join("out.jsonl")).unwrap();
    run(config, NOW_MS + 2000);
    assert_eq!(std::fs::read(resumed.join("out.jsonl")).unwrap(), before);
}

#[test]
fn a_state_dir_keeps_its_plugin_world() {
    let dir = tempfile::tempdir().unwrap();
    let views = views(50, 5, 9);
    let input = write_input(dir.path(), &views);
    run(config(plugins::SESSIONS, &input, dir.path(), 1000), NOW_MS);
    // The same state dir with a 0.1 plugin is refused, naming both worlds.
    let mut other = config(plugins::SESSIONS, &input, dir.path(), 1000);
    other.plugin = PathBuf::from(plugins::SENSOR_ALERTS);
    let clock = std::sync::Arc::new(groupstate::ManualClock::new(NOW_MS));
    let err = groupstate::Pipeline::open(other, clock).unwrap_err().to_string();
    assert!(err.contains("groupstate:plugin@0.2.0") && err.contains("groupstate:plugin@0.1.0"), "{err}");
}
