//! Pipeline configuration: what to run, where, and the limits, with their defaults.
//! Built from CLI flags or a TOML file (`groupstate run --config pipeline.toml`).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Deserialize;

/// The pipeline's timeout kind (Spark's `GroupStateTimeout`), fixed per pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimeoutKind {
    /// Keys never time out.
    #[default]
    None,
    /// Deadlines relative to the batch's processing time.
    ProcessingTime,
    /// Deadlines in event time, fired by the watermark.
    EventTime,
}

impl TimeoutKind {
    /// The CLI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::ProcessingTime => "processing-time",
            Self::EventTime => "event-time",
        }
    }
}

impl fmt::Display for TimeoutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TimeoutKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "processing-time" => Ok(Self::ProcessingTime),
            "event-time" => Ok(Self::EventTime),
            _ => Err(format!("unknown timeout kind {s:?}; use none, processing-time or event-time")),
        }
    }
}

/// What to do when a plugin call fails (trap, limit hit, or an `err` result).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorPolicy {
    /// Stop the pipeline; nothing of the batch is committed.
    #[default]
    Fail,
    /// Keep the key's state as before the call, drop the call's outputs, go on.
    Skip,
    /// Like `skip`, and write key, events, state before and error to the dead-letter
    /// output.
    DeadLetter,
}

impl FromStr for ErrorPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fail" => Ok(Self::Fail),
            "skip" => Ok(Self::Skip),
            "dead-letter" => Ok(Self::DeadLetter),
            _ => Err(format!("unknown error policy {s:?}; use fail, skip or dead-letter")),
        }
    }
}

/// Where records come from or outputs go: a file, or `-` for stdin/stdout; with a
/// Kafka input, the input and every output can be Kafka topics
/// (`kafka://HOST:PORT/TOPIC`, turned into topics by
/// [`PipelineConfig::resolve_topics`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "PathBuf")]
pub enum Stream {
    /// Standard input or output.
    Std,
    /// A file.
    File(PathBuf),
    /// A Kafka topic: an input read in a consumer group, or an output produced in
    /// the input partition's transactions.
    Kafka(KafkaInput),
}

/// The URL scheme of a Kafka input.
pub const KAFKA_SCHEME: &str = "kafka://";

/// A Kafka topic read in a consumer group: the whole topic for `partitions::run`, or
/// one partition of it for the `Pipeline` that owns that partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaInput {
    /// `HOST:PORT` of a broker (librdkafka's `bootstrap.servers`).
    pub bootstrap: String,
    /// The topic.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// The partition a pipeline owns; `None` for the whole topic.
    pub partition: Option<i32>,
}

impl KafkaInput {
    /// Parses `kafka://HOST:PORT/TOPIC`, read in consumer group `group`.
    pub fn parse(url: &str, group: &str) -> Result<Self, ConfigError> {
        Self::parse_for("--input", url, group)
    }

    /// Parses the `kafka://HOST:PORT/TOPIC` given to `flag`, in consumer group `group`
    /// (an output topic belongs to the input's group: its transactions are the
    /// group's).
    pub fn parse_for(flag: &str, url: &str, group: &str) -> Result<Self, ConfigError> {
        let bad = |why: &str| {
            ConfigError(format!(
                "{flag} {url}: {why}; give kafka://HOST:PORT/TOPIC, e.g. kafka://127.0.0.1:9092/events"
            ))
        };
        let rest = url.strip_prefix(KAFKA_SCHEME).ok_or_else(|| bad("not a kafka:// URL"))?;
        let (bootstrap, topic) = rest.split_once('/').ok_or_else(|| bad("the topic is missing"))?;
        let (host, port) = bootstrap.rsplit_once(':').ok_or_else(|| bad("the broker's port is missing"))?;
        if host.is_empty() {
            return Err(bad("the broker's host is missing"));
        }
        if port.parse::<u16>().is_err() {
            return Err(bad(&format!("the port {port:?} is not a number from 0 to 65535")));
        }
        // Kafka's rule for topic names.
        let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if topic.is_empty() || topic.len() > 249 || !topic.chars().all(legal) {
            return Err(bad(&format!(
                "{topic:?} is not a topic name (1 to 249 characters of ASCII letters, digits, '.', '_' and '-')"
            )));
        }
        if group.is_empty() {
            return Err(ConfigError("--group must name a consumer group".into()));
        }
        Ok(Self { bootstrap: bootstrap.to_owned(), topic: topic.to_owned(), group: group.to_owned(), partition: None })
    }
}

impl From<PathBuf> for Stream {
    fn from(p: PathBuf) -> Self {
        if p.as_os_str() == "-" { Self::Std } else { Self::File(p) }
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Std => f.write_str("-"),
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Kafka(k) => match k.partition {
                Some(p) => write!(f, "{KAFKA_SCHEME}{}/{} partition {p}", k.bootstrap, k.topic),
                None => write!(f, "{KAFKA_SCHEME}{}/{}", k.bootstrap, k.topic),
            },
        }
    }
}

/// Limits on what one plugin call and one batch may use. Every field has a default
/// (see `Limits::default`), documented in the README.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// CPU time one plugin call may take before it is interrupted (default 1000 ms).
    pub call_cpu_ms_max: u64,
    /// Memory one plugin instance may hold: all its linear memories together, plus
    /// 8 bytes per element of all its tables (default 256 MiB). A component that needs
    /// more at instantiation is refused at load; growing past it traps.
    pub instance_memory_bytes_max: u64,
    /// Resource handles one plugin instance may hold at once: WASI streams and
    /// pollables, the call's `group-state` handle, resources it makes itself; one more
    /// traps (default 10 000).
    pub instance_resources_max: usize,
    /// Wasm stack of a plugin call (default 512 KiB).
    pub wasm_stack_bytes_max: usize,
    /// Size of one key's state value (default 1 MiB); with a 0.2 plugin, of each value
    /// variable, list element, map key and map value.
    pub state_bytes_max: u64,
    /// Outputs one call may return (default 10 000).
    pub outputs_per_call_max: usize,
    /// Size of one output (default 1 MiB).
    pub output_bytes_max: usize,
    /// Bytes one call may write to the host's log, through the `log` interface and
    /// WASI stdout and stderr together; the rest is dropped and counted (default
    /// 16 KiB).
    pub log_bytes_per_call_max: usize,
    /// Bytes the host copies out of a plugin in one transfer: a call's result, or the
    /// arguments of one host-function call, counting 24 bytes of host overhead per list
    /// item (wasmtime's "hostcall fuel"). Larger transfers trap (default 64 MiB).
    pub transfer_bytes_max: usize,
    /// Length of one input line; a longer line goes to the dead-letter output
    /// (default 1 MiB).
    pub line_bytes_max: usize,
    /// Timeouts fired in one batch; the rest fire in the next batches (default 100 000).
    /// With a 0.2 plugin, the timers fired in one batch.
    pub timeouts_per_batch_max: usize,
    /// 0.2 plugins: the state changes one call may stage (each value set, list element,
    /// map entry and timer is one), and the entries one read may return (default
    /// 10 000).
    pub state_writes_per_call_max: usize,
    /// 0.2 plugins: the timers one key may hold (default 1 000).
    pub timers_per_key_max: usize,
    /// Calls one `process-batch` carries, with a plugin that exports it (default 512;
    /// 1 makes every call a `process` call).
    pub batch_calls_max: usize,
    /// 0.2 plugins: the expired TTL entries (values, list elements, map entries) one
    /// batch removes from the store; the rest stay invisible and go in the next batches
    /// (default 100 000).
    pub ttl_expirations_per_batch_max: usize,
    /// 0.2 plugins: the size of an `--initial-state` file, committed as one commit
    /// (default 1 GiB).
    pub initial_state_bytes_max: u64,
    /// Time a new plugin version may take to migrate the sample of stored values it is
    /// checked with before a hot swap (off the processing path); a slower one is
    /// refused (default 10 000 ms).
    pub migration_check_ms_max: u64,
    /// sled's page cache (default 256 MiB): the process's budget, which a Kafka input
    /// splits evenly over the partitions it may run at once (see
    /// `partitions::partition_cache_bytes`). sled splits it over 256 shards by node and
    /// counts a node rounded up to a power of two, so a shard holds few leaves of 16
    /// pages: at 10M events over 1M sensors, 192 MiB read leaves back from disk in every
    /// walk of the pages, and 256 MiB ran 4–6% faster at the same peak (BENCHMARKS.md).
    pub store_cache_bytes: u64,
    /// Memory for committed state changes not yet folded into sled (default 24 MiB),
    /// per state dir (per partition with a Kafka input): a key updated in many batches
    /// within it is written to sled once.
    pub store_buffer_bytes: u64,
    /// Size of the store's redo log before it is folded into sled (default 64 MiB); a
    /// restart replays at most this much.
    pub store_log_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            call_cpu_ms_max: 1000,
            instance_memory_bytes_max: 256 << 20,
            instance_resources_max: 10_000,
            wasm_stack_bytes_max: 512 << 10,
            state_bytes_max: 1 << 20,
            outputs_per_call_max: 10_000,
            output_bytes_max: 1 << 20,
            log_bytes_per_call_max: 16 << 10,
            transfer_bytes_max: 64 << 20,
            line_bytes_max: 1 << 20,
            timeouts_per_batch_max: 100_000,
            state_writes_per_call_max: 10_000,
            timers_per_key_max: 1_000,
            batch_calls_max: 512,
            ttl_expirations_per_batch_max: 100_000,
            initial_state_bytes_max: 1 << 30,
            migration_check_ms_max: 10_000,
            store_cache_bytes: 256 << 20,
            store_buffer_bytes: 24 << 20,
            store_log_bytes: 64 << 20,
        }
    }
}

/// A whole pipeline: plugin, streams, fields, time and limits.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// The plugin component (`.wasm`).
    pub plugin: PathBuf,
    /// Parameters passed to the plugin's `init`.
    #[serde(default)]
    pub params: Vec<(String, String)>,
    /// JSON Lines input: a file, `-` for stdin, or `kafka://HOST:PORT/TOPIC`.
    pub input: Stream,
    /// The consumer group of a Kafka input: its members share the topic's partitions.
    #[serde(default)]
    pub group: Option<String>,
    /// JSON Lines output.
    pub output: Stream,
    /// The state directory (sled).
    pub state_dir: PathBuf,
    /// The top-level string field holding the group key (a Kafka input's default:
    /// the record's Kafka key).
    #[serde(default)]
    pub key_field: String,
    /// The top-level integer field holding event time in epoch milliseconds.
    #[serde(default)]
    pub time_field: Option<String>,
    /// With a Kafka input: event time is each record's Kafka timestamp (its
    /// producer's CreateTime, or the broker's LogAppendTime), instead of a field.
    #[serde(default)]
    pub kafka_timestamp: bool,
    /// The timeout kind.
    #[serde(default)]
    pub timeout: TimeoutKind,
    /// The watermark trails the largest event time seen by this much (default 0).
    #[serde(default)]
    pub watermark_delay_ms: i64,
    /// A record whose event time is more than this ahead of the batch's processing
    /// time goes to the dead-letter output instead of moving the watermark (default
    /// one day): one record with a clock far off would make every later record late.
    #[serde(default = "default_event_time_ahead")]
    pub event_time_ahead_max_ms: i64,
    /// Records per micro-batch at most (default 500 000).
    #[serde(default = "default_batch_events")]
    pub batch_events_max: usize,
    /// Input bytes per micro-batch at most (default 64 MiB): a batch ends after the
    /// line that reaches it. With the next batch read ahead, about twice this much input
    /// is held in memory.
    #[serde(default = "default_batch_bytes")]
    pub batch_bytes_max: u64,
    /// Distinct keys per micro-batch at most (default 50 000): a batch ends before the
    /// record that would bring one more. It bounds the size of a commit, and with it
    /// sled's memory, when nearly every record has a key of its own. Stdin batches are
    /// bounded by records only.
    #[serde(default = "default_batch_keys")]
    pub batch_keys_max: usize,
    /// What to do when a plugin call fails.
    #[serde(default)]
    pub on_error: ErrorPolicy,
    /// Where undecodable records and dead-lettered calls go: a file (default
    /// `<state-dir>/dead-letter.jsonl`) or, with a Kafka input, a topic.
    #[serde(default)]
    pub dead_letter: Option<Stream>,
    /// Where records behind the watermark go: a file (default
    /// `<state-dir>/late.jsonl`) or, with a Kafka input, a topic.
    #[serde(default)]
    pub late: Option<Stream>,
    /// Keep reading the input after its end (a file still being written, or stdin),
    /// running empty batches every `trigger_interval_ms`.
    #[serde(default)]
    pub follow: bool,
    /// Time between empty batches while the input is quiet (stdin, or a file with
    /// `--follow`), and between checks of a watched plugin file (default 1000 ms).
    #[serde(default = "default_trigger_interval")]
    pub trigger_interval_ms: u64,
    /// Stop after this many batches (for tests and partial runs).
    #[serde(default)]
    pub batches_max: Option<u64>,
    /// Wait for each commit to reach the disk (fsync) before going on (default true).
    #[serde(default = "default_true")]
    pub durable_commits: bool,
    /// Directory for compiled plugins (default `$XDG_CACHE_HOME/groupstate` or
    /// `~/.cache/groupstate`); `none` disables the cache.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// Limits.
    #[serde(default)]
    pub limits: Limits,
}

fn default_event_time_ahead() -> i64 {
    DAY_MS
}
fn default_batch_events() -> usize {
    500_000
}
fn default_batch_bytes() -> u64 {
    64 << 20
}
fn default_batch_keys() -> usize {
    50_000
}
fn default_trigger_interval() -> u64 {
    1000
}
fn default_true() -> bool {
    true
}

/// A configuration that cannot run.
#[derive(Debug, thiserror::Error)]
#[error("invalid pipeline: {0}")]
pub struct ConfigError(pub String);

/// The largest state value a key may hold: a key's record must stay well inside the
/// largest record the store reads back (`codec`'s 256 MiB), or a committed value could
/// never be loaded again.
pub const STATE_BYTES_MAX_UPPER: u64 = 128 << 20;

/// One setting's allowed range, in the table that [`PipelineConfig::validate`] checks.
struct Bound {
    /// The setting's name (the TOML key; the README names its flag).
    name: &'static str,
    value: u128,
    min: u128,
    max: u128,
}

impl Bound {
    fn new(name: &'static str, value: impl Into<i128>, min: impl Into<i128>, max: impl Into<i128>) -> Self {
        // Every setting is an integer of at most 64 bits; a negative one is below
        // every minimum here.
        let clamp = |v: i128| v.max(-1).saturating_add(1) as u128;
        Self { name, value: clamp(value.into()), min: clamp(min.into()), max: clamp(max.into()) }
    }

    fn check(&self) -> Result<(), ConfigError> {
        if (self.min..=self.max).contains(&self.value) {
            return Ok(());
        }
        let shown = |v: u128| if v == 0 { "a negative number".to_owned() } else { (v - 1).to_string() };
        Err(ConfigError(format!(
            "{} is {}, outside its range {}..={}; see the limits table in the README",
            self.name,
            shown(self.value),
            shown(self.min),
            shown(self.max)
        )))
    }
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The least `store_cache_bytes` may be (a Kafka input's split gives no partition less).
pub(crate) const STORE_CACHE_BYTES_MIN: u64 = MIB;
const DAY_MS: i64 = 86_400_000;

impl PipelineConfig {
    /// A pipeline with every optional setting at its default.
    pub fn new(plugin: PathBuf, input: Stream, output: Stream, state_dir: PathBuf, key_field: String) -> Self {
        Self {
            plugin,
            params: Vec::new(),
            input,
            group: None,
            output,
            state_dir,
            key_field,
            time_field: None,
            kafka_timestamp: false,
            timeout: TimeoutKind::None,
            watermark_delay_ms: 0,
            event_time_ahead_max_ms: default_event_time_ahead(),
            batch_events_max: default_batch_events(),
            batch_bytes_max: default_batch_bytes(),
            batch_keys_max: default_batch_keys(),
            on_error: ErrorPolicy::Fail,
            dead_letter: None,
            late: None,
            follow: false,
            trigger_interval_ms: default_trigger_interval(),
            batches_max: None,
            durable_commits: true,
            cache_dir: None,
            limits: Limits::default(),
        }
    }

    /// Reads a TOML pipeline file; relative paths in it are taken relative to the
    /// file's directory.
    pub fn from_toml_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
        let mut config: Self = toml::from_str(&text).map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
        config.resolve_topics()?;
        let base = path.parent().unwrap_or(std::path::Path::new("."));
        config.rebase(base);
        Ok(config)
    }

    /// Turns the `kafka://HOST:PORT/TOPIC` among the input and outputs into topics:
    /// the input is read in consumer `group`, the outputs are produced in the input
    /// partitions' transactions (so they need a Kafka input).
    pub fn resolve_topics(&mut self) -> Result<(), ConfigError> {
        let url = |stream: &Stream| match stream {
            Stream::File(p) => p.to_str().filter(|t| t.starts_with(KAFKA_SCHEME)).map(str::to_owned),
            _ => None,
        };
        if let Some(u) = url(&self.input) {
            let group = self.group.as_deref().ok_or_else(|| {
                ConfigError(format!(
                    "--input {u} needs --group NAME (group = \"NAME\" in a TOML file): the consumer group whose members share the topic's partitions"
                ))
            })?;
            self.input = Stream::Kafka(KafkaInput::parse(&u, group)?);
        }
        let group = match &self.input {
            Stream::Kafka(k) => Some(k.group.clone()),
            _ => None,
        };
        let outputs = [
            ("--output", Some(&mut self.output)),
            ("--late", self.late.as_mut()),
            ("--dead-letter", self.dead_letter.as_mut()),
        ];
        for (flag, stream) in outputs {
            let Some(stream) = stream else { continue };
            let Some(u) = url(stream) else { continue };
            let Some(group) = &group else {
                return Err(ConfigError(format!(
                    "{flag} {u}: a Kafka topic output needs a kafka:// input (its records are produced in the input partition's transaction); write to a file"
                )));
            };
            *stream = Stream::Kafka(KafkaInput::parse_for(flag, &u, group)?);
        }
        Ok(())
    }

    /// Sets the consumer group of the input and of the topics produced in its
    /// transactions.
    pub fn set_group(&mut self, group: &str) {
        self.group = Some(group.to_owned());
        for stream in self.streams_mut() {
            if let Stream::Kafka(k) = stream {
                k.group = group.to_owned();
            }
        }
    }

    /// The input and every output that is set.
    fn streams_mut(&mut self) -> impl Iterator<Item = &mut Stream> {
        [Some(&mut self.input), Some(&mut self.output), self.dead_letter.as_mut(), self.late.as_mut()]
            .into_iter()
            .flatten()
    }

    fn rebase(&mut self, base: &std::path::Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() && p.as_os_str() != "-" {
                *p = base.join(&*p);
            }
        };
        fix(&mut self.plugin);
        fix(&mut self.state_dir);
        for stream in self.streams_mut() {
            if let Stream::File(p) = stream {
                fix(p);
            }
        }
        if let Some(p) = &mut self.cache_dir {
            fix(p);
        }
    }

    /// Checks the settings that do not depend on files.
    /// Every numeric setting with its range: the one table of bounds, documented in
    /// the README's limits table. The upper bounds keep a setting inside what the
    /// host can hold (a state value the store can read back, a wasm32 memory) and
    /// catch a unit slip (bytes for KiB) before it runs.
    fn bounds(&self) -> Vec<Bound> {
        let l = &self.limits;
        vec![
            Bound::new("watermark_delay_ms", self.watermark_delay_ms, 0, 365 * DAY_MS),
            Bound::new("event_time_ahead_max_ms", self.event_time_ahead_max_ms, 1, 100 * 365 * DAY_MS),
            Bound::new("batch_events_max", self.batch_events_max as u64, 1, 10_000_000),
            Bound::new("batch_bytes_max", self.batch_bytes_max, 1, 4 * GIB),
            Bound::new("batch_keys_max", self.batch_keys_max as u64, 1, 10_000_000),
            Bound::new("trigger_interval_ms", self.trigger_interval_ms, 1, DAY_MS),
            Bound::new("call_cpu_ms_max", l.call_cpu_ms_max, 1, 600_000),
            Bound::new("instance_memory_bytes_max", l.instance_memory_bytes_max, 64 * KIB, 4 * GIB),
            Bound::new("instance_resources_max", l.instance_resources_max as u64, 1, 1_000_000),
            Bound::new("migration_check_ms_max", l.migration_check_ms_max, 1, 600_000),
            Bound::new("wasm_stack_bytes_max", l.wasm_stack_bytes_max as u64, 16 * KIB, 64 * MIB),
            Bound::new("state_bytes_max", l.state_bytes_max, 1, STATE_BYTES_MAX_UPPER),
            Bound::new("outputs_per_call_max", l.outputs_per_call_max as u64, 1, 1_000_000),
            Bound::new("output_bytes_max", l.output_bytes_max as u64, 1, 128 * MIB),
            Bound::new("log_bytes_per_call_max", l.log_bytes_per_call_max as u64, 0, 16 * MIB),
            Bound::new("transfer_bytes_max", l.transfer_bytes_max as u64, 1, GIB),
            Bound::new("line_bytes_max", l.line_bytes_max as u64, 1, 256 * MIB),
            Bound::new("timeouts_per_batch_max", l.timeouts_per_batch_max as u64, 1, 10_000_000),
            Bound::new("state_writes_per_call_max", l.state_writes_per_call_max as u64, 1, 1_000_000),
            Bound::new("timers_per_key_max", l.timers_per_key_max as u64, 1, 1_000_000),
            Bound::new("batch_calls_max", l.batch_calls_max as u64, 1, 65_536),
            Bound::new("ttl_expirations_per_batch_max", l.ttl_expirations_per_batch_max as u64, 1, 10_000_000),
            Bound::new("initial_state_bytes_max", l.initial_state_bytes_max, 1, 64u64 << 30),
            Bound::new("store_cache_bytes", l.store_cache_bytes, STORE_CACHE_BYTES_MIN, 64 * GIB),
            Bound::new("store_buffer_bytes", l.store_buffer_bytes, 0, 16 * GIB),
            Bound::new("store_log_bytes", l.store_log_bytes, 0, 16 * GIB),
        ]
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        // A Kafka input keys records by their Kafka key unless a field is named.
        if self.key_field.is_empty() && !matches!(self.input, Stream::Kafka(_)) {
            return Err(ConfigError("--key-field must name a field".into()));
        }
        let kafka_input = matches!(self.input, Stream::Kafka(_));
        if self.group.is_some() && !kafka_input {
            return Err(ConfigError(
                "--group is only for a kafka:// input; drop it, or give --input kafka://HOST:PORT/TOPIC".into(),
            ));
        }
        for (flag, stream) in [
            ("--output", Some(&self.output)),
            ("--late", self.late.as_ref()),
            ("--dead-letter", self.dead_letter.as_ref()),
        ] {
            match stream {
                Some(Stream::Kafka(_)) if !kafka_input => {
                    return Err(ConfigError(format!(
                        "{flag} can be a Kafka topic only with a kafka:// input (its records are produced in the input partition's transaction); write to a file"
                    )));
                }
                Some(Stream::Std) if flag != "--output" => {
                    return Err(ConfigError(format!(
                        "{flag} cannot be - (stdout is the output): give a file path{}",
                        if kafka_input { " or kafka://HOST:PORT/TOPIC" } else { "" }
                    )));
                }
                _ => {}
            }
        }
        if self.kafka_timestamp && !kafka_input {
            return Err(ConfigError(
                "--kafka-timestamp takes event time from Kafka records: it needs a kafka:// input; give --time-field instead".into(),
            ));
        }
        if self.kafka_timestamp && self.time_field.is_some() {
            return Err(ConfigError(
                "--kafka-timestamp and --time-field both name the event time: give one of them".into(),
            ));
        }
        if self.timeout == TimeoutKind::EventTime && self.time_field.is_none() && !self.kafka_timestamp {
            return Err(ConfigError(
                "--timeout event-time needs --time-field (or --kafka-timestamp with a kafka:// input): event-time timeouts are fired by the watermark, which comes from event times".into(),
            ));
        }
        for bound in self.bounds() {
            bound.check()?;
        }
        let limits = &self.limits;
        for (name, value) in
            [("state_bytes_max", limits.state_bytes_max), ("output_bytes_max", limits.output_bytes_max as u64)]
        {
            if value > limits.transfer_bytes_max as u64 {
                return Err(ConfigError(format!(
                    "{name} ({value}) is above transfer_bytes_max ({}), which bounds every copy out of a plugin: a value between the two would trap; lower {name} or raise transfer_bytes_max",
                    limits.transfer_bytes_max
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_toml(text: &str) -> Result<PipelineConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pipeline.toml");
        std::fs::write(&path, text).unwrap();
        PipelineConfig::from_toml_file(&path).and_then(|c| c.validate().map(|()| c))
    }

    const KAFKA: &str = r#"
        plugin = "p.wasm"
        input = "kafka://127.0.0.1:9092/events"
        state_dir = "state"
    "#;

    #[test]
    fn a_toml_file_reads_kafka_topics_in_its_group() {
        let c = from_toml(&format!(
            "{KAFKA}group = \"g\"\noutput = \"kafka://127.0.0.1:9092/alerts\"\nlate = \"late.jsonl\"\ndead_letter = \"kafka://127.0.0.1:9092/dlq\"\n"
        ))
        .unwrap();
        let topic = |s: &Stream| match s {
            Stream::Kafka(k) => Some((k.topic.clone(), k.group.clone())),
            _ => None,
        };
        assert_eq!(topic(&c.input), Some(("events".into(), "g".into())));
        assert_eq!(topic(&c.output), Some(("alerts".into(), "g".into())));
        assert_eq!(c.dead_letter.as_ref().and_then(topic), Some(("dlq".into(), "g".into())));
        assert!(matches!(&c.late, Some(Stream::File(p)) if p.is_absolute() && p.ends_with("late.jsonl")));
        assert_eq!(c.key_field, "", "a Kafka input keys by the Kafka key by default");
    }

    #[test]
    fn kafka_settings_that_cannot_run_are_refused_with_what_to_do() {
        let refused = |text: String, want: &str| {
            let err = from_toml(&text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        };
        refused(format!("{KAFKA}output = \"out.jsonl\"\n"), "needs --group NAME (group = \"NAME\"");
        refused(format!("{KAFKA}group = \"g\"\noutput = \"out.jsonl\"\nlate = \"-\"\n"), "--late cannot be -");
        let file_input = "plugin = \"p.wasm\"\ninput = \"in.jsonl\"\nstate_dir = \"s\"\nkey_field = \"k\"\n";
        refused(format!("{file_input}output = \"kafka://h:1/t\"\n"), "needs a kafka:// input");
        refused(format!("{file_input}output = \"o\"\ngroup = \"g\"\n"), "--group is only for a kafka:// input");
        refused(format!("{KAFKA}group = \"g\"\noutput = \"kafka://h/t\"\n"), "--output kafka://h/t: the broker's port");
    }
}
