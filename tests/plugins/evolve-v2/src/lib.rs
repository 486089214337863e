//! Schema-evolution test plugin, layout 2 of 2: `evolve-v1`'s logic and alerts, with
//! new layouts for two of its three variables, converted in `migrate_state`:
//!
//! - `last_ts` (value, layout 2: [`LastSeen`], the time and where the episode began;
//!   layout 1 was the time alone);
//! - `errors` (list, layout 2: each error's time and reading; layout 1 was the time);
//! - `events` (value, layout 1 as before: this version refuses to convert it, so a
//!   host that asked would fail the call).
//!
//! With `--param refuse=true` it converts nothing (a broken release, for the tests of
//! a refused swap and of a failed conversion); with `--param fail_keys=K1,K2` its data
//! calls for those keys fail after reading and writing everything.

use groupstate_sdk::v2::{KeyState, KeyedFunction, StatePart, Timer, Variable, convert, render_as};
use groupstate_sdk::{Error, Event, Params, PluginInfo, export_keyed_plugin};
use serde::{Deserialize, Serialize};

/// The plugin.
pub struct Evolve {
    /// Converts nothing (`--param refuse=true`).
    refuse: bool,
    /// Keys whose data calls fail at their end (`--param fail_keys=K1,K2`).
    fail_keys: Vec<String>,
}

/// An input event; its time is the pipeline's time field.
#[derive(Deserialize)]
pub struct Reading {
    status: String,
    reading: f64,
}

/// An alert, as the sensor-alerts plugin writes it.
#[derive(Serialize)]
pub struct Alert {
    sensor_id: String,
    ts: i64,
    first_ts: i64,
}

/// Layout 2 of `last_ts`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct LastSeen {
    /// The sensor's last event time.
    ts: i64,
    /// When its episode began, where known (not for a converted layout-1 value).
    episode_start: Option<i64>,
}

/// Layout 2 of an `errors` element: the error's time and its reading, where known.
type ErrorSeen = (i64, Option<f64>);

const LAST_TS: &str = "last_ts";
const ERRORS: &str = "errors";
const EVENTS: &str = "events";
const GAP_MS: i64 = 600_000;

impl KeyedFunction for Evolve {
    type Key = String;
    type Event = Reading;
    type Output = Alert;

    fn info() -> PluginInfo {
        PluginInfo { name: "evolve", version: "2.0.0", state_schema_version: 2 }
    }

    fn variables() -> Vec<Variable> {
        vec![
            Variable::value(LAST_TS).with_schema_version(2),
            Variable::list(ERRORS).with_schema_version(2),
            Variable::value(EVENTS),
        ]
    }

    fn init(params: &Params) -> Result<Self, Error> {
        params.reject_unknown(&["refuse", "fail_keys"])?;
        let fail_keys: String = params.get_or("fail_keys", String::new())?;
        let fail_keys = fail_keys.split(',').filter(|k| !k.is_empty()).map(str::to_owned).collect();
        Ok(Self { refuse: params.get_or("refuse", false)?, fail_keys })
    }

    fn process(
        &mut self,
        key: &String,
        events: Vec<Event<Reading>>,
        state: &KeyState<'_>,
    ) -> Result<Vec<Alert>, Error> {
        let last = state.value::<LastSeen>(LAST_TS);
        let errors = state.list::<ErrorSeen>(ERRORS);
        let count = state.value::<u64>(EVENTS);
        let mut seen = last.get()?;
        let mut run: Vec<ErrorSeen> = errors.get()?;
        let mut n = count.get()?.unwrap_or(0);
        if let Some(old) = seen {
            state.delete_timer(old.ts + GAP_MS + 1, None)?;
        }
        let mut out = Vec::new();
        for event in events {
            let ts = event.time_ms.ok_or_else(|| Error::msg("events need a time: run with --time-field ts"))?;
            let episode_start = match seen {
                Some(s) if ts - s.ts <= GAP_MS => s.episode_start,
                Some(_) => {
                    run.clear();
                    errors.clear()?;
                    n = 0;
                    Some(ts)
                }
                None => Some(ts),
            };
            if event.value.status == "err" {
                if run.len() < 3 {
                    run.push((ts, Some(event.value.reading)));
                    errors.append(&(ts, Some(event.value.reading)))?;
                    if run.len() == 3 && ts - run[0].0 <= 60_000 {
                        out.push(Alert { sensor_id: key.clone(), ts, first_ts: run[0].0 });
                    }
                }
            } else if !run.is_empty() {
                run.clear();
                errors.clear()?;
            }
            seen = Some(LastSeen { ts, episode_start });
            n += 1;
        }
        if let Some(s) = seen {
            last.set(&s)?;
            count.set(&n)?;
            state.register_timer(s.ts + GAP_MS + 1, None)?;
        }
        if self.fail_keys.contains(key) {
            return Err(Error::msg(format!("{key} is in fail_keys")));
        }
        Ok(out)
    }

    fn handle_expired_timer(&mut self, _: &String, _: Timer, state: &KeyState<'_>) -> Result<Vec<Alert>, Error> {
        state.value::<LastSeen>(LAST_TS).clear()?;
        state.list::<ErrorSeen>(ERRORS).clear()?;
        state.value::<u64>(EVENTS).clear()?;
        Ok(Vec::new())
    }

    fn migrate_state(&self, variable: &str, part: StatePart, from: u32, bytes: &[u8]) -> Result<Vec<u8>, Error> {
        if self.refuse {
            return Err(Error::msg(format!("refusing to convert {variable} from layout {from} (refuse=true)")));
        }
        match (variable, part, from) {
            (LAST_TS, StatePart::Value, 1) => convert(bytes, |ts: i64| LastSeen { ts, episode_start: None }),
            (ERRORS, StatePart::ListElement, 1) => convert(bytes, |ts: i64| -> ErrorSeen { (ts, None) }),
            _ => Err(Error::msg(format!("no layout {from} of {variable} ({part:?}) to convert"))),
        }
    }

    fn render_state(&self, variable: &str, _: StatePart, bytes: &[u8]) -> Option<String> {
        match variable {
            LAST_TS => render_as::<LastSeen>(bytes),
            ERRORS => render_as::<ErrorSeen>(bytes),
            _ => render_as::<u64>(bytes),
        }
    }
}

export_keyed_plugin!(Evolve);
