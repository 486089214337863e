//! The `groupstate:plugin@0.2.0` world on the host: its bindings, the host side of the
//! `key-state` handle (each request answered by the call's [`KeyCall`], which
//! `keyed.rs` owns) and of its `log`, and the plugin's two calls. Generated types stop
//! here: the engine sees `keyed::{Variable, Timer, KeyStateError}`.

use wasmtime::component::Resource;

use std::sync::Arc;

use super::{
    Activity, Bindings, CallError, HostState, Live, Plugin, PluginInfo, Recipe, clip_message, set_deadline,
    trap_message,
};
use crate::config::TimeoutKind;
use crate::keyed::{
    KeyCall, KeyStateError, KeyedFunction, Migrate, RENDERED_BYTES_MAX, RequestError, StatePart, Timer, Ttl, TtlClock,
    Variable, VariableKind,
};
use crate::plugin::Event;

/// The generated bindings of the 0.2 `state-function` world.
pub(super) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/v0.2",
        world: "keyed-state-function",
        imports: { default: trappable },
        with: {
            "groupstate:plugin/state.key-state": crate::plugin::v2::KeyStateHandle,
        },
    });
}

use bindings::groupstate::plugin::{log, state, types};

/// The host's record behind a `key-state` handle: the call itself is in
/// `HostState::keyed` for as long as the call runs.
#[derive(Debug)]
pub struct KeyStateHandle;

/// The export a component has when it targets this world.
pub(super) const MARKER_EXPORT: &str = "handle-expired-timer";

impl From<types::Variable> for Variable {
    fn from(v: types::Variable) -> Self {
        let kind = match v.kind {
            types::VariableKind::Value => VariableKind::Value,
            types::VariableKind::List => VariableKind::List,
            types::VariableKind::Map => VariableKind::Map,
        };
        let ttl = v.ttl.map(|t| Ttl {
            duration_ms: t.duration_ms,
            clock: match t.clock {
                types::TtlClock::ProcessingTime => TtlClock::ProcessingTime,
                types::TtlClock::EventTime => TtlClock::EventTime,
            },
        });
        Self { name: v.name, kind, ttl, schema_version: v.schema_version }
    }
}

fn wit_part(part: StatePart) -> types::StatePart {
    match part {
        StatePart::Value => types::StatePart::Value,
        StatePart::ListElement => types::StatePart::ListElement,
        StatePart::MapKey => types::StatePart::MapKey,
        StatePart::MapValue => types::StatePart::MapValue,
    }
}

fn time_mode(kind: TimeoutKind) -> types::TimeMode {
    match kind {
        TimeoutKind::None => types::TimeMode::None,
        TimeoutKind::ProcessingTime => types::TimeMode::ProcessingTime,
        TimeoutKind::EventTime => types::TimeMode::EventTime,
    }
}

impl From<KeyStateError> for types::StateError {
    fn from(e: KeyStateError) -> Self {
        match e {
            KeyStateError::UnknownVariable(name) => Self::UnknownVariable(name),
            KeyStateError::ValueTooLarge(max) => Self::ValueTooLarge(max),
            KeyStateError::TooManyEntries(max) => Self::TooManyEntries(max),
            KeyStateError::TooManyTimers(max) => Self::TooManyTimers(max),
            KeyStateError::TimeModeMismatch(kind) => Self::TimeModeMismatch(time_mode(kind)),
            KeyStateError::NonPositiveTime(t) => Self::NonPositiveTime(t),
            KeyStateError::TimerNameTooLong(n) => Self::TimerNameTooLong(n),
            KeyStateError::KeyTooLong(n) => Self::KeyTooLong(n),
        }
    }
}

type Answer<T> = wasmtime::Result<Result<T, types::StateError>>;

impl HostState {
    fn keyed_call(&mut self) -> wasmtime::Result<&mut KeyCall> {
        self.keyed.as_mut().ok_or_else(|| wasmtime::Error::msg("key-state handle used outside its call"))
    }

    /// Runs one request; a store failure under it traps the call and is kept for the
    /// engine, which stops the batch with it.
    fn answer<T>(&mut self, f: impl FnOnce(&mut KeyCall) -> Result<T, RequestError>) -> Answer<T> {
        let call = self.keyed_call()?;
        match f(call) {
            Ok(v) => Ok(Ok(v)),
            Err(RequestError::Refused(e)) => Ok(Err(e.into())),
            Err(RequestError::Store(e)) => {
                let message = format!("state store read failed: {e}");
                call.store_error = Some(e);
                Err(wasmtime::Error::msg(message))
            }
            // The plugin's own conversion failed: the call fails like a trapped one.
            Err(RequestError::Migration(message)) => Err(wasmtime::Error::msg(message)),
        }
    }
}

type H = Resource<KeyStateHandle>;

impl state::HostKeyState for HostState {
    fn value_get(&mut self, _: H, name: String) -> Answer<Option<Vec<u8>>> {
        self.answer(|c| c.value_get(&name))
    }
    fn value_set(&mut self, _: H, name: String, value: Vec<u8>) -> Answer<()> {
        self.answer(|c| c.value_set(&name, value))
    }
    fn value_clear(&mut self, _: H, name: String) -> Answer<()> {
        self.answer(|c| c.value_clear(&name))
    }
    fn list_append(&mut self, _: H, name: String, value: Vec<u8>) -> Answer<()> {
        self.answer(|c| c.list_append(&name, value))
    }
    fn list_get(&mut self, _: H, name: String) -> Answer<Vec<Vec<u8>>> {
        self.answer(|c| c.list_get(&name))
    }
    fn list_len(&mut self, _: H, name: String) -> Answer<u64> {
        self.answer(|c| c.list_len(&name))
    }
    fn list_clear(&mut self, _: H, name: String) -> Answer<()> {
        self.answer(|c| c.list_clear(&name))
    }
    fn map_get(&mut self, _: H, name: String, key: Vec<u8>) -> Answer<Option<Vec<u8>>> {
        self.answer(|c| c.map_get(&name, &key))
    }
    fn map_contains(&mut self, _: H, name: String, key: Vec<u8>) -> Answer<bool> {
        self.answer(|c| c.map_contains(&name, &key))
    }
    fn map_put(&mut self, _: H, name: String, key: Vec<u8>, value: Vec<u8>) -> Answer<()> {
        self.answer(|c| c.map_put(&name, &key, value))
    }
    fn map_remove(&mut self, _: H, name: String, key: Vec<u8>) -> Answer<()> {
        self.answer(|c| c.map_remove(&name, &key))
    }
    fn map_keys(&mut self, _: H, name: String) -> Answer<Vec<Vec<u8>>> {
        self.answer(|c| c.map_keys(&name))
    }
    fn map_entries(&mut self, _: H, name: String) -> Answer<Vec<(Vec<u8>, Vec<u8>)>> {
        self.answer(|c| c.map_entries(&name))
    }
    fn register_timer(&mut self, _: H, expiry_ms: i64, name: Option<String>) -> Answer<()> {
        self.answer(|c| c.register_timer(expiry_ms, name.as_deref()))
    }
    fn delete_timer(&mut self, _: H, expiry_ms: i64, name: Option<String>) -> Answer<()> {
        self.answer(|c| c.delete_timer(expiry_ms, name.as_deref()))
    }
    fn list_timers(&mut self, _: H) -> Answer<Vec<types::Timer>> {
        self.answer(|c| {
            Ok(c.list_timers()?.into_iter().map(|t| types::Timer { expiry_ms: t.expiry_ms, name: t.name }).collect())
        })
    }
    fn time_mode(&mut self, _: H) -> wasmtime::Result<types::TimeMode> {
        Ok(time_mode(self.keyed_call()?.ctx.kind))
    }
    fn current_watermark_ms(&mut self, _: H) -> wasmtime::Result<i64> {
        Ok(self.keyed_call()?.ctx.watermark_ms)
    }
    fn current_processing_time_ms(&mut self, _: H) -> wasmtime::Result<i64> {
        Ok(self.keyed_call()?.ctx.processing_time_ms)
    }
    fn drop(&mut self, _: H) -> wasmtime::Result<()> {
        // The host owns the handle and deletes it when the call returns; the guest only
        // holds borrows.
        Ok(())
    }
}

impl state::Host for HostState {}
impl types::Host for HostState {}

super::log_host!(log);

/// Which export a 0.2 call makes.
enum Export<'a> {
    Process(&'a [Event<'a>]),
    Timer(&'a Timer),
    InitialState(&'a str),
}

impl Plugin {
    /// One 0.2 call for `call.key`; the call comes back with what it staged.
    fn call_keyed(&mut self, call: KeyCall, export: Export<'_>) -> (Result<Vec<String>, CallError>, KeyCall) {
        let ticks = self.deadline_ticks();
        let live = match self.live() {
            Ok(live) => live,
            Err(e) => return (Err(e), call),
        };
        let Bindings::V2(bindings, process) = &live.bindings else {
            let why = "the plugin targets groupstate:plugin@0.1.0, not 0.2.0".to_owned();
            return (Err(CallError::BadResult(why)), call);
        };
        live.env.prepare_call(call.ctx.processing_time_ms, call.ctx.batch_id, &call.key);
        let key = call.key.clone();
        live.store.data_mut().keyed = Some(call);
        let resource = match live.store.data_mut().table.push(KeyStateHandle) {
            Ok(resource) => resource,
            Err(_) => {
                let call = live.store.data_mut().keyed.take();
                self.live = None;
                let why = format!(
                    "no room for the key-state handle (instance_resources_max = {}: the plugin holds too many handles; drop the ones it no longer uses)",
                    self.recipe.limits.instance_resources_max
                );
                return (Err(CallError::Trap(why)), call.expect("the call was just put there"));
            }
        };
        let borrowed = Resource::<KeyStateHandle>::new_borrow(resource.rep());
        set_deadline(&mut live.store, ticks);
        let result = match export {
            Export::Process(events) => process.call(&mut live.store, (&key, events, borrowed)).map(|(result,)| result),
            Export::Timer(timer) => {
                let timer = types::Timer { expiry_ms: timer.expiry_ms, name: timer.name.clone() };
                bindings.call_handle_expired_timer(&mut live.store, &key, &timer, borrowed)
            }
            Export::InitialState(json) => bindings
                .call_handle_initial_state(&mut live.store, &key, json, borrowed)
                .map(|r| r.map(|()| Vec::new())),
        };
        let deleted = live.store.data_mut().table.delete(resource);
        let call = live.store.data_mut().keyed.take().expect("the call stays in the store while it runs");
        let log = live.store.data().log.clone();
        let outcome = self.settle(result, deleted, &log).map(|(outputs, _)| outputs);
        log.flush(Activity::Key(&key));
        (outcome, call)
    }
}

impl Plugin {
    /// `render-state(variable, part, bytes)`: the plugin's JSON for stored bytes, or
    /// `None` when it has none, traps, or answers with anything but one JSON value of
    /// at most [`RENDERED_BYTES_MAX`] bytes (the caller shows hex then).
    pub fn render_state(&mut self, variable: &str, part: StatePart, bytes: &[u8]) -> Option<String> {
        let ticks = self.deadline_ticks();
        let live = self.live().ok()?;
        let Bindings::V2(bindings, _) = &live.bindings else {
            return None;
        };
        set_deadline(&mut live.store, ticks);
        match bindings.call_render_state(&mut live.store, variable, wit_part(part), bytes) {
            Ok(Some(text)) if text.len() <= RENDERED_BYTES_MAX => {
                let valid = serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok();
                valid.then_some(text)
            }
            Ok(_) => None,
            Err(_) => {
                self.live = None;
                None
            }
        }
    }

    /// `migrate-state(variable, part, from-version, bytes)` on the plugin's own
    /// instance, outside any call (a hot-swap candidate's check).
    pub fn migrate_entry(
        &mut self,
        variable: &str,
        part: StatePart,
        from_version: u32,
        bytes: &[u8],
    ) -> Result<Vec<u8>, CallError> {
        let recipe = self.recipe.clone();
        let live = self.live()?;
        let (result, trapped) = migrate_state(&recipe, live, variable, part, from_version, bytes);
        if trapped {
            self.live = None;
        }
        result
    }

    /// One 0.2 call, with the migrator lent to it for the entries it reads.
    fn call_lending(&mut self, mut call: KeyCall, export: Export<'_>) -> (Result<Vec<String>, CallError>, KeyCall) {
        let migrator = self.migrator.take().unwrap_or_else(|| {
            Box::new(Migrator {
                recipe: self.recipe.clone(),
                info: self.info.clone(),
                variables: self.variables.clone(),
                live: None,
            })
        });
        call.migrator = Some(migrator);
        let (result, mut call) = self.call_keyed(call, export);
        self.migrator = call.migrator.take();
        (result, call)
    }
}

/// `migrate-state` on `live`; the flag says it trapped (the instance must go).
fn migrate_state(
    recipe: &Recipe,
    live: &mut Live,
    variable: &str,
    part: StatePart,
    from_version: u32,
    bytes: &[u8],
) -> (Result<Vec<u8>, CallError>, bool) {
    let Bindings::V2(bindings, _) = &live.bindings else {
        return (Err(CallError::BadResult("the plugin targets groupstate:plugin@0.1.0, not 0.2.0".into())), false);
    };
    let log = live.store.data().log.clone();
    set_deadline(&mut live.store, recipe.deadline_ticks());
    let result = bindings.call_migrate_state(&mut live.store, variable, wit_part(part), from_version, bytes);
    let state_bytes_max = recipe.limits.state_bytes_max;
    let outcome = match result {
        Ok(Ok(v)) if v.len() as u64 <= state_bytes_max => (Ok(v), false),
        Ok(Ok(v)) => {
            let why = format!("migrate-state returned {} bytes, over state_bytes_max ({state_bytes_max})", v.len());
            (Err(CallError::BadResult(why)), false)
        }
        Ok(Err(message)) => (
            Err(CallError::Returned(clip_message(&format!(
                "migrate-state of variable {variable:?} from schema {from_version}: {message}"
            )))),
            false,
        ),
        Err(e) => (Err(CallError::Trap(trap_message(&e, &recipe.limits, &log))), true),
    };
    log.flush(Activity::Migrate(from_version));
    outcome
}

/// A 0.2 plugin's second instance, which converts the entries a running call reads
/// from an older layout (the call's own instance cannot be entered again while it
/// waits for its read). Made on the first conversion, re-made after a trap.
struct Migrator {
    recipe: Arc<Recipe>,
    info: PluginInfo,
    variables: Arc<Vec<Variable>>,
    live: Option<Live>,
}

impl Migrate for Migrator {
    fn migrate(
        &mut self,
        variable: &str,
        part: StatePart,
        from_version: u32,
        bytes: &[u8],
    ) -> Result<Vec<u8>, CallError> {
        let live = match &mut self.live {
            Some(live) => live,
            None => self.live.insert(self.recipe.live_checked(&self.info, &self.variables)?),
        };
        let (result, trapped) = migrate_state(&self.recipe, live, variable, part, from_version, bytes);
        if trapped {
            self.live = None;
        }
        result
    }
}

impl KeyedFunction for Plugin {
    fn process(&mut self, call: KeyCall, events: &[Event<'_>]) -> (Result<Vec<String>, CallError>, KeyCall) {
        self.call_lending(call, Export::Process(events))
    }
    fn expired_timer(&mut self, call: KeyCall, timer: &Timer) -> (Result<Vec<String>, CallError>, KeyCall) {
        self.call_lending(call, Export::Timer(timer))
    }
    fn initial_state(&mut self, call: KeyCall, state_json: &str) -> (Result<(), CallError>, KeyCall) {
        let (result, call) = self.call_lending(call, Export::InitialState(state_json));
        (result.map(|_| ()), call)
    }
}
