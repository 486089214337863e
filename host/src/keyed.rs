//! The 0.2 call path (`groupstate:plugin@0.2.0`): a batch's data calls and then its
//! expired timers, each call's reads and staged writes over the batch's earlier calls
//! and the committed state, and the batch's changes as `KeyChange`s of the store
//! entries that `state_keys.rs` names, for `Store::commit` like 0.1's records. It knows
//! nothing of wasm: a [`KeyCall`] is what the plugin's handle works on, and
//! `plugin/v2.rs` turns its answers into the WIT's types.

use std::collections::BTreeMap;

use crate::config::{Limits, TimeoutKind};
use crate::plugin::{CallError, Event};
use crate::records::{KeyChange, KeyRecord};
use crate::state_keys::{self as sk, Entry};
use crate::store::{KEY_BYTES_MAX, Store, StoreError, StoreReader};

/// The kind of a declared variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VariableKind {
    /// One value.
    Value,
    /// A list, one store entry per element.
    List,
    /// A map, one store entry per entry.
    Map,
}

/// A state variable a 0.2 plugin declared from `init`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variable {
    /// Its name (see `state_keys::valid_variable_name`).
    pub name: String,
    /// Its kind.
    pub kind: VariableKind,
}

/// Checks the variables a plugin declared: valid, unique names.
pub fn check_variables(variables: &[Variable]) -> Result<(), String> {
    for (i, v) in variables.iter().enumerate() {
        if !sk::valid_variable_name(&v.name) {
            return Err(format!(
                "init declared a variable named {:?}: a name has 1 to {} ASCII letters, digits, '_', '-' or '.'",
                v.name.escape_debug().to_string(),
                sk::VARIABLE_NAME_BYTES_MAX
            ));
        }
        if variables[..i].iter().any(|w| w.name == v.name) {
            return Err(format!("init declared variable {:?} twice; give each variable its own name", v.name));
        }
    }
    Ok(())
}

/// A timer of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    /// When it fires (epoch milliseconds).
    pub expiry_ms: i64,
    /// Its name, if it has one.
    pub name: Option<String>,
}

/// Why a `key-state` request was refused (the WIT's `state-error`): the request had no
/// effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyStateError {
    /// No variable of this name and kind.
    UnknownVariable(String),
    /// Over `state_bytes_max`.
    ValueTooLarge(u64),
    /// Over `state_writes_per_call_max`.
    TooManyEntries(u32),
    /// Over `timers_per_key_max`.
    TooManyTimers(u32),
    /// The pipeline has no timers.
    TimeModeMismatch(TimeoutKind),
    /// A timer's expiry must be positive.
    NonPositiveTime(i64),
    /// A timer's name is too long.
    TimerNameTooLong(u32),
    /// The store key would be too long.
    KeyTooLong(u32),
}

/// A request failed: refused, or the store failed under it (the call then traps and
/// the batch stops with the store's error).
#[derive(Debug)]
pub enum RequestError {
    /// The plugin's request was refused.
    Refused(KeyStateError),
    /// Reading the store failed.
    Store(StoreError),
}

impl From<KeyStateError> for RequestError {
    fn from(e: KeyStateError) -> Self {
        Self::Refused(e)
    }
}

impl From<StoreError> for RequestError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

type Request<T> = Result<T, RequestError>;

/// What a batch's 0.2 calls read: the committed state, and what the batch's earlier
/// calls applied over it.
pub struct BatchView {
    reader: StoreReader,
    /// Store entries changed by the batch's successful calls (`None`: deleted).
    applied: BTreeMap<String, Option<KeyRecord>>,
}

impl std::fmt::Debug for BatchView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchView").field("applied", &self.applied.len()).finish_non_exhaustive()
    }
}

impl BatchView {
    fn get(&self, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        match self.applied.get(key) {
            Some(record) => Ok(record.clone()),
            None => self.reader.get(key),
        }
    }

    /// The batch's changes, each with the committed record before it.
    fn into_changes(self) -> Result<Vec<KeyChange>, StoreError> {
        let mut changes = Vec::with_capacity(self.applied.len());
        for (key, after) in self.applied {
            let before = self.reader.get(&key)?;
            if before != after {
                changes.push(KeyChange { key, before, after });
            }
        }
        Ok(changes)
    }
}

/// The batch's constants that every call sees.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// The pipeline's timer kind.
    pub kind: TimeoutKind,
    /// The batch's watermark.
    pub watermark_ms: i64,
    /// The batch's processing time.
    pub processing_time_ms: i64,
    /// The batch id (the plugin's virtual random is seeded from it).
    pub batch_id: u64,
    /// The schema version the records are written with.
    pub schema_version: u32,
    /// `state_bytes_max`.
    pub state_bytes_max: u64,
    /// `state_writes_per_call_max`.
    pub writes_max: usize,
    /// `timers_per_key_max`.
    pub timers_max: usize,
}

impl CallContext {
    /// The batch's constants under `limits`.
    pub fn new(kind: TimeoutKind, plan: &crate::records::BatchPlan, schema_version: u32, limits: &Limits) -> Self {
        Self {
            kind,
            watermark_ms: plan.watermark_ms,
            processing_time_ms: plan.processing_time_ms,
            batch_id: plan.batch_id,
            schema_version,
            state_bytes_max: limits.state_bytes_max,
            writes_max: limits.state_writes_per_call_max,
            timers_max: limits.timers_per_key_max,
        }
    }
}

/// One call of a 0.2 plugin for one key: what the handle reads through and stages in.
/// Its staged changes are applied to the batch only when the call returns `ok`.
pub struct KeyCall {
    /// The group key.
    pub key: String,
    /// The batch's constants.
    pub ctx: CallContext,
    view: BatchView,
    variables: std::sync::Arc<Vec<Variable>>,
    staged: BTreeMap<String, Option<KeyRecord>>,
    /// Changes applied whatever the call's result (the handled timer's removal).
    forced: Vec<String>,
    /// A store read failed under the call.
    pub store_error: Option<StoreError>,
}

impl std::fmt::Debug for KeyCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCall").field("key", &self.key).field("staged", &self.staged.len()).finish_non_exhaustive()
    }
}

impl KeyCall {
    fn new(key: &str, ctx: CallContext, view: BatchView, variables: std::sync::Arc<Vec<Variable>>) -> Self {
        Self {
            key: key.to_owned(),
            ctx,
            view,
            variables,
            staged: BTreeMap::new(),
            forced: Vec::new(),
            store_error: None,
        }
    }

    /// Applies the staged changes to the batch (`ok`), or only the forced ones.
    fn finish(mut self, ok: bool) -> BatchView {
        if ok {
            self.view.applied.append(&mut self.staged);
        } else {
            for key in self.forced {
                if let Some(after) = self.staged.remove(&key) {
                    self.view.applied.insert(key, after);
                }
            }
        }
        self.view
    }

    fn check(&self, name: &str, kind: VariableKind) -> Request<()> {
        if self.variables.iter().any(|v| v.name == name && v.kind == kind) {
            Ok(())
        } else {
            Err(KeyStateError::UnknownVariable(name.to_owned()).into())
        }
    }

    fn read(&self, key: &str) -> Request<Option<KeyRecord>> {
        match self.staged.get(key) {
            Some(record) => Ok(record.clone()),
            None => Ok(self.view.get(key)?),
        }
    }

    fn stage(&mut self, key: String, after: Option<KeyRecord>) -> Request<()> {
        if !self.staged.contains_key(&key) && self.staged.len() >= self.ctx.writes_max {
            return Err(KeyStateError::TooManyEntries(clamp_u32(self.ctx.writes_max)).into());
        }
        self.staged.insert(key, after);
        Ok(())
    }

    fn record(&self, value: Vec<u8>) -> Request<KeyRecord> {
        if value.len() as u64 > self.ctx.state_bytes_max {
            return Err(KeyStateError::ValueTooLarge(self.ctx.state_bytes_max).into());
        }
        Ok(KeyRecord { value: Some(value), timeout_ms: None, schema_version: self.ctx.schema_version })
    }

    fn checked_key(key: String) -> Request<String> {
        if key.len() > KEY_BYTES_MAX {
            return Err(KeyStateError::KeyTooLong(clamp_u32(key.len())).into());
        }
        Ok(key)
    }

    /// The entries under `prefix`: committed, then the batch's, then this call's; more
    /// than `writes_max` fail.
    fn range(&self, prefix: &str) -> Request<Vec<(String, KeyRecord)>> {
        let max = self.ctx.writes_max;
        let ours = |m: &BTreeMap<String, Option<KeyRecord>>| {
            m.range(prefix.to_owned()..).take_while(|(k, _)| k.starts_with(prefix)).count()
        };
        let extra = ours(&self.view.applied) + ours(&self.staged);
        let mut found: BTreeMap<String, Option<KeyRecord>> = self
            .view
            .reader
            .scan_prefix(prefix, max.saturating_add(extra))?
            .into_iter()
            .map(|(k, r)| (k, Some(r)))
            .collect();
        for layer in [&self.view.applied, &self.staged] {
            for (k, r) in layer.range(prefix.to_owned()..).take_while(|(k, _)| k.starts_with(prefix)) {
                found.insert(k.clone(), r.clone());
            }
        }
        let live: Vec<(String, KeyRecord)> = found.into_iter().filter_map(|(k, r)| Some((k, r?))).collect();
        if live.len() > max {
            return Err(KeyStateError::TooManyEntries(clamp_u32(max)).into());
        }
        Ok(live)
    }

    /// `value-get`.
    pub fn value_get(&self, name: &str) -> Request<Option<Vec<u8>>> {
        self.check(name, VariableKind::Value)?;
        Ok(self.read(&sk::value_key(&self.key, name))?.and_then(|r| r.value))
    }

    /// `value-set`.
    pub fn value_set(&mut self, name: &str, value: Vec<u8>) -> Request<()> {
        self.check(name, VariableKind::Value)?;
        let record = self.record(value)?;
        let key = Self::checked_key(sk::value_key(&self.key, name))?;
        self.stage(key, Some(record))
    }

    /// `value-clear`.
    pub fn value_clear(&mut self, name: &str) -> Request<()> {
        self.check(name, VariableKind::Value)?;
        let key = Self::checked_key(sk::value_key(&self.key, name))?;
        self.stage(key, None)
    }

    /// A list's (next index, length).
    fn list_meta(&self, name: &str) -> Request<(u64, u64)> {
        let bytes = self.read(&sk::list_next_key(&self.key, name))?.and_then(|r| r.value);
        let Some(bytes) = bytes else {
            return Ok((0, 0));
        };
        match <[u8; 16]>::try_from(bytes.as_slice()) {
            Ok(b) => {
                let (next, len) = b.split_at(8);
                let word = |w: &[u8]| u64::from_le_bytes(w.try_into().unwrap_or_default());
                Ok((word(next), word(len)))
            }
            Err(_) => Err(StoreError::Corrupt(format!(
                "list {name:?} of key {:?}: its next-index record is not 16 bytes",
                self.key
            ))
            .into()),
        }
    }

    fn set_list_meta(&mut self, name: &str, next: u64, len: u64) -> Request<()> {
        let key = sk::list_next_key(&self.key, name);
        if len == 0 {
            return self.stage(key, None);
        }
        let mut bytes = next.to_le_bytes().to_vec();
        bytes.extend_from_slice(&len.to_le_bytes());
        let record = KeyRecord { value: Some(bytes), timeout_ms: None, schema_version: self.ctx.schema_version };
        self.stage(key, Some(record))
    }

    /// `list-append`: two store entries, the element and the list's next index.
    pub fn list_append(&mut self, name: &str, value: Vec<u8>) -> Request<()> {
        self.check(name, VariableKind::List)?;
        let record = self.record(value)?;
        let (next, len) = self.list_meta(name)?;
        let key = Self::checked_key(sk::list_element_key(&self.key, name, next))?;
        let meta_staged = self.staged.contains_key(&sk::list_next_key(&self.key, name));
        if self.staged.len() + 1 + usize::from(!meta_staged) > self.ctx.writes_max {
            return Err(KeyStateError::TooManyEntries(clamp_u32(self.ctx.writes_max)).into());
        }
        self.stage(key, Some(record))?;
        self.set_list_meta(name, next + 1, len + 1)
    }

    /// `list-get`.
    pub fn list_get(&self, name: &str) -> Request<Vec<Vec<u8>>> {
        self.check(name, VariableKind::List)?;
        let entries = self.range(&sk::list_prefix(&self.key, name))?;
        Ok(entries.into_iter().filter_map(|(_, r)| r.value).collect())
    }

    /// `list-len`.
    pub fn list_len(&self, name: &str) -> Request<u64> {
        self.check(name, VariableKind::List)?;
        Ok(self.list_meta(name)?.1)
    }

    /// `list-clear`: a staged deletion per element.
    pub fn list_clear(&mut self, name: &str) -> Request<()> {
        self.check(name, VariableKind::List)?;
        let entries = self.range(&sk::list_prefix(&self.key, name))?;
        if self.staged.len() + entries.len() + 1 > self.ctx.writes_max {
            return Err(KeyStateError::TooManyEntries(clamp_u32(self.ctx.writes_max)).into());
        }
        for (key, _) in entries {
            self.stage(key, None)?;
        }
        self.set_list_meta(name, 0, 0)
    }

    fn map_key(&self, name: &str, key: &[u8]) -> Request<String> {
        if key.len() as u64 > self.ctx.state_bytes_max {
            return Err(KeyStateError::ValueTooLarge(self.ctx.state_bytes_max).into());
        }
        Self::checked_key(sk::map_entry_key(&self.key, name, key))
    }

    /// `map-get`.
    pub fn map_get(&self, name: &str, key: &[u8]) -> Request<Option<Vec<u8>>> {
        self.check(name, VariableKind::Map)?;
        let key = self.map_key(name, key)?;
        Ok(self.read(&key)?.and_then(|r| r.value))
    }

    /// `map-put`.
    pub fn map_put(&mut self, name: &str, key: &[u8], value: Vec<u8>) -> Request<()> {
        self.check(name, VariableKind::Map)?;
        let key = self.map_key(name, key)?;
        let record = self.record(value)?;
        self.stage(key, Some(record))
    }

    /// `map-remove`.
    pub fn map_remove(&mut self, name: &str, key: &[u8]) -> Request<()> {
        self.check(name, VariableKind::Map)?;
        let key = self.map_key(name, key)?;
        self.stage(key, None)
    }

    /// `map-entries`, in byte order of the map keys.
    pub fn map_entries(&self, name: &str) -> Request<Vec<(Vec<u8>, Vec<u8>)>> {
        self.check(name, VariableKind::Map)?;
        let prefix = sk::map_prefix(&self.key, name);
        let mut out = Vec::new();
        for (key, record) in self.range(&prefix)? {
            let Some(map_key) = sk::map_key_of(&key, &prefix) else {
                return Err(StoreError::Corrupt(format!("store key {key:?} is not a map entry's")).into());
            };
            out.push((map_key, record.value.unwrap_or_default()));
        }
        Ok(out)
    }

    fn check_timer(&self, expiry_ms: i64, name: Option<&str>) -> Request<()> {
        if self.ctx.kind == TimeoutKind::None {
            return Err(KeyStateError::TimeModeMismatch(self.ctx.kind).into());
        }
        if expiry_ms <= 0 {
            return Err(KeyStateError::NonPositiveTime(expiry_ms).into());
        }
        if let Some(name) = name.filter(|n| n.len() > sk::TIMER_NAME_BYTES_MAX) {
            return Err(KeyStateError::TimerNameTooLong(clamp_u32(name.len())).into());
        }
        Ok(())
    }

    /// `register-timer`.
    pub fn register_timer(&mut self, expiry_ms: i64, name: Option<&str>) -> Request<()> {
        self.check_timer(expiry_ms, name)?;
        let key = Self::checked_key(sk::timer_key(&self.key, expiry_ms, name))?;
        if self.read(&key)?.is_some() {
            return Ok(());
        }
        let held = self.range(&sk::timer_prefix(&self.key));
        match held {
            Ok(timers) if timers.len() < self.ctx.timers_max => {}
            Ok(_) | Err(RequestError::Refused(KeyStateError::TooManyEntries(_))) => {
                return Err(KeyStateError::TooManyTimers(clamp_u32(self.ctx.timers_max)).into());
            }
            Err(e) => return Err(e),
        }
        let record = KeyRecord { value: None, timeout_ms: Some(expiry_ms), schema_version: self.ctx.schema_version };
        self.stage(key, Some(record))
    }

    /// `delete-timer`.
    pub fn delete_timer(&mut self, expiry_ms: i64, name: Option<&str>) -> Request<()> {
        if name.is_some_and(|n| n.len() > sk::TIMER_NAME_BYTES_MAX) {
            return Ok(()); // No such timer can exist.
        }
        let key = sk::timer_key(&self.key, expiry_ms, name);
        if key.len() > KEY_BYTES_MAX || self.read(&key)?.is_none() {
            return Ok(());
        }
        self.stage(key, None)
    }

    /// `list-timers`, in (expiry, name) order.
    pub fn list_timers(&self) -> Request<Vec<Timer>> {
        let mut out = Vec::new();
        for (key, _) in self.range(&sk::timer_prefix(&self.key))? {
            match sk::parse(&key) {
                Some((_, Entry::Timer(expiry_ms, name))) => out.push(Timer { expiry_ms, name }),
                _ => return Err(StoreError::Corrupt(format!("store key {key:?} is not a timer's")).into()),
            }
        }
        Ok(out)
    }
}

fn clamp_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What a 0.2 state function does with one call (a loaded plugin of the 0.2 world).
pub trait KeyedFunction {
    /// `process(key, events, state)`; gives the call back with what it staged.
    fn process(&mut self, call: KeyCall, events: &[Event]) -> (Result<Vec<String>, CallError>, KeyCall);
    /// `handle-expired-timer(key, timer, state)`.
    fn expired_timer(&mut self, call: KeyCall, timer: &Timer) -> (Result<Vec<String>, CallError>, KeyCall);
}

/// One call's result, in call order: its outputs, or why it failed.
#[derive(Debug)]
pub struct Called {
    /// The key.
    pub key: String,
    /// A timer call (else a data call).
    pub timer: bool,
    /// The outputs, or the failure.
    pub result: Result<Vec<String>, CallError>,
}

/// What the 0.2 calls of a batch did.
#[derive(Debug, Default)]
pub struct KeyedBatch {
    /// Every call, in order.
    pub calls: Vec<Called>,
    /// The store entries the batch changed.
    pub changes: Vec<KeyChange>,
}

/// Calls `function` for every key with data, in the batch's order, then once per
/// expired timer (expiry at or before `threshold`, committed before the batch and not
/// deleted by its data calls), up to `timers_max`; `stop` says after a failed call
/// whether the batch stops there (`--on-error fail`).
#[allow(clippy::too_many_arguments)]
pub fn run_batch(
    function: &mut dyn KeyedFunction,
    store: &Store,
    variables: std::sync::Arc<Vec<Variable>>,
    ctx: &CallContext,
    groups: &[(String, Vec<Event>)],
    threshold: Option<i64>,
    timers_max: usize,
    stop_on_failure: bool,
) -> Result<KeyedBatch, StoreError> {
    let mut out = KeyedBatch::default();
    let mut view = BatchView { reader: store.reader(), applied: BTreeMap::new() };
    for (key, events) in groups {
        let call = KeyCall::new(key, ctx.clone(), view, variables.clone());
        let (result, call) = function.process(call, events);
        if let Some(e) = call.store_error {
            return Err(e);
        }
        let failed = result.is_err();
        view = call.finish(!failed);
        out.calls.push(Called { key: key.clone(), timer: false, result });
        if failed && stop_on_failure {
            return Ok(out);
        }
    }
    if let Some(threshold) = threshold {
        // `expired_timers` finds deadlines strictly below its threshold.
        let deleted = view.applied.values().filter(|r| r.is_none()).count();
        let expired = store.expired_timers(threshold.saturating_add(1), timers_max.saturating_add(deleted))?;
        let mut fired = 0;
        for (expiry_ms, store_key) in expired {
            if fired == timers_max {
                break;
            }
            let Some((key, Entry::Timer(expiry, name))) = sk::parse(&store_key) else {
                return Err(StoreError::Corrupt(format!(
                    "the deadline index names {store_key:?}, which is not a 0.2 timer: was this state dir written by a 0.1 plugin?"
                )));
            };
            if expiry != expiry_ms {
                return Err(StoreError::Corrupt(format!(
                    "timer {store_key:?} expires at {expiry}, its record at {expiry_ms}"
                )));
            }
            if view.get(&store_key)?.is_none() {
                continue; // Deleted by a data call of this batch.
            }
            fired += 1;
            let timer = Timer { expiry_ms, name };
            let mut call = KeyCall::new(&key, ctx.clone(), view, variables.clone());
            call.staged.insert(store_key.clone(), None);
            call.forced.push(store_key);
            let (result, call) = function.expired_timer(call, &timer);
            if let Some(e) = call.store_error {
                return Err(e);
            }
            let failed = result.is_err();
            view = call.finish(!failed);
            out.calls.push(Called { key, timer: true, result });
            if failed && stop_on_failure {
                return Ok(out);
            }
        }
    }
    out.changes = view.into_changes()?;
    Ok(out)
}
