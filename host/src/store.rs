//! The state store: the only module that touches sled.
//!
//! One sled tree holds everything, under one-byte prefixes, so that a batch's state
//! changes, timer changes and checkpoint go in with a single atomic `apply_batch`
//! (cheaper than a multi-tree transaction, and just as atomic through a crash):
//!
//! | prefix | key | value |
//! | --- | --- | --- |
//! | `s` | group key | [`KeyRecord`]: state value, timeout deadline, schema version |
//! | `t` | deadline (order-preserving 8 bytes) ++ group key | empty: the deadline index |
//! | `m` | `checkpoint`, `plan`, `pipeline` | [`Checkpoint`], [`BatchPlan`], [`PipelineIdentity`] |
//!
//! Firing timeouts scans the `t` range below the threshold only: O(expired keys).

use std::path::{Path, PathBuf};

use bincode::{Decode, Encode};

use crate::codec;

const PREFIX_STATE: u8 = b's';
const PREFIX_TIMER: u8 = b't';
const META_CHECKPOINT: &[u8] = b"mcheckpoint";
const META_PLAN: &[u8] = b"mplan";
const META_PIPELINE: &[u8] = b"mpipeline";

/// How often `open` retries a locked database (20 ms apart, 5 s in all) before giving up.
const OPEN_LOCK_RETRIES: u32 = 250;

/// Keys longer than this are refused before they reach the store (sled keys are
/// cheap up to a few KiB; a longer key is almost certainly a wrong `--key-field`).
pub const KEY_BYTES_MAX: usize = 4096;

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled could not open the directory.
    #[error(
        "state dir {path}: cannot open ({cause}); check the path and its permissions, and that no other groupstate process uses it"
    )]
    Open {
        /// The state dir.
        path: PathBuf,
        /// sled's error.
        cause: sled::Error,
    },
    /// A read or write failed.
    #[error("state store: {what} failed: {cause}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// sled's error.
        cause: sled::Error,
    },
    /// A stored record is corrupt.
    #[error(transparent)]
    Decode(#[from] codec::DecodeError),
    /// A stored record broke an invariant.
    #[error("state store: {0}; the state dir is corrupt")]
    Corrupt(String),
}

type Result<T> = std::result::Result<T, StoreError>;

/// Everything the store keeps for one group key.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct KeyRecord {
    /// The state value (opaque to the host), if the key has one.
    pub value: Option<Vec<u8>>,
    /// The key's timeout deadline in epoch milliseconds (processing or event time, per
    /// the pipeline's timeout kind), if one is set.
    pub timeout_ms: Option<i64>,
    /// The plugin state-schema version that wrote `value`.
    pub schema_version: u32,
}

impl KeyRecord {
    /// A record with neither value nor timeout carries nothing and is not stored.
    pub fn is_empty(&self) -> bool {
        self.value.is_none() && self.timeout_ms.is_none()
    }
}

/// Counters carried in the checkpoint, so that a resumed run reports totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Encode, Decode)]
pub struct Counters {
    /// Input records read (good, late and bad).
    pub records: u64,
    /// Records that went to the plugin.
    pub events: u64,
    /// Records behind the watermark, written to the late output.
    pub late: u64,
    /// Records that could not be decoded.
    pub bad_records: u64,
    /// Plugin calls with data.
    pub data_calls: u64,
    /// Plugin calls for expired timeouts.
    pub timeout_calls: u64,
    /// Outputs written.
    pub outputs: u64,
    /// Plugin calls that failed (trap, limit, or an `err` result) and were skipped or
    /// dead-lettered.
    pub failed_calls: u64,
}

/// The committed position of a pipeline: written atomically with the state changes
/// of the batch it closes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Encode, Decode)]
pub struct Checkpoint {
    /// The id the next batch gets.
    pub next_batch_id: u64,
    /// Input byte offset after the last committed record.
    pub input_offset: u64,
    /// Committed byte lengths of the output, late-data and dead-letter files.
    pub output_len: u64,
    /// See `output_len`.
    pub late_len: u64,
    /// See `output_len`.
    pub dead_letter_len: u64,
    /// The largest event time seen in committed batches.
    pub max_event_time_ms: Option<i64>,
    /// The watermark of the last committed batch; it never moves backwards.
    pub watermark_ms: i64,
    /// Running totals.
    pub counters: Counters,
}

/// A batch fixed before it is processed (the write-ahead batch log): a crash re-runs
/// the same plan, so the replay sees the same records, time and watermark.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct BatchPlan {
    /// The batch id.
    pub batch_id: u64,
    /// Input byte offset of the first record.
    pub start_offset: u64,
    /// Input byte offset after the last record.
    pub end_offset: u64,
    /// The batch's processing time (epoch milliseconds).
    pub processing_time_ms: i64,
    /// The batch's watermark (epoch milliseconds).
    pub watermark_ms: i64,
}

/// What a state dir was created for; a later run must match it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct PipelineIdentity {
    /// The key field.
    pub key_field: String,
    /// The time field, if any.
    pub time_field: Option<String>,
    /// The timeout kind, as its CLI name.
    pub timeout: String,
    /// The input, as given (a path or `-`).
    pub input: String,
}

/// A key's record before and after a batch.
#[derive(Debug, Clone)]
pub struct KeyChange {
    /// The group key.
    pub key: String,
    /// The record as loaded at the start of the batch.
    pub before: Option<KeyRecord>,
    /// The record to store (`None` deletes it).
    pub after: Option<KeyRecord>,
}

/// The sled-backed state store of one pipeline.
pub struct Store {
    db: sled::Db,
    tree: sled::Tree,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

/// sled reports a held lock as a custom `Other` error wrapping `WouldBlock`.
fn is_lock_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("could not acquire lock")
}

fn io(what: &'static str) -> impl FnOnce(sled::Error) -> StoreError {
    move |cause| StoreError::Io { what, cause }
}

fn state_key(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(PREFIX_STATE);
    k.extend_from_slice(key.as_bytes());
    k
}

/// Maps an i64 to 8 bytes whose lexicographic order is the numeric order.
fn ordered_i64(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1 << 63)).to_be_bytes()
}

fn from_ordered_i64(b: [u8; 8]) -> i64 {
    (u64::from_be_bytes(b) ^ (1 << 63)) as i64
}

fn timer_key(deadline_ms: i64, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.push(PREFIX_TIMER);
    k.extend_from_slice(&ordered_i64(deadline_ms));
    k.extend_from_slice(key.as_bytes());
    k
}

fn parse_timer_key(raw: &[u8]) -> Result<(i64, String)> {
    if raw.len() < 9 || raw[0] != PREFIX_TIMER {
        return Err(StoreError::Corrupt(format!("timer index entry of {} bytes", raw.len())));
    }
    let mut deadline = [0u8; 8];
    deadline.copy_from_slice(&raw[1..9]);
    let key = std::str::from_utf8(&raw[9..]).map_err(|_| StoreError::Corrupt("timer index key is not UTF-8".into()))?;
    Ok((from_ordered_i64(deadline), key.to_owned()))
}

impl Store {
    /// Opens (or creates) the store in `dir`. `cache_bytes` bounds sled's page cache.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Self> {
        let open_err = |cause| StoreError::Open { path: dir.to_owned(), cause };
        let config = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            // The engine flushes at every commit when asked to; the background flush
            // only bounds how much a crash can lose when it is not.
            .flush_every_ms(Some(1000));
        // sled releases its file lock only when its background flusher has exited,
        // shortly after the `Db` is dropped; a reopen within the same process may
        // have to wait for that.
        let mut attempts = 0;
        let db = loop {
            match config.open() {
                Err(sled::Error::Io(e)) if is_lock_error(&e) && attempts < OPEN_LOCK_RETRIES => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => break other.map_err(open_err)?,
            }
        };
        let tree = db.open_tree("groupstate").map_err(open_err)?;
        Ok(Self { db, tree })
    }

    fn get_meta<T: Decode<()>>(&self, name: &'static str, key: &[u8]) -> Result<Option<T>> {
        match self.tree.get(key).map_err(io("read metadata"))? {
            Some(bytes) => Ok(Some(codec::decode(name, &bytes)?)),
            None => Ok(None),
        }
    }

    /// The last committed checkpoint, or `None` for a new state dir.
    pub fn checkpoint(&self) -> Result<Option<Checkpoint>> {
        self.get_meta("checkpoint", META_CHECKPOINT)
    }

    /// The pipeline identity recorded at the first run, if any.
    pub fn pipeline_identity(&self) -> Result<Option<PipelineIdentity>> {
        self.get_meta("pipeline identity", META_PIPELINE)
    }

    /// Records the pipeline identity (first run only).
    pub fn set_pipeline_identity(&self, id: &PipelineIdentity) -> Result<()> {
        self.tree.insert(META_PIPELINE, codec::encode(id)).map_err(io("write pipeline identity"))?;
        Ok(())
    }

    /// The planned but uncommitted batch, if a run stopped in the middle of one.
    pub fn pending_plan(&self) -> Result<Option<BatchPlan>> {
        self.get_meta("batch plan", META_PLAN)
    }

    /// Writes the plan of the batch about to run (before any of its effects).
    pub fn write_plan(&self, plan: &BatchPlan) -> Result<()> {
        assert!(plan.start_offset <= plan.end_offset, "plan with a negative range: {plan:?}");
        self.tree.insert(META_PLAN, codec::encode(plan)).map_err(io("write batch plan"))?;
        Ok(())
    }

    /// Loads a key's record.
    pub fn get(&self, key: &str) -> Result<Option<KeyRecord>> {
        let Some(bytes) = self.tree.get(state_key(key)).map_err(io("read state"))? else {
            return Ok(None);
        };
        let record: KeyRecord = codec::decode("key record", &bytes)?;
        if record.is_empty() {
            return Err(StoreError::Corrupt(format!("empty record stored for key {key:?}")));
        }
        Ok(Some(record))
    }

    /// Up to `limit` timers with a deadline strictly below `threshold_ms`, in
    /// (deadline, key) order.
    pub fn expired_timers(&self, threshold_ms: i64, limit: usize) -> Result<Vec<(i64, String)>> {
        let start = vec![PREFIX_TIMER];
        let mut end = vec![PREFIX_TIMER];
        end.extend_from_slice(&ordered_i64(threshold_ms));
        let mut expired = Vec::new();
        for entry in self.tree.range(start..end).take(limit) {
            let (raw, _) = entry.map_err(io("scan timers"))?;
            expired.push(parse_timer_key(&raw)?);
        }
        Ok(expired)
    }

    /// Commits one batch atomically: every key change, its timer index entries, the
    /// checkpoint, and the removal of the batch plan. With `durable`, waits until it
    /// is on disk.
    pub fn commit(&self, changes: &[KeyChange], checkpoint: &Checkpoint, durable: bool) -> Result<()> {
        let mut batch = sled::Batch::default();
        for change in changes {
            add_change(&mut batch, change);
        }
        batch.insert(META_CHECKPOINT, codec::encode(checkpoint));
        batch.remove(META_PLAN);
        self.tree.apply_batch(batch).map_err(io("commit batch"))?;
        if durable {
            self.db.flush().map_err(io("flush commit"))?;
        }
        Ok(())
    }

    /// Waits until everything written so far is on disk.
    pub fn flush(&self) -> Result<()> {
        self.db.flush().map_err(io("flush"))?;
        Ok(())
    }

    /// All key records in key order (for `groupstate state` and tests).
    pub fn iter_keys(&self) -> impl Iterator<Item = Result<(String, KeyRecord)>> + '_ {
        self.tree.scan_prefix([PREFIX_STATE]).map(|entry| {
            let (raw, bytes) = entry.map_err(io("scan state"))?;
            let key = std::str::from_utf8(&raw[1..])
                .map_err(|_| StoreError::Corrupt("state key is not UTF-8".into()))?
                .to_owned();
            let record = codec::decode("key record", &bytes)?;
            Ok((key, record))
        })
    }

    /// All timers in (deadline, key) order.
    pub fn iter_timers(&self) -> impl Iterator<Item = Result<(i64, String)>> + '_ {
        self.tree.scan_prefix([PREFIX_TIMER]).map(|entry| {
            let (raw, _) = entry.map_err(io("scan timers"))?;
            parse_timer_key(&raw)
        })
    }

    /// Checks that the timer index and the key records agree (tests and `state check`).
    pub fn check_consistency(&self) -> Result<()> {
        let mut with_timeout = 0usize;
        for entry in self.iter_keys() {
            let (key, record) = entry?;
            if record.is_empty() {
                return Err(StoreError::Corrupt(format!("empty record for key {key:?}")));
            }
            if let Some(deadline) = record.timeout_ms {
                with_timeout += 1;
                let indexed = self.tree.contains_key(timer_key(deadline, &key)).map_err(io("read timer"))?;
                if !indexed {
                    return Err(StoreError::Corrupt(format!(
                        "key {key:?} has a timeout at {deadline} missing from the index"
                    )));
                }
            }
        }
        let indexed = self.iter_timers().count();
        if indexed != with_timeout {
            return Err(StoreError::Corrupt(format!(
                "{indexed} timer index entries for {with_timeout} keys with a timeout"
            )));
        }
        Ok(())
    }
}

fn add_change(batch: &mut sled::Batch, change: &KeyChange) {
    let before_timer = change.before.as_ref().and_then(|r| r.timeout_ms);
    let after_timer = change.after.as_ref().and_then(|r| r.timeout_ms);
    if before_timer != after_timer {
        if let Some(deadline) = before_timer {
            batch.remove(timer_key(deadline, &change.key));
        }
        if let Some(deadline) = after_timer {
            batch.insert(timer_key(deadline, &change.key), &[] as &[u8]);
        }
    }
    match &change.after {
        Some(record) => {
            // Assert at the storage boundary: an empty record must be a delete.
            assert!(!record.is_empty(), "empty record for key {:?} reached the store", change.key);
            assert!(change.key.len() <= KEY_BYTES_MAX, "over-long key reached the store");
            batch.insert(state_key(&change.key), codec::encode(record));
        }
        None => batch.remove(state_key(&change.key)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(value: Option<&[u8]>, timeout_ms: Option<i64>) -> Option<KeyRecord> {
        let r = KeyRecord { value: value.map(<[u8]>::to_vec), timeout_ms, schema_version: 1 };
        (!r.is_empty()).then_some(r)
    }

    #[test]
    fn ordered_i64_keeps_order() {
        let values = [i64::MIN, -5, -1, 0, 1, 7, 1_700_000_000_000, i64::MAX];
        for pair in values.windows(2) {
            assert!(ordered_i64(pair[0]) < ordered_i64(pair[1]));
            assert_eq!(from_ordered_i64(ordered_i64(pair[0])), pair[0]);
        }
    }

    #[test]
    fn commit_moves_timers_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), 1 << 20).unwrap();
            assert_eq!(store.checkpoint().unwrap(), None);
            let changes = vec![
                KeyChange { key: "a".into(), before: None, after: rec(Some(b"1"), Some(100)) },
                KeyChange { key: "b".into(), before: None, after: rec(None, Some(50)) },
                KeyChange { key: "c".into(), before: None, after: rec(Some(b"3"), None) },
            ];
            let cp = Checkpoint { next_batch_id: 1, input_offset: 10, ..Checkpoint::default() };
            store.commit(&changes, &cp, true).unwrap();
            assert_eq!(store.expired_timers(100, 10).unwrap(), vec![(50, "b".to_owned())]);
            assert_eq!(store.expired_timers(101, 1).unwrap(), vec![(50, "b".to_owned())]);
            // Move a's timer, drop b entirely.
            let changes = vec![
                KeyChange { key: "a".into(), before: rec(Some(b"1"), Some(100)), after: rec(Some(b"2"), Some(300)) },
                KeyChange { key: "b".into(), before: rec(None, Some(50)), after: None },
            ];
            let cp2 = Checkpoint { next_batch_id: 2, input_offset: 20, ..Checkpoint::default() };
            store.commit(&changes, &cp2, true).unwrap();
        }
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(store.checkpoint().unwrap().unwrap().input_offset, 20);
        assert_eq!(store.expired_timers(i64::MAX, 10).unwrap(), vec![(300, "a".to_owned())]);
        assert_eq!(store.get("a").unwrap().unwrap().value.as_deref(), Some(&b"2"[..]));
        assert_eq!(store.get("b").unwrap(), None);
        assert_eq!(store.iter_keys().count(), 2);
        store.check_consistency().unwrap();
    }

    #[test]
    fn plan_is_cleared_by_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        let plan = BatchPlan { batch_id: 0, start_offset: 0, end_offset: 5, processing_time_ms: 1, watermark_ms: 0 };
        store.write_plan(&plan).unwrap();
        assert_eq!(store.pending_plan().unwrap(), Some(plan));
        store.commit(&[], &Checkpoint::default(), false).unwrap();
        assert_eq!(store.pending_plan().unwrap(), None);
    }
}

/// A model-based test: random operations against the store and against a plain
/// in-memory model, including reboots that lose what was not committed.
#[cfg(test)]
mod model {
    use std::collections::BTreeMap;

    use super::*;
    use crate::workload::Rng;

    /// The model: committed records, and the batch being built.
    #[derive(Default)]
    struct Model {
        committed: BTreeMap<String, KeyRecord>,
        pending: BTreeMap<String, Option<KeyRecord>>,
        checkpoint: Checkpoint,
    }

    impl Model {
        fn current(&self, key: &str) -> Option<KeyRecord> {
            match self.pending.get(key) {
                Some(r) => r.clone(),
                None => self.committed.get(key).cloned(),
            }
        }
    }

    fn random_record(rng: &mut Rng, before: Option<&KeyRecord>) -> Option<KeyRecord> {
        let value = match rng.range(0, 4) {
            0 => None,
            1 => before.and_then(|r| r.value.clone()),
            _ => Some(rng.next_u64().to_le_bytes()[..rng.range(0, 9) as usize].to_vec()),
        };
        let timeout_ms = match rng.range(0, 3) {
            0 => None,
            1 => before.and_then(|r| r.timeout_ms),
            _ => Some(rng.range(-50, 1000)),
        };
        let r = KeyRecord { value, timeout_ms, schema_version: 1 };
        (!r.is_empty()).then_some(r)
    }

    #[test]
    fn random_operations_with_reboots_match_the_model() {
        for seed in 0..8u64 {
            let dir = tempfile::tempdir().unwrap();
            let mut rng = Rng::new(seed);
            let mut store = Store::open(dir.path(), 1 << 20).unwrap();
            let mut model = Model::default();
            let keys: Vec<String> = (0..40).map(|i| format!("key-{i}")).collect();
            for step in 0..1500 {
                let context = format!("seed {seed} step {step}");
                match rng.range(0, 100) {
                    // Change a key (update, remove, set or clear its timer).
                    0..=59 => {
                        let key = &keys[rng.range(0, keys.len() as i64) as usize];
                        let after = random_record(&mut rng, model.current(key).as_ref());
                        model.pending.insert(key.clone(), after);
                    }
                    // Commit the batch.
                    60..=79 => {
                        let changes: Vec<KeyChange> = model
                            .pending
                            .iter()
                            .map(|(k, after)| KeyChange {
                                key: k.clone(),
                                before: model.committed.get(k).cloned(),
                                after: after.clone(),
                            })
                            .collect();
                        model.checkpoint.next_batch_id += 1;
                        model.checkpoint.input_offset += rng.range(0, 100) as u64;
                        store.commit(&changes, &model.checkpoint, rng.range(0, 2) == 0).unwrap();
                        for (k, after) in std::mem::take(&mut model.pending) {
                            match after {
                                Some(r) => model.committed.insert(k, r),
                                None => model.committed.remove(&k),
                            };
                        }
                    }
                    // Fire: the expired timers must be exactly the model's, in order.
                    80..=91 => {
                        let threshold = rng.range(-60, 1100);
                        let limit = rng.range(1, 50) as usize;
                        let mut want: Vec<(i64, String)> = model
                            .committed
                            .iter()
                            .filter_map(|(k, r)| r.timeout_ms.filter(|d| *d < threshold).map(|d| (d, k.clone())))
                            .collect();
                        want.sort();
                        want.truncate(limit);
                        assert_eq!(store.expired_timers(threshold, limit).unwrap(), want, "{context}");
                    }
                    // Reboot: the uncommitted batch is lost, the rest survives.
                    _ => {
                        drop(store);
                        store = Store::open(dir.path(), 1 << 20).unwrap();
                        model.pending.clear();
                        let cp = store.checkpoint().unwrap().unwrap_or_default();
                        assert_eq!(cp, model.checkpoint, "{context}");
                        store.check_consistency().unwrap();
                    }
                }
                if step % 100 == 0 {
                    for key in &keys {
                        assert_eq!(store.get(key).unwrap(), model.committed.get(key).cloned(), "{context} key {key}");
                    }
                }
            }
            store.check_consistency().unwrap();
            let stored: Vec<(String, KeyRecord)> = store.iter_keys().map(Result::unwrap).collect();
            let want: Vec<(String, KeyRecord)> = model.committed.into_iter().collect();
            assert_eq!(stored, want, "seed {seed}");
        }
    }
}
