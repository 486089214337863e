//! `bench kafka`: the sensor plugin over an 8-partition topic on a local tansu broker
//! (`tests/setup.sh` installs it), with one process and with two processes in one
//! consumer group; and the time to restore a partition of `--restore-keys` keys from
//! its changelog. Every run is a `groupstate run` process of `target/release`, in a
//! consumer group of its own, so each reads the whole topic.

// A benchmark: a failed step ends it, loudly.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use groupstate_tests::kafka_broker::Broker;

use crate::{cpu_seconds, median};

const PARTITIONS: i32 = 8;
/// A run stops once every partition has been idle at its end this long; it is taken
/// off the run's time.
const IDLE_MS: u64 = 2_000;

fn groupstate_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("bench exe path");
    let bin = exe.parent().expect("target dir").join("groupstate");
    assert!(bin.exists(), "{} is missing: run `cargo build --release --workspace` first", bin.display());
    bin
}

/// A `groupstate run` of the sensor plugin over `topic` in `group`.
fn run_command(broker: &Broker, topic: &str, group: &str, dir: &Path, workers: Option<usize>) -> Command {
    let mut command = Command::new(groupstate_bin());
    let cache = groupstate_tests::cache_dir();
    command
        .args(["run", "--plugin", groupstate_tests::plugins::SENSOR_ALERTS])
        .args(["--input", &format!("kafka://{}/{topic}", broker.bootstrap()), "--group", group])
        .args(["--output", &dir.join("out.jsonl").display().to_string()])
        .args(["--state-dir", &dir.join("state").display().to_string()])
        .args(["--key-field", "sensor_id", "--time-field", "ts", "--timeout", "event-time"])
        .args(["--batch-events", "20000", "--until-idle-ms", &IDLE_MS.to_string()])
        .args(["--cache-dir", &cache.display().to_string(), "--log-format", "json"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(n) = workers {
        command.args(["--partition-workers", &n.to_string()]);
    }
    command
}

/// Runs `processes` processes in one new group over the topic at once; the seconds
/// until the last one ended, less the idle wait.
fn timed_group(broker: &Broker, group: &str, processes: usize, workers: Option<usize>) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let started = wall_seconds();
    let children: Vec<_> = (0..processes)
        .map(|i| {
            let d = dir.path().join(format!("p{i}"));
            run_command(broker, "sensors", group, &d, workers).spawn().unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "groupstate run failed: {}", String::from_utf8_lossy(&out.stderr));
        if std::env::var_os("BENCH_KAFKA_LOG").is_some() {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    wall_seconds() - started - IDLE_MS as f64 / 1e3
}

/// Wall-clock seconds since the first call (the bench measures time; the host reads
/// it only through clock.rs).
#[allow(clippy::disallowed_methods)]
fn wall_seconds() -> f64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}

/// The message of the JSON log line "restored from the changelog: ... in N ms; ...",
/// and its N.
fn restore_line(stderr: &str) -> Option<(String, f64)> {
    let message = stderr.lines().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        let m = v["message"].as_str()?;
        m.starts_with("restored from the changelog").then(|| m.to_owned())
    })?;
    let ms = message.split(" ms;").next()?.rsplit(' ').next()?.parse().ok()?;
    Some((message, ms))
}

pub fn kafka(events: u64, sensors: u32, runs: usize, restore_keys: u32, workers: Option<usize>) {
    let data = tempfile::tempdir().unwrap();
    let input = groupstate_tests::sensor_input(data.path(), events, sensors, 31);
    let broker = Broker::start();
    broker.create_topic("sensors", PARTITIONS);
    broker.produce_keyed_lines("sensors", PARTITIONS, &input, "sensor_id");
    println!(
        "kafka: {events} events, {sensors} sensors, {PARTITIONS} partitions, batches of 20000, {runs} runs each, partition workers {}",
        workers.map_or("default (cores)".to_owned(), |n| n.to_string())
    );
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for run in 0..runs {
        // Alternated, so that a change in the machine's load hits both alike.
        let cpu = cpu_seconds();
        let t1 = timed_group(&broker, &format!("one-{run}"), 1, workers);
        let t2 = timed_group(&broker, &format!("two-{run}"), 2, workers);
        println!(
            "  run {run}: 1 process {t1:.2} s ({:.0} ev/s), 2 processes {t2:.2} s ({:.0} ev/s); bench cpu {:.1} s",
            events as f64 / t1,
            events as f64 / t2,
            cpu_seconds() - cpu
        );
        one.push(events as f64 / t1);
        two.push(events as f64 / t2);
    }
    let (m1, m2) = (median(one), median(two));
    println!("kafka median: 1 process {m1:.0} events/s, 2 processes {m2:.0} events/s, ratio {:.2}x", m2 / m1);

    // Restore: one partition holding `restore_keys` keys, run once, its state dir
    // removed, run again in the same group: the second run restores it.
    let input = groupstate_tests::sensor_input(data.path(), u64::from(restore_keys) * 2, restore_keys, 7);
    broker.create_topic("restore", 1);
    broker.produce_keyed_lines("restore", 1, &input, "sensor_id");
    let dir = tempfile::tempdir().unwrap();
    let first = run_command(&broker, "restore", "restore", dir.path(), workers).output().unwrap();
    assert!(first.status.success(), "groupstate run failed: {}", String::from_utf8_lossy(&first.stderr));
    let mut times = Vec::new();
    for _ in 0..runs {
        std::fs::remove_dir_all(dir.path().join("state")).unwrap();
        let out = run_command(&broker, "restore", "restore", dir.path(), workers).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "groupstate run failed: {stderr}");
        let (message, ms) = restore_line(&stderr).unwrap_or_else(|| panic!("no restore line in: {stderr}"));
        println!("  {message}");
        times.push(ms);
    }
    println!("kafka restore median: {:.0} ms for a partition of {restore_keys} sensors", median(times));
}
