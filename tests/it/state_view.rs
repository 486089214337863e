//! `groupstate state` of a 0.2 state dir: every key's values, list elements, map
//! entries (with their expiry) and timers, rendered through the plugin's
//! `render-state` with `--plugin` (hex where it answers none), hex without it.

use std::process::Command;

use groupstate_tests::{cache_dir, plugins};
use serde_json::{Value, json};

use crate::cli::groupstate_bin;
use crate::initial_state::{TS, run, stderr, write_lines};

/// The SDK's encoding of a short string (its length, then its bytes), in hex.
fn sdk_hex(s: &str) -> String {
    let mut bytes = vec![s.len() as u8];
    bytes.extend_from_slice(s.as_bytes());
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn state(dir: &std::path::Path, extra: &[&str]) -> Vec<Value> {
    let cache = cache_dir().display().to_string();
    let mut args = vec!["state", "--state-dir"];
    let state_dir = dir.join("state").display().to_string();
    args.push(&state_dir);
    args.extend(["--cache-dir", &cache]);
    args.extend(extra);
    let out = Command::new(groupstate_bin()).args(&args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn state_shows_every_variable_and_timer_rendered_through_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let far = 9_000_000_000_000_i64;
    let initial = dir.path().join("initial.jsonl");
    std::fs::write(
        &initial,
        format!(
            "{}\n{}\n",
            json!({"key": "a", "state": {"v": "hello", "log": ["1", "2"], "m": {"x": "X"}, "timers": [far]}}),
            json!({"key": "b\u{1}c", "state": {"v": "zero"}}),
        ),
    )
    .unwrap();
    // The event-time TTL entries are written at event time TS: they expire at TS + 1000.
    write_lines(&dir.path().join("in.jsonl"), &[json!({"k": "a", "ts": TS, "ops": ["tappend:e", "tput:k=v"]})]);
    let out = run(dir.path(), plugins::KEYED_PROBE, Some(&initial));
    assert!(out.status.success(), "{}", stderr(&out));
    let expiry = TS + 1000;
    let a = json!({
        "key": "a",
        "variables": {
            "v": {"kind": "value", "value": "hello"},
            "log": {"kind": "list", "elements": [{"index": 0, "value": "1"}, {"index": 1, "value": "2"}]},
            "m": {"kind": "map", "entries": [{"key": "x", "value": "X"}]},
            // The probe renders none for tl: hex.
            "tl": {"kind": "list", "elements": [{"index": 0, "value_hex": sdk_hex("e"), "expiry_ms": expiry, "expiry_clock": "event-time"}]},
            "tm": {"kind": "map", "entries": [{"key": "k", "value": "v", "expiry_ms": expiry, "expiry_clock": "event-time"}]},
        },
        "timers": [{"expiry_ms": far, "name": null}],
    });
    let b = json!({"key": "b\u{1}c", "variables": {"v": {"kind": "value", "value": "zero"}}, "timers": []});
    let plugin = ["--plugin", plugins::KEYED_PROBE];
    assert_eq!(state(dir.path(), &plugin), vec![a.clone(), b.clone()]);
    assert_eq!(state(dir.path(), &[&plugin[..], &["--key", "b\u{1}c"]].concat()), vec![b]);

    // Without the plugin: every byte string in hex.
    let plain = state(dir.path(), &["--key", "a"]);
    assert_eq!(plain[0]["variables"]["v"], json!({"kind": "value", "value_hex": sdk_hex("hello")}));
    assert_eq!(
        plain[0]["variables"]["m"]["entries"],
        json!([{"key_hex": "78", "value_hex": sdk_hex("X")}]),
        "a String map key is its UTF-8 bytes"
    );
    let timers = state(dir.path(), &["--show", "timers"]);
    assert_eq!(timers, vec![json!({"expiry_ms": far, "key": "a", "name": null})]);
}
