//! The partitions one process owns, for a Kafka input: one `Pipeline` (the batch
//! executor) per partition the consumer group assigns, each on a worker thread of its
//! own with its own state dir, checkpoint, watermark and output files; started when
//! the group assigns the partition, stopped at a batch boundary when it is revoked.
//! Starting a partition fences its earlier owners (its transactional producer), then
//! restores its store from the changelog if the store is missing or behind the
//! group's commit (`restore.rs`); each batch is then one Kafka transaction (outputs,
//! changelog, offset) followed by the local commit.
//!
//! A partition is the unit because a key lives in exactly one (its Kafka key picks
//! it), so partitions share nothing: no state, no order, no watermark. The watermark
//! is per partition, like Kafka Streams' per-task stream time: a partition that runs
//! behind does not make another's records late, and one that runs ahead does not hold
//! another's timeouts back.
//!
//! The plugin versions are `PartitionPlugins`' (`plugins.rs`): a partition opens with
//! the newest accepted version and joins it, so that hot load reaches every partition.

mod plugins;

pub use plugins::{Membership, PartitionPlugins};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Duration;

use crate::clock::Clock;
use crate::config::{ConfigError, KafkaInput, PipelineConfig, Stream};
use crate::kafka::{Assignment, ChangelogReader, GroupMember, KafkaError, PartitionTransactions};
use crate::pipeline::{self, BatchReport, Pipeline};
use crate::store::Checkpoint;

/// How often the group member is served (heartbeats, rebalances, commits): 100 ms.
const MEMBER_POLL_MS: u64 = 100;

/// How long an idle run waits for a rebalance under way to settle before it stops
/// anyway (30 s; a dead member's partitions come a few seconds after its session
/// timeout). A broker whose rebalance never completes (tansu, after the members
/// that led it left) must not keep a run that is done from ending.
const REBALANCE_SETTLE_MS_MAX: u64 = 30_000;

/// How a process runs its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Partitions that run a batch at once, at most (default: no limit, the
    /// operating system shares the cores among the partitions' threads). A slot is
    /// held for one `next_batch`, waiting for records included (up to the trigger
    /// interval), so a small limit lets partitions at their end hold back busy ones.
    pub workers_max: usize,
    /// Stop once every assigned partition has read no record for this long and its
    /// last read found the partition's end, or the process has held no partition for
    /// this long, and the group has no rebalance under way (waited for up to 30 s)
    /// (default: run until stopped).
    pub until_idle_ms: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Self { workers_max: usize::MAX, until_idle_ms: None }
    }
}

/// Running a Kafka input failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The settings do not fit a Kafka input.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The broker or the group failed (boxed: rdkafka's error is large).
    #[error(transparent)]
    Kafka(Box<KafkaError>),
    /// A partition's pipeline failed (the others were stopped at a batch boundary).
    #[error("partition {partition}: {error}")]
    Partition {
        /// The partition.
        partition: i32,
        /// Its pipeline's error.
        error: pipeline::Error,
    },
    /// Restoring a partition's store from the changelog failed.
    #[error("partition {partition}: {error}")]
    Restore {
        /// The partition.
        partition: i32,
        /// What failed.
        error: crate::restore::Error,
    },
    /// A partition's thread could not start or panicked.
    #[error("partition {partition}: {what}; run again to resume from the last committed batch")]
    Thread {
        /// The partition.
        partition: i32,
        /// What happened.
        what: String,
    },
}

impl From<KafkaError> for Error {
    fn from(e: KafkaError) -> Self {
        Self::Kafka(Box::new(e))
    }
}

/// What a run did: each partition it ran, with its checkpoint when it stopped.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// (partition, checkpoint), in partition order.
    pub partitions: Vec<(i32, Checkpoint)>,
    /// Batches committed by this run, over all partitions.
    pub batches: u64,
}

/// What a run tells its caller of its partitions (for the log and the metrics),
/// called on the partition's thread.
pub trait Observer: Send + Sync {
    /// Restoring `partition` from the changelog has read `records` records so far;
    /// `done` once it has finished.
    fn restoring(&self, partition: i32, records: u64, done: bool) {
        let _ = (partition, records, done);
    }

    /// `partition`'s pipeline has opened (after any restore), before its first batch.
    fn opened(&self, partition: i32, pipeline: &Pipeline) {
        let _ = (partition, pipeline);
    }

    /// `partition` committed a batch.
    fn batch(&self, partition: i32, report: &BatchReport);
}

/// `path` with `.p<partition>` appended: a partition's own output file, so that each
/// partition's exactly-once bookkeeping (committed lengths) stays its own.
pub fn partition_path(path: &Path, partition: i32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".p{partition}"));
    PathBuf::from(name)
}

/// The pipeline of one partition: state in `<state-dir>/partition-<N>`, outputs in
/// `<output>.p<N>` (and `--late`, `--dead-letter` likewise when named; by default they
/// are in the partition's state dir).
pub fn partition_config(config: &PipelineConfig, input: &KafkaInput, partition: i32) -> PipelineConfig {
    let mut c = config.clone();
    c.input = Stream::Kafka(KafkaInput { partition: Some(partition), ..input.clone() });
    c.state_dir = config.state_dir.join(format!("partition-{partition}"));
    if let Stream::File(path) = &config.output {
        c.output = Stream::File(partition_path(path, partition));
    }
    for side in [&mut c.late, &mut c.dead_letter] {
        if let Some(Stream::File(path)) = side {
            *path = partition_path(path, partition);
        }
    }
    c
}

/// At most `n` holders at once.
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn acquire(&self) -> SlotGuard<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        SlotGuard(self)
    }
}

struct SlotGuard<'a>(&'a Slots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

/// What a partition's thread tells the process: it ended, stopped (with its
/// checkpoint and the batches it committed) or failed.
struct Ended {
    partition: i32,
    result: Result<(Checkpoint, u64), Error>,
}

/// What every partition's thread shares.
struct Shared {
    config: PipelineConfig,
    input: KafkaInput,
    clock: Arc<dyn Clock>,
    plugins: Arc<PartitionPlugins>,
    slots: Slots,
    until_idle_ms: Option<u64>,
    observer: Arc<dyn Observer>,
    events: Mutex<mpsc::Sender<Ended>>,
}

impl Shared {
    fn send(&self, event: Ended) {
        // The receiver lives until every thread is joined.
        let _ = self.events.lock().unwrap_or_else(|e| e.into_inner()).send(event);
    }
}

/// A partition's thread.
struct Worker {
    stop: Arc<AtomicBool>,
    idle: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    fn start(shared: &Arc<Shared>, partition: i32) -> Result<Self, Error> {
        let (stop, idle) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (s, st, id) = (shared.clone(), stop.clone(), idle.clone());
        let thread = std::thread::Builder::new()
            .name(format!("groupstate-p{partition}"))
            .spawn(move || {
                let span = tracing::info_span!("partition", partition);
                let _in_partition = span.enter();
                let result = run_partition(&s, partition, &st, &id);
                s.send(Ended { partition, result });
            })
            .map_err(|e| Error::Thread { partition, what: format!("cannot start its thread: {e}") })?;
        tracing::info!("partition {partition}: assigned, started");
        Ok(Self { stop, idle, thread: Some(thread) })
    }

    /// Asks the partition to stop at its next batch boundary.
    fn ask_to_stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Stops the partition at its next batch boundary and waits for it.
    fn stop(mut self, partition: i32) -> Result<(), Error> {
        self.ask_to_stop();
        match self.thread.take().map(|t| t.join()) {
            Some(Err(_)) => Err(Error::Thread { partition, what: "its thread panicked".into() }),
            _ => Ok(()),
        }
    }
}

/// One partition's batch loop, until `stop`; the checkpoint and batch count at the end.
fn run_partition(
    shared: &Shared,
    partition: i32,
    stop: &AtomicBool,
    idle: &AtomicBool,
) -> Result<(Checkpoint, u64), Error> {
    let config = partition_config(&shared.config, &shared.input, partition);
    let failed = |error| Error::Partition { partition, error };
    let input = &KafkaInput { partition: Some(partition), ..shared.input.clone() };
    // Fences the partition's earlier owners before anything is read.
    let transactions = PartitionTransactions::open(input)?;
    let clock = shared.clock.clone();
    let progress = &mut |records, done| shared.observer.restoring(partition, records, done);
    restore_if_behind(&config, input, &transactions, clock.clone(), progress)
        .map_err(|error| Error::Restore { partition, error })?;
    // Every new version reaches this partition until `_membership` is dropped, when
    // the partition stops.
    let (mut pipeline, _membership) = shared.plugins.open_pipeline(partition, config, clock.clone()).map_err(failed)?;
    shared.observer.opened(partition, &pipeline);
    pipeline.set_export(Box::new(transactions));
    let mut last_record_ns = clock.monotonic_ns();
    let mut batches = 0;
    while !stop.load(Ordering::Acquire) {
        let report = {
            let _slot = shared.slots.acquire();
            pipeline.next_batch().map_err(failed)?
        };
        let now = clock.monotonic_ns();
        if let Some(report) = report {
            batches += 1;
            if report.records > 0 {
                last_record_ns = now;
            }
            shared.observer.batch(partition, &report);
        }
        if let Some(ms) = shared.until_idle_ms {
            let quiet = now.saturating_sub(last_record_ns) >= ms.saturating_mul(1_000_000);
            idle.store(quiet && pipeline.input_at_end(), Ordering::Release);
        }
    }
    pipeline.flush().map_err(failed)?;
    Ok((pipeline.checkpoint().clone(), batches))
}

/// The sled cache of each partition's store: the process's `store_cache_bytes` split
/// evenly over the partitions it may run at once (the topic's, or fewer with
/// `--partition-workers`), so that the caches together stay within it whatever the
/// group assigns; at least the least the limit allows each.
fn partition_cache_bytes(total: u64, at_once: usize) -> u64 {
    (total / u64::try_from(at_once.max(1)).unwrap_or(u64::MAX)).max(crate::config::STORE_CACHE_BYTES_MIN)
}

/// Restores the partition's store from the changelog when it is missing or behind
/// what the group has committed.
fn restore_if_behind(
    config: &PipelineConfig,
    input: &KafkaInput,
    transactions: &PartitionTransactions,
    clock: Arc<dyn Clock>,
    progress: &mut dyn FnMut(u64, bool),
) -> Result<(), crate::restore::Error> {
    let committed = transactions.committed();
    let group = crate::restore::GroupCommit { offset: committed.offset, next_batch_id: committed.next_batch_id };
    let limits = &config.limits;
    let dir = config.state_dir.join("store");
    let open =
        || crate::store::Store::open(&dir, limits.store_cache_bytes, limits.store_buffer_bytes, limits.store_log_bytes);
    // The changelog holds every committed change, and the local store is never ahead
    // of the group's commit: a damaged store (sled is not crash-safe in every case)
    // is set aside and the partition restored, as Kafka Streams does with a corrupted
    // task.
    let mut store = match open() {
        Err(e) if e.is_damage() => {
            let aside = match set_aside(&dir, clock.now_ms()) {
                Ok(aside) => aside,
                Err(cause) => return Err(crate::restore::Error::SetAside { path: dir.clone(), damage: e, cause }),
            };
            tracing::warn!(
                "{e}: the partition's store is damaged; moved it to {} and restoring the partition from the changelog",
                aside.display()
            );
            open()?
        }
        other => other?,
    };
    let (local, pending) = (store.checkpoint()?, store.pending_plan()?);
    if !crate::restore::is_behind(local.as_ref(), pending.as_ref(), group) {
        return Ok(());
    }
    tracing::info!(
        "the store is {} the group's commit (input offset {}): restoring from the changelog",
        if local.is_some() { "behind" } else { "missing; restoring up to" },
        committed.offset
    );
    let mut reader =
        ChangelogReader::open(input, clock.clone()).map_err(|e| crate::restore::Error::Read(Box::new(e)))?;
    let mut next = || reader.next_record().map_err(|e| Box::new(e) as crate::restore::ReadError);
    let len = |path: Option<&Path>| path.and_then(|p| std::fs::metadata(p).ok()).map_or(0, |m| m.len());
    let output = match &config.output {
        Stream::File(path) => Some(path.as_path()),
        _ => None,
    };
    let late = pipeline::side_path(config, &config.late, "late.jsonl");
    let dead = pipeline::side_path(config, &config.dead_letter, "dead-letter.jsonl");
    let file_lengths = [len(output), len(late.as_deref()), len(dead.as_deref())];
    progress(0, false);
    let restored = crate::restore::catch_up(&mut store, group, file_lengths, clock.as_ref(), &mut next, &mut |r| {
        progress(r, false)
    })?;
    progress(restored.records, true);
    Ok(())
}

/// Renames a damaged store dir to `<dir>.damaged-<unix ms>` beside it (kept for a
/// post-mortem) and returns the new path.
fn set_aside(dir: &Path, now_ms: i64) -> std::io::Result<PathBuf> {
    let mut name = dir.file_name().unwrap_or_default().to_owned();
    name.push(format!(".damaged-{now_ms}"));
    let aside = dir.with_file_name(name);
    std::fs::rename(dir, &aside)?;
    Ok(aside)
}

type Workers = Arc<Mutex<BTreeMap<i32, Worker>>>;

/// Starts and stops partitions as the group assigns and revokes them.
/// Once `stopping` is set (the run is ending), partitions assigned are not started:
/// the member's close can still deliver an assignment, and starting a partition
/// there would fence its producer and restore its store only to stop it again,
/// and would leave a worker that nothing joins.
fn on_assignment(
    shared: Arc<Shared>,
    workers: Workers,
    failures: Arc<Mutex<Vec<Error>>>,
    stopping: Arc<AtomicBool>,
) -> crate::kafka::OnAssignment {
    Box::new(move |change| {
        let mut failed = Vec::new();
        match change {
            Assignment::Assigned(partitions) if stopping.load(Ordering::Acquire) => {
                tracing::info!("partitions {partitions:?}: assigned while this process stops: not started");
            }
            Assignment::Assigned(partitions) => {
                let mut workers = workers.lock().unwrap_or_else(|e| e.into_inner());
                for p in partitions {
                    if workers.contains_key(&p) {
                        continue;
                    }
                    match Worker::start(&shared, p) {
                        Ok(w) => {
                            workers.insert(p, w);
                        }
                        Err(e) => failed.push(e),
                    }
                }
            }
            Assignment::Revoked(partitions) => {
                let stopping: Vec<(i32, Worker)> = {
                    let mut workers = workers.lock().unwrap_or_else(|e| e.into_inner());
                    partitions.iter().filter_map(|p| Some((*p, workers.remove(p)?))).collect()
                };
                // All at once: each finishes its batch and closes its producer.
                for (p, w) in &stopping {
                    tracing::info!("partition {p}: revoked, stopping at a batch boundary");
                    w.ask_to_stop();
                }
                for (p, w) in stopping {
                    if let Err(e) = w.stop(p) {
                        failed.push(e);
                    }
                }
            }
        }
        failures.lock().unwrap_or_else(|e| e.into_inner()).extend(failed);
    })
}

/// Runs a Kafka input (`config.input` is `Stream::Kafka` for the whole topic) until
/// `options.until_idle_ms` says it is done, or a partition fails; each partition
/// stops at a batch boundary, and its group offset is committed. The partitions open
/// with `plugins`' newest version (made from the same `config`), and every version
/// offered to it reaches each running partition.
pub fn run(
    config: PipelineConfig,
    clock: Arc<dyn Clock>,
    options: Options,
    observer: Arc<dyn Observer>,
    plugins: Arc<PartitionPlugins>,
) -> Result<Summary, Error> {
    config.validate()?;
    let Stream::Kafka(input) = config.input.clone() else {
        return Err(ConfigError("partitions::run needs a kafka:// input".into()).into());
    };
    if matches!(config.output, Stream::Std) {
        return Err(ConfigError(
            "a kafka input writes one output file per partition (<output>.p<N>) or a Kafka topic: give --output a file path or kafka://HOST:PORT/TOPIC, not -"
                .into(),
        )
        .into());
    }
    if options.workers_max == 0 {
        return Err(ConfigError("--partition-workers must be at least 1".into()).into());
    }
    let outputs: Vec<&KafkaInput> = [Some(&config.output), config.late.as_ref(), config.dead_letter.as_ref()]
        .into_iter()
        .filter_map(|s| match s {
            Some(Stream::Kafka(topic)) => Some(topic),
            _ => None,
        })
        .collect();
    let partitions = crate::kafka::prepare_topics(&input, &outputs)?;
    let mut config = config;
    config.limits.store_cache_bytes =
        partition_cache_bytes(config.limits.store_cache_bytes, partitions.min(options.workers_max));
    let (events, events_rx) = mpsc::channel();
    let shared = Arc::new(Shared {
        slots: Slots { free: Mutex::new(options.workers_max), freed: Condvar::new() },
        until_idle_ms: options.until_idle_ms,
        config,
        input: input.clone(),
        clock,
        plugins,
        observer,
        events: Mutex::new(events),
    });
    let workers: Workers = Arc::default();
    let failures: Arc<Mutex<Vec<Error>>> = Arc::default();
    let stopping = Arc::new(AtomicBool::new(false));
    let assign = on_assignment(shared.clone(), workers.clone(), failures.clone(), stopping.clone());
    let member = GroupMember::join(&input, assign)?;
    let mut summary = Summary::default();
    let mut first_failure: Option<Error> = None;
    // When an idle run first found a rebalance under way.
    let mut unsettled_since_ns: Option<u64> = None;
    // Since when the process has held no partition.
    let mut unassigned_since_ns: Option<u64> = None;
    loop {
        if let Err(e) = member.poll(Duration::from_millis(MEMBER_POLL_MS)) {
            first_failure.get_or_insert(e.into());
        }
        for event in events_rx.try_iter() {
            handle_event(event, &mut first_failure, &mut summary);
        }
        if let Some(e) = failures.lock().unwrap_or_else(|e| e.into_inner()).drain(..).next() {
            first_failure.get_or_insert(e);
        }
        if first_failure.is_some() {
            break;
        }
        let Some(idle_ms) = options.until_idle_ms else { continue };
        let now = shared.clock.monotonic_ns();
        // Idle: every partition is idle at its end, or the process has held none for
        // `idle_ms` (more members than partitions, or its partitions went elsewhere).
        let all_idle = {
            let workers = workers.lock().unwrap_or_else(|e| e.into_inner());
            if workers.is_empty() {
                let since = *unassigned_since_ns.get_or_insert(now);
                now.saturating_sub(since) >= idle_ms.saturating_mul(1_000_000)
            } else {
                unassigned_since_ns = None;
                workers.values().all(|w| w.idle.load(Ordering::Acquire))
            }
        };
        if !all_idle {
            unsettled_since_ns = None;
            continue;
        }
        // A rebalance under way (a member died or left) may give this process more
        // partitions: idle means idle once the group has settled, or once it has
        // not for REBALANCE_SETTLE_MS_MAX.
        let unsettled_ms = match (member.settled(), unsettled_since_ns) {
            (true, _) => None,
            (false, None) => {
                unsettled_since_ns = Some(now);
                Some(0)
            }
            (false, Some(since)) => Some(now.saturating_sub(since) / 1_000_000),
        };
        let idle = match unassigned_since_ns {
            Some(_) => format!("the process has held no partition for {idle_ms} ms"),
            None => format!("every partition has been idle at its end for {idle_ms} ms"),
        };
        match unsettled_ms {
            None => {
                tracing::info!("{idle}: stopping");
                break;
            }
            Some(ms) if ms >= REBALANCE_SETTLE_MS_MAX => {
                tracing::warn!(
                    "{idle}, and the group's rebalance has not settled in {ms} ms: stopping anyway; check the broker's group coordinator if partitions stay unassigned"
                );
                break;
            }
            Some(_) => {}
        }
    }
    stopping.store(true, Ordering::Release);
    let running = std::mem::take(&mut *workers.lock().unwrap_or_else(|e| e.into_inner()));
    for w in running.values() {
        w.ask_to_stop();
    }
    for (p, w) in running {
        if let Err(e) = w.stop(p) {
            first_failure.get_or_insert(e);
        }
    }
    for event in events_rx.try_iter() {
        handle_event(event, &mut first_failure, &mut summary);
    }
    drop(member);
    summary.partitions.sort_by_key(|(p, _)| *p);
    match first_failure {
        Some(e) => Err(e),
        None => Ok(summary),
    }
}

/// Records how a partition's thread ended.
fn handle_event(event: Ended, failure: &mut Option<Error>, summary: &mut Summary) {
    match event.result {
        Ok((checkpoint, batches)) => {
            summary.batches += batches;
            summary.partitions.push((event.partition, checkpoint));
        }
        Err(e) => {
            failure.get_or_insert(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_budget_is_split_over_the_partitions_run_at_once() {
        assert_eq!(partition_cache_bytes(192 << 20, 1), 192 << 20);
        assert_eq!(partition_cache_bytes(192 << 20, 8), 24 << 20);
        // Never below the least the limit allows, nor divided by zero.
        assert_eq!(partition_cache_bytes(192 << 20, 1000), 1 << 20);
        assert_eq!(partition_cache_bytes(4 << 20, 0), 4 << 20);
        assert_eq!(partition_cache_bytes(192 << 20, usize::MAX), 1 << 20);
    }
}
