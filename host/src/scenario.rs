//! Scenarios: a plugin driven through the real engine with a virtual clock, step by
//! step, against what must come out. This is the format of `groupstate test` and of
//! the test suite's `tests/cases/`.
//!
//! A scenario is a TOML file: the pipeline's settings, then `[[step]]`s. A step sets
//! the clock (the processing time of its batches), appends its input lines, reopens
//! the pipeline on the same state dir (so every step is also a restart) and runs it to
//! the end of its input, then compares what the step produced with what it expects:
//! the outputs (as JSON values, in order), the late records, and, when given, the failed
//! plugin calls, the records that could not be decoded, the keys that hold state, the
//! timers and the watermark. Determinism makes every scenario
//! exactly reproducible: the same scenario and plugin give the same result every time.
//!
//! ```toml
//! key_field = "user"
//! time_field = "ts"
//! timeout = "event-time"
//!
//! [[step]]
//! clock_ms = 1000
//! input = ['{"user":"a","ts":10}']
//! expect = ['{"user":"a","count":1}']
//! keys = ["a"]
//! timers = { a = 600010 }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::clock::{Clock, ManualClock};
use crate::config::{ErrorPolicy, PipelineConfig, Stream, TimeoutKind};
use crate::pipeline::Pipeline;

/// A scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// The plugin the scenario was written for. Informational: `groupstate test` runs
    /// the plugin it is given.
    #[serde(default)]
    pub plugin: Option<String>,
    /// The key field (default `key`).
    #[serde(default = "default_key_field")]
    pub key_field: String,
    /// The event-time field, if any.
    #[serde(default)]
    pub time_field: Option<String>,
    /// The timeout kind (default `none`).
    #[serde(default)]
    pub timeout: TimeoutKind,
    /// The watermark delay (default 0).
    #[serde(default)]
    pub watermark_delay_ms: i64,
    /// The plugin's `init` parameters, as `[["name", "value"], ...]`.
    #[serde(default)]
    pub params: Vec<(String, String)>,
    /// What a failed call does (default `fail`).
    #[serde(default)]
    pub on_error: ErrorPolicy,
    /// Follow the input with this trigger interval: steps then need `batches`.
    #[serde(default)]
    pub follow_trigger_ms: Option<u64>,
    /// The steps, in order.
    pub step: Vec<Step>,
}

fn default_key_field() -> String {
    "key".to_owned()
}

/// One step of a scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// The clock during the step: the processing time of its batches.
    pub clock_ms: i64,
    /// Input lines appended before the step runs.
    #[serde(default)]
    pub input: Vec<String>,
    /// The outputs the step must produce, in order, compared as JSON values.
    #[serde(default)]
    pub expect: Vec<String>,
    /// Records the step must send to the late output (default 0).
    #[serde(default)]
    pub late: u64,
    /// With `follow_trigger_ms`: how many batches the step runs.
    #[serde(default)]
    pub batches: Option<u64>,
    /// The clock after the step (how long a follow step waited).
    #[serde(default)]
    pub clock_after_ms: Option<i64>,
    /// Plugin calls of the step that failed (trapped, hit a limit or returned an
    /// error) and were skipped or dead-lettered under `on_error`, if checked.
    #[serde(default)]
    pub failed_calls: Option<u64>,
    /// Input records of the step that could not be decoded, if checked.
    #[serde(default)]
    pub bad_records: Option<u64>,
    /// The keys that hold a state value or a timer after the step, if checked.
    #[serde(default)]
    pub keys: Option<Vec<String>>,
    /// The timers after the step (key to deadline), if checked.
    #[serde(default)]
    pub timers: Option<BTreeMap<String, i64>>,
    /// The watermark the step's last batch ran with, if checked: a batch runs with the
    /// watermark that the batches before it left, so a step's own events show in it
    /// only if a later batch of the step (one that fires timers, say) ran.
    #[serde(default)]
    pub watermark_ms: Option<i64>,
}

/// Reads a scenario file.
pub fn load(path: &Path) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let scenario: Scenario = toml::from_str(&text).map_err(|e| format!("{}: not a scenario: {e}", path.display()))?;
    if scenario.step.is_empty() {
        return Err(format!("{}: a scenario needs at least one [[step]]", path.display()));
    }
    Ok(scenario)
}

/// The scenario files a path names: the file itself, or every `.toml` file in a
/// folder, in name order.
pub fn files(path: &Path) -> Result<Vec<PathBuf>, String> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(format!("{}: no scenario (.toml) files in this folder", path.display()));
    }
    Ok(found)
}

/// A directory removed on drop, for one scenario's state and files.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> Result<Self, String> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("groupstate-scenario-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `scenario` with the plugin at `plugin` (compiled components cached in
/// `cache_dir`). `Err` says which step failed and how, with a diff of the outputs.
pub fn run(scenario: &Scenario, plugin: &Path, cache_dir: Option<&Path>) -> Result<(), String> {
    let dir = WorkDir::new()?;
    let input = dir.0.join("in.jsonl");
    let output = dir.0.join("out.jsonl");
    std::fs::write(&input, "").map_err(|e| e.to_string())?;
    let mut config = PipelineConfig::new(
        plugin.to_owned(),
        Stream::File(input.clone()),
        Stream::File(output.clone()),
        dir.0.join("state"),
        scenario.key_field.clone(),
    );
    config.timeout = scenario.timeout;
    config.time_field = scenario.time_field.clone();
    config.watermark_delay_ms = scenario.watermark_delay_ms;
    config.params = scenario.params.clone();
    config.on_error = scenario.on_error;
    config.durable_commits = false;
    config.cache_dir = cache_dir.map(Path::to_owned);
    if let Some(ms) = scenario.follow_trigger_ms {
        config.follow = true;
        config.trigger_interval_ms = ms;
    }
    let mut seen = 0;
    for (i, step) in scenario.step.iter().enumerate() {
        let at = |msg: String| format!("step {} (clock_ms {}): {msg}", i + 1, step.clock_ms);
        run_step(&config, step, &input, &output, &mut seen).map_err(at)?;
    }
    Ok(())
}

fn run_step(config: &PipelineConfig, step: &Step, input: &Path, output: &Path, seen: &mut usize) -> Result<(), String> {
    if config.follow && step.batches.is_none() {
        // A followed file never ends: only a batch count stops the run.
        return Err("a step of a follow scenario needs `batches`".into());
    }
    let mut appended = String::new();
    for line in &step.input {
        appended.push_str(line);
        appended.push('\n');
    }
    let mut file = std::fs::OpenOptions::new().append(true).open(input).map_err(|e| e.to_string())?;
    std::io::Write::write_all(&mut file, appended.as_bytes()).map_err(|e| e.to_string())?;
    let clock = ManualClock::new(step.clock_ms);
    let mut step_config = config.clone();
    step_config.batches_max = step.batches;
    let mut pipeline = Pipeline::open(step_config, Arc::new(clock.clone())).map_err(|e| e.to_string())?;
    let summary = pipeline.run(&mut |_| {}).map_err(|e| e.to_string())?;

    let out = std::fs::read_to_string(output).map_err(|e| e.to_string())?;
    let lines: Vec<&str> = out.lines().collect();
    let new = &lines[*seen..];
    *seen = lines.len();
    let parse = |what: &str, l: &str| serde_json::from_str(l).map_err(|e| format!("{what} {l:?} is not JSON: {e}"));
    let got: Vec<serde_json::Value> = new.iter().map(|l| parse("output", l)).collect::<Result<_, _>>()?;
    let want: Vec<serde_json::Value> =
        step.expect.iter().map(|l| parse("expected output", l)).collect::<Result<_, _>>()?;
    let mut problems = Vec::new();
    if got != want {
        problems.push(format!("outputs differ (- expected, + produced):\n{}", diff(&want, &got)));
    }
    if summary.run.late != step.late {
        problems.push(format!("{} late records, expected {}", summary.run.late, step.late));
    }
    let counted = [
        ("failed plugin calls", step.failed_calls, summary.run.failed_calls),
        ("bad records", step.bad_records, summary.run.bad_records),
    ];
    for (what, want, got) in counted {
        if let Some(want) = want
            && want != got
        {
            problems.push(format!("{got} {what}, expected {want}"));
        }
    }
    if let Some(after) = step.clock_after_ms {
        let now = clock.now_ms();
        if now != after {
            problems.push(format!("the clock ended at {now}, expected {after}"));
        }
    }
    let store = pipeline.store();
    if let Some(want_keys) = &step.keys {
        let mut keys = Vec::new();
        for entry in store.iter_keys() {
            keys.push(entry.map_err(|e| e.to_string())?.0);
        }
        let mut want_keys = want_keys.clone();
        want_keys.sort();
        if keys != want_keys {
            problems.push(format!("keys holding state: {keys:?}, expected {want_keys:?}"));
        }
    }
    if let Some(want_timers) = &step.timers {
        let mut timers = BTreeMap::new();
        for entry in store.iter_timers() {
            let (deadline, key) = entry.map_err(|e| e.to_string())?;
            timers.insert(key, deadline);
        }
        if &timers != want_timers {
            problems.push(format!("timers: {timers:?}, expected {want_timers:?}"));
        }
    }
    if let Some(want_wm) = step.watermark_ms {
        let wm = store.checkpoint().map_err(|e| e.to_string())?.map_or(i64::MIN, |c| c.watermark_ms);
        if wm != want_wm {
            problems.push(format!("watermark {wm}, expected {want_wm}"));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("\n")) }
}

/// The lines of `want` and `got` as a diff: common lines with two spaces, lines only
/// expected with `-`, lines only produced with `+` (a longest common subsequence).
pub fn diff(want: &[serde_json::Value], got: &[serde_json::Value]) -> String {
    let (n, m) = (want.len(), got.len());
    // lcs[i][j]: the longest common subsequence of want[i..] and got[j..].
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if want[i] == got[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && want[i] == got[j] {
            out.push(format!("    {}", want[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push(format!("  - {}", want[i]));
            i += 1;
        } else {
            out.push(format!("  + {}", got[j]));
            j += 1;
        }
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diff_marks_missing_and_extra_lines() {
        let want = [json!({"a": 1}), json!({"b": 2}), json!({"c": 3})];
        let got = [json!({"a": 1}), json!({"c": 3}), json!({"d": 4})];
        assert_eq!(diff(&want, &got), "    {\"a\":1}\n  - {\"b\":2}\n    {\"c\":3}\n  + {\"d\":4}");
    }
}
