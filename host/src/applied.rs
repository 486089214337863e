//! The store entries a 0.2 batch's calls have changed so far (`keyed.rs`), which its
//! later calls read before the committed state, and which become the batch's
//! [`KeyChange`](crate::records::KeyChange)s.
//!
//! A batch over a million group keys changes a few hundred thousand entries. Held in
//! one map ordered by store key, every read, range and insert searched a deep tree of
//! strings that share long prefixes (16% of a 0.2 batch loop, most of it `memcmp`).
//! Ranges never leave a scan group (`state_keys::scan_group`: a group key's entries,
//! or the expiry index), so the entries are kept in order within their group only: a
//! hash table of groups, each a few entries in a sorted vector, or a B-tree past
//! [`FEW_MAX`] (the expiry index, a large list or map).

use std::collections::BTreeMap;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::records::KeyRecord;
use crate::state_keys::scan_group;

/// A group of more entries than this is kept in a B-tree rather than a sorted vector.
const FEW_MAX: usize = 32;

/// The entries a new group has room for: a call of the sensor workload's 0.2 plugin
/// changes three (its value, the timer it sets and the one it deletes).
const FEW_RESERVED: usize = 4;

/// A store entry's record (`None`: absent, or deleted).
pub(crate) type Record = Option<KeyRecord>;

/// A changed entry's committed record and its record after the batch so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub before: Record,
    pub after: Record,
}

/// The entries of one scan group, in key order (never empty).
#[derive(Debug)]
enum Group {
    Few(Vec<(String, Change)>),
    Many(BTreeMap<String, Change>),
}

impl Group {
    fn first_key(&self) -> &str {
        match self {
            Self::Few(entries) => entries.first().map_or("", |(k, _)| k.as_str()),
            Self::Many(entries) => entries.keys().next().map_or("", String::as_str),
        }
    }

    fn get(&self, key: &str) -> Option<&Change> {
        match self {
            Self::Few(entries) => entries.binary_search_by(|(k, _)| k.as_str().cmp(key)).ok().map(|i| &entries[i].1),
            Self::Many(entries) => entries.get(key),
        }
    }

    /// Sets `key`'s record after the batch, its committed record from `before` if the
    /// key is new to the group (then `true`).
    fn insert<E>(
        &mut self,
        key: String,
        after: Record,
        before: impl FnOnce(&str) -> Result<Record, E>,
    ) -> Result<bool, E> {
        let changed = |key: String, after| Ok::<_, E>((before(&key)?, key, after));
        match self {
            Self::Few(entries) => match entries.binary_search_by(|(k, _)| k.as_str().cmp(&key)) {
                Ok(i) => entries[i].1.after = after,
                Err(i) => {
                    let (before, key, after) = changed(key, after)?;
                    entries.insert(i, (key, Change { before, after }));
                    if entries.len() > FEW_MAX {
                        *self = Self::Many(std::mem::take(entries).into_iter().collect());
                    }
                    return Ok(true);
                }
            },
            Self::Many(entries) => match entries.get_mut(&key) {
                Some(change) => change.after = after,
                None => {
                    let (before, key, after) = changed(key, after)?;
                    entries.insert(key, Change { before, after });
                    return Ok(true);
                }
            },
        }
        Ok(false)
    }

    /// The entries whose key starts with `prefix`, in key order, with their records
    /// after the batch so far.
    fn range<'a>(&'a self, prefix: &'a str) -> Box<dyn Iterator<Item = (&'a str, &'a Record)> + 'a> {
        let starts = move |(k, _): &(&'a str, &'a Record)| k.starts_with(prefix);
        match self {
            Self::Few(entries) => {
                let first = entries.partition_point(|(k, _)| k.as_str() < prefix);
                Box::new(entries[first..].iter().map(|(k, c)| (k.as_str(), &c.after)).take_while(starts))
            }
            Self::Many(entries) => {
                let from = (std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded);
                Box::new(entries.range::<str, _>(from).map(|(k, c)| (k.as_str(), &c.after)).take_while(starts))
            }
        }
    }

    fn into_entries(self) -> Box<dyn Iterator<Item = (String, Change)>> {
        match self {
            Self::Few(entries) => Box::new(entries.into_iter()),
            Self::Many(entries) => Box::new(entries.into_iter()),
        }
    }

    fn changes(&self) -> Box<dyn Iterator<Item = &Change> + '_> {
        match self {
            Self::Few(entries) => Box::new(entries.iter().map(|(_, c)| c)),
            Self::Many(entries) => Box::new(entries.values()),
        }
    }
}

/// The group of a store key: its scan group, or `""` for a key outside any (none of
/// 0.2's).
fn group_of(key: &str) -> &str {
    scan_group(key).unwrap_or("")
}

/// A batch's changed entries, by scan group (see the module doc).
#[derive(Default)]
pub(crate) struct Applied {
    groups: HashTable<Group>,
    hasher: foldhash::fast::RandomState,
    len: usize,
}

impl std::fmt::Debug for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applied").field("len", &self.len).field("groups", &self.groups.len()).finish()
    }
}

impl Applied {
    /// Room for the entries of `groups` groups.
    pub fn with_groups(groups: usize) -> Self {
        Self { groups: HashTable::with_capacity(groups), ..Self::default() }
    }

    /// The entries changed.
    pub fn len(&self) -> usize {
        self.len
    }

    fn group(&self, group: &str) -> Option<&Group> {
        self.groups.find(self.hasher.hash_one(group), |g| group_of(g.first_key()) == group)
    }

    /// `key`'s record after the batch so far, if the batch changed it.
    pub fn get(&self, key: &str) -> Option<&Record> {
        Some(&self.group(group_of(key))?.get(key)?.after)
    }

    /// Sets `key`'s record after the batch; when the batch had not changed it yet,
    /// `before` gives its committed record (a store read, or one a call made already).
    pub fn insert<E>(
        &mut self,
        key: String,
        after: Record,
        before: impl FnOnce(&str) -> Result<Record, E>,
    ) -> Result<(), E> {
        let Self { groups, hasher, len } = self;
        let group = group_of(&key);
        let hash = hasher.hash_one(group);
        let new = match groups.find_mut(hash, |g| group_of(g.first_key()) == group) {
            Some(entries) => entries.insert(key, after, before)?,
            None => {
                let before = before(&key)?;
                let mut entries = Vec::with_capacity(FEW_RESERVED);
                entries.push((key, Change { before, after }));
                let entries = Group::Few(entries);
                groups.insert_unique(hash, entries, |g| hasher.hash_one(group_of(g.first_key())));
                true
            }
        };
        *len += usize::from(new);
        Ok(())
    }

    /// The changed entries whose key starts with `prefix`, in key order.
    pub fn range<'a>(&'a self, prefix: &'a str) -> Box<dyn Iterator<Item = (&'a str, &'a Record)> + 'a> {
        match scan_group(prefix) {
            Some(group) => match self.group(group) {
                Some(entries) => entries.range(prefix),
                None => Box::new(std::iter::empty()),
            },
            // A prefix shorter than a group (no 0.2 range is): every group's, sorted.
            None => {
                let mut all: Vec<(&str, &Record)> = self.groups.iter().flat_map(|g| g.range(prefix)).collect();
                all.sort_unstable_by(|a, b| a.0.cmp(b.0));
                Box::new(all.into_iter())
            }
        }
    }

    /// How many of the changed entries are deletions.
    pub fn deleted(&self) -> usize {
        self.groups.iter().flat_map(Group::changes).filter(|c| c.after.is_none()).count()
    }

    /// The changed entries, group by group.
    pub fn into_entries(self) -> impl Iterator<Item = (String, Change)> {
        self.groups.into_iter().flat_map(Group::into_entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_keys as sk;

    fn rec(byte: u8) -> Record {
        Some(KeyRecord { value: Some(vec![byte]), timeout_ms: None, schema_version: 1 })
    }

    /// Inserts, reads and ranges match one ordered map of every key, with groups small
    /// and past `FEW_MAX`, the expiry index, and prefixes within and across groups; the
    /// committed record of a key is asked for once, when the batch first changes it.
    #[test]
    fn applied_entries_match_one_ordered_map() {
        let mut applied = Applied::default();
        let mut model: BTreeMap<String, Change> = BTreeMap::new();
        let committed = |key: &str| rec(key.len() as u8);
        let mut keys = Vec::new();
        for group in ["a", "b", "big", "sensor-1"] {
            let n = if group == "big" { 3 * FEW_MAX } else { 5 };
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
            model.entry(key.clone()).or_insert(Change { before: committed(&key), after: None }).after = after;
            assert_eq!(applied.len(), model.len());
        }
        // A failed read of the committed record changes nothing.
        let fresh = sk::value_key("c", "v");
        assert_eq!(applied.insert(fresh.clone(), rec(1), |_| Err("no")), Err("no"));
        assert_eq!(applied.get(&fresh), None);
        for key in keys.iter().chain([&"nothing\0v\0x".to_owned()]) {
            assert_eq!(applied.get(key), model.get(key).map(|c| &c.after), "{key:?}");
        }
        let mut prefixes: Vec<String> = ["a", "big", "sensor-1", "zz"].iter().map(|g| sk::group_prefix(g)).collect();
        prefixes.push(format!("{}v0", sk::group_prefix("big")));
        prefixes.push(sk::expired_range(true, 1_000).0);
        prefixes.push(String::new());
        for prefix in &prefixes {
            let want: Vec<(&str, &Record)> = model
                .iter()
                .filter(|(k, _)| k.starts_with(prefix.as_str()))
                .map(|(k, c)| (k.as_str(), &c.after))
                .collect();
            let got: Vec<(&str, &Record)> = applied.range(prefix).collect();
            assert_eq!(got, want, "{prefix:?}");
        }
        assert_eq!(applied.deleted(), model.values().filter(|c| c.after.is_none()).count());
        let mut all: Vec<(String, Change)> = applied.into_entries().collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(all, model.into_iter().collect::<Vec<_>>());
    }
}
