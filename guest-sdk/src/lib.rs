//! Write groupstate plugins in Rust: a typed per-key state function, exported as a WebAssembly component with one macro.
//!
//! groupstate runs per-key state machines over a stream of events, like Spark's
//! `mapGroupsWithState`. A plugin implements [`StateFunction`]: the host groups each
//! micro-batch by key and calls [`StateFunction::process`] once per key with data (and
//! once per key whose timeout expired), with the key's events and a [`GroupState`]
//! through which it reads and changes the key's state and timeout. The SDK decodes keys
//! ([`FromKey`]), event payloads (JSON, through serde), state values (bincode, see
//! [`codec`]) and encodes outputs (JSON); [`export_plugin!`] turns the type into the
//! exports of the WIT world `state-function-batched` (package `groupstate:plugin@0.1.0`):
//! those of `state-function` and `process-batch`, through which the host makes many
//! calls at once, each on a [`GroupState`] the plugin stages itself by the host's rules.
//!
//! Build with `cargo build --release --target wasm32-wasip2` in a `cdylib` crate. The
//! same code also compiles natively, so [`testing`] can run the plugin in unit tests.
//!
//! # Example
//!
//! Alert when a sensor reports three errors in a row:
//!
//! ```no_run
//! use groupstate_sdk::{Error, Event, GroupState, Params, PluginInfo, StateFunction, log};
//! use serde::{Deserialize, Serialize};
//!
//! struct Alerts {
//!     timeout_ms: i64,
//! }
//!
//! #[derive(Deserialize)]
//! struct Reading {
//!     status: String,
//! }
//!
//! #[derive(Serialize, Deserialize, Default)]
//! struct Errors {
//!     in_a_row: u32,
//! }
//!
//! #[derive(Serialize)]
//! struct Alert {
//!     sensor_id: String,
//! }
//!
//! impl StateFunction for Alerts {
//!     type Key = String;
//!     type Event = Reading;
//!     type State = Errors;
//!     type Output = Alert;
//!
//!     fn info() -> PluginInfo {
//!         PluginInfo { name: "alerts", version: env!("CARGO_PKG_VERSION"), state_schema_version: 1 }
//!     }
//!
//!     fn init(params: &Params) -> Result<Self, Error> {
//!         params.reject_unknown(&["timeout_ms"])?;
//!         Ok(Alerts { timeout_ms: params.get_or("timeout_ms", 600_000)? })
//!     }
//!
//!     fn process(
//!         &mut self,
//!         key: &String,
//!         events: Vec<Event<Reading>>,
//!         state: &mut GroupState<'_, Errors>,
//!     ) -> Result<Vec<Alert>, Error> {
//!         if state.has_timed_out() {
//!             state.remove();
//!             return Ok(vec![]);
//!         }
//!         let mut errors = state.get()?.unwrap_or_default();
//!         let mut alerts = vec![];
//!         for event in events {
//!             errors.in_a_row = if event.value.status == "err" { errors.in_a_row + 1 } else { 0 };
//!             if errors.in_a_row == 3 {
//!                 log::info!("sensor {key} failed three times");
//!                 alerts.push(Alert { sensor_id: key.clone() });
//!             }
//!         }
//!         state.update(&errors)?;
//!         state.set_timeout_duration(self.timeout_ms)?;
//!         Ok(alerts)
//!     }
//! }
//!
//! groupstate_sdk::export_plugin!(Alerts);
//! # fn main() {}
//! ```
//!
//! # What the component imports
//!
//! `groupstate:plugin/types` and `groupstate:plugin/state`, `groupstate:plugin/log` only
//! when the plugin logs, and, as every Rust `wasm32-wasip2` program, WASI 0.2 interfaces
//! that the Rust standard library links even when unused (`wasi:io/{error,poll,streams}`
//! and `wasi:cli/{environment,exit,stdin,stdout,stderr,terminal-*}`); the host provides
//! them virtualized. Panics abort: a panic is a trap, which the host handles like an
//! error return (the key's state stays as before the call) and then recreates the
//! instance.

#![deny(missing_docs)]

#[doc(hidden)]
pub mod batch;
pub mod codec;
mod error;
#[doc(hidden)]
pub mod export;
mod key;
pub mod log;
mod params;
mod state;
pub mod testing;
pub mod v2;

pub use error::Error;
pub use key::{FromKey, KeyError};
pub use params::{ParamError, Params};
pub use state::{GroupState, StateError, TimeoutKind};

/// The bindings wit-bindgen generates for the world `state-function-batched` (the world
/// `state-function` and its `process-batch` fast path). Not part of the
/// SDK's API: use the typed wrappers and [`export_plugin!`].
#[doc(hidden)]
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod wit {
    wit_bindgen::generate!({
        // Relative to this crate's Cargo.toml: the crate carries its own copy of the
        // contract (kept identical to the repository's `wit/` by a test), so it builds
        // from anywhere, as a path or a registry dependency.
        path: "wit",
        world: "state-function-batched",
        // `export_plugin!` expands the generated `export!` in the plugin's crate.
        pub_export_macro: true,
        default_bindings_module: "groupstate_sdk::wit",
    });
}

/// What a plugin says about itself; the host logs it and records it with the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginInfo {
    /// A short name, such as `sensor-alerts`.
    pub name: &'static str,
    /// The plugin's own version, such as `1.2.0`; `env!("CARGO_PKG_VERSION")` is a
    /// good choice.
    pub version: &'static str,
    /// The version of the layout of the state values this plugin writes. Raise it
    /// whenever that layout changes; the host then migrates older values through
    /// [`StateFunction::migrate_state`] before this plugin sees them.
    pub state_schema_version: u32,
}

/// One event of a key's group, decoded from its JSON payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Event<E> {
    /// The event time in epoch milliseconds, read by the host from the pipeline's time
    /// field; `None` when the pipeline has no time field.
    pub time_ms: Option<i64>,
    /// The event, decoded from the text of one JSON object (one input line).
    pub value: E,
}

impl<E> Event<E> {
    /// An event without event time.
    pub fn new(value: E) -> Self {
        Event { time_ms: None, value }
    }

    /// An event with event time `time_ms` (epoch milliseconds).
    pub fn at(time_ms: i64, value: E) -> Self {
        Event { time_ms: Some(time_ms), value }
    }
}

/// A per-key state function: the plugin's logic. Export it with [`export_plugin!`].
///
/// The host creates an instance with [`init`](Self::init) after every instantiation
/// (also after a trap), then calls [`process`](Self::process) many times on it. Keep
/// per-key data in the [`GroupState`], never in the instance: instances are recreated
/// at any time and calls for one key may go to different instances.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a groupstate state function",
    label = "`{Self}` does not implement `groupstate_sdk::StateFunction`",
    note = "implement `groupstate_sdk::StateFunction` for `{Self}` to export it with `export_plugin!`"
)]
pub trait StateFunction: Sized + 'static {
    /// The key type, built from the host's key string by [`FromKey`] (`String` and the
    /// integer types are provided). A key that does not convert fails the call.
    type Key: FromKey;
    /// The event type, decoded with serde from each event's JSON payload. A payload that
    /// does not decode fails the call; use `serde_json::Value` to accept anything.
    type Event: serde::de::DeserializeOwned;
    /// The state type, stored with [`codec`] (bincode); see there for what it may contain.
    type State: serde::Serialize + serde::de::DeserializeOwned;
    /// The output type, each value written as one line of JSON.
    type Output: serde::Serialize;

    /// Describes the plugin. Called once after each instantiation, before `init`; the
    /// answer must not change between calls.
    fn info() -> PluginInfo;

    /// Configures a fresh instance with the pipeline's parameters (`--param name=value`
    /// on the host). Called after every instantiation, including the fresh instance the
    /// host makes after a trap. An error refuses the plugin; say which parameter is
    /// wrong and what it should be ([`ParamError`] does).
    fn init(params: &Params) -> Result<Self, Error>;

    /// The state function. Called once per key with data in the batch, with that key's
    /// events in arrival order; and once per key whose timeout expired in this batch,
    /// with no events and [`GroupState::has_timed_out`] true.
    ///
    /// Returns the outputs for this key (zero outputs is fine; mapGroupsWithState is the
    /// one-output case). An error means the plugin could not process this key: the host
    /// keeps the key's state and timeout as before the call and applies the pipeline's
    /// error policy.
    fn process(
        &mut self,
        key: &Self::Key,
        events: Vec<Event<Self::Event>>,
        state: &mut GroupState<'_, Self::State>,
    ) -> Result<Vec<Self::Output>, Error>;

    /// Converts a state value written under `from_version` of the state schema into
    /// this plugin's current layout (decode the old layout with [`codec::decode`]). An
    /// error says the value cannot be converted; the host then refuses to switch to this
    /// plugin version. Not called for values already at the current version.
    ///
    /// The default converts nothing.
    fn migrate_state(from_version: u32, bytes: &[u8]) -> Result<Self::State, Error> {
        let _ = bytes;
        Err(Error::msg(format_args!(
            "no migration from state schema version {from_version} to {}: implement \
             StateFunction::migrate_state, or start the pipeline with empty state",
            Self::info().state_schema_version
        )))
    }
}

/// Exports a [`StateFunction`] as the plugin's `info`, `init`, `process` and
/// `migrate-state`. Use it once per plugin crate, at the top level, as
/// `groupstate_sdk::export_plugin!(MyFunction);` (see the [crate example](crate#example)).
/// A type that does not implement [`StateFunction`] is a compile error at the macro's
/// argument.
///
/// The instance made by `init` is kept in a thread-local slot of the component and
/// replaced by the next `init`.
#[macro_export]
macro_rules! export_plugin {
    ($ty:ty) => {
        const _: () = {
            ::std::thread_local! {
                static __GROUPSTATE_INSTANCE: ::core::cell::RefCell<::core::option::Option<$ty>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }

            struct __GroupstatePlugin;

            impl $crate::wit::Guest for __GroupstatePlugin {
                fn info() -> $crate::wit::PluginInfo {
                    $crate::export::info::<$ty>()
                }

                fn init(
                    params: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    let instance = $crate::export::init::<$ty>(params)?;
                    __GROUPSTATE_INSTANCE.with_borrow_mut(|slot| *slot = ::core::option::Option::Some(instance));
                    ::core::result::Result::Ok(())
                }

                fn process(
                    key: ::std::string::String,
                    events: ::std::vec::Vec<$crate::wit::Event>,
                    state: &$crate::wit::GroupState,
                ) -> ::core::result::Result<::std::vec::Vec<::std::string::String>, ::std::string::String> {
                    __GROUPSTATE_INSTANCE
                        .with_borrow_mut(|slot| $crate::export::process::<$ty>(slot.as_mut(), key, events, state))
                }

                fn process_batch(calls: ::std::vec::Vec<u8>) -> ::std::vec::Vec<u8> {
                    __GROUPSTATE_INSTANCE
                        .with_borrow_mut(|slot| $crate::batch::process_batch::<$ty>(slot.as_mut(), &calls))
                }

                fn migrate_state(
                    from_version: u32,
                    value: ::std::vec::Vec<u8>,
                ) -> ::core::result::Result<::std::vec::Vec<u8>, ::std::string::String> {
                    $crate::export::migrate_state::<$ty>(from_version, value)
                }
            }

    $crate::wit::export!(__GroupstatePlugin with_types_in $crate::wit);
        };
    };
}
