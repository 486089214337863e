//! The sensor-alerts plugin written in Python, JavaScript and C, through the whole
//! pipeline: each gives exactly the oracle's alerts, refuses bad parameters with the
//! Rust plugin's messages, and fails a call on a bad event without losing state.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use groupstate::config::ErrorPolicy;
use groupstate::{ManualClock, Pipeline};
use groupstate_tests::{assert_same_alerts, oracle, parse_alerts, plugins, run, sensor_config, sensor_input};

const NOW_MS: i64 = 1_800_000_000_000;

/// Over 100k events from 1500 sensors: alerts, silent sensors timing out, many keys
/// per batch and several batches.
fn matches_the_oracle(plugin: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = sensor_input(dir.path(), 150_000, 1_500, 17);
    let want = oracle::sensor_alerts(&input);
    assert!(want.len() > 100, "the workload should produce alerts, got {}", want.len());
    let mut config = sensor_config(&input, dir.path());
    config.plugin = PathBuf::from(plugin);
    let summary = run(config, NOW_MS);
    assert_eq!(summary.plugin, "sensor-alerts 0.1.0 (state schema 1)", "the plugin's info()");
    assert_eq!(summary.total.records, 150_000);
    assert_eq!(summary.total.events, 150_000, "sorted input has no late events");
    assert_eq!(summary.total.failed_calls, 0);
    assert!(summary.total.timeout_calls > 0, "silent sensors must time out");
    assert_same_alerts(&parse_alerts(&dir.path().join("out.jsonl")), &want);
}

/// `init` refuses what the Rust plugin refuses, with the same message.
fn refuses_bad_parameters(plugin: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = sensor_input(dir.path(), 10, 2, 1);
    let cases: &[(&str, &str, &str)] = &[
        (
            "gap",
            "1",
            "parameter `gap` is not a parameter of this plugin (it knows gap_ms, window_ms): remove it or fix its name",
        ),
        (
            "gap_ms",
            "10m",
            "parameter `gap_ms` is `10m`, not a valid i64 (invalid digit found in string): pass --param gap_ms=<i64>",
        ),
        (
            "gap_ms",
            "",
            "parameter `gap_ms` is ``, not a valid i64 (cannot parse integer from empty string): pass --param gap_ms=<i64>",
        ),
        (
            "window_ms",
            "99999999999999999999",
            "parameter `window_ms` is `99999999999999999999`, not a valid i64 (number too large to fit in target type): pass --param window_ms=<i64>",
        ),
        ("gap_ms", "0", "parameter `gap_ms` must be greater than 0 ms, got 0"),
        ("window_ms", "-1", "parameter `window_ms` must be 0 ms or more, got -1"),
    ];
    for (index, (name, value, message)) in cases.iter().enumerate() {
        let mut config = sensor_config(&input, &dir.path().join(index.to_string()));
        config.plugin = PathBuf::from(plugin);
        config.params = vec![(name.to_string(), value.to_string())];
        let error = open_error(config);
        assert!(
            error.ends_with(&format!("init refused the parameters: {message}")),
            "{plugin} with {name}={value}: {error}"
        );
    }
}

fn open_error(config: groupstate::config::PipelineConfig) -> String {
    let clock = Arc::new(ManualClock::new(NOW_MS));
    match Pipeline::open(config, clock) {
        Ok(mut pipeline) => match pipeline.run(&mut |_| {}) {
            Ok(_) => panic!("the plugin accepted bad parameters"),
            Err(error) => error.to_string(),
        },
        Err(error) => error.to_string(),
    }
}

/// A bad event fails its key's call (dead-lettered with the plugin's reason), and the
/// key's state stays as before that call: neither lost nor half-updated. Other keys go
/// on. Batches of 3 lines; escaped strings and nested fields in payloads.
fn a_bad_event_fails_only_its_call(plugin: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("in.jsonl");
    let lines = [
        r#"{"sensor_id":"s-1","ts":1000,"status":"err","reading":1.5}"#,
        r#"{"sensor_id":"s-2","ts":1000,"status":"err"}"#,
        r#"{"sensor_id":"s-1","ts":1200,"status":"err","extra":{"nested":[1,"\"}",null]}}"#,
        // s-2's call in this batch fails: its state stays at one error since 1000.
        r#"{"sensor_id":"s-2","ts":1500,"status":"err"}"#,
        r#"{"sensor_id":"s-2","ts":1501,"status":"warn"}"#,
        r#"{"sensor_id":"s-1","ts":1600,"status":"\u0065rr"}"#,
        r#"{"sensor_id":"s-2","ts":2500,"status":"err"}"#,
        r#"{"sensor_id":"s-2","ts":2600,"status":"err"}"#,
        r#"{"sensor_id":"s-\"3\"","ts":2600,"status":"err"}"#,
        r#"{"sensor_id":"s-\"3\"","ts":2601,"status":"err"}"#,
        r#"{"sensor_id":"s-\"3\"","ts":2602,"status":"err"}"#,
    ];
    std::fs::write(&input, lines.join("\n") + "\n").expect("write the input");
    let mut config = sensor_config(&input, dir.path());
    config.plugin = PathBuf::from(plugin);
    config.on_error = ErrorPolicy::DeadLetter;
    config.batch_events_max = 3;
    let summary = run(config, NOW_MS);
    assert_eq!(summary.total.failed_calls, 1, "only s-2's call with the bad status fails");
    let alerts = parse_alerts(&dir.path().join("out.jsonl"));
    let want = [("s-\"3\"".to_string(), 2602, 2600), ("s-1".to_string(), 1600, 1000), ("s-2".to_string(), 2600, 1000)];
    assert_eq!(alerts, want, "{plugin}");
    let dead =
        std::fs::read_to_string(dir.path().join("state").join("dead-letter.jsonl")).expect("the dead-letter file");
    let failure = dead.lines().find(|l| l.contains("plugin-error")).expect("a dead-lettered call");
    let failure: serde_json::Value = serde_json::from_str(failure).expect("a JSON dead letter");
    assert_eq!(failure["key"], "s-2");
    let reason = failure["error"].as_str().expect("the error is a string");
    assert!(reason.contains("event 1 of 2: payload is not a valid") && reason.contains("warn"), "{reason}");
}

fn check(plugin: &str) {
    assert!(Path::new(plugin).exists(), "{plugin} was not built");
    matches_the_oracle(plugin);
    refuses_bad_parameters(plugin);
    a_bad_event_fails_only_its_call(plugin);
}

#[test]
fn rust_reference_passes_the_same_checks() {
    check(plugins::SENSOR_ALERTS);
}

#[test]
fn python_matches_the_rust_plugin() {
    check(plugins::SENSOR_ALERTS_PY);
}

#[test]
fn javascript_matches_the_rust_plugin() {
    check(plugins::SENSOR_ALERTS_JS);
}

#[test]
fn c_matches_the_rust_plugin() {
    check(plugins::SENSOR_ALERTS_C);
}
