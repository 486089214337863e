//! The store entries a 0.2 batch's calls have changed so far (`keyed.rs`), which its
//! later calls read before the committed state, and which become the batch's
//! [`KeyChange`]s.
//!
//! The changes are kept in one vector, in the order the batch first changed them (the
//! batch's result, once the changes that end where they began are dropped), and found
//! by their key through `ScanGroups` (`scan_groups.rs`), whose positions are indices
//! in that vector. Held in one map ordered by store key, every read, range and insert
//! searched a deep tree of strings that share long prefixes (16% of a 0.2 batch loop
//! at a million group keys, most of it `memcmp`); and the batch's changes were then
//! copied out of it into a vector, both held at once.

use crate::records::{KeyChange, KeyRecord};
use crate::scan_groups::ScanGroups;
use crate::state_keys::scan_group;

/// A store entry's record (`None`: absent, or deleted).
pub(crate) type Record = Option<KeyRecord>;

/// A batch's changed entries (see the module doc).
#[derive(Default)]
pub(crate) struct Applied {
    /// Each changed entry once: its committed record, and its record after the batch
    /// so far.
    changes: Vec<KeyChange>,
    /// The changes' positions in `changes`, by key. Positions are u32 (usize ran 4%
    /// slower): 4 billion changes of 100 bytes or more would not fit in memory first.
    groups: ScanGroups<u32>,
}

impl std::fmt::Debug for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applied").field("changes", &self.changes.len()).finish_non_exhaustive()
    }
}

/// Where `changes` holds the key at `i`.
fn key_at<'c>(changes: &'c [KeyChange]) -> impl Fn(u32) -> &'c [u8] {
    move |i| changes[i as usize].key.as_bytes()
}

impl Applied {
    /// Room for the changes of `groups` groups, three each (the sensor workload's
    /// plugin's; the vector grows past that), in `changes` (emptied: the vector of an
    /// earlier batch, whose memory is kept rather than faulted in again).
    pub fn with_groups(groups: usize, mut changes: Vec<KeyChange>) -> Self {
        changes.clear();
        changes.reserve(groups.saturating_mul(3));
        Self { changes, groups: ScanGroups::with_capacity(groups) }
    }

    /// The entries changed.
    pub fn len(&self) -> usize {
        self.changes.len()
    }

    /// `key`'s record after the batch so far, if the batch changed it.
    pub fn get(&self, key: &str) -> Option<&Record> {
        let i = self.groups.get(key.as_bytes(), key_at(&self.changes))?;
        Some(&self.changes[i as usize].after)
    }

    /// Sets `key`'s record after the batch; when the batch had not changed it yet,
    /// `before` gives its committed record (a store read, or one a call made already).
    pub fn insert<E>(
        &mut self,
        key: String,
        after: Record,
        before: impl FnOnce(&str) -> Result<Record, E>,
    ) -> Result<(), E> {
        let Self { changes, groups } = self;
        if let Some(i) = groups.get(key.as_bytes(), key_at(changes)) {
            changes[i as usize].after = after;
            return Ok(());
        }
        let i = u32::try_from(changes.len()).expect("a batch holds fewer than 4 billion changes");
        let before = before(&key)?;
        changes.push(KeyChange { key, before, after });
        groups.insert_new(changes[i as usize].key.as_bytes(), i, key_at(changes));
        Ok(())
    }

    /// The changed entries whose key starts with `prefix`, in key order, with their
    /// records after the batch so far.
    pub fn range<'a>(&'a self, prefix: &'a str) -> Box<dyn Iterator<Item = (&'a str, &'a Record)> + 'a> {
        let changes = &self.changes;
        if scan_group(prefix).is_none() {
            // A prefix shorter than a group (no 0.2 range is): every group's, sorted.
            let mut all: Vec<(&str, &Record)> =
                changes.iter().filter(|c| c.key.starts_with(prefix)).map(|c| (c.key.as_str(), &c.after)).collect();
            all.sort_unstable_by(|a, b| a.0.cmp(b.0));
            return Box::new(all.into_iter());
        }
        let within = self.groups.range_from(prefix.as_bytes(), key_at(changes));
        let entries = within.map(move |i| (changes[i as usize].key.as_str(), &changes[i as usize].after));
        Box::new(entries.take_while(move |(k, _)| k.starts_with(prefix)))
    }

    /// How many of the changed entries are deletions.
    pub fn deleted(&self) -> usize {
        self.changes.iter().filter(|c| c.after.is_none()).count()
    }

    /// The batch's changes: every changed entry, in the order the batch first changed
    /// it, but those that end as they began.
    pub fn into_changes(self) -> Vec<KeyChange> {
        let Self { mut changes, groups } = self;
        drop(groups);
        changes.retain(|c| c.before != c.after);
        changes
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::state_keys as sk;

    fn rec(byte: u8) -> Record {
        Some(KeyRecord { value: Some(vec![byte]), timeout_ms: None, schema_version: 1 })
    }

    /// Inserts, reads and ranges match one ordered map of every key, with groups small
    /// and large (past `scan_groups`' few), the expiry index, and prefixes within and across groups; the
    /// committed record of a key is asked for once, when the batch first changes it.
    #[test]
    fn applied_entries_match_one_ordered_map() {
        let mut applied = Applied::default();
        let mut model: BTreeMap<String, (Record, Record)> = BTreeMap::new();
        let committed = |key: &str| rec(key.len() as u8);
        let mut keys = Vec::new();
        for group in ["a", "b", "big", "sensor-1"] {
            let n = if group == "big" { 100 } else { 5 };
            for i in 0..n {
                keys.push(sk::value_key(group, &format!("v{i:03}")));
                keys.push(sk::timer_key(group, i as i64, None));
            }
        }
        for i in 0..50 {
            keys.push(sk::expiry_index_key(i % 2 == 0, i, &sk::value_key("a", "v")));
        }
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        for step in 0..4000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let key = keys[(rng % keys.len() as u64) as usize].clone();
            let after = if rng.is_multiple_of(5) { None } else { rec((step % 251) as u8) };
            let mut asked = 0;
            let read = |k: &str| {
                asked += 1;
                Ok::<_, ()>(committed(k))
            };
            applied.insert(key.clone(), after.clone(), read).unwrap();
            let new = !model.contains_key(&key);
            assert_eq!(asked, usize::from(new), "{key:?}: the committed record is read once");
            model.entry(key.clone()).or_insert((committed(&key), None)).1 = after;
            assert_eq!(applied.len(), model.len());
        }
        // A failed read of the committed record changes nothing.
        let fresh = sk::value_key("c", "v");
        assert_eq!(applied.insert(fresh.clone(), rec(1), |_| Err("no")), Err("no"));
        assert_eq!(applied.get(&fresh), None);
        for key in keys.iter().chain([&"nothing\0v\0x".to_owned()]) {
            assert_eq!(applied.get(key), model.get(key).map(|c| &c.1), "{key:?}");
        }
        let mut prefixes: Vec<String> = ["a", "big", "sensor-1", "zz"].iter().map(|g| sk::group_prefix(g)).collect();
        prefixes.push(format!("{}v0", sk::group_prefix("big")));
        prefixes.push(sk::expired_range(true, 1_000).0);
        prefixes.push(String::new());
        for prefix in &prefixes {
            let want: Vec<(&str, &Record)> =
                model.iter().filter(|(k, _)| k.starts_with(prefix.as_str())).map(|(k, c)| (k.as_str(), &c.1)).collect();
            let got: Vec<(&str, &Record)> = applied.range(prefix).collect();
            assert_eq!(got, want, "{prefix:?}");
        }
        assert_eq!(applied.deleted(), model.values().filter(|c| c.1.is_none()).count());
        let mut all: Vec<(String, Record, Record)> =
            applied.into_changes().into_iter().map(|c| (c.key, c.before, c.after)).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let want: Vec<(String, Record, Record)> =
            model.into_iter().filter(|(_, c)| c.0 != c.1).map(|(k, (before, after))| (k, before, after)).collect();
        assert_eq!(all, want);
    }
}
