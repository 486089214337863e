//! The sensor-alerts plugin: alert when a sensor reports three errors in a row within a minute (the workload in WORKLOAD.md).
//!
//! Per sensor (key = `sensor_id`), each call's events are processed in `ts` order:
//!
//! - an event more than `gap_ms` (default 10 minutes) after the sensor's last event
//!   starts a new episode: the state is reset first;
//! - `"err"` counts one more consecutive error (the first one's `ts` is remembered),
//!   `"ok"` sets the count back to 0;
//! - when the count becomes exactly 3 and the third error is at most `window_ms`
//!   (default 1 minute) after the first, it emits
//!   `{"sensor_id":…,"ts":<ts of the 3rd error>,"first_ts":<ts of the 1st>}`;
//! - the state expires through an event-time timeout `gap_ms` after the sensor's last
//!   event (the timeout is skipped in pipelines without event-time timeouts); the
//!   timed-out call removes it and emits nothing.
//!
//! Because of the gap rule, the alerts do not depend on batch sizes or on when
//! timeouts fire.

use groupstate_sdk::{Error, Event, GroupState, ParamError, Params, PluginInfo, StateError, StateFunction};
use serde::{Deserialize, Serialize};

/// The plugin, configured by its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SensorAlerts {
    /// A sensor silent for longer than this starts a new episode; also how long after
    /// its last event a sensor's state is kept.
    gap_ms: i64,
    /// The most time from the first to the third consecutive error for an alert.
    window_ms: i64,
}

/// Parameter defaults, from WORKLOAD.md.
const GAP_MS_DEFAULT: i64 = 600_000;
const WINDOW_MS_DEFAULT: i64 = 60_000;

/// One input line; `sensor_id` (the key) and `reading` are not needed, so not decoded.
#[derive(Debug, Deserialize)]
pub struct Reading {
    /// Event time, epoch milliseconds.
    ts: i64,
    /// Whether the sensor reported an error.
    status: Status,
}

/// A reading's `status` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    Err,
}

/// A sensor's state between calls: the current episode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Episode {
    /// Errors since the last `"ok"` or the start of the episode.
    consecutive_errors: u32,
    /// The `ts` of the first of those errors.
    first_error_ts: i64,
    /// The `ts` of the sensor's last event.
    last_ts: i64,
}

/// The output: three consecutive errors within the window.
#[derive(Debug, Serialize)]
pub struct Alert {
    sensor_id: String,
    /// The `ts` of the third error.
    ts: i64,
    /// The `ts` of the first error.
    first_ts: i64,
}

impl StateFunction for SensorAlerts {
    type Key = String;
    type Event = Reading;
    type State = Episode;
    type Output = Alert;

    fn info() -> PluginInfo {
        PluginInfo { name: "sensor-alerts", version: env!("CARGO_PKG_VERSION"), state_schema_version: 1 }
    }

    fn init(params: &Params) -> Result<Self, Error> {
        params.reject_unknown(&["gap_ms", "window_ms"])?;
        let gap_ms = params.get_or("gap_ms", GAP_MS_DEFAULT)?;
        if gap_ms <= 0 {
            return Err(ParamError::new("gap_ms", format!("must be greater than 0 ms, got {gap_ms}")).into());
        }
        let window_ms = params.get_or("window_ms", WINDOW_MS_DEFAULT)?;
        if window_ms < 0 {
            return Err(ParamError::new("window_ms", format!("must be 0 ms or more, got {window_ms}")).into());
        }
        Ok(SensorAlerts { gap_ms, window_ms })
    }

    fn process(
        &mut self,
        sensor_id: &String,
        mut events: Vec<Event<Reading>>,
        state: &mut GroupState<'_, Episode>,
    ) -> Result<Vec<Alert>, Error> {
        // Checked only without events: a call with data is never a timeout call, and
        // this saves a host call per key.
        if events.is_empty() {
            if state.has_timed_out() {
                state.remove();
            } else if let Some(episode) = state.get()? {
                // Not a call the host makes today; every call clears the timeout, so set
                // it again rather than leave the state without one.
                self.set_expiry(state, episode.last_ts)?;
            }
            return Ok(Vec::new());
        }

        // Stable: events with equal `ts` keep their arrival order.
        events.sort_by_key(|event| event.value.ts);
        let mut episode = state.get()?;
        let mut alerts = Vec::new();
        for event in &events {
            let reading = &event.value;
            let silent_too_long =
                episode.is_some_and(|episode| reading.ts.saturating_sub(episode.last_ts) > self.gap_ms);
            if silent_too_long {
                episode = None;
            }
            let episode = episode.get_or_insert_default();
            if let Some(alert) = self.step(episode, reading) {
                alerts.push(Alert { sensor_id: sensor_id.clone(), ..alert });
            }
        }

        // `events` is not empty, so there is an episode.
        if let Some(episode) = episode {
            state.update(&episode)?;
            self.set_expiry(state, episode.last_ts)?;
        }
        Ok(alerts)
    }
}

impl SensorAlerts {
    /// Applies one reading to the episode; returns the alert (without `sensor_id`) when
    /// this reading is the third error in a row within the window.
    fn step(&self, episode: &mut Episode, reading: &Reading) -> Option<Alert> {
        episode.last_ts = reading.ts;
        if reading.status == Status::Ok {
            episode.consecutive_errors = 0;
            return None;
        }
        episode.consecutive_errors = episode.consecutive_errors.saturating_add(1);
        if episode.consecutive_errors == 1 {
            episode.first_error_ts = reading.ts;
        }
        let within_window = reading.ts.saturating_sub(episode.first_error_ts) <= self.window_ms;
        if episode.consecutive_errors != 3 || !within_window {
            return None;
        }
        Some(Alert { sensor_id: String::new(), ts: reading.ts, first_ts: episode.first_error_ts })
    }

    /// Expires the state `gap_ms` after the sensor's last event. Pipelines without
    /// event-time timeouts keep the state (the gap rule still starts new episodes).
    fn set_expiry(&self, state: &mut GroupState<'_, Episode>, last_ts: i64) -> Result<(), Error> {
        match state.set_timeout_timestamp(last_ts.saturating_add(self.gap_ms)) {
            Ok(()) | Err(StateError::TimeoutKindMismatch { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

groupstate_sdk::export_plugin!(SensorAlerts);

#[cfg(test)]
mod tests {
    use groupstate_sdk::TimeoutKind;
    use groupstate_sdk::testing::{self, TestState};

    use super::*;

    fn reading(ts: i64, status: &str) -> String {
        format!(r#"{{"sensor_id":"s-1","ts":{ts},"status":"{status}","reading":71.5}}"#)
    }

    fn alert(ts: i64, first_ts: i64) -> String {
        format!(r#"{{"sensor_id":"s-1","ts":{ts},"first_ts":{first_ts}}}"#)
    }

    /// Runs `batches` of `(ts, status)` for key `s-1` in an event-time pipeline, with
    /// the watermark at each batch's smallest `ts`, and checks all alerts emitted.
    fn check(params: &[(&str, &str)], batches: &[&[(i64, &str)]], expected: &[String]) {
        let mut plugin: SensorAlerts = testing::init(params).expect("init");
        let mut state = TestState::new(TimeoutKind::EventTime);
        let mut alerts = Vec::new();
        for batch in batches {
            let payloads: Vec<String> = batch.iter().map(|(ts, s)| reading(*ts, s)).collect();
            let events: Vec<_> = payloads.iter().map(|p| Event::new(p.as_str())).collect();
            let watermark_ms = batch.iter().map(|(ts, _)| *ts).min().unwrap_or(0);
            state.set_watermark_ms(watermark_ms);
            alerts.extend(testing::process(&mut plugin, "s-1", &events, &mut state).expect("process"));
        }
        assert_eq!(alerts, expected);
    }

    #[test]
    fn three_errors_within_the_window_alert_once() {
        let errors: &[(i64, &str)] = &[(1_000, "err"), (2_000, "err"), (61_000, "err"), (62_000, "err")];
        check(&[], &[errors], &[alert(61_000, 1_000)]);
    }

    #[test]
    fn three_errors_spanning_more_than_the_window_do_not_alert() {
        check(&[], &[&[(1_000, "err"), (2_000, "err"), (61_001, "err")]], &[]);
    }

    #[test]
    fn ok_resets_the_count() {
        let readings: &[(i64, &str)] = &[(1, "err"), (2, "err"), (3, "ok"), (4, "err"), (5, "err"), (6, "err")];
        check(&[], &[readings], &[alert(6, 4)]);
    }

    #[test]
    fn a_gap_starts_a_new_episode() {
        // A wide window, so that only the gap rule can prevent the alert: 600001 ms of
        // silence resets, exactly 600000 ms does not, in one batch or across two.
        let wide = &[("window_ms", "700000")];
        check(wide, &[&[(1, "err"), (2, "err"), (600_003, "err")]], &[]);
        check(wide, &[&[(1, "err"), (2, "err")], &[(600_003, "err")]], &[]);
        let expected = [alert(600_002, 1)];
        check(wide, &[&[(1, "err"), (2, "err"), (600_002, "err")]], &expected);
        check(wide, &[&[(1, "err"), (2, "err")], &[(600_002, "err")]], &expected);
    }

    #[test]
    fn events_are_processed_in_ts_order() {
        check(&[], &[&[(3, "err"), (1, "err"), (2, "ok"), (4, "err"), (5, "err")]], &[alert(5, 3)]);
    }

    #[test]
    fn alerts_do_not_depend_on_batch_boundaries() {
        let all: &[(i64, &str)] = &[(10, "err"), (20, "err"), (30, "err"), (40, "ok"), (50, "err")];
        let expected = [alert(30, 10)];
        check(&[], &[all], &expected);
        check(&[], &[&all[..1], &all[1..2], &all[2..]], &expected);
        check(&[], &[&all[..2], &all[2..]], &expected);
    }

    #[test]
    fn parameters_change_the_rules() {
        let readings: &[(i64, &str)] = &[(0, "err"), (100, "err"), (250, "err")];
        check(&[("window_ms", "200")], &[readings], &[]);
        check(&[("window_ms", "250")], &[readings], &[alert(250, 0)]);
        check(&[("gap_ms", "99")], &[readings], &[]);
    }

    #[test]
    fn state_expires_gap_ms_after_the_last_event() {
        let mut plugin: SensorAlerts = testing::init(&[]).expect("init");
        let mut state = TestState::new(TimeoutKind::EventTime);
        let (late, early) = (reading(5_000, "err"), reading(1_000, "err"));
        let events = [Event::new(late.as_str()), Event::new(early.as_str())];
        testing::process(&mut plugin, "s-1", &events, &mut state).expect("process");
        let expected = Episode { consecutive_errors: 2, first_error_ts: 1_000, last_ts: 5_000 };
        assert_eq!(state.value::<Episode>(), Ok(Some(expected)));
        assert_eq!(state.timeout_ms(), Some(605_000));

        state.set_watermark_ms(605_001);
        assert!(state.timeout_expired());
        assert_eq!(testing::process_timeout(&mut plugin, "s-1", &mut state), Ok(vec![]));
        assert_eq!(state.value_bytes(), None);
        assert_eq!(state.timeout_ms(), None);
    }

    #[test]
    fn pipelines_without_event_time_timeouts_keep_the_state() {
        let mut plugin: SensorAlerts = testing::init(&[]).expect("init");
        for kind in [TimeoutKind::None, TimeoutKind::ProcessingTime] {
            let mut state = TestState::new(kind);
            let payload = reading(1, "err");
            let out = testing::process(&mut plugin, "s-1", &[Event::new(payload.as_str())], &mut state);
            assert_eq!(out, Ok(vec![]));
            assert!(state.value_bytes().is_some());
            assert_eq!(state.timeout_ms(), None);
        }
    }

    #[test]
    fn a_bad_event_fails_the_call_and_keeps_the_state() {
        let mut plugin: SensorAlerts = testing::init(&[]).expect("init");
        let mut state = TestState::new(TimeoutKind::EventTime);
        let first = reading(1, "err");
        testing::process(&mut plugin, "s-1", &[Event::new(first.as_str())], &mut state).expect("process");
        let before = state.clone();
        let bad = r#"{"sensor_id":"s-1","ts":2,"status":"warn"}"#;
        let second = reading(2, "err");
        let error = testing::process(&mut plugin, "s-1", &[Event::new(second.as_str()), Event::new(bad)], &mut state)
            .expect_err("unknown status");
        assert!(
            error.starts_with("event 1 of 2: payload is not a valid sensor_alerts::Reading (unknown variant `warn`"),
            "{error}"
        );
        assert_eq!(state, before);
    }

    #[test]
    fn bad_parameters_are_refused() {
        let init = |params: &[(&str, &str)]| testing::init::<SensorAlerts>(params).expect_err("refused");
        assert_eq!(init(&[("gap_ms", "0")]), "parameter `gap_ms` must be greater than 0 ms, got 0");
        assert_eq!(init(&[("window_ms", "-1")]), "parameter `window_ms` must be 0 ms or more, got -1");
        assert!(init(&[("gap_ms", "10m")]).starts_with("parameter `gap_ms` is `10m`, not a valid i64"));
        assert!(init(&[("gap", "1")]).starts_with("parameter `gap` is not a parameter of this plugin"));
        assert_eq!(testing::init::<SensorAlerts>(&[]), Ok(SensorAlerts { gap_ms: 600_000, window_ms: 60_000 }));
    }

    #[test]
    fn a_new_schema_version_has_no_migration() {
        let error = SensorAlerts::migrate_state(0, &[]).expect_err("no migration");
        assert!(error.message().starts_with("no migration from state schema version 0 to 1"));
    }
}
