//! A scriptable test plugin. Each event is `{"k": <key>, "ops": [<op>, ...]}`; the ops
//! run in order against the key's `GroupState`. A timed-out call runs the ops of the
//! `on_timeout` parameter (comma-separated, default `remove`). Every call emits one
//! record of what it saw, so scenario tests can check each rule of the handle:
//!
//! `{"key", "timed_out", "events", "state", "wm", "pt", "errors"}`
//!
//! Ops: `update:<text>`, `remove`, `duration:<ms>`, `timestamp:<ms>`, `fail` (return an
//! error), `panic`.

use groupstate_sdk::{Error, Event, GroupState, Params, PluginInfo, StateError, StateFunction, export_plugin};
use serde::Deserialize;
use serde_json::{Value, json};

/// The probe, with its timeout script.
pub struct Probe {
    on_timeout: Vec<String>,
}

/// One scripted event.
#[derive(Deserialize)]
pub struct Script {
    #[serde(default)]
    ops: Vec<String>,
}

fn error_code(e: &StateError) -> String {
    match e {
        StateError::TimeoutKindMismatch { .. } => "timeout-kind-mismatch".into(),
        StateError::NonPositiveTimeout { .. } => "non-positive-timeout".into(),
        StateError::TimestampBeforeWatermark { .. } => "timestamp-before-watermark".into(),
        StateError::StateTooLarge { .. } => "state-too-large".into(),
        other => format!("other: {other}"),
    }
}

fn run_op(op: &str, state: &mut GroupState<'_, String>, errors: &mut Vec<String>) -> Result<(), Error> {
    let (name, arg) = op.split_once(':').unwrap_or((op, ""));
    let number = || arg.parse::<i64>().map_err(|e| Error::msg(format!("op {op:?}: {e}")));
    let result = match name {
        "update" => state.update(&arg.to_owned()),
        "remove" => {
            state.remove();
            Ok(())
        }
        "duration" => state.set_timeout_duration(number()?),
        "timestamp" => state.set_timeout_timestamp(number()?),
        "fail" => return Err(Error::msg("scripted failure")),
        "panic" => panic!("scripted panic"),
        _ => return Err(Error::msg(format!("unknown op {op:?}"))),
    };
    if let Err(e) = result {
        errors.push(format!("{op}: {}", error_code(&e)));
    }
    Ok(())
}

impl StateFunction for Probe {
    type Key = String;
    type Event = Script;
    type State = String;
    type Output = Value;

    fn info() -> PluginInfo {
        PluginInfo { name: "probe", version: "0.1.0", state_schema_version: 1 }
    }

    fn init(params: &Params) -> Result<Self, Error> {
        params.reject_unknown(&["on_timeout"])?;
        let script = params.get_str("on_timeout").unwrap_or("remove");
        let on_timeout = script.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect();
        Ok(Probe { on_timeout })
    }

    fn process(
        &mut self,
        key: &String,
        events: Vec<Event<Script>>,
        state: &mut GroupState<'_, String>,
    ) -> Result<Vec<Value>, Error> {
        let before = state.get()?;
        let mut errors = Vec::new();
        let ops: Vec<String> = if state.has_timed_out() {
            self.on_timeout.clone()
        } else {
            events.iter().flat_map(|e| e.value.ops.iter().cloned()).collect()
        };
        for op in &ops {
            run_op(op, state, &mut errors)?;
        }
        Ok(vec![json!({
            "key": key,
            "timed_out": state.has_timed_out(),
            "events": events.len(),
            "state": before,
            "wm": state.current_watermark_ms(),
            "pt": state.current_processing_time_ms(),
            "errors": errors,
        })])
    }
}

export_plugin!(Probe);
