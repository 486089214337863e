//! The state store: the only module that touches sled.
//!
//! Committed state lives in two places. sled holds everything up to the last *fold*,
//! in one tree under one-byte prefixes:
//!
//! | prefix | key | value |
//! | --- | --- | --- |
//! | `p` | the page's fence: the first key above its range (the last page's is the byte 0xFF, above every key) | a [`Page`]: the records ([`KeyRecord`]: state value, timeout deadline, schema version) of the keys from the previous page's fence up to its own |
//! | `t` | earliest deadline of a page (order-preserving 8 bytes) ++ the page's fence | empty: the deadline index, one entry per page with a timer |
//! | `m` | `checkpoint`, `folded`, `plan`, `pipeline` | [`Checkpoint`], sequence number of the last folded commit, [`BatchPlan`], [`PipelineIdentity`] |
//!
//! Keys live in pages, not one sled item each, because sled's cost per operation grows
//! with the items in its tree (see `page.rs`). The commits since the last fold are in
//! the redo log (`redo.log` beside sled's files, see `redo.rs`) and, merged per key,
//! in memory (the overlay, `overlay.rs`). A batch commits with one append to the log
//! (fsync'd when durable) and no sled write; a key updated in many batches is written
//! to sled once per fold. A fold writes the overlay into sled page by page, in key
//! order, in `apply_batch` chunks that each hold whole pages with their index entries
//! (a page that outgrows its limit is split, one left empty is removed), the
//! checkpoint and the folded sequence number with the last chunk; then it flushes
//! sled, replaces the fold marker and empties the log.
//!
//! When the overlay or the log outgrows its budget ([`Store::fold_if_due`]), the fold
//! runs on a thread of its own while the batches go on: the overlay is set aside for
//! it, the log is moved aside to `redo.folding.log`, and the next commits go into a new
//! overlay and a new `redo.log`. Reads see the overlay, then the one being folded, then
//! sled; the fold changes in sled only the records of the keys it holds (a split moves
//! the others to a new page, unchanged). When it is done, `redo.folding.log` is
//! removed; a crash before leaves both logs, and the next open replays them in order.
//! One fold runs at a time: a fold due while another runs waits for it, so at most two
//! overlays are held, besides the one retired last until the next batch has loaded
//! (the memory it holds is the one a spare would keep). At the end of a run
//! ([`Store::flush`]) and when the store opens, after replaying the logs, the fold runs
//! in place.
//!
//! Firing timeouts scans the deadline index below the threshold only: the pages whose
//! earliest deadline has passed, merged with the overlays' timers. O(pages with an
//! expired timer + overlay entries below the threshold). The scan holds a lock that a
//! fold takes to apply a chunk, so that it sees each chunk whole.

use std::collections::{BTreeSet, BinaryHeap};
use std::iter::Peekable;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use bincode::Decode;

use crate::codec;
use crate::fold_mark::{self, FoldMark};
use crate::key_order::cmp_keys;
use crate::overlay::Overlay;
use crate::page::{Merged, PAGE_BYTES_MAX, Page};
pub use crate::records::{BatchPlan, Checkpoint, Counters, KeyChange, KeyRecord, PipelineIdentity};
use crate::redo::{self, EncodedChange, LogError, RedoLog};

const PREFIX_PAGE: u8 = b'p';
const PREFIX_TIMER: u8 = b't';
/// One sled item per key: the layout before pages.
const PREFIX_OLD_STATE: u8 = b's';
const META_CHECKPOINT: &[u8] = b"mcheckpoint";
const META_FOLDED: &[u8] = b"mfolded";
/// The redo log's file name, in sled's directory (sled ignores files it did not make).
const REDO_LOG: &str = "redo.log";
/// The redo log a fold on its own thread is folding, moved aside so that commits go on
/// into a new `redo.log`; removed when that fold is durable.
const REDO_LOG_FOLDING: &str = "redo.folding.log";
const META_PLAN: &[u8] = b"mplan";
const META_PIPELINE: &[u8] = b"mpipeline";
/// The plugin world whose state the dir holds, in dirs made before the world file.
const META_STATE_API: &[u8] = b"mstate-api";
/// The layout of a 0.2 dir's entries, in dirs made before the world file (absent
/// from both: the first 0.2 layout, without the
/// expiry header of `keyed.rs`).
const META_KEYED_LAYOUT: &[u8] = b"mkeyed-layout";
/// The world file beside sled's files (see [`Store::state_api`]), and its staging name.
const WORLD_FILE: &str = "world.json";
const WORLD_TMP: &str = "world.json.tmp";
/// The changes of a durable commit from which the overlay takes them while the redo
/// log's append, on a thread started for it, waits on the disk (at a million keys, a
/// batch of 50 000 changes waited about 4 ms on its fsync and took about 10 ms to
/// update the overlay).
const APPLY_WHILE_SYNCING_CHANGES_MIN: usize = 1024;

/// The most arena an empty overlay reserves (`store_buffer_bytes` may be far more).
const OVERLAY_RESERVED_MAX: u64 = 256 << 20;

/// What a dir's state is, as the world file holds it.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
struct World {
    /// See [`Store::state_api`].
    state_api: Option<u32>,
    /// See [`Store::keyed_layout`].
    keyed_layout: Option<u32>,
}

/// sled's log segment for a new store (sled's default is 512 KiB). A leaf of sled's
/// tree holds up to 16 items, and sled writes an item over a quarter of a segment (a
/// leaf it rewrites whole included) as a file of its own: 1 MiB keeps a leaf of 16 pages
/// of up to [`PAGE_BYTES_MAX`] in the log (with 512 KiB segments, 16 KiB pages were
/// little faster than 8 KiB, BENCHMARKS.md). sled opens a store only with the segment
/// size it was created with, so an older store keeps its own ([`segment_bytes`]).
pub(crate) const SEGMENT_BYTES: usize = 1 << 20;

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
    /// sled's files are damaged: it cannot read what it wrote.
    #[error(
        "state dir {path}: sled's files are damaged ({cause}), so nothing was changed; restore the state dir from a backup, or move it aside and start a new one (a kafka:// input does that itself and rebuilds the partition from its changelog)"
    )]
    Damaged {
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
    /// The redo log could not be read or written.
    #[error("state store: redo log {path}: {cause}; check the disk (space, permissions) and run again")]
    Log {
        /// The log file.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// A stored record is corrupt.
    #[error(transparent)]
    Decode(#[from] codec::DecodeError),
    /// A stored record broke an invariant.
    #[error("state store: {0}; the state dir is corrupt")]
    Corrupt(String),
    /// The redo log is damaged before a whole commit: not a torn append.
    #[error(
        "state store: redo log {path} is damaged at byte {offset}, before the whole commit {commit} that follows: committed batches would be lost, so nothing was changed; restore the state dir from a backup, or move it aside and start a new one"
    )]
    LogDamaged {
        /// The log file.
        path: PathBuf,
        /// Where the damaged frame starts.
        offset: u64,
        /// The sequence number of a whole commit after it.
        commit: u64,
    },
    /// The state dir was written with one sled item per key, before pages.
    #[error(
        "state dir {dir} was written by an older groupstate (one sled item per key); this version keeps keys in pages and cannot read it: run the pipeline again into a new --state-dir"
    )]
    OldLayout {
        /// sled's directory.
        dir: PathBuf,
    },
    /// A commit failed after its changes went into memory (see [`Store::commit`]).
    #[error(
        "state store: a commit failed after its changes went into memory ({cause}), so this store refuses to go on; check the disk (space, permissions) and open the pipeline again: its state comes back from the disk as of the last whole commit"
    )]
    Unusable {
        /// Why the commit failed.
        cause: String,
    },
    /// sled holds less than what was folded into it.
    #[error(
        "state store: {dir} holds {found}, but {expected} was folded into it and made durable: its files were damaged, truncated or replaced, so nothing was changed; restore the state dir from a backup, or move it aside and start a new one"
    )]
    Behind {
        /// sled's directory.
        dir: PathBuf,
        /// What sled holds.
        found: String,
        /// What the fold marker says it must hold.
        expected: String,
    },
}

impl StoreError {
    /// The store's files are damaged (sled, the redo log or a record cannot be read
    /// as written, or sled holds less than was folded into it), as opposed to a
    /// disk, permission or lock problem that running again can fix.
    pub fn is_damage(&self) -> bool {
        match self {
            // `Store::open` reports sled's corruption as `Damaged`, not `Open`.
            Self::Io { cause, .. } => matches!(cause, sled::Error::Corruption { .. }),
            Self::Damaged { .. }
            | Self::Decode(_)
            | Self::Corrupt(_)
            | Self::LogDamaged { .. }
            | Self::Behind { .. } => true,
            Self::Open { .. } | Self::Log { .. } | Self::OldLayout { .. } | Self::Unusable { .. } => false,
        }
    }
}

impl From<LogError> for StoreError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::Io { path, cause } => Self::Log { path, cause },
            LogError::Damaged { path, offset, commit } => Self::LogDamaged { path, offset, commit },
            LogError::Corrupt(what) => Self::Corrupt(format!("redo log: {what}")),
            LogError::Decode(e) => Self::Decode(e),
        }
    }
}

type Result<T> = std::result::Result<T, StoreError>;

/// The sled-backed state store of one pipeline.
pub struct Store {
    /// sled, and what a fold on another thread needs of it.
    folder: Folder,
    log: RedoLog,
    /// Shared with the [`StoreReader`]s of a batch's 0.2 calls; a commit changes it in
    /// place once they are gone (`Arc::make_mut`, which copies only if one is left).
    overlay: Arc<Overlay>,
    /// The overlay a fold on its own thread is writing into sled (reads look here after
    /// `overlay`, before sled); retired (`retired_last`) when that fold is done.
    folding: Option<Arc<Overlay>>,
    /// A folded overlay, emptied, whose memory the next one takes over (see
    /// [`Store::fresh_overlay`]).
    spare: Option<Overlay>,
    /// That fold's thread: `Ok(false)` when it stopped short as a crash would (tests).
    fold_thread: Option<JoinHandle<Result<bool>>>,
    /// Tests only: where a fold on its own thread stops, as a crash would.
    background_chunks_max: usize,
    /// The last committed checkpoint (folded or in the log).
    checkpoint: Option<Checkpoint>,
    /// The last plan written, as sled holds it (read once at open): a read of sled
    /// per batch waited whenever a fold was applying a chunk.
    plan: Option<BatchPlan>,
    /// The sequence number of the last commit.
    seq: u64,
    /// The overlay's memory budget before a fold.
    buffer_bytes: u64,
    /// The log's size budget before a fold.
    log_bytes: u64,
    /// Tests only: the next fold fails before it writes anything.
    fail_next_fold: std::sync::atomic::AtomicBool,
    /// The records of the last commit, encoded once for the log and the overlay.
    encoded: EncodedRecords,
    /// Why the store refuses every call: a commit failed after its changes went into
    /// the overlay (see [`Store::commit`]).
    unusable: Option<String>,
    /// How many overlays were retired (folded, then no longer read): the records a
    /// [`PageReader`] read are good while this has not moved, or has moved by one and
    /// `retired_last` is kept.
    retired: Arc<AtomicU64>,
    /// The overlay retired last, until the batch after its retirement has loaded its
    /// records (the next [`Store::fold_if_due`]): that batch's keys were read ahead
    /// before it, and for those it holds, it has what sled has now.
    retired_last: Option<Arc<Overlay>>,
}

/// The records of a commit's changes, encoded one after the other.
#[derive(Debug, Default)]
struct EncodedRecords {
    bytes: Vec<u8>,
    /// Where each change's encoding ends (a deletion's is empty).
    ends: Vec<usize>,
}

impl EncodedRecords {
    /// Encodes the records of `changes`, asserting what the store takes of each (the
    /// storage boundary): a key within `KEY_BYTES_MAX`, an empty record only as a delete.
    fn fill(&mut self, changes: &[KeyChange]) {
        if self.bytes.capacity() > 4 << 20 {
            *self = Self::default();
        }
        self.bytes.clear();
        self.ends.clear();
        for change in changes {
            assert!(change.key.len() <= KEY_BYTES_MAX, "over-long key reached the store");
            if let Some(record) = &change.after {
                assert!(!record.is_empty(), "empty record for key {:?} reached the store", change.key);
                codec::encode_into(&mut self.bytes, record);
            }
            self.ends.push(self.bytes.len());
        }
    }

    /// `changes`, which [`EncodedRecords::fill`] took, with their encoded records.
    fn changes<'a>(&'a self, changes: &'a [KeyChange]) -> impl Iterator<Item = EncodedChange<'a>> + 'a {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        changes.iter().zip(starts.zip(&self.ends)).map(|(change, (start, &end))| EncodedChange {
            key: &change.key,
            record: change.after.as_ref().map(|_| &self.bytes[start..end]),
        })
    }
}

/// Committed state as a batch's 0.2 calls read it: point reads and prefix ranges over
/// the overlay, the overlay a fold is writing, and sled (see [`Store::reader`]).
pub struct StoreReader {
    tree: Arc<sled::Tree>,
    pages: Arc<parking_lot::Mutex<()>>,
    overlay: Arc<Overlay>,
    folding: Option<Arc<Overlay>>,
    /// What sled holds under the prefixes read ahead (see [`StoreReader::read_ahead`]):
    /// by prefix, all its keys and records, in key order.
    ahead: std::collections::HashMap<String, Vec<(String, KeyRecord)>, foldhash::fast::RandomState>,
}

impl std::fmt::Debug for StoreReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreReader").finish_non_exhaustive()
    }
}

impl StoreReader {
    /// Reads ahead, in one pass over the pages in key order, the committed state under
    /// each of `prefixes` (each ends with its only `\0`, as a 0.2 group key's entries
    /// do): what sled holds, with the overlays' changes over it. Later reads of those
    /// keys find it here instead of searching sled and probing the overlays for each.
    /// A batch's 0.2 calls read each of their group keys a few times, at random places
    /// of the store, and a new sled search copied a whole leaf each time (most of a
    /// call at a million keys). A prefix over more than [`READ_AHEAD_PAGES_MAX`] pages
    /// (a large list or map, of which a call reads little), and the prefixes after
    /// [`READ_AHEAD_BYTES_MAX`] are read, are left to sled.
    ///
    /// The records are what sled held when they were read, under the reader's
    /// overlays, which no commit changes (see [`Store::reader`]). A fold applying
    /// chunks meanwhile changes in sled only the records of the keys of the overlay it
    /// folds, whose records replace sled's here; its splits and removals of pages
    /// change no record.
    pub fn read_ahead<'p>(&mut self, prefixes: impl Iterator<Item = &'p str>) -> Result<()> {
        let mut prefixes: Vec<&str> = prefixes.filter(|p| p.ends_with('\0')).collect();
        crate::key_order::sort_by_key(&mut prefixes, |p| p.as_bytes());
        self.ahead.reserve(prefixes.len());
        let mut cursor = PageCursor::new(&self.tree);
        let mut bytes = 0;
        for prefix in prefixes {
            if bytes > READ_AHEAD_BYTES_MAX {
                break;
            }
            let mut entries = Vec::new();
            let (mut from, mut pages) = (prefix.to_owned(), 0);
            let whole = loop {
                let Some((raw, page)) = cursor.page_of(&from)? else { break true };
                for entry in Page::entries_from(page, &from)? {
                    let (key, record) = entry?;
                    if !key.starts_with(prefix) {
                        break;
                    }
                    bytes += key.len() + record.value.as_ref().map_or(0, Vec::len) + 64;
                    entries.push((key.to_owned(), record));
                }
                pages += 1;
                // The page holds the keys below its fence: is the prefix's range past it?
                match std::str::from_utf8(&raw[1..]) {
                    Ok(fence) if fence.starts_with(prefix) && pages < READ_AHEAD_PAGES_MAX => from = fence.to_owned(),
                    Ok(fence) if fence.starts_with(prefix) => break false,
                    // A fence above the prefix's keys (the last page's is not UTF-8).
                    _ => break true,
                }
            };
            if whole {
                for overlay in self.folding.iter().chain([&self.overlay]) {
                    for (key, record) in overlay.range_from(prefix).take_while(|(k, _)| k.starts_with(prefix)) {
                        let at = entries.binary_search_by(|(k, _)| k.as_str().cmp(key));
                        let record = record.map(|bytes| codec::decode("overlay record", bytes)).transpose()?;
                        match (at, record) {
                            (Ok(i), Some(record)) => entries[i].1 = record,
                            (Ok(i), None) => drop(entries.remove(i)),
                            (Err(i), Some(record)) => {
                                bytes += key.len() + record.value.as_ref().map_or(0, Vec::len) + 64;
                                entries.insert(i, (key.to_owned(), record));
                            }
                            (Err(_), None) => {}
                        }
                    }
                }
                self.ahead.insert(prefix.to_owned(), entries);
            }
        }
        Ok(())
    }

    /// The committed entries under the prefix `key` starts with, if they were read
    /// ahead: all of them, in key order.
    fn read_ahead_for(&self, key: &str) -> Option<&[(String, KeyRecord)]> {
        let prefix = &key[..=memchr::memchr(0, key.as_bytes())?];
        self.ahead.get(prefix).map(Vec::as_slice)
    }

    /// The committed record of `key`.
    pub fn get(&self, key: &str) -> Result<Option<KeyRecord>> {
        if let Some(entries) = self.read_ahead_for(key) {
            let found = entries.binary_search_by(|(k, _)| k.as_str().cmp(key));
            return Ok(found.ok().map(|i| entries[i].1.clone()));
        }
        let buffered = self.overlay.get(key).or_else(|| self.folding.as_ref()?.get(key));
        if let Some(record) = buffered {
            return Ok(record.map(|bytes| codec::decode("overlay record", bytes)).transpose()?);
        }
        match PageCursor::new(&self.tree).page_of(key)? {
            Some((_, bytes)) => Ok(Page::lookup(bytes, key)?),
            None => Ok(None),
        }
    }

    /// The committed records of the keys that start with `prefix`, in key order: at
    /// most `limit + 1`, so that a caller sees when there are more than `limit`. It
    /// reads the pages of the range only, and the overlays' composite keys from
    /// `prefix` on (`prefix` must hold a `\0`, as the keys of 0.2 state do).
    pub fn scan_prefix(&self, prefix: &str, limit: usize) -> Result<Vec<(String, KeyRecord)>> {
        debug_assert!(prefix.contains('\0'), "a prefix scan of keys the overlay does not order");
        if let Some(entries) = self.read_ahead_under(prefix) {
            return Ok(entries.take(limit.saturating_add(1)).cloned().collect());
        }
        self.scan(prefix, |k| k.starts_with(prefix), limit)
    }

    /// The committed entries that start with `prefix`, in key order, when they were
    /// read ahead.
    fn read_ahead_under<'a>(&'a self, prefix: &'a str) -> Option<impl Iterator<Item = &'a (String, KeyRecord)> + 'a> {
        let entries = self.read_ahead_for(prefix)?;
        let first = entries.partition_point(|(k, _)| k.as_str() < prefix);
        Some(entries[first..].iter().take_while(move |(k, _)| k.starts_with(prefix)))
    }

    /// The committed keys that start with `prefix` (which holds a `\0`), in key order,
    /// when they were read ahead ([`StoreReader::read_ahead`]); `None` when they were
    /// not. Nothing is copied, as a count needs: [`StoreReader::scan_prefix`] gives
    /// the records.
    pub fn keys_with_prefix<'a>(&'a self, prefix: &'a str) -> Option<impl Iterator<Item = &'a str> + 'a> {
        Some(self.read_ahead_under(prefix)?.map(|(k, _)| k.as_str()))
    }

    /// The committed records of the keys in `[start, end)`, in key order: at most
    /// `limit + 1`, as [`StoreReader::scan_prefix`] (every key in the range must hold a
    /// `\0`, as the expiry index's do).
    pub fn scan_range(&self, start: &str, end: &str, limit: usize) -> Result<Vec<(String, KeyRecord)>> {
        self.scan(start, |k| k < end, limit)
    }

    /// The keys from `start` on while `within` holds (it holds for a prefix of the
    /// keys from `start`), from the overlays and sled.
    fn scan(&self, start: &str, within: impl Fn(&str) -> bool, limit: usize) -> Result<Vec<(String, KeyRecord)>> {
        let want = limit.saturating_add(1);
        let mut buffered: std::collections::BTreeMap<&str, Option<&[u8]>> = std::collections::BTreeMap::new();
        if let Some(folding) = &self.folding {
            buffered.extend(folding.range_from(start).take_while(|(k, _)| within(k)));
        }
        buffered.extend(self.overlay.range_from(start).take_while(|(k, _)| within(k)));
        let mut found: std::collections::BTreeMap<String, KeyRecord> = std::collections::BTreeMap::new();
        // Enough of sled's to fill `want` whatever the overlays delete.
        let stored_max = want.saturating_add(buffered.len());
        self.scan_sled(start, &within, &buffered, stored_max, &mut found)?;
        for (key, record) in buffered {
            if let Some(bytes) = record {
                found.insert(key.to_owned(), codec::decode("overlay record", bytes)?);
            }
        }
        Ok(found.into_iter().take(want).collect())
    }

    /// The part of [`StoreReader::scan`] that reads sled: up to `stored_max` records
    /// of keys not in `buffered`.
    fn scan_sled(
        &self,
        start: &str,
        within: &impl Fn(&str) -> bool,
        buffered: &std::collections::BTreeMap<&str, Option<&[u8]>>,
        stored_max: usize,
        found: &mut std::collections::BTreeMap<String, KeyRecord>,
    ) -> Result<()> {
        let _walk = self.pages.lock();
        'pages: for entry in self.tree.range(pages_above(start)) {
            let (raw, bytes) = entry.map_err(io("read a page"))?;
            for entry in Page::entries_from(&bytes, start)? {
                let (key, record) = entry?;
                if !within(key) {
                    break 'pages;
                }
                if !buffered.contains_key(key) {
                    found.insert(key.to_owned(), record);
                    if found.len() >= stored_max {
                        break 'pages;
                    }
                }
            }
            // The page holds the keys below its fence: past the range, so are the next.
            match std::str::from_utf8(&raw[1..]) {
                Ok(fence) if within(fence) => {}
                _ => break,
            }
        }
        Ok(())
    }
}

/// Reads the records sled holds for a batch's keys ahead of the batch: on the input
/// thread, while the batch before it runs (see [`Store::page_reader`]). A batch over a
/// million keys touches every page of the store, and that walk was a quarter of the
/// batch loop's time. It holds sled open only while it reads: once the store and what
/// shares its tree (a fold on its own thread, a [`StoreReader`]) are gone, it reads
/// nothing.
#[derive(Clone)]
pub struct PageReader {
    tree: std::sync::Weak<sled::Tree>,
    pages: Arc<parking_lot::Mutex<()>>,
    retired: Arc<AtomicU64>,
}

impl std::fmt::Debug for PageReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageReader").finish_non_exhaustive()
    }
}

/// The keys [`PageReader::read`] looks up in one turn of the lock over the pages, after
/// which it hands the lock to a waiting fold chunk or batch loop: a walk over a batch
/// of a million-key store holds it for tens of milliseconds, and the batch loop's
/// search for expired timers waited for it (a second in all over 10M events and 1M
/// keys). About 400 pages at a million keys (1 024 keys a turn ran 1–2% slower); a
/// few keys in tests, so that their walks take turns.
const READ_AHEAD_KEYS_PER_TURN: usize = if cfg!(test) { 4 } else { 4096 };

/// The most record bytes [`PageReader::read`] holds for a batch: the keys after it are
/// read by [`Store::get_many`] itself.
const STORED_AHEAD_BYTES_MAX: usize = 16 << 20;

impl PageReader {
    /// Reads into `into` (emptied first) the records sled holds for `keys`, whether or
    /// not an overlay holds them too; `order` as for [`Store::get_many`], which takes
    /// them. sled alone is read, with no overlay: what a commit meanwhile puts in the
    /// overlay is found there first, and what a fold meanwhile writes into sled comes
    /// from an overlay that `get_many` either still reads (the one retired last
    /// included) or refuses these records for. The pages are walked by turns of the
    /// lock over them ([`READ_AHEAD_KEYS_PER_TURN`]); a key whose record would pass
    /// [`STORED_AHEAD_BYTES_MAX`], and those after it, are left unread.
    pub fn read(&self, keys: &[&str], order: Option<&[u32]>, into: &mut StoredAhead) -> Result<()> {
        into.clear();
        // Before any page is read: a fold that retires its overlay after this may have
        // written pages the walk read before.
        into.read_at = Some((Arc::clone(&self.retired), self.retired.load(Ordering::Acquire)));
        into.spans.resize(keys.len(), Span::Unread);
        let Some(tree) = self.tree.upgrade() else {
            // The store is gone: its batch loop will not ask.
            return Ok(());
        };
        let all = in_key_order(keys, (0..keys.len()).collect(), order);
        let StoredAhead { bytes, spans, .. } = into;
        let mut walk = self.pages.lock();
        let mut full = false;
        for (n, turn) in all.chunks(READ_AHEAD_KEYS_PER_TURN).enumerate() {
            if n > 0 {
                // Each turn searches sled anew: a fold may apply a chunk between two.
                parking_lot::MutexGuard::bump(&mut walk);
            }
            walk_pages(&tree, keys, turn, spans, |span, i, page| {
                let record = page.map(|page| Page::lookup_raw(page, keys[i])).transpose()?.flatten();
                let start = bytes.len();
                *span = match record.map(|record| (record, start + record.len())) {
                    // Within `STORED_AHEAD_BYTES_MAX`, so the ends fit in a u32.
                    Some((record, end)) if end <= STORED_AHEAD_BYTES_MAX => {
                        bytes.extend_from_slice(record);
                        Span::At(start as u32, end as u32)
                    }
                    Some(_) => {
                        full = true;
                        return Ok(false);
                    }
                    None => Span::Absent,
                };
                Ok(true)
            })?;
            if full {
                break;
            }
        }
        Ok(())
    }
}

/// What sled held for a batch's keys, read ahead of the batch ([`PageReader::read`]).
#[derive(Debug, Default)]
pub struct StoredAhead {
    /// The store's count of retired overlays when the pages were read, and the count.
    read_at: Option<(Arc<AtomicU64>, u64)>,
    /// The records found, encoded, one after the other.
    bytes: Vec<u8>,
    /// For each key, in the order given, its record in `bytes` or why it has none.
    spans: Vec<Span>,
}

#[derive(Debug, Clone, Copy)]
enum Span {
    /// Not read (past [`STORED_AHEAD_BYTES_MAX`]).
    Unread,
    /// sled has no record of the key.
    Absent,
    /// The record's range in [`StoredAhead::bytes`].
    At(u32, u32),
}

impl StoredAhead {
    /// Forgets what was read (its memory is kept for the next batch).
    pub fn clear(&mut self) {
        self.read_at = None;
        self.bytes.clear();
        self.spans.clear();
    }

    /// How many overlays retired since the records were read, if they were read from
    /// the store that counts its retired overlays in `retired`. Until one retires, a
    /// key that no overlay holds has in sled the record it had then.
    fn age(&self, retired: &Arc<AtomicU64>) -> Option<u64> {
        let (counter, at) = self.read_at.as_ref().filter(|(counter, _)| Arc::ptr_eq(counter, retired))?;
        Some(counter.load(Ordering::Acquire).saturating_sub(*at))
    }

    /// The `i`th key's encoded record as sled held it (`Some(None)`: none), as the
    /// overlays answer; `None` when it was not read (or there is no `i`th key).
    fn record(&self, i: usize) -> Option<Option<&[u8]>> {
        match *self.spans.get(i)? {
            Span::Unread => None,
            Span::Absent => Some(None),
            Span::At(start, end) => Some(Some(&self.bytes[start as usize..end as usize])),
        }
    }
}

impl Drop for Store {
    /// A fold on its own thread is waited for, so that the next open finds sled and
    /// the logs as that fold left them; what it returns the next open would find too.
    fn drop(&mut self) {
        if let Some(thread) = self.fold_thread.take() {
            let _done = thread.join();
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("seq", &self.seq).field("log_bytes", &self.log.len()).finish_non_exhaustive()
    }
}

/// sled's database and tree, with what a fold needs besides: shared by the store and
/// the fold on its own thread.
#[derive(Clone)]
struct Folder {
    /// sled's directory (the redo logs and the fold marker are in it too).
    dir: PathBuf,
    db: sled::Db,
    /// Shared with the [`PageReader`]s, which hold it weakly: sled stays open after
    /// the store (and a fold it started) is gone only while one reads.
    tree: Arc<sled::Tree>,
    /// Held while a fold applies a chunk and while [`Store::expired_timers`] walks the
    /// deadline index and the pages it names, so that the walk sees each chunk whole
    /// (sled makes each single read atomic, not a walk); also while
    /// [`Store::get_many`] reads a batch's pages, which would otherwise wait for each
    /// chunk applied on its way, and by turns while a [`PageReader`] does (each turn
    /// searches sled anew). parking_lot's, which hands it over fairly between turns.
    pages: Arc<parking_lot::Mutex<()>>,
}

/// The most pages [`StoreReader::read_ahead`] reads for one prefix: the entries of a
/// group key usually fit in one.
const READ_AHEAD_PAGES_MAX: usize = 4;

/// About the most memory [`StoreReader::read_ahead`] holds for a batch (keys, values
/// and their bookkeeping); the prefixes after it are read from sled as asked for.
const READ_AHEAD_BYTES_MAX: usize = 32 << 20;

/// Page bytes written into sled by one `apply_batch` of a fold, about (a few pages in
/// tests, so that their folds take several chunks): a chunk is held in memory whole,
/// and sled blocks every read of the store while it applies one. 4 MiB chunks made the
/// batch loop wait for them; at 10M events over 1M sensors 1 MiB ran 3–7% faster and
/// 256 KiB no better (BENCHMARKS.md).
const FOLD_CHUNK_BYTES: usize = if cfg!(test) { 3 * PAGE_BYTES_MAX } else { 1 << 20 };

/// Collection steps after each chunk of a fold (each frees up to 8 bags of 64 objects
/// once their epoch has passed).
const GARBAGE_COLLECTS_PER_CHUNK: usize = 1250;

/// sled reports a held lock as a custom `Other` error wrapping `WouldBlock`.
fn is_lock_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("could not acquire lock")
}

fn io(what: &'static str) -> impl FnOnce(sled::Error) -> StoreError {
    move |cause| StoreError::Io { what, cause }
}

/// The fence of the last page: above every key (no UTF-8 string holds the byte 0xFF).
const LAST_FENCE: &[u8] = &[0xFF];

/// A page's sled key: the prefix and the page's fence, the first key above its range
/// (the next page's first key when it was split off). A key's page is the first page
/// whose fence is above it: one forward step in sled.
fn page_key(fence: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + fence.len());
    k.push(PREFIX_PAGE);
    k.extend_from_slice(fence);
    k
}

/// Maps an i64 to 8 bytes whose lexicographic order is the numeric order.
fn ordered_i64(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1 << 63)).to_be_bytes()
}

fn from_ordered_i64(b: [u8; 8]) -> i64 {
    (u64::from_be_bytes(b) ^ (1 << 63)) as i64
}

fn index_key(deadline_ms: i64, fence: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + fence.len());
    k.push(PREFIX_TIMER);
    k.extend_from_slice(&ordered_i64(deadline_ms));
    k.extend_from_slice(fence);
    k
}

/// A deadline-index entry: a page's earliest deadline and the page's fence.
fn parse_index_key(raw: &[u8]) -> Result<(i64, Vec<u8>)> {
    if raw.len() < 10 || raw[0] != PREFIX_TIMER {
        return Err(StoreError::Corrupt(format!("deadline index entry of {} bytes", raw.len())));
    }
    let mut deadline = [0u8; 8];
    deadline.copy_from_slice(&raw[1..9]);
    Ok((from_ordered_i64(deadline), raw[9..].to_vec()))
}

/// Removes the files sled was still writing when its process stopped, and says
/// whether there were any; sled 0.34 refused to open over either after a kill -9
/// ("corrupted data at file offset None"):
/// - a snapshot: sled writes `snap.<lsn>.generating`, syncs it and renames it to
///   `snap.<lsn>` (at every open that finds new log), but reads the newest `snap.`
///   file of either name. Without it, sled reads its last finished snapshot and
///   replays its log from there, as after any crash;
/// - its `conf` (storage parameters, written once, at creation: the contents, then a
///   checksum) cut short before the checksum. sled writes it again from the `Config`,
///   with the storage parameters of a new store ([`SEGMENT_BYTES`]); sled writes its
///   `conf` before it creates its data file, so only a store that lost it in a power
///   failure could have been created with others.
///
/// Called only after sled refused to open for corruption, so after it held the
/// directory's lock: no other process is writing either.
fn drop_unfinished_sled_files(dir: &Path) -> Result<bool> {
    let fs = |what| move |cause| StoreError::Io { what, cause: sled::Error::Io(cause) };
    let listed = std::fs::read_dir(dir).map_err(fs("list the state dir"))?;
    let mut dropped = false;
    for entry in listed {
        let path = entry.map_err(fs("list the state dir"))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let unfinished = if name.starts_with("snap.") && name.ends_with(".generating") {
            true
        } else if name == "conf" {
            let bytes = std::fs::read(&path).map_err(fs("read sled's conf"))?;
            // sled reads a conf of 8 bytes or fewer as none and writes it again.
            bytes.len() > 8 && whole_conf(&bytes).is_none()
        } else {
            false
        };
        if unfinished {
            std::fs::remove_file(&path).map_err(fs("remove a file sled had not finished"))?;
            tracing::warn!("removed {}: sled had not finished writing it when it stopped", path.display());
            dropped = true;
        }
    }
    Ok(dropped)
}

/// The contents of sled's `conf` when it is whole: more than 8 bytes, the last 4 the
/// checksum of the others.
fn whole_conf(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.len() <= 8 {
        return None;
    }
    let (contents, crc) = bytes.split_at(bytes.len() - 4);
    (crc32fast::hash(contents).to_le_bytes() == crc).then_some(contents)
}

/// The segment size of the sled store in `dir`, from its whole `conf` (sled's storage
/// parameters, written at its creation), or [`SEGMENT_BYTES`] for a new store. A
/// `conf` sled had not finished is dropped and written again at open
/// ([`drop_unfinished_sled_files`]), with this segment size.
fn segment_bytes(dir: &Path) -> usize {
    std::fs::read(dir.join("conf"))
        .ok()
        .as_deref()
        .and_then(whole_conf)
        .and_then(|contents| {
            let text = std::str::from_utf8(contents).ok()?;
            text.lines().find_map(|line| line.strip_prefix("segment_size: ")?.trim().parse().ok())
        })
        .unwrap_or(SEGMENT_BYTES)
}

impl Store {
    /// Opens (or creates) the store in `dir`, replaying and folding the redo log.
    /// `cache_bytes` is sled's page cache; the committed changes are folded into sled
    /// when they take more than about `buffer_bytes` of memory or `log_bytes` of log.
    pub fn open(dir: &Path, cache_bytes: u64, buffer_bytes: u64, log_bytes: u64) -> Result<Self> {
        let open_err = |cause| match cause {
            sled::Error::Corruption { .. } => StoreError::Damaged { path: dir.to_owned(), cause },
            cause => StoreError::Open { path: dir.to_owned(), cause },
        };
        let config = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .segment_size(segment_bytes(dir))
            // Folds flush sled themselves; the background flush only bounds what a
            // crash can lose of the other writes (plans, the pipeline identity).
            .flush_every_ms(Some(1000));
        // sled releases its file lock only when its background flusher has exited,
        // shortly after the `Db` is dropped; a reopen within the same process may
        // have to wait for that.
        let mut attempts = 0;
        let mut unfinished_dropped = false;
        let db = loop {
            match config.open() {
                Err(sled::Error::Io(e)) if is_lock_error(&e) && attempts < OPEN_LOCK_RETRIES => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(sled::Error::Corruption { .. }) if !unfinished_dropped && drop_unfinished_sled_files(dir)? => {
                    unfinished_dropped = true;
                }
                other => break other.map_err(open_err)?,
            }
        };
        let tree = db.open_tree("groupstate").map_err(open_err)?;
        if tree.scan_prefix([PREFIX_OLD_STATE]).next().is_some() {
            return Err(StoreError::OldLayout { dir: dir.to_owned() });
        }
        let folded: u64 = read_meta(&tree, "folded sequence number", META_FOLDED)?.unwrap_or(0);
        let checkpoint = read_meta(&tree, "checkpoint", META_CHECKPOINT)?;
        let plan = read_meta(&tree, "batch plan", META_PLAN)?;
        check_fold_mark(dir, folded, checkpoint.as_ref())?;
        let mut overlay = Overlay::default();
        let (mut seq, mut last_checkpoint) = (folded, checkpoint);
        let mut replay = |commit: redo::Replayed| {
            if commit.seq <= folded {
                // Folded already: the run stopped between the fold and emptying the log.
                return Ok(());
            }
            if commit.seq != seq + 1 {
                return Err(StoreError::Corrupt(format!(
                    "redo log commit {} follows commit {seq}: a commit is missing",
                    commit.seq
                )));
            }
            for (key, after) in &commit.changes {
                overlay.apply(key, after.as_ref());
            }
            seq = commit.seq;
            last_checkpoint = Some(commit.checkpoint);
            Ok(())
        };
        // A log that a fold on its own thread had not finished folding holds the
        // commits before those of `redo.log`.
        let folding_log = dir.join(REDO_LOG_FOLDING);
        if folding_log.exists() {
            RedoLog::open(&folding_log, &mut replay)?;
        }
        let log = RedoLog::open(&dir.join(REDO_LOG), &mut replay)?;
        let mut store = Self {
            folder: Folder { dir: dir.to_owned(), db, tree: Arc::new(tree), pages: Arc::default() },
            log,
            overlay: Arc::new(overlay),
            folding: None,
            spare: None,
            fold_thread: None,
            background_chunks_max: usize::MAX,
            checkpoint: last_checkpoint,
            plan,
            seq,
            buffer_bytes,
            log_bytes,
            fail_next_fold: false.into(),
            encoded: EncodedRecords::default(),
            unusable: None,
            retired: Arc::default(),
            retired_last: None,
        };
        store.fold()?;
        Ok(store)
    }

    /// The last committed checkpoint, or `None` for a new state dir.
    pub fn checkpoint(&self) -> Result<Option<Checkpoint>> {
        Ok(self.checkpoint.clone())
    }

    /// The pipeline identity recorded at the first run, if any.
    pub fn pipeline_identity(&self) -> Result<Option<PipelineIdentity>> {
        read_meta(&self.folder.tree, "pipeline identity", META_PIPELINE)
    }

    /// Records the pipeline identity (first run only).
    pub fn set_pipeline_identity(&self, id: &PipelineIdentity) -> Result<()> {
        self.folder.tree.insert(META_PIPELINE, codec::encode(id)).map_err(io("write pipeline identity"))?;
        Ok(())
    }

    /// The plugin world whose state this dir holds: `1` (`groupstate:plugin@0.1.0`,
    /// also for a dir that predates the record) or `2`; `None` for a new dir.
    pub fn state_api(&self) -> Result<Option<u32>> {
        // Dirs made before the world file kept it in sled.
        let recorded = match read_meta::<u32>(&self.folder.tree, "state api", META_STATE_API)? {
            Some(api) => Some(api),
            None => self.world()?.state_api,
        };
        Ok(recorded.or(self.checkpoint.is_some().then_some(1)))
    }

    /// Records the plugin world whose state this dir holds (first run only), durably
    /// before the first commit: a dir whose checkpoint survived a crash without it
    /// would read as 0.1.
    pub fn set_state_api(&self, api: u32) -> Result<()> {
        self.set_world(World { state_api: Some(api), ..self.world()? })
    }

    /// The layout version of a 0.2 dir's entries (see `keyed::KEYED_LAYOUT`), `None`
    /// for a dir from before the record.
    pub fn keyed_layout(&self) -> Result<Option<u32>> {
        match read_meta::<u32>(&self.folder.tree, "0.2 layout", META_KEYED_LAYOUT)? {
            Some(layout) => Ok(Some(layout)),
            None => Ok(self.world()?.keyed_layout),
        }
    }

    /// Records the layout of a new 0.2 dir's entries, durably (as `set_state_api`).
    pub fn set_keyed_layout(&self, layout: u32) -> Result<()> {
        self.set_world(World { keyed_layout: Some(layout), ..self.world()? })
    }

    /// The world file: what the dir's state is, written beside sled's files (not into
    /// sled, which a dir's state reaches only through folds: a sled flush on a new dir
    /// that a kill cut short could leave sled unopenable).
    fn world(&self) -> Result<World> {
        let path = self.folder.dir.join(WORLD_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(World::default()),
            Err(cause) => return Err(StoreError::Log { path, cause }),
        };
        serde_json::from_slice(&bytes).map_err(|e| StoreError::Log {
            path: path.clone(),
            cause: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("damaged: {e}")),
        })
    }

    fn set_world(&self, world: World) -> Result<()> {
        let bytes = serde_json::to_vec(&world).unwrap_or_default();
        fold_mark::replace_durably(&self.folder.dir, WORLD_FILE, WORLD_TMP, &bytes)
            .map_err(|cause| StoreError::Log { path: self.folder.dir.join(WORLD_FILE), cause })
    }

    /// A reader of the committed state that owns what it reads (sled's tree and the
    /// overlays), for the handle of a 0.2 call. Drop it before the next commit: a
    /// commit while one is alive copies the overlay.
    pub fn reader(&self) -> Result<StoreReader> {
        self.usable()?;
        Ok(StoreReader {
            tree: Arc::clone(&self.folder.tree),
            pages: self.folder.pages.clone(),
            overlay: Arc::clone(&self.overlay),
            folding: self.folding.clone(),
            ahead: Default::default(),
        })
    }

    /// A reader of the records sled holds for a batch's keys, for the input thread to
    /// read ahead ([`PageReader`]).
    pub fn page_reader(&self) -> PageReader {
        PageReader {
            tree: Arc::downgrade(&self.folder.tree),
            pages: self.folder.pages.clone(),
            retired: Arc::clone(&self.retired),
        }
    }

    /// An error once a commit failed after its changes went into the overlay (see
    /// [`Store::commit`]): every call that reads, folds or writes refuses then.
    fn usable(&self) -> Result<()> {
        match &self.unusable {
            Some(cause) => Err(StoreError::Unusable { cause: cause.clone() }),
            None => Ok(()),
        }
    }

    /// The planned but uncommitted batch, if a run stopped in the middle of one. A
    /// plan stays in sled after its batch commits, until the next plan replaces it;
    /// such a plan is not pending.
    pub fn pending_plan(&self) -> Result<Option<BatchPlan>> {
        let next = self.checkpoint.as_ref().map_or(0, |c| c.next_batch_id);
        Ok(self.plan.clone().filter(|plan| plan.batch_id >= next))
    }

    /// Writes the plan of the batch about to run (before any of its effects).
    pub fn write_plan(&mut self, plan: &BatchPlan) -> Result<()> {
        assert!(plan.start_offset <= plan.end_offset, "plan with a negative range: {plan:?}");
        self.usable()?;
        self.folder.tree.insert(META_PLAN, codec::encode(plan)).map_err(io("write batch plan"))?;
        self.plan = Some(plan.clone());
        Ok(())
    }

    /// Loads a key's committed record.
    pub fn get(&self, key: &str) -> Result<Option<KeyRecord>> {
        let mut out = Vec::with_capacity(1);
        self.get_many(&[key], None, None, &mut out)?;
        Ok(out.pop().flatten())
    }

    /// Appends the committed records of `keys` to `out`, in the order given (`out` is
    /// the caller's, so that a batch loop can keep its allocation; after an error it
    /// holds a partial answer, to be discarded). The keys not in
    /// the overlay are looked up in key order, each page read from sled once for all
    /// of its keys: a batch over a million keys touches each page once, not once per
    /// key. `order`, when the caller has it, numbers `keys` in key order (a batch's
    /// groups come with theirs, sorted on the input thread); without it, or when it is
    /// not that order, the keys are sorted here. `ahead`, the records sled held for
    /// `keys` read ahead on the input thread ([`PageReader::read`]), answers for the
    /// keys not in the overlays when no overlay retired since it was read, or one that
    /// is still kept (`retired_last`), which answers for its keys.
    pub fn get_many(
        &self,
        keys: &[&str],
        order: Option<&[u32]>,
        ahead: Option<&StoredAhead>,
        out: &mut Vec<Option<KeyRecord>>,
    ) -> Result<()> {
        self.usable()?;
        // Read ahead before the last retirement: that overlay has the keys it holds.
        let (ahead, since) = match ahead.filter(|a| a.spans.len() == keys.len()).map(|a| (a, a.age(&self.retired))) {
            Some((ahead, Some(0))) => (Some(ahead), None),
            Some((ahead, Some(1))) if self.retired_last.is_some() => (Some(ahead), self.retired_last.as_deref()),
            _ => (None, None),
        };
        let base = out.len();
        out.resize(base + keys.len(), None);
        let out = &mut out[base..];
        let mut stored: Vec<usize> = Vec::with_capacity(keys.len());
        let hashes: Vec<u64> = keys.iter().map(|key| crate::overlay::hash(key)).collect();
        for (i, key) in keys.iter().enumerate() {
            self.overlay.prefetch_ahead(&hashes, i);
            for overlay in self.folding.as_deref().into_iter().chain(since) {
                overlay.prefetch_ahead(&hashes, i);
            }
            if let Some(Some([first, ..])) = ahead.and_then(|a| a.record(i + OUT_OF_ORDER_AHEAD)) {
                crate::prefetch::prefetch(first);
            }
            let buffered = self.buffered_record_hashed(key, hashes[i]).or_else(|| since?.get_hashed(key, hashes[i]));
            match (buffered, ahead.and_then(|a| a.record(i))) {
                (Some(record), _) => out[i] = record.map(|bytes| codec::decode("overlay record", bytes)).transpose()?,
                (None, Some(record)) => out[i] = record.map(|bytes| codec::decode("page record", bytes)).transpose()?,
                (None, None) => stored.push(i),
            }
        }
        if stored.is_empty() {
            return Ok(());
        }
        let stored = in_key_order(keys, stored, order);
        // A fold applies no chunk during the walk (see `Folder::pages`).
        let _walk = self.folder.pages.lock();
        walk_pages(&self.folder.tree, keys, &stored, out, |slot, i, page| {
            if let Some(page) = page {
                *slot = Page::lookup(page, keys[i])?;
            }
            Ok(true)
        })
    }

    /// Up to `limit` timers with a deadline strictly below `threshold_ms`, in
    /// (deadline, key) order.
    pub fn expired_timers(&self, threshold_ms: i64, limit: usize) -> Result<Vec<(i64, String)>> {
        self.usable()?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        // The `limit` earliest of sled's (a max-heap), from the pages whose earliest
        // deadline is below the threshold, in the order of those deadlines: once the
        // heap is full and a page's earliest deadline is past the heap's latest, no
        // later page has anything earlier.
        let mut earliest: BinaryHeap<(i64, String)> = BinaryHeap::with_capacity(limit + 1);
        // A fold on its own thread applies no chunk while the index and its pages are
        // walked: the walk would miss a page it splits or find one it removes.
        let walk = self.folder.pages.lock();
        let mut end = vec![PREFIX_TIMER];
        end.extend_from_slice(&ordered_i64(threshold_ms));
        for entry in self.folder.tree.range(vec![PREFIX_TIMER]..end) {
            let (page_min, fence) = parse_index_key(&entry.map_err(io("scan the deadline index"))?.0)?;
            if earliest.len() == limit && earliest.peek().is_some_and(|latest| page_min > latest.0) {
                break;
            }
            let page = self.read_page(&fence)?;
            for (key, record) in page.entries() {
                let Some(deadline) = record.timeout_ms.filter(|d| *d < threshold_ms) else { continue };
                if self.buffered(key) {
                    continue;
                }
                earliest.push((deadline, key.clone()));
                if earliest.len() > limit {
                    earliest.pop();
                }
            }
        }
        drop(walk);
        let mut stored = earliest.into_sorted_vec();
        if let Some(folding) = &self.folding {
            let timers = folding.timers_below(Some(threshold_ms)).filter(|(_, k)| !self.overlay.holds(k));
            stored.extend(timers.take(limit).map(|(d, k)| (d, k.to_owned())));
        }
        stored.extend(self.overlay.timers_below(Some(threshold_ms)).take(limit).map(|(d, k)| (d, k.to_owned())));
        stored.sort_unstable();
        stored.truncate(limit);
        Ok(stored)
    }

    /// The page with this fence, which the deadline index names.
    fn read_page(&self, fence: &[u8]) -> Result<Page> {
        match self.folder.tree.get(page_key(fence)).map_err(io("read a page"))? {
            Some(bytes) => Ok(Page::decode(&bytes)?),
            None => Err(StoreError::Corrupt(format!(
                "the deadline index names a missing page {:?}",
                String::from_utf8_lossy(fence)
            ))),
        }
    }

    /// Commits one batch atomically: every key change with its timer index entries,
    /// and the checkpoint (a pending plan is no longer pending once its batch id is
    /// below the checkpoint's). With `durable`, waits until it is on disk. A commit
    /// ends with the log append: folding is [`Store::fold_if_due`]'s, so that a fold
    /// that fails cannot be taken for a commit that failed. A failed commit changes
    /// nothing, except one over many keys whose changes went into the overlay while
    /// the append ran: the store then refuses every call ([`StoreError::Unusable`]).
    pub fn commit(&mut self, changes: &[KeyChange], checkpoint: &Checkpoint, durable: bool) -> Result<()> {
        self.usable()?;
        // Checks each change as it encodes it: one pass over megabytes of changes.
        self.encoded.fill(changes);
        let overlay = Arc::make_mut(&mut self.overlay);
        let (log, encoded, seq) = (&mut self.log, &self.encoded, self.seq + 1);
        let apply = |overlay: &mut Overlay| {
            let hashes: Vec<u64> = changes.iter().map(|change| crate::overlay::hash(&change.key)).collect();
            for (i, (encoded, change)) in encoded.changes(changes).zip(changes).enumerate() {
                overlay.prefetch_ahead(&hashes, i);
                let deadline = change.after.as_ref().and_then(|r| r.timeout_ms);
                overlay.apply_encoded(encoded.key, hashes[i], encoded.record, deadline);
            }
        };
        if durable && changes.len() >= APPLY_WHILE_SYNCING_CHANGES_MIN {
            // The append waits on the disk on a thread of its own meanwhile. If it
            // fails, the overlay holds changes that are not committed, and no call may
            // read or fold them: the store refuses everything from then on.
            let appended = std::thread::scope(|scope| {
                let appended = scope.spawn(|| log.append(seq, encoded.changes(changes), checkpoint, true));
                apply(overlay);
                appended.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            });
            if let Err(e) = appended {
                self.unusable = Some(e.to_string());
                return self.usable();
            }
        } else {
            log.append(seq, encoded.changes(changes), checkpoint, durable)?;
            apply(overlay);
        }
        self.seq = seq;
        self.checkpoint = Some(checkpoint.clone());
        Ok(())
    }

    /// Starts a fold on a thread of its own when the buffered changes or the log outgrow
    /// their budget: the overlay is set aside for it (reads still see it) and the log
    /// moves aside to `redo.folding.log`, so that the next commits go on into a new
    /// overlay and log meanwhile. When the previous fold has not finished, this waits
    /// for it first, so at most two overlays are held (besides `retired_last`, which
    /// this releases first: the batch after its retirement has loaded). A fold that
    /// failed is reported here, by the call after it; every commit stays in the logs,
    /// and the next open replays them.
    pub fn fold_if_due(&mut self) -> Result<()> {
        self.usable()?;
        self.release_retired_last();
        if self.fold_thread.as_ref().is_some_and(JoinHandle::is_finished) {
            self.settle()?;
        }
        if self.overlay.bytes() <= self.buffer_bytes && self.log.len() <= self.log_bytes {
            return Ok(());
        }
        self.start_fold()
    }

    /// Starts a fold of the overlay on a thread of its own (see [`Store::fold_if_due`]).
    fn start_fold(&mut self) -> Result<()> {
        self.settle()?;
        if self.folding.is_some() {
            // A fold that failed (reported already) or stopped short (tests): its
            // overlay stays for reads, and nothing more is folded until a reopen
            // replays both logs.
            return Ok(());
        }
        self.check_injected_failure()?;
        let folding_log = self.folder.dir.join(REDO_LOG_FOLDING);
        self.log.rotate(&folding_log)?;
        let fresh = self.fresh_overlay();
        let overlay = std::mem::replace(&mut self.overlay, fresh);
        self.folding = Some(Arc::clone(&overlay));
        let (folder, checkpoint, seq, chunks_max) =
            (self.folder.clone(), self.checkpoint.clone(), self.seq, self.background_chunks_max);
        let thread = std::thread::Builder::new()
            .name("groupstate-fold".into())
            .spawn(move || {
                let done = folder.fold(&overlay, checkpoint.as_ref(), seq, chunks_max)?;
                if done {
                    redo::remove(&folding_log)?;
                }
                Ok(done)
            })
            .map_err(|cause| StoreError::Log { path: self.folder.dir.clone(), cause })?;
        self.fold_thread = Some(thread);
        Ok(())
    }

    /// Waits for the fold on its own thread, if one runs, and drops its overlay once
    /// it is done.
    fn settle(&mut self) -> Result<()> {
        let Some(thread) = self.fold_thread.take() else {
            return Ok(());
        };
        match thread.join() {
            Ok(Ok(true)) => {
                if let Some(folded) = self.folding.take() {
                    self.retire(folded);
                }
                Ok(())
            }
            // Stopped short as a crash would (tests): its overlay stays for reads.
            Ok(Ok(false)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Corrupt("the fold thread panicked; the next open replays the redo log".into())),
        }
    }

    /// Makes the next fold fail before it writes anything, as a failing disk would
    /// (the tests' seam for a fold that fails after a commit).
    #[doc(hidden)]
    pub fn fail_next_fold(&self) {
        self.fail_next_fold.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The failure [`Store::fail_next_fold`] asked for, once.
    fn check_injected_failure(&self) -> Result<()> {
        if self.fail_next_fold.swap(false, std::sync::atomic::Ordering::Relaxed) {
            return Err(StoreError::Log {
                path: self.folder.dir.clone(),
                cause: std::io::Error::other("fold failed (injected by a test)"),
            });
        }
        Ok(())
    }

    /// Writes everything committed into sled here and now (see the module doc), after
    /// the fold on its own thread if one runs, then empties the redo logs.
    fn fold(&mut self) -> Result<()> {
        self.fold_chunks(usize::MAX)
    }

    /// A fold that stops (as a crash would) after `chunks_max` chunks when the overlay
    /// has more.
    fn fold_chunks(&mut self, chunks_max: usize) -> Result<()> {
        self.usable()?;
        self.settle()?;
        if self.folding.is_some() {
            return Err(StoreError::Corrupt(
                "an earlier fold failed or stopped short; reopen the store, which replays the redo logs".into(),
            ));
        }
        let folding_log = self.folder.dir.join(REDO_LOG_FOLDING);
        if self.log.len() == 0 && !folding_log.exists() {
            // Nothing committed since the last fold (the overlay fills only through
            // the log).
            self.folder.db.flush().map_err(io("flush sled"))?;
            return Ok(());
        }
        self.check_injected_failure()?;
        if self.folder.fold(&self.overlay, self.checkpoint.as_ref(), self.seq, chunks_max)? {
            redo::remove(&folding_log)?;
            self.log.clear()?;
            let folded = std::mem::take(&mut self.overlay);
            self.retire(folded);
            self.overlay = self.fresh_overlay();
        }
        Ok(())
    }

    /// An empty overlay with room for the buffer's worth of entries: the last folded
    /// one, emptied, or a new one whose arena is reserved up to the buffer. Grown by
    /// doubling, an arena was copied and faulted in again on the way, and a new one is
    /// faulted in page by page (together a third of the time of applying a commit at a
    /// million keys); the two overlays a background fold needs are held either way.
    fn fresh_overlay(&mut self) -> Arc<Overlay> {
        if self.spare.is_none() {
            self.release_retired_last();
        }
        let overlay = self.spare.take().unwrap_or_else(|| Overlay::with_arena_capacity(self.overlay_room()));
        Arc::new(overlay)
    }

    /// The arena a new overlay reserves: the buffer, up to [`OVERLAY_RESERVED_MAX`].
    fn overlay_room(&self) -> usize {
        usize::try_from(self.buffer_bytes.min(OVERLAY_RESERVED_MAX)).unwrap_or(0)
    }

    /// Stops reading a folded overlay (sled has its records now), counting it for the
    /// [`PageReader`]s' records read before, and keeps it as `retired_last` (the one
    /// retired before goes to be recycled).
    fn retire(&mut self, folded: Arc<Overlay>) {
        self.retired.fetch_add(1, Ordering::Release);
        if let Some(before) = self.retired_last.replace(folded) {
            self.recycle(before);
        }
    }

    /// Recycles the overlay retired last, whose records no load reads any more.
    fn release_retired_last(&mut self) {
        if let Some(last) = self.retired_last.take() {
            self.recycle(last);
        }
    }

    /// Keeps a folded overlay's memory for the next one, unless a reader still holds it
    /// or its arena grew past twice the room a new one reserves (an overlay replayed
    /// from a long redo log at open), which would hold that much for the whole run.
    fn recycle(&mut self, folded: Arc<Overlay>) {
        if let Ok(mut overlay) = Arc::try_unwrap(folded)
            && overlay.arena_capacity() <= 2 * self.overlay_room()
        {
            overlay.clear();
            self.spare = Some(overlay);
        }
    }

    /// Folds everything committed into sled and waits until it is on disk (the end of
    /// a run).
    pub fn flush(&mut self) -> Result<()> {
        self.fold()
    }

    /// All key records in key order (for `groupstate state`, the migration check and
    /// tests). A fold on its own thread may split pages meanwhile: a split moves keys
    /// only into a new page below the old one's fence, which the scan has not passed
    /// yet, and the keys whose records the fold changes come from its overlay.
    pub fn iter_keys(&self) -> impl Iterator<Item = Result<(String, KeyRecord)>> + '_ {
        let refused = self.usable().err();
        let keys = refused.is_none().then(|| self.merged_keys());
        refused.map(Err).into_iter().chain(keys.into_iter().flatten())
    }

    /// sled's records merged with the overlays', in key order (see [`Store::iter_keys`]).
    fn merged_keys(&self) -> impl Iterator<Item = Result<(String, KeyRecord)>> + '_ {
        let stored = self
            .folder
            .tree
            .scan_prefix([PREFIX_PAGE])
            .flat_map(|entry| {
                let page = entry.map_err(io("scan pages")).and_then(|(_, bytes)| Ok(Page::decode(&bytes)?));
                match page {
                    Ok(page) => page.entries().iter().cloned().map(Ok).collect::<Vec<_>>(),
                    Err(e) => vec![Err(e)],
                }
            })
            .filter(move |entry| !matches!(entry, Ok((key, _)) if self.buffered(key)));
        let overlay = &self.overlay;
        let folding = self.folding.as_deref().map(Overlay::sorted).unwrap_or_default();
        let folding = decoded_records(folding.into_entries().filter(move |(key, _)| !overlay.holds(key)));
        let buffered = decoded_records(overlay.sorted().into_entries());
        let buffered = MergeSorted { a: folding.peekable(), b: buffered.peekable(), le: |x, y| x.0 <= y.0 };
        MergeSorted { a: stored.peekable(), b: buffered.peekable(), le: |x, y| x.0 <= y.0 }
    }

    /// Whether a key's committed record is in one of the overlays (and not in sled).
    fn buffered(&self, key: &str) -> bool {
        self.overlay.holds(key) || self.folding.as_ref().is_some_and(|f| f.holds(key))
    }

    /// The committed record of the key if one of the overlays has it (see
    /// [`Overlay::get`]), given its [`crate::overlay::hash`].
    fn buffered_record_hashed(&self, key: &str, hash: u64) -> Option<Option<&[u8]>> {
        self.overlay.get_hashed(key, hash).or_else(|| self.folding.as_ref()?.get_hashed(key, hash))
    }

    /// All timers in (deadline, key) order. They are collected and sorted in memory: for
    /// inspection and tests, not for the batch path.
    pub fn iter_timers(&self) -> impl Iterator<Item = Result<(i64, String)>> + '_ {
        let timers: Result<Vec<(i64, String)>> = self
            .iter_keys()
            .filter_map(|entry| match entry {
                Ok((key, record)) => record.timeout_ms.map(|d| Ok((d, key))),
                Err(e) => Some(Err(e)),
            })
            .collect();
        let timers = timers.map(|mut t| {
            t.sort_unstable();
            t
        });
        let (ok, err) = match timers {
            Ok(t) => (t, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        err.map(Err).into_iter().chain(ok.into_iter().map(Ok))
    }

    /// Checks that the pages, the deadline index and the overlay agree (tests and
    /// inspection): pages in order, each holding only keys of its range, none empty but
    /// the first, and one index entry per page with a timer, at its earliest deadline.
    /// A fold on its own thread applies no chunk meanwhile: sled is checked as it is
    /// between two chunks, which must be consistent too.
    pub fn check_consistency(&self) -> Result<()> {
        self.usable()?;
        if let Some(folding) = &self.folding {
            folding.check().map_err(StoreError::Corrupt)?;
        }
        let _walk = self.folder.pages.lock();
        let mut want_index = BTreeSet::new();
        let mut lower: Vec<u8> = Vec::new();
        let mut last_fence = None;
        for entry in self.folder.tree.scan_prefix([PREFIX_PAGE]) {
            let (raw, bytes) = entry.map_err(io("scan pages"))?;
            let fence = raw[1..].to_vec();
            let page = Page::decode(&bytes)?;
            let shown = String::from_utf8_lossy(&fence).into_owned();
            if page.is_empty() && fence != LAST_FENCE {
                return Err(StoreError::Corrupt(format!("page {shown:?} is empty")));
            }
            for (key, _) in page.entries() {
                if key.as_bytes() < lower.as_slice() || key.as_bytes() >= fence.as_slice() {
                    return Err(StoreError::Corrupt(format!(
                        "key {key:?} is outside its page's range (fence {shown:?})"
                    )));
                }
            }
            if let Some(min) = page.min_deadline() {
                want_index.insert((min, fence.clone()));
            }
            lower.clone_from(&fence);
            last_fence = Some(fence);
        }
        if last_fence.as_ref().is_some_and(|f| f != LAST_FENCE) {
            return Err(StoreError::Corrupt("the last page's fence is not above every key".into()));
        }
        let mut index = BTreeSet::new();
        for entry in self.folder.tree.scan_prefix([PREFIX_TIMER]) {
            index.insert(parse_index_key(&entry.map_err(io("scan the deadline index"))?.0)?);
        }
        if index != want_index {
            let extra: Vec<_> = index.difference(&want_index).take(3).collect();
            let missing: Vec<_> = want_index.difference(&index).take(3).collect();
            return Err(StoreError::Corrupt(format!(
                "the deadline index does not match the pages: extra {extra:?}, missing {missing:?}"
            )));
        }
        self.overlay.check().map_err(StoreError::Corrupt)
    }
}

/// Adds a folded page to a sled batch, with its deadline-index entry moved: split
/// when it outgrew [`PAGE_BYTES_MAX`], removed when it is empty (except the last page,
/// which every key falls to).
fn write_page(batch: &mut sled::Batch, fence: Vec<u8>, page: Merged) -> Result<()> {
    let Merged { bytes, count, old_min, new_min } = page;
    let keep = count > 0 || fence == LAST_FENCE;
    let whole = keep && bytes.len() <= PAGE_BYTES_MAX;
    // A page that keeps its fence and its earliest deadline keeps its index entry: most
    // folds move a later deadline of a page, not its earliest (two sled writes saved).
    if !(whole && new_min == old_min)
        && let Some(min) = old_min
    {
        batch.remove(index_key(min, &fence));
    }
    if !keep {
        batch.remove(page_key(&fence));
        return Ok(());
    }
    if whole {
        if let Some(min) = new_min.filter(|_| new_min != old_min) {
            batch.insert(index_key(min, &fence), &[] as &[u8]);
        }
        batch.insert(page_key(&fence), bytes);
        return Ok(());
    }
    let len = bytes.len();
    for (piece_fence, piece) in Page::decode(&bytes)?.split(fence, len) {
        if let Some(min) = piece.min_deadline() {
            batch.insert(index_key(min, &piece_fence), &[] as &[u8]);
        }
        batch.insert(page_key(&piece_fence), piece.encode());
    }
    Ok(())
}

impl Folder {
    /// Writes `overlay`, and `checkpoint` as that of commit `seq`, into sled: page by
    /// page in key order, in chunks (sled's cost and memory for one batch grow faster
    /// than its size); then flushes sled and replaces the fold marker. Returns `false`
    /// when it stopped after `chunks_max` chunks, as a crash would (tests). A crash
    /// between chunks is safe: the logs are still whole, and replaying them sets each
    /// key's record whatever sled holds (a page and its index entries are in one chunk,
    /// and writing a key's committed record into its page again changes nothing).
    fn fold(&self, overlay: &Overlay, checkpoint: Option<&Checkpoint>, seq: u64, chunks_max: usize) -> Result<bool> {
        let changes = overlay.sorted();
        let mut batch = sled::Batch::default();
        let (mut chunk_bytes, mut chunks) = (0, 0);
        // The pages ahead of the chunks applied so far are as they were: only this fold
        // writes pages, in key order.
        let mut pages = PageCursor::new(&self.tree);
        let mut i = 0;
        while i < changes.len() {
            let (fence, bytes) = match pages.page_of(changes.key(i))? {
                Some((raw, bytes)) => (raw[1..].to_vec(), Some(bytes.clone())),
                None => (LAST_FENCE.to_vec(), None),
            };
            // The overlay's keys below the fence belong to this page.
            let start = i;
            while i < changes.len() && cmp_keys(changes.key_bytes(i), &fence).is_lt() {
                i += 1;
            }
            let merged = Page::merge(bytes.as_deref(), changes.range(start..i))?;
            chunk_bytes += merged.bytes.len().max(1);
            write_page(&mut batch, fence, merged)?;
            if chunk_bytes >= FOLD_CHUNK_BYTES {
                if chunks == chunks_max {
                    self.db.flush().map_err(io("flush sled"))?;
                    return Ok(false);
                }
                self.apply(std::mem::take(&mut batch))?;
                (chunk_bytes, chunks) = (0, chunks + 1);
            }
        }
        if chunks == chunks_max && chunk_bytes > 0 {
            self.db.flush().map_err(io("flush sled"))?;
            return Ok(false);
        }
        if let Some(checkpoint) = checkpoint {
            batch.insert(META_CHECKPOINT, codec::encode(checkpoint));
        }
        batch.insert(META_FOLDED, codec::encode(&seq));
        self.apply(batch)?;
        self.db.flush().map_err(io("flush sled"))?;
        // The marker says what sled now holds, before the logs that also hold it go.
        let mark = FoldMark { seq, digest: checkpoint_digest(checkpoint) };
        fold_mark::write(&self.dir, mark).map_err(|cause| StoreError::Log { path: self.dir.clone(), cause })?;
        Ok(true)
    }

    /// Applies one chunk of a fold, whole to any walk of the pages (see `pages`).
    fn apply(&self, batch: sled::Batch) -> Result<()> {
        {
            let _walks_wait = self.pages.lock();
            self.tree.apply_batch(batch).map_err(io("fold the redo log into sled"))?;
        }
        collect_garbage();
        Ok(())
    }
}

/// Pages read in key order through one sled iterator. A sled iterator keeps a copy of
/// the leaf it is in, where a new `range` for each page copies its leaf each time
/// (sled's leaves hold up to 16 items): a key a few pages ahead is reached by stepping,
/// one farther by a new search.
struct PageCursor<'t> {
    tree: &'t sled::Tree,
    iter: Option<sled::Iter>,
    /// The last page read (its sled key, its bytes).
    page: Option<(sled::IVec, sled::IVec)>,
    /// While the cursor steps from page to page, the iterator's next item, read already
    /// (its error, if any, is reported when the walk reaches it) and the page's lines
    /// asked for ([`prefetch_page`]), so that they arrive while the keys of `page` are
    /// searched (at 10M events over 1M keys, loads took about 2% less time). A search
    /// anew, as for one key, reads no page ahead.
    next: Option<sled::Result<(sled::IVec, sled::IVec)>>,
}

/// How many keys ahead of a page walk [`Store::get_many`] asks for a key's bytes and
/// its place in the answer (at 10M events over 1M keys, loads took about 1.5% less).
const OUT_OF_ORDER_AHEAD: usize = 8;

/// Walks the pages of the keys numbered `stored` (in key order) of `keys`, calling
/// `found` with each key's answer in `slots` (numbered as `keys`), its number and the
/// page whose range holds it (`None` when no page does: the store is empty), until
/// `found` returns false. The caller holds `Folder::pages`.
fn walk_pages<T>(
    tree: &sled::Tree,
    keys: &[&str],
    stored: &[usize],
    slots: &mut [T],
    mut found: impl FnMut(&mut T, usize, Option<&[u8]>) -> Result<bool>,
) -> Result<()> {
    let mut pages = PageCursor::new(tree);
    for (j, &i) in stored.iter().enumerate() {
        // The walk meets the keys in key order, their slots, their `&str` in `keys`
        // and their bytes in no order at all: the `&str` is asked for twice as far
        // ahead as the bytes it points to, so that reading it there does not wait (at
        // 10M events over 1M keys, loads took about 5% less).
        if let Some(&farther) = stored.get(j + 2 * OUT_OF_ORDER_AHEAD) {
            crate::prefetch::prefetch(&keys[farther]);
        }
        if let Some(&ahead) = stored.get(j + OUT_OF_ORDER_AHEAD) {
            crate::prefetch::prefetch(&slots[ahead]);
            if let Some(byte) = keys[ahead].as_bytes().first() {
                crate::prefetch::prefetch(byte);
            }
        }
        let page = pages.page_of(keys[i])?.map(|(_, bytes)| &bytes[..]);
        if !found(&mut slots[i], i, page)? {
            break;
        }
    }
    Ok(())
}

/// Pages a [`PageCursor`] steps over before it searches anew.
const CURSOR_STEPS_MAX: usize = 8;

impl<'t> PageCursor<'t> {
    fn new(tree: &'t sled::Tree) -> Self {
        Self { tree, iter: None, page: None, next: None }
    }

    /// The page whose range holds `key` (its sled key and bytes), or `None` when no
    /// page is above it; `key` is at or above the keys asked before.
    fn page_of(&mut self, key: &str) -> Result<Option<&(sled::IVec, sled::IVec)>> {
        let above = |page: &(sled::IVec, sled::IVec)| cmp_keys(key.as_bytes(), &page.0[1..]).is_lt();
        if self.page.as_ref().is_some_and(above) {
            return Ok(self.page.as_ref());
        }
        if self.iter.is_some() {
            for _ in 0..CURSOR_STEPS_MAX {
                let Some(page) = self.step()? else {
                    // The pages end here: none is above `key`.
                    self.page = None;
                    return Ok(None);
                };
                if above(&page) {
                    warm_up(&page.1);
                    return Ok(Some(self.page.insert(page)));
                }
            }
        }
        let mut iter = self.tree.range(pages_above(key));
        self.page = iter.next().transpose().map_err(io("read a page"))?;
        self.iter = Some(iter);
        self.next = None;
        if let Some((_, bytes)) = &self.page {
            warm_up(bytes);
        }
        Ok(self.page.as_ref())
    }

    /// The iterator's next page, with the one after it read and asked for.
    fn step(&mut self) -> Result<Option<(sled::IVec, sled::IVec)>> {
        let Some(iter) = &mut self.iter else { return Ok(None) };
        let Some(page) = self.next.take().or_else(|| iter.next()) else { return Ok(None) };
        let page = page.map_err(io("read a page"))?;
        self.next = iter.next();
        if let Some(Ok((_, bytes))) = &self.next {
            prefetch_page(bytes);
        }
        Ok(Some(page))
    }
}

/// Asks the CPU for every cache line of a page the walk reaches next.
fn prefetch_page(bytes: &[u8]) {
    for byte in bytes.iter().step_by(64) {
        crate::prefetch::prefetch(byte);
    }
}

/// Reads a page's cache lines in order before its keys are searched: a page from
/// sled's cache is rarely in the CPU's, and a binary search over it waited on memory
/// at each step (a sequential read lets the hardware prefetch the lines; at 10M events
/// over 1M keys, loads took 9% less time, BENCHMARKS.md).
fn warm_up(bytes: &[u8]) {
    let mut any = 0u8;
    for byte in bytes.iter().step_by(64) {
        any ^= *byte;
    }
    std::hint::black_box(any);
}

/// The numbers `stored` of `keys` in the order of the keys: picked from `order` (the
/// numbers of all `keys`, in key order) when it is one, else sorted. A page walk that
/// met its keys out of order would miss their records, so `order` is checked.
fn in_key_order(keys: &[&str], mut stored: Vec<usize>, order: Option<&[u32]>) -> Vec<usize> {
    if let Some(order) = order.filter(|o| o.len() == keys.len()) {
        let mut in_sled = vec![false; keys.len()];
        for &i in &stored {
            in_sled[i] = true;
        }
        let picked: Vec<usize> = order.iter().map(|&i| i as usize).filter(|&i| in_sled.get(i) == Some(&true)).collect();
        let ascending = picked.windows(2).all(|w| cmp_keys(keys[w[0]].as_bytes(), keys[w[1]].as_bytes()).is_lt());
        if picked.len() == stored.len() && ascending {
            return picked;
        }
    }
    crate::key_order::sort_by_key(&mut stored, |&i| keys[i].as_bytes());
    stored
}

/// The sled range of the pages whose fence is above `key`: the first is its page.
fn pages_above(key: &str) -> (std::ops::Bound<Vec<u8>>, std::ops::Bound<Vec<u8>>) {
    (std::ops::Bound::Excluded(page_key(key.as_bytes())), std::ops::Bound::Included(page_key(LAST_FENCE)))
}

/// Frees what sled's writes left for its epoch-based collector. sled defers freeing
/// replaced nodes to crossbeam-epoch, which frees a few bags of garbage every 128th
/// time a thread pins: reads pin often enough, a long run of writes alone does not,
/// and the garbage of one large fold held 800 MB at 1M keys. A pin and flush with
/// nothing to free costs tens of nanoseconds.
fn collect_garbage() {
    for _ in 0..GARBAGE_COLLECTS_PER_CHUNK {
        crossbeam_epoch::pin().flush();
    }
}

/// A digest of a checkpoint, for the fold marker.
fn checkpoint_digest(checkpoint: Option<&Checkpoint>) -> u32 {
    checkpoint.map_or(0, |c| crc32fast::hash(&codec::encode(c)))
}

/// Refuses a sled that holds less than the fold marker says was folded into it: its
/// files were damaged and sled went back to an older state. sled ahead of the marker
/// is a crash between a fold's flush and the marker's replacement.
fn check_fold_mark(dir: &Path, folded: u64, checkpoint: Option<&Checkpoint>) -> Result<()> {
    let mark = fold_mark::read(dir).map_err(|cause| StoreError::Log { path: dir.to_owned(), cause })?;
    let Some(mark) = mark else {
        return Ok(());
    };
    let behind = |found: String| StoreError::Behind {
        dir: dir.to_owned(),
        found,
        expected: format!("every commit up to {}", mark.seq),
    };
    if folded < mark.seq {
        return Err(behind(if folded == 0 { "no commit".to_owned() } else { format!("commits up to {folded}") }));
    }
    if folded == mark.seq && checkpoint_digest(checkpoint) != mark.digest {
        return Err(behind(format!("a checkpoint for commit {folded} that differs from the one folded")));
    }
    Ok(())
}

fn read_meta<T: Decode<()>>(tree: &sled::Tree, name: &'static str, key: &[u8]) -> Result<Option<T>> {
    match tree.get(key).map_err(io("read metadata"))? {
        Some(bytes) => Ok(Some(codec::decode(name, &bytes)?)),
        None => Ok(None),
    }
}

/// Decodes an overlay's sorted records, leaving out its deletions.
fn decoded_records<'o>(
    entries: impl Iterator<Item = (&'o str, Option<&'o [u8]>)> + 'o,
) -> impl Iterator<Item = Result<(String, KeyRecord)>> + 'o {
    entries.filter_map(|(key, record)| {
        let record = record?;
        Some(codec::decode("overlay record", record).map(|r| (key.to_owned(), r)).map_err(StoreError::from))
    })
}

/// Two iterators sorted by `le`, merged into one sorted iterator (an error comes out
/// as soon as it is met).
struct MergeSorted<T, A: Iterator<Item = Result<T>>, B: Iterator<Item = Result<T>>> {
    a: Peekable<A>,
    b: Peekable<B>,
    le: fn(&T, &T) -> bool,
}

impl<T, A: Iterator<Item = Result<T>>, B: Iterator<Item = Result<T>>> Iterator for MergeSorted<T, A, B> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        let take_a = match (self.a.peek(), self.b.peek()) {
            (None, None) => return None,
            (Some(_), None) | (Some(Err(_)), _) => true,
            (None, Some(_)) | (_, Some(Err(_))) => false,
            (Some(Ok(x)), Some(Ok(y))) => (self.le)(x, y),
        };
        if take_a { self.a.next() } else { self.b.next() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot sled was still writing when a kill stopped it, or its `conf` cut
    /// short before its checksum, does not keep the store from opening: sled reads its
    /// last finished snapshot and its log instead, and writes its `conf` again.
    #[test]
    fn files_sled_had_not_finished_when_killed_are_dropped_at_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = Store::open(dir.path(), 1 << 20, 1 << 20, 1 << 20).unwrap();
            let changes = vec![KeyChange { key: "a".into(), before: None, after: rec(Some(b"1"), Some(100)) }];
            store.commit(&changes, &Checkpoint { next_batch_id: 1, ..Checkpoint::default() }, true).unwrap();
            store.flush().unwrap();
        }
        let conf = dir.path().join("conf");
        let finished_conf = std::fs::read(&conf).unwrap();
        for unfinished in ["snapshot", "conf"] {
            if unfinished == "snapshot" {
                // Newer than any snapshot sled wrote, cut short before its length and checksum.
                std::fs::write(dir.path().join("snap.FFFFFFFFFFFFFF00.generating"), [0xAB; 100]).unwrap();
            } else {
                std::fs::write(&conf, &finished_conf[..finished_conf.len() - 4]).unwrap();
            }
            let store =
                Store::open(dir.path(), 1 << 20, 1 << 20, 1 << 20).unwrap_or_else(|e| panic!("{unfinished}: {e}"));
            assert!(!dir.path().join("snap.FFFFFFFFFFFFFF00.generating").exists());
            assert_eq!(std::fs::read(&conf).unwrap(), finished_conf, "{unfinished}");
            assert_eq!(store.get("a").unwrap(), rec(Some(b"1"), Some(100)), "{unfinished}");
            assert_eq!(store.checkpoint().unwrap().unwrap().next_batch_id, 1);
        }
    }

    /// sled opens a store only with the segment size it was created with: a store
    /// created with sled's default (before groupstate chose its own) keeps it, and a
    /// new one has groupstate's.
    #[test]
    fn a_store_keeps_the_segment_size_it_was_created_with() {
        let legacy = 512 << 10;
        assert_ne!(legacy, SEGMENT_BYTES);
        let old = tempfile::tempdir().unwrap();
        sled::Config::new().path(old.path()).segment_size(legacy).open().unwrap().flush().unwrap();
        let new = tempfile::tempdir().unwrap();
        for (dir, segment) in [(&old, legacy), (&new, SEGMENT_BYTES)] {
            for reopen in [false, true] {
                let mut store = Store::open(dir.path(), 1 << 20, 1 << 20, 1 << 20)
                    .unwrap_or_else(|e| panic!("{segment} (reopen {reopen}): {e}"));
                if !reopen {
                    let changes = vec![KeyChange { key: "a".into(), before: None, after: rec(Some(b"1"), None) }];
                    store.commit(&changes, &Checkpoint { next_batch_id: 1, ..Checkpoint::default() }, true).unwrap();
                    store.flush().unwrap();
                }
                assert_eq!(store.get("a").unwrap(), rec(Some(b"1"), None));
                assert_eq!(segment_bytes(dir.path()), segment);
            }
        }
        // A conf cut short is not read.
        let conf = std::fs::read(new.path().join("conf")).unwrap();
        assert_eq!(whole_conf(&conf[..conf.len() - 1]), None);
        assert!(whole_conf(&conf).is_some_and(|contents| contents.starts_with(b"segment_size: ")));
    }

    /// A durable commit over many keys updates the overlay while its log append waits
    /// on the disk. When that append fails, the overlay holds a batch that never
    /// committed: the store then refuses every read, fold and commit, and a reopen
    /// finds the last whole commit. A small commit updates the overlay only after its
    /// append, so its failure leaves the store usable.
    #[test]
    fn a_failed_sync_after_the_overlay_took_the_changes_makes_the_store_refuse() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<String> = (0..APPLY_WHILE_SYNCING_CHANGES_MIN * 2).map(|i| format!("k{i:05}")).collect();
        let batch = |value: &[u8]| -> Vec<KeyChange> {
            keys.iter().map(|k| KeyChange { key: k.clone(), before: None, after: rec(Some(value), Some(7)) }).collect()
        };
        let checkpoint = |next_batch_id| Checkpoint { next_batch_id, ..Checkpoint::default() };
        {
            let mut store = Store::open(dir.path(), 1 << 20, 64 << 20, 64 << 20).unwrap();
            store.commit(&batch(b"1"), &checkpoint(1), true).unwrap();

            // Small: the overlay is untouched and the store goes on.
            store.log.fail_next_sync = true;
            let small = vec![KeyChange { key: keys[0].clone(), before: None, after: rec(Some(b"small"), None) }];
            assert!(matches!(store.commit(&small, &checkpoint(2), true), Err(StoreError::Log { .. })));
            assert_eq!(store.get(&keys[0]).unwrap(), rec(Some(b"1"), Some(7)));

            store.log.fail_next_sync = true;
            let refused = |result: Result<()>| match result {
                Err(StoreError::Unusable { cause }) => assert!(cause.contains("injected fsync failure"), "{cause}"),
                other => panic!("expected the store to refuse, got {other:?}"),
            };
            refused(store.commit(&batch(b"2"), &checkpoint(2), true));
            refused(store.get(&keys[1]).map(drop));
            refused(store.get_many(&[keys[1].as_str()], None, None, &mut Vec::new()));
            refused(store.expired_timers(i64::MAX, 10).map(drop));
            refused(store.reader().map(drop));
            refused(store.iter_keys().next().expect("an error first").map(drop));
            assert_eq!(store.iter_keys().count(), 1, "nothing after the error");
            refused(store.check_consistency());
            refused(store.fold_if_due());
            refused(store.flush());
            refused(store.commit(&batch(b"3"), &checkpoint(3), true));
            let plan =
                BatchPlan { batch_id: 2, start_offset: 0, end_offset: 0, processing_time_ms: 0, watermark_ms: 0 };
            refused(store.write_plan(&plan));
        }
        let store = Store::open(dir.path(), 1 << 20, 64 << 20, 64 << 20).unwrap();
        assert_eq!(store.checkpoint().unwrap().unwrap().next_batch_id, 1);
        for key in &keys {
            assert_eq!(store.get(key).unwrap(), rec(Some(b"1"), Some(7)), "{key}");
        }
        store.check_consistency().unwrap();
    }

    /// Records read ahead answer for the keys no overlay holds while no overlay has
    /// retired since; a key a later commit changed comes from the overlay. Once a fold
    /// retires an overlay, whose keys sled then has anew, the records are used for the
    /// other keys until the next batch, that overlay answering for its own; after
    /// that, or a second retirement, they are not used.
    #[test]
    fn records_read_ahead_are_used_until_an_overlay_retires() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), 1 << 20, 64 << 20, 64 << 20).unwrap();
        let put = |store: &mut Store, batch: u64, key: &str, value: &[u8]| {
            let change = KeyChange { key: key.into(), before: None, after: rec(Some(value), None) };
            store.commit(&[change], &Checkpoint { next_batch_id: batch, ..Checkpoint::default() }, false).unwrap();
        };
        put(&mut store, 1, "a", b"a1");
        put(&mut store, 2, "b", b"b1");
        store.flush().unwrap();
        let keys = ["b", "none", "a"];
        let mut ahead = StoredAhead::default();
        store.page_reader().read(&keys, None, &mut ahead).unwrap();
        let get = |store: &Store, ahead: &StoredAhead| {
            let mut got = Vec::new();
            store.get_many(&keys, None, Some(ahead), &mut got).unwrap();
            got
        };
        assert_eq!(get(&store, &ahead), vec![rec(Some(b"b1"), None), None, rec(Some(b"a1"), None)]);

        // Used: what was read stands for sled (here made to say "b" has no record).
        let mut altered = StoredAhead { read_at: ahead.read_at.clone(), ..StoredAhead::default() };
        altered.spans = vec![Span::Absent, Span::Absent, ahead.spans[2]];
        altered.bytes.clone_from(&ahead.bytes);
        assert_eq!(get(&store, &altered), vec![None, None, rec(Some(b"a1"), None)]);

        // A commit after the read: its key comes from the overlay.
        put(&mut store, 3, "a", b"a2");
        assert_eq!(get(&store, &altered), vec![None, None, rec(Some(b"a2"), None)]);

        // A fold on its own thread retires that overlay: "a" comes from it, and the
        // rest is still read ahead, until the next batch's `fold_if_due`.
        store.start_fold().unwrap();
        store.settle().unwrap();
        assert_eq!(store.retired.load(Ordering::Acquire), ahead.read_at.as_ref().unwrap().1 + 1);
        assert_eq!(get(&store, &altered), vec![None, None, rec(Some(b"a2"), None)]);
        store.fold_if_due().unwrap();
        assert_eq!(get(&store, &altered), vec![rec(Some(b"b1"), None), None, rec(Some(b"a2"), None)]);

        // Read again, then two retirements: sled is read again.
        store.page_reader().read(&keys, None, &mut altered).unwrap();
        altered.spans[0] = Span::Absent;
        assert_eq!(get(&store, &altered), vec![None, None, rec(Some(b"a2"), None)]);
        for (batch, value) in [(4, b"a3"), (5, b"a4")] {
            put(&mut store, batch, "a", value);
            store.start_fold().unwrap();
            store.settle().unwrap();
        }
        assert_eq!(get(&store, &altered), vec![rec(Some(b"b1"), None), None, rec(Some(b"a4"), None)]);

        // A fold in place (the end of a run) retires the overlay too.
        store.page_reader().read(&keys, None, &mut ahead).unwrap();
        put(&mut store, 6, "a", b"a5");
        store.flush().unwrap();
        assert_eq!(ahead.age(&store.retired), Some(1));
        assert_eq!(get(&store, &ahead), vec![rec(Some(b"b1"), None), None, rec(Some(b"a5"), None)]);

        // Another store's records are not used either.
        let other_dir = tempfile::tempdir().unwrap();
        let other = Store::open(other_dir.path(), 1 << 20, 64 << 20, 64 << 20).unwrap();
        let mut theirs = StoredAhead::default();
        other.page_reader().read(&keys, None, &mut theirs).unwrap();
        assert_eq!(get(&store, &theirs), vec![rec(Some(b"b1"), None), None, rec(Some(b"a5"), None)]);
    }

    /// Records read ahead by many turns over many pages, while a fold that stopped short
    /// left sled half written (its overlay still read) and commits came after the read.
    #[test]
    fn records_read_ahead_by_turns_match_the_committed_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), 1 << 20, 64 << 20, 64 << 20).unwrap();
        let keys: Vec<String> = (0..300).map(|i| format!("k{i:04}")).collect();
        let mut model: std::collections::BTreeMap<String, KeyRecord> = std::collections::BTreeMap::new();
        let mut batch = 0;
        let mut commit =
            |store: &mut Store, model: &mut std::collections::BTreeMap<String, KeyRecord>, every: usize| {
                batch += 1;
                let value = format!("v{batch}").into_bytes();
                let changes: Vec<KeyChange> = keys
                    .iter()
                    .step_by(every)
                    .map(|k| KeyChange { key: k.clone(), before: None, after: rec(Some(&value), Some(batch)) })
                    .collect();
                for change in &changes {
                    model.insert(change.key.clone(), change.after.clone().unwrap());
                }
                store
                    .commit(&changes, &Checkpoint { next_batch_id: batch as u64, ..Checkpoint::default() }, false)
                    .unwrap();
            };
        commit(&mut store, &mut model, 1);
        store.flush().unwrap();
        commit(&mut store, &mut model, 3);
        store.background_chunks_max = 1;
        store.start_fold().unwrap();
        store.settle().unwrap();
        assert!(store.folding.is_some(), "the fold stopped short");

        let mut asked: Vec<&str> = keys.iter().map(String::as_str).rev().collect();
        asked.extend(["a", "k", "z"]);
        let mut ahead = StoredAhead::default();
        store.page_reader().read(&asked, None, &mut ahead).unwrap();
        assert!(asked.len() > 10 * READ_AHEAD_KEYS_PER_TURN);
        assert!(ahead.spans.iter().all(|span| !matches!(span, Span::Unread)), "every turn read its keys");
        commit(&mut store, &mut model, 5);

        assert_eq!(ahead.age(&store.retired), Some(0), "the records are used");
        let mut got = Vec::new();
        store.get_many(&asked, None, Some(&ahead), &mut got).unwrap();
        let want: Vec<Option<KeyRecord>> = asked.iter().map(|k| model.get(*k).cloned()).collect();
        assert_eq!(got, want);
    }

    fn rec(value: Option<&[u8]>, timeout_ms: Option<i64>) -> Option<KeyRecord> {
        let r = KeyRecord { value: value.map(<[u8]>::to_vec), timeout_ms, schema_version: 1 };
        (!r.is_empty()).then_some(r)
    }

    /// `StoreReader` against a map: composite keys of a few groups, changed and deleted
    /// over many commits, with folds in place and on their own thread, so that the
    /// entries of a prefix or a range lie in the overlay, the overlay being folded and
    /// sled's pages.
    #[test]
    fn reader_prefix_ranges_match_a_model_through_folds() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), 1 << 20, 4096, 1 << 20).unwrap();
        let mut model: std::collections::BTreeMap<String, Vec<u8>> = std::collections::BTreeMap::new();
        let mut seed = 7u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let prefix = |g: u64| format!("g{g}\0mvar\0");
        for batch in 0..300u64 {
            let mut changes = Vec::new();
            let mut touched = BTreeSet::new();
            for _ in 0..next(12) {
                let key = format!("{}{:04x}", prefix(next(4)), next(300));
                if !touched.insert(key.clone()) {
                    continue;
                }
                let before =
                    model.get(&key).map(|v| KeyRecord { value: Some(v.clone()), timeout_ms: None, schema_version: 1 });
                let after = if next(4) == 0 {
                    model.remove(&key);
                    None
                } else {
                    let value = format!("{batch}-{}", "x".repeat(next(200) as usize)).into_bytes();
                    model.insert(key.clone(), value.clone());
                    rec(Some(&value), None)
                };
                changes.push(KeyChange { key, before, after });
            }
            // Small groups too, whose entries fit in the pages `read_ahead` takes.
            let key = format!("s{}\0mvar\0{:04x}", next(6), next(3));
            if touched.insert(key.clone()) {
                let before =
                    model.get(&key).map(|v| KeyRecord { value: Some(v.clone()), timeout_ms: None, schema_version: 1 });
                let value = format!("{batch}").into_bytes();
                model.insert(key.clone(), value.clone());
                changes.push(KeyChange { key, before, after: rec(Some(&value), None) });
            }
            // A plain (0.1) key beside them, which no prefix range may return.
            changes.push(KeyChange { key: format!("g1{batch}"), before: None, after: rec(Some(b"plain"), None) });
            let cp = Checkpoint { next_batch_id: batch + 1, ..Checkpoint::default() };
            store.commit(&changes, &cp, false).unwrap();
            if batch % 50 == 49 {
                store.flush().unwrap();
            } else {
                store.fold_if_due().unwrap();
            }
            let reader = store.reader().unwrap();
            for g in 0..5 {
                let p = prefix(g);
                let want: Vec<(String, Vec<u8>)> = model
                    .range(p.clone()..)
                    .take_while(|(k, _)| k.starts_with(&p))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let got = reader.scan_prefix(&p, 1000).unwrap();
                let got: Vec<(String, Vec<u8>)> = got.into_iter().map(|(k, r)| (k, r.value.unwrap())).collect();
                assert_eq!(got, want, "batch {batch}, prefix {p:?}");
                if want.len() > 3 {
                    assert_eq!(
                        reader.scan_prefix(&p, 3).unwrap().len(),
                        4,
                        "limit + 1 tells the caller there are more"
                    );
                }
                if let Some((k, v)) = want.first() {
                    assert_eq!(reader.get(k).unwrap().and_then(|r| r.value).as_ref(), Some(v));
                }
            }
            // A range [start, end) inside a prefix, as the expiry index is read (the
            // plain keys between the groups are not composite: no range may span them).
            let (a, b, g) = (next(300), next(300), next(4));
            let start = format!("{}{:04x}", prefix(g), a.min(b));
            let end = format!("{}{:04x}", prefix(g), a.max(b));
            let want: Vec<(String, Vec<u8>)> = model
                .range(start.clone()..)
                .take_while(|(k, _)| **k < end)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let got = reader.scan_range(&start, &end, 1000).unwrap();
            let got: Vec<(String, Vec<u8>)> = got.into_iter().map(|(k, r)| (k, r.value.unwrap())).collect();
            assert_eq!(got, want, "batch {batch}, range {start:?}..{end:?}");
            assert_eq!(reader.scan_range(&start, &end, 2).unwrap().len(), want.len().min(3), "at most limit + 1");

            // Read ahead for every group (a batch's keys), it answers the same: from
            // what it read for the groups within its page limit, from sled for the rest.
            let groups: Vec<String> =
                (0..5).map(|g| format!("g{g}\0")).chain((0..7).map(|g| format!("s{g}\0"))).collect();
            let mut ahead = store.reader().unwrap();
            ahead.read_ahead(groups.iter().map(String::as_str)).unwrap();
            assert!(ahead.read_ahead_for("s0\0").is_some(), "a small group is read ahead");
            for group in &groups {
                let p = format!("{group}mvar\0");
                let want: Vec<(String, Vec<u8>)> = model
                    .range(p.clone()..)
                    .take_while(|(k, _)| k.starts_with(&p))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                for prefix in [group.as_str(), p.as_str()] {
                    let got = ahead.scan_prefix(prefix, 1000).unwrap();
                    let got: Vec<(String, Vec<u8>)> = got.into_iter().map(|(k, r)| (k, r.value.unwrap())).collect();
                    assert_eq!(got, want, "batch {batch}, read ahead, prefix {prefix:?}");
                }
                for i in 0..300 {
                    let key = format!("{p}{i:04x}");
                    let got = ahead.get(&key).unwrap().and_then(|r| r.value);
                    assert_eq!(got.as_ref(), model.get(&key), "batch {batch}, read ahead, key {key:?}");
                }
            }
        }
        store.check_consistency().unwrap();
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
            let mut store = Store::open(dir.path(), 1 << 20, 1 << 20, 1 << 20).unwrap();
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
        let store = Store::open(dir.path(), 1 << 20, 1 << 20, 1 << 20).unwrap();
        assert_eq!(store.checkpoint().unwrap().unwrap().input_offset, 20);
        assert_eq!(store.expired_timers(i64::MAX, 10).unwrap(), vec![(300, "a".to_owned())]);
        assert_eq!(store.get("a").unwrap().unwrap().value.as_deref(), Some(&b"2"[..]));
        assert_eq!(store.get("b").unwrap(), None);
        assert_eq!(store.iter_keys().count(), 2);
        store.check_consistency().unwrap();
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &to.join(entry.file_name()));
            } else {
                std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        }
    }

    /// A crash can stop an append anywhere: cut the log at every byte of the last
    /// commit, and the store must open at the commit before it, whole; junk after the
    /// last commit is dropped the same way.
    #[test]
    fn a_torn_log_tail_opens_at_the_last_whole_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store_dir = dir.path().join("store");
        let log = store_dir.join(REDO_LOG);
        let first = vec![
            KeyChange { key: "a".into(), before: None, after: rec(Some(b"1"), Some(100)) },
            KeyChange { key: "b".into(), before: None, after: rec(Some(b"2"), None) },
        ];
        let second = vec![
            KeyChange { key: "a".into(), before: rec(Some(b"1"), Some(100)), after: rec(Some(b"9"), Some(40)) },
            KeyChange { key: "b".into(), before: rec(Some(b"2"), None), after: None },
            KeyChange { key: "c".into(), before: None, after: rec(Some(b"3"), Some(7)) },
        ];
        let cp1 = Checkpoint { next_batch_id: 1, input_offset: 10, ..Checkpoint::default() };
        let cp2 = Checkpoint { next_batch_id: 2, input_offset: 20, ..Checkpoint::default() };
        let (after_first, after_second) = {
            let mut store = Store::open(&store_dir, 1 << 20, 1 << 20, 1 << 20).unwrap();
            store.commit(&first, &cp1, true).unwrap();
            let after_first = std::fs::metadata(&log).unwrap().len();
            store.commit(&second, &cp2, true).unwrap();
            (after_first, std::fs::metadata(&log).unwrap().len())
        };
        assert!(after_first > 0 && after_second > after_first);
        let state = |store: &Store| -> Vec<(String, KeyRecord)> { store.iter_keys().map(Result::unwrap).collect() };
        let damaged_copy = |cut: u64, junk: &[u8], flip: Option<u64>| {
            let copy = tempfile::tempdir().unwrap();
            copy_dir(&store_dir, copy.path());
            let copied_log = copy.path().join(REDO_LOG);
            let file = std::fs::OpenOptions::new().append(true).open(&copied_log).unwrap();
            file.set_len(cut).unwrap();
            std::io::Write::write_all(&mut &file, junk).unwrap();
            drop(file);
            if let Some(at) = flip {
                let mut bytes = std::fs::read(&copied_log).unwrap();
                bytes[at as usize] ^= 0x40;
                std::fs::write(&copied_log, bytes).unwrap();
            }
            copy
        };
        let cut_at = |cut: u64, junk: &[u8], flip: Option<u64>| {
            let copy = damaged_copy(cut, junk, flip);
            let copied_log = copy.path().join(REDO_LOG);
            let store = Store::open(copy.path(), 1 << 20, 1 << 20, 1 << 20).unwrap();
            store.check_consistency().unwrap();
            let opened = (
                store.checkpoint().unwrap().unwrap(),
                state(&store),
                store.iter_timers().map(Result::unwrap).collect::<Vec<_>>(),
            );
            drop(store);
            // The open folded the log into sled and emptied it; a second open agrees.
            assert_eq!(std::fs::metadata(&copied_log).unwrap().len(), 0);
            let again = Store::open(copy.path(), 1 << 20, 1 << 20, 1 << 20).unwrap();
            assert_eq!(again.checkpoint().unwrap().unwrap(), opened.0);
            assert_eq!(state(&again), opened.1);
            opened
        };
        let at_first = (
            cp1.clone(),
            vec![
                ("a".to_owned(), rec(Some(b"1"), Some(100)).unwrap()),
                ("b".to_owned(), rec(Some(b"2"), None).unwrap()),
            ],
            vec![(100, "a".to_owned())],
        );
        let at_second = (
            cp2.clone(),
            vec![
                ("a".to_owned(), rec(Some(b"9"), Some(40)).unwrap()),
                ("c".to_owned(), rec(Some(b"3"), Some(7)).unwrap()),
            ],
            vec![(7, "c".to_owned()), (40, "a".to_owned())],
        );
        for cut in after_first..after_second {
            assert_eq!(cut_at(cut, &[], None), at_first, "log cut at byte {cut}");
        }
        assert_eq!(cut_at(after_second, &[], None), at_second);
        assert_eq!(cut_at(after_second, &[0x13, 0, 0, 0, 1, 2], None), at_second);
        assert_eq!(cut_at(after_second, &[7; 40], None), at_second);
        // A flipped bit in the last frame (a write the crash left half done) fails its
        // checksum: that commit is dropped whole.
        assert_eq!(cut_at(after_second, &[], Some(after_second - 1)), at_first);
        // A damaged frame that a whole commit frame follows is not a torn append: the
        // open fails, names the offset and leaves the log as it was.
        for (at, frame) in [(0, 0), (9, 0), (after_first + 9, after_first), (after_first + 1, after_first)] {
            let copy = damaged_copy(after_second, &[], Some(at));
            let before = std::fs::read(copy.path().join(REDO_LOG)).unwrap();
            let err = Store::open(copy.path(), 1 << 20, 1 << 20, 1 << 20).unwrap_err();
            assert!(
                matches!(err, StoreError::LogDamaged { offset, .. } if offset == frame),
                "bit flipped at byte {at}: {err}"
            );
            assert_eq!(std::fs::read(copy.path().join(REDO_LOG)).unwrap(), before);
        }
    }

    /// sled going back to an older state (damaged files) is refused: the fold marker
    /// remembers what was folded into it.
    #[test]
    fn a_sled_behind_its_fold_marker_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store_dir = dir.path().join("store");
        let older = dir.path().join("older");
        let cp = |n: u64| Checkpoint { next_batch_id: n, input_offset: 10 * n, ..Checkpoint::default() };
        {
            let mut store = Store::open(&store_dir, 1 << 20, 0, 1 << 20).unwrap();
            store
                .commit(&[KeyChange { key: "a".into(), before: None, after: rec(Some(b"1"), None) }], &cp(1), true)
                .unwrap();
            store.fold_if_due().unwrap();
        }
        copy_dir(&store_dir, &older);
        {
            let mut store = Store::open(&store_dir, 1 << 20, 0, 1 << 20).unwrap();
            store
                .commit(&[KeyChange { key: "b".into(), before: None, after: rec(Some(b"2"), None) }], &cp(2), true)
                .unwrap();
            store.fold_if_due().unwrap();
        }
        // sled's files from before the second fold, under the newer marker.
        for entry in std::fs::read_dir(&older).unwrap() {
            let entry = entry.unwrap();
            if entry.file_name() != "fold.mark" {
                let to = store_dir.join(entry.file_name());
                if entry.file_type().unwrap().is_dir() {
                    std::fs::remove_dir_all(&to).unwrap();
                    copy_dir(&entry.path(), &to);
                } else {
                    std::fs::copy(entry.path(), to).unwrap();
                }
            }
        }
        let err = Store::open(&store_dir, 1 << 20, 0, 1 << 20).unwrap_err();
        assert!(matches!(err, StoreError::Behind { .. }), "{err}");
        assert!(err.to_string().contains("commits up to 1") && err.to_string().contains("up to 2"), "{err}");
        // The older files with their own marker open at the older state.
        let store = Store::open(&older, 1 << 20, 0, 1 << 20).unwrap();
        assert_eq!(store.checkpoint().unwrap(), Some(cp(1)));
    }

    #[test]
    fn a_plan_is_pending_until_its_batch_commits_and_is_read_back_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), 1 << 20, 1 << 20, 1 << 20).unwrap();
        let plan = BatchPlan { batch_id: 0, start_offset: 0, end_offset: 5, processing_time_ms: 1, watermark_ms: 0 };
        store.write_plan(&plan).unwrap();
        assert_eq!(store.pending_plan().unwrap(), Some(plan.clone()));
        // A reopen reads the plan back from sled (the store keeps it in memory after).
        drop(store);
        let mut store = Store::open(dir.path(), 1 << 20, 1 << 20, 1 << 20).unwrap();
        assert_eq!(store.pending_plan().unwrap(), Some(plan));
        store.commit(&[], &Checkpoint { next_batch_id: 1, ..Checkpoint::default() }, false).unwrap();
        assert_eq!(store.pending_plan().unwrap(), None);
        let next = BatchPlan { batch_id: 1, start_offset: 5, end_offset: 9, processing_time_ms: 2, watermark_ms: 0 };
        store.write_plan(&next).unwrap();
        drop(store);
        let store = Store::open(dir.path(), 1 << 20, 1 << 20, 1 << 20).unwrap();
        assert_eq!(store.pending_plan().unwrap(), Some(next));
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

    /// Commits the model's pending changes as one batch, and folds when due.
    fn commit_pending(store: &mut Store, model: &mut Model, rng: &mut Rng) {
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
        store.fold_if_due().unwrap();
        for (k, after) in std::mem::take(&mut model.pending) {
            match after {
                Some(r) => model.committed.insert(k, r),
                None => model.committed.remove(&k),
            };
        }
    }

    #[test]
    fn random_operations_with_reboots_match_the_model() {
        // Records read ahead that were used: in all, and after an overlay retired.
        let (mut used, mut used_retired) = (0, 0);
        for seed in 0..8u64 {
            let dir = tempfile::tempdir().unwrap();
            let mut rng = Rng::new(seed);
            // No buffer (a fold per commit), a small one, and one that never fills.
            let buffer = [0, 4 << 10, 64 << 20][seed as usize % 3];
            let mut store = Store::open(dir.path(), 1 << 20, buffer, buffer).unwrap();
            let mut model = Model::default();
            let keys: Vec<String> = (0..40).map(|i| format!("key-{i}")).collect();
            // Records read ahead (as the input thread does) a few steps before they
            // are used: commits, folds and reboots may come between.
            let mut ahead: Option<(usize, Vec<&str>, StoredAhead)> = None;
            for step in 0..1500 {
                let context = format!("seed {seed} step {step}");
                if ahead.as_ref().is_some_and(|(due, _, _)| *due == step) {
                    let (_, asked, stored) = ahead.take().unwrap();
                    let want: Vec<Option<KeyRecord>> = asked.iter().map(|k| model.committed.get(*k).cloned()).collect();
                    let age = stored.age(&store.retired);
                    let retired = age == Some(1) && store.retired_last.is_some();
                    used += usize::from(age == Some(0) || retired);
                    used_retired += usize::from(retired);
                    let mut got = Vec::new();
                    store.get_many(&asked, None, Some(&stored), &mut got).unwrap();
                    assert_eq!(got, want, "{context}, read ahead");
                }
                if ahead.is_none() && rng.range(0, 10) == 0 {
                    let mut asked: Vec<&str> =
                        keys.iter().map(String::as_str).filter(|_| rng.range(0, 2) == 0).collect();
                    asked.extend(["", "key-", "zzz"]);
                    for i in (1..asked.len()).rev() {
                        asked.swap(i, rng.range(0, i as i64 + 1) as usize);
                    }
                    let mut stored = StoredAhead::default();
                    store.page_reader().read(&asked, None, &mut stored).unwrap();
                    ahead = Some((step + rng.range(1, 6) as usize, asked, stored));
                }
                match rng.range(0, 100) {
                    // Change a key (update, remove, set or clear its timer).
                    0..=59 => {
                        let key = &keys[rng.range(0, keys.len() as i64) as usize];
                        let after = random_record(&mut rng, model.current(key).as_ref());
                        model.pending.insert(key.clone(), after);
                    }
                    // Commit the batch.
                    60..=79 => commit_pending(&mut store, &mut model, &mut rng),
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
                    // A fold on its own thread, waited for, as `fold_if_due` takes one
                    // that finished: its overlay is the one retired last until the next
                    // commit.
                    92..=93 => {
                        store.start_fold().unwrap();
                        store.settle().unwrap();
                    }
                    // Reboot: the uncommitted batch is lost, the rest survives; at
                    // times the crash comes in the middle of a fold.
                    _ => {
                        match rng.range(0, 3) {
                            0 => store.fold_chunks(rng.range(0, 4) as usize).unwrap(),
                            // A fold on its own thread, stopped short, while a commit
                            // goes on into the new log.
                            1 => {
                                store.background_chunks_max = rng.range(0, 4) as usize;
                                store.start_fold().unwrap();
                                commit_pending(&mut store, &mut model, &mut rng);
                            }
                            _ => {}
                        }
                        drop(store);
                        store = Store::open(dir.path(), 1 << 20, buffer, buffer).unwrap();
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
                    // Many at once, in no order, with keys never stored among them.
                    let mut asked: Vec<&str> =
                        keys.iter().map(String::as_str).filter(|_| rng.range(0, 2) == 0).collect();
                    asked.extend(["", "key-", "key-99", "zzz"]);
                    for i in (1..asked.len()).rev() {
                        asked.swap(i, rng.range(0, i as i64 + 1) as usize);
                    }
                    let want: Vec<Option<KeyRecord>> = asked.iter().map(|k| model.committed.get(*k).cloned()).collect();
                    // Appended after what `out` held.
                    let mut got = vec![None];
                    store.get_many(&asked, None, None, &mut got).unwrap();
                    assert_eq!(got.split_off(1), want, "{context}");
                    // With the keys' order given, and with a wrong one, which must not
                    // lose a record.
                    let mut order: Vec<u32> = (0..asked.len() as u32).collect();
                    order.sort_by_key(|&i| asked[i as usize]);
                    for (order, how) in [(order.clone(), "in order"), (order.into_iter().rev().collect(), "reversed")] {
                        let mut got = Vec::new();
                        store.get_many(&asked, Some(&order), None, &mut got).unwrap();
                        assert_eq!(got, want, "{context}, {how}");
                    }
                    // The merged views (sled and the unfolded commits) as well.
                    store.check_consistency().unwrap_or_else(|e| panic!("{context}: {e}"));
                    let stored: Vec<(String, KeyRecord)> = store.iter_keys().map(Result::unwrap).collect();
                    let want: Vec<(String, KeyRecord)> =
                        model.committed.iter().map(|(k, r)| (k.clone(), r.clone())).collect();
                    assert_eq!(stored, want, "{context}");
                }
            }
            store.check_consistency().unwrap();
            let stored: Vec<(String, KeyRecord)> = store.iter_keys().map(Result::unwrap).collect();
            let want: Vec<(String, KeyRecord)> = model.committed.into_iter().collect();
            assert_eq!(stored, want, "seed {seed}");
        }
        assert!(
            used > 100 && used_retired > 5,
            "records read ahead used {used} times, {used_retired} after a retirement"
        );
    }
}
