//! Version 2 of the per-key event counter: a new output format
//! `{"version":2,"key":…,"total":…,"calls":…}` and a new state schema (2: total and
//! calls), migrated from schema 1 (a bare count; calls start at 0).
//!
//! With the parameter `migrate_spin=N`, each migration first spins N times: a slow
//! migration, for the hot-load tests that measure the pause of a swap.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use groupstate_sdk::{Error, Event, GroupState, Params, PluginInfo, StateFunction, codec, export_plugin};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The counter.
pub struct CounterV2;

/// `migrate_spin`, set by `init` (`migrate_state` is not given the instance).
static MIGRATE_SPIN: AtomicU64 = AtomicU64::new(0);

/// The state of schema 2.
#[derive(Default, Serialize, Deserialize)]
pub struct Tally {
    total: u64,
    calls: u64,
}

impl StateFunction for CounterV2 {
    type Key = String;
    type Event = serde::de::IgnoredAny;
    type State = Tally;
    type Output = Value;

    fn info() -> PluginInfo {
        PluginInfo { name: "counter", version: "2.0.0", state_schema_version: 2 }
    }

    fn init(params: &Params) -> Result<Self, Error> {
        MIGRATE_SPIN.store(params.get_or("migrate_spin", 0u64)?, Ordering::Relaxed);
        Ok(CounterV2)
    }

    fn process(
        &mut self,
        key: &String,
        events: Vec<Event<Self::Event>>,
        state: &mut GroupState<'_, Tally>,
    ) -> Result<Vec<Value>, Error> {
        let mut tally = state.get()?.unwrap_or_default();
        tally.total += events.len() as u64;
        tally.calls += 1;
        state.update(&tally)?;
        Ok(vec![json!({ "version": 2, "key": key, "total": tally.total, "calls": tally.calls })])
    }

    fn migrate_state(from_version: u32, bytes: &[u8]) -> Result<Tally, Error> {
        let mut spun = 0u64;
        for _ in 0..MIGRATE_SPIN.load(Ordering::Relaxed) {
            spun = black_box(spun.wrapping_add(1));
        }
        match from_version {
            1 => Ok(Tally { total: codec::decode(bytes)?, calls: 0 }),
            2 => Ok(codec::decode(bytes)?),
            other => Err(Error::msg(format!("no migration from state schema {other} to 2"))),
        }
    }
}

export_plugin!(CounterV2);
