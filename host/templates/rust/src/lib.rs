//! The `{{name}}` groupstate plugin. Per key, it counts the events and emits
//! `{"key":…,"count":…}` at every `every`th event (parameter `every`, default 3). With
//! event-time timeouts, a key that gets no event for `idle_ms` of event time (default
//! 60 000) is forgotten: its count starts again from 0.

use groupstate_sdk::{Error, Event, GroupState, ParamError, Params, PluginInfo, StateError, StateFunction};
use serde::{Deserialize, Serialize};

/// The plugin, configured by its parameters.
pub struct Plugin {
    /// Emit at every `every`th event of a key.
    every: u64,
    /// Forget a key after this much event time without events.
    idle_ms: i64,
}

/// A key's state between calls.
#[derive(Default, Serialize, Deserialize)]
pub struct Count {
    /// Events seen since the key was (re)started.
    count: u64,
    /// The latest event time seen, in epoch milliseconds.
    last_ms: i64,
}

/// What the plugin emits.
#[derive(Serialize)]
pub struct Counted {
    key: String,
    count: u64,
}

impl StateFunction for Plugin {
    type Key = String;
    // Any JSON value: only the count and the event time matter.
    type Event = serde::de::IgnoredAny;
    type State = Count;
    type Output = Counted;

    fn info() -> PluginInfo {
        PluginInfo { name: "{{name}}", version: env!("CARGO_PKG_VERSION"), state_schema_version: 1 }
    }

    fn init(params: &Params) -> Result<Self, Error> {
        params.reject_unknown(&["every", "idle_ms"])?;
        let every: i64 = params.get_or("every", 3)?;
        if every <= 0 {
            return Err(ParamError::new("every", format!("must be greater than 0, got {every}")).into());
        }
        let idle_ms: i64 = params.get_or("idle_ms", 60_000)?;
        if idle_ms <= 0 {
            return Err(ParamError::new("idle_ms", format!("must be greater than 0 ms, got {idle_ms}")).into());
        }
        Ok(Plugin { every: every as u64, idle_ms })
    }

    fn process(
        &mut self,
        key: &String,
        events: Vec<Event<Self::Event>>,
        state: &mut GroupState<'_, Count>,
    ) -> Result<Vec<Counted>, Error> {
        if state.has_timed_out() {
            // No event for `idle_ms`: forget the key.
            state.remove();
            return Ok(Vec::new());
        }
        let mut count = state.get()?.unwrap_or_default();
        let mut outputs = Vec::new();
        for event in &events {
            count.count += 1;
            if count.count % self.every == 0 {
                outputs.push(Counted { key: key.clone(), count: count.count });
            }
            if let Some(time_ms) = event.time_ms {
                count.last_ms = count.last_ms.max(time_ms);
            }
        }
        state.update(&count)?;
        // Without event-time timeouts (`--timeout none`), keys are kept for good.
        match state.set_timeout_timestamp(count.last_ms.saturating_add(self.idle_ms)) {
            Ok(()) | Err(StateError::TimeoutKindMismatch { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        Ok(outputs)
    }
}

groupstate_sdk::export_plugin!(Plugin);
