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

#[test]
fn a_toml_pipeline_file_runs_with_paths_relative_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    groupstate_tests::sensor_input(dir.path(), 20_000, 200, 9);
    std::fs::rename(dir.path().join("sensor-20000-200-9.jsonl"), &input).unwrap();
    let toml = format!(
        r#"plugin = {plugin:?}
input = "in.jsonl"
output = "out/alerts.jsonl"
state_dir = "state"
key_field = "sensor_id"
time_field = "ts"
timeout = "event-time"
batch_events_max = 3000
params = [["window_ms", "60000"]]

[limits]
call_cpu_ms_max = 500
"#,
        plugin = plugins::SENSOR_ALERTS
    );
    std::fs::write(dir.path().join("pipeline.toml"), toml).unwrap();
    // Run from another directory: the paths in the file are relative to the file.
    let out = Command::new(groupstate_bin())
        .args(["run", "--config", "pipeline.toml", "--no-cache", "--quiet"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want = oracle::sensor_alerts(&input);
    assert_same_alerts(&parse_alerts(&dir.path().join("out").join("alerts.jsonl")), &want);

    // An unknown key is an error that names it.
    std::fs::write(dir.path().join("bad.toml"), "plugin = \"p.wasm\"\nbatch_size = 5\n").unwrap();
    let out = groupstate(&["run", "--config", &dir.path().join("bad.toml").display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("batch_size"), "{stderr}");
}

#[test]
fn stdin_is_read_until_it_closes_even_across_pauses() {
    let dir = tempfile::tempdir().unwrap();
    let input = groupstate_tests::sensor_input(dir.path(), 20_000, 300, 4);
    let text = std::fs::read(&input).unwrap();
    let (output, state_dir) = (dir.path().join("out.jsonl"), dir.path().join("state"));
    let mut args = sensor_run_args("-", &output.display().to_string(), &state_dir.display().to_string());
    args.extend(["--trigger-interval-ms", "50", "--batch-events", "4000"].map(String::from));
    let mut child = Command::new(groupstate_bin())
        .args(&args)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let half = text.len() / 2;
    let cut = half + text[half..].iter().position(|&b| b == b'\n').unwrap() + 1;
    std::io::Write::write_all(&mut stdin, &text[..cut]).unwrap();
    // A pause longer than several trigger intervals: the run must wait, not end.
    std::thread::sleep(std::time::Duration::from_millis(400));
    std::io::Write::write_all(&mut stdin, &text[cut..]).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("20000 records"), "{stderr}");
    assert_same_alerts(&parse_alerts(&output), &oracle::sensor_alerts(&input));
}

#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "set -o pipefail; {bin} gen sensor --events 200000 --sensors 100 --output - | head -n 1 >/dev/null",
        bin = groupstate_bin().display()
    );
    let out = Command::new("bash").arg("-c").arg(&script).current_dir(dir.path()).output().unwrap();
    assert!(out.status.success(), "exit {:?}: {}", out.status.code(), String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let refused = groupstate(&["gen", "sensor", "--sensors", "0", "--output", "-"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--sensors must be at least 1"));
}

#[test]
fn many_late_records_bring_a_warning_that_names_the_watermark_delay() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let input = groupstate_tests::sensor_input(dir.path(), 20_000, 200, 3);
    // Out of order: each block of 1000 lines reversed, so that most batches of 100
    // fall behind the watermark of the batch before.
    let text = std::fs::read_to_string(&input).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    for block in lines.chunks_mut(1000) {
        block.reverse();
    }
    std::fs::write(p("shuffled.jsonl"), lines.join("\n") + "\n").unwrap();
    let run = |input: &str, state: &str, extra: &[&str]| {
        let mut args = sensor_run_args(input, &p(&format!("{state}.out")), &p(state));
        args.retain(|a| a != "--quiet");
        args.extend(["--no-fsync"].map(String::from));
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = Command::new(groupstate_bin()).args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let warned = run(&p("shuffled.jsonl"), "late", &["--batch-events", "100"]);
    assert!(warned.contains("warning:") && warned.contains("--watermark-delay-ms (now 0)"), "{warned}");
    let quiet = run(&p("shuffled.jsonl"), "delayed", &["--batch-events", "100", "--watermark-delay-ms", "600000"]);
    assert!(!quiet.contains("--watermark-delay-ms (now"), "{quiet}");
    // The summary counts in words that agree with the numbers.
    let one = run(&input.display().to_string(), "one", &["--batch-events", "100000"]);
    assert!(one.contains(" batch, 20000 records") || one.contains(" batches, 20000 records"), "{one}");
    assert!(!one.contains("1 batches") && !one.contains(" 1 calls"), "{one}");
}

#[test]
fn plugin_inspection_lists_interfaces_not_the_resource_types_they_share() {
    let out = groupstate(&["plugin", plugins::SENSOR_ALERTS]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let imports: Vec<&str> = report["imports"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(imports.iter().any(|i| i.starts_with("groupstate:plugin/state@")), "{imports:?}");
    assert!(imports.iter().all(|i| i.contains(':')), "a bare type among the imports: {imports:?}");
    let exports: Vec<&str> = report["exports"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(exports.contains(&"process"), "{exports:?}");
    assert_eq!(report["info"]["name"], "sensor-alerts");
    assert_eq!(report["forbidden_imports"], serde_json::json!([]));
}

#[test]
fn log_lines_in_json_carry_level_target_message_and_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(p("in.jsonl"), "{\"k\":\"a\",\"do\":\"print\"}\n{\"k\":\"b\",\"do\":\"print\"}\n").unwrap();
    let cache = groupstate_tests::cache_dir().display().to_string();
    let run = |input: &str, format: &[&str]| {
        let (output, state) = (p("out.jsonl"), p("state"));
        let args =
            ["run", "--plugin", plugins::ADVERSARY, "--input", input, "--output", &output, "--state-dir", &state];
        let args =
            args.into_iter().chain(["--key-field", "k", "--cache-dir", &cache, "--batch-events", "1", "--no-fsync"]);
        let mut command = Command::new(groupstate_bin());
        command.args(args).env_remove("GROUPSTATE_LOG_FORMAT");
        if format.is_empty() {
            command.env("GROUPSTATE_LOG_FORMAT", "json");
        } else {
            command.args(format);
        }
        let out = command.output().unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
            .collect();
        (out.status.success(), lines)
    };
    let (ok, lines) = run(&p("in.jsonl"), &["--log-format", "json"]);
    assert!(ok, "{lines:?}");
    for line in &lines {
        assert!(["INFO", "WARN", "ERROR"].contains(&line["level"].as_str().unwrap()), "{line}");
        assert!(line["target"].as_str().unwrap().starts_with("groupstate"), "{line}");
        assert!(line["time_ms"].as_i64().is_some(), "{line}");
    }
    // What the plugin printed in each batch carries the batch.
    let printed = |key: &str| {
        let message = format!("plugin adversary key=\"{key}\" stdout: hello on stdout from {key}");
        lines.iter().find(|l| l["message"] == message.as_str()).unwrap_or_else(|| panic!("{message:?}: {lines:?}"))
    };
    assert_eq!((printed("a")["batch"].as_u64(), printed("b")["batch"].as_u64()), (Some(0), Some(1)));
    let done = lines.iter().find(|l| l["message"].as_str().unwrap().starts_with("done: 2 batches, 2 records")).unwrap();
    assert_eq!((done["level"].as_str(), done["batches"].as_u64()), (Some("INFO"), Some(2)));

    // GROUPSTATE_LOG_FORMAT does the same, and a failure is a JSON line too.
    let (ok, lines) = run(&p("missing.jsonl"), &[]);
    assert!(!ok);
    let last = lines.last().unwrap();
    assert_eq!(last["level"], "ERROR");
    assert!(
        last["message"].as_str().unwrap().contains("missing.jsonl")
            && last["message"].as_str().unwrap().contains("check the path"),
        "{last}"
    );
}
