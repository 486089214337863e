//! The overlay: committed key changes not yet folded into sled, merged per key, with
//! the deadlines they set. Reads look here first; a fold writes it into sled's pages
//! and empties it. It knows nothing of sled: what sled holds for a key is the store's
//! business, and the overlay's record for a key replaces it whole.
//!
//! Its size in memory decides how many keys a fold writes at once, and so how often
//! the store folds when the keys are many: a fold rewrites every page that holds one
//! of its keys. So it is kept compact. Each change is appended to one arena as the
//! bytes a page holds (the key and the `codec` encoding of its record), a hash table
//! of arena offsets (`key_index.rs`) finds a key's latest entry, and the timers point
//! at entries: for 300 000 keys of the sensor workload, about 78 bytes a key as
//! [`Overlay::bytes`] counts them (56 of arena, 14 of hash table, 8 of timer), where a
//! map of strings to records took about 250. An arena more than half garbage (entries
//! replaced by a later change of their key) is compacted.
//!
//! The timers are appended to buckets of nearby deadlines, never removed: a timer
//! whose entry a later change replaced is dead, skipped by the reads and dropped by
//! compaction. Deadlines of one workload fall in a few buckets, so a change costs a
//! push instead of a B-tree insert and remove (7% of a batch loop at a million keys),
//! and a read of the expired ones walks the buckets below its threshold only.
//!
//! The composite keys of 0.2 state (`state_keys.rs`, the only keys holding a `\0`) are
//! also kept in order within their scan group (`scan_groups.rs`, at the offset of an
//! entry of theirs), so that the entries of one list or map variable are found by a
//! range, not a pass over every key ([`Overlay::range_from`]).

use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;

use crate::codec;
use crate::key_index::{self, KeyIndex};
use crate::records::{KeyRecord, KeyRecordRef};
use crate::scan_groups::ScanGroups;

/// An entry's header: the key's length (u16), the record's length (u32, [`DELETED`]
/// for a deletion) and a byte of flags ([`REPLACED`]), little endian. The key and the
/// record's encoding follow. The record's deadline is in its encoding and in its
/// timer, not here: every byte an entry takes counts against the keys the overlay
/// holds before a fold.
const HEADER_BYTES: usize = 7;
const DELETED: u32 = u32::MAX;
/// Where the flags are in the header.
const FLAGS_AT: usize = 6;
/// A later entry of the same key replaced this one: it is garbage. Marked where the
/// entry lies, so that a pass over the live entries reads the arena in order instead
/// of following the hash table's offsets all over it.
const REPLACED: u8 = 2;
/// What a timer takes in its bucket's vector (dead ones too, until compaction).
const TIMER_BYTES: u64 = 8;
/// What a bucket of timers is charged beyond its timers: an estimate.
const BUCKET_BYTES: u64 = 64;
/// A bucket holds the deadlines of 2^16 ms (about a minute).
const BUCKET_SHIFT: u32 = 16;
/// How many keys ahead [`Overlay::prefetch_ahead`] asks for a key's slot.
const PREFETCH_AHEAD: usize = 16;
/// An arena is not compacted below this size.
const COMPACT_MIN_BYTES: usize = 1 << 20;

/// A key's hash in every overlay's table: one seed for the process, so that a key
/// looked up in the overlay and in the one being folded is hashed once.
pub(crate) fn hash(key: &str) -> u64 {
    static SEED: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    SEED.get_or_init(foldhash::fast::RandomState::default).hash_one(key)
}

/// One entry of the arena.
#[derive(Debug, Clone, Copy)]
struct Entry<'a> {
    key: &'a str,
    /// The encoded record (`None`: deleted).
    record: Option<&'a [u8]>,
    /// Whether a later entry of its key replaced it.
    replaced: bool,
    /// The entry's length in the arena.
    len: usize,
}

fn read_entry(arena: &[u8], at: usize) -> Entry<'_> {
    let head = &arena[at..at + HEADER_BYTES];
    let key_len = usize::from(u16::from_le_bytes([head[0], head[1]]));
    let record_len = u32::from_le_bytes([head[2], head[3], head[4], head[5]]);
    let flags = head[FLAGS_AT];
    let key_at = at + HEADER_BYTES;
    let key = std::str::from_utf8(&arena[key_at..key_at + key_len]).expect("the overlay appends keys as UTF-8");
    let record_at = key_at + key_len;
    let record = (record_len != DELETED).then(|| &arena[record_at..record_at + record_len as usize]);
    Entry { key, record, replaced: flags & REPLACED != 0, len: HEADER_BYTES + key_len + record.map_or(0, <[u8]>::len) }
}

/// The entries not replaced by a later one of their key (the live ones), with their
/// offsets, in the arena's order.
fn live_entries(arena: &[u8]) -> impl Iterator<Item = (usize, Entry<'_>)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < arena.len() {
            let entry = (at, read_entry(arena, at));
            at += entry.1.len;
            if !entry.1.replaced {
                return Some(entry);
            }
        }
        None
    })
}

/// The key of the entry at `at`, unchecked: what a hash probe compares (checking its
/// UTF-8 there cost more than the rest of the probe).
fn entry_key(arena: &[u8], at: usize) -> &[u8] {
    let key_len = usize::from(u16::from_le_bytes([arena[at], arena[at + 1]]));
    &arena[at + HEADER_BYTES..at + HEADER_BYTES + key_len]
}

/// An overlay's latest entries in key order ([`Overlay::sorted`]), held as their offsets
/// in its arena: a fold holds them while it runs, and the keys and records themselves
/// (pointers and lengths) took five times the memory.
#[derive(Debug, Default)]
pub(crate) struct SortedEntries<'o> {
    arena: &'o [u8],
    offsets: Vec<usize>,
}

impl<'o> SortedEntries<'o> {
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// The `i`th key.
    pub fn key(&self, i: usize) -> &'o str {
        read_entry(self.arena, self.offsets[i]).key
    }

    /// The `i`th key's bytes, unchecked: what a comparison reads.
    pub fn key_bytes(&self, i: usize) -> &'o [u8] {
        entry_key(self.arena, self.offsets[i])
    }

    /// The keys of `range` with their encoded records (`None`: deleted).
    pub fn range(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = (&'o str, Option<&'o [u8]>)> + '_ {
        self.offsets[range].iter().map(|&at| read_entry(self.arena, at)).map(|entry| (entry.key, entry.record))
    }

    /// Every key with its encoded record (`None`: deleted).
    pub fn into_entries(self) -> impl Iterator<Item = (&'o str, Option<&'o [u8]>)> {
        let arena = self.arena;
        self.offsets.into_iter().map(move |at| read_entry(arena, at)).map(|entry| (entry.key, entry.record))
    }
}

/// Committed changes not yet folded into sled.
#[derive(Default, Clone)]
pub(crate) struct Overlay {
    /// The entries, in the order they were applied.
    arena: Vec<u8>,
    /// The offset of each changed key's latest entry.
    index: KeyIndex,
    /// The deadlines of the entries, with their offsets (see [`Timers`]).
    timers: Timers,
    /// The bytes of the latest entries (the rest of the arena is garbage).
    live: usize,
    /// The keys holding a `\0` (0.2 state), by scan group, each group in key order: for
    /// each, the offset of one of its entries (the first the overlay took: a later
    /// change of the key leaves its bytes there, and compaction points it at the key's
    /// live entry).
    composite: ScanGroups<usize>,
}

impl std::fmt::Debug for Overlay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overlay").field("keys", &self.index.len()).field("bytes", &self.bytes()).finish()
    }
}

impl Overlay {
    /// An empty overlay whose arena has room for `bytes` of entries.
    pub fn with_arena_capacity(bytes: usize) -> Self {
        Self { arena: Vec::with_capacity(bytes), ..Self::default() }
    }

    /// The arena's room, in bytes.
    pub fn arena_capacity(&self) -> usize {
        self.arena.capacity()
    }

    /// Empties it, keeping its memory (the arena's and the hash table's room).
    pub fn clear(&mut self) {
        let Self { arena, index, timers, live, composite } = self;
        arena.clear();
        index.clear();
        timers.clear();
        *live = 0;
        composite.clear();
    }

    /// Applies one committed change.
    pub fn apply(&mut self, key: &str, after: Option<&KeyRecord>) {
        let encode = after.map(|record| |arena: &mut Vec<u8>| codec::encode_into(arena, record));
        self.append(key, hash(key), after.and_then(|r| r.timeout_ms), encode);
    }

    /// Applies one committed change whose record is encoded already (`codec`), with the
    /// record's deadline, given the key's [`hash`] (a commit hashed its keys to ask for
    /// their slots ahead, see [`Overlay::prefetch_ahead`]).
    pub fn apply_encoded(&mut self, key: &str, key_hash: u64, record: Option<&[u8]>, deadline: Option<i64>) {
        let write_record = record.map(|bytes| |arena: &mut Vec<u8>| arena.extend_from_slice(bytes));
        self.append(key, key_hash, deadline, write_record);
    }

    /// Appends a change's entry (`write_record` appends the record's encoding, `None`
    /// for a deletion) and makes it its key's latest.
    fn append(
        &mut self,
        key: &str,
        key_hash: u64,
        deadline: Option<i64>,
        write_record: Option<impl FnOnce(&mut Vec<u8>)>,
    ) {
        let at = self.arena.len();
        let key_len = u16::try_from(key.len()).expect("keys are at most KEY_BYTES_MAX long");
        self.arena.extend_from_slice(&key_len.to_le_bytes());
        self.arena.extend_from_slice(&DELETED.to_le_bytes());
        self.arena.push(0);
        self.arena.extend_from_slice(key.as_bytes());
        if let Some(write_record) = write_record {
            let record_at = self.arena.len();
            write_record(&mut self.arena);
            let record_len = u32::try_from(self.arena.len() - record_at).expect("records are at most RECORD_BYTES_MAX");
            self.arena[at + 2..at + 6].copy_from_slice(&record_len.to_le_bytes());
        }
        let Self { arena, index, timers, live, composite } = self;
        match index.find(key_hash, |at| entry_key(arena, at) == key.as_bytes()) {
            Some(position) => {
                let replaced = index.offset_at(position);
                // Its timer, if any, is dead from now on.
                *live -= read_entry(arena, replaced).len;
                arena[replaced + FLAGS_AT] |= REPLACED;
                index.set_offset(position, at);
            }
            None => {
                if index.is_full() {
                    // The live entries, read in the arena's order, include this one.
                    index.rebuild(index.len() + 1, live_entries(arena).map(|(at, e)| (hash(e.key), at)));
                } else {
                    index.insert_new(key_hash, at);
                }
                if key.as_bytes().contains(&0) {
                    composite.insert_new(key.as_bytes(), at, |at| entry_key(arena, at));
                }
            }
        }
        if let Some(deadline) = deadline {
            timers.push(deadline, at);
        }
        *live += arena.len() - at;
        if arena.len() > COMPACT_MIN_BYTES && arena.len() > 2 * *live {
            self.compact();
        }
    }

    /// Copies the latest entries into a new arena, in their order, and drops the rest.
    fn compact(&mut self) {
        let Self { arena, index, timers, live, composite, .. } = self;
        let mut kept = Vec::with_capacity(*live * 3 / 2);
        // (old offset, new offset), in the order of both.
        let mut moved: Vec<(usize, usize)> = Vec::with_capacity(index.len());
        for (at, entry) in live_entries(arena) {
            moved.push((at, kept.len()));
            kept.extend_from_slice(&arena[at..at + entry.len]);
        }
        index.rebuild(index.len(), live_entries(&kept).map(|(at, e)| (hash(e.key), at)));
        timers.retain_map(|old| {
            let i = moved.binary_search_by_key(&old, |m| m.0).ok()?;
            Some(moved[i].1)
        });
        // A composite key's offset may be of an entry a later one replaced: each now
        // points at its key's live entry.
        composite.remap(|at| {
            let key = read_entry(arena, at).key;
            let position = index.find(hash(key), |at| entry_key(&kept, at) == key.as_bytes());
            index.offset_at(position.expect("a composite key is held"))
        });
        *arena = kept;
    }

    /// The committed record of `key` (encoded), if the overlay has one: `Some(None)`
    /// for a key it deleted, `None` for a key it does not hold (look in sled).
    pub fn get(&self, key: &str) -> Option<Option<&[u8]>> {
        self.get_hashed(key, hash(key))
    }

    /// [`Overlay::get`] for a key whose [`hash`] is known: a read that looks in two
    /// overlays hashes the key once.
    pub fn get_hashed(&self, key: &str, hash: u64) -> Option<Option<&[u8]>> {
        let position = self.index.find(hash, |at| entry_key(&self.arena, at) == key.as_bytes())?;
        Some(read_entry(&self.arena, self.index.offset_at(position)).record)
    }

    /// For a caller looking up or changing the keys of `hashes` in order, at the
    /// `i`th: asks the CPU for the slot that the lookup of a key [`PREFETCH_AHEAD`]
    /// places later reads first, and for the entry that the lookup of a key half as far
    /// will most likely compare (its slot, asked for earlier, should be in the cache by
    /// now). At a million keys, a lookup not asked for ahead waited on memory twice.
    pub fn prefetch_ahead(&self, hashes: &[u64], i: usize) {
        if let Some(&far) = hashes.get(i + PREFETCH_AHEAD) {
            self.index.prefetch(far);
        }
        let near = hashes.get(i + PREFETCH_AHEAD / 2).and_then(|&near| self.index.first_candidate(near));
        if let Some(at) = near {
            // The header and key, and the record after them.
            crate::prefetch::prefetch(&self.arena[at]);
            if let Some(byte) = self.arena.get(at + 63) {
                crate::prefetch::prefetch(byte);
            }
        }
    }

    /// Whether the overlay holds `key` (its record replaces sled's).
    pub fn holds(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Every changed key with its encoded record (`None`: deleted), in key order.
    pub fn sorted(&self) -> SortedEntries<'_> {
        // The live entries in the arena's order, which the sort's passes over the keys
        // then read in that order too (through the hash table, each entry was a cache
        // miss, three times).
        let arena = &self.arena[..];
        let mut offsets: Vec<usize> = Vec::with_capacity(self.index.len());
        offsets.extend(live_entries(arena).map(|(at, _)| at));
        crate::key_order::sort_by_key(&mut offsets, |&at| entry_key(arena, at));
        SortedEntries { arena, offsets }
    }

    /// The composite keys (those holding a `\0`) from `start` on within its scan group
    /// (`state_keys::scan_group`: the keys of one group key, or the expiry index), in key
    /// order, with their encoded records (`None`: deleted). No 0.2 range leaves the
    /// scan group it starts in; a `start` in none finds nothing.
    pub fn range_from<'s>(&'s self, start: &'s str) -> impl Iterator<Item = (&'s str, Option<&'s [u8]>)> + 's {
        let arena = &self.arena[..];
        let offsets = self.composite.range_from(start.as_bytes(), |at| entry_key(arena, at));
        // An entry not replaced is its key's latest: its record needs no lookup.
        offsets.map(|at| read_entry(arena, at)).filter_map(|entry| {
            let record = if entry.replaced { self.get(entry.key)? } else { entry.record };
            Some((entry.key, record))
        })
    }

    /// Its deadlines below `threshold` (all for `None`), in (deadline, key) order.
    pub fn timers_below(&self, threshold: Option<i64>) -> impl Iterator<Item = (i64, &str)> {
        let mut below: Vec<(i64, &str)> = self
            .timers
            .below(threshold)
            .filter_map(|(deadline, at)| {
                let entry = read_entry(&self.arena, at);
                (!entry.replaced).then_some((deadline, entry.key))
            })
            .collect();
        below.sort_unstable();
        below.into_iter()
    }

    /// About how much memory it takes.
    pub fn bytes(&self) -> u64 {
        self.arena.len() as u64
            + self.index.slots() as u64 * key_index::SLOT_BYTES
            + self.timers.bytes()
            + self.composite.bytes()
    }

    /// Checks that each key has one entry, its records are not empty and decode, and
    /// its deadlines are those of its records.
    pub fn check(&self) -> Result<(), String> {
        let (mut want, mut live) = (BTreeSet::new(), 0);
        for at in self.index.offsets() {
            let entry = read_entry(&self.arena, at);
            if self.index.find(hash(entry.key), |a| a == at).is_none() {
                return Err(format!("key {:?} is not where its hash says", entry.key));
            }
            if entry.replaced {
                return Err(format!("the latest entry of key {:?} is marked replaced", entry.key));
            }
            if let Some(bytes) = entry.record {
                let record: KeyRecord = codec::decode("overlay record", bytes).map_err(|e| e.to_string())?;
                if record.is_empty() {
                    return Err(format!("empty record for key {:?} in the overlay", entry.key));
                }
                if let Some(deadline) = record.timeout_ms {
                    want.insert((deadline, at));
                }
            }
            live += entry.len;
        }
        let mut timers = BTreeSet::new();
        for (deadline, at) in self.timers.below(None) {
            let entry = read_entry(&self.arena, at);
            let record = entry.record.map(|bytes| codec::borrow_decode::<KeyRecordRef<'_>>("overlay record", bytes));
            let record = record.transpose().map_err(|e| e.to_string())?;
            if record.and_then(|r| r.timeout_ms) != Some(deadline) {
                return Err(format!("a timer of key {:?} is not its entry's deadline", entry.key));
            }
            if !entry.replaced && !timers.insert((deadline, at)) {
                return Err(format!("key {:?} has two timers", entry.key));
            }
        }
        if want != timers {
            return Err(format!("the overlay's {} live timers are not its records' {}", timers.len(), want.len()));
        }
        if live != self.live {
            return Err(format!("the overlay counts {} live bytes, its entries take {live}", self.live));
        }
        let unreplaced = live_entries(&self.arena).count();
        if unreplaced != self.index.len() {
            return Err(format!("{unreplaced} entries are not marked replaced, {} keys are held", self.index.len()));
        }
        self.check_composite()
    }

    /// Checks that the composite keys are those of the held keys holding a `\0`, each
    /// once, in its scan group, in order.
    fn check_composite(&self) -> Result<(), String> {
        let arena = &self.arena[..];
        let grouped = self.composite.check(
            |at| entry_key(arena, at),
            |key, _| match std::str::from_utf8(key).ok().filter(|key| self.get(key).is_some()) {
                Some(_) => Ok(()),
                None => Err(format!("composite key {:?} is not held", String::from_utf8_lossy(key))),
            },
        )?;
        let held = self.index.offsets().filter(|&at| read_entry(arena, at).key.contains('\0')).count();
        if grouped != held {
            return Err(format!("{grouped} composite keys are grouped, {held} are held"));
        }
        Ok(())
    }
}

/// The timers of an overlay: each a deadline and its entry's offset, appended to the
/// bucket of its deadline, in the order applied. A timer is never removed here: the
/// overlay knows one whose entry was replaced is dead, and compaction drops it.
///
/// A timer is one u64: the entry's offset above the deadline's bits within its bucket
/// (the bucket gives the rest), half an (i64, usize) pair: 8 bytes a key less of the
/// overlay's budget, so more keys before a fold.
#[derive(Debug, Default, Clone)]
struct Timers {
    buckets: BTreeMap<i64, Vec<u64>>,
    /// The timers in all buckets, dead ones included.
    len: usize,
}

/// The bits of a deadline within its bucket.
const IN_BUCKET: u64 = (1 << BUCKET_SHIFT) - 1;

fn pack_timer(deadline: i64, at: usize) -> u64 {
    let at = u64::try_from(at).ok().filter(|&at| at >> (64 - BUCKET_SHIFT) == 0);
    let at = at.expect("an overlay's arena is smaller than 2^48 bytes");
    (at << BUCKET_SHIFT) | (deadline as u64 & IN_BUCKET)
}

/// A timer of the bucket `bucket`, unpacked: its deadline and its entry's offset.
fn unpack_timer(bucket: i64, timer: u64) -> (i64, usize) {
    ((bucket << BUCKET_SHIFT) | (timer & IN_BUCKET) as i64, (timer >> BUCKET_SHIFT) as usize)
}

impl Timers {
    fn push(&mut self, deadline: i64, at: usize) {
        self.buckets.entry(deadline >> BUCKET_SHIFT).or_default().push(pack_timer(deadline, at));
        self.len += 1;
    }

    fn clear(&mut self) {
        self.buckets.clear();
        self.len = 0;
    }

    /// The timers below `threshold` (all for `None`), dead ones included, in no order.
    fn below(&self, threshold: Option<i64>) -> impl Iterator<Item = (i64, usize)> + '_ {
        // The buckets up to the threshold's hold every deadline below it.
        let last = match threshold {
            Some(t) => t.checked_sub(1).map(|t| t >> BUCKET_SHIFT),
            None => Some(i64::MAX),
        };
        let buckets = last.map(|last| self.buckets.range(..=last)).into_iter().flatten();
        buckets
            .flat_map(|(&bucket, timers)| timers.iter().map(move |&timer| unpack_timer(bucket, timer)))
            .filter(move |&(d, _)| threshold.is_none_or(|t| d < t))
    }

    /// Keeps the timers for which `new_offset` gives an offset, moved there.
    fn retain_map(&mut self, mut new_offset: impl FnMut(usize) -> Option<usize>) {
        self.len = 0;
        self.buckets.retain(|&bucket, timers| {
            timers.retain_mut(|timer| {
                let (deadline, at) = unpack_timer(bucket, *timer);
                new_offset(at).map(|moved| *timer = pack_timer(deadline, moved)).is_some()
            });
            self.len += timers.len();
            !timers.is_empty()
        });
    }

    /// About how much memory they take.
    fn bytes(&self) -> u64 {
        self.len as u64 * TIMER_BYTES + self.buckets.len() as u64 * BUCKET_BYTES
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn rec(value: u8, timeout_ms: Option<i64>) -> KeyRecord {
        KeyRecord { value: Some(vec![value; usize::from(value)]), timeout_ms, schema_version: 1 }
    }

    fn decoded(overlay: &Overlay, key: &str) -> Option<Option<KeyRecord>> {
        overlay.get(key).map(|r| r.map(|bytes| codec::decode("test", bytes).unwrap()))
    }

    #[test]
    fn a_key_changed_again_keeps_one_record_and_one_timer() {
        let mut overlay = Overlay::default();
        overlay.apply("a", Some(&rec(1, Some(5))));
        overlay.apply("a", Some(&rec(2, Some(9))));
        overlay.apply("b", Some(&rec(3, Some(9))));
        overlay.apply("b", Some(&rec(3, Some(9))));
        overlay.apply("c", Some(&rec(4, None)));
        overlay.apply("c", None);
        overlay.check().unwrap();
        let timers: Vec<_> = overlay.timers_below(None).collect();
        assert_eq!(timers, [(9, "a"), (9, "b")]);
        assert_eq!(decoded(&overlay, "a"), Some(Some(rec(2, Some(9)))));
        assert_eq!(overlay.get("c"), Some(None));
        assert_eq!(overlay.get("d"), None);
        let keys: Vec<&str> = overlay.sorted().into_entries().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "b", "c"]);
    }

    #[test]
    fn a_cleared_overlay_is_empty_keeps_its_room_and_works_as_a_new_one() {
        let mut overlay = Overlay::default();
        for i in 0..1000 {
            overlay.apply(&format!("k{i}"), Some(&rec(1, Some(i))));
        }
        overlay.apply("a\0b", Some(&rec(2, None)));
        let room = overlay.arena_capacity();
        overlay.clear();
        overlay.check().unwrap();
        assert_eq!(overlay.get("k1"), None);
        assert!(overlay.sorted().into_entries().next().is_none());
        assert_eq!(overlay.timers_below(None).count(), 0);
        assert_eq!(overlay.range_from("a").count(), 0);
        assert_eq!(overlay.arena_capacity(), room, "its memory is kept");
        overlay.apply("k1", Some(&rec(3, Some(7))));
        overlay.check().unwrap();
        assert_eq!(decoded(&overlay, "k1"), Some(Some(rec(3, Some(7)))));
        assert_eq!(overlay.timers_below(None).collect::<Vec<_>>(), [(7, "k1")]);
    }

    /// The composite keys' ranges, as 0.2 state reads them (within a scan group), match
    /// the model's.
    fn check_ranges(overlay: &Overlay, model: &BTreeMap<String, Option<KeyRecord>>) {
        let starts = (0..200).step_by(7).map(|g| format!("g{g}\0")).chain((0..3).map(|g| format!("big{g}\0")));
        let starts = starts.chain(["g3\0v2".into(), "big1\0v3".into(), "\u{1}ep".into(), "\u{1}ep150".into()]);
        for start in starts {
            let group = crate::state_keys::scan_group(&start).expect("a scan group");
            let want: Vec<(&str, Option<KeyRecord>)> = model
                .range(start.clone()..)
                .take_while(|(k, _)| k.starts_with(group))
                .map(|(k, r)| (k.as_str(), r.clone()))
                .collect();
            let got: Vec<(&str, Option<KeyRecord>)> = overlay
                .range_from(&start)
                .map(|(k, r)| (k, r.map(|bytes| codec::decode("test", bytes).unwrap())))
                .collect();
            assert_eq!(got, want, "from {start:?}");
        }
    }

    /// Many changes over few keys (so that the arena is compacted many times) against
    /// a map of the latest record of each key, and their ranges of composite keys too.
    #[test]
    fn matches_a_map_of_the_latest_changes_through_compactions() {
        let mut overlay = Overlay::default();
        let mut model: BTreeMap<String, Option<KeyRecord>> = BTreeMap::new();
        let mut seed = 7u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut arena_max = 0;
        for i in 0..200_000 {
            let key = match next(4) {
                // 0.2 keys: groups of a few keys, groups past `scan_groups`' few (32), and
                // the expiry index's one scan group.
                0 if next(2) == 0 => format!("g{}\0v{}", next(200), next(4)),
                0 => format!("big{}\0v{}", next(3), next(48)),
                1 => format!("\u{1}ep{:03}\0{}", next(300), next(3)),
                _ => format!("key-{}", next(500)),
            };
            let record = match next(4) {
                0 => None,
                1 => Some(rec(next(200) as u8 + 1, None)),
                // Deadlines over many buckets, below zero too.
                _ => Some(rec(next(200) as u8 + 1, Some((next(50) as i64 - 25) * 30_000))),
            };
            overlay.apply(&key, record.as_ref());
            model.insert(key, record);
            arena_max = arena_max.max(overlay.arena.len());
            if i % 20_000 == 0 {
                overlay.check().unwrap();
                check_ranges(&overlay, &model);
            }
        }
        overlay.check().unwrap();
        check_ranges(&overlay, &model);
        // Compacted: the arena never held more than twice its live entries.
        assert!(arena_max <= COMPACT_MIN_BYTES.max(2 * overlay.live) + 300, "{arena_max}");
        for (key, record) in &model {
            assert_eq!(decoded(&overlay, key), Some(record.clone()), "{key}");
        }
        let sorted: Vec<(&str, Option<KeyRecord>)> = overlay
            .sorted()
            .into_entries()
            .map(|(k, r)| (k, r.map(|bytes| codec::decode("test", bytes).unwrap())))
            .collect();
        let want: Vec<(&str, Option<KeyRecord>)> = model.iter().map(|(k, r)| (k.as_str(), r.clone())).collect();
        assert_eq!(sorted, want);
        let mut timers: Vec<(i64, &str)> =
            model.iter().filter_map(|(k, r)| r.as_ref()?.timeout_ms.map(|d| (d, k.as_str()))).collect();
        timers.sort_unstable();
        assert_eq!(overlay.timers_below(None).collect::<Vec<_>>(), timers);
        for threshold in [i64::MIN, -700_000, -1, 0, 1, 15_000, 90_001, i64::MAX] {
            let below: Vec<(i64, &str)> = timers.iter().copied().filter(|t| t.0 < threshold).collect();
            assert_eq!(overlay.timers_below(Some(threshold)).collect::<Vec<_>>(), below, "below {threshold}");
        }
    }
}
