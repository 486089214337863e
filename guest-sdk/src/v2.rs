//! The 0.2 state API (`groupstate:plugin@0.2.0`): named state variables per key — typed
//! [`ValueState`], [`ListState`] and [`MapState`] — and many timers per key, after
//! Spark's `transformWithState`. Implement [`KeyedFunction`] and export it with
//! [`export_keyed_plugin!`](crate::export_keyed_plugin).
//!
//! The host calls [`KeyedFunction::process`] once per key with data in a batch, then,
//! after every data call of the batch, [`KeyedFunction::handle_expired_timer`] once
//! per timer whose expiry the batch's watermark (event-time pipelines) or processing
//! time (processing-time pipelines) has reached (`expiry <= threshold`). A timer
//! registered in a batch fires in a later batch at the earliest; a timer deleted in a
//! data call does not fire. Everything a call changes is applied only when it returns
//! `Ok`.
//!
//! Each list element and map entry is stored on its own: [`ListState::append`] and
//! [`MapState::put`] cost the same on a long list or a large map as on an empty one.
//! Values are encoded with [`codec`](crate::codec) (bincode), map keys with
//! [`MapKey`], whose encoding keeps their order.

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, Event, FromKey, KeyError, Params, PluginInfo, codec};

/// The bindings wit-bindgen generates for the 0.2 world. Not part of the SDK's API.
#[doc(hidden)]
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod wit {
    wit_bindgen::generate!({
        path: "wit/v0.2",
        world: "keyed-state-function",
        pub_export_macro: true,
        export_macro_name: "export_v2",
        default_bindings_module: "groupstate_sdk::v2::wit",
    });
}

use wit::groupstate::plugin::state::KeyState as Handle;
use wit::groupstate::plugin::types as t;

/// The raw result of a state request: the WIT's error on refusal.
type Raw<T> = Result<T, t::StateError>;

/// Where a [`KeyState`] reads and writes: the host's handle, or the in-memory state of
/// a [`testing::KeyedDriver`](crate::testing::KeyedDriver) call in native tests.
#[derive(Clone, Copy)]
enum Backend<'a> {
    Host(&'a Handle),
    Test(&'a crate::testing::keyed::TestCall),
}

impl Backend<'_> {
    fn value_get(&self, name: &str) -> Raw<Option<Vec<u8>>> {
        match self {
            Backend::Host(h) => h.value_get(name),
            Backend::Test(c) => c.value_get(name),
        }
    }
    fn value_set(&self, name: &str, value: &[u8]) -> Raw<()> {
        match self {
            Backend::Host(h) => h.value_set(name, value),
            Backend::Test(c) => c.value_set(name, value),
        }
    }
    fn value_clear(&self, name: &str) -> Raw<()> {
        match self {
            Backend::Host(h) => h.value_clear(name),
            Backend::Test(c) => c.value_clear(name),
        }
    }
    fn list_append(&self, name: &str, value: &[u8]) -> Raw<()> {
        match self {
            Backend::Host(h) => h.list_append(name, value),
            Backend::Test(c) => c.list_append(name, value),
        }
    }
    fn list_get(&self, name: &str) -> Raw<Vec<Vec<u8>>> {
        match self {
            Backend::Host(h) => h.list_get(name),
            Backend::Test(c) => c.list_get(name),
        }
    }
    fn list_len(&self, name: &str) -> Raw<u64> {
        match self {
            Backend::Host(h) => h.list_len(name),
            Backend::Test(c) => c.list_len(name),
        }
    }
    fn list_clear(&self, name: &str) -> Raw<()> {
        match self {
            Backend::Host(h) => h.list_clear(name),
            Backend::Test(c) => c.list_clear(name),
        }
    }
    fn map_get(&self, name: &str, key: &[u8]) -> Raw<Option<Vec<u8>>> {
        match self {
            Backend::Host(h) => h.map_get(name, key),
            Backend::Test(c) => c.map_get(name, key),
        }
    }
    fn map_contains(&self, name: &str, key: &[u8]) -> Raw<bool> {
        match self {
            Backend::Host(h) => h.map_contains(name, key),
            Backend::Test(c) => c.map_get(name, key).map(|v| v.is_some()),
        }
    }
    fn map_put(&self, name: &str, key: &[u8], value: &[u8]) -> Raw<()> {
        match self {
            Backend::Host(h) => h.map_put(name, key, value),
            Backend::Test(c) => c.map_put(name, key, value),
        }
    }
    fn map_remove(&self, name: &str, key: &[u8]) -> Raw<()> {
        match self {
            Backend::Host(h) => h.map_remove(name, key),
            Backend::Test(c) => c.map_remove(name, key),
        }
    }
    fn map_keys(&self, name: &str) -> Raw<Vec<Vec<u8>>> {
        match self {
            Backend::Host(h) => h.map_keys(name),
            Backend::Test(c) => c.map_entries(name).map(|e| e.into_iter().map(|(k, _)| k).collect()),
        }
    }
    fn map_entries(&self, name: &str) -> Raw<Vec<(Vec<u8>, Vec<u8>)>> {
        match self {
            Backend::Host(h) => h.map_entries(name),
            Backend::Test(c) => c.map_entries(name),
        }
    }
    fn register_timer(&self, expiry_ms: i64, name: Option<&str>) -> Raw<()> {
        match self {
            Backend::Host(h) => h.register_timer(expiry_ms, name),
            Backend::Test(c) => c.register_timer(expiry_ms, name),
        }
    }
    fn delete_timer(&self, expiry_ms: i64, name: Option<&str>) -> Raw<()> {
        match self {
            Backend::Host(h) => h.delete_timer(expiry_ms, name),
            Backend::Test(c) => c.delete_timer(expiry_ms, name),
        }
    }
    fn list_timers(&self) -> Raw<Vec<Timer>> {
        match self {
            Backend::Host(h) => {
                Ok(h.list_timers()?.into_iter().map(|t| Timer { expiry_ms: t.expiry_ms, name: t.name }).collect())
            }
            Backend::Test(c) => c.list_timers(),
        }
    }
    fn time_mode(&self) -> TimeMode {
        match self {
            Backend::Host(h) => match h.time_mode() {
                t::TimeMode::None => TimeMode::None,
                t::TimeMode::ProcessingTime => TimeMode::ProcessingTime,
                t::TimeMode::EventTime => TimeMode::EventTime,
            },
            Backend::Test(c) => c.time_mode(),
        }
    }
    fn current_watermark_ms(&self) -> i64 {
        match self {
            Backend::Host(h) => h.current_watermark_ms(),
            Backend::Test(c) => c.watermark_ms(),
        }
    }
    fn current_processing_time_ms(&self) -> i64 {
        match self {
            Backend::Host(h) => h.current_processing_time_ms(),
            Backend::Test(c) => c.processing_time_ms(),
        }
    }
}

/// The time a pipeline's timers are in, fixed per pipeline (the host's `--timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeMode {
    /// No timers: registering one fails.
    None,
    /// Timers fire in the first batch whose processing time is at or after their expiry.
    ProcessingTime,
    /// Timers fire in the first batch whose watermark is at or after their expiry.
    EventTime,
}

/// The kind of a state variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VariableKind {
    /// One value: [`KeyState::value`].
    Value,
    /// A list: [`KeyState::list`].
    List,
    /// A map: [`KeyState::map`].
    Map,
}

/// The clock a variable's time-to-live runs on (see [`Ttl`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlClock {
    /// Written at the batch's processing time, expired in the first batch whose
    /// processing time is at or after the expiry.
    ProcessingTime,
    /// Written at the call's event time (the largest event time of a data call's
    /// events, or the watermark if larger; the watermark in a timer call; the load's
    /// processing time in [`KeyedFunction::handle_initial_state`]), expired in the first
    /// batch whose watermark is at or after the expiry. Needs a pipeline with a time
    /// field.
    EventTime,
}

/// A time-to-live: each value, list element or map entry expires `duration_ms` after
/// it was last written (a value at its last [`ValueState::set`], a map entry at its
/// last [`MapState::put`], a list element at its [`ListState::append`]). Reading does
/// not renew an entry. An expired entry is invisible at once, in every call of the
/// batch in which it expires, and the host removes it from the store without calling
/// the plugin. An entry keeps the expiry it was written with. Expiry follows the
/// batch's planned time, never the wall clock, so a replay expires the same entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttl {
    /// How long an entry lives after it was written (greater than zero).
    pub duration_ms: i64,
    /// The clock it runs on.
    pub clock: TtlClock,
}

impl Ttl {
    /// A processing-time TTL.
    pub const fn processing_time(duration_ms: i64) -> Self {
        Self { duration_ms, clock: TtlClock::ProcessingTime }
    }
    /// An event-time TTL (against the watermark).
    pub const fn event_time(duration_ms: i64) -> Self {
        Self { duration_ms, clock: TtlClock::EventTime }
    }
}

/// A state variable, declared by [`KeyedFunction::variables`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variable {
    /// 1 to 64 ASCII letters, digits, `_`, `-` or `.`, unique among the plugin's.
    pub name: &'static str,
    /// Its kind.
    pub kind: VariableKind,
    /// Its time-to-live, if its entries expire.
    pub ttl: Option<Ttl>,
    /// The version of the layout of its bytes (value, list elements or map values;
    /// never map keys), from 1. Raise it when the layout changes, and convert the
    /// older layouts in [`KeyedFunction::migrate_state`].
    pub schema_version: u32,
}

impl Variable {
    /// A value variable.
    pub const fn value(name: &'static str) -> Self {
        Self { name, kind: VariableKind::Value, ttl: None, schema_version: 1 }
    }
    /// A list variable.
    pub const fn list(name: &'static str) -> Self {
        Self { name, kind: VariableKind::List, ttl: None, schema_version: 1 }
    }
    /// A map variable.
    pub const fn map(name: &'static str) -> Self {
        Self { name, kind: VariableKind::Map, ttl: None, schema_version: 1 }
    }
    /// The same variable with a time-to-live:
    /// `Variable::map("sessions").with_ttl(Ttl::event_time(3_600_000))`.
    pub const fn with_ttl(self, ttl: Ttl) -> Self {
        Self { ttl: Some(ttl), ..self }
    }
    /// The same variable with layout version `version` (1 by default):
    /// `Variable::map("sessions").with_schema_version(2)`. Entries stored under
    /// another version go through [`KeyedFunction::migrate_state`] when first read.
    pub const fn with_schema_version(self, version: u32) -> Self {
        Self { schema_version: version, ..self }
    }
}

/// Which part of a variable a byte string is, for [`KeyedFunction::render_state`] and
/// [`KeyedFunction::migrate_state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatePart {
    /// The value of a value variable.
    Value,
    /// An element of a list variable.
    ListElement,
    /// A key of a map variable.
    MapKey,
    /// A value of a map variable.
    MapValue,
}

/// Renders bytes that [`ValueState`], [`ListState`] or a [`MapState`] value stored as
/// a `T` as JSON, for [`KeyedFunction::render_state`]; `None` when they do not decode.
pub fn render_as<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Option<String> {
    let value: T = codec::decode(bytes).ok()?;
    serde_json::to_string(&value).ok()
}

/// Converts bytes that [`ValueState`], [`ListState`] or a [`MapState`] value stored as
/// an `Old` into a `New` through `convert`, for [`KeyedFunction::migrate_state`]
/// (`("totals", 1) => convert(bytes, |count: u64| Totals { count, sum: 0 })`):
///
/// ```
/// use groupstate_sdk::{codec, v2::convert};
///
/// let old = codec::encode(&5u64).unwrap();
/// let new = convert(&old, |count: u64| (count, 0i64)).unwrap();
/// assert_eq!(codec::decode::<(u64, i64)>(&new).unwrap(), (5, 0));
/// assert!(convert(&new, |count: u64| count).is_err(), "layout 2 is not a u64");
/// ```
pub fn convert<Old: DeserializeOwned, New: Serialize>(
    bytes: &[u8],
    convert: impl FnOnce(Old) -> New,
) -> Result<Vec<u8>, Error> {
    let old: Old = codec::decode(bytes)
        .map_err(|e| Error::msg(format!("stored bytes do not decode as a {} ({e})", std::any::type_name::<Old>())))?;
    codec::encode(&convert(old)).map_err(|e| Error::msg(format!("the converted value does not encode ({e})")))
}

/// Renders a map key stored by a [`MapState`] with key type `K` as JSON, for
/// [`KeyedFunction::render_state`]; `None` when the bytes are not a `K`.
pub fn render_key_as<K: MapKey + Serialize>(bytes: &[u8]) -> Option<String> {
    serde_json::to_string(&K::from_bytes(bytes)?).ok()
}

/// A timer of a key: its expiry (epoch milliseconds, event or processing time per the
/// pipeline) and an optional name. A key holds at most one timer per (expiry, name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timer {
    /// When it fires.
    pub expiry_ms: i64,
    /// Its name, at most 256 bytes.
    pub name: Option<String>,
}

/// A request the host refused: what and why, and what to do.
pub(crate) fn refused(what: &str, e: t::StateError) -> Error {
    let why = match e {
        t::StateError::UnknownVariable(name) => {
            format!("no variable {name:?} of this kind is declared: add it to KeyedFunction::variables")
        }
        t::StateError::ValueTooLarge(max) => format!("the value is over state_bytes_max ({max} bytes)"),
        t::StateError::TooManyEntries(max) => {
            format!("over state_writes_per_call_max ({max}) entries in one call: change or read less per call")
        }
        t::StateError::TooManyTimers(max) => format!("the key holds timers_per_key_max ({max}) timers already"),
        t::StateError::TimeModeMismatch(_) => {
            "the pipeline has no timers: run it with --timeout event-time or processing-time".to_owned()
        }
        t::StateError::NonPositiveTime(ms) => format!("a timer's expiry must be greater than zero, not {ms}"),
        t::StateError::TimerNameTooLong(n) => format!("a timer name has at most 256 bytes, not {n}"),
        t::StateError::KeyTooLong(n) => {
            format!("key, variable and map key take {n} bytes of store key: use shorter map keys")
        }
    };
    Error::msg(format_args!("{what}: {why}"))
}

fn encode<T: Serialize + ?Sized>(what: &str, value: &T) -> Result<Vec<u8>, Error> {
    codec::encode(value).map_err(|e| Error::msg(format_args!("{what}: cannot encode ({e})")))
}

fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, Error> {
    codec::decode(bytes).map_err(|e| {
        Error::msg(format_args!("{what}: stored value does not decode ({e}): was it written with another type?"))
    })
}

/// A map key, encoded so that the byte order of the encodings is the order of the
/// keys (so [`MapState::entries`] comes in key order).
pub trait MapKey: Sized {
    /// The key's bytes.
    fn to_bytes(&self) -> Vec<u8>;
    /// The key from its bytes, `None` when they are not one.
    fn from_bytes(bytes: &[u8]) -> Option<Self>;
}

impl MapKey for String {
    fn to_bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

impl MapKey for Vec<u8> {
    fn to_bytes(&self) -> Vec<u8> {
        self.clone()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(bytes.to_vec())
    }
}

impl MapKey for u64 {
    fn to_bytes(&self) -> Vec<u8> {
        self.to_be_bytes().to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(u64::from_be_bytes(bytes.try_into().ok()?))
    }
}

impl MapKey for i64 {
    fn to_bytes(&self) -> Vec<u8> {
        ((*self as u64) ^ (1 << 63)).to_be_bytes().to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some((u64::from_be_bytes(bytes.try_into().ok()?) ^ (1 << 63)) as i64)
    }
}

/// A key's variables and timers during one call.
pub struct KeyState<'a> {
    handle: Backend<'a>,
}

impl<'a> KeyState<'a> {
    pub(crate) fn from_test(call: &'a crate::testing::keyed::TestCall) -> Self {
        KeyState { handle: Backend::Test(call) }
    }

    fn from_host(handle: &'a Handle) -> Self {
        KeyState { handle: Backend::Host(handle) }
    }

    /// Value variable `name`, holding a `T`.
    pub fn value<T: Serialize + DeserializeOwned>(&self, name: &'static str) -> ValueState<'a, T> {
        ValueState { handle: self.handle, name, t: PhantomData }
    }

    /// List variable `name`, of `T`s.
    pub fn list<T: Serialize + DeserializeOwned>(&self, name: &'static str) -> ListState<'a, T> {
        ListState { handle: self.handle, name, t: PhantomData }
    }

    /// Map variable `name`, from `K` to `V`.
    pub fn map<K: MapKey, V: Serialize + DeserializeOwned>(&self, name: &'static str) -> MapState<'a, K, V> {
        MapState { handle: self.handle, name, t: PhantomData }
    }

    /// Registers a timer (see the module doc for when it fires). Registering one the
    /// key has already changes nothing.
    pub fn register_timer(&self, expiry_ms: i64, name: Option<&str>) -> Result<(), Error> {
        self.handle.register_timer(expiry_ms, name).map_err(|e| refused("register-timer", e))
    }

    /// Deletes the timer (expiry, name) if the key has it.
    pub fn delete_timer(&self, expiry_ms: i64, name: Option<&str>) -> Result<(), Error> {
        self.handle.delete_timer(expiry_ms, name).map_err(|e| refused("delete-timer", e))
    }

    /// The key's timers in (expiry, name) order; the one being handled is not among them.
    pub fn timers(&self) -> Result<Vec<Timer>, Error> {
        self.handle.list_timers().map_err(|e| refused("list-timers", e))
    }

    /// The pipeline's time mode (its `--timeout`).
    pub fn time_mode(&self) -> TimeMode {
        self.handle.time_mode()
    }

    /// The batch's watermark (epoch milliseconds), constant within the batch.
    pub fn watermark_ms(&self) -> i64 {
        self.handle.current_watermark_ms()
    }

    /// The batch's processing time (epoch milliseconds), constant within the batch.
    pub fn processing_time_ms(&self) -> i64 {
        self.handle.current_processing_time_ms()
    }
}

/// A value variable.
pub struct ValueState<'a, T> {
    handle: Backend<'a>,
    name: &'static str,
    t: PhantomData<T>,
}

impl<T: Serialize + DeserializeOwned> ValueState<'_, T> {
    /// The value, if the variable has one.
    pub fn get(&self) -> Result<Option<T>, Error> {
        let what = self.name;
        let bytes = self.handle.value_get(what).map_err(|e| refused(what, e))?;
        bytes.map(|b| decode(what, &b)).transpose()
    }
    /// Sets the value.
    pub fn set(&self, value: &T) -> Result<(), Error> {
        let bytes = encode(self.name, value)?;
        self.handle.value_set(self.name, &bytes).map_err(|e| refused(self.name, e))
    }
    /// Clears the value.
    pub fn clear(&self) -> Result<(), Error> {
        self.handle.value_clear(self.name).map_err(|e| refused(self.name, e))
    }
}

/// A list variable: elements in append order, each stored on its own.
pub struct ListState<'a, T> {
    handle: Backend<'a>,
    name: &'static str,
    t: PhantomData<T>,
}

impl<T: Serialize + DeserializeOwned> ListState<'_, T> {
    /// Appends an element without reading the list.
    pub fn append(&self, value: &T) -> Result<(), Error> {
        let bytes = encode(self.name, value)?;
        self.handle.list_append(self.name, &bytes).map_err(|e| refused(self.name, e))
    }
    /// Every element, in append order.
    pub fn get(&self) -> Result<Vec<T>, Error> {
        let items = self.handle.list_get(self.name).map_err(|e| refused(self.name, e))?;
        items.iter().map(|b| decode(self.name, b)).collect()
    }
    /// How many elements the list holds.
    pub fn len(&self) -> Result<u64, Error> {
        self.handle.list_len(self.name).map_err(|e| refused(self.name, e))
    }
    /// Whether the list is empty.
    pub fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len()? == 0)
    }
    /// Removes every element.
    pub fn clear(&self) -> Result<(), Error> {
        self.handle.list_clear(self.name).map_err(|e| refused(self.name, e))
    }
}

/// A map variable: entries in key order, each stored on its own.
pub struct MapState<'a, K, V> {
    handle: Backend<'a>,
    name: &'static str,
    t: PhantomData<(K, V)>,
}

impl<K: MapKey, V: Serialize + DeserializeOwned> MapState<'_, K, V> {
    /// The value under `key`.
    pub fn get(&self, key: &K) -> Result<Option<V>, Error> {
        let bytes = self.handle.map_get(self.name, &key.to_bytes()).map_err(|e| refused(self.name, e))?;
        bytes.map(|b| decode(self.name, &b)).transpose()
    }
    /// Whether there is an entry under `key`.
    pub fn contains(&self, key: &K) -> Result<bool, Error> {
        self.handle.map_contains(self.name, &key.to_bytes()).map_err(|e| refused(self.name, e))
    }
    /// Sets the entry under `key`.
    pub fn put(&self, key: &K, value: &V) -> Result<(), Error> {
        let bytes = encode(self.name, value)?;
        self.handle.map_put(self.name, &key.to_bytes(), &bytes).map_err(|e| refused(self.name, e))
    }
    /// Removes the entry under `key`, if any.
    pub fn remove(&self, key: &K) -> Result<(), Error> {
        self.handle.map_remove(self.name, &key.to_bytes()).map_err(|e| refused(self.name, e))
    }
    /// The keys, in order.
    pub fn keys(&self) -> Result<Vec<K>, Error> {
        let keys = self.handle.map_keys(self.name).map_err(|e| refused(self.name, e))?;
        keys.iter().map(|k| self.key(k)).collect()
    }
    /// The entries, in key order.
    pub fn entries(&self) -> Result<Vec<(K, V)>, Error> {
        let entries = self.handle.map_entries(self.name).map_err(|e| refused(self.name, e))?;
        entries.iter().map(|(k, v)| Ok((self.key(k)?, decode(self.name, v)?))).collect()
    }
    fn key(&self, bytes: &[u8]) -> Result<K, Error> {
        K::from_bytes(bytes).ok_or_else(|| {
            Error::msg(format_args!(
                "{}: a stored map key does not decode: was it written with another key type?",
                self.name
            ))
        })
    }
}

/// A per-key state function on the 0.2 state API. Export it with
/// [`export_keyed_plugin!`](crate::export_keyed_plugin).
pub trait KeyedFunction: Sized + 'static {
    /// The key type (see [`FromKey`]).
    type Key: FromKey;
    /// The event type, decoded with serde from each event's JSON payload.
    type Event: DeserializeOwned;
    /// The output type, each value written as one line of JSON.
    type Output: Serialize;

    /// Describes the plugin.
    fn info() -> PluginInfo;
    /// The state variables, the same at every instantiation.
    fn variables() -> Vec<Variable>;
    /// Configures a fresh instance with the pipeline's parameters.
    fn init(params: &Params) -> Result<Self, Error>;
    /// Called once per key with data in the batch, with its events in arrival order.
    fn process(
        &mut self,
        key: &Self::Key,
        events: Vec<Event<Self::Event>>,
        state: &KeyState<'_>,
    ) -> Result<Vec<Self::Output>, Error>;
    /// Called once per expired timer, after the batch's data calls; the timer is gone
    /// with the call whatever it returns.
    fn handle_expired_timer(
        &mut self,
        key: &Self::Key,
        timer: Timer,
        state: &KeyState<'_>,
    ) -> Result<Vec<Self::Output>, Error>;

    /// Writes a key's initial state, given as one line of the host's
    /// `--initial-state FILE` (its `state`, any JSON value), before the first batch of
    /// a new state dir. Any error stores nothing of the whole file. The default refuses:
    /// a plugin that takes initial state implements this.
    fn handle_initial_state(
        &mut self,
        key: &Self::Key,
        state_json: serde_json::Value,
        state: &KeyState<'_>,
    ) -> Result<(), Error> {
        let _ = (key, state_json, state);
        Err(Error::msg(
            "this plugin has no initial-state handler: implement KeyedFunction::handle_initial_state, or run without --initial-state",
        ))
    }

    /// Converts bytes that `variable` stored under its older layout `from_version`
    /// (its `part`: a value, list element or map value) into the layout of its current
    /// [`Variable::schema_version`] (see [`convert`]). The host calls it, on an instance
    /// of its own, the first time a call reads such an entry, and writes the result
    /// back with the call's changes; it must depend on its arguments only. The default
    /// refuses: a plugin that raises a variable's version implements this.
    fn migrate_state(
        &self,
        variable: &str,
        part: StatePart,
        from_version: u32,
        bytes: &[u8],
    ) -> Result<Vec<u8>, Error> {
        let _ = (part, bytes);
        Err(Error::msg(format!(
            "variable {variable:?} holds entries of layout {from_version}, and this plugin converts none: implement KeyedFunction::migrate_state"
        )))
    }

    /// Renders stored bytes of `variable` as JSON for `groupstate state --plugin`
    /// (see [`render_as`] and [`render_key_as`]); `None` (the default) shows them in
    /// hex. It must depend on its arguments only.
    fn render_state(&self, variable: &str, part: StatePart, bytes: &[u8]) -> Option<String> {
        let _ = (variable, part, bytes);
        None
    }
}

fn outputs<O: Serialize>(outputs: Vec<O>) -> Result<Vec<String>, String> {
    outputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            serde_json::to_string(o).map_err(|e| {
                format!("output {i} cannot be written as JSON ({e}): check the output type's Serialize implementation")
            })
        })
        .collect()
}

/// The glue of [`export_keyed_plugin!`](crate::export_keyed_plugin). Not part of the API.
#[doc(hidden)]
pub mod export {
    use super::*;

    const NO_INIT: &str = "called before init succeeded: the host must call init on every new instance";

    pub fn info<T: KeyedFunction>() -> t::PluginInfo {
        let info = T::info();
        t::PluginInfo {
            name: info.name.to_string(),
            version: info.version.to_string(),
            state_schema_version: info.state_schema_version,
        }
    }

    pub fn init<T: KeyedFunction>(params: Vec<(String, String)>) -> Result<(T, Vec<t::Variable>), String> {
        let instance = T::init(&Params::new(params)).map_err(String::from)?;
        let variables = T::variables()
            .into_iter()
            .map(|v| t::Variable {
                name: v.name.to_owned(),
                kind: match v.kind {
                    VariableKind::Value => t::VariableKind::Value,
                    VariableKind::List => t::VariableKind::List,
                    VariableKind::Map => t::VariableKind::Map,
                },
                ttl: v.ttl.map(|ttl| t::Ttl {
                    duration_ms: ttl.duration_ms,
                    clock: match ttl.clock {
                        TtlClock::ProcessingTime => t::TtlClock::ProcessingTime,
                        TtlClock::EventTime => t::TtlClock::EventTime,
                    },
                }),
                schema_version: v.schema_version,
            })
            .collect();
        Ok((instance, variables))
    }

    pub fn process<T: KeyedFunction>(
        instance: Option<&mut T>,
        key: String,
        events: Vec<t::Event>,
        handle: &Handle,
    ) -> Result<Vec<String>, String> {
        run_process(instance, key, events, &KeyState::from_host(handle))
    }

    pub fn handle_expired_timer<T: KeyedFunction>(
        instance: Option<&mut T>,
        key: String,
        timer: t::Timer,
        handle: &Handle,
    ) -> Result<Vec<String>, String> {
        let timer = Timer { expiry_ms: timer.expiry_ms, name: timer.name };
        run_expired_timer(instance, key, timer, &KeyState::from_host(handle))
    }

    /// `process` over either backend: decodes the key and the events, encodes the outputs.
    pub(crate) fn run_process<T: KeyedFunction>(
        instance: Option<&mut T>,
        key: String,
        events: Vec<t::Event>,
        state: &KeyState<'_>,
    ) -> Result<Vec<String>, String> {
        let instance = instance.ok_or_else(|| format!("process {NO_INIT}"))?;
        let key = T::Key::from_key(key).map_err(KeyError::call_message)?;
        let count = events.len();
        let mut decoded = Vec::with_capacity(count);
        for (index, event) in events.into_iter().enumerate() {
            let value = serde_json::from_str(&event.payload).map_err(|e| {
                format!("event {index} of {count}: payload is not a valid {} ({e}): fix the input, or make the plugin's Event type accept it", std::any::type_name::<T::Event>())
            })?;
            decoded.push(Event { time_ms: event.event_time_ms, value });
        }
        let out = instance.process(&key, decoded, state).map_err(String::from)?;
        outputs(out)
    }

    /// `handle-expired-timer` over either backend.
    pub(crate) fn run_expired_timer<T: KeyedFunction>(
        instance: Option<&mut T>,
        key: String,
        timer: Timer,
        state: &KeyState<'_>,
    ) -> Result<Vec<String>, String> {
        let instance = instance.ok_or_else(|| format!("handle-expired-timer {NO_INIT}"))?;
        let key = T::Key::from_key(key).map_err(KeyError::call_message)?;
        let out = instance.handle_expired_timer(&key, timer, state).map_err(String::from)?;
        outputs(out)
    }

    pub fn handle_initial_state<T: KeyedFunction>(
        instance: Option<&mut T>,
        key: String,
        state_json: String,
        handle: &Handle,
    ) -> Result<(), String> {
        run_initial_state(instance, key, state_json, &KeyState::from_host(handle))
    }

    /// `handle-initial-state` over either backend.
    pub(crate) fn run_initial_state<T: KeyedFunction>(
        instance: Option<&mut T>,
        key: String,
        state_json: String,
        state: &KeyState<'_>,
    ) -> Result<(), String> {
        let instance = instance.ok_or_else(|| format!("handle-initial-state {NO_INIT}"))?;
        let key = T::Key::from_key(key).map_err(KeyError::call_message)?;
        let json = serde_json::from_str(&state_json).map_err(|e| {
            format!("the initial state is not valid JSON ({e}): the host sends the line's `state` value")
        })?;
        instance.handle_initial_state(&key, json, state).map_err(String::from)
    }

    fn part_of(part: t::StatePart) -> StatePart {
        match part {
            t::StatePart::Value => StatePart::Value,
            t::StatePart::ListElement => StatePart::ListElement,
            t::StatePart::MapKey => StatePart::MapKey,
            t::StatePart::MapValue => StatePart::MapValue,
        }
    }

    pub fn render_state<T: KeyedFunction>(
        instance: Option<&T>,
        variable: String,
        part: t::StatePart,
        bytes: Vec<u8>,
    ) -> Option<String> {
        instance?.render_state(&variable, part_of(part), &bytes)
    }

    pub fn migrate_state<T: KeyedFunction>(
        instance: Option<&T>,
        variable: String,
        part: t::StatePart,
        from_version: u32,
        bytes: Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        let instance = instance.ok_or_else(|| format!("migrate-state {NO_INIT}"))?;
        instance.migrate_state(&variable, part_of(part), from_version, &bytes).map_err(String::from)
    }
}

/// Exports a [`KeyedFunction`] as the `groupstate:plugin@0.2.0` world's `info`, `init`,
/// `process`, `handle-expired-timer`, `handle-initial-state`, `migrate-state` and
/// `render-state`. Use it
/// once per plugin crate, at the top level:
/// `groupstate_sdk::export_keyed_plugin!(MyFunction);`.
#[macro_export]
macro_rules! export_keyed_plugin {
    ($ty:ty) => {
        const _: () = {
    $crate::v2::wit::export_v2!(__GroupstatePlugin with_types_in $crate::v2::wit);

            ::std::thread_local! {
                static __GROUPSTATE_INSTANCE: ::core::cell::RefCell<::core::option::Option<$ty>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }

            struct __GroupstatePlugin;

            impl $crate::v2::wit::Guest for __GroupstatePlugin {
                fn info() -> $crate::v2::wit::groupstate::plugin::types::PluginInfo {
                    $crate::v2::export::info::<$ty>()
                }

                fn init(
                    params: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
                ) -> ::core::result::Result<
                    ::std::vec::Vec<$crate::v2::wit::groupstate::plugin::types::Variable>,
                    ::std::string::String,
                > {
                    let (instance, variables) = $crate::v2::export::init::<$ty>(params)?;
                    __GROUPSTATE_INSTANCE.with_borrow_mut(|slot| *slot = ::core::option::Option::Some(instance));
                    ::core::result::Result::Ok(variables)
                }

                fn process(
                    key: ::std::string::String,
                    events: ::std::vec::Vec<$crate::v2::wit::groupstate::plugin::types::Event>,
                    state: &$crate::v2::wit::groupstate::plugin::state::KeyState,
                ) -> ::core::result::Result<::std::vec::Vec<::std::string::String>, ::std::string::String> {
                    __GROUPSTATE_INSTANCE
                        .with_borrow_mut(|slot| $crate::v2::export::process::<$ty>(slot.as_mut(), key, events, state))
                }

                fn handle_expired_timer(
                    key: ::std::string::String,
                    timer: $crate::v2::wit::groupstate::plugin::types::Timer,
                    state: &$crate::v2::wit::groupstate::plugin::state::KeyState,
                ) -> ::core::result::Result<::std::vec::Vec<::std::string::String>, ::std::string::String> {
                    __GROUPSTATE_INSTANCE.with_borrow_mut(|slot| {
                        $crate::v2::export::handle_expired_timer::<$ty>(slot.as_mut(), key, timer, state)
                    })
                }

                fn handle_initial_state(
                    key: ::std::string::String,
                    state_json: ::std::string::String,
                    state: &$crate::v2::wit::groupstate::plugin::state::KeyState,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    __GROUPSTATE_INSTANCE.with_borrow_mut(|slot| {
                        $crate::v2::export::handle_initial_state::<$ty>(slot.as_mut(), key, state_json, state)
                    })
                }

                fn migrate_state(
                    variable: ::std::string::String,
                    part: $crate::v2::wit::groupstate::plugin::types::StatePart,
                    from_version: u32,
                    bytes: ::std::vec::Vec<u8>,
                ) -> ::core::result::Result<::std::vec::Vec<u8>, ::std::string::String> {
                    __GROUPSTATE_INSTANCE.with_borrow(|slot| {
                        $crate::v2::export::migrate_state::<$ty>(slot.as_ref(), variable, part, from_version, bytes)
                    })
                }

                fn render_state(
                    variable: ::std::string::String,
                    part: $crate::v2::wit::groupstate::plugin::types::StatePart,
                    bytes: ::std::vec::Vec<u8>,
                ) -> ::core::option::Option<::std::string::String> {
                    __GROUPSTATE_INSTANCE.with_borrow(|slot| {
                        $crate::v2::export::render_state::<$ty>(slot.as_ref(), variable, part, bytes)
                    })
                }
            }
        };
    };
}
