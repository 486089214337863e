//! The overlay's hash table: for each key it holds, the offset of the key's latest entry
//! in its arena. Open addressing with linear probing, at most three quarters full, one
//! `u64` a slot: the top [`TAG_BITS`] of the key's hash (a probe compares keys only
//! where the tag matches) and the offset plus one (0: an empty slot). Keys are never
//! removed, only all at once ([`KeyIndex::clear`]).
//!
//! Its own rather than hashbrown's so that a caller with many keys to look up can ask
//! the CPU for the slots, and the entries they point at, of the keys it will look up a
//! few keys later ([`KeyIndex::prefetch`], [`KeyIndex::first_candidate`]): at a million
//! keys the table and the arena are far larger than the caches, and a batch's probes
//! waited on memory one after the other (hashbrown's `find` was 12% of a batch loop's
//! time at 10M events over 1M keys).
//!
//! A table that must grow is rebuilt from the keys' hashes and offsets, which the
//! overlay reads from its arena in order (a slot keeps too little of the hash to place
//! it again).

/// The bits of the hash a slot keeps.
const TAG_BITS: u32 = 20;
const OFFSET_BITS: u32 = u64::BITS - TAG_BITS;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
/// What a slot takes.
pub(crate) const SLOT_BYTES: u64 = 8;
/// Slots of a table's first allocation.
const SLOTS_MIN: usize = 64;

/// Arena offsets of keys, by their hash.
#[derive(Debug, Default, Clone)]
pub(crate) struct KeyIndex {
    /// A power of two of slots (or none).
    slots: Vec<u64>,
    len: usize,
}

fn tag(hash: u64) -> u64 {
    hash >> OFFSET_BITS
}

impl KeyIndex {
    /// The keys held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The slots allocated.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Forgets every key, keeping the room.
    pub fn clear(&mut self) {
        self.slots.fill(0);
        self.len = 0;
    }

    /// Whether one more key needs a larger table ([`KeyIndex::rebuild`]).
    pub fn is_full(&self) -> bool {
        4 * (self.len + 1) > 3 * self.slots.len()
    }

    /// Holds exactly `keys` (hash, offset), each once, in a table with room for at
    /// least `room` keys; it never shrinks (an emptied overlay keeps its table's room).
    pub fn rebuild(&mut self, room: usize, keys: impl IntoIterator<Item = (u64, usize)>) {
        let slots = (room.max(1) * 4).div_ceil(3).next_power_of_two().max(SLOTS_MIN).max(self.slots.len());
        if slots == self.slots.len() {
            self.clear();
        } else {
            *self = Self { slots: vec![0; slots], len: 0 };
        }
        for (hash, at) in keys {
            self.insert_new(hash, at);
        }
    }

    fn home(&self, hash: u64) -> usize {
        // The low bits: the tag is the high ones.
        hash as usize & (self.slots.len() - 1)
    }

    /// The position of the slot of the key `is_key` accepts (given its entry's offset)
    /// among those with this hash.
    pub fn find(&self, hash: u64, mut is_key: impl FnMut(usize) -> bool) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(hash);
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                return None;
            }
            if slot >> OFFSET_BITS == tag(hash) && is_key(offset(slot)) {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// The offset in the slot at `position` (from [`KeyIndex::find`]).
    pub fn offset_at(&self, position: usize) -> usize {
        offset(self.slots[position])
    }

    /// Points the slot at `position` (from [`KeyIndex::find`]) at a later entry of its key.
    pub fn set_offset(&mut self, position: usize, at: usize) {
        let slot = self.slots[position];
        self.slots[position] = (slot & !OFFSET_MASK) | packed_offset(at);
    }

    /// Adds a key it does not hold; the table must not be full ([`KeyIndex::is_full`]).
    pub fn insert_new(&mut self, hash: u64, at: usize) {
        assert!(!self.is_full(), "the overlay grows its key index before it is full");
        let mask = self.slots.len() - 1;
        let mut i = self.home(hash);
        while self.slots[i] != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = (tag(hash) << OFFSET_BITS) | packed_offset(at);
        self.len += 1;
    }

    /// The offsets of all keys, in no order.
    pub fn offsets(&self) -> impl Iterator<Item = usize> + '_ {
        self.slots.iter().filter(|&&slot| slot != 0).map(|&slot| offset(slot))
    }

    /// Asks the CPU for the first slot a lookup of `hash` reads.
    pub fn prefetch(&self, hash: u64) {
        if !self.slots.is_empty() {
            crate::prefetch::prefetch(&self.slots[self.home(hash)]);
        }
    }

    /// The offset in the first slot a lookup of `hash` reads, when its tag matches: most
    /// likely the entry the lookup will compare, worth a prefetch.
    pub fn first_candidate(&self, hash: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let slot = self.slots[self.home(hash)];
        (slot != 0 && slot >> OFFSET_BITS == tag(hash)).then(|| offset(slot))
    }
}

fn offset(slot: u64) -> usize {
    usize::try_from((slot & OFFSET_MASK) - 1).expect("offsets fit in usize")
}

fn packed_offset(at: usize) -> u64 {
    let packed = at as u64 + 1;
    assert!(packed <= OFFSET_MASK, "an overlay's arena is smaller than 2^44 bytes");
    packed
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Keys of 64-bit hashes of which only a few bits differ, so that homes and tags
    /// collide often: every probe path is taken.
    #[test]
    fn finds_what_a_map_holds_through_growth_and_clears() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut index = KeyIndex::default();
        // key number -> (hash, offset)
        let mut model: HashMap<u64, (u64, usize)> = HashMap::new();
        for round in 0..3 {
            for step in 0..5000usize {
                let key = next() % 3000;
                // Hashes share their low bits in pairs and their tags in eights.
                let hash = ((key / 8) << OFFSET_BITS) | (key / 2);
                let found = index.find(hash, |at| model.get(&key).is_some_and(|&(_, o)| o == at));
                assert_eq!(found.map(|p| index.offset_at(p)), model.get(&key).map(|&(_, at)| at), "round {round}");
                let at = round * 100_000 + step;
                match found {
                    Some(position) => index.set_offset(position, at),
                    None => {
                        if index.is_full() {
                            index.rebuild(2 * model.len() + 1, model.values().copied());
                        }
                        index.insert_new(hash, at);
                    }
                }
                model.insert(key, (hash, at));
                assert_eq!(index.len(), model.len());
            }
            let mut offsets: Vec<usize> = index.offsets().collect();
            let mut want: Vec<usize> = model.values().map(|&(_, at)| at).collect();
            offsets.sort_unstable();
            want.sort_unstable();
            assert_eq!(offsets, want);
            let slots = index.slots();
            index.clear();
            model.clear();
            assert_eq!((index.len(), index.slots()), (0, slots), "a clear keeps the room");
            assert_eq!(index.find(1, |_| true), None);
        }
    }
}
