//! Version 1 of a per-key event counter (state schema 1: the count). It emits
//! `{"v":1,"key":…,"count":…}` per call, and reads schema-2 state (version 2's) by
//! keeping only the count, so the hot-load tests can swap back and forth.

use groupstate_sdk::{Error, Event, GroupState, Params, PluginInfo, StateFunction, codec, export_plugin};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The counter.
pub struct CounterV1;

/// Version 2's state, read when swapping back.
#[derive(Serialize, Deserialize)]
struct Tally {
    total: u64,
    calls: u64,
}

impl StateFunction for CounterV1 {
    type Key = String;
    type Event = serde::de::IgnoredAny;
    type State = u64;
    type Output = Value;

    fn info() -> PluginInfo {
        PluginInfo { name: "counter", version: "1.0.0", state_schema_version: 1 }
    }

    fn init(_: &Params) -> Result<Self, Error> {
        Ok(CounterV1)
    }

    fn process(
        &mut self,
        key: &String,
        events: Vec<Event<Self::Event>>,
        state: &mut GroupState<'_, u64>,
    ) -> Result<Vec<Value>, Error> {
        let count = state.get()?.unwrap_or(0) + events.len() as u64;
        state.update(&count)?;
        Ok(vec![json!({ "v": 1, "key": key, "count": count })])
    }

    fn migrate_state(from_version: u32, bytes: &[u8]) -> Result<u64, Error> {
        match from_version {
            1 => Ok(codec::decode(bytes)?),
            2 => Ok(codec::decode::<Tally>(bytes)?.total),
            other => Err(Error::msg(format!("no migration from state schema {other} to 1"))),
        }
    }
}

export_plugin!(CounterV1);
