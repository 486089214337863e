//! A page: the records of one range of keys, stored by the store as one sled value.
//!
//! sled's cost per operation grows steeply with the number of items in its tree (on
//! this machine, about 1.8 µs per write at 20 000 items and 25 µs at 2 million, for
//! small values): one item per key made a store of a million keys pay that price three
//! times per changed key (the record and two deadline-index entries). A page holds the
//! records of the keys from its start key up to the next page's start, sorted, and a
//! page outgrowing [`PAGE_BYTES_MAX`] is split; the deadline index holds one entry per
//! page (its earliest deadline). So a million small keys make a few thousand pages,
//! and a fold writes each changed page once.
//!
//! Why 16 KiB: a fold writes every page one of its keys falls in, and at a million keys
//! that is nearly all of them, so sled's cost per item written (and per item stepped
//! over by a walk) is paid per page. At 10M events over 1M sensors, 16 KiB pages ran
//! 4–7% faster than 8 KiB (BENCHMARKS.md). sled's leaves hold up to 16 items, and it
//! writes a leaf over a quarter of its log segment as a file of its own, so the store's
//! segments are 1 MiB (`store::SEGMENT_BYTES`); 24 and 32 KiB pages ran a few percent
//! faster still but peaked past the 256 MiB budget there.

use crate::codec::{self, DecodeError};
use crate::key_order::cmp_keys;
use crate::records::{KeyRecord, KeyRecordRef};

/// A page is split when its encoding grows past this (a few in tests, so that the
/// model test splits and empties pages all the time).
pub(crate) const PAGE_BYTES_MAX: usize = if cfg!(test) { 64 } else { 16 << 10 };

/// The records of one key range, sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Page {
    entries: Vec<(String, KeyRecord)>,
}

impl Page {
    /// Decodes a page read from the store, checking that its keys are sorted and its
    /// records not empty (assert at the storage boundary).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let view = View::new(bytes)?;
        let mut entries: Vec<(String, KeyRecord)> = Vec::with_capacity(view.count);
        for i in 0..view.count {
            let (key, record) = view.entry(i)?;
            entries.push((key.to_owned(), codec::decode("page record", record)?));
        }
        let sorted = entries.windows(2).all(|w| w[0].0 < w[1].0);
        let whole = entries.iter().all(|(_, r)| !r.is_empty());
        if !sorted || !whole {
            return Err(DecodeError::invalid("page", "keys out of order or an empty record"));
        }
        Ok(Self { entries })
    }

    /// The record of `key` in an encoded page, found by binary search over the page's
    /// offset table, decoding that record only: the read path of a key not in memory.
    pub fn lookup(bytes: &[u8], key: &str) -> Result<Option<KeyRecord>, DecodeError> {
        Self::lookup_raw(bytes, key)?.map(|record| codec::decode("page record", record)).transpose()
    }

    /// The encoded record of `key` in an encoded page, as [`Page::lookup`] finds it.
    pub fn lookup_raw<'a>(bytes: &'a [u8], key: &str) -> Result<Option<&'a [u8]>, DecodeError> {
        let view = View::new(bytes)?;
        let i = view.first_at_or_above(key.as_bytes())?;
        if i == view.count {
            return Ok(None);
        }
        match view.raw_entry(i)? {
            (found, record) if found == key.as_bytes() => Ok(Some(record)),
            _ => Ok(None),
        }
    }

    /// The entries of an encoded page from the first key at or above `start` on, in key
    /// order, each record decoded as it is reached: a scan of a few keys of a page
    /// decodes those only.
    pub fn entries_from<'a>(
        bytes: &'a [u8],
        start: &str,
    ) -> Result<impl Iterator<Item = Result<(&'a str, KeyRecord), DecodeError>> + 'a, DecodeError> {
        let view = View::new(bytes)?;
        let first = view.first_at_or_above(start.as_bytes())?;
        Ok((first..view.count).map(move |i| {
            let (key, record) = view.entry(i)?;
            Ok((key, codec::decode("page record", record)?))
        }))
    }

    /// The page's encoding: the count of records (u32), the offset of each record's
    /// entry (u32 each), then the entries, each a key (u16 length, UTF-8) and a
    /// record (u32 length, `codec`), little endian. The offsets let a read find one key
    /// without decoding the others.
    pub fn encode(&self) -> Vec<u8> {
        let records: Vec<Vec<u8>> = self.entries.iter().map(|(_, r)| codec::encode(r)).collect();
        encode_entries(self.entries.iter().zip(&records).map(|((k, _), r)| (k.as_bytes(), r.as_slice())))
    }

    /// Merges `changes` (sorted by key, each an encoded record to set or `None` to
    /// remove) into the encoded page `bytes` (`None`: no page yet), copying the
    /// records as they are: a fold changes a few records of each page it writes, and
    /// decoding and re-encoding the others cost as much as sled's write.
    pub fn merge<'c>(
        bytes: Option<&[u8]>,
        changes: impl IntoIterator<Item = (&'c str, Option<&'c [u8]>)>,
    ) -> Result<Merged, DecodeError> {
        let view = bytes.map(View::new).transpose()?;
        let count = view.as_ref().map_or(0, |v| v.count);
        let mut old_min: Option<i64> = None;
        let mut new_min: Option<i64> = None;
        // Keys as the page holds them: their UTF-8 is checked where a page is decoded.
        let mut kept: Vec<(&[u8], &[u8])> = Vec::with_capacity(count + 4);
        let mut changes = changes.into_iter().peekable();
        let mut at = 0;
        loop {
            let old = match &view {
                Some(v) if at < count => Some(v.raw_entry(at)?),
                _ => None,
            };
            let next_change = changes.peek().map(|(k, _)| k.as_bytes());
            let take_old = match (old, next_change) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((k, _)), Some(c)) => cmp_keys(k, c).is_lt(),
            };
            if take_old {
                let (key, record) = old.expect("take_old implies an old entry");
                let deadline = codec::borrow_decode::<KeyRecordRef<'_>>("page record", record)?.timeout_ms;
                old_min = min_of(old_min, deadline);
                new_min = min_of(new_min, deadline);
                if kept.last().is_some_and(|(k, _)| cmp_keys(k, key).is_ge()) {
                    return Err(DecodeError::invalid("page", "keys out of order"));
                }
                kept.push((key, record));
                at += 1;
                continue;
            }
            let (key, record) = changes.next().expect("a change is next");
            let key = key.as_bytes();
            if let Some((_, old_record)) = old.filter(|(k, _)| *k == key) {
                old_min =
                    min_of(old_min, codec::borrow_decode::<KeyRecordRef<'_>>("page record", old_record)?.timeout_ms);
                at += 1;
            }
            if let Some(record) = record {
                new_min = min_of(new_min, codec::borrow_decode::<KeyRecordRef<'_>>("page record", record)?.timeout_ms);
                kept.push((key, record));
            }
        }
        let bytes = encode_entries(kept.iter().copied());
        Ok(Merged { bytes, count: kept.len(), old_min, new_min })
    }

    /// The records, in key order.
    pub fn entries(&self) -> &[(String, KeyRecord)] {
        &self.entries
    }

    /// Whether the page holds no record.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The record of `key`, if the page holds one.
    #[cfg(test)]
    pub fn get(&self, key: &str) -> Option<&KeyRecord> {
        self.entries.binary_search_by(|(k, _)| k.as_str().cmp(key)).ok().map(|i| &self.entries[i].1)
    }

    /// Sets (or, with `None`, removes) the record of `key`.
    #[cfg(test)]
    pub fn set(&mut self, key: &str, record: Option<KeyRecord>) {
        match (self.entries.binary_search_by(|(k, _)| k.as_str().cmp(key)), record) {
            (Ok(i), Some(r)) => self.entries[i].1 = r,
            (Ok(i), None) => {
                self.entries.remove(i);
            }
            (Err(i), Some(r)) => self.entries.insert(i, (key.to_owned(), r)),
            (Err(_), None) => {}
        }
    }

    /// The earliest deadline of the page's records: its deadline-index entry.
    pub fn min_deadline(&self) -> Option<i64> {
        self.entries.iter().filter_map(|(_, r)| r.timeout_ms).min()
    }

    /// Splits a page whose encoding passes [`PAGE_BYTES_MAX`] into pieces of about
    /// half the limit each, in key order, each with its fence (the first key above
    /// it): a piece's fence is the next piece's first key, the last keeps `fence`. A
    /// page within the limit (or of one record, however large) comes back whole.
    pub fn split(self, fence: Vec<u8>, encoded_len: usize) -> Vec<(Vec<u8>, Page)> {
        let pieces = encoded_len.div_ceil(PAGE_BYTES_MAX / 2).min(self.entries.len());
        if encoded_len <= PAGE_BYTES_MAX || pieces < 2 {
            return vec![(fence, self)];
        }
        let per_piece = self.entries.len().div_ceil(pieces);
        let mut groups: Vec<Vec<(String, KeyRecord)>> = Vec::with_capacity(pieces);
        let mut entries = self.entries.into_iter().peekable();
        while entries.peek().is_some() {
            groups.push(entries.by_ref().take(per_piece).collect());
        }
        let mut fences: Vec<Vec<u8>> = groups.iter().skip(1).map(|g| g[0].0.as_bytes().to_vec()).collect();
        fences.push(fence);
        let out: Vec<(Vec<u8>, Page)> =
            fences.into_iter().zip(groups).map(|(fence, entries)| (fence, Page { entries })).collect();
        out
    }
}

/// A page after [`Page::merge`].
#[derive(Debug)]
pub(crate) struct Merged {
    /// Its encoding.
    pub bytes: Vec<u8>,
    /// Its records.
    pub count: usize,
    /// The earliest deadline of the page before the merge.
    pub old_min: Option<i64>,
    /// The earliest deadline after it.
    pub new_min: Option<i64>,
}

fn min_of(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Encodes sorted entries (key, encoded record) as a page (see [`Page::encode`]).
fn encode_entries<'e>(entries: impl Iterator<Item = (&'e [u8], &'e [u8])> + Clone) -> Vec<u8> {
    let (count, body) = entries.clone().fold((0, 0), |(n, len), (k, r)| (n + 1, len + 6 + k.len() + r.len()));
    let table = 4 + 4 * count;
    let mut out = Vec::with_capacity(table + body);
    out.extend_from_slice(&(count as u32).to_le_bytes());
    let mut offset = table;
    for (key, record) in entries.clone() {
        out.extend_from_slice(&(offset as u32).to_le_bytes());
        offset += 6 + key.len() + record.len();
    }
    for (key, record) in entries {
        // Keys are at most `KEY_BYTES_MAX` (4 KiB) long: the store refuses longer.
        out.extend_from_slice(&(key.len() as u16).to_le_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(&(record.len() as u32).to_le_bytes());
        out.extend_from_slice(record);
    }
    out
}

/// An encoded page, read in place.
struct View<'a> {
    bytes: &'a [u8],
    count: usize,
}

impl<'a> View<'a> {
    fn new(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let count = read_u32(bytes, 0)? as usize;
        if 4 + 4 * count > bytes.len() {
            return Err(DecodeError::invalid("page", "offset table past the end"));
        }
        Ok(Self { bytes, count })
    }

    /// The index of the first entry whose key is at or above `key` (`count` if none),
    /// by binary search over the offset table.
    fn first_at_or_above(&self, key: &[u8]) -> Result<usize, DecodeError> {
        let (mut low, mut high) = (0, self.count);
        while low < high {
            let mid = (low + high) / 2;
            if cmp_keys(self.raw_key(mid)?, key).is_lt() {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        Ok(low)
    }

    /// The key and the encoded record of entry `i`.
    fn entry(&self, i: usize) -> Result<(&'a str, &'a [u8]), DecodeError> {
        let (key, record) = self.raw_entry(i)?;
        let key = std::str::from_utf8(key).map_err(|_| DecodeError::invalid("page", "key is not UTF-8"))?;
        Ok((key, record))
    }

    /// The key of entry `i`, its UTF-8 unchecked: what a lookup compares (UTF-8 orders
    /// as its bytes), without the record's length and bounds.
    fn raw_key(&self, i: usize) -> Result<&'a [u8], DecodeError> {
        Ok(self.key_at(i)?.1)
    }

    /// Where entry `i` starts, and its key.
    fn key_at(&self, i: usize) -> Result<(usize, &'a [u8]), DecodeError> {
        let at = read_u32(self.bytes, 4 + 4 * i)? as usize;
        let key_len = self.bytes.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
        let key_len = key_len.ok_or_else(|| DecodeError::invalid("page", "entry past the end"))?;
        let key =
            self.bytes.get(at + 2..at + 2 + key_len).ok_or_else(|| DecodeError::invalid("page", "key past the end"))?;
        Ok((at, key))
    }

    /// [`View::entry`] with the key's UTF-8 unchecked.
    fn raw_entry(&self, i: usize) -> Result<(&'a [u8], &'a [u8]), DecodeError> {
        let (at, key) = self.key_at(i)?;
        let record_len = read_u32(self.bytes, at + 2 + key.len())? as usize;
        let start = at + 6 + key.len();
        let record = self
            .bytes
            .get(start..start + record_len)
            .ok_or_else(|| DecodeError::invalid("page", "record past the end"))?;
        Ok((key, record))
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Result<u32, DecodeError> {
    match bytes.get(at..at + 4) {
        Some(b) => Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        None => Err(DecodeError::invalid("page", "length past the end")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(timeout_ms: Option<i64>) -> KeyRecord {
        KeyRecord { value: Some(vec![1, 2, 3]), timeout_ms, schema_version: 1 }
    }

    #[test]
    fn set_get_and_split_keep_the_keys_sorted() {
        let mut page = Page::default();
        for (i, key) in ["m", "c", "x", "a", "q", "e", "z", "b"].iter().enumerate() {
            page.set(key, Some(rec(Some(100 - i as i64))));
        }
        page.set("q", None);
        page.set("nothing", None);
        assert_eq!(page.get("a"), Some(&rec(Some(97))));
        assert_eq!(page.get("q"), None);
        assert_eq!(page.min_deadline(), Some(93));
        let keys: Vec<&str> = page.entries().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c", "e", "m", "x", "z"]);
        let decoded = Page::decode(&page.encode()).unwrap();
        assert_eq!(decoded, page);

        let len = page.encode().len();
        assert!(len > PAGE_BYTES_MAX, "{len}");
        let pieces = page.clone().split(vec![0xFF], len);
        assert!(pieces.len() >= 2);
        assert_eq!(pieces.last().unwrap().0, vec![0xFF]);
        let mut all = Vec::new();
        for (fence, piece) in &pieces {
            assert!(!piece.is_empty());
            assert!(piece.entries().last().unwrap().0.as_bytes() < fence.as_slice());
            all.extend(piece.entries().iter().cloned());
        }
        assert_eq!(all, page.entries());
        for pair in pieces.windows(2) {
            assert_eq!(pair[0].0, pair[1].1.entries()[0].0.as_bytes(), "a piece's fence is the next one's first key");
        }
    }

    #[test]
    fn lookup_finds_every_key_and_only_those() {
        let mut page = Page::default();
        for i in 0..50 {
            page.set(&format!("k{i:03}"), Some(rec(Some(i))));
        }
        let bytes = page.encode();
        for i in 0..50 {
            assert_eq!(Page::lookup(&bytes, &format!("k{i:03}")).unwrap(), Some(rec(Some(i))));
        }
        for missing in ["", "a", "k", "k0005", "k050", "z"] {
            assert_eq!(Page::lookup(&bytes, missing).unwrap(), None, "{missing}");
        }
        assert_eq!(Page::lookup(&Page::default().encode(), "k").unwrap(), None);
    }

    #[test]
    fn entries_from_starts_at_the_first_key_at_or_above() {
        let mut page = Page::default();
        for i in (0..50).step_by(2) {
            page.set(&format!("k{i:03}"), Some(rec(Some(i))));
        }
        let bytes = page.encode();
        let from = |start: &str| -> Vec<(String, KeyRecord)> {
            Page::entries_from(&bytes, start).unwrap().map(|e| e.map(|(k, r)| (k.to_owned(), r)).unwrap()).collect()
        };
        for start in ["", "a", "k", "k000", "k001", "k024", "k025", "k048", "k049", "z"] {
            let want: Vec<(String, KeyRecord)> =
                page.entries().iter().filter(|(k, _)| k.as_str() >= start).cloned().collect();
            assert_eq!(from(start), want, "{start}");
        }
    }

    #[test]
    fn merge_equals_setting_each_change_on_the_decoded_page() {
        let mut rng = crate::workload::Rng::new(7);
        for round in 0..300 {
            let mut page = Page::default();
            for _ in 0..rng.range(0, 12) {
                let key = format!("k{}", rng.range(0, 30));
                page.set(&key, Some(rec((rng.range(0, 3) > 0).then(|| rng.range(-5, 50)))));
            }
            let mut changes: std::collections::BTreeMap<String, Option<KeyRecord>> = Default::default();
            for _ in 0..rng.range(0, 8) {
                let record = (rng.range(0, 3) > 0).then(|| rec((rng.range(0, 2) > 0).then(|| rng.range(-5, 50))));
                changes.insert(format!("k{}", rng.range(0, 30)), record);
            }
            let bytes = (round % 5 != 0 || !page.is_empty()).then(|| page.encode());
            let encoded: Vec<(&str, Option<Vec<u8>>)> =
                changes.iter().map(|(k, r)| (k.as_str(), r.as_ref().map(codec::encode))).collect();
            let merged = Page::merge(bytes.as_deref(), encoded.iter().map(|(k, r)| (*k, r.as_deref()))).unwrap();
            let old_min = page.min_deadline();
            for (key, record) in &changes {
                page.set(key, record.clone());
            }
            assert_eq!(Page::decode(&merged.bytes).unwrap(), page, "round {round}");
            assert_eq!(merged.bytes, page.encode(), "round {round}");
            assert_eq!(merged.count, page.entries().len());
            assert_eq!((merged.old_min, merged.new_min), (old_min, page.min_deadline()), "round {round}");
        }
    }

    #[test]
    fn a_damaged_page_is_refused() {
        let mut page = Page::default();
        page.set("b", Some(rec(None)));
        page.set("a", Some(rec(None)));
        let bytes = page.encode();
        for cut in 0..bytes.len() {
            assert!(Page::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // Swap the two offsets: the keys come out of order.
        let mut swapped = bytes.clone();
        swapped[4..8].copy_from_slice(&bytes[8..12]);
        swapped[8..12].copy_from_slice(&bytes[4..8]);
        assert!(Page::decode(&swapped).is_err());
    }
}
