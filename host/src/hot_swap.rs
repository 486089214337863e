//! Hot swap: the running plugin, the candidates queued for it, and the decision at each
//! batch boundary. `SwapController` owns the running plugin; the batch loop borrows it
//! for its calls and tells the controller when a batch committed (the end of a new
//! version's probation) or failed (a rollback). A candidate that must migrate stored
//! values is checked on a thread of its own (`swap.rs`) while the batches go on.
//!
//! A new version reaches the controllers through a [`SwapTarget`]: the watcher of
//! `--watch` and the admin endpoint offer it there, and know nothing else of what
//! runs. [`PipelineTarget`] is the one pipeline of a file or stdin input; a Kafka
//! run's target is `partitions::PartitionPlugins`, which offers it to every
//! partition's controller. Each controller then decides its own swap.

use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};

use crate::clock::Clock;
use crate::function::{StateFunction, label_of};
use crate::keyed::{StatePart, Variable, VariableKind, unpack_entry};
use crate::plugin::{PluginInfo, Runtime};
use crate::state_keys::{self as sk, Entry};
use crate::store::Store;
use crate::swap::{CheckPlan, SampledValue, SwapCheck};

/// A new plugin version, compiled, instantiated and initialised off the processing
/// path, waiting for the next batch boundary.
pub struct Candidate {
    /// The loaded plugin.
    pub plugin: Box<dyn StateFunction>,
    /// Where it came from (a path, "admin upload", ...), for the logs.
    pub origin: String,
}

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate").field("origin", &self.origin).finish_non_exhaustive()
    }
}

/// Stored values a candidate must migrate before it is accepted (when its state schema
/// differs); the rest are migrated lazily, on first touch.
const MIGRATION_SAMPLE_KEYS: usize = 64;

/// Keys looked at for that sample at most. The sample is taken on the processing path,
/// so a large store whose values are mostly of the candidate's schema is not scanned
/// whole; old values beyond it are found when first touched.
const MIGRATION_SCAN_KEYS_MAX: usize = 10_000;

/// Bytes of stored values in the sample at most (it is held until the check ends).
const MIGRATION_SAMPLE_BYTES_MAX: usize = 16 << 20;

/// Candidates queued at most; a full queue refuses new uploads until the pipeline has
/// taken one.
const CANDIDATES_MAX: usize = 4;

/// Hands new plugin versions to a running pipeline (from a watcher thread, the admin
/// endpoint or a test).
#[derive(Debug, Clone)]
pub struct SwapSender(mpsc::SyncSender<Candidate>);

impl SwapSender {
    /// Queues a candidate; it is validated against the state and swapped in at the next
    /// batch boundary. Fails when the queue is full or the pipeline is gone.
    pub fn send(&self, candidate: Candidate) -> Result<(), String> {
        self.0.try_send(candidate).map_err(|e| match e {
            mpsc::TrySendError::Full(_) => {
                "too many plugin versions waiting; try again after the next batch".to_owned()
            }
            mpsc::TrySendError::Disconnected(_) => "the pipeline has stopped".to_owned(),
        })
    }

    /// [`SwapSender::send`], telling a full queue from a stopped pipeline.
    pub(crate) fn try_send(&self, candidate: Candidate) -> Result<(), mpsc::TrySendError<Candidate>> {
        self.0.try_send(candidate)
    }
}

/// Why a new version was not offered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// The component cannot run (it does not load, compile, pass the import check or
    /// initialise); nothing was queued and the running version goes on.
    #[error("{0}")]
    Refused(String),
    /// A pipeline has too many versions waiting (or has stopped); retry after its next
    /// batch. For a Kafka run, the partitions not named in the message have it queued.
    #[error("{0}")]
    Busy(String),
}

/// A version that was queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offered {
    /// Its name, version and state schema.
    pub info: PluginInfo,
    /// For a Kafka run, the partitions it was queued at (a partition assigned later
    /// opens with it); none for a single pipeline.
    pub partitions: Option<Vec<i32>>,
}

/// What runs where, for `GET /plugin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetStatus {
    /// The one pipeline of a file or stdin input.
    Pipeline(PluginStatus),
    /// The partitions a Kafka run runs now, in partition order, and where the newest
    /// version came from (the one a partition assigned from now on opens with).
    Partitions {
        /// Where the newest version came from.
        newest: String,
        /// Each running partition's status.
        partitions: Vec<(i32, PluginStatus)>,
    },
}

/// Where new plugin versions go: what the watcher and the admin endpoint offer to.
pub trait SwapTarget: Send + Sync {
    /// Loads the component at `path` (compiled, instantiated and initialised here, off
    /// the processing path) and queues it for each pipeline of the target, which
    /// checks it against its state and swaps at a batch boundary of its own.
    /// `origin` names it in the logs and the status.
    fn offer(&self, path: &Path, origin: &str) -> Result<Offered, OfferError>;

    /// The running versions and the swaps so far.
    fn status(&self) -> TargetStatus;
}

/// The [`SwapTarget`] of one pipeline (a file or stdin input).
#[derive(Debug, Clone)]
pub struct PipelineTarget {
    runtime: Arc<Runtime>,
    params: Vec<(String, String)>,
    sender: SwapSender,
    status: Arc<Mutex<PluginStatus>>,
}

impl PipelineTarget {
    /// New versions compiled in `runtime` with `params`, queued through `sender`; the
    /// pipeline's status is `status`.
    pub fn new(
        runtime: Arc<Runtime>,
        params: Vec<(String, String)>,
        sender: SwapSender,
        status: Arc<Mutex<PluginStatus>>,
    ) -> Self {
        Self { runtime, params, sender, status }
    }
}

impl SwapTarget for PipelineTarget {
    fn offer(&self, path: &Path, origin: &str) -> Result<Offered, OfferError> {
        let plugin = self.runtime.load(path, &self.params).map_err(|e| OfferError::Refused(e.to_string()))?;
        let info = plugin.info().clone();
        self.sender
            .send(Candidate { plugin: Box::new(plugin), origin: origin.to_owned() })
            .map_err(OfferError::Busy)?;
        Ok(Offered { info, partitions: None })
    }

    fn status(&self) -> TargetStatus {
        TargetStatus::Pipeline(lock_status(&self.status).clone())
    }
}

/// A status's lock: a poisoned one only means a reader panicked; the status is whole.
pub(crate) fn lock_status(status: &Mutex<PluginStatus>) -> std::sync::MutexGuard<'_, PluginStatus> {
    status.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the pipeline runs now and what happened to the last candidate: shared with the
/// admin endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginStatus {
    /// The running plugin's name, version and schema.
    pub running: String,
    /// The batch from which it runs (0 for the first).
    pub since_batch: u64,
    /// The swaps so far: `(batch, from, to)`.
    pub swaps: Vec<(u64, String, String)>,
    /// The last refusal or rollback, if any.
    pub last_refusal: Option<String>,
    /// A candidate whose migration check is under way (off the processing path), if
    /// any; candidates queued meanwhile wait for its verdict.
    pub checking: Option<String>,
}

/// The running plugin and what may replace it.
pub(crate) struct SwapController {
    plugin: Box<dyn StateFunction>,
    label: String,
    queue: mpsc::Receiver<Candidate>,
    sender: mpsc::SyncSender<Candidate>,
    /// The plugin replaced by the last swap, kept until the new one has committed a
    /// batch: a new version that fails its first batch under `fail` is rolled back.
    probation: Option<(Box<dyn StateFunction>, String)>,
    /// The migration check of the next candidate, under way on its own thread.
    check: Option<SwapCheck<Candidate>>,
    status: Arc<Mutex<PluginStatus>>,
}

impl SwapController {
    /// A controller running `plugin` from batch `since_batch`.
    pub fn new(plugin: Box<dyn StateFunction>, since_batch: u64) -> Self {
        let label = label_of(plugin.info());
        let (sender, queue) = mpsc::sync_channel(CANDIDATES_MAX);
        let status = PluginStatus { running: label.clone(), since_batch, ..PluginStatus::default() };
        Self { plugin, label, queue, sender, probation: None, check: None, status: Arc::new(Mutex::new(status)) }
    }

    /// The running plugin, for a call.
    pub fn plugin(&mut self) -> &mut dyn StateFunction {
        self.plugin.as_mut()
    }

    /// The running plugin's name, version and schema.
    pub fn info(&self) -> &PluginInfo {
        self.plugin.info()
    }

    /// The world the running plugin targets (see `StateFunction::state_api`).
    pub fn state_api(&self) -> u32 {
        self.plugin.state_api()
    }

    /// The running plugin's label (name, version and schema).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Where to send new versions.
    pub fn sender(&self) -> SwapSender {
        SwapSender(self.sender.clone())
    }

    /// The status shared with the admin endpoint.
    pub fn status(&self) -> Arc<Mutex<PluginStatus>> {
        self.status.clone()
    }

    /// The swaps so far, rollbacks included (as `GET /plugin` lists them).
    pub fn swaps(&self) -> u64 {
        lock_status(&self.status).swaps.len() as u64
    }

    /// Whether the running plugin was swapped in and has not committed a batch yet.
    pub fn on_probation(&self) -> bool {
        self.probation.is_some()
    }

    /// The running plugin committed a batch: no rollback from here on.
    pub fn committed(&mut self) {
        self.probation = None;
    }

    fn update_status(&self, f: impl FnOnce(&mut PluginStatus)) {
        f(&mut lock_status(&self.status));
    }

    /// At the boundary before batch `batch_id`: swaps in the candidate whose check has
    /// passed (or records its refusal), then, if no check is under way, takes the
    /// newest queued candidate. One that must migrate stored values is checked on a
    /// thread of its own within `budget_ms` while the batches go on with the running
    /// plugin, and swapped in at the first boundary after its check passed; one that
    /// has nothing to migrate is swapped in at once.
    pub fn at_boundary(&mut self, batch_id: u64, store: &Store, budget_ms: u64, clock: Arc<dyn Clock>) {
        if self.check.as_ref().is_some_and(SwapCheck::is_finished)
            && let Some(check) = self.check.take()
        {
            self.finish_check(batch_id, check);
        }
        if self.check.is_some() {
            return;
        }
        let Some(mut candidate) = self.queue.try_iter().last() else {
            return;
        };
        let label = label_of(candidate.plugin.info());
        // The version that runs, offered again (a retry after `OfferError::Busy` queues
        // it again where it was still under its check): nothing to swap.
        if let (Some(offered), Some(running)) = (candidate.plugin.build(), self.plugin.build())
            && offered == running
        {
            tracing::info!(
                "plugin {label} from {}: runs already (the same component and parameters)",
                candidate.origin
            );
            return;
        }
        let sample = match candidate.plugin.keyed() {
            Some((_, variables)) => keyed_migration_sample(store, &variables),
            None => migration_sample(store, candidate.plugin.info().state_schema_version),
        };
        let sample = match sample {
            Ok(sample) if sample.is_empty() => return self.swap_in(batch_id, candidate, label),
            Ok(sample) => sample,
            Err(why) => return self.refuse(&label, &candidate.origin, &why),
        };
        let plan = CheckPlan { sample, budget_ms, clock };
        let origin = candidate.origin.clone();
        let migrate = |c: &mut Candidate, s: &SampledValue| {
            match &s.entry {
                None => c.plugin.migrate(s.schema_version, &s.value),
                Some((variable, part)) => c.plugin.migrate_entry(variable, *part, s.schema_version, &s.value),
            }
            .map_err(|e| e.to_string())
        };
        match SwapCheck::start(candidate, migrate, plan, label.clone(), origin.clone()) {
            Ok(check) => {
                tracing::info!("plugin {label} from {origin}: checking its state migration");
                self.update_status(|s| s.checking = Some(label));
                self.check = Some(check);
            }
            Err(e) => self.refuse(&label, &origin, &format!("cannot start the migration check ({e})")),
        }
    }

    /// Acts on the verdict of a finished migration check.
    fn finish_check(&mut self, batch_id: u64, check: SwapCheck<Candidate>) {
        let (label, origin) = (check.label.clone(), check.origin.clone());
        match check.finish() {
            (Some(candidate), Ok(())) => self.swap_in(batch_id, candidate, label),
            (_, Err(why)) => self.refuse(&label, &origin, &why),
            (None, Ok(())) => self.refuse(&label, &origin, "the migration check lost the candidate"),
        }
    }

    /// Makes `candidate` the running plugin from batch `batch_id` on; the replaced one
    /// is kept on probation until the new one commits a batch.
    fn swap_in(&mut self, batch_id: u64, candidate: Candidate, label: String) {
        tracing::info!(
            batch = batch_id,
            "plugin swapped at batch {batch_id}: {} -> {label} (from {})",
            self.label,
            candidate.origin
        );
        let previous = std::mem::replace(&mut self.plugin, candidate.plugin);
        let previous_label = std::mem::replace(&mut self.label, label.clone());
        self.update_status(|s| {
            s.swaps.push((batch_id, previous_label.clone(), label.clone()));
            s.running = label;
            s.since_batch = batch_id;
            s.checking = None;
        });
        self.probation = Some((previous, previous_label));
    }

    /// Records that the candidate `label` from `origin` was refused.
    fn refuse(&mut self, label: &str, origin: &str, why: &str) {
        let message = format!("plugin {label} from {origin}: refused: {why}; {} keeps running", self.label);
        tracing::warn!("{message}");
        self.update_status(|s| {
            s.last_refusal = Some(message);
            s.checking = None;
        });
    }

    /// Puts back the plugin that ran before the last swap, after the new one (`failed`)
    /// failed its first batch, `batch_id`, which (still planned, not committed) runs
    /// again with it.
    pub fn roll_back(&mut self, batch_id: u64, cause: &str, failed: &str) {
        let Some((previous, previous_label)) = self.probation.take() else {
            return;
        };
        let message = format!("plugin {failed} failed its first batch ({cause}): rolled back to {previous_label}");
        tracing::warn!(batch = batch_id, "{message}; the batch runs again with it");
        self.plugin = previous;
        self.label = previous_label.clone();
        self.update_status(|s| {
            s.swaps.push((batch_id, failed.to_owned(), previous_label.clone()));
            s.running = previous_label;
            s.since_batch = batch_id;
            s.last_refusal = Some(message);
        });
    }
}

/// Stored values written under another schema than `schema`, for a candidate to
/// migrate: up to [`MIGRATION_SAMPLE_KEYS`] values and [`MIGRATION_SAMPLE_BYTES_MAX`]
/// bytes, from the first [`MIGRATION_SCAN_KEYS_MAX`] keys. Reading them is cheap;
/// migrating them is left to the check's thread.
fn migration_sample(store: &Store, schema: u32) -> Result<Vec<SampledValue>, String> {
    let mut sample = Vec::new();
    let mut bytes = 0;
    for entry in store.iter_keys().take(MIGRATION_SCAN_KEYS_MAX) {
        let (key, record) = entry.map_err(|e| format!("cannot read the stored state to check it: {e}"))?;
        let Some(value) = record.value.filter(|_| record.schema_version != schema) else {
            continue;
        };
        bytes += value.len();
        sample.push(SampledValue { key, schema_version: record.schema_version, value, entry: None });
        if sample.len() == MIGRATION_SAMPLE_KEYS || bytes >= MIGRATION_SAMPLE_BYTES_MAX {
            break;
        }
    }
    Ok(sample)
}

/// The 0.2 form of [`migration_sample`]: stored values, list elements and map values
/// of the candidate's `variables` written under another schema version than the
/// variable now declares, with the same bounds. Entries of variables it no longer
/// declares are left out: no call can read them.
fn keyed_migration_sample(store: &Store, variables: &[Variable]) -> Result<Vec<SampledValue>, String> {
    let mut sample = Vec::new();
    let mut bytes = 0;
    for entry in store.iter_keys().take(MIGRATION_SCAN_KEYS_MAX) {
        let (store_key, record) = entry.map_err(|e| format!("cannot read the stored state to check it: {e}"))?;
        let Some((key, (name, kind, part))) = sk::parse(&store_key).and_then(|(key, e)| Some((key, data_entry(e)?)))
        else {
            continue;
        };
        let declared = variables.iter().find(|v| v.name == name && v.kind == kind);
        let (Some(declared), Some(stored)) = (declared, record.value) else {
            continue;
        };
        if declared.schema_version == record.schema_version {
            continue;
        }
        let value = unpack_entry(&store_key, &stored).map_err(|e| e.to_string())?.1.to_vec();
        bytes += value.len();
        let entry = Some((name, part));
        sample.push(SampledValue { key, schema_version: record.schema_version, value, entry });
        if sample.len() == MIGRATION_SAMPLE_KEYS || bytes >= MIGRATION_SAMPLE_BYTES_MAX {
            break;
        }
    }
    Ok(sample)
}

/// The variable, its kind and the part a store entry holds, for the entries that hold
/// a plugin's bytes (not a list's length or a timer).
fn data_entry(entry: Entry) -> Option<(String, VariableKind, StatePart)> {
    match entry {
        Entry::Value(name) => Some((name, VariableKind::Value, StatePart::Value)),
        Entry::ListElement(name, _) => Some((name, VariableKind::List, StatePart::ListElement)),
        Entry::MapEntry(name, _) => Some((name, VariableKind::Map, StatePart::MapValue)),
        Entry::ListNext(_) | Entry::Timer(..) => None,
    }
}
