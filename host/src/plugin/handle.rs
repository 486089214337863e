//! The host side of the `group-state` handle and of the `log` interface (whose
//! messages go to the plugin's log, `output.rs`). Everything the plugin asks of the
//! handle is staged here; the engine applies it only when the call returns `ok`, so a
//! failed call leaves the key untouched.

use wasmtime::component::Resource;

use super::bindings::groupstate::plugin::{log, state, types};
use super::{CallRequest, HostState, WitTimeoutKind};
use crate::config::TimeoutKind;
use types::StateError;

/// The state value after a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StagedValue {
    /// Neither `update` nor `remove` was called.
    Unchanged,
    /// The new value.
    Updated(Vec<u8>),
    /// `remove` was called last.
    Removed,
}

/// The host's record behind one `group-state` handle: valid for one call.
#[derive(Debug)]
pub struct GroupStateHandle {
    /// The value before the call; `staged` says what the call made of it.
    before: Option<Vec<u8>>,
    staged: StagedValue,
    timeout_ms: Option<i64>,
    has_timed_out: bool,
    kind: TimeoutKind,
    watermark_ms: i64,
    processing_time_ms: i64,
    state_bytes_max: u64,
}

impl GroupStateHandle {
    pub(super) fn new(req: &CallRequest<'_>, kind: TimeoutKind, state_bytes_max: u64) -> Self {
        Self {
            before: req.state.map(<[u8]>::to_vec),
            staged: StagedValue::Unchanged,
            // Spark's rule: the timeout is cleared at every call.
            timeout_ms: None,
            has_timed_out: req.has_timed_out,
            kind,
            watermark_ms: req.watermark_ms,
            processing_time_ms: req.processing_time_ms,
            state_bytes_max,
        }
    }

    pub(super) fn into_staged(self) -> (StagedValue, Option<i64>) {
        (self.staged, self.timeout_ms)
    }

    fn set_duration(&mut self, duration_ms: i64) -> Result<(), StateError> {
        if self.kind != TimeoutKind::ProcessingTime {
            return Err(StateError::TimeoutKindMismatch(self.kind.into()));
        }
        if duration_ms <= 0 {
            return Err(StateError::NonPositiveTimeout(duration_ms));
        }
        self.timeout_ms = Some(self.processing_time_ms.saturating_add(duration_ms));
        Ok(())
    }

    fn set_timestamp(&mut self, timestamp_ms: i64) -> Result<(), StateError> {
        if self.kind != TimeoutKind::EventTime {
            return Err(StateError::TimeoutKindMismatch(self.kind.into()));
        }
        if timestamp_ms <= 0 {
            return Err(StateError::NonPositiveTimeout(timestamp_ms));
        }
        if timestamp_ms < self.watermark_ms {
            return Err(StateError::TimestampBeforeWatermark(self.watermark_ms));
        }
        self.timeout_ms = Some(timestamp_ms);
        Ok(())
    }

    /// The value as staged so far in this call.
    fn value(&self) -> Option<&[u8]> {
        match &self.staged {
            StagedValue::Unchanged => self.before.as_deref(),
            StagedValue::Updated(value) => Some(value),
            StagedValue::Removed => None,
        }
    }

    fn update(&mut self, value: Vec<u8>) -> Result<(), StateError> {
        if value.len() as u64 > self.state_bytes_max {
            return Err(StateError::StateTooLarge(self.state_bytes_max));
        }
        self.staged = StagedValue::Updated(value);
        Ok(())
    }
}

fn bad_handle(e: impl std::fmt::Display) -> wasmtime::Error {
    wasmtime::Error::msg(format!("invalid group-state handle: {e}"))
}

impl HostState {
    fn handle(&mut self, h: &Resource<GroupStateHandle>) -> wasmtime::Result<&mut GroupStateHandle> {
        self.table.get_mut(h).map_err(bad_handle)
    }
}

impl state::HostGroupState for HostState {
    fn exists(&mut self, h: Resource<GroupStateHandle>) -> wasmtime::Result<bool> {
        Ok(self.handle(&h)?.value().is_some())
    }

    fn get(&mut self, h: Resource<GroupStateHandle>) -> wasmtime::Result<Option<Vec<u8>>> {
        // A copy per call: a plugin that reads a large value in a loop spends its own
        // CPU time limit, and the copy is freed as soon as it is handed over.
        Ok(self.handle(&h)?.value().map(<[u8]>::to_vec))
    }

    fn update(&mut self, h: Resource<GroupStateHandle>, value: Vec<u8>) -> wasmtime::Result<Result<(), StateError>> {
        Ok(self.handle(&h)?.update(value))
    }

    fn remove(&mut self, h: Resource<GroupStateHandle>) -> wasmtime::Result<()> {
        self.handle(&h)?.staged = StagedValue::Removed;
        Ok(())
    }

    fn has_timed_out(&mut self, h: Resource<GroupStateHandle>) -> wasmtime::Result<bool> {
        Ok(self.handle(&h)?.has_timed_out)
    }

    fn set_timeout_duration(
        &mut self,
        h: Resource<GroupStateHandle>,
        duration_ms: i64,
    ) -> wasmtime::Result<Result<(), StateError>> {
        Ok(self.handle(&h)?.set_duration(duration_ms))
    }

    fn set_timeout_timestamp(
        &mut self,
        h: Resource<GroupStateHandle>,
        timestamp_ms: i64,
    ) -> wasmtime::Result<Result<(), StateError>> {
        Ok(self.handle(&h)?.set_timestamp(timestamp_ms))
    }

    fn timeout_kind(&mut self, h: Resource<GroupStateHandle>) -> wasmtime::Result<WitTimeoutKind> {
        Ok(self.handle(&h)?.kind.into())
    }

    fn current_watermark_ms(&mut self, h: Resource<GroupStateHandle>) -> wasmtime::Result<i64> {
        Ok(self.handle(&h)?.watermark_ms)
    }

    fn current_processing_time_ms(&mut self, h: Resource<GroupStateHandle>) -> wasmtime::Result<i64> {
        Ok(self.handle(&h)?.processing_time_ms)
    }

    fn drop(&mut self, _h: Resource<GroupStateHandle>) -> wasmtime::Result<()> {
        // The host owns every handle and deletes it when the call returns; the guest
        // only ever holds borrows, so there is nothing to drop here.
        Ok(())
    }
}

impl state::Host for HostState {}
impl types::Host for HostState {}

super::log_host!(log);
