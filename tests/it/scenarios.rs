//! Data-driven GroupState scenarios: each `tests/cases/*.toml` is a scenario in the
//! format of `groupstate test` (see `groupstate::scenario`), run with the test plugin
//! its `plugin` field names (the probe by default).

use std::path::{Path, PathBuf};

use groupstate::scenario;
use groupstate_tests::{cache_dir, plugins};

fn check(path: &Path) -> Result<(), String> {
    let case = scenario::load(path)?;
    let plugin = match case.plugin.as_deref().unwrap_or("probe") {
        "probe" => plugins::PROBE,
        "inactivity-alert" => plugins::INACTIVITY_ALERT,
        "inactivity-alert-v2" => plugins::INACTIVITY_ALERT_V2,
        "inactivity-alert-v2-c" => plugins::INACTIVITY_ALERT_V2_C,
        other => return Err(format!("unknown plugin {other:?}")),
    };
    scenario::run(&case, Path::new(plugin), Some(&cache_dir()))
}

#[test]
fn groupstate_scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cases");
    let cases: Vec<PathBuf> = scenario::files(&dir).expect("tests/cases");
    assert!(cases.len() >= 8, "expected the scenario files in {}", dir.display());
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|p| check(p).err().map(|e| format!("{}: {e}", p.file_name().unwrap_or_default().to_string_lossy())))
        .collect();
    assert!(failures.is_empty(), "{} of {} scenarios failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// A wrong expectation fails, and the failure shows the outputs as a diff.
#[test]
fn a_wrong_expectation_fails_with_a_diff() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("wrong.toml");
    let good =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("cases/event-time-rules.toml")).unwrap();
    // The first step's call reports wm 0; expect 1 instead.
    let wrong = good.replacen("\"wm\":0,", "\"wm\":1,", 1);
    assert_ne!(wrong, good);
    std::fs::write(&case, wrong).unwrap();
    let err = check(&case).unwrap_err();
    assert!(err.starts_with("step 1 (clock_ms 7): outputs differ"), "{err}");
    assert!(err.contains("\n  - {") && err.contains("\n  + {") && err.contains("\"wm\":1"), "{err}");
}
