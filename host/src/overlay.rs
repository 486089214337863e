//! The overlay: committed key changes not yet folded into sled, merged per key, with
//! the deadlines they set. Reads look here first; a fold writes it into sled's pages
//! and empties it. It knows nothing of sled: what sled holds for a key is the store's
//! business, and the overlay's record for a key replaces it whole.

use std::collections::{BTreeSet, HashMap};

use crate::records::KeyRecord;

/// What the overlay is charged for an entry beyond its key and value bytes (map
/// slots, string and vector headers): an estimate, not a measure.
const OVERLAY_ENTRY_BYTES: u64 = 96;

fn record_bytes(key: &str, record: Option<&KeyRecord>) -> u64 {
    (key.len() + record.and_then(|r| r.value.as_ref()).map_or(0, Vec::len)) as u64 + OVERLAY_ENTRY_BYTES
}

/// Committed changes not yet folded into sled.
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    /// Each changed key's committed record (`None`: deleted).
    records: HashMap<String, Option<KeyRecord>>,
    /// The deadlines of the records above, in (deadline, key) order.
    timers: BTreeSet<(i64, String)>,
    /// About how much memory the above take.
    bytes: u64,
}

impl Overlay {
    /// Applies one committed change.
    pub fn apply(&mut self, key: String, after: Option<KeyRecord>) {
        let after_timer = after.as_ref().and_then(|r| r.timeout_ms);
        self.bytes += record_bytes(&key, after.as_ref());
        if let Some(deadline) = after_timer {
            self.bytes += record_bytes(&key, None);
            self.timers.insert((deadline, key.clone()));
        }
        let old = self.records.insert(key.clone(), after);
        if let Some(old) = old {
            self.bytes -= record_bytes(&key, old.as_ref());
            if let Some(deadline) = old.and_then(|r| r.timeout_ms) {
                if Some(deadline) != after_timer {
                    self.timers.remove(&(deadline, key.clone()));
                }
                self.bytes -= record_bytes(&key, None);
            }
        }
    }

    /// The committed record of `key`, if the overlay has one: `Some(None)` for a key
    /// it deleted, `None` for a key it does not hold (look in sled).
    pub fn get(&self, key: &str) -> Option<Option<&KeyRecord>> {
        self.records.get(key).map(Option::as_ref)
    }

    /// Whether the overlay holds `key` (its record replaces sled's).
    pub fn holds(&self, key: &str) -> bool {
        self.records.contains_key(key)
    }

    /// The changed keys, in no order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.records.keys()
    }

    /// The records it holds (not the deletions), in key order.
    pub fn sorted_records(&self) -> Vec<(String, KeyRecord)> {
        let mut out: Vec<(String, KeyRecord)> =
            self.records.iter().filter_map(|(k, r)| r.clone().map(|r| (k.clone(), r))).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Its deadlines below `threshold` (all for `None`), in (deadline, key) order.
    pub fn timers_below(&self, threshold: Option<i64>) -> impl Iterator<Item = &(i64, String)> {
        let upper = match threshold {
            Some(t) => std::ops::Bound::Excluded((t, String::new())),
            None => std::ops::Bound::Unbounded,
        };
        self.timers.range((std::ops::Bound::Unbounded, upper))
    }

    /// About how much memory it takes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Checks that its deadlines are those of its records.
    pub fn check(&self) -> Result<(), String> {
        let mut want = BTreeSet::new();
        for (key, record) in &self.records {
            if record.as_ref().is_some_and(KeyRecord::is_empty) {
                return Err(format!("empty record for key {key:?} in the overlay"));
            }
            if let Some(deadline) = record.as_ref().and_then(|r| r.timeout_ms) {
                want.insert((deadline, key.clone()));
            }
        }
        if want != self.timers {
            return Err(format!("the overlay's {} timers are not its records' {}", self.timers.len(), want.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(timeout_ms: Option<i64>) -> Option<KeyRecord> {
        Some(KeyRecord { value: Some(vec![7]), timeout_ms, schema_version: 1 })
    }

    #[test]
    fn a_key_changed_again_keeps_one_record_and_one_timer() {
        let mut overlay = Overlay::default();
        overlay.apply("a".into(), rec(Some(5)));
        overlay.apply("a".into(), rec(Some(9)));
        overlay.apply("b".into(), rec(Some(9)));
        overlay.apply("b".into(), rec(Some(9)));
        overlay.apply("c".into(), rec(None));
        overlay.apply("c".into(), None);
        overlay.check().unwrap();
        let timers: Vec<_> = overlay.timers_below(None).cloned().collect();
        assert_eq!(timers, [(9, "a".to_owned()), (9, "b".to_owned())]);
        assert_eq!(overlay.get("c"), Some(None));
        assert_eq!(overlay.get("d"), None);
        let keys: Vec<String> = overlay.sorted_records().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "b"]);
        let one = record_bytes("a", rec(Some(9)).as_ref()) + record_bytes("a", None);
        assert_eq!(overlay.bytes(), 2 * one + record_bytes("c", None));
    }
}
