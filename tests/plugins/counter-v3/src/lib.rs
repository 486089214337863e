//! A broken version 3 of the counter: a new state schema (3) without any migration
//! path, so the host must refuse to swap to it while older state exists.

use groupstate_sdk::{Error, Event, GroupState, Params, PluginInfo, StateFunction, export_plugin};
use serde_json::{Value, json};

/// The counter.
pub struct CounterV3;

impl StateFunction for CounterV3 {
    type Key = String;
    type Event = serde::de::IgnoredAny;
    type State = String;
    type Output = Value;

    fn info() -> PluginInfo {
        PluginInfo { name: "counter", version: "3.0.0", state_schema_version: 3 }
    }

    fn init(_: &Params) -> Result<Self, Error> {
        Ok(CounterV3)
    }

    fn process(
        &mut self,
        key: &String,
        _: Vec<Event<Self::Event>>,
        _: &mut GroupState<'_, String>,
    ) -> Result<Vec<Value>, Error> {
        Ok(vec![json!({ "version": 3, "key": key })])
    }
}

export_plugin!(CounterV3);
