//! `groupstate run --initial-state FILE`: a new state dir's keys are given to the
//! keyed-probe's `handle-initial-state` before the first batch, all or nothing; a
//! malformed line, a duplicate key or a refused line stores nothing and names its line;
//! a state dir with a checkpoint and a 0.1 plugin refuse the flag.

use std::path::Path;
use std::process::{Command, Output};

use groupstate_tests::{cache_dir, plugins};
use serde_json::{Value, json};

use crate::cli::groupstate_bin;

const NOW: i64 = 1_800_000_000_000;
/// An event time the real clock of the binary's runs is well ahead of.
pub(crate) const TS: i64 = 1_000;

pub(crate) fn run(dir: &Path, plugin: &str, initial: Option<&Path>) -> Output {
    let cache = cache_dir().display().to_string();
    let state = dir.join("state").display().to_string();
    let input = dir.join("in.jsonl").display().to_string();
    let output = dir.join("out.jsonl").display().to_string();
    let mut args: Vec<String> = [
        "run",
        "--plugin",
        plugin,
        "--input",
        &input,
        "--output",
        &output,
        "--state-dir",
        &state,
        "--key-field",
        "k",
        "--time-field",
        "ts",
        "--timeout",
        "processing-time",
        "--cache-dir",
        &cache,
        "--quiet",
    ]
    .map(String::from)
    .to_vec();
    if let Some(path) = initial {
        args.extend(["--initial-state".to_owned(), path.display().to_string()]);
    }
    Command::new(groupstate_bin()).args(&args).output().expect("run groupstate")
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub(crate) fn write_lines(path: &Path, lines: &[Value]) {
    std::fs::write(path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
}

fn outputs(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("out.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Whether the state dir has a checkpoint (through `groupstate state`).
fn checkpointed(dir: &Path) -> bool {
    let out = Command::new(groupstate_bin())
        .args(["state", "--state-dir", &dir.join("state").display().to_string(), "--show", "checkpoint"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let cp: Value = serde_json::from_slice(&out.stdout).unwrap();
    cp["committed"] == true
}

/// The store entries of the state dir (through `groupstate state`).
fn entries(dir: &Path) -> Vec<Value> {
    let out = Command::new(groupstate_bin())
        .args(["state", "--state-dir", &dir.join("state").display().to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn initial_state_is_loaded_once_before_the_first_batch() {
    let dir = tempfile::tempdir().unwrap();
    let initial = dir.path().join("initial.jsonl");
    let far = NOW + 10_000_000_000;
    std::fs::write(
        &initial,
        [
            json!({"key": "a", "state": {"v": "hello", "log": ["1", "2"], "m": {"x": "X", "y": 5}, "timers": [far]}}),
            json!({"key": "b", "state": {"tv": "short-lived", "tl": ["e"], "tm": {"k": "v"}}}),
        ]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect::<String>()
            + "\n",
    )
    .unwrap();
    write_lines(
        &dir.path().join("in.jsonl"),
        &[json!({"k": "a", "ts": TS, "ops": ["append:3"]}), json!({"k": "b", "ts": TS, "ops": []})],
    );
    let out = run(dir.path(), plugins::KEYED_PROBE, Some(&initial));
    assert!(out.status.success(), "{}", stderr(&out));
    let got = outputs(dir.path());
    assert_eq!(got.len(), 2, "{got:#?}");
    assert_eq!(got[0]["value"], "hello");
    assert_eq!(got[0]["list_tail"], json!(["1", "2", "3"]));
    assert_eq!(got[0]["map"], json!([["x", "X"], ["y", "5"]]));
    assert_eq!(got[0]["timers"], json!([[far, null]]));
    // b's TTL entries were written at the load; the first batch is within their TTL
    // (the same second), so they are still there.
    assert_eq!(got[1]["tl"], json!(["e"]));
    assert_eq!(got[1]["tm"], json!([["k", "v"]]));

    // A second run with the flag: the dir has a checkpoint now.
    let again = run(dir.path(), plugins::KEYED_PROBE, Some(&initial));
    assert!(!again.status.success());
    let why = stderr(&again);
    assert!(why.contains("already has state") && why.contains("new --state-dir"), "{why}");
    // Without it the pipeline goes on as usual.
    let on = run(dir.path(), plugins::KEYED_PROBE, None);
    assert!(on.status.success(), "{}", stderr(&on));
}

#[test]
fn a_bad_initial_state_file_stores_nothing_and_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    write_lines(&dir.path().join("in.jsonl"), &[json!({"k": "a", "ts": TS, "ops": []})]);
    let initial = dir.path().join("initial.jsonl");
    let cases: [(&str, &[&str]); 4] = [
        (
            "{\"key\": \"a\", \"state\": {}}\n{\"key\": \"b\", \"state\": 1}\n{\"key\": \"a\", \"state\": 2}\n",
            &["line 3", "\"a\"", "first on line 1"],
        ),
        ("{\"key\": \"a\", \"state\": {}}\n{\"key\": \"b\", \"state\"\n", &["line 2", "not JSON"]),
        ("{\"key\": 7, \"state\": {}}\n", &["line 1", "\"key\""]),
        (
            "{\"key\": \"a\", \"state\": {\"v\": \"kept?\"}}\n{\"key\": \"b\", \"state\": {}}\n{\"key\": \"c\", \"state\": \"fail\"}\n",
            &["line 3", "\"c\"", "refused", "nothing of the file was stored"],
        ),
    ];
    for (text, wanted) in cases {
        std::fs::write(&initial, text).unwrap();
        let out = run(dir.path(), plugins::KEYED_PROBE, Some(&initial));
        assert!(!out.status.success(), "{text}");
        let why = stderr(&out);
        for w in wanted {
            assert!(why.contains(w), "{w:?} missing from: {why}");
        }
        assert!(!checkpointed(dir.path()), "a refused load leaves the dir new: {text}");
        assert_eq!(entries(dir.path()), Vec::<Value>::new(), "a refused load stores nothing: {text}");
    }
    // The dir is still new: a good file loads.
    std::fs::write(&initial, "{\"key\": \"a\", \"state\": {\"v\": \"now\"}}\n").unwrap();
    let out = run(dir.path(), plugins::KEYED_PROBE, Some(&initial));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(outputs(dir.path())[0]["value"], "now");
}

#[test]
fn a_01_plugin_refuses_initial_state() {
    let dir = tempfile::tempdir().unwrap();
    write_lines(&dir.path().join("in.jsonl"), &[json!({"k": "a", "ts": TS})]);
    let initial = dir.path().join("initial.jsonl");
    std::fs::write(&initial, "{\"key\": \"a\", \"state\": 1}\n").unwrap();
    let out = run(dir.path(), plugins::PROBE, Some(&initial));
    assert!(!out.status.success());
    let why = stderr(&out);
    assert!(why.contains("groupstate:plugin@0.1.0") && why.contains("0.2.0"), "{why}");
}
