//! Keys in order within their scan group only, as 0.2 state reads them.
//!
//! The ranges 0.2 state reads never leave a scan group (`state_keys::scan_group`: a
//! group key's entries, or the expiry index). So the composite keys the overlay holds,
//! and the entries a 0.2 batch changed, are kept in order within their group only: a
//! hash table of groups, each the positions of its few keys sorted by key, or past
//! [`FEW_MAX`] (the expiry index, a large list or map) a B-tree of its keys. One
//! ordered collection of all the keys (300 000 strings at a million group keys) cost a
//! search of many cache misses for each range and each new key: 14% of a 0.2 batch
//! loop in the overlay, 16% in a batch's changes. Kept so, the overlay's keys ran a 0.2
//! plugin over 1M sensors 1.16 to 1.33 times as fast, and a batch's changes (with the
//! rest of that step) 1.41 times (BENCHMARKS.md).
//!
//! A position is where the owner keeps the key (an offset in the overlay's arena, an
//! index in a batch's vector of changes), and the keys are read back through it
//! (`key_of`): a few positions take less memory than their keys, and no key is copied.

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::ops::Bound;

use hashbrown::HashTable;

use crate::state_keys::scan_group_bytes;

/// A group of more keys than this is kept in a B-tree rather than a sorted vector.
const FEW_MAX: usize = 32;
/// The positions a new group has room for: a 0.2 call of the sensor workload changes
/// three entries of its group key (its value, the timer it sets and the one it
/// deletes), and growing from one showed in profiles.
const FEW_RESERVED: usize = 4;
/// What a key of a small group is charged (its position, with room to grow).
const FEW_KEY_BYTES: u64 = 16;
/// What a key of a large group is charged beyond its bytes (its box, its position and
/// its share of the B-tree's nodes): an estimate.
const MANY_KEY_BYTES: u64 = 56;
/// What a group is charged beyond its keys: its slot in the hash table and a control
/// byte, in a table at most seven eighths full, and its vector's allocation: an
/// estimate.
const GROUP_BYTES: u64 = 112;

/// Keys by scan group (see the module doc), each at a position `P` of its owner's.
#[derive(Debug, Clone)]
pub(crate) struct ScanGroups<P> {
    table: HashTable<Group<P>>,
    hasher: foldhash::fast::RandomState,
    /// What the groups take, about.
    bytes: u64,
}

impl<P> Default for ScanGroups<P> {
    fn default() -> Self {
        Self { table: HashTable::new(), hasher: Default::default(), bytes: 0 }
    }
}

/// The keys of one scan group (never none).
#[derive(Debug, Clone)]
struct Group<P> {
    /// The hash of the group's prefix.
    hash: u64,
    keys: Keys<P>,
}

#[derive(Debug, Clone)]
enum Keys<P> {
    /// Their positions, sorted by key.
    Few(Vec<P>),
    Many(BTreeMap<Box<[u8]>, P>),
}

/// The scan group of a key: `b""` for a key in none, whose group holds all such keys.
fn group_of(key: &[u8]) -> &[u8] {
    scan_group_bytes(key).unwrap_or(b"")
}

impl<P: Copy> Group<P> {
    /// Whether this is the group `group`: what the table's lookups compare.
    fn is<'k>(&self, group: &[u8], key_of: &impl Fn(P) -> &'k [u8]) -> bool {
        match &self.keys {
            Keys::Few(at) => group_of(key_of(at[0])) == group,
            Keys::Many(keys) => keys.keys().next().is_some_and(|first| group_of(first) == group),
        }
    }
}

impl<P: Copy> ScanGroups<P> {
    /// Room for `groups` groups.
    pub fn with_capacity(groups: usize) -> Self {
        Self { table: HashTable::with_capacity(groups), ..Self::default() }
    }

    fn find<'k>(&self, group: &[u8], key_of: &impl Fn(P) -> &'k [u8]) -> Option<&Group<P>> {
        self.table.find(self.hasher.hash_one(group), |g| g.is(group, key_of))
    }

    /// The position of `key`, if it holds it.
    pub fn get<'k>(&self, key: &[u8], key_of: impl Fn(P) -> &'k [u8]) -> Option<P> {
        match &self.find(group_of(key), &key_of)?.keys {
            Keys::Few(at) => at.binary_search_by(|&p| key_of(p).cmp(key)).ok().map(|i| at[i]),
            Keys::Many(keys) => keys.get(key).copied(),
        }
    }

    /// Adds `key`, which it does not hold yet, at `p` (where `key_of` finds it).
    pub fn insert_new<'k>(&mut self, key: &[u8], p: P, key_of: impl Fn(P) -> &'k [u8]) {
        let Self { table, hasher, bytes } = self;
        let group = group_of(key);
        let hash = hasher.hash_one(group);
        let Some(found) = table.find_mut(hash, |g| g.is(group, &key_of)) else {
            let mut at = Vec::with_capacity(FEW_RESERVED);
            at.push(p);
            table.insert_unique(hash, Group { hash, keys: Keys::Few(at) }, |g| g.hash);
            *bytes += GROUP_BYTES + FEW_KEY_BYTES;
            return;
        };
        match &mut found.keys {
            Keys::Few(at) if at.len() < FEW_MAX => {
                let i = at.partition_point(|&q| key_of(q) < key);
                at.insert(i, p);
                *bytes += FEW_KEY_BYTES;
            }
            Keys::Few(at) => {
                let mut keys: BTreeMap<Box<[u8]>, P> = at.iter().map(|&q| (key_of(q).into(), q)).collect();
                keys.insert(key.into(), p);
                // Each key is charged as a large group's, less what its position was.
                let charged: u64 = keys.keys().map(|k| k.len() as u64 + MANY_KEY_BYTES).sum();
                *bytes = (*bytes + charged).saturating_sub(at.len() as u64 * FEW_KEY_BYTES);
                found.keys = Keys::Many(keys);
            }
            Keys::Many(keys) => {
                keys.insert(key.into(), p);
                *bytes += key.len() as u64 + MANY_KEY_BYTES;
            }
        }
    }

    /// The positions of the keys from `start` on within its scan group, in key order.
    pub fn range_from<'a, 'k: 'a>(
        &'a self,
        start: &'a [u8],
        key_of: impl Fn(P) -> &'k [u8] + 'a,
    ) -> impl Iterator<Item = P> + 'a {
        let (few, many) = match self.find(group_of(start), &key_of).map(|g| &g.keys) {
            Some(Keys::Few(at)) => (Some(&at[at.partition_point(|&p| key_of(p) < start)..]), None),
            Some(Keys::Many(keys)) => (None, Some(keys.range::<[u8], _>((Bound::Included(start), Bound::Unbounded)))),
            None => (None, None),
        };
        let few = few.into_iter().flatten().copied();
        few.chain(many.into_iter().flatten().map(|(_, &p)| p))
    }

    /// Moves every position `p` to `moved(p)` (its owner moved the keys).
    pub fn remap(&mut self, mut moved: impl FnMut(P) -> P) {
        for group in self.table.iter_mut() {
            match &mut group.keys {
                Keys::Few(at) => at.iter_mut().for_each(|p| *p = moved(*p)),
                Keys::Many(keys) => keys.values_mut().for_each(|p| *p = moved(*p)),
            }
        }
    }

    /// What it takes in memory, about.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Empties it, keeping the hash table's room.
    pub fn clear(&mut self) {
        self.table.clear();
        self.bytes = 0;
    }

    /// Checks that each group's keys are in order, in the group whose hash it has, and
    /// at their positions, and passes each key with its position to `each`; gives the
    /// number of keys.
    pub fn check<'k>(
        &self,
        key_of: impl Fn(P) -> &'k [u8],
        mut each: impl FnMut(&[u8], P) -> Result<(), String>,
    ) -> Result<usize, String> {
        let mut held = 0;
        for group in &self.table {
            let keys: Vec<(&[u8], P)> = match &group.keys {
                Keys::Few(at) => at.iter().map(|&p| (key_of(p), p)).collect(),
                Keys::Many(keys) => keys.iter().map(|(k, &p)| (&**k, p)).collect(),
            };
            let name = group_of(keys[0].0);
            if self.hasher.hash_one(name) != group.hash {
                return Err(format!("the scan group {:?} is not where its hash says", String::from_utf8_lossy(name)));
            }
            for pair in keys.windows(2) {
                if pair[0].0 >= pair[1].0 {
                    let [a, b] = [pair[0].0, pair[1].0].map(String::from_utf8_lossy);
                    return Err(format!("keys {a:?} and {b:?} out of order in their scan group"));
                }
            }
            for &(key, p) in &keys {
                if group_of(key) != name || key_of(p) != key {
                    let key = String::from_utf8_lossy(key);
                    return Err(format!("key {key:?} is not in its scan group, or not at its position"));
                }
                each(key, p)?;
            }
            held += keys.len();
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Rng;

    /// Random keys of a few scan groups (small ones, one past `FEW_MAX`, and keys of
    /// none), against one ordered set: each key's position, and each range.
    #[test]
    fn ranges_and_positions_match_one_ordered_set() {
        let mut rng = Rng::new(3);
        let mut keys: Vec<String> = Vec::new();
        let mut groups: ScanGroups<u32> = ScanGroups::default();
        let mut model = std::collections::BTreeMap::new();
        for _ in 0..3000 {
            let key = match rng.range(0, 10) {
                0 => format!("plain{}", rng.range(0, 50)),
                1..=3 => format!("big\0v{:03}", rng.range(0, 200)),
                _ => format!("g{}\0t{}", rng.range(0, 40), rng.range(0, 6)),
            };
            let key_of = |p: u32| keys[p as usize].as_bytes();
            if groups.get(key.as_bytes(), key_of).is_some() {
                continue;
            }
            let p = keys.len() as u32;
            keys.push(key.clone());
            groups.insert_new(key.as_bytes(), p, |p| keys[p as usize].as_bytes());
            model.insert(key, p);
        }
        let key_of = |p: u32| keys[p as usize].as_bytes();
        for (key, &p) in &model {
            assert_eq!(groups.get(key.as_bytes(), key_of), Some(p), "{key:?}");
        }
        assert_eq!(groups.get(b"g0\0nope", key_of), None);
        for start in ["big\0", "big\0v1", "g3\0", "g3\0t2", "g99\0", "plain3", ""] {
            let group = group_of(start.as_bytes());
            let want: Vec<u32> = model
                .range(start.to_owned()..)
                .filter(|(k, _)| group_of(k.as_bytes()) == group)
                .map(|(_, &p)| p)
                .collect();
            let got: Vec<u32> = groups.range_from(start.as_bytes(), key_of).collect();
            assert_eq!(got, want, "from {start:?}");
        }
        assert_eq!(groups.check(key_of, |_, _| Ok(())), Ok(model.len()));
        // Moved keys are found at their new positions.
        let n = keys.len() as u32;
        keys.reverse();
        groups.remap(|p| n - 1 - p);
        let key_of = |p: u32| keys[p as usize].as_bytes();
        for key in model.keys() {
            let p = groups.get(key.as_bytes(), key_of).expect("held");
            assert_eq!(keys[p as usize], *key);
        }
        assert_eq!(groups.check(key_of, |_, _| Ok(())), Ok(model.len()));
    }
}
