//! The 0.2 call path (`groupstate:plugin@0.2.0`): a batch's data calls and then its
//! expired timers, each call's reads and staged writes over the batch's earlier calls
//! and the committed state, and the batch's changes as `KeyChange`s of the store
//! entries that `state_keys.rs` names, for `Store::commit` like 0.1's records. It knows
//! nothing of wasm: a [`KeyCall`] is what the plugin's handle works on, and
//! `plugin/v2.rs` turns its answers into the WIT's types.

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::applied::Applied;
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

/// The clock a variable's time-to-live runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlClock {
    /// Written at the batch's processing time, expired against it.
    ProcessingTime,
    /// Written at the call's event time, expired against the watermark.
    EventTime,
}

/// A variable's time-to-live (the WIT's `ttl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttl {
    /// How long an entry lives after it was written.
    pub duration_ms: i64,
    /// The clock it runs on.
    pub clock: TtlClock,
}

/// Which part of a variable `render-state` is asked to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatePart {
    /// A value variable's value.
    Value,
    /// A list element.
    ListElement,
    /// A map key.
    MapKey,
    /// A map value.
    MapValue,
}

/// The longest answer of `render-state` the host shows (longer: hex).
pub const RENDERED_BYTES_MAX: usize = 1 << 20;

/// A state variable a 0.2 plugin declared from `init`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variable {
    /// Its name (see `state_keys::valid_variable_name`).
    pub name: String,
    /// Its kind.
    pub kind: VariableKind,
    /// Its time-to-live, if its entries expire.
    pub ttl: Option<Ttl>,
    /// The layout version of its bytes: entries stored under another version are
    /// converted through [`Migrate`] when a call reads them.
    pub schema_version: u32,
}

/// Converts an entry that a variable stored under an older layout (the plugin's
/// `migrate-state`), for a call that reads it. Implemented by a loaded plugin on an
/// instance of its own, since the call that reads is still running in the main one.
pub trait Migrate: Send {
    /// The bytes of `part` of `variable`, stored under `from_version`, in the
    /// variable's current layout.
    fn migrate(
        &mut self,
        variable: &str,
        part: StatePart,
        from_version: u32,
        bytes: &[u8],
    ) -> Result<Vec<u8>, CallError>;
}

/// Checks that a pipeline can run the variables' TTLs: an event-time TTL needs a
/// watermark, so a time field.
pub fn check_ttl_clocks(variables: &[Variable], has_time_field: bool) -> Result<(), String> {
    match variables.iter().find(|v| v.ttl.is_some_and(|t| t.clock == TtlClock::EventTime)) {
        Some(v) if !has_time_field => Err(format!(
            "variable {:?} has an event-time TTL, but the pipeline has no --time-field, so no watermark to expire it against: run with --time-field, or give it a processing-time TTL",
            v.name
        )),
        _ => Ok(()),
    }
}

/// An entry's expiry: its clock (event time or processing time) and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    /// On the event-time clock (the watermark), else processing time.
    pub event_time: bool,
    /// When it expires (epoch milliseconds): at the first batch whose threshold is at
    /// or after it.
    pub at_ms: i64,
}

/// The layout of 0.2 entries this host writes, recorded in a new state dir: 1 has the
/// expiry header of [`pack_entry`].
pub const KEYED_LAYOUT: u32 = 1;

/// The first byte of a stored value, list element or map entry: no expiry follows.
const NO_EXPIRY: u8 = 0;
/// The first byte: a processing-time expiry follows (8 bytes, little endian).
const PROCESSING_EXPIRY: u8 = 1;
/// The first byte: an event-time expiry follows.
const EVENT_EXPIRY: u8 = 2;

/// The stored form of a value, list element or map entry: a byte saying whether an
/// expiry follows, the expiry, then the plugin's bytes.
pub fn pack_entry(expiry: Option<Expiry>, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 9);
    match expiry {
        None => out.push(NO_EXPIRY),
        Some(e) => {
            out.push(if e.event_time { EVENT_EXPIRY } else { PROCESSING_EXPIRY });
            out.extend_from_slice(&e.at_ms.to_le_bytes());
        }
    }
    out.extend_from_slice(bytes);
    out
}

/// A stored value, list element or map entry read back: its expiry and the plugin's
/// bytes (checked right after the read: damage is an error, not a guess).
pub fn unpack_entry<'b>(store_key: &str, stored: &'b [u8]) -> Result<(Option<Expiry>, &'b [u8]), StoreError> {
    let damaged = || StoreError::Corrupt(format!("the record of {store_key:?} has no valid expiry header"));
    let (&tag, rest) = stored.split_first().ok_or_else(damaged)?;
    let event_time = match tag {
        NO_EXPIRY => return Ok((None, rest)),
        PROCESSING_EXPIRY => false,
        EVENT_EXPIRY => true,
        _ => return Err(damaged()),
    };
    let (at, bytes) = rest.split_at_checked(8).ok_or_else(damaged)?;
    let at_ms = i64::from_le_bytes(at.try_into().map_err(|_| damaged())?);
    Ok((Some(Expiry { event_time, at_ms }), bytes))
}

/// A list element as stored: its store key, its expiry, the plugin's bytes and the
/// schema version they were written under.
type StoredElement = (String, Option<Expiry>, Vec<u8>, u32);

/// A map entry as stored: its store key, its map key, its expiry and the plugin's
/// bytes, and the schema version they were written under.
type StoredMapEntry = (String, Vec<u8>, (Option<Expiry>, Vec<u8>), u32);

/// Why an initial-state load stopped: the index of the line's (key, state) pair, the
/// key and the call's failure.
pub type InitialStateRefused = (usize, String, CallError);

/// Checks the variables a plugin declared: valid, unique names, positive TTLs, schema
/// versions from 1.
pub fn check_variables(variables: &[Variable]) -> Result<(), String> {
    for (i, v) in variables.iter().enumerate() {
        if v.schema_version == 0 {
            return Err(format!(
                "init declared variable {:?} with schema-version 0: versions start at 1 (raise it when the variable's layout changes)",
                v.name
            ));
        }
        if let Some(ttl) = v.ttl.filter(|t| t.duration_ms <= 0) {
            return Err(format!(
                "init declared variable {:?} with a TTL of {} ms: a TTL's duration-ms must be greater than zero",
                v.name, ttl.duration_ms
            ));
        }
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
/// the batch stops with the store's error), or an entry it read could not be
/// converted to its variable's layout (the call then traps, and the pipeline's error
/// policy decides).
#[derive(Debug)]
pub enum RequestError {
    /// The plugin's request was refused.
    Refused(KeyStateError),
    /// Reading the store failed.
    Store(StoreError),
    /// `migrate-state` failed for an entry the request read: why.
    Migration(String),
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

/// A committed record a call read from the store, by its key.
type Noted = (String, Option<KeyRecord>);

/// The most bytes (keys and values) of the committed records a call keeps for its
/// changes' records before: past it, a change reads its record from the store again.
/// A call may read many entries, or one large entry many times, and must not hold a
/// copy of each.
const NOTED_BYTES_MAX: usize = 64 << 10;

/// The committed records a call read (see [`NOTED_BYTES_MAX`]).
#[derive(Debug, Default)]
struct NotedReads {
    entries: Vec<Noted>,
    bytes: usize,
}

/// What a batch's 0.2 calls read: the committed state, and what the batch's earlier
/// calls applied over it.
pub struct BatchView {
    reader: StoreReader,
    /// Store entries changed by the batch's successful calls (`None`: deleted).
    applied: Applied,
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

    /// Sets `key`'s record after the batch so far. When the batch had not changed it
    /// yet, its committed record is the one in `noted` (records a call read from the
    /// store, sorted by key) or read now.
    fn set(&mut self, key: String, after: Option<KeyRecord>, noted: &mut [Noted]) -> Result<(), StoreError> {
        let Self { reader, applied } = self;
        applied.insert(key, after, |key| match noted.binary_search_by(|(k, _)| k.as_str().cmp(key)) {
            Ok(i) => Ok(noted[i].1.take()),
            Err(_) => reader.get(key),
        })
    }

    /// The batch's changes, each with the committed record before it.
    fn into_changes(self) -> Vec<KeyChange> {
        self.applied.into_changes()
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
    /// `ttl_expirations_per_batch_max`.
    pub expirations_max: usize,
}

impl CallContext {
    /// Whether an entry with expiry `e` is expired in this batch: its clock's threshold
    /// (watermark or processing time) is at or after it.
    pub fn expired(&self, e: Expiry) -> bool {
        e.at_ms <= if e.event_time { self.watermark_ms } else { self.processing_time_ms }
    }
}

/// A list's (next index, length) from its record.
fn parse_list_meta(bytes: &[u8]) -> Option<(u64, u64)> {
    let b = <[u8; 16]>::try_from(bytes).ok()?;
    let (next, len) = b.split_at(8);
    Some((u64::from_le_bytes(next.try_into().ok()?), u64::from_le_bytes(len.try_into().ok()?)))
}

/// A list's next-index record; none for an empty list.
fn list_meta_record(next: u64, len: u64, schema_version: u32) -> Option<KeyRecord> {
    if len == 0 {
        return None;
    }
    let mut bytes = next.to_le_bytes().to_vec();
    bytes.extend_from_slice(&len.to_le_bytes());
    Some(KeyRecord { value: Some(bytes), timeout_ms: None, schema_version })
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
            expirations_max: limits.ttl_expirations_per_batch_max,
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
    /// The call's write time on the event-time clock (see the WIT's `ttl-clock`).
    event_time_ms: i64,
    /// Changes applied whatever the call's result (the handled timer's removal).
    forced: Vec<String>,
    /// Converted entries written back (not counted against `state_writes_per_call_max`:
    /// bounded by what one request may read).
    migrated: BTreeMap<String, Option<KeyRecord>>,
    /// Converts entries stored under an older layout; none: such an entry fails the read.
    pub migrator: Option<Box<dyn Migrate>>,
    /// The committed records the call read from the store: the `before` of the
    /// batch's changes it makes first, without a second read.
    noted: RefCell<NotedReads>,
    /// A store read failed under the call.
    pub store_error: Option<StoreError>,
}

impl std::fmt::Debug for KeyCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCall").field("key", &self.key).field("staged", &self.staged.len()).finish_non_exhaustive()
    }
}

impl KeyCall {
    fn new(
        key: &str,
        ctx: CallContext,
        view: BatchView,
        variables: std::sync::Arc<Vec<Variable>>,
        event_time_ms: i64,
    ) -> Self {
        Self {
            key: key.to_owned(),
            ctx,
            view,
            variables,
            staged: BTreeMap::new(),
            event_time_ms,
            forced: Vec::new(),
            migrated: BTreeMap::new(),
            migrator: None,
            noted: RefCell::default(),
            store_error: None,
        }
    }

    /// Applies the staged changes to the batch (`ok`), or only the forced ones.
    fn finish(mut self, ok: bool) -> Result<BatchView, StoreError> {
        let mut noted = self.noted.into_inner().entries;
        noted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        noted.dedup_by(|a, b| a.0 == b.0);
        if ok {
            // A converted entry the call later wrote or removed keeps what it staged.
            self.migrated.extend(std::mem::take(&mut self.staged));
            for (key, after) in std::mem::take(&mut self.migrated) {
                self.view.set(key, after, &mut noted)?;
            }
        } else {
            for key in self.forced {
                if let Some(after) = self.staged.remove(&key) {
                    self.view.set(key, after, &mut noted)?;
                }
            }
        }
        Ok(self.view)
    }

    fn check(&self, name: &str, kind: VariableKind) -> Request<Option<Ttl>> {
        match self.variables.iter().find(|v| v.name == name && v.kind == kind) {
            Some(v) => Ok(v.ttl),
            None => Err(KeyStateError::UnknownVariable(name.to_owned()).into()),
        }
    }

    /// The schema version entries of variable `name` are written under.
    fn schema_of(&self, name: &str) -> u32 {
        self.variables.iter().find(|v| v.name == name).map_or(1, |v| v.schema_version)
    }

    /// The plugin's bytes of `record`, stored under `store_key` as `part` of variable
    /// `name` with `expiry`, in the variable's current layout: an entry of another
    /// schema version is converted through the migrator and written back with the
    /// call's changes.
    fn current(
        &mut self,
        name: &str,
        part: StatePart,
        store_key: &str,
        stored_schema: u32,
        (expiry, bytes): (Option<Expiry>, Vec<u8>),
    ) -> Request<Vec<u8>> {
        let schema_version = self.schema_of(name);
        if stored_schema == schema_version {
            return Ok(bytes);
        }
        let Some(migrator) = self.migrator.as_mut() else {
            return Err(RequestError::Migration(format!(
                "variable {name:?} of key {:?} holds an entry of schema {stored_schema}, and nothing can convert it to schema {schema_version}",
                self.key
            )));
        };
        let converted = migrator.migrate(name, part, stored_schema, &bytes).map_err(|e| {
            RequestError::Migration(format!(
                "converting variable {name:?} of key {:?} from schema {stored_schema} to {schema_version} failed: {e}",
                self.key
            ))
        })?;
        if converted.len() as u64 > self.ctx.state_bytes_max {
            return Err(RequestError::Migration(format!(
                "migrate-state converted variable {name:?} of key {:?} to {} bytes, over state_bytes_max ({})",
                self.key,
                converted.len(),
                self.ctx.state_bytes_max
            )));
        }
        let record = KeyRecord { value: Some(pack_entry(expiry, &converted)), timeout_ms: None, schema_version };
        self.migrated.insert(store_key.to_owned(), Some(record));
        Ok(converted)
    }

    /// The expiry an entry written now with `ttl` gets.
    fn expiry_of(&self, ttl: Option<Ttl>) -> Option<Expiry> {
        let ttl = ttl?;
        Some(match ttl.clock {
            TtlClock::ProcessingTime => {
                Expiry { event_time: false, at_ms: self.ctx.processing_time_ms.saturating_add(ttl.duration_ms) }
            }
            TtlClock::EventTime => {
                Expiry { event_time: true, at_ms: self.event_time_ms.saturating_add(ttl.duration_ms) }
            }
        })
    }

    /// The plugin's bytes of a stored entry and its expiry, `None` when it is absent
    /// or expired in this batch.
    fn live(&self, key: &str, record: Option<KeyRecord>) -> Request<Option<(Option<Expiry>, Vec<u8>)>> {
        let Some(stored) = record.and_then(|r| r.value) else {
            return Ok(None);
        };
        let (expiry, bytes) = unpack_entry(key, &stored)?;
        if expiry.is_some_and(|e| self.ctx.expired(e)) {
            return Ok(None);
        }
        Ok(Some((expiry, bytes.to_vec())))
    }

    /// Stages every change of one request, or none of them (over
    /// `state_writes_per_call_max`: the request has no effect).
    fn stage_all(&mut self, changes: Vec<(String, Option<KeyRecord>)>) -> Request<()> {
        let new = changes.iter().filter(|(k, _)| !self.staged.contains_key(k)).count();
        if self.staged.len() + new > self.ctx.writes_max {
            return Err(KeyStateError::TooManyEntries(clamp_u32(self.ctx.writes_max)).into());
        }
        self.staged.extend(changes);
        Ok(())
    }

    fn index_record(&self) -> KeyRecord {
        KeyRecord { value: Some(Vec::new()), timeout_ms: None, schema_version: self.ctx.schema_version }
    }

    /// The changes that write `value` (or remove the entry, `None`) under store key
    /// `key` of a variable with `ttl`: the entry, and with a TTL its index entry and
    /// the removal of the one it replaces. Without a TTL the old entry is not read: an
    /// index entry it leaves (a TTL dropped since it was written) is removed when it
    /// expires.
    fn entry_changes(
        &self,
        name: &str,
        key: String,
        ttl: Option<Ttl>,
        value: Option<Vec<u8>>,
    ) -> Request<Vec<(String, Option<KeyRecord>)>> {
        let mut changes = Vec::with_capacity(3);
        let old = if ttl.is_some() { self.read(&key)?.and_then(|r| r.value) } else { None };
        if let Some(stored) = old
            && let (Some(old), _) = unpack_entry(&key, &stored)?
        {
            changes.push((sk::expiry_index_key(old.event_time, old.at_ms, &key), None));
        }
        let Some(value) = value else {
            changes.push((key, None));
            return Ok(changes);
        };
        let expiry = self.expiry_of(ttl);
        if let Some(e) = expiry {
            let index_key = sk::expiry_index_key(e.event_time, e.at_ms, &key);
            changes.retain(|(k, _)| *k != index_key);
            changes.push((index_key, Some(self.index_record())));
        }
        let record = KeyRecord {
            value: Some(pack_entry(expiry, &value)),
            timeout_ms: None,
            schema_version: self.schema_of(name),
        };
        changes.push((key, Some(record)));
        Ok(changes)
    }

    /// The store key of an entry of a variable with `ttl`, checked for length (with
    /// room for its expiry index key).
    fn checked_entry_key(key: String, ttl: Option<Ttl>) -> Request<String> {
        let room = if ttl.is_some() { sk::EXPIRY_INDEX_OVERHEAD_BYTES } else { 0 };
        if key.len() + room > KEY_BYTES_MAX {
            return Err(KeyStateError::KeyTooLong(clamp_u32(key.len() + room)).into());
        }
        Ok(key)
    }

    fn read(&self, key: &str) -> Request<Option<KeyRecord>> {
        let changed = self.staged.get(key).or_else(|| self.migrated.get(key));
        if let Some(record) = changed.or_else(|| self.view.applied.get(key)) {
            return Ok(record.clone());
        }
        let record = self.view.reader.get(key)?;
        let mut noted = self.noted.borrow_mut();
        let bytes = key.len() + record.as_ref().and_then(|r| r.value.as_ref()).map_or(0, Vec::len);
        if noted.bytes + bytes <= NOTED_BYTES_MAX {
            noted.bytes += bytes;
            noted.entries.push((key.to_owned(), record.clone()));
        }
        Ok(record)
    }

    fn stage(&mut self, key: String, after: Option<KeyRecord>) -> Request<()> {
        if !self.staged.contains_key(&key) && self.staged.len() >= self.ctx.writes_max {
            return Err(KeyStateError::TooManyEntries(clamp_u32(self.ctx.writes_max)).into());
        }
        self.staged.insert(key, after);
        Ok(())
    }

    fn check_size(&self, value: &[u8]) -> Request<()> {
        if value.len() as u64 > self.ctx.state_bytes_max {
            return Err(KeyStateError::ValueTooLarge(self.ctx.state_bytes_max).into());
        }
        Ok(())
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
        let ours = |m| in_prefix(m, prefix);
        let extra = self.view.applied.range(prefix).count() + ours(&self.migrated).count() + ours(&self.staged).count();
        let mut found: BTreeMap<String, Option<KeyRecord>> = self
            .view
            .reader
            .scan_prefix(prefix, max.saturating_add(extra))?
            .into_iter()
            .map(|(k, r)| (k, Some(r)))
            .collect();
        for (k, r) in self.view.applied.range(prefix).chain(ours(&self.migrated)).chain(ours(&self.staged)) {
            found.insert(k.to_owned(), r.clone());
        }
        let live: Vec<(String, KeyRecord)> = found.into_iter().filter_map(|(k, r)| Some((k, r?))).collect();
        if live.len() > max {
            return Err(KeyStateError::TooManyEntries(clamp_u32(max)).into());
        }
        Ok(live)
    }

    /// How many entries under `prefix` [`KeyCall::range`] would give, counted up to
    /// `max`, without copying one where the prefix was read ahead (`register-timer`
    /// counts the key's timers: a range copied each into a map).
    fn count(&self, prefix: &str, max: usize) -> Request<usize> {
        let Some(stored) = self.view.reader.keys_with_prefix(prefix) else {
            return Ok(self.range(prefix)?.len().min(max));
        };
        type Layer<'a> = Box<dyn Iterator<Item = (&'a str, bool)> + 'a>;
        let ours = |m| -> Layer<'_> { Box::new(in_prefix(m, prefix).map(|(k, r)| (k, r.is_some()))) };
        let applied = self.view.applied.range(prefix).map(|(k, r)| (k, r.is_some()));
        let stored = stored.map(|k| (k, true));
        let layers = vec![ours(&self.staged), ours(&self.migrated), Box::new(applied), Box::new(stored)];
        Ok(crate::key_order::latest(layers).filter(|&(_, held)| held).take(max).count())
    }

    /// The plugin's bytes of the entry under `key`, `part` of variable `name`, in the
    /// variable's current layout; `None` when it is absent or expired.
    fn current_entry(&mut self, name: &str, part: StatePart, key: &str) -> Request<Option<Vec<u8>>> {
        let Some(record) = self.read(key)? else {
            return Ok(None);
        };
        let stored_schema = record.schema_version;
        match self.live(key, Some(record))? {
            Some(entry) => self.current(name, part, key, stored_schema, entry).map(Some),
            None => Ok(None),
        }
    }

    /// `value-get`.
    pub fn value_get(&mut self, name: &str) -> Request<Option<Vec<u8>>> {
        self.check(name, VariableKind::Value)?;
        let key = sk::value_key(&self.key, name);
        self.current_entry(name, StatePart::Value, &key)
    }

    /// `value-set`.
    pub fn value_set(&mut self, name: &str, value: Vec<u8>) -> Request<()> {
        let ttl = self.check(name, VariableKind::Value)?;
        self.check_size(&value)?;
        let key = Self::checked_entry_key(sk::value_key(&self.key, name), ttl)?;
        let changes = self.entry_changes(name, key, ttl, Some(value))?;
        self.stage_all(changes)
    }

    /// `value-clear`.
    pub fn value_clear(&mut self, name: &str) -> Request<()> {
        let ttl = self.check(name, VariableKind::Value)?;
        let key = Self::checked_entry_key(sk::value_key(&self.key, name), ttl)?;
        let changes = self.entry_changes(name, key, ttl, None)?;
        self.stage_all(changes)
    }

    /// A list's (next index, length); the length counts the elements in the store,
    /// expired ones not yet removed included.
    fn list_meta(&self, name: &str) -> Request<(u64, u64)> {
        let bytes = self.read(&sk::list_next_key(&self.key, name))?.and_then(|r| r.value);
        let Some(bytes) = bytes else {
            return Ok((0, 0));
        };
        parse_list_meta(&bytes).ok_or_else(|| {
            StoreError::Corrupt(format!("list {name:?} of key {:?}: its next-index record is not 16 bytes", self.key))
                .into()
        })
    }

    fn list_meta_change(&self, name: &str, next: u64, len: u64) -> (String, Option<KeyRecord>) {
        let key = sk::list_next_key(&self.key, name);
        (key, list_meta_record(next, len, self.ctx.schema_version))
    }

    /// `list-append`: the element, the list's next index and, with a TTL, the element's
    /// expiry index entry.
    pub fn list_append(&mut self, name: &str, value: Vec<u8>) -> Request<()> {
        let ttl = self.check(name, VariableKind::List)?;
        self.check_size(&value)?;
        let (next, len) = self.list_meta(name)?;
        let key = Self::checked_entry_key(sk::list_element_key(&self.key, name, next), ttl)?;
        let mut changes = Vec::with_capacity(3);
        let expiry = self.expiry_of(ttl);
        if let Some(e) = expiry {
            changes.push((sk::expiry_index_key(e.event_time, e.at_ms, &key), Some(self.index_record())));
        }
        let record = KeyRecord {
            value: Some(pack_entry(expiry, &value)),
            timeout_ms: None,
            schema_version: self.schema_of(name),
        };
        changes.push((key, Some(record)));
        changes.push(self.list_meta_change(name, next + 1, len + 1));
        self.stage_all(changes)
    }

    /// The list's elements in the store (expired or not) with their expiry and the
    /// schema version they were written under.
    fn list_elements(&self, name: &str) -> Request<Vec<StoredElement>> {
        let mut out = Vec::new();
        for (key, record) in self.range(&sk::list_prefix(&self.key, name))? {
            let stored = record.value.unwrap_or_default();
            let (expiry, bytes) = unpack_entry(&key, &stored)?;
            out.push((key, expiry, bytes.to_vec(), record.schema_version));
        }
        Ok(out)
    }

    /// The list's elements not expired.
    fn live_elements(&self, name: &str) -> Request<Vec<StoredElement>> {
        let mut elements = self.list_elements(name)?;
        elements.retain(|(_, e, _, _)| !e.is_some_and(|e| self.ctx.expired(e)));
        Ok(elements)
    }

    /// `list-get`: the elements not expired, in the list's current layout.
    pub fn list_get(&mut self, name: &str) -> Request<Vec<Vec<u8>>> {
        self.check(name, VariableKind::List)?;
        let elements = self.live_elements(name)?;
        let mut out = Vec::with_capacity(elements.len());
        for (key, expiry, bytes, stored_schema) in elements {
            out.push(self.current(name, StatePart::ListElement, &key, stored_schema, (expiry, bytes))?);
        }
        Ok(out)
    }

    /// `list-len`: with a TTL, the elements not expired (read); without, the stored
    /// length.
    pub fn list_len(&self, name: &str) -> Request<u64> {
        match self.check(name, VariableKind::List)? {
            Some(_) => Ok(self.live_elements(name)?.len() as u64),
            None => Ok(self.list_meta(name)?.1),
        }
    }

    /// `list-clear`: a staged deletion per element (and per expiry index entry).
    pub fn list_clear(&mut self, name: &str) -> Request<()> {
        self.check(name, VariableKind::List)?;
        let elements = self.list_elements(name)?;
        let mut changes = Vec::with_capacity(elements.len() + 1);
        for (key, expiry, _, _) in elements {
            if let Some(e) = expiry {
                changes.push((sk::expiry_index_key(e.event_time, e.at_ms, &key), None));
            }
            changes.push((key, None));
        }
        changes.push(self.list_meta_change(name, 0, 0));
        self.stage_all(changes)
    }

    fn map_key(&self, name: &str, key: &[u8], ttl: Option<Ttl>) -> Request<String> {
        if key.len() as u64 > self.ctx.state_bytes_max {
            return Err(KeyStateError::ValueTooLarge(self.ctx.state_bytes_max).into());
        }
        Self::checked_entry_key(sk::map_entry_key(&self.key, name, key), ttl)
    }

    /// `map-get`.
    pub fn map_get(&mut self, name: &str, key: &[u8]) -> Request<Option<Vec<u8>>> {
        let ttl = self.check(name, VariableKind::Map)?;
        let key = self.map_key(name, key, ttl)?;
        self.current_entry(name, StatePart::MapValue, &key)
    }

    /// `map-contains` (reads no bytes, so converts nothing).
    pub fn map_contains(&self, name: &str, key: &[u8]) -> Request<bool> {
        let ttl = self.check(name, VariableKind::Map)?;
        let key = self.map_key(name, key, ttl)?;
        Ok(self.live(&key, self.read(&key)?)?.is_some())
    }

    /// `map-put`.
    pub fn map_put(&mut self, name: &str, key: &[u8], value: Vec<u8>) -> Request<()> {
        let ttl = self.check(name, VariableKind::Map)?;
        let key = self.map_key(name, key, ttl)?;
        self.check_size(&value)?;
        let changes = self.entry_changes(name, key, ttl, Some(value))?;
        self.stage_all(changes)
    }

    /// `map-remove`.
    pub fn map_remove(&mut self, name: &str, key: &[u8]) -> Request<()> {
        let ttl = self.check(name, VariableKind::Map)?;
        let key = self.map_key(name, key, ttl)?;
        let changes = self.entry_changes(name, key, ttl, None)?;
        self.stage_all(changes)
    }

    /// The map's entries not expired, in byte order of the map keys.
    fn live_map_entries(&self, name: &str) -> Request<Vec<StoredMapEntry>> {
        let prefix = sk::map_prefix(&self.key, name);
        let mut out = Vec::new();
        for (key, record) in self.range(&prefix)? {
            let Some(map_key) = sk::map_key_of(&key, &prefix) else {
                return Err(StoreError::Corrupt(format!("store key {key:?} is not a map entry's")).into());
            };
            let stored_schema = record.schema_version;
            if let Some(entry) = self.live(&key, Some(record))? {
                out.push((key, map_key, entry, stored_schema));
            }
        }
        Ok(out)
    }

    /// `map-keys`, in byte order (reads no bytes, so converts nothing).
    pub fn map_keys(&self, name: &str) -> Request<Vec<Vec<u8>>> {
        self.check(name, VariableKind::Map)?;
        Ok(self.live_map_entries(name)?.into_iter().map(|(_, map_key, _, _)| map_key).collect())
    }

    /// `map-entries`, in byte order of the map keys, the expired ones skipped, in the
    /// map's current layout.
    pub fn map_entries(&mut self, name: &str) -> Request<Vec<(Vec<u8>, Vec<u8>)>> {
        self.check(name, VariableKind::Map)?;
        let entries = self.live_map_entries(name)?;
        let mut out = Vec::with_capacity(entries.len());
        for (key, map_key, entry, stored_schema) in entries {
            out.push((map_key, self.current(name, StatePart::MapValue, &key, stored_schema, entry)?));
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
        let held = self.count(&sk::timer_prefix(&self.key), self.ctx.timers_max);
        match held {
            Ok(timers) if timers < self.ctx.timers_max => {}
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

/// The entries of `m` whose key starts with `prefix`, in key order.
fn in_prefix<'a>(
    m: &'a BTreeMap<String, Option<KeyRecord>>,
    prefix: &'a str,
) -> impl Iterator<Item = (&'a str, &'a Option<KeyRecord>)> + 'a {
    let from = (std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded);
    m.range::<str, _>(from).take_while(move |(k, _)| k.starts_with(prefix)).map(|(k, r)| (k.as_str(), r))
}

fn clamp_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What a 0.2 state function does with one call (a loaded plugin of the 0.2 world).
pub trait KeyedFunction {
    /// `process(key, events, state)`; gives the call back with what it staged.
    fn process(&mut self, call: KeyCall, events: &[Event<'_>]) -> (Result<Vec<String>, CallError>, KeyCall);
    /// `handle-expired-timer(key, timer, state)`.
    fn expired_timer(&mut self, call: KeyCall, timer: &Timer) -> (Result<Vec<String>, CallError>, KeyCall);
    /// `handle-initial-state(key, state-json, state)`.
    fn initial_state(&mut self, call: KeyCall, state_json: &str) -> (Result<(), CallError>, KeyCall);
}

/// Removes from `view` the entries whose expiry the batch has reached, in expiry
/// order, through the expiry index (a range read of the expired index entries only),
/// at most `limit`; the rest stay invisible to reads and go in later batches. An index
/// entry whose entry no longer has its expiry (a TTL dropped since) goes alone.
fn remove_expired(view: &mut BatchView, ctx: &CallContext, limit: usize) -> Result<usize, StoreError> {
    let mut removed = 0;
    for (event_time, threshold) in [(false, ctx.processing_time_ms), (true, ctx.watermark_ms)] {
        if removed >= limit {
            break;
        }
        let (start, end) = sk::expired_range(event_time, threshold);
        for (index_key, index) in
            view.reader.scan_range(&start, &end, limit - removed)?.into_iter().take(limit - removed)
        {
            let Some((_, at_ms, entry_key)) = sk::parse_expiry_index(&index_key) else {
                return Err(StoreError::Corrupt(format!("{index_key:?} in the expiry index is not an index key")));
            };
            let expiry = Expiry { event_time, at_ms };
            let entry_key = entry_key.to_owned();
            // What the batch had not changed yet is as the store holds it.
            view.applied.insert(index_key, None, |_| Ok::<_, StoreError>(Some(index)))?;
            removed += 1;
            let entry = view.get(&entry_key)?;
            let Some(stored) = entry.as_ref().and_then(|r| r.value.as_deref()) else {
                continue;
            };
            if unpack_entry(&entry_key, stored)?.0 != Some(expiry) {
                continue;
            }
            view.applied.insert(entry_key.clone(), None, |_| Ok::<_, StoreError>(entry))?;
            if let Some((group, Entry::ListElement(name, _))) = sk::parse(&entry_key) {
                let meta_key = sk::list_next_key(&group, &name);
                let meta = view.get(&meta_key)?;
                let Some((next, len)) = meta.as_ref().and_then(|r| parse_list_meta(r.value.as_deref()?)) else {
                    return Err(StoreError::Corrupt(format!("list element {entry_key:?} has no valid list length")));
                };
                let schema = meta.as_ref().map_or(ctx.schema_version, |r| r.schema_version);
                let after = list_meta_record(next, len.saturating_sub(1), schema);
                view.applied.insert(meta_key, after, |_| Ok::<_, StoreError>(meta))?;
            }
        }
    }
    Ok(removed)
}

/// Whether the store holds an entry expired at these thresholds (so a batch without
/// data has entries to remove).
pub fn has_expired_entries(store: &Store, processing_time_ms: i64, watermark_ms: i64) -> Result<bool, StoreError> {
    let reader = store.reader()?;
    for (event_time, threshold) in [(false, processing_time_ms), (true, watermark_ms)] {
        let (start, end) = sk::expired_range(event_time, threshold);
        if !reader.scan_range(&start, &end, 0)?.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Gives a new state dir its initial state: `handle-initial-state` once per
/// (key, state JSON) in order, each call's writes applied for the next; the first
/// failed call stops the load with its index and why. Its changes are for one commit.
pub fn run_initial_state(
    function: &mut dyn KeyedFunction,
    store: &Store,
    variables: std::sync::Arc<Vec<Variable>>,
    ctx: &CallContext,
    states: impl Iterator<Item = (String, String)>,
) -> Result<Result<Vec<KeyChange>, InitialStateRefused>, StoreError> {
    let mut view = BatchView { reader: store.reader()?, applied: Applied::default() };
    for (index, (key, json)) in states.enumerate() {
        // No watermark before the first batch: an event-time TTL counts from the load's
        // processing time (the WIT's `ttl-clock`).
        let call = KeyCall::new(&key, ctx.clone(), view, variables.clone(), ctx.processing_time_ms);
        let (result, call) = function.initial_state(call, &json);
        if let Some(e) = call.store_error {
            return Err(e);
        }
        if let Err(e) = result {
            return Ok(Err((index, key, e)));
        }
        view = call.finish(true)?;
    }
    Ok(Ok(view.into_changes()))
}

/// One call's result, in call order: its outputs, or why it failed.
#[derive(Debug)]
pub struct Called {
    /// The key.
    pub key: String,
    /// A data call's group: its index in the batch's groups (`None` for a timer call).
    pub group: Option<usize>,
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
    /// The expiry index entries of expired entries it removed.
    pub expired: usize,
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
    groups: &[(&str, &[Event<'_>])],
    threshold: Option<i64>,
    timers_max: usize,
    stop_on_failure: bool,
    changes: Vec<KeyChange>,
) -> Result<KeyedBatch, StoreError> {
    let mut out = KeyedBatch { calls: Vec::with_capacity(groups.len()), ..KeyedBatch::default() };
    let mut reader = store.reader()?;
    let prefixes: Vec<String> = groups.iter().map(|&(key, _)| sk::group_prefix(key)).collect();
    reader.read_ahead(prefixes.iter().map(String::as_str))?;
    // Its calls change their group's entries, and the expired ones a few more.
    let mut view = BatchView { reader, applied: Applied::with_groups(groups.len(), changes) };
    out.expired = remove_expired(&mut view, ctx, ctx.expirations_max)?;
    for (group, &(key, events)) in groups.iter().enumerate() {
        let event_time = events.iter().filter_map(|e| e.event_time_ms).fold(ctx.watermark_ms, i64::max);
        let call = KeyCall::new(key, ctx.clone(), view, variables.clone(), event_time);
        let (result, call) = function.process(call, events);
        if let Some(e) = call.store_error {
            return Err(e);
        }
        let failed = result.is_err();
        view = call.finish(!failed)?;
        out.calls.push(Called { key: key.to_owned(), group: Some(group), result });
        if failed && stop_on_failure {
            return Ok(out);
        }
    }
    if let Some(threshold) = threshold {
        // `expired_timers` finds deadlines strictly below its threshold.
        let deleted = view.applied.deleted();
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
            let mut call = KeyCall::new(&key, ctx.clone(), view, variables.clone(), ctx.watermark_ms);
            call.staged.insert(store_key.clone(), None);
            call.forced.push(store_key);
            let (result, call) = function.expired_timer(call, &timer);
            if let Some(e) = call.store_error {
                return Err(e);
            }
            let failed = result.is_err();
            view = call.finish(!failed)?;
            out.calls.push(Called { key, group: None, result });
            if failed && stop_on_failure {
                return Ok(out);
            }
        }
    }
    out.changes = view.into_changes();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_pack_and_unpack_with_their_expiry_and_damage_is_refused() {
        let cases = [
            None,
            Some(Expiry { event_time: false, at_ms: 1_700_000_000_000 }),
            Some(Expiry { event_time: true, at_ms: -1 }),
            Some(Expiry { event_time: true, at_ms: i64::MAX }),
        ];
        for expiry in cases {
            for bytes in [&b""[..], b"\x00\x01\x02", b"plugin bytes"] {
                let stored = pack_entry(expiry, bytes);
                assert_eq!(unpack_entry("k", &stored).unwrap(), (expiry, bytes));
            }
        }
        for damaged in [&b""[..], b"\x03rest", b"\x01short", b"\x02\x01\x02\x03\x04\x05\x06\x07"] {
            assert!(unpack_entry("k", damaged).is_err(), "{damaged:?}");
        }
    }

    /// The context of a call in batch 1 at time 0, with the default limits.
    fn context() -> CallContext {
        let plan = crate::records::BatchPlan {
            batch_id: 1,
            start_offset: 0,
            end_offset: 0,
            processing_time_ms: 0,
            watermark_ms: 0,
        };
        CallContext::new(TimeoutKind::ProcessingTime, &plan, 1, &Limits::default())
    }

    /// A call reading one large entry again and again keeps a bounded copy of what it
    /// read, and its change still carries the committed record before it.
    #[test]
    fn a_call_keeps_a_bounded_copy_of_what_it_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), 1 << 20, 64 << 20, 64 << 20).unwrap();
        let key = sk::value_key("g", "v");
        let large =
            KeyRecord { value: Some(pack_entry(None, &vec![7; 40 << 10])), timeout_ms: None, schema_version: 1 };
        let change = KeyChange { key: key.clone(), before: None, after: Some(large.clone()) };
        store.commit(&[change], &crate::records::Checkpoint::default(), false).unwrap();
        let ctx = context();
        let variables = std::sync::Arc::new(vec![Variable {
            name: "v".into(),
            kind: VariableKind::Value,
            ttl: None,
            schema_version: 1,
        }]);
        let view = BatchView { reader: store.reader().unwrap(), applied: Applied::default() };
        let mut call = KeyCall::new("g", ctx, view, variables, 0);
        for _ in 0..100 {
            assert_eq!(call.value_get("v").unwrap().map(|v| v.len()), Some(40 << 10));
        }
        assert!(call.noted.borrow().bytes <= NOTED_BYTES_MAX, "{}", call.noted.borrow().bytes);
        assert_eq!(call.noted.borrow().entries.len(), 1);
        call.value_set("v", b"small".to_vec()).unwrap();
        let changes = call.finish(true).unwrap().into_changes();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].before, Some(large));
    }

    /// A key's timers counted at `register-timer` are those the call would list: the
    /// store's (in sled, and the overlay's over them), an earlier call's of the batch
    /// and the call's own, whether the key's entries were read ahead or not.
    #[test]
    fn a_count_of_timers_sees_every_layer_as_a_listing_does() {
        for read_ahead in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let mut store = Store::open(dir.path(), 1 << 20, 64 << 20, 64 << 20).unwrap();
            let mut rng = crate::workload::Rng::new(5);
            let groups = ["g0", "g1", "g2"];
            // Few enough that a group's committed timers fit the pages a read-ahead
            // takes (pages are 64 bytes in tests).
            const EXPIRIES: i64 = 6;
            let mut model: Vec<std::collections::BTreeSet<i64>> = vec![Default::default(); groups.len()];
            let timer = |expiry| KeyRecord { value: None, timeout_ms: Some(expiry), schema_version: 1 };
            // Two committed batches, the first folded into sled, the second in the overlay.
            for fold in [true, false] {
                let mut changes = Vec::new();
                for (g, held) in groups.iter().zip(&mut model) {
                    for expiry in 1..=EXPIRIES {
                        let key = sk::timer_key(g, expiry, None);
                        let (before, after) = (held.contains(&expiry), rng.range(0, 3) == 0);
                        if before != after {
                            let record = |on: bool| on.then(|| timer(expiry));
                            changes.push(KeyChange { key, before: record(before), after: record(after) });
                            if after {
                                held.insert(expiry)
                            } else {
                                held.remove(&expiry)
                            };
                        }
                    }
                }
                store.commit(&changes, &crate::records::Checkpoint::default(), false).unwrap();
                if fold {
                    store.flush().unwrap();
                }
            }
            let mut reader = store.reader().unwrap();
            let prefixes: Vec<String> = groups.iter().map(|g| sk::group_prefix(g)).collect();
            if read_ahead {
                reader.read_ahead(prefixes.iter().map(String::as_str)).unwrap();
            }
            for g in groups {
                assert_eq!(reader.keys_with_prefix(&sk::timer_prefix(g)).is_some(), read_ahead, "{g}");
            }
            let mut view = BatchView { reader, applied: Applied::default() };
            // Three calls of each key in one batch: each sees the earlier ones' timers.
            for round in 0..9 {
                let g = round % groups.len();
                let mut call = KeyCall::new(groups[g], context(), view, std::sync::Arc::new(Vec::new()), 0);
                let prefix = sk::timer_prefix(groups[g]);
                for _ in 0..6 {
                    let expiry = rng.range(1, EXPIRIES + 1);
                    if rng.range(0, 2) == 0 {
                        call.register_timer(expiry, None).unwrap();
                        model[g].insert(expiry);
                    } else {
                        call.delete_timer(expiry, None).unwrap();
                        model[g].remove(&expiry);
                    }
                    let counted = call.count(&prefix, usize::MAX).unwrap();
                    assert_eq!(counted, model[g].len(), "round {round}, read ahead: {read_ahead}");
                    assert_eq!(counted, call.range(&prefix).unwrap().len());
                    assert_eq!(call.count(&prefix, 2).unwrap(), counted.min(2));
                }
                view = call.finish(true).unwrap();
            }
        }
    }

    #[test]
    fn a_ttl_must_be_positive_and_event_time_needs_a_time_field() {
        let var = |ttl| Variable { name: "v".into(), kind: VariableKind::Value, ttl, schema_version: 1 };
        let event = Ttl { duration_ms: 5, clock: TtlClock::EventTime };
        assert!(check_variables(&[var(Some(event))]).is_ok());
        let zero = check_variables(&[var(Some(Ttl { duration_ms: 0, clock: TtlClock::ProcessingTime }))]);
        assert!(zero.unwrap_err().contains("greater than zero"));
        assert!(check_ttl_clocks(&[var(Some(event))], true).is_ok());
        assert!(check_ttl_clocks(&[var(Some(event))], false).unwrap_err().contains("--time-field"));
        let processing = Ttl { duration_ms: 5, clock: TtlClock::ProcessingTime };
        assert!(check_ttl_clocks(&[var(Some(processing))], false).is_ok());
    }
}
