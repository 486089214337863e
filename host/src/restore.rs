//! Bringing a partition's local store up to what the group has committed, from the
//! partition's changelog, before its pipeline opens: the store is missing (the
//! partition moved here, or its state dir was lost) or behind (the partition ran
//! elsewhere meanwhile). A store whose last batch's transaction committed while its
//! local commit did not is left as it is: the pipeline replays that batch from its
//! plan, without sending it again, so its file outputs are written again too.
//!
//! The changelog holds, per batch, a record per key change and a checkpoint record,
//! each with the batch's id and input range in its headers. A batch can appear more
//! than once: a transaction that was aborted and retried (a broker that does not
//! hide aborted records from `read_committed` readers, such as tansu, shows both).
//! The rule that picks the committed one: a batch's attempt is committed when a
//! later batch was started after it (the next batch is planned only once this one
//! committed), or, for the last batches, when the group's commit says so; of several
//! attempts of one batch the latest is the committed one. So at most two batches'
//! changes are held at once, and each committed batch is applied to the store as one
//! commit, like the batch itself.

use crate::clock::Clock;
use crate::records::{BatchPlan, Checkpoint, KeyChange};
use crate::store::{Store, StoreError};

/// How often restoring logs its progress (2 s).
const PROGRESS_MS: u64 = 2_000;

/// One changelog entry: a key's record after a batch (none: removed), or the
/// batch's checkpoint.
#[derive(Debug, Clone)]
pub enum ChangelogEntry {
    /// A key change (its `before` is not known, and not needed).
    Key(KeyChange),
    /// The checkpoint the batch committed, with the plugin world whose state the
    /// partition holds (none in a changelog written before it was recorded).
    Checkpoint {
        /// The checkpoint.
        checkpoint: Checkpoint,
        /// 1 or 2 (see `Store::state_api`).
        state_api: Option<u32>,
    },
}

/// One changelog record, with its batch's id and input range.
#[derive(Debug, Clone)]
pub struct ChangelogRecord {
    /// The batch.
    pub batch_id: u64,
    /// The input offset the batch started at.
    pub start_offset: u64,
    /// The input offset after the batch.
    pub end_offset: u64,
    /// What it holds.
    pub entry: ChangelogEntry,
}

/// What the group has committed for the partition (see `kafka::Committed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommit {
    /// The offset after the last committed batch.
    pub offset: u64,
    /// The id of the next batch, when a groupstate transaction committed it.
    pub next_batch_id: Option<u64>,
}

/// Reading the changelog failed.
pub type ReadError = Box<dyn std::error::Error + Send + Sync>;

/// Restoring failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The local store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A damaged store could not be moved aside to restore the partition.
    #[error(
        "{damage}; moving the damaged store {path} aside to restore the partition from the changelog failed: {cause}; move or delete it yourself and run again"
    )]
    SetAside {
        /// The store dir.
        path: std::path::PathBuf,
        /// What is damaged.
        damage: StoreError,
        /// The rename's error.
        cause: std::io::Error,
    },
    /// The changelog could not be read.
    #[error("restoring from the changelog: {0}")]
    Read(ReadError),
    /// The changelog does not reach what the group committed.
    #[error(
        "the group has committed batches up to input offset {committed}, but the changelog gives them only up to offset {reached}: the changelog topic was deleted or truncated, or the partition was consumed by a groupstate without one; run with the --state-dir that holds the partition, or start over with a new --group"
    )]
    Short {
        /// The group's committed offset.
        committed: u64,
        /// Where the restored state ends.
        reached: u64,
    },
}

/// What restoring did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Changelog records read.
    pub records: u64,
    /// Batches applied to the store.
    pub batches: u64,
    /// Key changes applied.
    pub changes: u64,
    /// The store's checkpoint after restoring.
    pub checkpoint: Checkpoint,
}

/// Whether the local store (its checkpoint and pending plan) is behind the group's
/// commit, so that it must be restored from the changelog first.
pub fn is_behind(local: Option<&Checkpoint>, pending: Option<&BatchPlan>, group: GroupCommit) -> bool {
    let (next_id, offset) = local.map_or((0, 0), |c| (c.next_batch_id, c.input_offset));
    match group.next_batch_id {
        // The local commit of the pending plan's batch did not follow its
        // transaction: the pipeline replays the plan.
        Some(n) if n == next_id + 1 && pending.is_some_and(|p| p.batch_id == next_id && p.start_offset == offset) => {
            false
        }
        Some(n) => n > next_id,
        None => group.offset > offset,
    }
}

/// One batch as the changelog holds it.
struct Attempt {
    batch_id: u64,
    start_offset: u64,
    end_offset: u64,
    changes: Vec<KeyChange>,
    checkpoint: Option<Checkpoint>,
    state_api: Option<u32>,
}

impl Attempt {
    fn new(record: &ChangelogRecord) -> Self {
        Self {
            batch_id: record.batch_id,
            start_offset: record.start_offset,
            end_offset: record.end_offset,
            changes: Vec::new(),
            checkpoint: None,
            state_api: None,
        }
    }

    fn holds(&self, record: &ChangelogRecord) -> bool {
        (self.batch_id, self.start_offset, self.end_offset) == (record.batch_id, record.start_offset, record.end_offset)
    }
}

/// Applies the committed batches the changelog holds after `store`'s checkpoint, up
/// to the group's commit. `next` gives the changelog's records in order, `None` at
/// its end; `progress` hears of the records read so far when progress is logged.
///
/// The output files are this process's own, so their committed lengths are the
/// local checkpoint's, or with no local state `file_lengths` (output, late, dead
/// letter): what the files hold now, which restoring keeps.
pub fn catch_up(
    store: &mut Store,
    group: GroupCommit,
    file_lengths: [u64; 3],
    clock: &dyn Clock,
    next: &mut dyn FnMut() -> Result<Option<ChangelogRecord>, ReadError>,
    progress: &mut dyn FnMut(u64),
) -> Result<Restored, Error> {
    let local = store.checkpoint()?;
    let records_state_api = store.state_api()?.is_none();
    let [output_len, late_len, dead_letter_len] = file_lengths;
    let mut restore = Restoring {
        skip_below: local.as_ref().map_or(0, |c| c.next_batch_id),
        checkpoint: local.unwrap_or(Checkpoint { output_len, late_len, dead_letter_len, ..Checkpoint::default() }),
        group,
        records_state_api,
        pending: None,
        done: Restored { records: 0, batches: 0, changes: 0, checkpoint: Checkpoint::default() },
        store,
    };
    let started = clock.monotonic_ns();
    let elapsed_ms = || clock.monotonic_ns().saturating_sub(started) / 1_000_000;
    let mut logged_ms = 0;
    let mut current: Option<Attempt> = None;
    while let Some(record) = next().map_err(Error::Read)? {
        restore.done.records += 1;
        if elapsed_ms() >= logged_ms + PROGRESS_MS {
            logged_ms = elapsed_ms();
            progress(restore.done.records);
            tracing::info!(
                "restoring from the changelog: {} records read, {} batches ({} key changes) applied, at batch {}",
                restore.done.records,
                restore.done.batches,
                restore.done.changes,
                record.batch_id
            );
        }
        if record.batch_id < restore.skip_below {
            continue;
        }
        if !current.as_ref().is_some_and(|a| a.holds(&record)) {
            if let Some(done) = current.take() {
                restore.finished(done)?;
            }
            current = Some(Attempt::new(&record));
        }
        let attempt = current.as_mut().expect("set above");
        match record.entry {
            ChangelogEntry::Key(change) => attempt.changes.push(change),
            ChangelogEntry::Checkpoint { checkpoint, state_api } => {
                attempt.checkpoint = Some(checkpoint);
                attempt.state_api = state_api;
            }
        }
    }
    if let Some(done) = current.take() {
        restore.finished(done)?;
    }
    if let Some(last) = restore.pending.take() {
        restore.apply_if_committed(last)?;
    }
    restore.store.flush()?;
    let reached = restore.checkpoint.input_offset;
    if reached < group.offset || group.next_batch_id.is_some_and(|n| restore.checkpoint.next_batch_id < n) {
        return Err(Error::Short { committed: group.offset, reached });
    }
    restore.done.checkpoint = restore.checkpoint.clone();
    tracing::info!(
        "restored from the changelog: {} records read, {} batches ({} key changes) applied in {} ms; next batch {} at input offset {}",
        restore.done.records,
        restore.done.batches,
        restore.done.changes,
        elapsed_ms(),
        restore.checkpoint.next_batch_id,
        restore.checkpoint.input_offset
    );
    Ok(restore.done)
}

struct Restoring<'s> {
    store: &'s mut Store,
    /// Batches below this id are in the local store already.
    skip_below: u64,
    /// The store's checkpoint, as restoring moves it.
    checkpoint: Checkpoint,
    group: GroupCommit,
    /// The store is new: the first checkpoint that names the plugin world records it.
    records_state_api: bool,
    /// The latest attempt of the highest batch read, not yet known to be final.
    pending: Option<Attempt>,
    done: Restored,
}

impl Restoring<'_> {
    /// An attempt's records are all read.
    fn finished(&mut self, attempt: Attempt) -> Result<(), Error> {
        match self.pending.take() {
            // A later batch was started: the pending one committed.
            Some(pending) if pending.batch_id < attempt.batch_id => self.apply_if_committed(pending)?,
            // A retry of the same batch: the earlier attempt was aborted.
            Some(pending) if pending.batch_id == attempt.batch_id => {}
            Some(pending) => {
                tracing::warn!(
                    "changelog: batch {} appears after batch {}; it is not applied",
                    attempt.batch_id,
                    pending.batch_id
                );
                self.pending = Some(pending);
                return Ok(());
            }
            None => {}
        }
        self.pending = Some(attempt);
        Ok(())
    }

    fn apply_if_committed(&mut self, attempt: Attempt) -> Result<(), Error> {
        let committed = match self.group.next_batch_id {
            Some(n) => attempt.batch_id < n,
            None => attempt.end_offset <= self.group.offset,
        };
        if !committed {
            return Ok(());
        }
        let local = &self.checkpoint;
        let checkpoint = match attempt.checkpoint {
            // The output files are this process's: their committed lengths stay.
            Some(c) => Checkpoint {
                input_digest: 0,
                output_len: local.output_len,
                late_len: local.late_len,
                dead_letter_len: local.dead_letter_len,
                ..c
            },
            // A compacted changelog keeps only the latest checkpoint record.
            None => {
                Checkpoint { next_batch_id: attempt.batch_id + 1, input_offset: attempt.end_offset, ..local.clone() }
            }
        };
        if let Some(api) = attempt.state_api.filter(|_| self.records_state_api) {
            // The changelog carries entries of this host's 0.2 layout.
            if api == 2 {
                self.store.set_keyed_layout(crate::keyed::KEYED_LAYOUT)?;
            }
            self.store.set_state_api(api)?;
            self.records_state_api = false;
        }
        self.done.batches += 1;
        self.done.changes += attempt.changes.len() as u64;
        self.store.commit(&attempt.changes, &checkpoint, false)?;
        self.store.fold_if_due()?;
        self.checkpoint = checkpoint;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::records::KeyRecord;

    fn key(batch_id: u64, start: u64, end: u64, key: &str, value: Option<u8>) -> ChangelogRecord {
        let after = value.map(|v| KeyRecord { value: Some(vec![v]), timeout_ms: None, schema_version: 0 });
        let entry = ChangelogEntry::Key(KeyChange { key: key.into(), before: None, after });
        ChangelogRecord { batch_id, start_offset: start, end_offset: end, entry }
    }

    fn checkpoint(batch_id: u64, start: u64, end: u64) -> ChangelogRecord {
        let checkpoint = Checkpoint { next_batch_id: batch_id + 1, input_offset: end, ..Checkpoint::default() };
        let entry = ChangelogEntry::Checkpoint { checkpoint, state_api: Some(2) };
        ChangelogRecord { batch_id, start_offset: start, end_offset: end, entry }
    }

    /// Batch 0 aborted and retried (as tansu shows it), batch 1, and batch 2 whose
    /// transaction the group has not committed.
    fn changelog() -> Vec<ChangelogRecord> {
        vec![
            key(0, 0, 10, "a", Some(1)),
            checkpoint(0, 0, 10),
            key(0, 0, 10, "a", Some(2)),
            key(0, 0, 10, "b", Some(2)),
            checkpoint(0, 0, 10),
            key(1, 10, 20, "b", None),
            key(1, 10, 20, "c", Some(3)),
            checkpoint(1, 10, 20),
            key(2, 20, 30, "d", Some(4)),
            checkpoint(2, 20, 30),
        ]
    }

    fn restore(group: GroupCommit) -> (tempfile::TempDir, Result<Restored, Error>) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("store"), 1 << 20, 1 << 20, 1 << 20).unwrap();
        let mut records = changelog().into_iter();
        let result =
            catch_up(&mut store, group, [7, 0, 0], &ManualClock::new(0), &mut || Ok(records.next()), &mut |_| {})
                .inspect(|_| {
                    let value = |k: &str| store.get(k).unwrap().and_then(|r| r.value);
                    assert_eq!(value("a"), Some(vec![2]), "the latest attempt of batch 0 is the committed one");
                    assert_eq!(value("b"), None, "batch 1 removed b");
                    assert_eq!(value("c"), Some(vec![3]));
                    assert_eq!(value("d"), None, "batch 2 is not committed");
                    assert_eq!(store.state_api().unwrap(), Some(2), "the plugin world is recorded");
                });
        (dir, result)
    }

    #[test]
    fn the_latest_attempt_of_each_committed_batch_is_applied() {
        for group in
            [GroupCommit { offset: 20, next_batch_id: Some(2) }, GroupCommit { offset: 20, next_batch_id: None }]
        {
            let (_dir, restored) = restore(group);
            let restored = restored.unwrap();
            assert_eq!((restored.batches, restored.records), (2, 10), "{group:?}");
            let c = &restored.checkpoint;
            assert_eq!((c.next_batch_id, c.input_offset, c.output_len), (2, 20, 7), "{group:?}");
        }
    }

    #[test]
    fn a_changelog_short_of_the_group_commit_is_refused() {
        let (_dir, restored) = restore(GroupCommit { offset: 40, next_batch_id: Some(4) });
        let err = restored.unwrap_err().to_string();
        assert!(err.contains("up to input offset 40") && err.contains("only up to offset 30"), "{err}");
    }

    #[test]
    fn behind_means_the_group_committed_more_than_the_store_and_its_plan() {
        let local = Checkpoint { next_batch_id: 3, input_offset: 30, ..Checkpoint::default() };
        let group = |n| GroupCommit { offset: 40, next_batch_id: Some(n) };
        assert!(!is_behind(Some(&local), None, group(3)));
        assert!(is_behind(Some(&local), None, group(4)));
        assert!(is_behind(None, None, group(1)));
        let plan = BatchPlan { batch_id: 3, start_offset: 30, end_offset: 40, processing_time_ms: 0, watermark_ms: 0 };
        assert!(!is_behind(Some(&local), Some(&plan), group(4)), "the pending plan's transaction committed");
        assert!(is_behind(Some(&local), Some(&plan), group(5)));
        assert!(is_behind(Some(&local), None, GroupCommit { offset: 40, next_batch_id: None }));
        assert!(!is_behind(Some(&local), None, GroupCommit { offset: 30, next_batch_id: None }));
    }
}
