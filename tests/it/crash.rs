//! Crash testing: `groupstate run` as a child process, killed with SIGKILL at random
//! moments and restarted on the same state dir, must end with exactly the output of an
//! uninterrupted run: no line missing, none doubled. Set GROUPSTATE_CRASH_SEED to replay
//! a failure with the seed it printed, and GROUPSTATE_CRASH_EVENTS and
//! GROUPSTATE_CRASH_SENSORS for a larger workload (500 000 events from 5 000 sensors by
//! default; the README gives the 1M-sensor command).

use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use groupstate::Clock;
use groupstate::store::Store;
use groupstate::workload::Rng;
use groupstate_tests::{assert_same_alerts, copy_dir, oracle, parse_alerts, sensor_input, store_contents};

use crate::cli::{groupstate_bin, sensor_run_args};

/// Kills before the run is allowed to finish.
const KILLS: u32 = 25;

fn run_args(input: &Path, dir: &Path) -> Vec<String> {
    let p = |name: &str| dir.join(name).display().to_string();
    let mut args = sensor_run_args(&input.display().to_string(), &p("out.jsonl"), &p("state"));
    // Key cuts end most batches early (5000 records carry ~3000 of the 5000 sensors),
    // so replays of cut plans are killed too.
    args.extend(["--batch-events", "5000", "--batch-keys", "1500"].map(String::from));
    args
}

/// A number from the environment, or `default`.
fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |s| s.parse().unwrap_or_else(|_| panic!("{name} is a number")))
}

fn seed() -> u64 {
    match std::env::var("GROUPSTATE_CRASH_SEED") {
        Ok(s) => s.parse().expect("GROUPSTATE_CRASH_SEED is a number"),
        Err(_) => std::collections::hash_map::RandomState::new().build_hasher().finish(),
    }
}

#[test]
fn kill_9_at_random_moments_loses_and_doubles_nothing() {
    let seed = seed();
    println!("crash test seed {seed} (GROUPSTATE_CRASH_SEED={seed} replays it)");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let (events, sensors) =
        (env_number("GROUPSTATE_CRASH_EVENTS", 500_000), env_number("GROUPSTATE_CRASH_SENSORS", 5_000));
    let input = sensor_input(dir.path(), events, sensors as u32, seed % 1000);
    let clock = groupstate::SystemClock;

    // The uninterrupted reference run, timed to scale the kill delays.
    let reference = dir.path().join("reference");
    let started = clock.monotonic_ns();
    let status = Command::new(groupstate_bin()).args(run_args(&input, &reference)).status().unwrap();
    assert!(status.success(), "reference run failed");
    let reference_ms = (clock.monotonic_ns() - started) / 1_000_000;

    let crashed = dir.path().join("crashed");
    let mut kills = 0u32;
    let mut restarts = 0u32;
    // Restarts that found commits in the redo log (not yet folded into sled).
    let mut logs_replayed = 0u32;
    // Kills that landed while a fold ran on its own thread (its log still aside).
    let mut folds_cut = 0u32;
    // Kills before the first run had made its store.
    let mut early_kills = 0u32;
    loop {
        restarts += 1;
        assert!(restarts < KILLS + 100, "the run never finished");
        // Each restart buffers state changes differently: a fold into sled after about
        // every batch, every few batches, or only at the end of the run.
        let buffer = ["65536", "1048576", "67108864"][rng.range(0, 3) as usize];
        let mut child = Command::new(groupstate_bin())
            .args(run_args(&input, &crashed))
            .args(["--store-buffer", buffer])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if kills < KILLS {
            // Short enough that the run cannot finish within the kills, long enough that
            // most kills land after the plugin is loaded, inside batches.
            let delay_ms = rng.range(5, (reference_ms / 60 + 60) as i64) as u64;
            std::thread::sleep(Duration::from_millis(delay_ms));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
                let store_dir = crashed.join("state").join("store");
                if !store_dir.exists() {
                    // Killed before its first open made the store (the plugin still
                    // loading): there is nothing to check yet.
                    early_kills += 1;
                    continue;
                }
                // The state dir must open and be consistent after every kill. A copy is
                // checked: opening folds the redo log, and the restart must find it as
                // the kill left it.
                let copy = dir.path().join(format!("check-{kills}"));
                copy_dir(&store_dir, &copy);
                folds_cut += u32::from(copy.join("redo.folding.log").exists());
                let store = Store::open(&copy, 1 << 20, 1 << 20, 1 << 20)
                    .unwrap_or_else(|e| panic!("seed {seed}: state dir unopenable after kill {kills}: {e}"));
                store.check_consistency().unwrap_or_else(|e| panic!("seed {seed}: after kill {kills}: {e}"));
                logs_replayed +=
                    u32::from(std::fs::metadata(crashed.join("state/store/redo.log")).is_ok_and(|m| m.len() > 0));
                drop(store);
                std::fs::remove_dir_all(&copy).unwrap();
                continue;
            }
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "seed {seed}: restart failed: {}", String::from_utf8_lossy(&out.stderr));
        break;
    }
    println!(
        "crash test: {kills} kills ({early_kills} before the store was made), {restarts} runs, {logs_replayed} restarts over a non-empty redo log, {folds_cut} in the middle of a fold on its own thread, reference run {reference_ms} ms"
    );
    assert!(
        kills - early_kills >= 20,
        "seed {seed}: only {} kills landed after the store was made",
        kills - early_kills
    );
    assert!(logs_replayed > 0, "seed {seed}: no restart replayed a redo log");

    for name in ["out.jsonl", "state/late.jsonl", "state/dead-letter.jsonl"] {
        let want = std::fs::read(reference.join(name)).unwrap();
        let got = std::fs::read(crashed.join(name)).unwrap();
        assert!(
            got == want,
            "seed {seed}: {name} differs from the uninterrupted run ({} vs {} bytes)",
            got.len(),
            want.len()
        );
    }
    assert_same_alerts(&parse_alerts(&crashed.join("out.jsonl")), &oracle::sensor_alerts(&input));
    // The state too: every key's record and timer, and the checkpoint.
    let open = |dir: &Path| Store::open(&dir.join("state/store"), 1 << 20, 1 << 20, 1 << 20).unwrap();
    let (want, got) = (open(&reference), open(&crashed));
    assert!(store_contents(&got) == store_contents(&want), "seed {seed}: the state differs from the uninterrupted run");
    // Batches are cut the same way from the same offsets, so even the counters agree.
    assert_eq!(got.checkpoint().unwrap(), want.checkpoint().unwrap(), "seed {seed}: the checkpoints differ");
}
