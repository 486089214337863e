//! Shared helpers of the end-to-end tests: the built plugin paths, workload files,
//! pipeline runners and the independent oracles.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use groupstate::config::{PipelineConfig, Stream, TimeoutKind};
use groupstate::store::Store;
use groupstate::workload::{SensorSpec, generate_sensor};
use groupstate::{ManualClock, Pipeline, RunSummary};

/// Paths of the plugin components built by `build.rs`.
pub mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

pub mod kafka_broker;
pub mod oracle;

/// A sensor workload file in `dir`.
pub fn sensor_input(dir: &Path, events: u64, sensors: u32, seed: u64) -> PathBuf {
    let path = dir.join(format!("sensor-{events}-{sensors}-{seed}.jsonl"));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).expect("create input"));
    generate_sensor(SensorSpec { events, sensors, seed }, &mut out).expect("generate");
    std::io::Write::flush(&mut out).expect("flush input");
    path
}

/// The compiled-plugin cache shared by all tests (compiling once per process run).
pub fn cache_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("target").join("test-plugin-cache");
    std::fs::create_dir_all(&dir).expect("create cache dir");
    dir
}

/// The sensor pipeline over `input`, writing to `dir/out.jsonl`, state in `dir/state`.
pub fn sensor_config(input: &Path, dir: &Path) -> PipelineConfig {
    let mut config = PipelineConfig::new(
        PathBuf::from(plugins::SENSOR_ALERTS),
        Stream::File(input.to_owned()),
        Stream::File(dir.join("out.jsonl")),
        dir.join("state"),
        "sensor_id".into(),
    );
    config.time_field = Some("ts".into());
    config.timeout = TimeoutKind::EventTime;
    config.durable_commits = false;
    config.cache_dir = Some(cache_dir());
    config
}

/// Runs a pipeline in-process with a manual clock at `now_ms`.
pub fn run(config: PipelineConfig, now_ms: i64) -> RunSummary {
    run_and_inspect(config, now_ms, |_| {})
}

/// Runs a pipeline, then hands its store to `inspect` before closing it.
pub fn run_and_inspect(config: PipelineConfig, now_ms: i64, inspect: impl FnOnce(&Store)) -> RunSummary {
    let clock = Arc::new(ManualClock::new(now_ms));
    let mut pipeline = Pipeline::open(config, clock).unwrap_or_else(|e| panic!("open: {e}"));
    let summary = pipeline.run(&mut |_| {}).unwrap_or_else(|e| panic!("run: {e}"));
    inspect(pipeline.store());
    summary
}

/// Everything a store holds for its keys: records in key order, timers in deadline order.
pub type StoreContents = (Vec<(String, groupstate::store::KeyRecord)>, Vec<(i64, String)>);

/// The records and timers of `store`.
pub fn store_contents(store: &Store) -> StoreContents {
    (
        store.iter_keys().map(|entry| entry.expect("read a key")).collect(),
        store.iter_timers().map(|entry| entry.expect("read a timer")).collect(),
    )
}

/// Copies the directory tree `from` to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy file");
        }
    }
}

/// The lines of a JSON Lines file, as a sorted multiset (a Vec, so doubles show).
pub fn sorted_lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

/// Alerts as (sensor, ts, first_ts), parsed from the pipeline's output file.
pub fn parse_alerts(path: &Path) -> Vec<(String, i64, i64)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut alerts: Vec<(String, i64, i64)> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("bad output line {l:?}: {e}"));
            (
                v["sensor_id"].as_str().expect("sensor_id").to_owned(),
                v["ts"].as_i64().expect("ts"),
                v["first_ts"].as_i64().expect("first_ts"),
            )
        })
        .collect();
    alerts.sort();
    alerts
}

/// Asserts that `got` equals `want` as multisets, printing the first differences.
pub fn assert_same_alerts(got: &[(String, i64, i64)], want: &BTreeSet<(String, i64, i64)>) {
    let got_set: BTreeSet<_> = got.iter().cloned().collect();
    assert_eq!(got.len(), got_set.len(), "duplicate alerts in the output");
    let missing: Vec<_> = want.difference(&got_set).take(5).collect();
    let extra: Vec<_> = got_set.difference(want).take(5).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "alerts differ from the oracle: {} got, {} expected; missing e.g. {missing:?}; extra e.g. {extra:?}",
        got.len(),
        want.len()
    );
}
