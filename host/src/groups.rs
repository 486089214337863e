//! A batch's records grouped by key, held in a few flat vectors instead of a string
//! per line and a vector per key: the lines back to back in one text, the keys back
//! to back in another, and the events a vector of spans of the text, ordered key by
//! key. Filling it allocates nothing once its vectors have grown to a batch's size,
//! so the input thread reuses a batch's groups for a later batch ([`Groups::clear`])
//! instead of faulting fresh memory in for every line.

use std::hash::BuildHasher;
use std::ops::Range;

use hashbrown::HashTable;

use crate::plugin::Event;

/// The fewest events a key, on average, for which [`Groups::finish`] also orders the
/// text key by key. At 10k sensors (50 a key) doing so made the run 6% faster; at 1M
/// sensors (1.25 a key) it made nothing faster and took 9 MiB more.
const REORDER_EVENTS_PER_KEY_MIN: usize = 2;

/// How many lines ahead [`Groups::finish`] asks for a line it copies.
const REORDER_LINES_AHEAD: usize = 16;

/// A record's event time and where its line lies in [`Groups::text`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    event_time_ms: Option<i64>,
    start: usize,
    end: usize,
}

/// A key: where it lies in [`Groups::key_text`], and where its events end in
/// [`Groups::events`] (while the batch is being read, how many it has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KeySpan {
    start: usize,
    end: usize,
    events_end: usize,
}

/// A batch's records grouped by key: keys in order of first appearance, each key's
/// events in arrival order.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    /// The records' lines back to back.
    text: String,
    /// The keys back to back: apart from the lines, so that the lookup of a line's key
    /// reads a few cache-hot bytes, not a line somewhere in the batch.
    key_text: String,
    keys: Vec<KeySpan>,
    /// In arrival order while the batch is being read, then key by key ([`Groups::finish`]).
    events: Vec<Span>,
    /// While the batch is being read: the key of each event, in arrival order.
    arrivals: Vec<u32>,
    /// The keys' numbers in the order of their bytes, made by [`Groups::finish`] on the
    /// thread that reads the batch, so that the batch loop need not sort a batch's
    /// keys to read them from the store ([`Groups::key_order`]).
    key_order: Vec<u32>,
}

/// What the thread that fills groups keeps from batch to batch, one for all of them:
/// the other half of the sort that [`Groups::finish`] does, and the numbers of the keys
/// of the groups being filled.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    text: String,
    events: Vec<Span>,
    numbers: KeyNumbers,
    /// The mean length of the last batch's grouped lines (late and bad ones left out),
    /// if it had any: from it the room for a batch is judged, and the lines left of a
    /// file read to its end.
    line_bytes: Option<usize>,
}

/// Makes room for `n` items in an empty vector. One too small is replaced, not grown:
/// growing copies the whole old allocation (a batch's, megabytes) into the new one.
/// Room the system refuses is not made: the vector grows as it is filled instead.
fn make_room<T>(v: &mut Vec<T>, n: usize) {
    debug_assert!(v.is_empty());
    if v.capacity() < n {
        let mut room = Vec::new();
        if room.try_reserve_exact(n).is_ok() {
            *v = room;
        }
    }
}

/// [`make_room`] for `n` bytes of an empty string.
fn make_room_in(s: &mut String, n: usize) {
    debug_assert!(s.is_empty());
    if s.capacity() < n {
        let mut room = String::new();
        if room.try_reserve_exact(n).is_ok() {
            *s = room;
        }
    }
}

/// The number of each key of the groups being filled, by the key's hash (foldhash,
/// randomly seeded: SipHash showed in profiles of this per-line lookup); the key itself
/// is held once, in the groups. Kept from batch to batch, so that the table is as large
/// as the batches have needed, not as `batch_keys_max` allows: one made for 50 000 keys
/// each batch, over 10 000 keys, missed the cache at each line (a sixth of the input
/// thread's time at 10M events over 10k sensors).
#[derive(Default)]
struct KeyNumbers {
    hasher: foldhash::fast::RandomState,
    /// Replaced when it has room for many times the keys of the last batch: one batch
    /// over millions of keys would leave the later ones a table that misses the cache.
    table: HashTable<u32>,
}

/// How many times the keys of the last batch [`KeyNumbers`]' table may have room for
/// before it is made anew for the next (at the least room for [`KEY_TABLE_KEPT_MIN`]).
const KEY_TABLE_SLACK: usize = 4;

/// Room for keys that [`KeyNumbers`]' table keeps in any case.
const KEY_TABLE_KEPT_MIN: usize = 1 << 16;

impl std::fmt::Debug for KeyNumbers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyNumbers({} keys)", self.table.len())
    }
}

/// Where a line's key stands among the keys of the groups being filled
/// ([`Scratch::number_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyNumber {
    /// The key has this number.
    Known(usize),
    /// The key is not there yet (its hash, for [`Scratch::add_key`]).
    New(u64),
}

impl Scratch {
    /// Forgets the keys of the groups filled last, keeping the memory: before a batch.
    pub fn start_batch(&mut self) {
        let table = &mut self.numbers.table;
        if table.capacity() > KEY_TABLE_KEPT_MIN.max(KEY_TABLE_SLACK * table.len()) {
            *table = HashTable::new();
        } else {
            table.clear();
        }
    }

    /// How many records, and bytes of lines, to make room for in a batch of at most
    /// `records_max` records and `bytes_max` bytes of input: judged by the last batch's
    /// lines, with a quarter more for lines a little longer than those (a vector grown
    /// when nearly full copies it all); `(0, 0)` before a first batch. Room made for
    /// more than a batch fills is address space, not memory: pages are given only as
    /// the lines are written.
    pub fn expected_batch(&self, records_max: usize, bytes_max: u64) -> (usize, usize) {
        let Some(line_bytes) = self.line_bytes else { return (0, 0) };
        let line_bytes = line_bytes.max(1);
        let with_slack = |n: usize| n.saturating_add(n / 4);
        let bytes_max = usize::try_from(bytes_max).unwrap_or(usize::MAX);
        let bytes = with_slack(records_max.saturating_mul(line_bytes)).min(bytes_max);
        (with_slack(bytes / line_bytes).min(records_max), bytes)
    }

    /// About how many lines `bytes` of input hold, judged by the last batch's lines
    /// (`None` before a first batch).
    pub fn lines_in(&self, bytes: u64) -> Option<u64> {
        // The mean is of the lines without their newlines.
        Some(bytes / (self.line_bytes? as u64 + 1))
    }

    /// The number of `key` in `groups`, which are being filled along with this scratch
    /// (since [`Scratch::start_batch`]).
    pub fn number_of(&self, groups: &Groups, key: &str) -> KeyNumber {
        let hash = self.numbers.hasher.hash_one(key);
        match self.numbers.table.find(hash, |&i| groups.is_key(i as usize, key)) {
            Some(&i) => KeyNumber::Known(i as usize),
            None => KeyNumber::New(hash),
        }
    }

    /// Numbers a key [`Scratch::number_of`] found new (`hash` is its hash) as the next
    /// key of `groups`, which is then pushed as that number.
    pub fn add_key(&mut self, groups: &Groups, hash: u64) {
        let KeyNumbers { hasher, table } = &mut self.numbers;
        // See `Groups::push` for the bound.
        table.insert_unique(hash, groups.len() as u32, |&i| hasher.hash_one(groups.key(i as usize)));
    }
}

impl Groups {
    /// Empties the groups, keeping their memory.
    pub fn clear(&mut self) {
        self.text.clear();
        self.key_text.clear();
        self.keys.clear();
        self.events.clear();
        self.arrivals.clear();
        self.key_order.clear();
    }

    /// Makes room for a batch of `keys` keys and `records` records whose lines take
    /// `text_bytes` (the groups are empty: see [`Groups::clear`]).
    pub fn reserve(&mut self, keys: usize, records: usize, text_bytes: usize) {
        debug_assert!(self.keys.is_empty() && self.events.is_empty() && self.text.is_empty());
        make_room(&mut self.keys, keys);
        make_room(&mut self.events, records);
        make_room(&mut self.arrivals, records);
        make_room_in(&mut self.text, text_bytes);
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// How many events.
    pub fn event_count(&self) -> usize {
        self.events.len()
    }

    /// The `i`th key.
    pub fn key(&self, i: usize) -> &str {
        let k = self.keys[i];
        &self.key_text[k.start..k.end]
    }

    /// Whether the `i`th key is `key`.
    pub fn is_key(&self, i: usize, key: &str) -> bool {
        let k = self.keys[i];
        self.key_text.as_bytes().get(k.start..k.end) == Some(key.as_bytes())
    }

    /// The keys, in order of first appearance.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| &self.key_text[k.start..k.end])
    }

    /// Adds a record of `line` to the key numbered `key_index`: an existing key, or the
    /// next one (`len()`), which `key` names.
    pub fn push(&mut self, key_index: usize, key: &str, line: &str, event_time_ms: Option<i64>) {
        let start = self.text.len();
        self.text.push_str(line);
        let end = self.text.len();
        if key_index == self.keys.len() {
            let key_start = self.key_text.len();
            self.key_text.push_str(key);
            self.keys.push(KeySpan { start: key_start, end: self.key_text.len(), events_end: 0 });
        }
        // Counts for now: `finish` turns them into ends.
        self.keys[key_index].events_end += 1;
        self.events.push(Span { event_time_ms, start, end });
        // A batch's keys are no more than its records, which `batch_events_max` bounds
        // far below 2^32 (a replayed batch was read under such a bound too).
        self.arrivals.push(key_index as u32);
    }

    /// Orders the events key by key (a counting sort, stable), once every record is in,
    /// and, with many events a key, the text with them: the plugin's calls then read
    /// their events' lines from one run of memory, not from all over a batch's text
    /// (a tenth of the calling thread's time went to waiting for those scattered lines).
    pub fn finish(&mut self, scratch: &mut Scratch) {
        if !self.events.is_empty() {
            scratch.line_bytes = Some(self.text.len() / self.events.len());
        }
        // See `Groups::push` for the bound.
        self.key_order.clear();
        self.key_order.extend(0..self.keys.len() as u32);
        let (keys, key_text) = (&self.keys, self.key_text.as_bytes());
        crate::key_order::sort_by_key(&mut self.key_order, |&i| {
            &key_text[keys[i as usize].start..keys[i as usize].end]
        });
        let mut at = 0;
        for k in &mut self.keys {
            let count = k.events_end;
            k.events_end = at;
            at += count;
        }
        // Each key with one event (most keys of a batch over many): already in order.
        if self.keys.len() == self.events.len() {
            for (i, k) in self.keys.iter_mut().enumerate() {
                k.events_end = i + 1;
            }
            self.arrivals.clear();
            return;
        }
        let sorted = &mut scratch.events;
        sorted.clear();
        make_room(sorted, self.events.len());
        sorted.resize(self.events.len(), Span { event_time_ms: None, start: 0, end: 0 });
        for (&span, &k) in self.events.iter().zip(&self.arrivals) {
            let next = &mut self.keys[k as usize].events_end;
            sorted[*next] = span;
            *next += 1;
        }
        std::mem::swap(&mut self.events, sorted);
        self.arrivals.clear();
        // With few events a key the lines are about as scattered either way, and the
        // copy would cost the input thread more than it saves (at 1M sensors), and
        // hold another batch's text.
        if self.events.len() < REORDER_EVENTS_PER_KEY_MIN * self.keys.len() {
            return;
        }
        // As much room as the groups' own text, for which it is swapped.
        let text = &mut scratch.text;
        text.clear();
        make_room_in(text, self.text.capacity());
        for j in 0..self.events.len() {
            // The lines are read in no order: each is asked for a few lines ahead, its
            // first byte and the one after it (which the slicing below reads).
            if let Some(ahead) = self.events.get(j + REORDER_LINES_AHEAD) {
                for at in [ahead.start, ahead.end] {
                    if let Some(byte) = self.text.as_bytes().get(at) {
                        crate::prefetch::prefetch(byte);
                    }
                }
            }
            let span = &mut self.events[j];
            let start = text.len();
            text.push_str(&self.text[span.start..span.end]);
            *span = Span { start, end: text.len(), ..*span };
        }
        std::mem::swap(&mut self.text, text);
    }

    /// The keys' numbers (as [`Groups::ranges`] counts them) in the order of their
    /// bytes; `None` before [`Groups::finish`] and after [`Groups::retain`].
    pub fn key_order(&self) -> Option<&[u32]> {
        (self.key_order.len() == self.keys.len()).then_some(&self.key_order[..])
    }

    /// The events, key by key, as the plugin takes them (after [`Groups::finish`]).
    pub fn events(&self) -> impl Iterator<Item = Event<'_>> {
        self.events.iter().map(|s| Event { event_time_ms: s.event_time_ms, payload: &self.text[s.start..s.end] })
    }

    /// Each key with the range of its events in [`Groups::events`].
    pub fn ranges(&self) -> impl Iterator<Item = (&str, Range<usize>)> {
        let mut start = 0;
        self.keys.iter().map(move |k| {
            let range = start..k.events_end;
            start = k.events_end;
            (&self.key_text[k.start..k.end], range)
        })
    }

    /// Keeps only the events `keep` answers true for (given the event and its key),
    /// and the keys left with events.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, Event<'_>) -> bool) {
        let (mut kept, mut keys_kept, mut start) = (0, 0, 0);
        for i in 0..self.keys.len() {
            let k = self.keys[i];
            let key = &self.key_text[k.start..k.end];
            let before = kept;
            for e in start..k.events_end {
                let span = self.events[e];
                let event = Event { event_time_ms: span.event_time_ms, payload: &self.text[span.start..span.end] };
                if keep(key, event) {
                    self.events[kept] = span;
                    kept += 1;
                }
            }
            start = k.events_end;
            if kept > before {
                self.keys[keys_kept] = KeySpan { events_end: kept, ..k };
                keys_kept += 1;
            }
        }
        self.events.truncate(kept);
        self.keys.truncate(keys_kept);
        self.key_order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Contents = Vec<(String, Vec<(Option<i64>, String)>)>;

    fn contents(g: &Groups) -> Contents {
        let events: Vec<Event<'_>> = g.events().collect();
        g.ranges()
            .map(|(key, r)| {
                (key.to_owned(), events[r].iter().map(|e| (e.event_time_ms, e.payload.to_owned())).collect())
            })
            .collect()
    }

    #[test]
    fn groups_key_by_key_in_arrival_order_and_reuses_its_memory() {
        let mut g = Groups::default();
        for round in 0..2 {
            g.clear();
            let lines = [("a", "a1", 1), ("b", "b1", 2), ("a", "a2", 3), ("c", "c1", 4), ("b", "b2", 5)];
            let mut names: Vec<&str> = Vec::new();
            for (key, payload, t) in lines {
                let line = format!("{{\"k\":\"{key}\",\"p\":\"{payload}\"}}");
                let i = names.iter().position(|k| *k == key).unwrap_or(names.len());
                if i == names.len() {
                    names.push(key);
                }
                g.push(i, key, &line, Some(t));
            }
            g.finish(&mut Scratch::default());
            let line = |k: &str, p: &str| format!("{{\"k\":\"{k}\",\"p\":\"{p}\"}}");
            assert_eq!(
                contents(&g),
                vec![
                    ("a".into(), vec![(Some(1), line("a", "a1")), (Some(3), line("a", "a2"))]),
                    ("b".into(), vec![(Some(2), line("b", "b1")), (Some(5), line("b", "b2"))]),
                    ("c".into(), vec![(Some(4), line("c", "c1"))]),
                ],
                "round {round}"
            );
            assert_eq!((g.len(), g.event_count()), (3, 5));
            assert_eq!(g.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
            assert_eq!(g.key(2), "c");
        }
        let text_address = g.text.as_ptr();
        g.clear();
        g.push(0, "x", "x", None);
        assert_eq!(g.text.as_ptr(), text_address, "the text keeps its allocation");
    }

    #[test]
    fn with_many_events_a_key_the_text_is_ordered_key_by_key_too() {
        let mut g = Groups::default();
        let mut scratch = Scratch::default();
        let lines = ["a1", "b1", "a2", "b2", "c1", "a3", "b3", "c2"];
        for line in lines {
            let key = &line[..1];
            g.push(["a", "b", "c"].iter().position(|k| *k == key).unwrap(), key, line, None);
        }
        g.finish(&mut scratch);
        assert_eq!(g.text, "a1a2a3b1b2b3c1c2", "8 events over 3 keys: reordered");
        let got: Vec<(String, Vec<String>)> =
            contents(&g).into_iter().map(|(k, e)| (k, e.into_iter().map(|(_, p)| p).collect())).collect();
        assert_eq!(
            got,
            [
                ("a".to_owned(), vec!["a1".to_owned(), "a2".into(), "a3".into()]),
                ("b".into(), vec!["b1".into(), "b2".into(), "b3".into()]),
                ("c".into(), vec!["c1".into(), "c2".into()]),
            ]
        );
        // The arrival-order text went to the scratch, for the next batch to use.
        assert_eq!(scratch.text, "a1b1a2b2c1a3b3c2");
    }

    #[test]
    fn room_for_a_batch_is_judged_by_the_last_ones_lines_and_then_not_grown() {
        let mut scratch = Scratch::default();
        assert_eq!(scratch.expected_batch(100, u64::MAX), (0, 0), "no batch yet");
        let mut g = Groups::default();
        for i in 0..4 {
            g.push(i, &format!("k{i}"), "0123456789", None);
        }
        g.finish(&mut scratch);
        // Lines of 10 bytes: a quarter more than 100 of them, or what the input allows.
        assert_eq!(scratch.expected_batch(100, u64::MAX), (100, 1250));
        assert_eq!(scratch.expected_batch(100, 500), (62, 500));
        g.clear();
        let (records, bytes) = scratch.expected_batch(100, u64::MAX);
        g.reserve(100, records, bytes);
        let room = (g.text.capacity(), g.events.capacity(), g.arrivals.capacity());
        assert!(room.0 >= 1250 && room.1 >= 100 && room.2 >= 100, "{room:?}");
        for i in 0..100 {
            g.push(i, &format!("k{i}"), "0123456789", None);
        }
        assert_eq!((g.text.capacity(), g.events.capacity(), g.arrivals.capacity()), room, "not grown");
    }

    #[test]
    fn one_event_per_key_needs_no_sort() {
        let mut g = Groups::default();
        for (i, k) in ["y", "x", "z"].into_iter().enumerate() {
            g.push(i, k, k, None);
        }
        assert_eq!(g.key_order(), None, "not finished");
        g.finish(&mut Scratch::default());
        // Calls keep the order of first appearance; the store reads in key order.
        assert_eq!(g.key_order(), Some(&[1, 0, 2][..]));
        assert_eq!(
            contents(&g).iter().map(|(k, e)| (k.as_str(), e.len())).collect::<Vec<_>>(),
            [("y", 1), ("x", 1), ("z", 1)]
        );
    }

    #[test]
    fn retain_drops_events_and_the_keys_left_without() {
        let mut g = Groups::default();
        for (k, t) in [("a", 1), ("b", 9), ("a", 8), ("c", 2), ("b", 3)] {
            g.push(["a", "b", "c"].iter().position(|x| *x == k).unwrap(), k, &format!("{k}{t}"), Some(t));
        }
        g.finish(&mut Scratch::default());
        assert_eq!(g.key_order(), Some(&[0, 1, 2][..]));
        let mut dropped = Vec::new();
        g.retain(|key, e| {
            let keep = e.event_time_ms.is_some_and(|t| t < 5) || key == "c";
            if !keep {
                dropped.push(e.payload.to_owned());
            }
            keep
        });
        assert_eq!(dropped, ["a8", "b9"]);
        assert_eq!(
            contents(&g),
            vec![
                ("a".into(), vec![(Some(1), "a1".into())]),
                ("b".into(), vec![(Some(3), "b3".into())]),
                ("c".into(), vec![(Some(2), "c2".into())]),
            ]
        );
        assert_eq!(g.key_order(), None, "the keys were renumbered");
        g.retain(|key, _| key == "b");
        assert_eq!(g.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(g.event_count(), 1);
    }
}
