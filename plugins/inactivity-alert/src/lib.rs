//! The inactivity-alert plugin: a processing-time example. Per key, it counts the
//! events seen since the key last became active; when no event has arrived for
//! `timeout_ms` of processing time (default 60 s), it emits
//! `{"key":…,"last_seen_ms":…,"events":…}` once and forgets the key.
//!
//! Run it with `--timeout processing-time`; with `--follow`, the host runs empty batches
//! on its trigger interval, so alerts come out while no data arrives.

use groupstate_sdk::{Error, Event, GroupState, ParamError, Params, PluginInfo, StateFunction};
use serde::{Deserialize, Serialize};

/// The plugin, configured by its parameters.
pub struct InactivityAlert {
    /// How long a key may stay silent, in milliseconds of processing time.
    timeout_ms: i64,
}

/// A key's state: when it was last seen and how many events it sent.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Activity {
    /// Processing time of the batch that brought the last event.
    last_seen_ms: i64,
    /// Events since the key became active.
    events: u64,
}

/// The alert.
#[derive(Debug, Serialize)]
pub struct Inactive {
    key: String,
    last_seen_ms: i64,
    events: u64,
}

impl StateFunction for InactivityAlert {
    type Key = String;
    // Any JSON object: only the count matters.
    type Event = serde::de::IgnoredAny;
    type State = Activity;
    type Output = Inactive;

    fn info() -> PluginInfo {
        PluginInfo { name: "inactivity-alert", version: env!("CARGO_PKG_VERSION"), state_schema_version: 1 }
    }

    fn init(params: &Params) -> Result<Self, Error> {
        params.reject_unknown(&["timeout_ms"])?;
        let timeout_ms = params.get_or("timeout_ms", 60_000)?;
        if timeout_ms <= 0 {
            return Err(ParamError::new("timeout_ms", format!("must be greater than 0 ms, got {timeout_ms}")).into());
        }
        Ok(Self { timeout_ms })
    }

    fn process(
        &mut self,
        key: &String,
        events: Vec<Event<Self::Event>>,
        state: &mut GroupState<'_, Activity>,
    ) -> Result<Vec<Inactive>, Error> {
        if state.has_timed_out() {
            let activity = state.get()?.unwrap_or_default();
            state.remove();
            return Ok(vec![Inactive {
                key: key.clone(),
                last_seen_ms: activity.last_seen_ms,
                events: activity.events,
            }]);
        }
        let mut activity = state.get()?.unwrap_or_default();
        activity.events += events.len() as u64;
        activity.last_seen_ms = state.current_processing_time_ms();
        state.update(&activity)?;
        state.set_timeout_duration(self.timeout_ms)?;
        Ok(Vec::new())
    }
}

groupstate_sdk::export_plugin!(InactivityAlert);
