//! A scriptable 0.2 test plugin. Each event is `{"k": KEY, "ops": [OP, ...]}`; the ops
//! run in order on value `v`, list `log` and map `m` (strings), and timers:
//! `set:X`, `clear`, `append:X`, `appendn:N` (N appends), `clearlist`, `put:K=V`,
//! `del:K`, `timer:T`, `timer:T:NAME`, `untimer:T`, `badvar`, `fail` (return an error
//! after the ops), `trap` (panic). A refused op is reported, not fatal. Every call
//! (data or timer) outputs the state it leaves behind.

use groupstate_sdk::v2::{KeyState, KeyedFunction, Timer, Variable};
use groupstate_sdk::{Error, Event, Params, PluginInfo, export_keyed_plugin};
use serde::Deserialize;
use serde_json::{Value, json};

/// The plugin.
pub struct KeyedProbe;

/// One scripted event.
#[derive(Deserialize)]
pub struct Script {
    /// The ops.
    #[serde(default)]
    pub ops: Vec<String>,
}

fn run(op: &str, state: &KeyState<'_>) -> Result<(), Error> {
    let (name, arg) = op.split_once(':').unwrap_or((op, ""));
    let value = state.value::<String>("v");
    let list = state.list::<String>("log");
    let map = state.map::<String, String>("m");
    match name {
        "set" => value.set(&arg.to_owned()),
        "clear" => value.clear(),
        "append" => list.append(&arg.to_owned()),
        "appendn" => {
            for i in 0..arg.parse::<u32>().map_err(Error::from)? {
                list.append(&i.to_string())?;
            }
            Ok(())
        }
        "clearlist" => list.clear(),
        "put" => {
            let (k, v) = arg.split_once('=').unwrap_or((arg, ""));
            map.put(&k.to_owned(), &v.to_owned())
        }
        "del" => map.remove(&arg.to_owned()),
        "timer" => {
            let (t, n) = arg.split_once(':').map_or((arg, None), |(t, n)| (t, Some(n)));
            state.register_timer(t.parse().map_err(Error::from)?, n)
        }
        "untimer" => state.delete_timer(arg.parse().map_err(Error::from)?, None),
        "badvar" => state.value::<String>("nope").set(&String::new()),
        "trap" => panic!("trap requested"),
        other => Err(Error::msg(format_args!("unknown op {other}"))),
    }
}

fn report(key: &str, timer: Option<&Timer>, errors: Vec<String>, state: &KeyState<'_>) -> Result<Value, Error> {
    let list = state.list::<String>("log");
    let items = list.get()?;
    let shown: Vec<&String> =
        if items.len() > 5 { items[items.len() - 5..].iter().collect() } else { items.iter().collect() };
    Ok(json!({
        "key": key,
        "timer": timer.map(|t| json!([t.expiry_ms, t.name])),
        "value": state.value::<String>("v").get()?,
        "list_len": list.len()?,
        "list_tail": shown,
        "map": state.map::<String, String>("m").entries()?,
        "timers": state.timers()?.into_iter().map(|t| json!([t.expiry_ms, t.name])).collect::<Vec<_>>(),
        "errors": errors,
    }))
}

impl KeyedFunction for KeyedProbe {
    type Key = String;
    type Event = Script;
    type Output = Value;

    fn info() -> PluginInfo {
        PluginInfo { name: "keyed-probe", version: "0.1.0", state_schema_version: 1 }
    }

    fn variables() -> Vec<Variable> {
        vec![Variable::value("v"), Variable::list("log"), Variable::map("m")]
    }

    fn init(_: &Params) -> Result<Self, Error> {
        Ok(KeyedProbe)
    }

    fn process(&mut self, key: &String, events: Vec<Event<Script>>, state: &KeyState<'_>) -> Result<Vec<Value>, Error> {
        let mut errors = Vec::new();
        let mut fail = false;
        for event in events {
            for op in &event.value.ops {
                if op == "fail" {
                    fail = true;
                } else if let Err(e) = run(op, state) {
                    errors.push(format!("{op}: {e}"));
                }
            }
        }
        if fail {
            return Err(Error::msg("fail requested"));
        }
        Ok(vec![report(key, None, errors, state)?])
    }

    fn handle_expired_timer(&mut self, key: &String, timer: Timer, state: &KeyState<'_>) -> Result<Vec<Value>, Error> {
        Ok(vec![report(key, Some(&timer), Vec::new(), state)?])
    }
}

export_keyed_plugin!(KeyedProbe);
