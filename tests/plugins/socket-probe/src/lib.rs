//! A plugin that opens a TCP connection, for the sandbox tests (`tests/it/sandbox.rs`).
//! `std::net` on wasm32-wasip2 imports `wasi:sockets/*`, which the host must refuse
//! when it loads the component, naming those imports.

use groupstate_sdk::{Error, Event, GroupState, Params, PluginInfo, StateFunction};
use serde_json::{Value, json};

/// The plugin.
pub struct SocketProbe;

impl StateFunction for SocketProbe {
    type Key = String;
    type Event = Value;
    type State = u64;
    type Output = Value;

    fn info() -> PluginInfo {
        PluginInfo { name: "socket-probe", version: env!("CARGO_PKG_VERSION"), state_schema_version: 1 }
    }

    fn init(_params: &Params) -> Result<Self, Error> {
        Ok(SocketProbe)
    }

    fn process(
        &mut self,
        _key: &String,
        _events: Vec<Event<Value>>,
        _state: &mut GroupState<'_, u64>,
    ) -> Result<Vec<Value>, Error> {
        let connected = std::net::TcpStream::connect(("127.0.0.1", 9)).map(drop).map_err(|e| e.to_string());
        Ok(vec![json!({ "connected": connected.is_ok(), "error": connected.err() })])
    }
}

groupstate_sdk::export_plugin!(SocketProbe);
