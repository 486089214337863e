//! Run a plugin natively, without a host: for a 0.1 [`StateFunction`], an in-memory
//! [`TestState`] with the host's rules (Spark's `TestGroupState`); for a 0.2
//! [`KeyedFunction`](crate::v2::KeyedFunction), a [`KeyedDriver`] that runs it over
//! several keys and batches (see [`keyed`]).
//!
//! ```
//! use groupstate_sdk::testing::{self, TestState};
//! use groupstate_sdk::{Error, Event, GroupState, Params, PluginInfo, StateFunction, TimeoutKind};
//!
//! /// Counts events per key and reports the running count.
//! struct Count;
//!
//! impl StateFunction for Count {
//!     type Key = String;
//!     type Event = serde_json::Value;
//!     type State = u64;
//!     type Output = u64;
//!
//!     fn info() -> PluginInfo {
//!         PluginInfo { name: "count", version: "0.1.0", state_schema_version: 1 }
//!     }
//!
//!     fn init(_params: &Params) -> Result<Self, Error> {
//!         Ok(Count)
//!     }
//!
//!     fn process(
//!         &mut self,
//!         _key: &String,
//!         events: Vec<Event<serde_json::Value>>,
//!         state: &mut GroupState<'_, u64>,
//!     ) -> Result<Vec<u64>, Error> {
//!         let count = state.get()?.unwrap_or(0) + events.len() as u64;
//!         state.update(&count)?;
//!         state.set_timeout_duration(60_000)?;
//!         Ok(vec![count])
//!     }
//! }
//!
//! let mut count: Count = testing::init(&[]).unwrap();
//! let mut state = TestState::new(TimeoutKind::ProcessingTime);
//! state.set_processing_time_ms(1_000);
//! let events = [Event::new("{}"), Event::new("{}")];
//! assert_eq!(testing::process(&mut count, "k", &events, &mut state).unwrap(), ["2"]);
//! assert_eq!(state.value::<u64>().unwrap(), Some(2));
//! assert_eq!(state.timeout_ms(), Some(61_000));
//! ```

pub mod keyed;

pub use keyed::{Batch, BatchResult, Call, KeyedDriver};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::{self, CodecError};
use crate::export::run_process;
use crate::{Event, FromKey, GroupState, KeyError, Params, StateError, StateFunction, TimeoutKind};

/// One key's state as the host keeps it, for native tests: the value (as encoded
/// bytes), the timeout deadline, and the batch's watermark and processing time.
///
/// [`process`] and [`process_timeout`] apply the host's rules to it: the timeout is
/// cleared at the start of each call, setters are checked as the host checks them
/// (timeout kind, positive values, not before the watermark, `state_bytes_max`), and a
/// call that returns an error leaves the value and timeout as they were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestState {
    pub(crate) value: Option<Vec<u8>>,
    timeout_ms: Option<i64>,
    pub(crate) timeout_kind: TimeoutKind,
    pub(crate) watermark_ms: i64,
    pub(crate) processing_time_ms: i64,
    pub(crate) timed_out: bool,
    state_bytes_max: u64,
    /// The buffer the next update encodes into: the replaced value's.
    spare: Spare,
}

/// A buffer kept for the next encoding of a value: not part of the state, so any two
/// are equal.
#[derive(Clone, Default)]
struct Spare(Vec<u8>);

impl PartialEq for Spare {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Spare {}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Spare")
    }
}

impl TestState {
    /// An empty state in a pipeline with `timeout_kind`, with watermark and processing
    /// time 0 and no size limit.
    pub fn new(timeout_kind: TimeoutKind) -> Self {
        TestState {
            value: None,
            timeout_ms: None,
            timeout_kind,
            watermark_ms: 0,
            processing_time_ms: 0,
            timed_out: false,
            state_bytes_max: u64::MAX,
            spare: Spare::default(),
        }
    }

    /// Limits encoded values to `state_bytes_max` bytes, as the host's option of that name.
    pub fn with_state_bytes_max(mut self, state_bytes_max: u64) -> Self {
        self.state_bytes_max = state_bytes_max;
        self
    }

    /// Sets the watermark of the next calls, in epoch milliseconds.
    pub fn set_watermark_ms(&mut self, watermark_ms: i64) {
        self.watermark_ms = watermark_ms;
    }

    /// Sets the processing time of the next calls, in epoch milliseconds.
    pub fn set_processing_time_ms(&mut self, processing_time_ms: i64) {
        self.processing_time_ms = processing_time_ms;
    }

    /// The stored value decoded as `S`, or `None` when there is none.
    pub fn value<S: DeserializeOwned>(&self) -> Result<Option<S>, CodecError> {
        self.value.as_deref().map(codec::decode).transpose()
    }

    /// Stores `value`, as a previous call would have (no size check).
    pub fn set_value<S: Serialize>(&mut self, value: &S) -> Result<(), CodecError> {
        self.value = Some(codec::encode(value)?);
        Ok(())
    }

    /// Stores raw bytes, such as a value written under an older state schema.
    pub fn set_value_bytes(&mut self, bytes: Option<Vec<u8>>) {
        self.value = bytes;
    }

    /// The stored value's bytes, or `None` when there is none.
    pub fn value_bytes(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }

    /// The timeout deadline the last call set (epoch milliseconds, in processing time or
    /// event time after the pipeline's kind), or `None`.
    pub fn timeout_ms(&self) -> Option<i64> {
        self.timeout_ms
    }

    /// Whether the host would now fire the timeout: the deadline is before the
    /// processing time (processing-time pipelines) or the watermark (event-time ones).
    pub fn timeout_expired(&self) -> bool {
        match (self.timeout_kind, self.timeout_ms) {
            (TimeoutKind::ProcessingTime, Some(deadline)) => deadline < self.processing_time_ms,
            (TimeoutKind::EventTime, Some(deadline)) => deadline < self.watermark_ms,
            _ => false,
        }
    }

    /// Sets the stored value of the next `process-batch` call, copied into the buffer
    /// the last call left.
    pub(crate) fn refill_value(&mut self, value: Option<&[u8]>) {
        match value {
            Some(bytes) => {
                let mut buffer = self.value.take().unwrap_or_else(|| std::mem::take(&mut self.spare.0));
                buffer.clear();
                buffer.extend_from_slice(bytes);
                self.value = Some(buffer);
            }
            None => {
                if let Some(old) = self.value.take() {
                    self.spare.0 = old;
                }
            }
        }
    }

    /// Starts a call as the host does: the timeout is cleared at the start of every call.
    pub(crate) fn begin_call(&mut self, timed_out: bool) {
        self.timeout_ms = None;
        self.timed_out = timed_out;
    }

    /// Stages `value` encoded, in the buffer the replaced value leaves for the next one.
    pub(crate) fn update<S: Serialize>(&mut self, value: &S) -> Result<(), StateError> {
        let mut bytes = std::mem::take(&mut self.spare.0);
        bytes.clear();
        let checked = match codec::encode_into(value, &mut bytes) {
            Err(error) => Err(StateError::Encode { message: error.to_string() }),
            Ok(()) if bytes.len() as u64 > self.state_bytes_max => Err(StateError::StateTooLarge {
                state_bytes: bytes.len() as u64,
                state_bytes_max: self.state_bytes_max,
            }),
            Ok(()) => Ok(()),
        };
        match checked {
            Ok(()) => self.spare.0 = self.value.replace(bytes).unwrap_or_default(),
            Err(_) => self.spare.0 = bytes,
        }
        checked
    }

    pub(crate) fn set_timeout_duration(&mut self, duration_ms: i64) -> Result<(), StateError> {
        self.check_timeout(TimeoutKind::ProcessingTime, duration_ms)?;
        self.timeout_ms = Some(self.processing_time_ms.saturating_add(duration_ms));
        Ok(())
    }

    pub(crate) fn set_timeout_timestamp(&mut self, timestamp_ms: i64) -> Result<(), StateError> {
        self.check_timeout(TimeoutKind::EventTime, timestamp_ms)?;
        if timestamp_ms < self.watermark_ms {
            return Err(StateError::TimestampBeforeWatermark { timestamp_ms, watermark_ms: self.watermark_ms });
        }
        self.timeout_ms = Some(timestamp_ms);
        Ok(())
    }

    fn check_timeout(&self, kind: TimeoutKind, value_ms: i64) -> Result<(), StateError> {
        if self.timeout_kind != kind {
            return Err(StateError::TimeoutKindMismatch { pipeline_kind: self.timeout_kind });
        }
        if value_ms <= 0 {
            return Err(StateError::NonPositiveTimeout { value_ms });
        }
        Ok(())
    }
}

/// Builds an instance from `name, value` parameters, as the host's `init` does.
pub fn init<T: StateFunction>(params: &[(&str, &str)]) -> Result<T, String> {
    let pairs = params.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect();
    T::init(&Params::new(pairs)).map_err(String::from)
}

/// Calls `process` for `key` with `events` (JSON payloads), as the host does for a key
/// with data; returns the outputs as JSON text, exactly what the host would write.
pub fn process<T: StateFunction>(
    instance: &mut T,
    key: &str,
    events: &[Event<&str>],
    state: &mut TestState,
) -> Result<Vec<String>, String> {
    call(instance, key, events, false, state)
}

/// Calls `process` for `key` with no events and `has_timed_out` true, as the host does
/// when the key's timeout fires. It does not check [`TestState::timeout_expired`], so
/// tests can also call it early.
pub fn process_timeout<T: StateFunction>(
    instance: &mut T,
    key: &str,
    state: &mut TestState,
) -> Result<Vec<String>, String> {
    call(instance, key, &[], true, state)
}

fn call<T: StateFunction>(
    instance: &mut T,
    key: &str,
    events: &[Event<&str>],
    timed_out: bool,
    state: &mut TestState,
) -> Result<Vec<String>, String> {
    let key = T::Key::from_key(key.to_string()).map_err(KeyError::call_message)?;
    let before = state.clone();
    state.begin_call(timed_out);
    let events = events.iter().map(|event| (event.time_ms, event.value));
    let result = run_process(instance, &key, events, GroupState::from_test(state));
    state.timed_out = false;
    if result.is_err() {
        *state = before;
    }
    result.map_err(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setters_follow_the_host_rules() {
        let mut state = TestState::new(TimeoutKind::EventTime).with_state_bytes_max(2);
        state.set_watermark_ms(100);
        assert_eq!(
            state.set_timeout_duration(5),
            Err(StateError::TimeoutKindMismatch { pipeline_kind: TimeoutKind::EventTime })
        );
        assert_eq!(state.set_timeout_timestamp(0), Err(StateError::NonPositiveTimeout { value_ms: 0 }));
        assert_eq!(
            state.set_timeout_timestamp(99),
            Err(StateError::TimestampBeforeWatermark { timestamp_ms: 99, watermark_ms: 100 })
        );
        assert_eq!(state.set_timeout_timestamp(100), Ok(()));
        assert_eq!(state.timeout_ms(), Some(100));
        assert!(!state.timeout_expired());
        state.set_watermark_ms(101);
        assert!(state.timeout_expired());
        assert_eq!(state.update(&300u32), Err(StateError::StateTooLarge { state_bytes: 3, state_bytes_max: 2 }));
        assert_eq!(state.value_bytes(), None);
        assert_eq!(state.update(&7u8), Ok(()));
        assert_eq!(state.update(&300u32), Err(StateError::StateTooLarge { state_bytes: 3, state_bytes_max: 2 }));
        assert_eq!(state.value::<u8>(), Ok(Some(7)), "a refused update leaves the value");
        assert_eq!(state.update(&9u8), Ok(()));
        assert_eq!(state.value::<u8>(), Ok(Some(9)));
    }
}
