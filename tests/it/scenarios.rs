//! Data-driven GroupState scenarios: each `tests/cases/*.toml` is a pipeline of the
//! probe plugin plus steps; a step sets the clock, appends input lines, reopens the
//! pipeline on the same state dir (so every step is also a restart), runs it to the end
//! of the input and compares the calls the probe reports with `expect`, in order.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use groupstate::config::{PipelineConfig, Stream, TimeoutKind};
use groupstate::{ManualClock, Pipeline};
use groupstate_tests::{cache_dir, plugins};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    /// The plugin: `probe` (default) or `inactivity-alert`.
    #[serde(default)]
    plugin: Option<String>,
    /// The key field (default `k`).
    #[serde(default)]
    key_field: Option<String>,
    timeout: TimeoutKind,
    #[serde(default)]
    time_field: Option<String>,
    #[serde(default)]
    watermark_delay_ms: i64,
    #[serde(default)]
    params: Vec<(String, String)>,
    #[serde(default)]
    follow_trigger_ms: Option<u64>,
    step: Vec<Step>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    clock_ms: i64,
    #[serde(default)]
    input: Vec<String>,
    #[serde(default)]
    expect: Vec<String>,
    #[serde(default)]
    late: u64,
    /// With `follow_trigger_ms`: how many batches this step runs before it stops.
    #[serde(default)]
    batches: Option<u64>,
    /// The clock after the step (checks how long a follow step waited).
    #[serde(default)]
    clock_after_ms: Option<i64>,
}

fn check(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let case: Case = toml::from_str(&text).map_err(|e| format!("bad case file: {e}"))?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let input = dir.path().join("in.jsonl");
    let output = dir.path().join("out.jsonl");
    std::fs::write(&input, "").map_err(|e| e.to_string())?;
    let plugin = match case.plugin.as_deref().unwrap_or("probe") {
        "probe" => plugins::PROBE,
        "inactivity-alert" => plugins::INACTIVITY_ALERT,
        other => return Err(format!("unknown plugin {other:?}")),
    };
    let mut config = PipelineConfig::new(
        PathBuf::from(plugin),
        Stream::File(input.clone()),
        Stream::File(output.clone()),
        dir.path().join("state"),
        case.key_field.clone().unwrap_or_else(|| "k".into()),
    );
    config.timeout = case.timeout;
    config.time_field = case.time_field.clone();
    config.watermark_delay_ms = case.watermark_delay_ms;
    config.params = case.params.clone();
    config.durable_commits = false;
    config.cache_dir = Some(cache_dir());
    if let Some(ms) = case.follow_trigger_ms {
        config.follow = true;
        config.trigger_interval_ms = ms;
    }
    let mut seen = 0;
    for (i, step) in case.step.iter().enumerate() {
        let at = |msg: String| format!("step {} (clock {}): {msg}", i + 1, step.clock_ms);
        let mut appended = String::new();
        for line in &step.input {
            appended.push_str(line);
            appended.push('\n');
        }
        let mut file = std::fs::OpenOptions::new().append(true).open(&input).map_err(|e| e.to_string())?;
        std::io::Write::write_all(&mut file, appended.as_bytes()).map_err(|e| e.to_string())?;
        let clock = ManualClock::new(step.clock_ms);
        if config.follow && step.batches.is_none() {
            // A followed file never ends: only a batch count stops the run.
            return Err(at("a step of a follow case needs `batches`".into()));
        }
        let mut step_config = config.clone();
        step_config.batches_max = step.batches;
        let mut pipeline = Pipeline::open(step_config, Arc::new(clock.clone())).map_err(|e| at(e.to_string()))?;
        let summary = pipeline.run(&mut |_| {}).map_err(|e| at(e.to_string()))?;
        drop(pipeline);
        let out = std::fs::read_to_string(&output).map_err(|e| e.to_string())?;
        let lines: Vec<&str> = out.lines().collect();
        let new = &lines[seen..];
        seen = lines.len();
        let got: Vec<serde_json::Value> = new
            .iter()
            .map(|l| serde_json::from_str(l).map_err(|e| at(format!("output {l:?}: {e}"))))
            .collect::<Result<_, _>>()?;
        let want: Vec<serde_json::Value> = step
            .expect
            .iter()
            .map(|l| serde_json::from_str(l).map_err(|e| at(format!("expect {l:?}: {e}"))))
            .collect::<Result<_, _>>()?;
        if got != want {
            return Err(at(format!(
                "calls differ\n  got:  {}\n  want: {}",
                new.join("\n        "),
                step.expect.join("\n        ")
            )));
        }
        if summary.run.late != step.late {
            return Err(at(format!("{} late records, expected {}", summary.run.late, step.late)));
        }
        if let Some(after) = step.clock_after_ms {
            let now = groupstate::Clock::now_ms(&clock);
            if now != after {
                return Err(at(format!("clock ended at {now}, expected {after}")));
            }
        }
    }
    Ok(())
}

#[test]
fn groupstate_scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cases");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/cases")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 8, "expected the scenario files in {}", dir.display());
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|p| check(p).err().map(|e| format!("{}: {e}", p.file_name().unwrap_or_default().to_string_lossy())))
        .collect();
    assert!(failures.is_empty(), "{} of {} scenarios failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
