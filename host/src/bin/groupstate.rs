//! The `groupstate` command line: run a pipeline, generate the sensor workload,
//! inspect a state dir or a plugin, test a plugin against scenarios, and create a
//! plugin project. It installs the log's subscriber (`logging.rs`) and feeds the
//! admin endpoint's metrics from the batch loop.

// Beside this file, in a folder of its own: a file in src/bin/ would be a binary.
#[path = "groupstate/keyed_state.rs"]
mod keyed_state;
#[path = "groupstate/logging.rs"]
mod logging;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use groupstate::config::{ErrorPolicy, PipelineConfig, Stream, TimeoutKind};
use groupstate::metrics::Metrics;
use groupstate::store::Store;
use groupstate::workload::{SensorSpec, generate_sensor};
use groupstate::{Clock, Pipeline, SystemClock};
use logging::{LogFormat, PROGRESS_TARGET};

/// mimalloc (`allocator.rs`): glibc's malloc slows down badly once sled has churned
/// through millions of small allocations (batch time grew with the number of idle
/// keys); mimalloc stays flat.
#[global_allocator]
static ALLOCATOR: groupstate::allocator::Allocator = groupstate::allocator::Allocator;

/// Per-key state machines over a stream, as sandboxed WebAssembly components.
#[derive(Parser)]
#[command(name = "groupstate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines on stderr are written: text for a person, or json, one object per
    /// line (time_ms, level, target, message, and fields such as batch).
    #[arg(long, global = true, value_enum, env = "GROUPSTATE_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Run a pipeline: read JSON Lines, call the plugin per key, keep state in sled.
    Run(Box<RunArgs>),
    /// Generate a workload.
    Gen {
        #[command(subcommand)]
        workload: GenCommand,
    },
    /// Inspect a pipeline's state dir (keys, values, timers) as JSON Lines.
    State(StateArgs),
    /// Inspect a plugin component: size, imports, exports, info.
    Plugin {
        /// The component.
        path: PathBuf,
    },
    /// Test a compiled plugin against scenarios: steps of input with their clock, and
    /// the outputs, late records, keys, timers and watermark that must follow.
    Test {
        /// The component (.wasm).
        plugin: PathBuf,
        /// Scenario files (TOML), or folders of them.
        #[arg(required = true)]
        scenarios: Vec<PathBuf>,
    },
    /// Write a plugin project that builds as it is: source with a small working example,
    /// a build.sh that writes NAME.wasm, a README and example scenarios in tests/.
    New(NewArgs),
}

/// `groupstate new`.
#[derive(Args)]
struct NewArgs {
    /// The plugin's name: lowercase letters, digits and `_`, starting with a letter.
    name: String,
    /// The language.
    #[arg(long, value_parser = ["rust", "python", "js", "c"])]
    lang: String,
    /// The project folder to write, missing or empty [default: ./NAME].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The groupstate checkout whose guest-sdk/ the project builds with (the project
    /// refers to it by its absolute path) [default: the checkout this binary was built
    /// from].
    #[arg(long, env = "GROUPSTATE_SDK")]
    sdk: Option<PathBuf>,
}

#[derive(Subcommand)]
enum GenCommand {
    /// The sensor-alerts workload (WORKLOAD.md at the repository root).
    Sensor {
        /// Events to generate.
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        /// Distinct sensors.
        #[arg(long, default_value_t = 10_000)]
        sensors: u32,
        /// Seed; the same seed gives the same file.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output file, or - for stdout.
        #[arg(long, default_value = "-")]
        output: PathBuf,
    },
}

#[derive(Args)]
struct RunArgs {
    /// A TOML pipeline file; flags given as well override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The plugin component (.wasm).
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// JSON Lines input file, - for stdin, or kafka://HOST:PORT/TOPIC (with --group).
    #[arg(long)]
    input: Option<PathBuf>,
    /// The consumer group of a kafka:// input: its members share the topic's partitions.
    #[arg(long)]
    group: Option<String>,
    /// With a kafka:// input: stop once every assigned partition has read no record for
    /// this long and found its end, or none has been assigned for this long [default:
    /// run until stopped].
    #[arg(long)]
    until_idle_ms: Option<u64>,
    /// With a kafka:// input: partitions that run a batch at once, waiting for records
    /// included [default: no limit].
    #[arg(long)]
    partition_workers: Option<usize>,
    /// JSON Lines output file, - for stdout, or (with a kafka:// input)
    /// kafka://HOST:PORT/TOPIC.
    #[arg(long)]
    output: Option<PathBuf>,
    /// State directory (created if absent).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// A new state dir's initial state, JSON Lines of {"key": ..., "state": ...}, given
    /// to a 0.2 plugin's handle-initial-state before the first batch, all or nothing
    /// (refused once the state dir has a checkpoint).
    #[arg(long, value_name = "FILE")]
    initial_state: Option<PathBuf>,
    /// Top-level string field holding the group key.
    #[arg(long)]
    key_field: Option<String>,
    /// Top-level integer field holding event time in epoch milliseconds.
    #[arg(long)]
    time_field: Option<String>,
    /// With a kafka:// input: event time is each record's Kafka timestamp (instead of
    /// --time-field).
    #[arg(long)]
    kafka_timestamp: bool,
    /// Timeout kind: none, processing-time or event-time.
    #[arg(long)]
    timeout: Option<TimeoutKind>,
    /// The watermark trails the largest event time seen by this much.
    #[arg(long)]
    watermark_delay_ms: Option<i64>,
    /// A record whose event time is more than this ahead of the batch's processing time
    /// goes to the dead-letter output, not into the watermark [default: 86400000, one day].
    #[arg(long)]
    event_time_ahead_max_ms: Option<i64>,
    /// Records per micro-batch at most [default: 500000].
    #[arg(long)]
    batch_events: Option<usize>,
    /// Input bytes per micro-batch at most; a batch ends after the line that reaches it [default: 67108864].
    #[arg(long)]
    batch_bytes: Option<u64>,
    /// Distinct keys per micro-batch at most [default: 50000].
    #[arg(long)]
    batch_keys: Option<usize>,
    /// Memory for committed state changes not yet written into sled [default: 25165824].
    #[arg(long)]
    store_buffer: Option<u64>,
    /// On a failed plugin call: fail, skip or dead-letter [default: fail].
    #[arg(long)]
    on_error: Option<ErrorPolicy>,
    /// Dead-letter output: a file, or (with a kafka:// input) kafka://HOST:PORT/TOPIC
    /// [default: <state-dir>/dead-letter.jsonl].
    #[arg(long)]
    dead_letter: Option<PathBuf>,
    /// Late-data output: a file, or (with a kafka:// input) kafka://HOST:PORT/TOPIC
    /// [default: <state-dir>/late.jsonl].
    #[arg(long)]
    late: Option<PathBuf>,
    /// Keep reading after the end of the input; run empty batches on a timer.
    #[arg(long)]
    follow: bool,
    /// Time between empty batches while the input is quiet (with --follow or stdin), and
    /// between checks of a --watch'ed plugin file [default: 1000].
    #[arg(long)]
    trigger_interval_ms: Option<u64>,
    /// Stop after this many batches.
    #[arg(long)]
    batches_max: Option<u64>,
    /// A plugin parameter, name=value (repeatable).
    #[arg(long = "param", value_parser = parse_param)]
    params: Vec<(String, String)>,
    /// Do not fsync at every commit (a crash of the machine may lose recent
    /// batches; a crash of the process still loses nothing).
    #[arg(long)]
    no_fsync: bool,
    /// Directory of compiled plugins [default: ~/.cache/groupstate].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Do not cache compiled plugins.
    #[arg(long)]
    no_cache: bool,
    /// CPU time per plugin call, ms [default: 1000].
    #[arg(long)]
    call_cpu_ms_max: Option<u64>,
    /// Memory per plugin instance, bytes [default: 268435456].
    #[arg(long)]
    instance_memory_bytes_max: Option<u64>,
    /// State value size per key, bytes [default: 1048576].
    #[arg(long)]
    state_bytes_max: Option<u64>,
    /// Reload the plugin when its file changes (checked every trigger interval); the new
    /// version is validated off the processing path and swapped in at a batch boundary
    /// (with a kafka:// input, by every partition at a boundary of its own).
    #[arg(long)]
    watch: bool,
    /// Serve the admin endpoint (GET/POST /plugin, GET /metrics): `unix` (also what the bare flag
    /// means) is the socket admin.sock in the state dir, mode 0600; `unix:PATH` a socket
    /// elsewhere; IP:PORT (127.0.0.1:7070) a TCP address, which needs --admin-token.
    #[arg(long, value_name = "unix|unix:PATH|IP:PORT", num_args = 0..=1, default_missing_value = "unix")]
    admin: Option<String>,
    /// Bearer token the admin endpoint requires on every request; needed on a TCP
    /// address (loopback included), and must not be empty; also read from
    /// GROUPSTATE_ADMIN_TOKEN.
    #[arg(long, env = "GROUPSTATE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// No progress lines (plugin ready, batches so far, where the time went); events,
    /// warnings and the summary stay.
    #[arg(long, short)]
    quiet: bool,
}

fn parse_param(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("--param takes name=value, got {s:?}")),
    }
}

#[derive(Args)]
struct StateArgs {
    /// The pipeline's state directory.
    #[arg(long)]
    state_dir: PathBuf,
    /// What to show: keys (every key with its value and timeout), timers (in
    /// deadline order), checkpoint, or one key with --key.
    #[arg(long, default_value = "keys")]
    show: String,
    /// Show only this key.
    #[arg(long)]
    key: Option<String>,
    /// A 0.2 state dir's plugin: its render-state decodes the stored bytes as JSON
    /// (hex where it returns none).
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// A parameter for the plugin's init, name=value (repeatable).
    #[arg(long = "param", value_parser = parse_param)]
    params: Vec<(String, String)>,
    /// Directory of compiled plugins [default: ~/.cache/groupstate].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

/// `groupstate test`: runs every scenario, says which failed and how, and fails if any
/// did.
fn test(plugin: &std::path::Path, paths: &[PathBuf]) -> Result<()> {
    if !plugin.is_file() {
        bail!("plugin {}: no such file; build the plugin first", plugin.display());
    }
    let mut files = Vec::new();
    for path in paths {
        files.extend(groupstate::scenario::files(path).map_err(anyhow::Error::msg)?);
    }
    let cache = groupstate::pipeline::default_cache_dir();
    let (mut passed, mut failed) = (0usize, 0usize);
    let mut out = std::io::stdout().lock();
    for file in &files {
        let result =
            groupstate::scenario::load(file).and_then(|s| groupstate::scenario::run(&s, plugin, cache.as_deref()));
        match result {
            Ok(()) => {
                passed += 1;
                writeln!(out, "ok   {}", file.display())?;
            }
            Err(why) => {
                failed += 1;
                writeln!(out, "FAIL {}\n  {}", file.display(), why.replace('\n', "\n  "))?;
            }
        }
    }
    writeln!(out, "scenarios: {passed} passed, {failed} failed")?;
    if failed > 0 {
        bail!("{failed} of {} scenarios failed", files.len());
    }
    Ok(())
}

fn new_project(args: NewArgs) -> Result<()> {
    use groupstate::scaffold::{Language, NewProject, create};
    let language: Language = args.lang.parse()?;
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&args.name));
    // The checkout this binary was built from: host/ is one level below it.
    let sdk = args.sdk.unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")));
    let project = NewProject { name: args.name, language, dir, sdk };
    create(&project)?;
    let dir = project.dir.display();
    let name = &project.name;
    println!("created the {language} plugin `{name}` in {dir}; build it and run its scenarios with:");
    println!("  cd {dir}");
    println!("  ./build.sh");
    println!("  groupstate test {name}.wasm tests/");
    Ok(())
}

fn main() {
    groupstate::allocator::configure();
    let cli = Cli::parse();
    let quiet = matches!(&cli.command, Command::Run(args) if args.quiet);
    logging::install(cli.log_format, quiet);
    let result = match cli.command {
        Command::Run(args) => run(*args),
        Command::Gen { workload: GenCommand::Sensor { events, sensors, seed, output } } => {
            gen_sensor(SensorSpec { events, sensors, seed }, &output)
        }
        Command::State(args) => state(&args),
        Command::Plugin { path } => plugin(&path),
        Command::Test { plugin, scenarios } => test(&plugin, &scenarios),
        Command::New(args) => new_project(args),
    };
    if let Err(e) = result {
        // A reader that closed the pipe (`groupstate state ... | head`) ends the output
        // normally: there is nobody left to tell.
        if is_broken_pipe(&e) {
            return;
        }
        tracing::error!("{e:#}");
        std::process::exit(1);
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// `n` and the noun, singular for 1.
fn count(n: u64, singular: &str, plural: &str) -> String {
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// Records behind the watermark, as a share of all, above which a run warns.
const LATE_SHARE_WARNING: f64 = 0.01;

/// The warning for a run that sent many records to the late output: an out-of-order
/// input with no watermark delay looks like this.
fn late_warning(late: u64, records: u64, delay_ms: i64) -> Option<String> {
    let share = late as f64 / records.max(1) as f64;
    (share > LATE_SHARE_WARNING).then(|| {
        format!(
            "{late} of {records} records ({:.1}%) were behind the watermark and went to the late output, unprocessed; if the input is out of order, raise --watermark-delay-ms (now {delay_ms}) to the largest delay you expect",
            share * 100.0
        )
    })
}

fn config_from(args: &RunArgs) -> Result<PipelineConfig> {
    let mut config = match &args.config {
        Some(path) => PipelineConfig::from_toml_file(path)?,
        None => {
            let need = |v: &Option<PathBuf>, flag: &str| {
                v.clone().with_context(|| format!("{flag} is required (or give --config FILE)"))
            };
            // In the order of the usage line: --plugin is named first when missing.
            let plugin = need(&args.plugin, "--plugin")?;
            let input = need(&args.input, "--input")?;
            // A Kafka input keys records by their Kafka keys unless a field is named.
            let kafka = input.to_string_lossy().starts_with(groupstate::config::KAFKA_SCHEME);
            let key_field = match &args.key_field {
                Some(k) => k.clone(),
                None if kafka => String::new(),
                None => bail!("--key-field is required (or give --config FILE)"),
            };
            let output = need(&args.output, "--output")?;
            let (input, output) = (Stream::from(input), Stream::from(output));
            PipelineConfig::new(plugin, input, output, need(&args.state_dir, "--state-dir")?, key_field)
        }
    };
    if let Some(p) = &args.plugin {
        config.plugin = p.clone();
    }
    if let Some(p) = &args.input {
        config.input = Stream::from(p.clone());
    }
    if let Some(p) = &args.output {
        config.output = Stream::from(p.clone());
    }
    if let Some(p) = &args.dead_letter {
        config.dead_letter = Some(Stream::from(p.clone()));
    }
    if let Some(p) = &args.late {
        config.late = Some(Stream::from(p.clone()));
    }
    if let Some(group) = &args.group {
        config.set_group(group);
    }
    config.resolve_topics()?;
    if (args.until_idle_ms.is_some() || args.partition_workers.is_some()) && !matches!(config.input, Stream::Kafka(_)) {
        bail!("--until-idle-ms and --partition-workers are only for a kafka:// input (a file ends by itself)");
    }
    if let Some(p) = &args.state_dir {
        config.state_dir = p.clone();
    }
    if let Some(k) = &args.key_field {
        config.key_field = k.clone();
    }
    config.kafka_timestamp |= args.kafka_timestamp;
    if args.time_field.is_some() {
        config.time_field = args.time_field.clone();
    }
    if let Some(t) = args.timeout {
        config.timeout = t;
    }
    if let Some(d) = args.watermark_delay_ms {
        config.watermark_delay_ms = d;
    }
    if let Some(d) = args.event_time_ahead_max_ms {
        config.event_time_ahead_max_ms = d;
    }
    if let Some(n) = args.batch_events {
        config.batch_events_max = n;
    }
    if let Some(n) = args.batch_bytes {
        config.batch_bytes_max = n;
    }
    if let Some(n) = args.batch_keys {
        config.batch_keys_max = n;
    }
    if let Some(n) = args.store_buffer {
        config.limits.store_buffer_bytes = n;
    }
    if let Some(p) = args.on_error {
        config.on_error = p;
    }
    config.follow |= args.follow;
    if let Some(ms) = args.trigger_interval_ms {
        config.trigger_interval_ms = ms;
    }
    if args.batches_max.is_some() {
        config.batches_max = args.batches_max;
    }
    config.params.extend(args.params.iter().cloned());
    if args.no_fsync {
        config.durable_commits = false;
    }
    config.cache_dir = if args.no_cache {
        None
    } else {
        args.cache_dir.clone().or(config.cache_dir).or_else(groupstate::pipeline::default_cache_dir)
    };
    if let Some(v) = args.call_cpu_ms_max {
        config.limits.call_cpu_ms_max = v;
    }
    if let Some(v) = args.instance_memory_bytes_max {
        config.limits.instance_memory_bytes_max = v;
    }
    if let Some(v) = args.state_bytes_max {
        config.limits.state_bytes_max = v;
    }
    Ok(config)
}

/// `--admin`'s listener, checked against the token; none without `--admin`.
fn admin_listen(args: &RunArgs, config: &PipelineConfig) -> Result<Option<groupstate::admin::Listen>> {
    let Some(spec) = &args.admin else { return Ok(None) };
    let listen = groupstate::admin::Listen::parse(spec, &config.state_dir)?;
    listen.check_token(args.admin_token.as_deref())?;
    Ok(Some(listen))
}

/// `groupstate run` over a Kafka topic: one pipeline per assigned partition. A new
/// plugin version (`--watch`, `POST /plugin`) is offered to every partition.
fn run_kafka(args: &RunArgs, config: PipelineConfig) -> Result<()> {
    let admin_listen = admin_listen(args, &config)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut options = groupstate::partitions::Options { until_idle_ms: args.until_idle_ms, ..Default::default() };
    if let Some(n) = args.partition_workers {
        options.workers_max = n;
    }
    let metrics = Arc::new(Metrics::new());
    let plugins = Arc::new(groupstate::partitions::PartitionPlugins::new(&config)?);
    let target: Arc<dyn groupstate::SwapTarget> = plugins.clone();
    // Kept until the run ends: dropping it stops the watcher and the admin endpoint.
    let _hot_load =
        start_hot_load(args, admin_listen, &config, Some(target), plugins.newest_sha256(), metrics.clone())?;
    let started = clock.monotonic_ns();
    let observer = Arc::new(KafkaObserver {
        metrics,
        count_stored: args.admin.is_some(),
        records: Default::default(),
        logged_ns: Default::default(),
        clock: clock.clone(),
    });
    let summary = groupstate::partitions::run(config, clock.clone(), options, observer.clone(), plugins)?;
    let secs = (clock.monotonic_ns() - started) as f64 / 1e9;
    let records = observer.records.load(std::sync::atomic::Ordering::Relaxed);
    let offsets: Vec<String> = summary.partitions.iter().map(|(p, c)| format!("{p}@{}", c.input_offset)).collect();
    tracing::info!(
        batches = summary.batches,
        records,
        "done: {}, {} in {secs:.2} s over {}; next offsets {}",
        count(summary.batches, "batch", "batches"),
        count(records, "record", "records"),
        count(summary.partitions.len() as u64, "partition", "partitions"),
        offsets.join(" ")
    );
    Ok(())
}

/// How often a Kafka run logs each partition's progress (10 s).
const PARTITION_PROGRESS_NS: u64 = 10_000_000_000;

/// The log's and the metrics' view of a Kafka run's partitions.
struct KafkaObserver {
    metrics: Arc<Metrics>,
    /// Count each partition's keys and timers when it opens (for the metrics).
    count_stored: bool,
    records: std::sync::atomic::AtomicU64,
    /// When each partition last logged its progress.
    logged_ns: std::sync::Mutex<std::collections::BTreeMap<i32, u64>>,
    clock: Arc<dyn Clock>,
}

impl groupstate::partitions::Observer for KafkaObserver {
    fn restoring(&self, partition: i32, records: u64, done: bool) {
        self.metrics.partition(partition as u32).set_restore(records, !done);
    }

    fn opened(&self, partition: i32, pipeline: &Pipeline) {
        if !self.count_stored {
            return;
        }
        match count_stored(pipeline.store()) {
            Ok((keys, timers)) => self.metrics.partition(partition as u32).set_stored(keys, timers),
            Err(e) => tracing::warn!("partition {partition}: cannot count its keys for the metrics: {e}"),
        }
    }

    fn batch(&self, partition: i32, b: &groupstate::BatchReport) {
        self.metrics.partition(partition as u32).record_batch(b);
        self.records.fetch_add(b.records, std::sync::atomic::Ordering::Relaxed);
        if b.replayed {
            tracing::info!(target: PROGRESS_TARGET, batch = b.batch_id, "partition {partition}: batch {} replayed after a stop", b.batch_id);
        }
        let now = self.clock.monotonic_ns();
        let mut logged = self.logged_ns.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = logged.entry(partition).or_insert(0);
        if now.saturating_sub(*last) < PARTITION_PROGRESS_NS {
            return;
        }
        *last = now;
        let lag = b.input_lag.map_or("unknown".to_owned(), |l| l.to_string());
        tracing::info!(
            target: PROGRESS_TARGET,
            batch = b.batch_id,
            "partition {partition}: batch {}, {} in {:.1} ms; lag {lag} records",
            b.batch_id,
            count(b.records, "record", "records"),
            b.duration_ns as f64 / 1e6
        );
    }
}

fn run(args: RunArgs) -> Result<()> {
    let config = config_from(&args)?;
    if matches!(config.input, Stream::Kafka(_)) && args.initial_state.is_some() {
        bail!("--initial-state does not work with a kafka:// input yet (its state is kept per partition); drop it");
    }
    if matches!(config.input, Stream::Kafka(_)) {
        return run_kafka(&args, config);
    }
    // A wrong --admin fails here, before the plugin is compiled and the store opened.
    let admin_listen = admin_listen(&args, &config)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let started = clock.monotonic_ns();
    let mut pipeline = Pipeline::open(config.clone(), clock.clone())?;
    let opened_ms = (clock.monotonic_ns() - started) / 1_000_000;
    tracing::info!(target: PROGRESS_TARGET, "plugin {} ready in {opened_ms} ms", pipeline.plugin_label());
    if let Some(path) = &args.initial_state {
        let keys = pipeline.load_initial_state(path)?;
        tracing::info!(target: PROGRESS_TARGET, "initial state of {} loaded from {}", count(keys, "key", "keys"), path.display());
    }
    // The metrics of the one input there is today: partition 0.
    let metrics = Arc::new(Metrics::new());
    let partition = metrics.partition(0);
    if admin_listen.is_some() {
        let (keys, timers) = count_stored(pipeline.store())?;
        partition.set_stored(keys, timers);
    }
    let target = pipeline.swap_target().map(|t| Arc::new(t) as Arc<dyn groupstate::SwapTarget>);
    let running_sha256 = groupstate::plugin::sha256_hex(&std::fs::read(&config.plugin)?);
    // Kept until the run ends: dropping it stops the watcher and the admin endpoint.
    let _hot_load = start_hot_load(&args, admin_listen, &config, target, running_sha256, metrics.clone())?;
    let mut last_report = clock.monotonic_ns();
    let mut records = 0u64;
    let mut late = 0u64;
    // A long (or endless, with --follow) run warns once, as soon as the share of late
    // records is clear; a short one at the end.
    let mut late_warned = None;
    let summary = pipeline.run(&mut |b| {
        partition.record_batch(b);
        records += b.records;
        late += b.late;
        if late_warned.is_none()
            && records >= 100_000
            && let Some(warning) = late_warning(late, records, config.watermark_delay_ms)
        {
            tracing::warn!("{warning}");
            late_warned = Some(());
        }
        let now = clock.monotonic_ns();
        if now - last_report > 2_000_000_000 || b.replayed {
            last_report = now;
            let secs = (now - started) as f64 / 1e9;
            tracing::info!(
                target: PROGRESS_TARGET,
                batch = b.batch_id,
                "batch {}{}: {} records so far ({:.0}/s), {} keys, {} timeouts, watermark {}",
                b.batch_id,
                if b.replayed { " (replayed after a stop)" } else { "" },
                records,
                records as f64 / secs.max(1e-9),
                b.keys,
                b.timeouts,
                b.watermark_ms
            );
        }
    })?;
    let r = &summary.run;
    let secs = summary.elapsed_ms as f64 / 1000.0;
    tracing::info!(
        batches = summary.batches,
        records = r.records,
        "done: {}, {} in {:.2} s ({:.0} records/s); {} to the plugin in {}, {}; {}; {} late, {}, {}; input offset {}, next batch {}",
        count(summary.batches, "batch", "batches"),
        count(r.records, "record", "records"),
        secs,
        r.records as f64 / secs.max(1e-9),
        count(r.events, "event", "events"),
        count(r.data_calls, "call", "calls"),
        count(r.timeout_calls, "timeout call", "timeout calls"),
        count(r.outputs, "output", "outputs"),
        r.late,
        count(r.bad_records, "bad record", "bad records"),
        count(r.failed_calls, "failed call", "failed calls"),
        summary.checkpoint.input_offset,
        summary.checkpoint.next_batch_id,
    );
    if late_warned.is_none()
        && let Some(warning) = late_warning(r.late, r.records, config.watermark_delay_ms)
    {
        tracing::warn!("{warning}");
    }
    let status = pipeline.plugin_status();
    let status = status.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for (batch, from, to) in &status.swaps {
        tracing::info!(batch = *batch, "plugin swap at batch {batch}: {from} -> {to}");
    }
    let st = &summary.stages;
    let ms = |ns: u64| ns / 1_000_000;
    tracing::info!(
        target: PROGRESS_TARGET,
        "time: read+decode {} ms (waited for {} ms), state load {} ms, plugin {} ms, commit {} ms",
        ms(st.read_decode_ns),
        ms(st.input_wait_ns),
        ms(st.state_load_ns),
        ms(st.plugin_ns),
        ms(st.commit_ns)
    );
    Ok(())
}

/// The keys in the store and the timers pending, for the metrics to start from: one
/// pass over the store when the run starts (the batches then report how they change
/// both, at no cost), made only when the admin endpoint serves them.
fn count_stored(store: &Store) -> Result<(u64, u64)> {
    let (mut keys, mut timers) = (0, 0);
    for entry in store.iter_keys() {
        let (_, record) = entry?;
        keys += 1;
        timers += u64::from(record.timeout_ms.is_some());
    }
    Ok((keys, timers))
}

/// The hot-load services of a run: each stops (and joins its thread) when dropped.
struct HotLoad {
    _watcher: Option<groupstate::reload::Watcher>,
    _admin: Option<groupstate::admin::AdminServer>,
}

/// Starts the file watcher and the admin endpoint, as asked, both offering new
/// versions to `target` (the one pipeline, or a Kafka run's partitions), whose running
/// version has the digest `running_sha256`.
fn start_hot_load(
    args: &RunArgs,
    admin_listen: Option<groupstate::admin::Listen>,
    config: &PipelineConfig,
    target: Option<Arc<dyn groupstate::SwapTarget>>,
    running_sha256: String,
    metrics: Arc<Metrics>,
) -> Result<HotLoad> {
    if !args.watch && admin_listen.is_none() {
        return Ok(HotLoad { _watcher: None, _admin: None });
    }
    let target = target.context("hot load needs a wasm plugin")?;
    let watcher = if args.watch {
        Some(groupstate::reload::watch(
            config.plugin.clone(),
            target.clone(),
            running_sha256,
            config.trigger_interval_ms,
        )?)
    } else {
        None
    };
    let Some(listen) = admin_listen else { return Ok(HotLoad { _watcher: watcher, _admin: None }) };
    let admin = groupstate::admin::Admin {
        plugin: groupstate::admin::PluginTarget { upload_dir: config.state_dir.join("plugins"), target },
        metrics,
        token: args.admin_token.clone(),
        limits: groupstate::admin::AdminLimits::default(),
    };
    let server = groupstate::admin::serve(listen, admin)?;
    tracing::info!("admin endpoint on {} (GET/POST /plugin, GET /metrics)", server.listen());
    Ok(HotLoad { _watcher: watcher, _admin: Some(server) })
}

fn gen_sensor(spec: SensorSpec, output: &PathBuf) -> Result<()> {
    if spec.sensors == 0 {
        bail!("--sensors must be at least 1: every event comes from a sensor");
    }
    if output.as_os_str() == "-" {
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        generate_sensor(spec, &mut out)?;
        out.flush()?;
        return Ok(());
    }
    let file = std::fs::File::create(output).with_context(|| format!("cannot create {}", output.display()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    generate_sensor(spec, &mut out)?;
    out.flush()?;
    tracing::info!(
        "wrote {} events from {} sensors (seed {}) to {}",
        spec.events,
        spec.sensors,
        spec.seed,
        output.display()
    );
    Ok(())
}

fn state(args: &StateArgs) -> Result<()> {
    let store_dir = args.state_dir.join("store");
    if !store_dir.exists() {
        bail!("{} is not a groupstate state dir (no store/ inside)", args.state_dir.display());
    }
    let store = {
        let limits = groupstate::Limits::default();
        Store::open(&store_dir, 16 << 20, limits.store_buffer_bytes, limits.store_log_bytes)?
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let keyed = store.state_api()? == Some(2);
    if args.plugin.is_some() && !keyed {
        bail!(
            "--plugin decodes a groupstate:plugin@0.2.0 state dir; {} holds 0.1 state, shown without it",
            args.state_dir.display()
        );
    }
    if keyed && args.show != "checkpoint" {
        match (args.show.as_str(), &args.key) {
            ("keys", _) | (_, Some(_)) => {
                let plugin = match &args.plugin {
                    Some(path) => Some(state_plugin(path, &args.params, args.cache_dir.clone())?),
                    None => None,
                };
                keyed_state::show_keys(&store, args.key.as_deref(), plugin, &mut out)?;
            }
            ("timers", None) => keyed_state::show_timers(&store, &mut out)?,
            (other, None) => bail!("--show takes keys, timers or checkpoint, not {other:?}"),
        }
        out.flush()?;
        return Ok(());
    }
    let key_json = |key: &str, r: &groupstate::store::KeyRecord| {
        serde_json::json!({
            "key": key,
            "value_hex": r.value.as_deref().map(groupstate::codec::hex),
            "value_bytes": r.value.as_ref().map(Vec::len),
            "timeout_ms": r.timeout_ms,
            "schema_version": r.schema_version,
        })
    };
    match (args.show.as_str(), &args.key) {
        (_, Some(key)) => match store.get(key)? {
            Some(r) => writeln!(out, "{}", key_json(key, &r))?,
            None => bail!("no state for key {key:?}"),
        },
        ("keys", None) => {
            for entry in store.iter_keys() {
                let (key, r) = entry?;
                writeln!(out, "{}", key_json(&key, &r))?;
            }
        }
        ("timers", None) => {
            for entry in store.iter_timers() {
                let (deadline, key) = entry?;
                writeln!(out, "{}", serde_json::json!({ "deadline_ms": deadline, "key": key }))?;
            }
        }
        ("checkpoint", None) => {
            let committed = store.checkpoint()?;
            let cp = committed.clone().unwrap_or_default();
            let c = cp.counters;
            writeln!(
                out,
                "{}",
                serde_json::json!({
                    "committed": committed.is_some(),
                    "next_batch_id": cp.next_batch_id,
                    "input_offset": cp.input_offset,
                    "output_len": cp.output_len,
                    "late_len": cp.late_len,
                    "dead_letter_len": cp.dead_letter_len,
                    "max_event_time_ms": cp.max_event_time_ms,
                    "watermark_ms": cp.watermark_ms,
                    "pending_plan": store.pending_plan()?.map(|p| p.batch_id),
                    "counters": {
                        "records": c.records, "events": c.events, "late": c.late,
                        "bad_records": c.bad_records, "data_calls": c.data_calls,
                        "timeout_calls": c.timeout_calls, "outputs": c.outputs,
                        "failed_calls": c.failed_calls,
                    },
                })
            )?;
        }
        (other, None) => bail!("--show takes keys, timers or checkpoint, not {other:?}"),
    }
    out.flush()?;
    Ok(())
}

/// The plugin `groupstate state --plugin` renders through: a 0.2 one.
fn state_plugin(
    path: &std::path::Path,
    params: &[(String, String)],
    cache: Option<PathBuf>,
) -> Result<groupstate::plugin::Plugin> {
    let cache = cache.or_else(groupstate::pipeline::default_cache_dir);
    let runtime = groupstate::plugin::Runtime::new(&groupstate::Limits::default(), cache.as_deref())?;
    let plugin = runtime.load(path, params)?;
    if plugin.state_api() != 2 {
        bail!(
            "--plugin {}: a groupstate:plugin@0.1.0 plugin has no render-state; give the state dir's 0.2 plugin",
            path.display()
        );
    }
    Ok(plugin)
}

fn plugin(path: &std::path::Path) -> Result<()> {
    let runtime = groupstate::plugin::Runtime::new(&groupstate::Limits::default(), None)?;
    let i = runtime.inspect(path)?;
    let report = serde_json::json!({
        "path": path.display().to_string(),
        "size_bytes": i.size_bytes,
        "sha256": i.sha256,
        "info": i.info.map(|info| serde_json::json!({
            "name": info.name, "version": info.version, "state_schema_version": info.state_schema_version,
        })),
        "load_error": i.load_error,
        "exports": i.exports,
        "imports": i.imports,
        "forbidden_imports": i.forbidden_imports,
    });
    writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(&report)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// `run`'s options leave a config file's values alone when not given, so their help
    /// states the defaults by hand: each number there must be the default a pipeline
    /// takes, and a new one must be added here.
    #[test]
    fn run_help_states_the_pipeline_defaults() {
        let config =
            PipelineConfig::new(PathBuf::from("p.wasm"), Stream::Std, Stream::Std, PathBuf::from("state"), "k".into());
        let limits = &config.limits;
        let want = [
            ("event_time_ahead_max_ms", config.event_time_ahead_max_ms.to_string()),
            ("batch_events", config.batch_events_max.to_string()),
            ("batch_bytes", config.batch_bytes_max.to_string()),
            ("batch_keys", config.batch_keys_max.to_string()),
            ("store_buffer", limits.store_buffer_bytes.to_string()),
            ("trigger_interval_ms", config.trigger_interval_ms.to_string()),
            ("call_cpu_ms_max", limits.call_cpu_ms_max.to_string()),
            ("instance_memory_bytes_max", limits.instance_memory_bytes_max.to_string()),
            ("state_bytes_max", limits.state_bytes_max.to_string()),
        ];
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("a run command");
        let mut stated = Vec::new();
        for arg in run.get_arguments() {
            let help = arg.get_long_help().or(arg.get_help()).map(ToString::to_string).unwrap_or_default();
            let Some(at) = help.find("[default: ") else { continue };
            let number: String = help[at + "[default: ".len()..].chars().take_while(char::is_ascii_digit).collect();
            if !number.is_empty() {
                stated.push((arg.get_id().to_string(), number));
            }
        }
        let want: Vec<(String, String)> = want.into_iter().map(|(id, n)| (id.to_owned(), n)).collect();
        assert_eq!(stated, want, "the defaults `run --help` states, against the pipeline's");
    }
}
