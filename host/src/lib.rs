//! groupstate: per-key state machines over a stream of events, like Spark's
//! `mapGroupsWithState`, with the user's logic as a sandboxed WebAssembly component
//! and the state kept in sled.
//!
//! Start at [`pipeline::Pipeline`]; ARCHITECTURE.md has the map.

pub mod admin;
pub mod allocator;
mod applied;
pub mod clock;
pub mod codec;
pub mod config;
pub mod decode;
pub mod export;
mod fold_mark;
mod function;
mod groups;
mod hot_swap;
pub mod kafka;
mod key_index;
mod key_order;
pub mod keyed;
pub mod metrics;
mod overlay;
mod pace;
mod page;
pub mod partitions;
pub mod pipeline;
pub mod plugin;
mod prefetch;
mod prepare;
mod records;
mod redo;
pub mod reload;
pub mod restore;
pub mod scaffold;
mod scan_groups;
pub mod scenario;
pub mod sink;
pub mod source;
pub mod state_keys;
pub mod store;
mod swap;
pub mod workload;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{ErrorPolicy, Limits, PipelineConfig, Stream, TimeoutKind};
pub use pipeline::{
    BatchReport, Candidate, Error, OfferError, Offered, Pipeline, PipelineTarget, PluginStatus, RunSummary, StageTimes,
    StateFunction, SwapSender, SwapTarget, TargetStatus,
};
