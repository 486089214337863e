//! The engine: plans micro-batches (write-ahead) over batches read and grouped by
//! `prepare.rs`, calls the plugin per key and per expired timeout, and commits state,
//! timers, input position and output lengths atomically. What it has to say goes out
//! as `tracing` events, inside a `batch` span (field `batch`, the batch's id) while a
//! batch runs; where they go is the binary's choice.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::Clock;
use crate::config::{ErrorPolicy, PipelineConfig, Stream, TimeoutKind};
use crate::decode::Decoder;
use crate::export::{BatchExport, ExportBatch, ExportError};
pub use crate::function::StateFunction;
use crate::hot_swap::SwapController;
pub use crate::hot_swap::{
    Candidate, OfferError, Offered, PipelineTarget, PluginStatus, SwapSender, SwapTarget, TargetStatus,
};
use crate::pace::PaceWatch;
use crate::plugin::{CallError, CallOutcome, CallRequest, Event, PluginError, Runtime, StagedValue};
use crate::prepare::{Prepared, Preparer, RAMP_RECORDS_MIN, Request};
use crate::sink::{Sink, SinkError, Sinks};
use crate::source::{Source, SourceError};
use crate::store::{
    BatchPlan, Checkpoint, Counters, KeyChange, KeyRecord, PipelineIdentity, Store, StoreError, StoredAhead,
};

/// The time field a state dir records when event time is the Kafka timestamp, so that
/// a state dir made with `--kafka-timestamp` refuses a run with `--time-field`, and
/// the other way round.
const KAFKA_TIMESTAMP_IDENTITY: &str = "(kafka timestamp)";

/// Where a run (or one batch) spent its time, in nanoseconds of the monotonic clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTimes {
    /// Reading and decoding lines, late-data checks and grouping by key (and, for a
    /// seekable input and a 0.1 plugin, reading the keys' stored records ahead). For
    /// a seekable input this runs on a thread of its own, one batch ahead, overlapping
    /// the other stages.
    pub read_decode_ns: u64,
    /// Time the batch loop waited for its batch to be read and decoded.
    pub input_wait_ns: u64,
    /// Loading key records from the store (and migrating them).
    pub state_load_ns: u64,
    /// Plugin calls, with what they returned applied to the batch (outputs to the
    /// sinks' buffers, changes staged).
    pub plugin_ns: u64,
    /// Writing the sinks and committing the store.
    pub commit_ns: u64,
}

impl StageTimes {
    /// Adds `other`'s times to these (a sum over batches).
    pub fn add(&mut self, other: &StageTimes) {
        self.read_decode_ns += other.read_decode_ns;
        self.input_wait_ns += other.input_wait_ns;
        self.state_load_ns += other.state_load_ns;
        self.plugin_ns += other.plugin_ns;
        self.commit_ns += other.commit_ns;
    }

    /// The time spent in each stage since `earlier`, a copy of these times taken before.
    pub fn since(&self, earlier: &StageTimes) -> StageTimes {
        StageTimes {
            read_decode_ns: self.read_decode_ns.saturating_sub(earlier.read_decode_ns),
            input_wait_ns: self.input_wait_ns.saturating_sub(earlier.input_wait_ns),
            state_load_ns: self.state_load_ns.saturating_sub(earlier.state_load_ns),
            plugin_ns: self.plugin_ns.saturating_sub(earlier.plugin_ns),
            commit_ns: self.commit_ns.saturating_sub(earlier.commit_ns),
        }
    }
}

/// A pipeline failed; the message names the stage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The plugin could not be loaded.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The input failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// An output failed.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// A plugin call failed under `--on-error fail`.
    #[error(
        "batch {batch_id}: plugin {plugin} failed on key {key:?}: {cause}; nothing of this batch was committed: fix the plugin, or rerun with --on-error skip or dead-letter"
    )]
    Call {
        /// The batch.
        batch_id: u64,
        /// The plugin's name and version.
        plugin: String,
        /// The key.
        key: String,
        /// What went wrong.
        cause: CallError,
    },
    /// The batch's export (a Kafka transaction) failed; nothing of it is committed.
    #[error("batch {batch_id}: {cause}")]
    Export {
        /// The batch.
        batch_id: u64,
        /// What the export said.
        cause: ExportError,
    },
    /// A batch committed, but folding the redo log into sled then failed.
    #[error(
        "batch {batch_id} committed, but folding the redo log into sled failed: {cause}; the batch is kept in the redo log: fix the cause and run again, the next start replays the log"
    )]
    Fold {
        /// The batch that committed.
        batch_id: u64,
        /// The fold's error.
        cause: StoreError,
    },
    /// `--initial-state` was refused: its file, a line of it, or the plugin's call.
    /// Nothing of the file was stored.
    #[error("--initial-state {}: {why}", path.display())]
    InitialState {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line and what to do.
        why: String,
    },
    /// The state dir belongs to another pipeline.
    #[error("state dir {dir} was created with {recorded}, not {given}; use the original setting, or a new --state-dir")]
    Mismatch {
        /// The state dir.
        dir: PathBuf,
        /// What it records.
        recorded: String,
        /// What this run gave.
        given: String,
    },
}

/// What one committed batch did (for progress reports and metrics).
#[derive(Debug, Clone, Default)]
pub struct BatchReport {
    /// The batch id.
    pub batch_id: u64,
    /// Records read.
    pub records: u64,
    /// Keys called with data.
    pub keys: u64,
    /// Timeouts fired.
    pub timeouts: u64,
    /// Records behind the watermark, sent to the late output.
    pub late: u64,
    /// Whether this batch was a replay of a plan left by a stopped run.
    pub replayed: bool,
    /// The watermark the batch ran with.
    pub watermark_ms: i64,
    /// The batch's own counts (not the pipeline's totals).
    pub counters: Counters,
    /// Entries the batch wrote to the dead-letter output: undecodable records, records
    /// too far ahead in event time, and failed calls under `--on-error dead-letter`.
    pub dead_letters: u64,
    /// Keys the batch added to the store less the keys it removed (a key is stored
    /// while it has a value or a timeout).
    pub keys_delta: i64,
    /// Timeouts the batch set on keys that had none, less those it cleared or that fired.
    pub timers_delta: i64,
    /// Where the batch's time went, a rolled-back attempt included.
    pub stages: StageTimes,
    /// Monotonic time from the batch's boundary to its commit.
    pub duration_ns: u64,
    /// A Kafka partition's records after the batch, as its consumer last learned
    /// from the broker (none for other inputs).
    pub input_lag: Option<u64>,
    /// The batch loop's plugin swaps so far, rollbacks included.
    pub plugin_swaps: u64,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Batches committed by this run.
    pub batches: u64,
    /// Counters of this run only.
    pub run: Counters,
    /// Totals over the pipeline's life.
    pub total: Counters,
    /// The committed checkpoint at the end.
    pub checkpoint: Checkpoint,
    /// The plugin's name, version and state-schema version.
    pub plugin: String,
    /// Wall time of the run in milliseconds (monotonic clock).
    pub elapsed_ms: u64,
    /// Where the run's time went.
    pub stages: StageTimes,
}

/// A running pipeline over one state dir.
pub struct Pipeline {
    config: PipelineConfig,
    clock: Arc<dyn Clock>,
    store: Store,
    input: Preparer,
    /// Stdin has closed.
    input_closed: bool,
    /// The last read of a Kafka partition found its end.
    input_at_end: bool,
    /// The input's records after the last batch read (a Kafka partition's lag).
    input_lag: Option<u64>,
    sinks: Sinks,
    checkpoint: Checkpoint,
    stages: StageTimes,
    runtime: Option<Arc<Runtime>>,
    /// The running plugin and the hot swaps.
    swaps: SwapController,
    /// Per-call plugin time of the recent batches, to notice a plugin turning slow.
    pace: PaceWatch,
    /// Where each batch goes before the local commit (a Kafka partition's
    /// transaction), if anywhere.
    export: Option<Box<dyn BatchExport>>,
    /// The first batch this run planned: its first batches are smaller (see
    /// [`ramped_records_max`]).
    run_first_batch_id: u64,
    /// The vectors of the last batch, emptied, for the next one.
    spare: Spare,
}

/// A call of [`Pipeline::call_keys`]: key, events, and the deadline of the timer that
/// expired (a timeout call).
type Call<'a> = (&'a str, &'a [Event<'a>], Option<i64>);

/// The vectors a batch fills and empties, kept for the next batch. Over many keys each
/// holds a batch's worth of items (MiBs); allocated afresh every batch, they were
/// faulted in again each time, and mimalloc handed them back to the system after its
/// purge delay (BENCHMARKS.md has what keeping them saved). Those of borrowed items
/// are kept as `'static` and [`relabel`]ed to the batch's lifetime and back.
#[derive(Default)]
struct Spare {
    changes: Vec<KeyChange>,
    loaded: Vec<Option<KeyRecord>>,
    keys: Vec<&'static str>,
    calls: Vec<Call<'static>>,
    events: Vec<Event<'static>>,
}

/// `v` emptied, as a vector of another item type of the same layout: the standard
/// library collects a vector's `into_iter` in place, in its own allocation, when the
/// layouts agree (a unit test checks that the capacity stays).
fn relabel<T, U>(mut v: Vec<T>) -> Vec<U> {
    const { assert!(size_of::<T>() == size_of::<U>() && align_of::<T>() == align_of::<U>()) };
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline").field("plugin", &self.swaps.label()).finish_non_exhaustive()
    }
}

/// About how many keys are called and staged as one run (see [`call_run_keys`]): a
/// few of the plugin's `process-batch` runs at the default `batch_calls_max` (512).
const CALL_RUN_KEYS: usize = 2048;

/// The keys of one run of [`Pipeline::call_keys`]: [`CALL_RUN_KEYS`] rounded up to
/// whole `process-batch` runs of `batch_calls_max`, so that no run is cut short.
fn call_run_keys(batch_calls_max: usize) -> usize {
    let per_batch = batch_calls_max.max(1);
    CALL_RUN_KEYS.div_ceil(per_batch) * per_batch
}

/// Batches at the start of a run that read fewer records than `batch_events_max`.
const RAMP_BATCHES: u64 = 4;

/// The records the `nth` batch of a run may read: a sixteenth of `batch_events_max`,
/// then an eighth, a quarter, a half, then all of it, but at least
/// [`RAMP_RECORDS_MIN`]. The first batch is read before anything else can run; the
/// later ones are read while the one before is processed, so a small first batch lets
/// the work overlap sooner and holds less (over 10 000 keys: 50 MiB less at the peak,
/// BENCHMARKS.md).
fn ramped_records_max(batch_events_max: usize, nth: u64) -> usize {
    let shift = u32::try_from(RAMP_BATCHES.saturating_sub(nth)).unwrap_or(0);
    (batch_events_max >> shift).max(RAMP_RECORDS_MIN).min(batch_events_max)
}

/// The default cache directory for compiled plugins.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("groupstate"))
}

/// The file of a side output (`late.jsonl` or `dead-letter.jsonl` in the state dir
/// when not named); none for a Kafka topic.
pub(crate) fn side_path(config: &PipelineConfig, explicit: &Option<Stream>, name: &str) -> Option<PathBuf> {
    match explicit {
        None => Some(config.state_dir.join(name)),
        Some(Stream::File(path)) => Some(path.clone()),
        // `validate` refuses stdout for a side output.
        Some(Stream::Kafka(_) | Stream::Std) => None,
    }
}

/// A side output's sink: its file, or the topic its records are exported to.
fn side_sink(
    config: &PipelineConfig,
    explicit: &Option<Stream>,
    name: &str,
    committed_len: u64,
) -> Result<Sink, Error> {
    Ok(match (explicit, side_path(config, explicit, name)) {
        (Some(Stream::Kafka(topic)), _) => Sink::exported(&topic.topic),
        (_, Some(path)) => Sink::open_file(&path, committed_len)?,
        (_, None) => Sink::stdout(committed_len),
    })
}

impl Pipeline {
    /// Opens the state dir, loads the plugin and positions the input after the last
    /// committed batch.
    pub fn open(config: PipelineConfig, clock: Arc<dyn Clock>) -> Result<Self, Error> {
        config.validate()?;
        let runtime = Arc::new(Runtime::new(&config.limits, config.cache_dir.as_deref())?);
        Self::open_in(runtime, config, clock)
    }

    /// Opens the pipeline with its plugin loaded in `runtime`: the pipelines of a
    /// process's partitions share one engine, epoch ticker and compile cache.
    pub fn open_in(runtime: Arc<Runtime>, config: PipelineConfig, clock: Arc<dyn Clock>) -> Result<Self, Error> {
        config.validate()?;
        let plugin = runtime.load(&config.plugin, &config.params)?;
        Self::open_with_plugin(runtime, config, clock, plugin)
    }

    /// Opens the pipeline with `plugin`, loaded in `runtime` (a Kafka run's partition
    /// opens with the newest version the run has accepted, which may no longer be the
    /// file `config.plugin` names).
    pub fn open_with_plugin(
        runtime: Arc<Runtime>,
        config: PipelineConfig,
        clock: Arc<dyn Clock>,
        plugin: crate::plugin::Plugin,
    ) -> Result<Self, Error> {
        let mut pipeline = Self::open_with_function(config, clock, Box::new(plugin))?;
        pipeline.runtime = Some(runtime);
        Ok(pipeline)
    }

    /// The engine that loaded the plugin (none for a native function): new versions
    /// for hot load are compiled with it.
    pub fn runtime(&self) -> Option<Arc<Runtime>> {
        self.runtime.clone()
    }

    /// Opens the pipeline with a given state function instead of loading
    /// `config.plugin`. This is the benchmarks' seam for a native function (what the
    /// sandbox costs); it is not a user feature.
    #[doc(hidden)]
    pub fn open_with_function(
        config: PipelineConfig,
        clock: Arc<dyn Clock>,
        mut plugin: Box<dyn StateFunction>,
    ) -> Result<Self, Error> {
        config.validate()?;
        check_streams(&config)?;
        // Before the state dir is made: a plugin this pipeline cannot run leaves none.
        if let Some((_, variables)) = plugin.keyed() {
            crate::keyed::check_ttl_clocks(&variables, config.time_field.is_some())
                .map_err(crate::config::ConfigError)?;
        }
        let store = Store::open(
            &config.state_dir.join("store"),
            config.limits.store_cache_bytes,
            config.limits.store_buffer_bytes,
            config.limits.store_log_bytes,
        )?;
        check_identity(&store, &config)?;
        check_state_api(&store, &config, plugin.state_api())?;
        let committed = store.checkpoint()?;
        let mut checkpoint = committed.clone().unwrap_or_default();
        let source = match &config.input {
            Stream::File(path) => {
                let (offset, digest) = (checkpoint.input_offset, checkpoint.input_digest);
                Source::open_file(path, offset, digest, config.limits.line_bytes_max, config.follow)?
            }
            Stream::Std => Source::stdin(checkpoint.input_offset, config.limits.line_bytes_max),
            // The local checkpoint's offset is the truth; without local state the
            // reader starts at the partition's first offset, and refuses a partition
            // the group has consumed past it (its state is elsewhere).
            Stream::Kafka(input) => {
                if input.partition.is_none() {
                    let why = "a kafka input runs one pipeline per partition: run it through partitions::run";
                    return Err(crate::config::ConfigError(why.into()).into());
                }
                let offset = committed.as_ref().map(|c| c.input_offset);
                Source::kafka(input, offset, config.limits.line_bytes_max, clock.clone())?
            }
        };
        if committed.is_none() {
            checkpoint.input_offset = source.offset();
        }
        let output = match &config.output {
            Stream::File(path) => Sink::open_file(path, checkpoint.output_len)?,
            Stream::Std => Sink::stdout(checkpoint.output_len),
            // Its records go out with the batch's export (`set_export`).
            Stream::Kafka(topic) => Sink::exported(&topic.topic),
        };
        let late = side_sink(&config, &config.late, "late.jsonl", checkpoint.late_len)?;
        let dead_letter = side_sink(&config, &config.dead_letter, "dead-letter.jsonl", checkpoint.dead_letter_len)?;
        let mut decoder = Decoder::new(&config.key_field, config.time_field.as_deref());
        if config.kafka_timestamp {
            decoder = decoder.with_kafka_timestamp();
        }
        let input = Preparer::new(source, decoder, clock.clone(), store.page_reader())?;
        Ok(Self {
            run_first_batch_id: checkpoint.next_batch_id,
            spare: Spare::default(),
            config,
            clock,
            store,
            swaps: SwapController::new(plugin, checkpoint.next_batch_id),
            input,
            input_closed: false,
            input_at_end: false,
            input_lag: None,
            sinks: Sinks { output, late, dead_letter },
            checkpoint,
            stages: StageTimes::default(),
            runtime: None,
            pace: PaceWatch::default(),
            export: None,
        })
    }

    /// Gives a new state dir its initial state from `path` (JSON Lines, each line
    /// `{"key": "...", "state": <any JSON>}`, blank lines skipped) through the plugin's
    /// `handle-initial-state`, before the first batch: the whole file is checked first
    /// (a malformed line or a duplicate key is refused with its line number, before any
    /// call), then one call per line, in order, and every call's writes are committed
    /// together in one commit, so a refusal anywhere stores nothing. Only a 0.2 plugin
    /// takes initial state, and only a state dir without a checkpoint. Returns the
    /// number of keys given.
    pub fn load_initial_state(&mut self, path: &Path) -> Result<u64, Error> {
        let refuse = |why: String| Error::InitialState { path: path.to_owned(), why };
        if self.swaps.state_api() != 2 {
            return Err(refuse(format!(
                "plugin {} targets groupstate:plugin@0.1.0, which has no handle-initial-state; initial state needs a groupstate:plugin@0.2.0 plugin",
                self.swaps.label()
            )));
        }
        if matches!(self.config.input, Stream::Kafka(_)) {
            return Err(refuse("a kafka:// input keeps its state per partition, which initial state does not fit yet; run without --initial-state".into()));
        }
        if self.store.checkpoint()?.is_some() || self.store.pending_plan()?.is_some() {
            return Err(refuse(format!(
                "state dir {} already has state (a committed checkpoint): initial state is given once, to a new state dir; drop --initial-state to go on with it, or use a new --state-dir",
                self.config.state_dir.display()
            )));
        }
        let states = read_initial_state(path, &self.config.limits).map_err(refuse)?;
        let started = self.clock.monotonic_ns();
        let plan = BatchPlan {
            batch_id: self.checkpoint.next_batch_id,
            start_offset: 0,
            end_offset: 0,
            processing_time_ms: self.clock.now_ms(),
            watermark_ms: 0,
        };
        let schema = self.swaps.info().state_schema_version;
        let ctx = crate::keyed::CallContext::new(self.config.timeout, &plan, schema, &self.config.limits);
        let Some((function, variables)) = self.swaps.plugin().keyed() else {
            return Err(refuse("the plugin is not a groupstate:plugin@0.2.0 one".into()));
        };
        crate::keyed::check_ttl_clocks(&variables, self.config.time_field.is_some()).map_err(&refuse)?;
        let pairs = states.iter().map(|(_, key, json)| (key.clone(), json.clone()));
        let changes = match crate::keyed::run_initial_state(function, &self.store, variables, &ctx, pairs)? {
            Ok(changes) => changes,
            Err((index, key, cause)) => {
                let line = states[index].0;
                return Err(refuse(format!(
                    "line {line}: key {key:?}: handle-initial-state failed: {cause}; nothing of the file was stored: fix the line (or the plugin) and run again"
                )));
            }
        };
        self.stages.plugin_ns += self.since(started);
        self.store.commit(&changes, &self.checkpoint, self.config.durable_commits)?;
        Ok(states.len() as u64)
    }

    /// Sends every batch through `export` before its local commit (a Kafka
    /// partition's transaction): the local store never gets ahead of it.
    pub fn set_export(&mut self, export: Box<dyn BatchExport>) {
        self.export = Some(export);
    }

    /// The plugin's name, version and schema.
    pub fn plugin_label(&self) -> &str {
        self.swaps.label()
    }

    /// Where to send new plugin versions (hot load).
    pub fn swap_sender(&self) -> SwapSender {
        self.swaps.sender()
    }

    /// The running plugin and the swap history, shared (the admin endpoint reads it).
    pub fn plugin_status(&self) -> Arc<Mutex<PluginStatus>> {
        self.swaps.status()
    }

    /// Where the watcher and the admin endpoint offer new versions of this pipeline's
    /// plugin: none for a native function, which nothing can replace.
    pub fn swap_target(&self) -> Option<PipelineTarget> {
        let runtime = self.runtime.clone()?;
        Some(PipelineTarget::new(runtime, self.config.params.clone(), self.swaps.sender(), self.swaps.status()))
    }

    /// The committed checkpoint (its `input_offset` is where the next batch starts).
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// Whether the last read of a Kafka partition found its end.
    pub fn input_at_end(&self) -> bool {
        self.input_at_end
    }

    /// Folds what the store holds in memory into sled: the end of a run that drives
    /// `next_batch` itself.
    pub fn flush(&mut self) -> Result<(), Error> {
        let started = self.clock.monotonic_ns();
        self.store.flush()?;
        self.stages.commit_ns += self.since(started);
        Ok(())
    }

    /// The state store (read-only use: inspection and tests).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Runs batches until the input ends (or, with `follow`, forever; or until
    /// `batches_max`), calling `on_batch` after each commit.
    pub fn run(&mut self, on_batch: &mut dyn FnMut(&BatchReport)) -> Result<RunSummary, Error> {
        let started_ns = self.clock.monotonic_ns();
        let start_counters = self.checkpoint.counters;
        let mut batches = 0u64;
        while self.config.batches_max.is_none_or(|max| batches < max) {
            match self.next_batch()? {
                Some(report) => {
                    batches += 1;
                    on_batch(&report);
                }
                None if self.input_closed => break,
                // Stdin is read until it closes; the read already waited one trigger
                // interval, and the empty batches that fire timeouts ran meanwhile.
                None if !self.input.is_seekable() => {}
                None if self.config.follow => self.clock.sleep_ms(self.config.trigger_interval_ms),
                None => break,
            }
        }
        // The run's last fold is part of committing.
        self.flush()?;
        let total = self.checkpoint.counters;
        Ok(RunSummary {
            batches,
            run: total.since(&start_counters),
            total,
            checkpoint: self.checkpoint.clone(),
            plugin: self.swaps.label().to_owned(),
            elapsed_ms: (self.clock.monotonic_ns().saturating_sub(started_ns)) / 1_000_000,
            stages: self.stages,
        })
    }

    /// Plans and runs one batch; `None` when there is nothing to do now. Everything it
    /// logs is inside a `batch` span whose `batch` field is the id of the batch it
    /// plans (a caller that runs several pipelines, one per partition, can enter a span
    /// with a `partition` field around it).
    pub fn next_batch(&mut self) -> Result<Option<BatchReport>, Error> {
        let span = tracing::info_span!("batch", batch = self.checkpoint.next_batch_id);
        let _in_batch = span.enter();
        let started = self.clock.monotonic_ns();
        let stages_before = self.stages;
        let mut report = self.boundary_and_batch()?;
        if let Some(report) = &mut report {
            report.stages = self.stages.since(&stages_before);
            report.duration_ns = self.since(started);
        }
        Ok(report)
    }

    fn boundary_and_batch(&mut self) -> Result<Option<BatchReport>, Error> {
        let budget_ms = self.config.limits.migration_check_ms_max;
        self.swaps.at_boundary(self.checkpoint.next_batch_id, &self.store, budget_ms, self.clock.clone());
        match self.plan_and_run() {
            Err(Error::Call { batch_id, plugin, key, cause })
                if self.swaps.on_probation() && self.input.is_seekable() =>
            {
                // The failed batch stays planned and uncommitted: it runs again, from
                // the same input offset, with the plugin that ran before the swap.
                let cause = format!("batch {batch_id}: key {key:?}: {cause}");
                self.swaps.roll_back(self.checkpoint.next_batch_id, &cause, &plugin);
                self.plan_and_run()
            }
            other => other,
        }
    }

    fn plan_and_run(&mut self) -> Result<Option<BatchReport>, Error> {
        let batch_id = self.checkpoint.next_batch_id;
        let start_offset = self.checkpoint.input_offset;
        if let Some(plan) = self.store.pending_plan()?
            && plan.batch_id == batch_id
            && plan.start_offset == start_offset
        {
            if self.input.is_seekable() {
                let prepared = self.prepared(Request {
                    batch_id,
                    start_offset,
                    end_offset: Some(plan.end_offset),
                    watermark_ms: plan.watermark_ms,
                    records_max: usize::MAX,
                    records_room: self.config.batch_events_max,
                    bytes_max: u64::MAX,
                    keys_max: usize::MAX,
                    wait: Duration::ZERO,
                    read_stored: self.swaps.state_api() == 1,
                })?;
                return self.run_plan(plan, prepared, true).map(Some);
            }
            tracing::warn!("batch {batch_id} was planned from stdin and cannot be re-read; planning anew");
        }
        let watermark_ms = self.next_watermark();
        let prepared = self.prepared(self.new_batch_request(batch_id, start_offset, watermark_ms))?;
        if prepared.records == 0
            && let Some(rotation) = prepared.input_rotation
        {
            self.input.recycle(prepared);
            self.continue_with_rotated_input(rotation)?;
            return Ok(None);
        }
        let processing_time_ms = self.clock.now_ms();
        if prepared.records == 0 && !self.has_expired_timers(watermark_ms, processing_time_ms)? {
            return Ok(None);
        }
        let plan =
            BatchPlan { batch_id, start_offset, end_offset: prepared.end_offset, processing_time_ms, watermark_ms };
        self.run_plan(plan, prepared, false).map(Some)
    }

    /// The followed input was rotated and the old file is read to its end: commits
    /// the input position as the start of the file now at the path, which the next
    /// batch reads (a restart after this commit reads it too).
    fn continue_with_rotated_input(&mut self, rotation: crate::source::Rotation) -> Result<(), Error> {
        let next = Checkpoint { input_offset: 0, input_digest: 0, ..self.checkpoint.clone() };
        self.store.commit(&[], &next, self.config.durable_commits)?;
        tracing::info!(
            "input {} was {rotation} after offset {}: continuing with the file now at that path, from its start",
            self.config.input,
            self.checkpoint.input_offset
        );
        self.checkpoint = next;
        self.store.fold_if_due().map_err(|cause| Error::Fold { batch_id: self.checkpoint.next_batch_id, cause })
    }

    /// What a new batch from `start_offset` reads: up to `batch_events_max` records (fewer
    /// in a run's first batches, [`ramped_records_max`]) and `batch_bytes_max` bytes
    /// and, from a file, up to `batch_keys_max` distinct keys (stdin cannot give back the
    /// lines after a cut).
    fn new_batch_request(&self, batch_id: u64, start_offset: u64, watermark_ms: i64) -> Request {
        let nth = batch_id.saturating_sub(self.run_first_batch_id);
        Request {
            batch_id,
            start_offset,
            end_offset: None,
            watermark_ms,
            records_max: ramped_records_max(self.config.batch_events_max, nth),
            records_room: self.config.batch_events_max,
            bytes_max: self.config.batch_bytes_max,
            keys_max: if self.input.is_seekable() { self.config.batch_keys_max } else { usize::MAX },
            wait: Duration::from_millis(self.config.trigger_interval_ms),
            read_stored: self.swaps.state_api() == 1,
        }
    }

    /// The batch read and decoded for `req`, and the time waited for it.
    fn prepared(&mut self, req: Request) -> Result<Prepared, Error> {
        let started = self.clock.monotonic_ns();
        let prepared = self.input.get(req)?;
        self.input_closed = prepared.closed;
        self.input_at_end = prepared.at_end;
        self.input_lag = prepared.lag;
        self.stages.input_wait_ns += self.since(started);
        self.stages.read_decode_ns += prepared.read_decode_ns;
        Ok(prepared)
    }

    /// Monotonic nanoseconds since `start`.
    fn since(&self, start: u64) -> u64 {
        self.clock.monotonic_ns().saturating_sub(start)
    }

    /// The watermark of the next batch: the largest event time of committed batches
    /// minus the delay, never below the last watermark.
    fn next_watermark(&self) -> i64 {
        self.watermark_after(self.checkpoint.max_event_time_ms, self.checkpoint.watermark_ms)
    }

    /// The watermark after batches whose largest event time is `max_event_time_ms`,
    /// the last of which ran with `watermark_ms`.
    fn watermark_after(&self, max_event_time_ms: Option<i64>, watermark_ms: i64) -> i64 {
        let from_events = max_event_time_ms.map_or(i64::MIN, |t| t.saturating_sub(self.config.watermark_delay_ms));
        from_events.max(watermark_ms)
    }

    fn timeout_threshold(&self, watermark_ms: i64, processing_time_ms: i64) -> Option<i64> {
        match self.config.timeout {
            TimeoutKind::None => None,
            TimeoutKind::EventTime => Some(watermark_ms),
            TimeoutKind::ProcessingTime => Some(processing_time_ms),
        }
    }

    /// Whether a batch without data has work: expired timers, or (0.2) expired TTL
    /// entries to remove.
    fn has_expired_timers(&self, watermark_ms: i64, processing_time_ms: i64) -> Result<bool, Error> {
        if self.swaps.state_api() == 2
            && crate::keyed::has_expired_entries(&self.store, processing_time_ms, watermark_ms)?
        {
            return Ok(true);
        }
        match self.timeout_threshold(watermark_ms, processing_time_ms) {
            // A 0.2 timer fires at `expiry <= threshold`.
            Some(threshold) => {
                let threshold = if self.swaps.state_api() == 2 { threshold.saturating_add(1) } else { threshold };
                Ok(!self.store.expired_timers(threshold, 1)?.is_empty())
            }
            None => Ok(false),
        }
    }

    /// Runs a prepared batch: its plan is written to the store before any plugin call
    /// (a replayed plan is already there).
    fn run_plan(&mut self, plan: BatchPlan, mut prepared: Prepared, replayed: bool) -> Result<BatchReport, Error> {
        let ahead_max_ms = self.config.event_time_ahead_max_ms;
        prepared.set_aside_far_ahead(plan.batch_id, plan.processing_time_ms.saturating_add(ahead_max_ms), ahead_max_ms);
        if !replayed {
            // Reading and decoding had no effect that a restart keeps: the plan still
            // comes first.
            self.store.write_plan(&plan)?;
        }
        // The next batch is read and decoded meanwhile, on the input thread.
        let max_event_time_ms = self.checkpoint.max_event_time_ms.max(prepared.max_event_time_ms);
        let next = self.new_batch_request(
            plan.batch_id + 1,
            prepared.end_offset,
            self.watermark_after(max_event_time_ms, plan.watermark_ms),
        );
        self.input.prefetch(next);
        let records = prepared.records;
        let late = prepared.late_lines.len() as u64;
        let counters_before = self.checkpoint.counters;
        let mut batch = Batch::new(plan, counters_before, max_event_time_ms);
        batch.changes = std::mem::take(&mut self.spare.changes);
        batch.input_digest = prepared.input_digest;
        batch.bad_records = prepared.bad_lines.len() as u64;
        batch.counters.records += records;
        batch.counters.events += prepared.groups.event_count() as u64;
        batch.counters.late += late;
        batch.counters.bad_records += prepared.bad_lines.len() as u64;
        let plugin_ns_before = self.stages.plugin_ns;
        let result = self.process(&mut batch, prepared).and_then(|()| {
            let started = self.clock.monotonic_ns();
            let committed = self.commit(&mut batch);
            self.stages.commit_ns += self.since(started);
            committed
        });
        if let Err(e) = result {
            // Nothing of the batch is committed: take back what the sinks wrote.
            if let Err(abort) = self.sinks.abort_batch() {
                tracing::warn!("{abort}");
            }
            return Err(e);
        }
        self.spare.changes = std::mem::take(&mut batch.changes);
        self.note_pace(
            batch.plan.batch_id,
            self.stages.plugin_ns - plugin_ns_before,
            batch.data_keys + batch.timeout_keys,
        );
        Ok(BatchReport {
            batch_id: batch.plan.batch_id,
            records,
            keys: batch.data_keys,
            timeouts: batch.timeout_keys,
            late,
            replayed,
            watermark_ms: batch.plan.watermark_ms,
            counters: batch.counters.since(&counters_before),
            dead_letters: batch.bad_records + batch.dead_lettered_calls,
            keys_delta: batch.keys_delta,
            timers_delta: batch.timers_delta,
            // Filled in by `next_batch`, which sees the whole batch.
            stages: StageTimes::default(),
            duration_ns: 0,
            input_lag: self.input_lag,
            plugin_swaps: self.swaps.swaps(),
        })
    }

    /// Warns when a committed batch's plugin time per call is far above that of the
    /// recent batches (see `pace.rs`).
    fn note_pace(&mut self, batch_id: u64, plugin_ns: u64, calls: u64) {
        let Some(slow) = self.pace.record(plugin_ns, calls) else {
            return;
        };
        tracing::warn!(
            "batch {batch_id}: plugin {} took {} us per call, {}x the median of the last {} batches ({} us); a plugin that spends most of call_cpu_ms_max ({} ms) on every key slows the whole pipeline",
            self.swaps.label(),
            slow.per_call_ns / 1000,
            slow.per_call_ns / slow.median_ns.max(1),
            slow.batches,
            slow.median_ns / 1000,
            self.config.limits.call_cpu_ms_max,
        );
    }

    fn process(&mut self, batch: &mut Batch, prepared: Prepared) -> Result<(), Error> {
        let result = self.call_all(batch, &prepared);
        // The input thread allocated the batch: it frees it too (a free from another
        // thread is several times dearer in mimalloc).
        self.input.recycle(prepared);
        result
    }

    fn call_all(&mut self, batch: &mut Batch, prepared: &Prepared) -> Result<(), Error> {
        for line in &prepared.late_lines {
            self.sinks.late.push_line(line)?;
        }
        for line in &prepared.bad_lines {
            self.sinks.dead_letter.push_line(line)?;
        }
        // A hot swap to a plugin of the other world would read the state as it is not.
        check_state_api(&self.store, &self.config, self.swaps.state_api())?;
        if self.swaps.state_api() == 2 {
            return self.call_all_keyed(batch, prepared);
        }
        let groups = &prepared.groups;
        batch.data_keys = groups.len() as u64;
        // Most calls change their key: grown by doubling, this vector of a batch over
        // many keys was copied and faulted in again and again (5% of a 1M-key run).
        batch.changes.reserve(groups.len());
        let mut events: Vec<Event<'_>> = relabel(std::mem::take(&mut self.spare.events));
        events.extend(groups.events());
        let calls = groups.ranges().map(|(key, range)| (key, &events[range], None));
        let called = self.call_listed(batch, calls, groups.key_order(), Some(&prepared.stored));
        self.spare.events = relabel(events);
        called?;
        let Some(threshold) = self.timeout_threshold(batch.plan.watermark_ms, batch.plan.processing_time_ms) else {
            return Ok(());
        };
        // Keys with data in this batch never time out in it; fetch enough to skip them.
        let limit = self.config.limits.timeouts_per_batch_max;
        let expired = self.store.expired_timers(threshold, limit.saturating_add(groups.len()))?;
        if expired.is_empty() {
            return Ok(());
        }
        let data_keys: HashSet<&str, foldhash::fast::RandomState> = groups.keys().collect();
        let expired: Vec<(i64, String)> =
            expired.into_iter().filter(|(_, k)| !data_keys.contains(k.as_str())).take(limit).collect();
        batch.changes.reserve(expired.len());
        batch.timeout_keys += expired.len() as u64;
        let calls = expired.iter().map(|(deadline, key)| (key.as_str(), &[][..], Some(*deadline)));
        self.call_listed(batch, calls, None, None)
    }

    /// Lists `calls` in the spare call vector, loads their keys' records, and runs
    /// [`Pipeline::call_keys`], timed as a run (also when a call failed the batch: its
    /// stage times include the attempt). `key_order` numbers the calls in the order of
    /// their keys, and `stored` has their stored records read ahead, if the caller has
    /// them (see `Store::get_many`).
    fn call_listed<'a>(
        &mut self,
        batch: &mut Batch,
        calls: impl Iterator<Item = Call<'a>>,
        key_order: Option<&[u32]>,
        stored: Option<&StoredAhead>,
    ) -> Result<(), Error> {
        let mut listed: Vec<Call<'_>> = relabel(std::mem::take(&mut self.spare.calls));
        listed.extend(calls);
        let called = self.load(listed.iter().map(|&(key, _, _)| key), key_order, stored).and_then(|loaded| {
            let started = self.calls_started();
            let called = self.call_keys(batch, &listed, loaded);
            self.calls_done(started);
            called
        });
        self.spare.calls = relabel(listed);
        called
    }

    /// A 0.2 plugin's batch (`keyed.rs`): its data calls, then its expired timers.
    fn call_all_keyed(&mut self, batch: &mut Batch, prepared: &Prepared) -> Result<(), Error> {
        let started = self.clock.monotonic_ns();
        let plan = &batch.plan;
        let threshold = self.timeout_threshold(plan.watermark_ms, plan.processing_time_ms);
        let schema = self.swaps.info().state_schema_version;
        let ctx = crate::keyed::CallContext::new(self.config.timeout, plan, schema, &self.config.limits);
        let (limit, fail) = (self.config.limits.timeouts_per_batch_max, self.config.on_error == ErrorPolicy::Fail);
        let Some((function, variables)) = self.swaps.plugin().keyed() else {
            return Err(crate::config::ConfigError("the plugin is not a groupstate:plugin@0.2.0 one".into()).into());
        };
        crate::keyed::check_ttl_clocks(&variables, self.config.time_field.is_some())
            .map_err(crate::config::ConfigError)?;
        let events: Vec<Event<'_>> = prepared.groups.events().collect();
        let groups: Vec<(&str, &[Event<'_>])> =
            prepared.groups.ranges().map(|(key, range)| (key, &events[range])).collect();
        let spare = std::mem::take(&mut batch.changes);
        let done =
            crate::keyed::run_batch(function, &self.store, variables, &ctx, &groups, threshold, limit, fail, spare)?;
        self.stages.plugin_ns += self.since(started);
        for called in done.calls {
            let key = called.key.as_str();
            let group = called.group.and_then(|i| groups.get(i));
            let events: &[Event<'_>] = group.map_or(&[], |&(_, events)| events);
            if called.group.is_none() {
                batch.timeout_keys += 1;
                batch.counters.timeout_calls += 1;
            } else {
                batch.data_keys += 1;
                batch.counters.data_calls += 1;
            }
            match called.result {
                Ok(outputs) => {
                    for out in &outputs {
                        self.sinks.output.push_line(out)?;
                    }
                    batch.counters.outputs += outputs.len() as u64;
                }
                // Its changes were not applied; the policy decides the rest (a failed
                // timer call drops the timer, as 0.1's does).
                Err(cause) => self.call_failed(batch, key, events, None, cause)?,
            }
        }
        batch.set_changes(done.changes);
        Ok(())
    }

    /// Loads the committed records of a batch's keys at once (see `Store::get_many`).
    fn load<'k>(
        &mut self,
        keys: impl Iterator<Item = &'k str>,
        key_order: Option<&[u32]>,
        stored: Option<&StoredAhead>,
    ) -> Result<Vec<Option<KeyRecord>>, Error> {
        let started = self.clock.monotonic_ns();
        let mut asked: Vec<&str> = relabel(std::mem::take(&mut self.spare.keys));
        asked.extend(keys);
        let mut loaded = std::mem::take(&mut self.spare.loaded);
        debug_assert!(loaded.is_empty(), "call_keys empties the loaded records it keeps");
        let result = self.store.get_many(&asked, key_order, stored, &mut loaded);
        self.spare.keys = relabel(asked);
        self.stages.state_load_ns += self.since(started);
        result?;
        Ok(loaded)
    }

    /// Calls the plugin for each `(key, events, deadline)` (a deadline: a timeout call
    /// for the timer that expired at it) with its loaded record (`loaded`, in the same
    /// order), in runs of [`call_run_keys`]: for each run, migrates each loaded state
    /// written by an older schema, makes one [`StateFunction::call_many`] (which a
    /// plugin may run as a few `process-batch` calls), then stages the results in order.
    fn call_keys(
        &mut self,
        batch: &mut Batch,
        calls: &[Call<'_>],
        mut loaded: Vec<Option<KeyRecord>>,
    ) -> Result<(), Error> {
        for ((key, _, deadline), before) in calls.iter().zip(&loaded) {
            // Timer calls only: a data call's record is first read where it is called.
            let Some(deadline) = *deadline else { continue };
            let stored = before.as_ref().and_then(|r| r.timeout_ms);
            if stored != Some(deadline) {
                return Err(StoreError::Corrupt(format!(
                    "timer index says key {key:?} expires at {deadline}, its record says {stored:?}"
                ))
                .into());
            }
        }
        let schema = self.swaps.info().state_schema_version;
        // In runs of about `CALL_RUN_KEYS`: the per-call vectors of a whole batch over many
        // keys (MiBs each) were faulted in afresh every batch, and handed back to the
        // system after it.
        debug_assert_eq!(loaded.len(), calls.len());
        let mut rest = loaded.drain(..);
        for calls in calls.chunks(call_run_keys(self.config.limits.batch_calls_max)) {
            let loaded: Vec<Option<KeyRecord>> = rest.by_ref().take(calls.len()).collect();
            self.call_run(batch, calls, loaded, schema)?;
        }
        drop(rest);
        self.spare.loaded = loaded;
        Ok(())
    }

    /// [`Pipeline::call_keys`] for one run of keys.
    fn call_run(
        &mut self,
        batch: &mut Batch,
        calls: &[Call<'_>],
        loaded: Vec<Option<KeyRecord>>,
        schema: u32,
    ) -> Result<(), Error> {
        let values: Vec<Result<LoadedValue, CallError>> =
            loaded.iter().map(|before| self.migrated_value(before.as_ref(), schema)).collect();
        let plan = &batch.plan;
        let mut reqs: Vec<CallRequest<'_>> = Vec::with_capacity(calls.len());
        reqs.extend(calls.iter().zip(&loaded).zip(&values).filter_map(
            |((&(key, events, deadline), before), value)| {
                let state = value.as_ref().ok()?.bytes(before.as_ref());
                Some(CallRequest {
                    batch_id: plan.batch_id,
                    key,
                    events,
                    state,
                    has_timed_out: deadline.is_some(),
                    watermark_ms: plan.watermark_ms,
                    processing_time_ms: plan.processing_time_ms,
                })
            },
        ));
        let outcomes = self.swaps.plugin().call_many(self.config.timeout, &reqs);
        drop(reqs);
        let mut outcomes = outcomes.into_iter();
        for ((&(key, events, deadline), before), value) in calls.iter().zip(loaded).zip(values) {
            if deadline.is_some() {
                batch.counters.timeout_calls += 1;
            } else {
                batch.counters.data_calls += 1;
            }
            let called = value.and_then(|value| {
                let outcome = outcomes.next().unwrap_or_else(|| {
                    Err(CallError::BadResult("the plugin returned fewer outcomes than calls".into()))
                });
                outcome.map(|outcome| (value, outcome))
            });
            match called {
                Ok((value, outcome)) => self.apply(batch, key, before, value, outcome, schema)?,
                Err(cause) => self.call_failed(batch, key, events, before, cause)?,
            }
        }
        Ok(())
    }

    /// Starts timing a run of calls: the clock, and the state load so far (which a
    /// migration in a call adds to). The calls are timed as a run, not one by one: two
    /// clock reads a call showed in profiles at a million keys.
    fn calls_started(&self) -> (u64, u64) {
        (self.clock.monotonic_ns(), self.stages.state_load_ns)
    }

    /// Adds a run of calls to the plugin stage: the time since it started, less the
    /// migrations in it. The plugin stage includes applying what the calls returned.
    fn calls_done(&mut self, (started, load_before): (u64, u64)) {
        let migrations = self.stages.state_load_ns.saturating_sub(load_before);
        self.stages.plugin_ns += self.since(started).saturating_sub(migrations);
    }

    /// The value a call gets: the stored one, or the stored one migrated to the running
    /// plugin's schema.
    fn migrated_value(&mut self, before: Option<&KeyRecord>, schema: u32) -> Result<LoadedValue, CallError> {
        match before {
            Some(KeyRecord { value: Some(v), schema_version, .. }) if *schema_version != schema => {
                let started = self.clock.monotonic_ns();
                let migrated = self.swaps.plugin().migrate(*schema_version, v);
                self.stages.state_load_ns += self.since(started);
                migrated.map(LoadedValue::Migrated)
            }
            _ => Ok(LoadedValue::Stored),
        }
    }

    fn apply(
        &mut self,
        batch: &mut Batch,
        key: &str,
        before: Option<KeyRecord>,
        value: LoadedValue,
        outcome: CallOutcome,
        schema: u32,
    ) -> Result<(), Error> {
        for out in &outcome.outputs {
            self.sinks.output.push_record(key, out)?;
        }
        batch.counters.outputs += outcome.outputs.len() as u64;
        let value = match outcome.value {
            StagedValue::Unchanged => value.bytes(before.as_ref()).map(<[u8]>::to_vec),
            StagedValue::Updated(v) => Some(v),
            StagedValue::Removed => None,
        };
        let after = KeyRecord { value, timeout_ms: outcome.timeout_ms, schema_version: schema };
        let after = (!after.is_empty()).then_some(after);
        if after != before {
            batch.push_change(KeyChange { key: key.to_owned(), before, after });
        }
        Ok(())
    }

    fn call_failed(
        &mut self,
        batch: &mut Batch,
        key: &str,
        events: &[Event<'_>],
        before: Option<KeyRecord>,
        cause: CallError,
    ) -> Result<(), Error> {
        if self.config.on_error == ErrorPolicy::Fail {
            return Err(Error::Call {
                batch_id: batch.plan.batch_id,
                plugin: self.swaps.label().to_owned(),
                key: key.to_owned(),
                cause,
            });
        }
        batch.counters.failed_calls += 1;
        if self.config.on_error == ErrorPolicy::DeadLetter {
            let state_before_hex = before.as_ref().and_then(|r| r.value.as_deref()).map(crate::codec::hex);
            let entry = serde_json::json!({
                "kind": "plugin-error",
                "batch": batch.plan.batch_id,
                "key": key,
                "error": cause.to_string(),
                "timed_out": events.is_empty(),
                "events": events.iter().map(|e| e.payload).collect::<Vec<_>>(),
                "state_before_hex": state_before_hex,
            });
            self.sinks.dead_letter.push_line(&entry.to_string())?;
            batch.dead_lettered_calls += 1;
        }
        // The key keeps its state. A failed timeout call also drops the timer, or the
        // key would fail again in every following batch.
        if events.is_empty()
            && let Some(record) = &before
        {
            let after = KeyRecord { timeout_ms: None, ..record.clone() };
            let after = (!after.is_empty()).then_some(after);
            batch.push_change(KeyChange { key: key.to_owned(), before, after });
        }
        Ok(())
    }

    fn commit(&mut self, batch: &mut Batch) -> Result<(), Error> {
        let plan = &batch.plan;
        let durable = self.config.durable_commits;
        let lengths = self.sinks.prepare_commit(durable)?;
        let next = Checkpoint {
            next_batch_id: plan.batch_id + 1,
            input_offset: plan.end_offset,
            input_digest: batch.input_digest,
            output_len: lengths.output,
            late_len: lengths.late,
            dead_letter_len: lengths.dead_letter,
            max_event_time_ms: batch.max_event_time_ms,
            watermark_ms: plan.watermark_ms,
            counters: batch.counters,
        };
        self.export(plan, &batch.changes, &next)?;
        self.store.commit(&batch.changes, &next, durable)?;
        batch.changes.clear();
        self.sinks.committed();
        // The new plugin has committed a batch: no rollback from here on.
        self.swaps.committed();
        self.checkpoint = next;
        // The batch is committed: a fold that fails now stops the run, and the next
        // start replays the log, but nothing of the batch is taken back.
        self.store.fold_if_due().map_err(|cause| Error::Fold { batch_id: plan.batch_id, cause })
    }
}

impl Pipeline {
    /// Sends the batch through the export, unless it went out before: a replayed
    /// batch that ends where the export has committed is the one whose local commit
    /// did not follow (it runs again for the local store and the files only).
    fn export(&mut self, plan: &BatchPlan, changes: &[KeyChange], next: &Checkpoint) -> Result<(), Error> {
        let topics = self.sinks.exported();
        let Some(export) = &mut self.export else {
            if topics.is_empty() {
                return Ok(());
            }
            let why = "a Kafka topic output needs the batch's export (a Kafka input's transaction): run it through partitions::run";
            return Err(crate::config::ConfigError(why.into()).into());
        };
        if export.exported(plan) {
            tracing::info!(
                "batch {}: its transaction committed before the local commit was cut short; not sent again",
                plan.batch_id
            );
            return Ok(());
        }
        let state_api = self.swaps.state_api();
        let batch = ExportBatch { plan, topics: &topics, changes, checkpoint: next, state_api };
        export.export(&batch).map_err(|cause| Error::Export { batch_id: plan.batch_id, cause })
    }
}

/// The state value a call gets, from its key's stored record.
enum LoadedValue {
    /// The record's value, as stored (none without a record).
    Stored,
    /// The record's value, written under an older state schema, migrated.
    Migrated(Vec<u8>),
}

impl LoadedValue {
    /// The bytes the call gets, from `before`, the record it was loaded from.
    fn bytes<'a>(&'a self, before: Option<&'a KeyRecord>) -> Option<&'a [u8]> {
        match self {
            LoadedValue::Stored => before.and_then(|r| r.value.as_deref()),
            LoadedValue::Migrated(migrated) => Some(migrated),
        }
    }
}

/// The working set of one batch.
struct Batch {
    plan: BatchPlan,
    counters: Counters,
    changes: Vec<KeyChange>,
    /// The largest event time of the committed batches and this one.
    max_event_time_ms: Option<i64>,
    /// A digest of the input before the batch's end offset.
    input_digest: u32,
    data_keys: u64,
    timeout_keys: u64,
    /// Dead-letter entries for records that could not go to the plugin.
    bad_records: u64,
    /// Dead-letter entries for failed calls.
    dead_lettered_calls: u64,
    /// See [`BatchReport::keys_delta`] and [`BatchReport::timers_delta`].
    keys_delta: i64,
    timers_delta: i64,
}

impl Batch {
    fn new(plan: BatchPlan, counters: Counters, max_event_time_ms: Option<i64>) -> Self {
        Self {
            plan,
            counters,
            changes: Vec::new(),
            max_event_time_ms,
            input_digest: 0,
            data_keys: 0,
            timeout_keys: 0,
            bad_records: 0,
            dead_lettered_calls: 0,
            keys_delta: 0,
            timers_delta: 0,
        }
    }

    /// Adds a change, and what it does to the numbers of stored keys and timers: counted
    /// as the change is made, while its records are in the cache (a pass over a batch's
    /// changes before its commit read them back from memory: 3% of a batch loop at a
    /// million keys).
    fn push_change(&mut self, change: KeyChange) {
        let (keys, timers) = stored_delta(&change);
        self.keys_delta += keys;
        self.timers_delta += timers;
        self.changes.push(change);
    }

    /// Takes the changes of a 0.2 batch (`keyed.rs`), made all at once, in place of the
    /// ones it has (none).
    fn set_changes(&mut self, changes: Vec<KeyChange>) {
        let sum = |(k, t): (i64, i64), (dk, dt): (i64, i64)| (k + dk, t + dt);
        (self.keys_delta, self.timers_delta) = changes.iter().map(stored_delta).fold((0, 0), sum);
        self.changes = changes;
    }
}

/// How a change moves the number of stored keys and of pending timers. Each change
/// carries the key's committed record before the batch, so this needs no store read.
fn stored_delta(change: &KeyChange) -> (i64, i64) {
    let stored = |r: &Option<KeyRecord>| i64::from(r.is_some());
    let timer = |r: &Option<KeyRecord>| i64::from(r.as_ref().is_some_and(|r| r.timeout_ms.is_some()));
    (stored(&change.after) - stored(&change.before), timer(&change.after) - timer(&change.before))
}

/// The settings a state dir is tied to, as this run gives them.
fn identity_of(config: &PipelineConfig) -> PipelineIdentity {
    PipelineIdentity {
        key_field: config.key_field.clone(),
        // A state dir is tied to where its event times come from.
        time_field: if config.kafka_timestamp {
            Some(KAFKA_TIMESTAMP_IDENTITY.to_owned())
        } else {
            config.time_field.clone()
        },
        timeout: config.timeout.as_str().to_owned(),
        input: stream_identity(&config.input),
        output: stream_identity(&config.output),
    }
}

/// A stream as a state dir remembers it: the same file named by another path is the
/// same stream (an output may not exist yet: its folder is resolved, not the file).
fn stream_identity(stream: &Stream) -> String {
    let path = match stream {
        Stream::File(path) => path,
        // A partition of a topic, wherever the broker is reached.
        Stream::Kafka(k) => return format!("kafka topic {} partition {}", k.topic, k.partition.unwrap_or(0)),
        Stream::Std => return "-".to_owned(),
    };
    let resolved = std::fs::canonicalize(path).ok().or_else(|| {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        Some(std::fs::canonicalize(parent).ok()?.join(path.file_name()?))
    });
    resolved.unwrap_or_else(|| path.clone()).display().to_string()
}

fn check_identity(store: &Store, config: &PipelineConfig) -> Result<(), Error> {
    let given = identity_of(config);
    let Some(recorded) = store.pipeline_identity()? else {
        store.set_pipeline_identity(&given)?;
        return Ok(());
    };
    let time = |id: &PipelineIdentity| id.time_field.clone().unwrap_or_else(|| "(none)".to_owned());
    // Only the settings that differ are named.
    let differing: Vec<(&str, String, String)> = [
        ("--input", recorded.input.clone(), given.input.clone()),
        ("--output", recorded.output.clone(), given.output.clone()),
        ("--key-field", recorded.key_field.clone(), given.key_field.clone()),
        ("--time-field", time(&recorded), time(&given)),
        ("--timeout", recorded.timeout.clone(), given.timeout.clone()),
    ]
    .into_iter()
    .filter(|(_, was, is)| was != is)
    .collect();
    if differing.is_empty() {
        return Ok(());
    }
    let describe = |recorded: bool| {
        let value = |d: &(&str, String, String)| if recorded { d.1.clone() } else { d.2.clone() };
        differing.iter().map(|d| format!("{} {}", d.0, value(d))).collect::<Vec<_>>().join(" ")
    };
    Err(Error::Mismatch { dir: config.state_dir.clone(), recorded: describe(true), given: describe(false) })
}

/// The lines of an initial-state file: (line number, key, the `state` value as JSON
/// text), checked whole before any call: a malformed line, a key too long or given
/// twice, or a file over `initial_state_bytes_max` is refused with what to do.
fn read_initial_state(path: &Path, limits: &crate::config::Limits) -> Result<Vec<(usize, String, String)>, String> {
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("{e}; give a JSON Lines file of {{\"key\": ..., \"state\": ...}} lines"))?;
    if meta.len() > limits.initial_state_bytes_max {
        return Err(format!(
            "{} bytes, over initial_state_bytes_max ({}): the whole initial state is one commit; raise the limit in the pipeline file",
            meta.len(),
            limits.initial_state_bytes_max
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{e}; it must be UTF-8 JSON Lines"))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let number = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let shape = "each line is {\"key\": \"...\", \"state\": <any JSON>}";
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("line {number}: not JSON ({e}); {shape}"))?;
        let Some(object) = value.as_object() else {
            return Err(format!("line {number}: not a JSON object; {shape}"));
        };
        let Some(key) = object.get("key").and_then(serde_json::Value::as_str) else {
            return Err(format!("line {number}: no string field \"key\"; {shape}"));
        };
        let Some(state) = object.get("state") else {
            return Err(format!("line {number}: no field \"state\"; {shape}"));
        };
        if key.len() > crate::store::KEY_BYTES_MAX {
            return Err(format!(
                "line {number}: the key has {} bytes, over the store's {}",
                key.len(),
                crate::store::KEY_BYTES_MAX
            ));
        }
        if let Some(first) = seen.insert(key.to_owned(), number) {
            return Err(format!(
                "line {number}: key {key:?} again (first on line {first}): each key has one line of initial state; merge them"
            ));
        }
        out.push((number, key.to_owned(), state.to_string()));
    }
    Ok(out)
}

/// A state dir holds the state of one plugin world: its first run records it, and a
/// plugin of the other world is refused (0.1 records and 0.2 entries share no layout).
fn check_state_api(store: &Store, config: &PipelineConfig, api: u32) -> Result<(), Error> {
    match store.state_api()? {
        None => {
            if api == 2 {
                store.set_keyed_layout(crate::keyed::KEYED_LAYOUT)?;
            }
            Ok(store.set_state_api(api)?)
        }
        Some(2) if api == 2 => match store.keyed_layout()? {
            Some(crate::keyed::KEYED_LAYOUT) => Ok(()),
            layout => Err(Error::Mismatch {
                dir: config.state_dir.clone(),
                recorded: format!("0.2 entries in layout {} (a development build before TTL)", layout.unwrap_or(0)),
                given: format!("layout {}", crate::keyed::KEYED_LAYOUT),
            }),
        },
        Some(recorded) if recorded == api => Ok(()),
        Some(recorded) => Err(Error::Mismatch {
            dir: config.state_dir.clone(),
            recorded: format!("a groupstate:plugin@0.{recorded}.0 plugin"),
            given: format!("a groupstate:plugin@0.{api}.0 plugin"),
        }),
    }
}

/// Checks that the input can be read and the outputs written, before the state dir
/// is created or changed: a wrong path must not leave a state dir tied to it.
fn check_streams(config: &PipelineConfig) -> Result<(), Error> {
    let bad = |what: String| Err(Error::Config(crate::config::ConfigError(what)));
    if let Stream::File(path) = &config.input {
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => {
                return bad(format!("--input {} is a directory; give a JSON Lines file", path.display()));
            }
            Ok(_) => {}
            Err(e) => return bad(format!("--input {}: {e}; check the path", path.display())),
        }
    }
    let outputs = [
        (
            "--output",
            match &config.output {
                Stream::File(path) => Some(path.clone()),
                Stream::Std | Stream::Kafka(_) => None,
            },
        ),
        ("--late", side_path(config, &config.late, "late.jsonl")),
        ("--dead-letter", side_path(config, &config.dead_letter, "dead-letter.jsonl")),
    ];
    for (flag, path) in outputs {
        let Some(path) = path else { continue };
        // A missing folder is created with the file; a directory cannot be one.
        if path.is_dir() {
            return bad(format!("{flag} {} is a directory; give a file path for the output", path.display()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_run_is_whole_process_batch_runs() {
        assert_eq!(call_run_keys(512), 2048);
        assert_eq!(call_run_keys(1000), 3000);
        assert_eq!(call_run_keys(65_536), 65_536);
        assert_eq!(call_run_keys(1), CALL_RUN_KEYS);
        assert_eq!(call_run_keys(0), CALL_RUN_KEYS);
    }

    /// A relabelled vector is the same allocation, emptied, both ways.
    #[test]
    fn relabel_keeps_the_allocation() {
        let text = String::from("key");
        let mut calls: Vec<Call<'_>> = relabel(Vec::<Call<'static>>::with_capacity(1000));
        assert!(calls.capacity() >= 1000);
        calls.extend((0..1000).map(|_| (text.as_str(), &[][..], None)));
        let address = calls.as_ptr().cast::<u8>();
        let spare: Vec<Call<'static>> = relabel(calls);
        assert!(spare.is_empty());
        assert!(spare.capacity() >= 1000, "capacity {}", spare.capacity());
        assert_eq!(spare.as_ptr().cast::<u8>(), address);
    }

    #[test]
    fn a_runs_first_batches_ramp_up_to_batch_events_max_and_small_ones_do_not() {
        let ramp: Vec<usize> = (0..6).map(|nth| ramped_records_max(500_000, nth)).collect();
        assert_eq!(ramp, [31_250, 62_500, 125_000, 250_000, 500_000, 500_000]);
        assert_eq!(ramped_records_max(100_000, 0), RAMP_RECORDS_MIN);
        for small in [1, 443, 7_000, RAMP_RECORDS_MIN] {
            assert_eq!(ramped_records_max(small, 0), small, "a batch of {small} is not ramped");
        }
        assert_eq!(ramped_records_max(usize::MAX, u64::MAX), usize::MAX);
    }
}
