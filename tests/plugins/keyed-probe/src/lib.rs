//! A scriptable 0.2 test plugin. Each event is `{"k": KEY, "ops": [OP, ...]}`; the ops
//! run in order on value `v`, list `log` and map `m` (strings), and timers:
//! `set:X`, `clear`, `append:X`, `appendn:N` (N appends), `clearlist`, `put:K=V`,
//! `del:K`, `putn:N:START` (N puts, keys START.. as 10 digits), `timer:T`,
//! `timer:T:NAME`, `untimer:T`, `badvar`, `fail` (return an error after the ops), `trap`
//! (panic), `quiet` (no output: the benchmark's calls read nothing back). A refused op is
//! reported, not fatal. Every call (data or timer) outputs the state it leaves behind.
//!
//! Variables with a 1000 ms TTL: value `tv` (processing time; `tset:X`, `tclear`), list
//! `tl` (event time; `tappend:X`, `tclearlist`), map `tm` (event time; `tput:K=V`,
//! `tdel:K`), list `pl` and map `pm` (processing time; `pappend:X`, `pput:K=V`).
//!
//! Initial state: a JSON object whose fields `v`, `log` (array), `m` (object), `tv`,
//! `tl`, `tm`, `timers` (array of expiries) are written; the string `"fail"` is
//! refused. `render-state` renders every variable's strings as JSON except `tl`'s
//! (`none`: the host shows hex).

use groupstate_sdk::v2::{KeyState, KeyedFunction, StatePart, Timer, Ttl, Variable, render_as, render_key_as};
use groupstate_sdk::{Error, Event, Params, PluginInfo, export_keyed_plugin};
use serde::Deserialize;
use serde_json::{Value, json};

/// The plugin.
pub struct KeyedProbe;

/// The TTL of the `t*` and `p*` variables.
const TTL_MS: i64 = 1000;

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
        "putn" => {
            let (n, start) = arg.split_once(':').unwrap_or((arg, "0"));
            let start: u64 = start.parse().map_err(Error::from)?;
            for i in 0..n.parse::<u64>().map_err(Error::from)? {
                map.put(&format!("{:010}", start + i), &i.to_string())?;
            }
            Ok(())
        }
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
        "tset" => state.value::<String>("tv").set(&arg.to_owned()),
        "tclear" => state.value::<String>("tv").clear(),
        "tappend" => state.list::<String>("tl").append(&arg.to_owned()),
        "tclearlist" => state.list::<String>("tl").clear(),
        "tput" => {
            let (k, v) = arg.split_once('=').unwrap_or((arg, ""));
            state.map::<String, String>("tm").put(&k.to_owned(), &v.to_owned())
        }
        "tdel" => state.map::<String, String>("tm").remove(&arg.to_owned()),
        "pappend" => state.list::<String>("pl").append(&arg.to_owned()),
        "pput" => {
            let (k, v) = arg.split_once('=').unwrap_or((arg, ""));
            state.map::<String, String>("pm").put(&k.to_owned(), &v.to_owned())
        }
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
        "tv": state.value::<String>("tv").get()?,
        "tl": state.list::<String>("tl").get()?,
        "tl_len": state.list::<String>("tl").len()?,
        "tm": state.map::<String, String>("tm").entries()?,
        "pl": state.list::<String>("pl").get()?,
        "pm": state.map::<String, String>("pm").entries()?,
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
        vec![
            Variable::value("v"),
            Variable::list("log"),
            Variable::map("m"),
            Variable::value("tv").with_ttl(Ttl::processing_time(TTL_MS)),
            Variable::list("tl").with_ttl(Ttl::event_time(TTL_MS)),
            Variable::map("tm").with_ttl(Ttl::event_time(TTL_MS)),
            Variable::list("pl").with_ttl(Ttl::processing_time(TTL_MS)),
            Variable::map("pm").with_ttl(Ttl::processing_time(TTL_MS)),
        ]
    }

    fn init(_: &Params) -> Result<Self, Error> {
        Ok(KeyedProbe)
    }

    fn process(&mut self, key: &String, events: Vec<Event<Script>>, state: &KeyState<'_>) -> Result<Vec<Value>, Error> {
        let mut errors = Vec::new();
        let mut fail = false;
        let mut quiet = false;
        for event in events {
            for op in &event.value.ops {
                if op == "fail" {
                    fail = true;
                } else if op == "quiet" {
                    quiet = true;
                } else if let Err(e) = run(op, state) {
                    errors.push(format!("{op}: {e}"));
                }
            }
        }
        if fail {
            return Err(Error::msg("fail requested"));
        }
        if quiet {
            return match errors.first() {
                Some(e) => Err(Error::msg(e)),
                None => Ok(Vec::new()),
            };
        }
        Ok(vec![report(key, None, errors, state)?])
    }

    fn handle_expired_timer(&mut self, key: &String, timer: Timer, state: &KeyState<'_>) -> Result<Vec<Value>, Error> {
        Ok(vec![report(key, Some(&timer), Vec::new(), state)?])
    }

    fn handle_initial_state(&mut self, key: &String, initial: Value, state: &KeyState<'_>) -> Result<(), Error> {
        if initial == "fail" {
            return Err(Error::msg(format_args!("initial state of {key} refused: it says \"fail\"")));
        }
        let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        if let Some(v) = initial.get("v") {
            state.value::<String>("v").set(&text(v))?;
        }
        if let Some(v) = initial.get("tv") {
            state.value::<String>("tv").set(&text(v))?;
        }
        for (name, field) in [("log", "log"), ("tl", "tl")] {
            for item in initial.get(field).and_then(Value::as_array).into_iter().flatten() {
                state.list::<String>(name).append(&text(item))?;
            }
        }
        for name in ["m", "tm"] {
            for (k, v) in initial.get(name).and_then(Value::as_object).into_iter().flatten() {
                state.map::<String, String>(name).put(k, &text(v))?;
            }
        }
        for t in initial.get("timers").and_then(Value::as_array).into_iter().flatten() {
            state.register_timer(t.as_i64().ok_or_else(|| Error::msg("a timer is an integer"))?, None)?;
        }
        Ok(())
    }

    fn render_state(&self, variable: &str, part: StatePart, bytes: &[u8]) -> Option<String> {
        match (variable, part) {
            ("tl", _) => None,
            (_, StatePart::MapKey) => render_key_as::<String>(bytes),
            _ => render_as::<String>(bytes),
        }
    }
}

export_keyed_plugin!(KeyedProbe);
