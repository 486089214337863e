//! Schema-evolution test plugin, layout 1 of 2: WORKLOAD.md's sensor-alerts logic on
//! the 0.2 state API, keeping its state in three variables so that `evolve-v2` can
//! change the layout of two of them and leave the third alone.
//!
//! - `last_ts` (value, layout 1: the sensor's last event time, an `i64`);
//! - `errors` (list, layout 1: the times of the current run's first three errors);
//! - `events` (value, layout 1 in both versions: events in the current episode).
//!
//! One event-time timer per sensor at `last_ts + 600_001` clears them: it fires once
//! the watermark is past the gap, when any event that could still join the episode
//! would be late (0.2 timers fire at `expiry <= watermark`, hence the `+ 1`).

use groupstate_sdk::v2::{KeyState, KeyedFunction, Timer, Variable};
use groupstate_sdk::{Error, Event, Params, PluginInfo, export_keyed_plugin};
use serde::{Deserialize, Serialize};

/// The plugin (no parameters).
pub struct Evolve;

/// An input event; its time is the pipeline's time field.
#[derive(Deserialize)]
pub struct Reading {
    status: String,
}

/// An alert, as the sensor-alerts plugin writes it.
#[derive(Serialize)]
pub struct Alert {
    sensor_id: String,
    ts: i64,
    first_ts: i64,
}

const LAST_TS: &str = "last_ts";
const ERRORS: &str = "errors";
const EVENTS: &str = "events";
const GAP_MS: i64 = 600_000;

impl KeyedFunction for Evolve {
    type Key = String;
    type Event = Reading;
    type Output = Alert;

    fn info() -> PluginInfo {
        PluginInfo { name: "evolve", version: "1.0.0", state_schema_version: 1 }
    }

    fn variables() -> Vec<Variable> {
        vec![Variable::value(LAST_TS), Variable::list(ERRORS), Variable::value(EVENTS)]
    }

    fn init(params: &Params) -> Result<Self, Error> {
        params.reject_unknown(&[])?;
        Ok(Self)
    }

    fn process(
        &mut self,
        key: &String,
        events: Vec<Event<Reading>>,
        state: &KeyState<'_>,
    ) -> Result<Vec<Alert>, Error> {
        let (last, errors, count) =
            (state.value::<i64>(LAST_TS), state.list::<i64>(ERRORS), state.value::<u64>(EVENTS));
        let mut last_ts = last.get()?;
        let mut run: Vec<i64> = errors.get()?;
        let mut n = count.get()?.unwrap_or(0);
        if let Some(old) = last_ts {
            state.delete_timer(old + GAP_MS + 1, None)?;
        }
        let mut out = Vec::new();
        for event in events {
            let ts = event.time_ms.ok_or_else(|| Error::msg("events need a time: run with --time-field ts"))?;
            if last_ts.is_some_and(|last| ts - last > GAP_MS) {
                run.clear();
                errors.clear()?;
                n = 0;
            }
            if event.value.status == "err" {
                if run.len() < 3 {
                    run.push(ts);
                    errors.append(&ts)?;
                    if run.len() == 3 && ts - run[0] <= 60_000 {
                        out.push(Alert { sensor_id: key.clone(), ts, first_ts: run[0] });
                    }
                }
            } else if !run.is_empty() {
                run.clear();
                errors.clear()?;
            }
            last_ts = Some(ts);
            n += 1;
        }
        if let Some(ts) = last_ts {
            last.set(&ts)?;
            count.set(&n)?;
            state.register_timer(ts + GAP_MS + 1, None)?;
        }
        Ok(out)
    }

    fn handle_expired_timer(&mut self, _: &String, _: Timer, state: &KeyState<'_>) -> Result<Vec<Alert>, Error> {
        state.value::<i64>(LAST_TS).clear()?;
        state.list::<i64>(ERRORS).clear()?;
        state.value::<u64>(EVENTS).clear()?;
        Ok(Vec::new())
    }
}

export_keyed_plugin!(Evolve);
