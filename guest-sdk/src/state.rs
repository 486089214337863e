//! Typed per-key state over the WIT `group-state` handle (Spark's `GroupState`), and its errors.

use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::testing::TestState;
use crate::wit::groupstate::plugin::types as wit_types;
use crate::{Error, codec, wit};

/// The kind of timeout a pipeline uses. It is fixed per pipeline (the host's
/// `--timeout` flag), as Spark's `GroupStateTimeout` is fixed per query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeoutKind {
    /// Keys never time out; both timeout setters fail with
    /// [`StateError::TimeoutKindMismatch`].
    None,
    /// Deadlines are set with [`GroupState::set_timeout_duration`], relative to the
    /// batch's processing time, and fire when a later batch's processing time passes them.
    ProcessingTime,
    /// Deadlines are set with [`GroupState::set_timeout_timestamp`], in event time, and
    /// fire when the watermark passes them.
    EventTime,
}

impl From<wit_types::TimeoutKind> for TimeoutKind {
    fn from(kind: wit_types::TimeoutKind) -> Self {
        match kind {
            wit_types::TimeoutKind::None => TimeoutKind::None,
            wit_types::TimeoutKind::ProcessingTime => TimeoutKind::ProcessingTime,
            wit_types::TimeoutKind::EventTime => TimeoutKind::EventTime,
        }
    }
}

impl fmt::Display for TimeoutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimeoutKind::None => "none",
            TimeoutKind::ProcessingTime => "processing-time",
            TimeoutKind::EventTime => "event-time",
        })
    }
}

/// Why a [`GroupState`] request was refused. Every case is recoverable: the request had
/// no effect and the plugin may go on, or return the error (it converts into [`Error`]).
///
/// The cases mirror the WIT `state-error` variant, with the value the SDK passed added
/// for a better message, plus [`StateError::Encode`], which the SDK raises itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateError {
    /// The setter called does not match the pipeline's timeout kind, which is carried
    /// here: use `set_timeout_duration` with `processing-time`, `set_timeout_timestamp`
    /// with `event-time`, neither with `none`.
    TimeoutKindMismatch {
        /// The pipeline's timeout kind.
        pipeline_kind: TimeoutKind,
    },
    /// A timeout duration or timestamp must be greater than zero.
    NonPositiveTimeout {
        /// The duration or timestamp given, in milliseconds.
        value_ms: i64,
    },
    /// An event-time timeout must not be earlier than the current watermark: pick a
    /// timestamp at or after it.
    TimestampBeforeWatermark {
        /// The timestamp given, in epoch milliseconds.
        timestamp_ms: i64,
        /// The batch's watermark, in epoch milliseconds.
        watermark_ms: i64,
    },
    /// The encoded state value is larger than the pipeline's `state_bytes_max`: keep
    /// less per key, or raise the limit when running the host. The previous value stays.
    StateTooLarge {
        /// The size of the encoded value.
        state_bytes: u64,
        /// The pipeline's limit.
        state_bytes_max: u64,
    },
    /// The SDK could not encode the value (its `Serialize` implementation failed); the
    /// host was not asked. The previous value stays.
    Encode {
        /// What the encoder reported.
        message: String,
    },
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::TimeoutKindMismatch { pipeline_kind } => write!(
                f,
                "the timeout setter does not match the pipeline's timeout kind \
                 `{pipeline_kind}`: use set_timeout_duration with processing-time, \
                 set_timeout_timestamp with event-time, neither with none"
            ),
            StateError::NonPositiveTimeout { value_ms } => write!(
                f,
                "a timeout must be greater than 0 ms, got {value_ms}: pass a positive \
                 duration or timestamp"
            ),
            StateError::TimestampBeforeWatermark { timestamp_ms, watermark_ms } => write!(
                f,
                "timeout timestamp {timestamp_ms} is before the current watermark \
                 {watermark_ms}: pick a timestamp at or after the watermark"
            ),
            StateError::StateTooLarge { state_bytes, state_bytes_max } => write!(
                f,
                "state value of {state_bytes} bytes is larger than the pipeline's \
                 state_bytes_max of {state_bytes_max}: keep less per key, or raise the \
                 limit when running the host"
            ),
            StateError::Encode { message } => write!(
                f,
                "cannot encode the state value ({message}): check the state type's \
                 Serialize implementation"
            ),
        }
    }
}

impl std::error::Error for StateError {}

/// Where a [`GroupState`] reads and writes: the host, or a [`TestState`] in native tests.
enum Backend<'a> {
    Host(&'a wit::GroupState),
    Test(&'a mut TestState),
}

/// The state of one key during one `process` call, typed as `S` (Spark's `GroupState`).
/// Only valid for the duration of the call that received it.
///
/// Rules (Spark's): one state value per key; the timeout is cleared at the start of
/// every call, so a call that does not set it again leaves the key without a timeout;
/// [`update`](Self::update) and [`remove`](Self::remove) change only the value, never
/// the timeout set in this call; a key may hold a timeout without a value (it then
/// fires with [`exists`](Self::exists) false).
///
/// Everything asked of it is staged by the host and applied only when `process` returns
/// `Ok`: an error or a trap leaves the key's state and timeout as they were.
///
/// Values are stored as bytes written by [`codec::encode`]; see [`codec`] for what a
/// state type may contain.
pub struct GroupState<'a, S> {
    backend: Backend<'a>,
    state: PhantomData<fn() -> S>,
}

impl<'a, S: Serialize + DeserializeOwned> GroupState<'a, S> {
    pub(crate) fn from_host(handle: &'a wit::GroupState) -> Self {
        GroupState { backend: Backend::Host(handle), state: PhantomData }
    }

    pub(crate) fn from_test(test: &'a mut TestState) -> Self {
        GroupState { backend: Backend::Test(test), state: PhantomData }
    }

    /// Whether the key has a state value (as staged so far in this call).
    pub fn exists(&self) -> bool {
        match &self.backend {
            Backend::Host(handle) => handle.exists(),
            Backend::Test(test) => test.value.is_some(),
        }
    }

    /// The key's state value (as staged so far in this call), or `None`.
    ///
    /// Fails when the stored bytes do not decode as `S`: the state was written with
    /// another layout of the type. Raise `state_schema_version` whenever the layout
    /// changes and convert old values in
    /// [`StateFunction::migrate_state`](crate::StateFunction::migrate_state).
    pub fn get(&self) -> Result<Option<S>, Error> {
        match &self.backend {
            Backend::Host(handle) => handle.get().map_or(Ok(None), |bytes| Self::decode(&bytes)),
            // Read where it lies: `process-batch` calls run on this backend.
            Backend::Test(test) => test.value.as_deref().map_or(Ok(None), Self::decode),
        }
    }

    fn decode(bytes: &[u8]) -> Result<Option<S>, Error> {
        codec::decode(bytes).map(Some).map_err(|error| {
            Error::msg(format_args!(
                "the stored state ({} bytes) does not decode as {} ({error}): it was \
                 written with another layout; raise state_schema_version in info() and \
                 convert old values in migrate_state",
                bytes.len(),
                std::any::type_name::<S>()
            ))
        })
    }

    /// Replaces the key's state value. Fails with [`StateError::StateTooLarge`] when
    /// the encoded value exceeds the pipeline's limit; the previous value then stays.
    pub fn update(&mut self, value: &S) -> Result<(), StateError> {
        match &mut self.backend {
            Backend::Host(handle) => {
                let bytes = codec::encode(value).map_err(|error| StateError::Encode { message: error.to_string() })?;
                handle.update(&bytes).map_err(|error| from_wit_error(error, 0, bytes.len() as u64))
            }
            // Into the buffer of the value it replaces: `process-batch` calls run here.
            Backend::Test(test) => test.update(value),
        }
    }

    /// Removes the key's state value; [`exists`](Self::exists) is false afterwards.
    pub fn remove(&mut self) {
        match &mut self.backend {
            Backend::Host(handle) => handle.remove(),
            Backend::Test(test) => test.value = None,
        }
    }

    /// True when this call was made because the key's timeout expired; the call then
    /// has no events.
    pub fn has_timed_out(&self) -> bool {
        match &self.backend {
            Backend::Host(handle) => handle.has_timed_out(),
            Backend::Test(test) => test.timed_out,
        }
    }

    /// Sets a processing-time timeout `duration_ms` after the batch's processing time
    /// (not the wall clock at the moment of the call). `duration_ms` must be greater
    /// than zero; only with [`TimeoutKind::ProcessingTime`] pipelines.
    pub fn set_timeout_duration(&mut self, duration_ms: i64) -> Result<(), StateError> {
        match &mut self.backend {
            Backend::Host(handle) => {
                handle.set_timeout_duration(duration_ms).map_err(|error| from_wit_error(error, duration_ms, 0))
            }
            Backend::Test(test) => test.set_timeout_duration(duration_ms),
        }
    }

    /// Sets an event-time timeout at `timestamp_ms` (epoch milliseconds). It must be
    /// greater than zero and not earlier than the current watermark; only with
    /// [`TimeoutKind::EventTime`] pipelines. The key times out once the watermark
    /// passes it.
    pub fn set_timeout_timestamp(&mut self, timestamp_ms: i64) -> Result<(), StateError> {
        match &mut self.backend {
            Backend::Host(handle) => {
                handle.set_timeout_timestamp(timestamp_ms).map_err(|error| from_wit_error(error, timestamp_ms, 0))
            }
            Backend::Test(test) => test.set_timeout_timestamp(timestamp_ms),
        }
    }

    /// The pipeline's timeout kind.
    pub fn timeout_kind(&self) -> TimeoutKind {
        match &self.backend {
            Backend::Host(handle) => handle.timeout_kind().into(),
            Backend::Test(test) => test.timeout_kind,
        }
    }

    /// The batch's watermark in epoch milliseconds (0 before any event time has been
    /// seen). Constant within a batch and identical when a batch is replayed.
    pub fn current_watermark_ms(&self) -> i64 {
        match &self.backend {
            Backend::Host(handle) => handle.current_watermark_ms(),
            Backend::Test(test) => test.watermark_ms,
        }
    }

    /// The batch's processing time in epoch milliseconds, fixed when the batch was
    /// planned. Constant within a batch and identical when a batch is replayed.
    pub fn current_processing_time_ms(&self) -> i64 {
        match &self.backend {
            Backend::Host(handle) => handle.current_processing_time_ms(),
            Backend::Test(test) => test.processing_time_ms,
        }
    }
}

/// The host's error, with what the SDK sent added: `given_ms` for the timeout setters,
/// `state_bytes` for `update`.
fn from_wit_error(error: wit_types::StateError, given_ms: i64, state_bytes: u64) -> StateError {
    match error {
        wit_types::StateError::TimeoutKindMismatch(kind) => {
            StateError::TimeoutKindMismatch { pipeline_kind: kind.into() }
        }
        wit_types::StateError::NonPositiveTimeout(value_ms) => StateError::NonPositiveTimeout { value_ms },
        wit_types::StateError::TimestampBeforeWatermark(watermark_ms) => {
            StateError::TimestampBeforeWatermark { timestamp_ms: given_ms, watermark_ms }
        }
        wit_types::StateError::StateTooLarge(state_bytes_max) => {
            StateError::StateTooLarge { state_bytes, state_bytes_max }
        }
    }
}
