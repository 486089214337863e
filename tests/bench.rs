//! The benchmark (WORKLOAD.md's workload; figures in BENCHMARKS.md). Run it with
//! `cargo run --release -p groupstate-tests --bin bench -- <scenario> [options]`:
//!
//! - `throughput [--events N,..] [--sensors K,..] [--runs R] [--batch-events B] [--configs floor,native,wasm,wasm-v2]`: the sensor
//!   workload end to end with state in sled committed (fsync) every batch, three ways on
//!   the same input: the wasm plugin, the same logic as a native Rust function inside the
//!   host (what the sandbox costs), and a plain in-memory loop over the file (the floor);
//!   `wasm-v2` runs the 0.2 state API over the same input (inactivity-alert-v2).
//!   Each run is a child process, so peak RSS is its own. Prints medians and ratios;
//!   with several event or sensor counts, every pair runs interleaved and the cost of an
//!   event is compared across them (e.g. `--sensors 10000,1000000`: at 1M keys
//!   against 10k).
//! - `timers [--keys 10000,1000000] [--batches B]`: the time of a batch that fires no
//!   timeout while N keys hold timers, and the recovery time (open + first batch) with
//!   N keys in state.
//!
//! - `swap [--runs R]`: hot load of the counter test plugin, v1 -> v2 with a state
//!   migration: the background load of v2 with the compile cache cold and warm, and the
//!   pause at the batch boundary (the swap batch against the batches around it).
//!
//! - `state [--size N] [--ops K] [--runs R]`: 0.2 state (the keyed-probe plugin): the
//!   cost of one list-append on a list of 0 elements against one of N (default 10 000),
//!   and of one map-put into a map of 0 entries against one of N, each measured as a
//!   batch of one call making K (default 1000) appends or puts of new elements; the
//!   median per operation of the call (plugin stage: the wasm call, its store reads and
//!   staging) and of the whole batch (commit included), and their ratios.
//!
//! Numbers on a shared 2-core machine are noisy: compare ratios from the same run.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use groupstate::config::TimeoutKind;
use groupstate::plugin::{CallError, CallOutcome, CallRequest, PluginInfo, StagedValue};
use groupstate::store::{Checkpoint, KeyChange, KeyRecord, Store};
use groupstate::workload::{SensorSpec, generate_sensor};
use groupstate::{Clock, Pipeline, StageTimes, StateFunction, SystemClock};
use groupstate_tests::{plugins, sensor_config};
use serde::Deserialize;

/// The same allocator as the `groupstate` binary.
#[global_allocator]
static ALLOCATOR: groupstate::allocator::Allocator = groupstate::allocator::Allocator;

const GAP_MS: i64 = 600_000;
const WINDOW_MS: i64 = 60_000;

#[path = "bench/kafka.rs"]
mod kafka;

fn main() {
    groupstate::allocator::configure();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str, default: &str| -> String {
        args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.to_owned())
    };
    let num = |name: &str, default: u64| -> u64 {
        let value = flag(name, &default.to_string());
        value.parse().unwrap_or_else(|_| usage(&format!("{name} takes a number, not {value:?}")))
    };
    let list = |name: &str, default: &str| -> Vec<u64> {
        let value = flag(name, default);
        value
            .split(',')
            .map(|n| n.parse())
            .collect::<Result<_, _>>()
            .unwrap_or_else(|_| usage(&format!("{name} takes numbers separated by commas, not {value:?}")))
    };
    // At least one: a median of no runs, or a workload of no sensors, is nothing.
    let count = |name: &str, default: u64| -> u64 {
        let n = num(name, default);
        if n == 0 {
            usage(&format!("{name} takes 1 or more"));
        }
        n
    };
    let small = |n: u64, name: &str| -> u32 {
        u32::try_from(n).unwrap_or_else(|_| usage(&format!("{name} takes at most {}", u32::MAX)))
    };
    match args.first().map(String::as_str) {
        Some("throughput") => {
            let configs = flag("--configs", "floor,native,wasm");
            let configs: Vec<&str> = configs.split(',').collect();
            if let Some(other) = configs.iter().find(|c| !CONFIGS.contains(c)) {
                usage(&format!("no config {other:?} ({})", CONFIGS.join(", ")));
            }
            let sensors = list("--sensors", "10000");
            if sensors.iter().any(|&s| s == 0 || u32::try_from(s).is_err()) {
                usage(&format!("--sensors takes counts from 1 to {}", u32::MAX));
            }
            throughput(
                &list("--events", "1000000"),
                &sensors,
                count("--runs", 3) as usize,
                num("--batch-events", 0) as usize,
                &configs,
            )
        }
        Some("timers") => timers(&list("--keys", "10000,1000000"), num("--batches", 20) as usize),
        Some("swap") => swap(count("--runs", 5) as usize),
        Some("state") => state_cost(num("--size", 10_000), num("--ops", 1000), count("--runs", 5) as usize),
        Some("kafka") => kafka::kafka(
            num("--events", 200_000),
            small(count("--sensors", 10_000), "--sensors"),
            count("--runs", 3) as usize,
            small(num("--restore-keys", 100_000), "--restore-keys"),
            args.iter().any(|a| a == "--partition-workers").then(|| num("--partition-workers", 0) as usize),
        ),
        // A child process of `throughput`: one run, one JSON line on stdout.
        Some("one") if args.len() >= 3 && !args[2].starts_with("--") => {
            one(&args[1], Path::new(&args[2]), num("--batch-events", 0) as usize)
        }
        Some("one") => usage(&format!("one takes a config ({}) and an input file", CONFIGS.join(", "))),
        Some("-h" | "--help" | "help") => usage(""),
        Some(other) => usage(&format!("no scenario {other:?}")),
        None => usage("which scenario?"),
    }
}

/// Prints what went wrong and exits with status 1.
fn fail(problem: &str) -> ! {
    eprintln!("bench: {problem}");
    std::process::exit(1);
}

/// Prints `problem` (if any) and the usage, and exits with status 2 (0 when asked for
/// help).
fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("bench: {problem}");
    }
    eprintln!(
        "usage: bench throughput [--events N,..] [--sensors K,..] [--runs R] [--batch-events B] [--configs {}]",
        CONFIGS.join(",")
    );
    eprintln!("       bench timers [--keys 10000,1000000] [--batches B]");
    eprintln!("       bench swap [--runs R]");
    eprintln!("       bench state [--size N] [--ops K] [--runs R]");
    eprintln!("       bench kafka [--events N] [--sensors K] [--runs R] [--restore-keys K] [--partition-workers W]");
    eprintln!("       bench one {} FILE [--batch-events B]   (one run, one JSON line)", CONFIGS.join("|"));
    std::process::exit(if problem.is_empty() { 0 } else { 2 });
}

/// The configurations `throughput` and `one` run.
const CONFIGS: [&str; 4] = ["floor", "native", "wasm", "wasm-v2"];

fn data_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target").join("bench-data");
    std::fs::create_dir_all(&dir).expect("create target/bench-data");
    dir
}

/// Whether the pipelines wait for each commit to reach the disk: yes, unless
/// `BENCH_NO_FSYNC` is set (to measure what the fsyncs cost).
fn durable_commits() -> bool {
    std::env::var_os("BENCH_NO_FSYNC").is_none()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One workload of a `throughput` run: its input file and its results per config.
struct Cell {
    events: u64,
    sensors: u64,
    input: PathBuf,
    results: HashMap<String, Vec<serde_json::Value>>,
}

impl Cell {
    fn median(&self, config: &str, field: &str) -> f64 {
        median(self.results[config].iter().map(|v| v[field].as_f64().unwrap_or(0.0)).collect())
    }
}

/// Runs every (events, sensors) pair of the lists with every config, interleaved, and
/// prints a table per pair, then the cost of an event at each key count against the
/// first (and at each event count against the first): the ratios that hold on a noisy
/// machine because they come from one run.
fn throughput(events: &[u64], sensors: &[u64], runs: usize, batch_events: usize, configs: &[&str]) {
    let mut cells: Vec<Cell> = Vec::new();
    for &e in events {
        for &s in sensors {
            let input = data_dir().join(format!("sensor-{e}-{s}.jsonl"));
            if !input.exists() {
                eprintln!("generating {}", input.display());
                let mut out = std::io::BufWriter::new(std::fs::File::create(&input).expect("create input"));
                let spec = SensorSpec { events: e, sensors: u32::try_from(s).expect("--sensors fits u32"), seed: 1 };
                generate_sensor(spec, &mut out).expect("generate");
                out.flush().expect("flush");
            }
            cells.push(Cell { events: e, sensors: s, input, results: HashMap::new() });
        }
    }
    let exe = std::env::current_exe().expect("current exe");
    // Interleaved, so that machine noise hits every configuration alike.
    for run in 0..runs {
        for cell in &mut cells {
            for &config in configs {
                let out = Command::new(&exe)
                    .args([
                        "one",
                        config,
                        &cell.input.display().to_string(),
                        "--batch-events",
                        &batch_events.to_string(),
                    ])
                    .output()
                    .expect("run child");
                assert!(out.status.success(), "{config} run failed: {}", String::from_utf8_lossy(&out.stderr));
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("child JSON");
                eprintln!("run {run} {} events {} sensors {config}: {v}", cell.events, cell.sensors);
                cell.results.entry(config.to_owned()).or_default().push(v);
            }
        }
    }
    let batch = if batch_events > 0 { batch_events.to_string() } else { "default".to_owned() };
    for cell in &cells {
        println!(
            "\nsensor workload: {} events, {} sensors, batch {batch}, medians of {runs} runs",
            cell.events, cell.sensors
        );
        println!(
            "{:<8} {:>12} {:>10} {:>10} {:>7} | {:>12} {:>8} {:>8} {:>8} {:>8} (ms)",
            "config", "events/s", "vs native", "peak MiB", "CPU s", "read+decode", "wait", "load", "plugin", "commit"
        );
        let native = configs.contains(&"native").then(|| cell.median("native", "events_per_s"));
        for &config in configs {
            let eps = cell.median(config, "events_per_s");
            // Without a native run, nothing to compare with.
            let vs_native = native.map_or_else(|| "-".to_owned(), |native| format!("{:.2}x", eps / native));
            println!(
                "{:<8} {:>12.0} {:>10} {:>10.1} {:>7.1} | {:>12.0} {:>8.0} {:>8.0} {:>8.0} {:>8.0}",
                config,
                eps,
                vs_native,
                cell.median(config, "peak_rss_kib") / 1024.0,
                cell.median(config, "cpu_s"),
                cell.median(config, "read_decode_ms"),
                cell.median(config, "input_wait_ms"),
                cell.median(config, "state_load_ms"),
                cell.median(config, "plugin_ms"),
                cell.median(config, "commit_ms"),
            );
        }
    }
    // Cost of an event = 1 / events per second (wall time, as the tables); its CPU
    // cost = CPU seconds / events, which other tenants of a shared machine move less.
    let cost = |cell: &Cell, config: &str| 1.0 / cell.median(config, "events_per_s");
    let cpu = |cell: &Cell, config: &str| cell.median(config, "cpu_s") / cell.events as f64;
    let find = |e: u64, s: u64| cells.iter().find(|c| c.events == e && c.sensors == s).expect("cell");
    for &config in configs {
        for &e in events {
            let base = find(e, sensors[0]);
            for &s in &sensors[1..] {
                let cell = find(e, s);
                println!(
                    "{config}, {e} events: an event costs {:.2}x at {s} sensors what it costs at {} sensors (CPU: {:.2}x)",
                    cost(cell, config) / cost(base, config),
                    sensors[0],
                    cpu(cell, config) / cpu(base, config),
                );
            }
        }
        for &s in sensors {
            let base = find(events[0], s);
            for &e in &events[1..] {
                let cell = find(e, s);
                println!(
                    "{config}, {s} sensors: an event costs {:.2}x over {e} events what it costs over {} events (CPU: {:.2}x)",
                    cost(cell, config) / cost(base, config),
                    events[0],
                    cpu(cell, config) / cpu(base, config),
                );
            }
        }
    }
}

/// CPU time (user and system) of this process so far, seconds (Linux).
fn cpu_seconds() -> f64 {
    stat_cpu_seconds(false)
}

/// CPU time (user and system) of this process's waited-for children so far, seconds
/// (Linux).
fn children_cpu_seconds() -> f64 {
    stat_cpu_seconds(true)
}

fn stat_cpu_seconds(children: bool) -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses: utime and stime are the
    // 12th and 13th, cutime and cstime the 14th and 15th, in clock ticks (100 a
    // second on Linux).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    let first = if children { 13 } else { 11 };
    (ticks(first) + ticks(first + 1)) / 100.0
}

/// Peak resident set size of this process, KiB (Linux).
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn one(config: &str, input: &Path, batch_events: usize) {
    if !input.is_file() {
        fail(&format!("no input file {}", input.display()));
    }
    let clock = SystemClock;
    let started = clock.monotonic_ns();
    let (events, stages) = match config {
        "floor" => (floor(input), StageTimes::default()),
        "native" | "wasm" | "wasm-v2" => {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut pc = sensor_config(input, dir.path());
            if config == "wasm-v2" {
                // The 0.2 state API over the same keys: a value and a timer per sensor
                // (inactivity-alert-v2, whose timers are in processing time).
                pc.plugin = PathBuf::from(plugins::INACTIVITY_ALERT_V2);
                pc.timeout = TimeoutKind::ProcessingTime;
            }
            // BENCH_PLUGIN runs another build of the plugin (to compare guest changes).
            if let Some(plugin) = std::env::var_os("BENCH_PLUGIN").filter(|_| config == "wasm") {
                pc.plugin = PathBuf::from(plugin);
            }
            if batch_events > 0 {
                pc.batch_events_max = batch_events;
            }
            pc.durable_commits = durable_commits();
            // BENCH_STORE_BUFFER=0 folds into sled at every commit, as if there were no
            // redo log.
            let env_bytes = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
            pc.limits.store_buffer_bytes = env_bytes("BENCH_STORE_BUFFER").unwrap_or(pc.limits.store_buffer_bytes);
            pc.limits.store_cache_bytes = env_bytes("BENCH_STORE_CACHE").unwrap_or(pc.limits.store_cache_bytes);
            pc.batch_keys_max = env_bytes("BENCH_BATCH_KEYS").map_or(pc.batch_keys_max, |n| n as usize);
            pc.limits.batch_calls_max =
                env_bytes("BENCH_BATCH_CALLS").map_or(pc.limits.batch_calls_max, |n| n as usize);
            let clock: Arc<dyn Clock> = Arc::new(SystemClock);
            let mut pipeline = if config != "native" {
                Pipeline::open(pc, clock)
            } else {
                Pipeline::open_with_function(pc, clock, Box::new(NativeSensor::default()))
            }
            .unwrap_or_else(|e| fail(&format!("cannot open the pipeline: {e}")));
            let summary = pipeline.run(&mut |_| {}).unwrap_or_else(|e| fail(&format!("the run failed: {e}")));
            (summary.run.records, summary.stages)
        }
        other => usage(&format!("no config {other:?} ({})", CONFIGS.join(", "))),
    };
    let secs = (clock.monotonic_ns() - started) as f64 / 1e9;
    let ms = |ns: u64| ns as f64 / 1e6;
    println!(
        "{}",
        serde_json::json!({
            "config": config,
            "events": events,
            "seconds": secs,
            "events_per_s": events as f64 / secs,
            "peak_rss_kib": peak_rss_kib(),
            "cpu_s": cpu_seconds(),
            "read_decode_ms": ms(stages.read_decode_ns),
            "input_wait_ms": ms(stages.input_wait_ns),
            "state_load_ms": ms(stages.state_load_ns),
            "plugin_ms": ms(stages.plugin_ns),
            "commit_ms": ms(stages.commit_ns),
        })
    );
}

#[derive(Deserialize)]
struct Reading {
    sensor_id: String,
    ts: i64,
    status: String,
}

#[derive(Clone, Copy, Default)]
struct Episode {
    consecutive_errors: u32,
    first_error_ts: i64,
    last_ts: i64,
}

impl Episode {
    /// WORKLOAD.md's step; returns whether this reading raises an alert.
    fn step(&mut self, ts: i64, err: bool) -> bool {
        if self.last_ts != 0 && ts - self.last_ts > GAP_MS {
            *self = Episode::default();
        }
        self.last_ts = ts;
        if !err {
            self.consecutive_errors = 0;
            return false;
        }
        self.consecutive_errors += 1;
        if self.consecutive_errors == 1 {
            self.first_error_ts = ts;
        }
        self.consecutive_errors == 3 && ts - self.first_error_ts <= WINDOW_MS
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(20);
        v.extend_from_slice(&self.consecutive_errors.to_le_bytes());
        v.extend_from_slice(&self.first_error_ts.to_le_bytes());
        v.extend_from_slice(&self.last_ts.to_le_bytes());
        v
    }

    fn decode(b: &[u8]) -> Option<Self> {
        Some(Episode {
            consecutive_errors: u32::from_le_bytes(b.get(0..4)?.try_into().ok()?),
            first_error_ts: i64::from_le_bytes(b.get(4..12)?.try_into().ok()?),
            last_ts: i64::from_le_bytes(b.get(12..20)?.try_into().ok()?),
        })
    }
}

/// The floor: the same logic in a plain in-memory loop over the file.
fn floor(input: &Path) -> u64 {
    let file = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(input).expect("open input"));
    let mut sensors: HashMap<String, Episode> = HashMap::new();
    let (mut events, mut alerts) = (0u64, 0u64);
    for line in file.lines() {
        let r: Reading = serde_json::from_str(&line.expect("read")).expect("parse");
        events += 1;
        alerts += u64::from(sensors.entry(r.sensor_id).or_default().step(r.ts, r.status == "err"));
    }
    std::hint::black_box(alerts);
    events
}

/// The sensor logic as a native function behind the pipeline's seam.
struct NativeSensor {
    info: PluginInfo,
}

impl Default for NativeSensor {
    fn default() -> Self {
        Self { info: PluginInfo { name: "sensor-alerts-native".into(), version: "0".into(), state_schema_version: 1 } }
    }
}

impl StateFunction for NativeSensor {
    fn info(&self) -> &PluginInfo {
        &self.info
    }

    fn call(&mut self, _kind: TimeoutKind, req: &CallRequest<'_>) -> Result<CallOutcome, CallError> {
        if req.has_timed_out {
            return Ok(CallOutcome { value: StagedValue::Removed, timeout_ms: None, outputs: Vec::new() });
        }
        let mut readings: Vec<Reading> = req
            .events
            .iter()
            .map(|e| serde_json::from_str(e.payload).map_err(|e| CallError::Returned(e.to_string())))
            .collect::<Result<_, _>>()?;
        readings.sort_by_key(|r| r.ts);
        let mut episode = req.state.and_then(Episode::decode).unwrap_or_default();
        let mut outputs = Vec::new();
        for r in &readings {
            if episode.step(r.ts, r.status == "err") {
                outputs.push(format!(
                    "{{\"sensor_id\":\"{}\",\"ts\":{},\"first_ts\":{}}}",
                    req.key, r.ts, episode.first_error_ts
                ));
            }
        }
        Ok(CallOutcome {
            value: StagedValue::Updated(episode.encode()),
            timeout_ms: Some(episode.last_ts + GAP_MS),
            outputs,
        })
    }

    fn migrate(&mut self, _from_version: u32, value: &[u8]) -> Result<Vec<u8>, CallError> {
        Ok(value.to_vec())
    }
}

/// Fills a fresh state dir with `keys` keys, each holding a value and a timer far in
/// the future, committed in chunks.
fn prefill(dir: &Path, keys: u64) {
    let mut store = Store::open(&dir.join("store"), 64 << 20, 64 << 20, 64 << 20).expect("open store");
    let mut changes = Vec::with_capacity(100_000);
    let checkpoint = Checkpoint::default();
    let timers = std::env::var_os("BENCH_IDLE_WITHOUT_TIMERS").is_none();
    for i in 0..keys {
        let record = KeyRecord {
            value: Some(Episode::default().encode()),
            // BENCH_IDLE_WITHOUT_TIMERS=1 separates the cost of a bigger store from the
            // cost of more timers.
            timeout_ms: timers.then_some(4_000_000_000_000 + i as i64),
            schema_version: 1,
        };
        changes.push(KeyChange { key: format!("idle-{i:08}"), before: None, after: Some(record) });
        if changes.len() == 100_000 || i + 1 == keys {
            store.commit(&changes, &checkpoint, false).expect("commit");
            changes.clear();
            store.fold_if_due().expect("fold");
        }
    }
    store.flush().expect("flush");
}

fn timers(keys: &[u64], batches: usize) {
    if batches < 2 {
        eprintln!("bench timers: --batches must be 2 or more (the first batch is timed apart from the others)");
        std::process::exit(2);
    }
    let active = 100;
    let per_batch = 1000;
    let input = data_dir().join(format!("timers-{batches}.jsonl"));
    let mut text = String::new();
    for i in 0..(batches * per_batch) as i64 {
        text.push_str(&format!(
            "{{\"sensor_id\":\"s-{:03}\",\"ts\":{},\"status\":\"ok\"}}\n",
            i % active,
            1_700_000_000_000 + i * 10
        ));
    }
    std::fs::write(&input, text).expect("write input");
    println!(
        "\nbatches of {per_batch} events over {active} active keys, while N idle keys hold timers that do not fire"
    );
    println!(
        "{:>10} {:>12} {:>14} {:>18} | {:>8} {:>8} {:>8} | {:>12}   (load, plugin, commit: median ms a batch)",
        "N", "open ms", "1st batch ms", "median batch ms", "load", "plugin", "commit", "last fold ms"
    );
    let mut medians = Vec::new();
    for &n in keys {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = SystemClock;
        let t = clock.monotonic_ns();
        prefill(&dir.path().join("state"), n);
        eprintln!("prefilled {n} keys in {:.1} s", (clock.monotonic_ns() - t) as f64 / 1e9);
        let mut pc = sensor_config(&input, dir.path());
        pc.batch_events_max = per_batch;
        pc.durable_commits = durable_commits();
        let started = clock.monotonic_ns();
        let mut pipeline = Pipeline::open(pc, Arc::new(SystemClock)).expect("open");
        let opened = clock.monotonic_ns();
        let mut last = opened;
        let (mut times, mut stages) = (Vec::new(), Vec::new());
        let summary = pipeline
            .run(&mut |report| {
                let now = clock.monotonic_ns();
                times.push((now - last) as f64 / 1e6);
                stages.push(report.stages);
                last = now;
            })
            .expect("run");
        // Medians of the batches after the first: a mean over all of them spread the
        // first batch's commit (on a cold store) and the fold and flush that end the
        // run (in the run's commit stage) over the batches, and with 1M keys read
        // about 1 ms a commit where a batch's own took 0.4.
        let later = |ns: fn(&StageTimes) -> u64| median(stages[1..].iter().map(|s| ns(s) as f64 / 1e6).collect());
        let batch_commits: u64 = stages.iter().map(|s| s.commit_ns).sum();
        let first = times[0];
        let med = median(times[1..].to_vec());
        medians.push(med);
        println!(
            "{:>10} {:>12.1} {:>14.1} {:>18.2} | {:>8.2} {:>8.2} {:>8.2} | {:>12.1}",
            n,
            (opened - started) as f64 / 1e6,
            first,
            med,
            later(|s| s.state_load_ns),
            later(|s| s.plugin_ns),
            later(|s| s.commit_ns),
            summary.stages.commit_ns.saturating_sub(batch_commits) as f64 / 1e6
        );
    }
    if medians.len() >= 2 {
        println!(
            "median batch time, {} keys vs {} keys: {:.2}x",
            keys[keys.len() - 1],
            keys[0],
            medians[medians.len() - 1] / medians[0]
        );
    }
}

fn swap(runs: usize) {
    use groupstate::Candidate;
    use groupstate_tests::plugins;
    let clock = SystemClock;
    let ms = |from: u64| (clock.monotonic_ns() - from) as f64 / 1e6;
    let (mut cold, mut warm, mut pause, mut normal) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("in.jsonl");
        let lines: String = (0..40_000).map(|i| format!("{{\"k\":\"k{}\"}}\n", i % 1000)).collect();
        std::fs::write(&input, lines).expect("write input");
        let mut pc = groupstate::PipelineConfig::new(
            plugins::COUNTER_V1.into(),
            groupstate::Stream::File(input),
            groupstate::Stream::File(dir.path().join("out.jsonl")),
            dir.path().join("state"),
            "k".into(),
        );
        pc.batch_events_max = 4_000;
        pc.cache_dir = Some(dir.path().join("cache"));
        let mut pipeline = Pipeline::open(pc, Arc::new(SystemClock)).expect("open");
        let runtime = pipeline.runtime().expect("wasm runtime");
        let mut batch_ms = Vec::new();
        for i in 0..10 {
            if i == 5 {
                // Off the processing path: what --watch or the admin endpoint does.
                let t = clock.monotonic_ns();
                drop(runtime.load(Path::new(plugins::COUNTER_V2), &[]).expect("load v2"));
                cold.push(ms(t));
                let t = clock.monotonic_ns();
                let v2 = runtime.load(Path::new(plugins::COUNTER_V2), &[]).expect("load v2");
                warm.push(ms(t));
                pipeline.swap_sender().send(Candidate { plugin: Box::new(v2), origin: "bench".into() }).expect("send");
            }
            let t = clock.monotonic_ns();
            pipeline.next_batch().expect("batch").expect("a batch");
            batch_ms.push(ms(t));
        }
        pause.push(batch_ms[5]);
        normal.push(median([&batch_ms[..5], &batch_ms[6..]].concat()));
    }
    println!(
        "\nhot load, counter v1 -> v2 (state schema 1 -> 2), 1000 keys, batches of 4000 events, medians of {runs}"
    );
    println!(
        "load v2 off the processing path: {:.1} ms with a cold compile cache, {:.1} ms warm",
        median(cold),
        median(warm)
    );
    println!(
        "swap batch {:.2} ms vs other batches {:.2} ms (the swap batch also migrates 1000 keys lazily)",
        median(pause),
        median(normal)
    );
}

/// `state`: list-append and map-put on a 0.2 list or map of 0 and of `size` elements,
/// `ops` operations in one call per batch, `runs` fresh state dirs with five measured
/// rounds each.
fn state_cost(size: u64, ops: u64, runs: usize) {
    assert!(ops < 10_000, "--ops must stay under state_writes_per_call_max (10 000)");
    let rounds = 5;
    // The probe declares event-time TTLs, which need a time field.
    let quiet = |k: &str, op: String| format!("{{\"k\":\"{k}\",\"ts\":1000,\"ops\":[\"{op}\",\"quiet\"]}}\n");
    // (name, plugin µs per op, batch µs per op) for: list of 0, list of N, map of 0, map of N.
    let mut per_op: [(Vec<f64>, Vec<f64>); 4] = Default::default();
    for run in 0..runs {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut text = String::new();
        let mut prefill = 0;
        let mut filled = 0;
        while filled < size {
            let n = (size - filled).min(5000);
            text.push_str(&quiet("big-list", format!("appendn:{n}")));
            text.push_str(&quiet("big-map", format!("putn:{n}:{filled}")));
            filled += n;
            prefill += 2;
        }
        for round in 0..rounds {
            let fresh = size + 1_000_000 * (round + 1);
            text.push_str(&quiet(&format!("list-{round}"), format!("appendn:{ops}")));
            text.push_str(&quiet("big-list", format!("appendn:{ops}")));
            text.push_str(&quiet(&format!("map-{round}"), format!("putn:{ops}:{fresh}")));
            text.push_str(&quiet("big-map", format!("putn:{ops}:{fresh}")));
        }
        let input = dir.path().join("in.jsonl");
        std::fs::write(&input, text).expect("write input");
        let mut config = groupstate::PipelineConfig::new(
            PathBuf::from(groupstate_tests::plugins::KEYED_PROBE),
            groupstate::Stream::File(input),
            groupstate::Stream::File(dir.path().join("out.jsonl")),
            dir.path().join("state"),
            "k".into(),
        );
        config.batch_events_max = 1;
        config.time_field = Some("ts".into());
        config.on_error = groupstate::ErrorPolicy::Fail;
        config.durable_commits = durable_commits();
        config.cache_dir = Some(groupstate_tests::cache_dir());
        let mut pipeline = Pipeline::open(config, Arc::new(SystemClock)).expect("open");
        let mut batches = Vec::new();
        pipeline.run(&mut |b| batches.push((b.stages.plugin_ns, b.duration_ns))).expect("run");
        assert_eq!(batches.len(), prefill + 4 * rounds as usize, "one batch per line");
        for (i, (plugin_ns, duration_ns)) in batches[prefill..].iter().enumerate() {
            let (plugin, batch) = &mut per_op[i % 4];
            plugin.push(*plugin_ns as f64 / 1e3 / ops as f64);
            batch.push(*duration_ns as f64 / 1e3 / ops as f64);
        }
        eprintln!("run {} of {runs} done", run + 1);
    }
    println!("\n0.2 state: {ops} operations in one call per batch, medians of {} batches", runs * rounds as usize);
    println!("{:<28} {:>16} {:>16}", "", "call us/op", "batch us/op");
    let names = [
        "list-append, list of 0".to_owned(),
        format!("list-append, list of {size}"),
        "map-put, map of 0".to_owned(),
        format!("map-put, map of {size}"),
    ];
    let medians: Vec<(f64, f64)> = per_op.iter().map(|(p, b)| (median(p.clone()), median(b.clone()))).collect();
    for (name, (p, b)) in names.iter().zip(&medians) {
        println!("{name:<28} {p:>16.2} {b:>16.2}");
    }
    for (what, empty, full) in [("list-append", 0, 1), ("map-put", 2, 3)] {
        println!(
            "{what}: {size} vs 0: call {:.2}x, batch {:.2}x",
            medians[full].0 / medians[empty].0,
            medians[full].1 / medians[empty].1
        );
    }
}
