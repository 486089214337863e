//! What a batch's commit sends beyond the local store, before the store commits it:
//! for a Kafka input, the partition's transaction (`kafka.rs`: the output records,
//! the changelog records and the consumed offset, committed as one). The executor
//! (`pipeline.rs`) knows only this seam; the local commit follows a successful
//! export, so the local store is never ahead of what was exported.

use crate::records::{BatchPlan, Checkpoint, KeyChange};

/// One output record of a batch: the key whose call emitted it, and its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRecord {
    /// The key whose call emitted the line.
    pub key: String,
    /// The line (no newline).
    pub line: String,
}

/// The records a batch produces to one topic, in emission order.
#[derive(Debug, Clone, Copy)]
pub struct TopicRecords<'a> {
    /// The topic.
    pub topic: &'a str,
    /// Its records.
    pub records: &'a [OutputRecord],
}

/// A batch, as its commit is about to make it durable.
#[derive(Debug)]
pub struct ExportBatch<'a> {
    /// The batch's plan (id, input range).
    pub plan: &'a BatchPlan,
    /// The records of each output that is a Kafka topic (the results, late records
    /// and dead letters, in that order; the outputs that go to files are not here).
    pub topics: &'a [TopicRecords<'a>],
    /// The batch's key changes.
    pub changes: &'a [KeyChange],
    /// The checkpoint the batch commits.
    pub checkpoint: &'a Checkpoint,
    /// The plugin world whose state the batch changes (1 or 2), which a store
    /// restored from the export must record.
    pub state_api: u32,
}

/// An export failed: nothing of the batch is committed.
pub type ExportError = Box<dyn std::error::Error + Send + Sync>;

/// Where a batch goes before the local commit.
pub trait BatchExport: Send {
    /// Whether the batch of `plan` was exported and committed there already: a
    /// replayed batch whose export committed while the local commit after it did not.
    fn exported(&self, plan: &BatchPlan) -> bool;

    /// Makes the batch durable where it goes, all of it or nothing.
    fn export(&mut self, batch: &ExportBatch<'_>) -> Result<(), ExportError>;
}
