//! The `groupstate` binary, called exactly as the CLI contract says.

use std::path::PathBuf;
use std::process::Command;

use groupstate_tests::{assert_same_alerts, oracle, parse_alerts, plugins};

/// The release binary, built by `cargo build --release` (the README's test command
/// builds it before running the tests).
pub fn groupstate_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe path");
    // target/release/deps/it-<hash> -> target/release/groupstate
    let bin = exe.parent().and_then(|d| d.parent()).expect("target dir").join("groupstate");
    assert!(bin.exists(), "{} is missing: run `cargo build --release --workspace` before the tests", bin.display());
    bin
}

/// `groupstate run` of the sensor plugin, with the CLI contract's flags and the tests'
/// compile cache; callers add more.
pub fn sensor_run_args(input: &str, output: &str, state_dir: &str) -> Vec<String> {
    let cache = groupstate_tests::cache_dir().display().to_string();
    [
        "run",
        "--plugin",
        plugins::SENSOR_ALERTS,
        "--input",
        input,
        "--output",
        output,
        "--state-dir",
        state_dir,
        "--key-field",
        "sensor_id",
        "--time-field",
        "ts",
        "--timeout",
        "event-time",
        "--cache-dir",
        &cache,
        "--quiet",
    ]
    .map(String::from)
    .to_vec()
}

fn groupstate(args: &[&str]) -> std::process::Output {
    Command::new(groupstate_bin()).args(args).output().expect("run groupstate")
}

#[test]
fn gen_and_run_through_the_cli_match_the_oracle() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (input, output, state_dir) = (p("in.jsonl"), p("out.jsonl"), p("state"));
    let generated =
        groupstate(&["gen", "sensor", "--events", "100000", "--sensors", "1000", "--seed", "5", "--output", &input]);
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
    let mut args = sensor_run_args(&input, &output, &state_dir);
    args.extend(["--watermark-delay-ms", "0", "--batch-events", "10000"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = groupstate(&args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("100000 records"), "summary missing: {stderr}");
    let want = oracle::sensor_alerts(&dir.path().join("in.jsonl"));
    assert_same_alerts(&parse_alerts(&dir.path().join("out.jsonl")), &want);

    // The state inspector shows the keys still holding state as JSON.
    let state = groupstate(&["state", "--state-dir", &state_dir, "--show", "timers"]);
    assert!(state.status.success());
    let timers = String::from_utf8_lossy(&state.stdout);
    let first: serde_json::Value = serde_json::from_str(timers.lines().next().expect("some timers")).unwrap();
    assert!(first["deadline_ms"].as_i64().is_some() && first["key"].as_str().is_some());
}

#[test]
fn bad_invocations_fail_with_clear_messages() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (garbage, input, out) = (p("garbage.wasm"), p("in.jsonl"), p("o"));
    let (s1, s2) = (p("s"), p("s2"));
    std::fs::write(&garbage, b"not wasm at all").unwrap();
    std::fs::write(&input, b"{}\n").unwrap();
    let cases: [(Vec<&str>, &str); 3] = [
        (vec!["run", "--input", "x"], "--plugin is required"),
        (
            vec![
                "run",
                "--plugin",
                &garbage,
                "--input",
                &input,
                "--output",
                &out,
                "--state-dir",
                &s1,
                "--key-field",
                "k",
                "--no-cache",
            ],
            "not a WebAssembly file",
        ),
        (
            vec![
                "run",
                "--plugin",
                plugins::SENSOR_ALERTS,
                "--input",
                &input,
                "--output",
                &out,
                "--state-dir",
                &s2,
                "--key-field",
                "k",
                "--timeout",
                "event-time",
            ],
            "needs --time-field",
        ),
    ];
    for (args, needle) in cases {
        let out = groupstate(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(needle), "{args:?}: expected {needle:?} in {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
