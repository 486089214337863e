//! The inactivity-alert plugin ported to the 0.2 state API: per key, it counts the
//! events seen since the key last became active; when no event has arrived for more
//! than `timeout_ms` of processing time (default 60 s), it emits
//! `{"key":…,"last_seen_ms":…,"events":…}` once and forgets the key. The same
//! parameters, outputs and timing as `plugins/inactivity-alert` (0.1).
//!
//! State: value variable `activity`, and one unnamed processing-time timer per active
//! key. A data call moves the timer: it deletes the one at the old deadline (so it does
//! not fire in that batch, as a 0.1 key with data never times out in its batch) and
//! registers one at the new. The timer is at `last_seen_ms + timeout_ms + 1`: a 0.1
//! timeout fires when its deadline is strictly before the batch's processing time, a
//! 0.2 timer when its expiry is at or before it, so the `+ 1` keeps the alerts those of
//! the 0.1 plugin, batch for batch.
//!
//! Run it with `--timeout processing-time`; with `--follow`, the host runs empty batches
//! on its trigger interval, so alerts come out while no data arrives.

use groupstate_sdk::v2::{KeyState, KeyedFunction, Timer, Variable};
use groupstate_sdk::{Error, Event, ParamError, Params, PluginInfo, export_keyed_plugin};
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

const ACTIVITY: &str = "activity";

impl InactivityAlert {
    fn deadline(&self, activity: &Activity) -> i64 {
        activity.last_seen_ms.saturating_add(self.timeout_ms).saturating_add(1)
    }
}

impl KeyedFunction for InactivityAlert {
    type Key = String;
    // Any JSON object: only the count matters.
    type Event = serde::de::IgnoredAny;
    type Output = Inactive;

    fn info() -> PluginInfo {
        PluginInfo { name: "inactivity-alert-v2", version: env!("CARGO_PKG_VERSION"), state_schema_version: 1 }
    }

    fn variables() -> Vec<Variable> {
        vec![Variable::value(ACTIVITY)]
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
        _key: &String,
        events: Vec<Event<Self::Event>>,
        state: &KeyState<'_>,
    ) -> Result<Vec<Inactive>, Error> {
        let value = state.value::<Activity>(ACTIVITY);
        let mut activity = value.get()?.unwrap_or_default();
        if activity.events > 0 {
            state.delete_timer(self.deadline(&activity), None)?;
        }
        activity.events += events.len() as u64;
        activity.last_seen_ms = state.processing_time_ms();
        value.set(&activity)?;
        state.register_timer(self.deadline(&activity), None)?;
        Ok(Vec::new())
    }

    fn handle_expired_timer(
        &mut self,
        key: &String,
        _timer: Timer,
        state: &KeyState<'_>,
    ) -> Result<Vec<Inactive>, Error> {
        let value = state.value::<Activity>(ACTIVITY);
        let Some(activity) = value.get()? else {
            return Ok(Vec::new());
        };
        value.clear()?;
        Ok(vec![Inactive { key: key.clone(), last_seen_ms: activity.last_seen_ms, events: activity.events }])
    }
}

export_keyed_plugin!(InactivityAlert);

#[cfg(test)]
mod tests {
    use groupstate_sdk::testing::{Batch, KeyedDriver};
    use groupstate_sdk::v2::TimeMode;

    use super::*;

    fn driver() -> KeyedDriver<InactivityAlert> {
        KeyedDriver::new(&[("timeout_ms", "60000")], TimeMode::ProcessingTime).expect("init")
    }

    #[test]
    fn a_key_alerts_once_after_more_than_the_timeout_of_silence() {
        let mut d = driver();
        d.run(Batch::new().processing_time_ms(1_000_000).event("d-1", "{}").event("d-2", "{}").event("d-1", "{}"));
        assert_eq!(d.timers("d-1"), [Timer { expiry_ms: 1_060_001, name: None }]);
        // d-2 speaks again: its timer moves, d-1's stays.
        d.run(Batch::new().processing_time_ms(1_040_000).event("d-2", r#"{"x":[1,2]}"#));
        assert_eq!(d.timers("d-2"), [Timer { expiry_ms: 1_100_001, name: None }]);
        assert!(d.run(Batch::new().processing_time_ms(1_060_000)).outputs().is_empty(), "exactly the timeout: not yet");
        let alerts = d.run(Batch::new().processing_time_ms(1_060_001)).outputs();
        assert_eq!(alerts, [r#"{"key":"d-1","last_seen_ms":1000000,"events":2}"#]);
        assert!(d.run(Batch::new().processing_time_ms(1_090_000)).outputs().is_empty(), "once");
        let alerts = d.run(Batch::new().processing_time_ms(1_100_001)).outputs();
        assert_eq!(alerts, [r#"{"key":"d-2","last_seen_ms":1040000,"events":2}"#]);
        assert!(d.keys().is_empty(), "alerted keys are forgotten");
    }

    #[test]
    fn data_in_the_batch_where_the_timer_expires_keeps_the_key_alive() {
        let mut d = driver();
        d.run(Batch::new().processing_time_ms(1_000).event("k", "{}"));
        let r = d.run(Batch::new().processing_time_ms(500_000).event("k", "{}"));
        assert!(r.outputs().is_empty() && r.timer_calls().is_empty(), "{:?}", r.calls);
        assert_eq!(d.timers("k"), [Timer { expiry_ms: 560_001, name: None }]);
        assert_eq!(d.key_state("k", |s| s.value::<Activity>(ACTIVITY).get()).unwrap().map(|a| a.events), Some(2));
    }

    #[test]
    fn a_bad_timeout_is_refused() {
        let err = KeyedDriver::<InactivityAlert>::new(&[("timeout_ms", "0")], TimeMode::ProcessingTime).err();
        assert!(err.is_some_and(|e| e.contains("timeout_ms")));
    }
}
