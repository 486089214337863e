//! Schema evolution of 0.2 state, per variable: `evolve-v1` keeps the sensor-alerts
//! state in three variables, `evolve-v2` changes the layout of two of them and converts
//! their old entries in `migrate-state`, which the host calls as calls read them. The
//! alerts are the sensor oracle's whatever version wrote the state, across a restart
//! with the new version and across a hot swap; a version that cannot convert is
//! refused before it runs, and one that fails under a call fails only that call.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use groupstate::config::ErrorPolicy;
use groupstate::state_keys::{self, Entry};
use groupstate::store::{KeyRecord, Store};
use groupstate::{Candidate, ManualClock, Pipeline, PipelineConfig};
use groupstate_tests::{assert_same_alerts, cache_dir, oracle, parse_alerts, plugins, sensor_config, sensor_input};

use crate::cli::groupstate_bin;
use crate::hotload::{drain, settle};

const NOW_MS: i64 = 1_800_000_000_000;

/// The sensor workload split in two: `dir/in.jsonl` holds the first half (the second
/// is returned, to append later) and the whole is at the returned path.
fn split_input(dir: &Path, events: u64, sensors: u32) -> (PathBuf, String) {
    let whole = sensor_input(dir, events, sensors, 11);
    let text = std::fs::read_to_string(&whole).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (first, second) = lines.split_at(lines.len() / 2);
    std::fs::write(dir.join("in.jsonl"), first.join("\n") + "\n").unwrap();
    (whole, second.join("\n") + "\n")
}

fn append(dir: &Path, text: &str) {
    let mut file = std::fs::OpenOptions::new().append(true).open(dir.join("in.jsonl")).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

fn config(dir: &Path, plugin: &str, params: &[(&str, &str)]) -> PipelineConfig {
    let mut config = sensor_config(&dir.join("in.jsonl"), dir);
    config.plugin = PathBuf::from(plugin);
    config.params = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    config.batch_events_max = 997;
    config
}

fn open(config: PipelineConfig) -> Pipeline {
    Pipeline::open(config, Arc::new(ManualClock::new(NOW_MS))).unwrap_or_else(|e| panic!("open: {e}"))
}

/// The schema version of every stored entry of each variable: (variable, version) -> count.
fn versions(store: &Store) -> std::collections::BTreeMap<(String, u32), usize> {
    let mut out = std::collections::BTreeMap::new();
    for entry in store.iter_keys() {
        let (store_key, record) = entry.unwrap();
        let name = match state_keys::parse(&store_key) {
            Some((_, Entry::Value(name) | Entry::ListElement(name, _))) => name,
            _ => continue,
        };
        *out.entry((name, record.schema_version)).or_default() += 1;
    }
    out
}

#[test]
fn a_restart_with_new_layouts_converts_old_entries_as_they_are_read_and_only_those_variables() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, second) = split_input(dir.path(), 40_000, 1_500);

    // The control: v1 alone over the whole input gives the oracle's alerts.
    let control = tempfile::tempdir().unwrap();
    std::fs::copy(&whole, control.path().join("in.jsonl")).unwrap();
    open(config(control.path(), plugins::EVOLVE_V1, &[])).run(&mut |_| {}).unwrap();
    let want = oracle::sensor_alerts(&whole);
    assert!(want.len() > 20, "the workload has alerts to check ({})", want.len());
    assert_same_alerts(&parse_alerts(&control.path().join("out.jsonl")), &want);

    let mut v1 = open(config(dir.path(), plugins::EVOLVE_V1, &[]));
    v1.run(&mut |_| {}).unwrap();
    let before = versions(v1.store());
    drop(v1);
    assert!(before.keys().all(|(_, version)| *version == 1), "{before:?}");

    // A stored layout-1 entry, shown through v2: converted for the view, the store kept.
    let some_key = first_key_with(dir.path(), "last_ts");
    let shown = state_view(dir.path(), &["--plugin", plugins::EVOLVE_V2, "--key", &some_key]);
    let last_ts = &shown["variables"]["last_ts"];
    assert_eq!(last_ts["schema_version"], 1, "{shown}");
    assert!(last_ts["value"]["ts"].is_i64() && last_ts["value"]["episode_start"].is_null(), "{shown}");

    append(dir.path(), &second);
    let mut v2 = open(config(dir.path(), plugins::EVOLVE_V2, &[]));
    let summary = v2.run(&mut |_| {}).unwrap();
    assert_eq!(summary.run.failed_calls, 0, "{summary:?}");
    let after = versions(v2.store());
    drop(v2);
    assert_same_alerts(&parse_alerts(&dir.path().join("out.jsonl")), &want);
    // The untouched variable kept its layout; the others were rewritten as read.
    assert!(after.keys().all(|(name, version)| name != "events" || *version == 1), "{after:?}");
    for name in ["last_ts", "errors"] {
        assert!(after.get(&(name.to_owned(), 2)).is_some_and(|n| *n > 0), "{name} converted: {after:?}");
    }
    // Every call of v2 reads its key's `errors` list: the old elements it read were
    // written back converted, so no sensor of the second half keeps one.
    let v2 = open(config(dir.path(), plugins::EVOLVE_V2, &[]));
    let old_errors: Vec<String> = old_entries(v2.store(), "errors");
    let second_half = sensors_of(&second);
    assert!(old_errors.iter().all(|key| !second_half.contains(key)), "old elements left: {old_errors:?}");
}

/// The sensors of a part of the input.
fn sensors_of(lines: &str) -> std::collections::BTreeSet<String> {
    lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["sensor_id"].as_str().unwrap().to_owned())
        .collect()
}

/// The group keys holding an entry of variable `name` stored under schema 1.
fn old_entries(store: &Store, name: &str) -> Vec<String> {
    store
        .iter_keys()
        .map(Result::unwrap)
        .filter_map(|(store_key, record)| match state_keys::parse(&store_key) {
            Some((key, Entry::Value(n) | Entry::ListElement(n, _))) if n == name && record.schema_version == 1 => {
                Some(key)
            }
            _ => None,
        })
        .collect()
}

/// The first key holding variable `name`, from `groupstate state`.
fn first_key_with(dir: &Path, name: &str) -> String {
    let out = Command::new(groupstate_bin()).args(["state", "--state-dir"]).arg(dir.join("state")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| !v["variables"][name].is_null())
        .and_then(|v| v["key"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no key holds {name}"))
}

fn state_view(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(groupstate_bin())
        .args(["state", "--state-dir"])
        .arg(dir.join("state"))
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_hot_swap_to_new_layouts_is_checked_refused_when_it_cannot_convert_and_then_taken() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, second) = split_input(dir.path(), 30_000, 1_000);
    let input = dir.path().join("in.jsonl");
    let mut pipeline = open(config(dir.path(), plugins::EVOLVE_V1, &[]));
    drain(&mut pipeline, &input);
    let offer = |pipeline: &Pipeline, params: &[(&str, &str)]| {
        let params: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let loaded = pipeline.runtime().unwrap().load(Path::new(plugins::EVOLVE_V2), &params).unwrap();
        pipeline.swap_sender().send(Candidate { plugin: Box::new(loaded), origin: "v2".into() }).unwrap();
    };

    // A release that converts nothing fails its check on the stored sample: refused.
    offer(&pipeline, &[("refuse", "true")]);
    settle(&mut pipeline);
    let status = pipeline.plugin_status().lock().unwrap().clone();
    assert!(status.running.contains("evolve 1.0.0"), "{status:?}");
    let refusal = status.last_refusal.unwrap_or_default();
    assert!(refusal.contains("of variable") && refusal.contains("refusing to convert"), "{refusal}");

    offer(&pipeline, &[]);
    settle(&mut pipeline);
    let status = pipeline.plugin_status().lock().unwrap().clone();
    assert!(status.running.contains("evolve 2.0.0"), "{status:?}");
    append(dir.path(), &second);
    drain(&mut pipeline, &input);
    assert_same_alerts(&parse_alerts(&dir.path().join("out.jsonl")), &oracle::sensor_alerts(&whole));
}

/// A state dir in which `evolve-v1` ran over the first half of a small workload, with
/// the second half appended to its input; and up to 20 sensors of that second half
/// that hold layout-1 list elements.
fn after_v1_small() -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let (_, second) = split_input(dir.path(), 6_000, 200);
    let mut v1 = open(config(dir.path(), plugins::EVOLVE_V1, &[]));
    v1.run(&mut |_| {}).unwrap();
    let mut keys = old_entries(v1.store(), "errors");
    drop(v1);
    keys.dedup();
    let second_half = sensors_of(&second);
    append(dir.path(), &second);
    (dir, keys.into_iter().filter(|k| second_half.contains(k)).take(20).collect())
}

#[test]
fn a_call_that_fails_keeps_its_keys_old_entries_whether_their_conversion_failed_or_not() {
    // (a) Conversions that fail, (b) conversions that succeed in calls that then fail:
    // either way the call fails as a whole, under --on-error dead-letter.
    for case in ["refused", "failed"] {
        let (dir, with_old_errors) = after_v1_small();
        assert!(with_old_errors.len() >= 5, "keys with old list elements: {with_old_errors:?}");
        let fail_keys = with_old_errors.join(",");
        let (params, message) = match case {
            "refused" => (vec![("refuse", "true")], "refusing to convert"),
            _ => (vec![("fail_keys", fail_keys.as_str())], "is in fail_keys"),
        };
        let mut config = config(dir.path(), plugins::EVOLVE_V2, &params);
        config.on_error = ErrorPolicy::DeadLetter;
        let mut v2 = open(config);
        let before = groupstate_tests::store_contents(v2.store()).0;
        let summary = v2.run(&mut |_| {}).unwrap();
        assert!(summary.run.failed_calls > 0, "{case}: {summary:?}");
        let after = groupstate_tests::store_contents(v2.store()).0;
        drop(v2);
        let dead = std::fs::read_to_string(dir.path().join("state").join("dead-letter.jsonl")).unwrap();
        let first = dead.lines().next().unwrap_or_else(|| panic!("{case}: no dead letters"));
        assert!(first.contains(message), "{case}: {first}");
        // Each failed key still holds what the first half left it (or nothing, where
        // its old timer fired and v2 cleared it).
        let failed = dead
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["key"].as_str().unwrap().to_owned());
        let of = |entries: &[(String, KeyRecord)], key: &str| -> Vec<(String, KeyRecord)> {
            let prefix = state_keys::group_prefix(key);
            entries.iter().filter(|(k, _)| k.starts_with(&prefix)).cloned().collect()
        };
        let mut kept = 0;
        for key in failed.collect::<std::collections::BTreeSet<_>>() {
            let (was, is) = (of(&before, &key), of(&after, &key));
            assert!(is.is_empty() || is == was, "{case}: key {key}: {was:?} became {is:?}");
            kept += usize::from(!is.is_empty());
        }
        assert!(kept > 0, "{case}: some failed keys kept their state");
    }
}
