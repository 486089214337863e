//! `PartitionPlugins`: the plugin versions of a Kafka run, the `SwapTarget` of its
//! partitions. It owns the newest accepted version (its bytes, read once, so a file
//! replaced meanwhile cannot give two partitions different versions) and the swap
//! sender and status of every partition that runs now. A new version is offered to
//! each running partition's `SwapController`, which checks it against that partition's
//! state and swaps at a batch boundary of its own; a partition that opens later opens
//! with the newest version. The swap decisions stay in `hot_swap.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};

use crate::clock::Clock;
use crate::config::PipelineConfig;
use crate::function::label_of;
use crate::hot_swap::{
    Candidate, OfferError, Offered, PluginStatus, SwapSender, SwapTarget, TargetStatus, lock_status,
};
use crate::pipeline::Pipeline;
use crate::plugin::{Plugin, PluginError, Runtime};

/// A version the run has accepted.
struct Version {
    /// Where it was read from (it names the plugin in errors).
    path: PathBuf,
    /// Where it came from, for the logs and the status.
    origin: String,
    bytes: Arc<[u8]>,
    sha256: String,
    /// Counts the versions: 0 for the one the run started with.
    generation: u64,
}

/// A partition that runs now.
struct Member {
    /// Tells this membership from a later one of the same partition.
    id: u64,
    sender: SwapSender,
    status: Arc<Mutex<PluginStatus>>,
    /// The version it opened with or was last offered.
    offered_sha256: String,
}

struct State {
    newest: Version,
    running: BTreeMap<i32, Member>,
    next_member_id: u64,
}

/// The plugin versions of a Kafka run's partitions.
pub struct PartitionPlugins {
    runtime: Arc<Runtime>,
    params: Vec<(String, String)>,
    /// Held for a whole offer and while a partition joins: a partition that opened
    /// with an older version than the newest is caught up as it joins, and no offer
    /// is half-way meanwhile, so no partition misses a version.
    offering: Mutex<()>,
    state: Mutex<State>,
}

impl std::fmt::Debug for PartitionPlugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionPlugins").finish_non_exhaustive()
    }
}

/// A partition's place among the running ones: it is offered every new version until
/// this is dropped.
pub struct Membership {
    plugins: Arc<PartitionPlugins>,
    partition: i32,
    id: u64,
}

impl Drop for Membership {
    fn drop(&mut self) {
        let mut state = self.plugins.state();
        if state.running.get(&self.partition).is_some_and(|m| m.id == self.id) {
            state.running.remove(&self.partition);
        }
    }
}

/// The version a partition opened with.
struct OpenedWith {
    generation: u64,
    sha256: String,
}

impl PartitionPlugins {
    /// The engine for `config`'s limits and compile cache, and `config.plugin` (read
    /// now) as the version the partitions start with.
    pub fn new(config: &PipelineConfig) -> Result<Self, PluginError> {
        let runtime = Arc::new(Runtime::new(&config.limits, config.cache_dir.as_deref())?);
        let path = config.plugin.clone();
        let bytes: Arc<[u8]> =
            std::fs::read(&path).map_err(|error| PluginError::Read { path: path.clone(), error })?.into();
        let sha256 = crate::plugin::sha256_hex(&bytes);
        let origin = path.display().to_string();
        let newest = Version { path, origin, bytes, sha256, generation: 0 };
        let state = State { newest, running: BTreeMap::new(), next_member_id: 0 };
        Ok(Self { runtime, params: config.params.clone(), offering: Mutex::new(()), state: Mutex::new(state) })
    }

    /// The engine every partition's plugin is loaded in.
    pub fn runtime(&self) -> Arc<Runtime> {
        self.runtime.clone()
    }

    /// The SHA-256 of the newest version (the watcher's starting point).
    pub fn newest_sha256(&self) -> String {
        self.state().newest.sha256.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while it was held left it whole: every change is one assignment.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens `partition`'s pipeline (`config` is the partition's, its state dir its
    /// own) with the newest version, and adds it to the running partitions, which are
    /// offered every new version until the returned [`Membership`] is dropped. A
    /// version accepted while it opened is queued for it at once.
    pub fn open_pipeline(
        self: &Arc<Self>,
        partition: i32,
        config: PipelineConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<(Pipeline, Membership), crate::pipeline::Error> {
        let (plugin, opened_with) = self.newest()?;
        let pipeline = Pipeline::open_with_plugin(self.runtime(), config, clock, plugin)?;
        let membership = self.join(partition, opened_with, &pipeline)?;
        Ok((pipeline, membership))
    }

    /// Loads the newest version for a partition that opens.
    fn newest(&self) -> Result<(Plugin, OpenedWith), PluginError> {
        let (path, bytes, generation, sha256) = {
            let state = self.state();
            let v = &state.newest;
            (v.path.clone(), v.bytes.clone(), v.generation, v.sha256.clone())
        };
        let plugin = self.runtime.load_bytes(&path, &bytes, &self.params)?;
        Ok((plugin, OpenedWith { generation, sha256 }))
    }

    /// Adds `partition`, whose `pipeline` opened with `opened`, to the running
    /// partitions: from now on it is offered every new version. A version accepted
    /// since it opened is queued for it at once.
    fn join(
        self: &Arc<Self>,
        partition: i32,
        opened: OpenedWith,
        pipeline: &Pipeline,
    ) -> Result<Membership, PluginError> {
        let _offering = self.offering.lock().unwrap_or_else(PoisonError::into_inner);
        let sender = pipeline.swap_sender();
        let (missed, id) = {
            let mut state = self.state();
            let v = &state.newest;
            let missed = (v.generation != opened.generation)
                .then(|| (v.path.clone(), v.bytes.clone(), v.origin.clone(), v.sha256.clone()));
            let id = state.next_member_id;
            state.next_member_id += 1;
            (missed, id)
        };
        let mut offered_sha256 = opened.sha256;
        if let Some((path, bytes, origin, sha256)) = missed {
            let plugin = self.runtime.load_bytes(&path, &bytes, &self.params)?;
            offered_sha256 = sha256;
            // A new pipeline's queue is empty; a stopped one has nothing to swap.
            let _ = sender.try_send(Candidate { plugin: Box::new(plugin), origin });
        }
        let member = Member { id, sender, status: pipeline.plugin_status(), offered_sha256 };
        self.state().running.insert(partition, member);
        Ok(Membership { plugins: self.clone(), partition, id })
    }
}

impl SwapTarget for PartitionPlugins {
    /// Loads the version once per running partition (all of them before any is
    /// queued: one that does not load is refused everywhere) and queues it at each,
    /// except at a partition that runs it already; it becomes the version partitions
    /// assigned from now on open with. A partition whose queue is full is named in
    /// `OfferError::Busy`; the others have it queued.
    fn offer(&self, path: &Path, origin: &str) -> Result<Offered, OfferError> {
        let _offering = self.offering.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes: Arc<[u8]> = std::fs::read(path)
            .map_err(|e| OfferError::Refused(format!("cannot read {}: {e}; check the path", path.display())))?
            .into();
        let sha256 = crate::plugin::sha256_hex(&bytes);
        let load =
            || self.runtime.load_bytes(path, &bytes, &self.params).map_err(|e| OfferError::Refused(e.to_string()));
        let first = load()?;
        let info = first.info().clone();
        let label = label_of(&info);
        let members: Vec<(i32, SwapSender)> = self
            .state()
            .running
            .iter()
            .filter(|(_, m)| m.offered_sha256 != sha256 || lock_status(&m.status).running != label)
            .map(|(p, m)| (*p, m.sender.clone()))
            .collect();
        let mut plugins = vec![first];
        while plugins.len() < members.len() {
            plugins.push(load()?);
        }
        let (mut queued, mut busy) = (Vec::new(), Vec::new());
        for ((partition, sender), plugin) in members.into_iter().zip(plugins) {
            match sender.try_send(Candidate { plugin: Box::new(plugin), origin: origin.to_owned() }) {
                Ok(()) => queued.push(partition),
                Err(mpsc::TrySendError::Full(_)) => busy.push(partition),
                // A partition stopping (revoked) leaves the running ones as it ends.
                Err(mpsc::TrySendError::Disconnected(_)) => {}
            }
        }
        {
            let mut state = self.state();
            let generation = state.newest.generation + 1;
            let path = path.to_owned();
            state.newest = Version { path, origin: origin.to_owned(), bytes, sha256: sha256.clone(), generation };
            for partition in &queued {
                if let Some(member) = state.running.get_mut(partition) {
                    member.offered_sha256.clone_from(&sha256);
                }
            }
        }
        tracing::info!(
            "plugin {label} from {origin}: queued at partitions {queued:?}; partitions assigned from now on open with it"
        );
        if !busy.is_empty() {
            return Err(OfferError::Busy(format!(
                "plugin {label} from {origin}: partitions {busy:?} have too many plugin versions waiting (or a migration check under way): offer it again after their next batch; partitions {queued:?} have it queued"
            )));
        }
        Ok(Offered { info, partitions: Some(queued) })
    }

    fn status(&self) -> TargetStatus {
        let state = self.state();
        let partitions = state.running.iter().map(|(p, m)| (*p, lock_status(&m.status).clone())).collect();
        TargetStatus::Partitions { newest: state.newest.origin.clone(), partitions }
    }
}
