//! The records the store keeps: per key ([`KeyRecord`]), per batch ([`Checkpoint`],
//! [`BatchPlan`], [`KeyChange`]) and per state dir ([`PipelineIdentity`]). They sit
//! below both the store and its redo log, which encode them through `codec`; neither
//! of the two imports the other for them.

use bincode::{BorrowDecode, Decode, Encode};

/// Everything the store keeps for one group key.
#[derive(Debug, Clone, Eq, Encode, Decode)]
pub struct KeyRecord {
    /// The state value (opaque to the host), if the key has one.
    pub value: Option<Vec<u8>>,
    /// The key's timeout deadline in epoch milliseconds (processing or event time, per
    /// the pipeline's timeout kind), if one is set.
    pub timeout_ms: Option<i64>,
    /// The plugin state-schema version that wrote `value`.
    pub schema_version: u32,
}

/// The fields' equality, the deadline and schema first: a batch compares each call's
/// record with the one it loaded, whose value lies apart in memory and was read long
/// before, and most calls move the deadline (the comparison's `memcmp` took 1.8% of a
/// batch loop at a million keys).
impl PartialEq for KeyRecord {
    fn eq(&self, other: &Self) -> bool {
        self.timeout_ms == other.timeout_ms && self.schema_version == other.schema_version && self.value == other.value
    }
}

impl KeyRecord {
    /// A record with neither value nor timeout carries nothing and is not stored.
    pub fn is_empty(&self) -> bool {
        self.value.is_none() && self.timeout_ms.is_none()
    }
}

/// A [`KeyRecord`] read in place from its encoding (the same encoding: the fold reads
/// the deadlines of the records it keeps without copying their values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, BorrowDecode)]
pub struct KeyRecordRef<'a> {
    /// See [`KeyRecord::value`].
    pub value: Option<&'a [u8]>,
    /// See [`KeyRecord::timeout_ms`].
    pub timeout_ms: Option<i64>,
    /// See [`KeyRecord::schema_version`].
    pub schema_version: u32,
}

/// Counters carried in the checkpoint, so that a resumed run reports totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Encode, Decode)]
pub struct Counters {
    /// Input records read (good, late and bad).
    pub records: u64,
    /// Records that went to the plugin.
    pub events: u64,
    /// Records behind the watermark, written to the late output.
    pub late: u64,
    /// Records that could not be decoded.
    pub bad_records: u64,
    /// Plugin calls with data.
    pub data_calls: u64,
    /// Plugin calls for expired timeouts.
    pub timeout_calls: u64,
    /// Outputs written.
    pub outputs: u64,
    /// Plugin calls that failed (trap, limit, or an `err` result) and were skipped or
    /// dead-lettered.
    pub failed_calls: u64,
}

impl Counters {
    /// Adds `other`'s counts to these (a sum over batches).
    pub fn add(&mut self, other: &Counters) {
        self.records += other.records;
        self.events += other.events;
        self.late += other.late;
        self.bad_records += other.bad_records;
        self.data_calls += other.data_calls;
        self.timeout_calls += other.timeout_calls;
        self.outputs += other.outputs;
        self.failed_calls += other.failed_calls;
    }

    /// The counts since `earlier`, a copy of these counts taken before.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            records: self.records - earlier.records,
            events: self.events - earlier.events,
            late: self.late - earlier.late,
            bad_records: self.bad_records - earlier.bad_records,
            data_calls: self.data_calls - earlier.data_calls,
            timeout_calls: self.timeout_calls - earlier.timeout_calls,
            outputs: self.outputs - earlier.outputs,
            failed_calls: self.failed_calls - earlier.failed_calls,
        }
    }
}

/// The committed position of a pipeline: written atomically with the state changes
/// of the batch it closes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Encode, Decode)]
pub struct Checkpoint {
    /// The id the next batch gets.
    pub next_batch_id: u64,
    /// Input byte offset after the last committed record.
    pub input_offset: u64,
    /// A digest of the input's bytes before `input_offset` (0 for stdin): a resumed
    /// run checks that its input still has them.
    pub input_digest: u32,
    /// Committed byte lengths of the output, late-data and dead-letter files.
    pub output_len: u64,
    /// See `output_len`.
    pub late_len: u64,
    /// See `output_len`.
    pub dead_letter_len: u64,
    /// The largest event time seen in committed batches.
    pub max_event_time_ms: Option<i64>,
    /// The watermark of the last committed batch; it never moves backwards.
    pub watermark_ms: i64,
    /// Running totals.
    pub counters: Counters,
}

/// A batch fixed before it is processed (the write-ahead batch log): a crash re-runs
/// the same plan, so the replay sees the same records, time and watermark.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct BatchPlan {
    /// The batch id.
    pub batch_id: u64,
    /// Input byte offset of the first record.
    pub start_offset: u64,
    /// Input byte offset after the last record.
    pub end_offset: u64,
    /// The batch's processing time (epoch milliseconds).
    pub processing_time_ms: i64,
    /// The batch's watermark (epoch milliseconds).
    pub watermark_ms: i64,
}

/// What a state dir was created for; a later run must match it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct PipelineIdentity {
    /// The key field.
    pub key_field: String,
    /// The time field, if any.
    pub time_field: Option<String>,
    /// The timeout kind, as its CLI name.
    pub timeout: String,
    /// The input: its canonical path, or `-`.
    pub input: String,
    /// The output: its canonical path, or `-` (the committed output length refers to
    /// this file).
    pub output: String,
}

/// A key's record before and after a batch.
#[derive(Debug, Clone)]
pub struct KeyChange {
    /// The group key.
    pub key: String,
    /// The record as loaded at the start of the batch.
    pub before: Option<KeyRecord>,
    /// The record to store (`None` deletes it).
    pub after: Option<KeyRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_equal_only_when_every_field_is() {
        let record = KeyRecord { value: Some(vec![1, 2]), timeout_ms: Some(5), schema_version: 1 };
        assert_eq!(record, record.clone());
        let others = [
            KeyRecord { value: Some(vec![1, 3]), ..record.clone() },
            KeyRecord { value: None, ..record.clone() },
            KeyRecord { timeout_ms: Some(6), ..record.clone() },
            KeyRecord { timeout_ms: None, ..record.clone() },
            KeyRecord { schema_version: 2, ..record.clone() },
        ];
        for other in &others {
            assert_ne!(&record, other);
        }
    }
}
