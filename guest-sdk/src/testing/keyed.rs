//! Run a 0.2 [`KeyedFunction`] natively over several keys and batches with the host's
//! rules: [`KeyedDriver`].
//!
//! ```
//! use groupstate_sdk::testing::{Batch, KeyedDriver};
//! use groupstate_sdk::v2::{KeyState, KeyedFunction, TimeMode, Timer, Variable};
//! use groupstate_sdk::{Error, Event, Params, PluginInfo};
//!
//! /// Counts events per key; a timer 10 s (event time) after a key's first event
//! /// reports the count and forgets it.
//! struct Count;
//!
//! impl KeyedFunction for Count {
//!     type Key = String;
//!     type Event = serde_json::Value;
//!     type Output = (String, u64);
//!
//!     fn info() -> PluginInfo {
//!         PluginInfo { name: "count", version: "0.1.0", state_schema_version: 1 }
//!     }
//!     fn variables() -> Vec<Variable> {
//!         vec![Variable::value("count")]
//!     }
//!     fn init(_: &Params) -> Result<Self, Error> {
//!         Ok(Count)
//!     }
//!     fn process(&mut self, _: &String, events: Vec<Event<serde_json::Value>>, state: &KeyState<'_>)
//!         -> Result<Vec<(String, u64)>, Error> {
//!         let count = state.value::<u64>("count");
//!         let before = count.get()?;
//!         if before.is_none() {
//!             state.register_timer(events[0].time_ms.unwrap_or(0) + 10_000, None)?;
//!         }
//!         count.set(&(before.unwrap_or(0) + events.len() as u64))?;
//!         Ok(vec![])
//!     }
//!     fn handle_expired_timer(&mut self, key: &String, _: Timer, state: &KeyState<'_>)
//!         -> Result<Vec<(String, u64)>, Error> {
//!         let count = state.value::<u64>("count");
//!         let n = count.get()?.unwrap_or(0);
//!         count.clear()?;
//!         Ok(vec![(key.clone(), n)])
//!     }
//! }
//!
//! let mut driver = KeyedDriver::<Count>::new(&[], TimeMode::EventTime).unwrap().with_watermark_delay_ms(1_000);
//! let first = driver.run(Batch::new().event_at("a", 1_000, "{}").event_at("b", 5_000, "{}").event_at("a", 2_000, "{}"));
//! assert!(first.outputs().is_empty());
//! assert_eq!(driver.key_state("a", |s| s.value::<u64>("count").get()).unwrap(), Some(2));
//! assert_eq!(driver.timers("a"), [Timer { expiry_ms: 11_000, name: None }]);
//! // The watermark is now 5 000 - 1 000: no timer has expired yet.
//! assert!(driver.run(Batch::new().event_at("b", 12_000, "{}")).outputs().is_empty());
//! // 12 000 - 1 000 reaches a's timer (11 000), not b's (15 000).
//! assert_eq!(driver.run(Batch::new()).outputs(), [r#"["a",2]"#]);
//! ```

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use crate::v2::wit::groupstate::plugin::types as t;
use crate::v2::{self, KeyState, KeyedFunction, TimeMode, Timer, Ttl, TtlClock, Variable, VariableKind};
use crate::{Error, Event, Params};

/// The longest store key the host keeps (its `KEY_BYTES_MAX`).
const KEY_BYTES_MAX: usize = 4096;
/// The longest a timer's name may be.
const TIMER_NAME_BYTES_MAX: usize = 256;
/// The longest a variable's name may be.
const VARIABLE_NAME_BYTES_MAX: usize = 64;

type Raw<T> = Result<T, t::StateError>;

/// The host's limits that a call can hit, with the host's defaults.
#[derive(Debug, Clone, Copy)]
struct Limits {
    state_bytes_max: u64,
    state_writes_per_call_max: usize,
    timers_per_key_max: usize,
    timeouts_per_batch_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            state_bytes_max: 1 << 20,
            state_writes_per_call_max: 10_000,
            timers_per_key_max: 1_000,
            timeouts_per_batch_max: 100_000,
        }
    }
}

/// When an entry of a variable with a TTL expires: on which clock, and at what time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Expiry {
    event_time: bool,
    at_ms: i64,
}

/// A stored value, list element or map entry: the plugin's bytes and, for a variable
/// with a TTL, its expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    bytes: Vec<u8>,
    expiry: Option<Expiry>,
}

/// A list variable as the host keeps it: its elements under their indices, and the
/// index the next append takes (back to 0 when the list is empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ListData {
    next: u64,
    elements: BTreeMap<u64, Stored>,
}

/// Everything one key holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct KeyData {
    values: BTreeMap<String, Stored>,
    lists: BTreeMap<String, ListData>,
    maps: BTreeMap<String, BTreeMap<Vec<u8>, Stored>>,
    timers: BTreeSet<Timer>,
}

impl KeyData {
    fn is_empty(&self) -> bool {
        self.values.is_empty()
            && self.lists.values().all(|l| l.elements.is_empty())
            && self.maps.values().all(BTreeMap::is_empty)
            && self.timers.is_empty()
    }

    /// Removes the entries `expired` says are, as the host does at the start of a batch;
    /// a list left empty starts again at index 0.
    fn remove_expired(&mut self, expired: impl Fn(Expiry) -> bool) {
        let gone = |s: &Stored| s.expiry.is_some_and(&expired);
        self.values.retain(|_, s| !gone(s));
        for list in self.lists.values_mut() {
            list.elements.retain(|_, s| !gone(s));
        }
        self.lists.retain(|_, l| !l.elements.is_empty());
        for map in self.maps.values_mut() {
            map.retain(|_, s| !gone(s));
        }
        self.maps.retain(|_, m| !m.is_empty());
    }
}

/// One store entry, as the host counts them against `state_writes_per_call_max`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum EntryId {
    Value(String),
    ListNext(String),
    ListElement(String, u64),
    MapEntry(String, Vec<u8>),
    Timer(Timer),
    /// An entry's expiry index entry (variables with a TTL).
    Index(Expiry, Box<EntryId>),
}

/// What a call sees of the pipeline.
#[derive(Debug, Clone, Copy)]
struct Context {
    time_mode: TimeMode,
    watermark_ms: i64,
    processing_time_ms: i64,
    /// The call's write time on the event-time clock: the largest of a data call's event
    /// times and the watermark; the watermark in a timer call; the load's processing
    /// time for initial state.
    event_time_ms: i64,
    limits: Limits,
}

impl Context {
    /// Whether an entry with expiry `e` is expired in this batch (`expiry <= threshold`).
    fn expired(&self, e: Expiry) -> bool {
        e.at_ms <= if e.event_time { self.watermark_ms } else { self.processing_time_ms }
    }
}

/// The state of one call of a [`KeyedDriver`]: the key's entries as the call changed
/// them so far, and the entries it changed. Not part of the API.
#[doc(hidden)]
pub struct TestCall {
    inner: RefCell<CallInner>,
}

struct CallInner {
    key: String,
    data: KeyData,
    touched: BTreeSet<EntryId>,
    variables: Vec<Variable>,
    ctx: Context,
}

fn clamp_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What an expiry index key adds to its entry's store key.
const EXPIRY_INDEX_OVERHEAD_BYTES: usize = 2 + 1 + 16;

impl CallInner {
    /// Checks that `name` is a declared variable of `kind`; its TTL.
    fn check(&self, name: &str, kind: VariableKind) -> Raw<Option<Ttl>> {
        match self.variables.iter().find(|v| v.name == name && v.kind == kind) {
            Some(v) => Ok(v.ttl),
            None => Err(t::StateError::UnknownVariable(name.to_owned())),
        }
    }

    /// The bytes of the group key's prefix in a store key (escapes and separator).
    fn prefix_bytes(&self) -> usize {
        self.key.len() + self.key.chars().filter(|c| matches!(c, '\0' | '\u{1}')).count() + 1
    }

    fn checked_key_len(len: usize) -> Raw<()> {
        if len > KEY_BYTES_MAX { Err(t::StateError::KeyTooLong(clamp_u32(len))) } else { Ok(()) }
    }

    /// The length check of an entry's store key, with room for its index key under a TTL.
    fn checked_entry_len(len: usize, ttl: Option<Ttl>) -> Raw<()> {
        Self::checked_key_len(len + if ttl.is_some() { EXPIRY_INDEX_OVERHEAD_BYTES } else { 0 })
    }

    fn checked_value(&self, value: &[u8]) -> Raw<()> {
        let max = self.ctx.limits.state_bytes_max;
        if value.len() as u64 > max { Err(t::StateError::ValueTooLarge(max)) } else { Ok(()) }
    }

    fn writes_max(&self) -> usize {
        self.ctx.limits.state_writes_per_call_max
    }

    fn too_many_entries(&self) -> t::StateError {
        t::StateError::TooManyEntries(clamp_u32(self.writes_max()))
    }

    fn stage(&mut self, id: EntryId) -> Raw<()> {
        self.stage_all(vec![id])
    }

    /// Stages every entry of one request, or none of them (over the write limit).
    fn stage_all(&mut self, ids: Vec<EntryId>) -> Raw<()> {
        let new = ids.iter().collect::<BTreeSet<_>>().into_iter().filter(|id| !self.touched.contains(*id)).count();
        if self.touched.len() + new > self.writes_max() {
            return Err(self.too_many_entries());
        }
        self.touched.extend(ids);
        Ok(())
    }

    /// A read of `count` entries at once, refused over the write limit as the host does.
    fn checked_read(&self, count: usize) -> Raw<()> {
        if count > self.writes_max() { Err(self.too_many_entries()) } else { Ok(()) }
    }

    /// The expiry an entry written now with `ttl` gets.
    fn expiry_of(&self, ttl: Option<Ttl>) -> Option<Expiry> {
        let ttl = ttl?;
        Some(match ttl.clock {
            TtlClock::ProcessingTime => {
                Expiry { event_time: false, at_ms: self.ctx.processing_time_ms.saturating_add(ttl.duration_ms) }
            }
            TtlClock::EventTime => {
                Expiry { event_time: true, at_ms: self.ctx.event_time_ms.saturating_add(ttl.duration_ms) }
            }
        })
    }

    fn live(&self, stored: &Stored) -> bool {
        !stored.expiry.is_some_and(|e| self.ctx.expired(e))
    }

    /// The entries that writing (or removing, `new` none) entry `id` of a variable with
    /// `ttl` stages: with a TTL the removal of the old index entry and the new one.
    fn entry_ids(id: EntryId, ttl: Option<Ttl>, old: Option<&Stored>, new: Option<Option<Expiry>>) -> Vec<EntryId> {
        let mut ids = Vec::with_capacity(3);
        if ttl.is_some()
            && let Some(e) = old.and_then(|s| s.expiry)
        {
            ids.push(EntryId::Index(e, Box::new(id.clone())));
        }
        if let Some(Some(e)) = new {
            ids.push(EntryId::Index(e, Box::new(id.clone())));
        }
        ids.push(id);
        ids
    }

    fn value_set(&mut self, name: &str, value: &[u8]) -> Raw<()> {
        let ttl = self.check(name, VariableKind::Value)?;
        self.checked_value(value)?;
        Self::checked_entry_len(self.prefix_bytes() + 1 + name.len(), ttl)?;
        let expiry = self.expiry_of(ttl);
        let ids = Self::entry_ids(EntryId::Value(name.to_owned()), ttl, self.data.values.get(name), Some(expiry));
        self.stage_all(ids)?;
        self.data.values.insert(name.to_owned(), Stored { bytes: value.to_vec(), expiry });
        Ok(())
    }

    fn value_clear(&mut self, name: &str) -> Raw<()> {
        let ttl = self.check(name, VariableKind::Value)?;
        Self::checked_entry_len(self.prefix_bytes() + 1 + name.len(), ttl)?;
        let ids = Self::entry_ids(EntryId::Value(name.to_owned()), ttl, self.data.values.get(name), None);
        self.stage_all(ids)?;
        self.data.values.remove(name);
        Ok(())
    }

    fn list_append(&mut self, name: &str, value: &[u8]) -> Raw<()> {
        let ttl = self.check(name, VariableKind::List)?;
        self.checked_value(value)?;
        let next = self.data.lists.get(name).map_or(0, |l| l.next);
        Self::checked_entry_len(self.prefix_bytes() + 2 + name.len() + 16, ttl)?;
        let expiry = self.expiry_of(ttl);
        let mut ids = Self::entry_ids(EntryId::ListElement(name.to_owned(), next), ttl, None, Some(expiry));
        ids.push(EntryId::ListNext(name.to_owned()));
        self.stage_all(ids)?;
        let list = self.data.lists.entry(name.to_owned()).or_default();
        list.elements.insert(next, Stored { bytes: value.to_vec(), expiry });
        list.next = next + 1;
        Ok(())
    }

    /// The list's elements not expired, the read checked against the limit over every
    /// stored element (expired ones not yet removed included), as the host reads them.
    fn list_live(&self, name: &str) -> Raw<Vec<Vec<u8>>> {
        let Some(list) = self.data.lists.get(name) else {
            return Ok(Vec::new());
        };
        self.checked_read(list.elements.len())?;
        Ok(list.elements.values().filter(|s| self.live(s)).map(|s| s.bytes.clone()).collect())
    }

    fn list_clear(&mut self, name: &str) -> Raw<()> {
        self.check(name, VariableKind::List)?;
        let elements: Vec<(u64, Option<Expiry>)> = self
            .data
            .lists
            .get(name)
            .map(|l| l.elements.iter().map(|(i, s)| (*i, s.expiry)).collect())
            .unwrap_or_default();
        self.checked_read(elements.len())?;
        let mut ids = Vec::with_capacity(2 * elements.len() + 1);
        for (index, expiry) in elements {
            let id = EntryId::ListElement(name.to_owned(), index);
            if let Some(e) = expiry {
                ids.push(EntryId::Index(e, Box::new(id.clone())));
            }
            ids.push(id);
        }
        ids.push(EntryId::ListNext(name.to_owned()));
        self.stage_all(ids)?;
        self.data.lists.remove(name);
        Ok(())
    }

    fn map_key(&self, name: &str, key: &[u8], ttl: Option<Ttl>) -> Raw<()> {
        let max = self.ctx.limits.state_bytes_max;
        if key.len() as u64 > max {
            return Err(t::StateError::ValueTooLarge(max));
        }
        Self::checked_entry_len(self.prefix_bytes() + 2 + name.len() + 2 * key.len(), ttl)
    }

    fn map_put(&mut self, name: &str, key: &[u8], value: &[u8]) -> Raw<()> {
        let ttl = self.check(name, VariableKind::Map)?;
        self.map_key(name, key, ttl)?;
        self.checked_value(value)?;
        let expiry = self.expiry_of(ttl);
        let old = self.data.maps.get(name).and_then(|m| m.get(key));
        let ids = Self::entry_ids(EntryId::MapEntry(name.to_owned(), key.to_vec()), ttl, old, Some(expiry));
        self.stage_all(ids)?;
        self.data
            .maps
            .entry(name.to_owned())
            .or_default()
            .insert(key.to_vec(), Stored { bytes: value.to_vec(), expiry });
        Ok(())
    }

    fn map_remove(&mut self, name: &str, key: &[u8]) -> Raw<()> {
        let ttl = self.check(name, VariableKind::Map)?;
        self.map_key(name, key, ttl)?;
        let old = self.data.maps.get(name).and_then(|m| m.get(key));
        let ids = Self::entry_ids(EntryId::MapEntry(name.to_owned(), key.to_vec()), ttl, old, None);
        self.stage_all(ids)?;
        if let Some(map) = self.data.maps.get_mut(name) {
            map.remove(key);
        }
        Ok(())
    }

    fn register_timer(&mut self, expiry_ms: i64, name: Option<&str>) -> Raw<()> {
        if self.ctx.time_mode == TimeMode::None {
            return Err(t::StateError::TimeModeMismatch(t::TimeMode::None));
        }
        if expiry_ms <= 0 {
            return Err(t::StateError::NonPositiveTime(expiry_ms));
        }
        let name_bytes = name.map_or(0, str::len);
        if name_bytes > TIMER_NAME_BYTES_MAX {
            return Err(t::StateError::TimerNameTooLong(clamp_u32(name_bytes)));
        }
        Self::checked_key_len(self.prefix_bytes() + 1 + 16 + 1 + 2 * name_bytes)?;
        let timer = Timer { expiry_ms, name: name.map(str::to_owned) };
        if self.data.timers.contains(&timer) {
            return Ok(());
        }
        let held = self.data.timers.len();
        let timers_max = self.ctx.limits.timers_per_key_max;
        if held >= timers_max || held > self.writes_max() {
            return Err(t::StateError::TooManyTimers(clamp_u32(timers_max)));
        }
        self.stage(EntryId::Timer(timer.clone()))?;
        self.data.timers.insert(timer);
        Ok(())
    }

    fn delete_timer(&mut self, expiry_ms: i64, name: Option<&str>) -> Raw<()> {
        let timer = Timer { expiry_ms, name: name.map(str::to_owned) };
        if !self.data.timers.contains(&timer) {
            return Ok(()); // Also every timer whose name is too long: none can exist.
        }
        self.stage(EntryId::Timer(timer.clone()))?;
        self.data.timers.remove(&timer);
        Ok(())
    }
}

impl TestCall {
    fn new(key: &str, data: KeyData, variables: &[Variable], ctx: Context) -> Self {
        TestCall {
            inner: RefCell::new(CallInner {
                key: key.to_owned(),
                data,
                touched: BTreeSet::new(),
                variables: variables.to_vec(),
                ctx,
            }),
        }
    }

    fn into_data(self) -> KeyData {
        self.inner.into_inner().data
    }

    pub(crate) fn value_get(&self, name: &str) -> Raw<Option<Vec<u8>>> {
        let c = self.inner.borrow();
        c.check(name, VariableKind::Value)?;
        Ok(c.data.values.get(name).filter(|s| c.live(s)).map(|s| s.bytes.clone()))
    }
    pub(crate) fn value_set(&self, name: &str, value: &[u8]) -> Raw<()> {
        self.inner.borrow_mut().value_set(name, value)
    }
    pub(crate) fn value_clear(&self, name: &str) -> Raw<()> {
        self.inner.borrow_mut().value_clear(name)
    }
    pub(crate) fn list_append(&self, name: &str, value: &[u8]) -> Raw<()> {
        self.inner.borrow_mut().list_append(name, value)
    }
    pub(crate) fn list_get(&self, name: &str) -> Raw<Vec<Vec<u8>>> {
        let c = self.inner.borrow();
        c.check(name, VariableKind::List)?;
        c.list_live(name)
    }
    pub(crate) fn list_len(&self, name: &str) -> Raw<u64> {
        let c = self.inner.borrow();
        match c.check(name, VariableKind::List)? {
            // With a TTL the host reads the list; without, it keeps its length.
            Some(_) => Ok(c.list_live(name)?.len() as u64),
            None => Ok(c.data.lists.get(name).map_or(0, |l| l.elements.len() as u64)),
        }
    }
    pub(crate) fn list_clear(&self, name: &str) -> Raw<()> {
        self.inner.borrow_mut().list_clear(name)
    }
    pub(crate) fn map_get(&self, name: &str, key: &[u8]) -> Raw<Option<Vec<u8>>> {
        let c = self.inner.borrow();
        let ttl = c.check(name, VariableKind::Map)?;
        c.map_key(name, key, ttl)?;
        Ok(c.data.maps.get(name).and_then(|m| m.get(key)).filter(|s| c.live(s)).map(|s| s.bytes.clone()))
    }
    pub(crate) fn map_put(&self, name: &str, key: &[u8], value: &[u8]) -> Raw<()> {
        self.inner.borrow_mut().map_put(name, key, value)
    }
    pub(crate) fn map_remove(&self, name: &str, key: &[u8]) -> Raw<()> {
        self.inner.borrow_mut().map_remove(name, key)
    }
    pub(crate) fn map_entries(&self, name: &str) -> Raw<Vec<(Vec<u8>, Vec<u8>)>> {
        let c = self.inner.borrow();
        c.check(name, VariableKind::Map)?;
        let Some(map) = c.data.maps.get(name) else {
            return Ok(Vec::new());
        };
        c.checked_read(map.len())?;
        Ok(map.iter().filter(|(_, s)| c.live(s)).map(|(k, s)| (k.clone(), s.bytes.clone())).collect())
    }
    pub(crate) fn register_timer(&self, expiry_ms: i64, name: Option<&str>) -> Raw<()> {
        self.inner.borrow_mut().register_timer(expiry_ms, name)
    }
    pub(crate) fn delete_timer(&self, expiry_ms: i64, name: Option<&str>) -> Raw<()> {
        self.inner.borrow_mut().delete_timer(expiry_ms, name)
    }
    pub(crate) fn list_timers(&self) -> Raw<Vec<Timer>> {
        let c = self.inner.borrow();
        c.checked_read(c.data.timers.len())?;
        Ok(c.data.timers.iter().cloned().collect())
    }
    pub(crate) fn time_mode(&self) -> TimeMode {
        self.inner.borrow().ctx.time_mode
    }
    pub(crate) fn watermark_ms(&self) -> i64 {
        self.inner.borrow().ctx.watermark_ms
    }
    pub(crate) fn processing_time_ms(&self) -> i64 {
        self.inner.borrow().ctx.processing_time_ms
    }
}

/// One micro-batch for [`KeyedDriver::run`]: events of any keys in arrival order, and
/// optionally the batch's watermark and processing time (by default the driver's: the
/// watermark as the host computes it, the processing time of the batch before).
#[derive(Debug, Clone, Default)]
pub struct Batch {
    events: Vec<(String, Event<String>)>,
    watermark_ms: Option<i64>,
    processing_time_ms: Option<i64>,
}

impl Batch {
    /// An empty batch (it still fires the timers its threshold reaches).
    pub fn new() -> Self {
        Batch::default()
    }

    /// Adds an event of `key` without event time; `payload` is the text of a JSON object.
    pub fn event(mut self, key: &str, payload: &str) -> Self {
        self.events.push((key.to_owned(), Event::new(payload.to_owned())));
        self
    }

    /// Adds an event of `key` with event time `time_ms` (what the host reads from the
    /// pipeline's time field).
    pub fn event_at(mut self, key: &str, time_ms: i64, payload: &str) -> Self {
        self.events.push((key.to_owned(), Event::at(time_ms, payload.to_owned())));
        self
    }

    /// Sets the batch's watermark. It must not be below the previous batch's: the host's
    /// watermark never moves back.
    pub fn watermark_ms(mut self, watermark_ms: i64) -> Self {
        self.watermark_ms = Some(watermark_ms);
        self
    }

    /// Sets the batch's processing time (it stays the next batches' until set again).
    pub fn processing_time_ms(mut self, processing_time_ms: i64) -> Self {
        self.processing_time_ms = Some(processing_time_ms);
        self
    }
}

/// One plugin call of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The key.
    pub key: String,
    /// The timer of a `handle-expired-timer` call; `None` for a data call.
    pub timer: Option<Timer>,
    /// The outputs (JSON text, as the host writes them), or the call's error.
    pub result: Result<Vec<String>, String>,
}

/// What a batch did.
#[derive(Debug, Clone)]
pub struct BatchResult {
    /// The batch's watermark.
    pub watermark_ms: i64,
    /// The batch's processing time.
    pub processing_time_ms: i64,
    /// Every call in order: the data calls (keys in order of their first event), then
    /// the timer calls (by expiry, then key, then name).
    pub calls: Vec<Call>,
    /// The events below the watermark, which the host does not give the plugin (it
    /// writes them to its late file).
    pub late: Vec<(String, Event<String>)>,
}

impl BatchResult {
    /// The outputs of the calls that succeeded, in call order: the lines the host would
    /// write to its output.
    pub fn outputs(&self) -> Vec<String> {
        self.calls.iter().filter_map(|c| c.result.as_ref().ok()).flatten().cloned().collect()
    }

    /// The outputs parsed as JSON values.
    pub fn output_values(&self) -> Vec<serde_json::Value> {
        self.outputs().iter().map(|o| serde_json::from_str(o).unwrap_or(serde_json::Value::Null)).collect()
    }

    /// The failed calls: key and error.
    pub fn errors(&self) -> Vec<(&str, &str)> {
        self.calls.iter().filter_map(|c| c.result.as_ref().err().map(|e| (c.key.as_str(), e.as_str()))).collect()
    }

    /// The timer calls: key and timer.
    pub fn timer_calls(&self) -> Vec<(&str, &Timer)> {
        self.calls.iter().filter_map(|c| c.timer.as_ref().map(|t| (c.key.as_str(), t))).collect()
    }
}

/// Runs a [`KeyedFunction`] over batches as the host does, keeping every key's
/// variables and timers in memory (Flink's `KeyedOneInputStreamOperatorTestHarness`,
/// for groupstate's rules).
///
/// Per [`run`](Self::run):
///
/// - the batch's watermark is the given one, or the host's: the largest event time of
///   the earlier batches minus the watermark delay, never moving back, 0 at first;
///   events strictly below it are late and go to [`BatchResult::late`];
/// - `process` is called once per key with data, with its events in arrival order,
///   keys in the order of their first event;
/// - then `handle-expired-timer` once per timer that the key held before the batch and
///   whose expiry is at or below the threshold (the watermark with
///   [`TimeMode::EventTime`], the processing time with [`TimeMode::ProcessingTime`];
///   none with [`TimeMode::None`]), by expiry, then key, then name, at most
///   `timeouts_per_batch_max` (100 000) of them; a timer that an earlier call of the
///   batch deleted does not fire, one registered in the batch fires in a later one at
///   the earliest. The timer is removed with its call, whatever the result;
/// - a call's changes are applied only when it returns `Ok`; after a failed call the
///   instance is replaced by a fresh one from `init`, as the host does, and the batch
///   goes on (the host's `--on-error skip`);
/// - requests are checked as the host checks them, with its default limits
///   (`state_bytes_max` 1 MiB, `state_writes_per_call_max` 10 000,
///   `timers_per_key_max` 1 000) unless set with the `with_` methods;
/// - variables with a TTL: each value, list element and map entry expires at its write
///   time plus the TTL (processing time, or the call's event time: its latest event or
///   the watermark if later; the watermark in a timer call; the processing time for
///   initial state), is invisible from the first batch whose threshold on its clock
///   reaches the expiry, and is removed then; a TTL'd write stages its index entries
///   against `state_writes_per_call_max` as the host's do, and `list-len` reads the list.
pub struct KeyedDriver<F: KeyedFunction> {
    function: F,
    params: Vec<(String, String)>,
    variables: Vec<Variable>,
    time_mode: TimeMode,
    limits: Limits,
    keys: BTreeMap<String, KeyData>,
    watermark_delay_ms: i64,
    watermark_ms: i64,
    processing_time_ms: i64,
}

/// Checks the variables as the host does after `init`.
fn check_variables(variables: &[Variable]) -> Result<(), String> {
    for (i, v) in variables.iter().enumerate() {
        let valid = !v.name.is_empty()
            && v.name.len() <= VARIABLE_NAME_BYTES_MAX
            && v.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !valid {
            return Err(format!(
                "init declared a variable named {:?}: a name has 1 to {VARIABLE_NAME_BYTES_MAX} ASCII letters, digits, '_', '-' or '.'",
                v.name
            ));
        }
        if variables[..i].iter().any(|w| w.name == v.name) {
            return Err(format!("init declared variable {:?} twice; give each variable its own name", v.name));
        }
        if let Some(ttl) = v.ttl.filter(|t| t.duration_ms <= 0) {
            return Err(format!(
                "init declared variable {:?} with a TTL of {} ms: a TTL must be greater than zero",
                v.name, ttl.duration_ms
            ));
        }
        if v.schema_version == 0 {
            return Err(format!(
                "init declared variable {:?} with schema-version 0: versions start at 1 (raise it when the variable's layout changes)",
                v.name
            ));
        }
    }
    Ok(())
}

impl<F: KeyedFunction> KeyedDriver<F> {
    /// A driver with an instance built from `name, value` parameters (as `--param`),
    /// its declared variables checked as the host checks them, and no state.
    pub fn new(params: &[(&str, &str)], time_mode: TimeMode) -> Result<Self, String> {
        let params: Vec<(String, String)> = params.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        let function = F::init(&Params::new(params.clone())).map_err(String::from)?;
        let variables = F::variables();
        check_variables(&variables)?;
        Ok(KeyedDriver {
            function,
            params,
            variables,
            time_mode,
            limits: Limits::default(),
            keys: BTreeMap::new(),
            watermark_delay_ms: 0,
            watermark_ms: 0,
            processing_time_ms: 0,
        })
    }

    /// Sets the watermark delay (the host's `--watermark-delay-ms`, default 0 here).
    pub fn with_watermark_delay_ms(mut self, watermark_delay_ms: i64) -> Self {
        self.watermark_delay_ms = watermark_delay_ms;
        self
    }

    /// Sets `state_bytes_max` (values, list elements, map keys and values).
    pub fn with_state_bytes_max(mut self, state_bytes_max: u64) -> Self {
        self.limits.state_bytes_max = state_bytes_max;
        self
    }

    /// Sets `state_writes_per_call_max` (entries a call may change or read at once).
    pub fn with_state_writes_per_call_max(mut self, state_writes_per_call_max: usize) -> Self {
        self.limits.state_writes_per_call_max = state_writes_per_call_max;
        self
    }

    /// Sets `timers_per_key_max`.
    pub fn with_timers_per_key_max(mut self, timers_per_key_max: usize) -> Self {
        self.limits.timers_per_key_max = timers_per_key_max;
        self
    }

    /// Sets `timeouts_per_batch_max` (timer calls per batch; the rest fire later).
    pub fn with_timeouts_per_batch_max(mut self, timeouts_per_batch_max: usize) -> Self {
        self.limits.timeouts_per_batch_max = timeouts_per_batch_max;
        self
    }

    /// The plugin instance.
    pub fn function(&mut self) -> &mut F {
        &mut self.function
    }

    /// The watermark the next batch gets unless it sets one: the host's, from the
    /// batches so far (0 before any event time).
    pub fn watermark_ms(&self) -> i64 {
        self.watermark_ms
    }

    /// Runs one batch (see the type's doc for the rules).
    ///
    /// # Panics
    ///
    /// When the batch's watermark is below the previous batch's: the host's never moves back.
    pub fn run(&mut self, batch: Batch) -> BatchResult {
        let watermark_ms = batch.watermark_ms.unwrap_or(self.watermark_ms);
        assert!(
            watermark_ms >= self.watermark_ms,
            "batch watermark {watermark_ms} is below the previous one, {}: the host's watermark never moves back",
            self.watermark_ms
        );
        self.watermark_ms = watermark_ms;
        self.processing_time_ms = batch.processing_time_ms.unwrap_or(self.processing_time_ms);
        let mut out = BatchResult {
            watermark_ms,
            processing_time_ms: self.processing_time_ms,
            calls: Vec::new(),
            late: Vec::new(),
        };

        let mut groups: Vec<(String, Vec<t::Event>)> = Vec::new();
        let mut max_event_time_ms: Option<i64> = None;
        for (key, event) in batch.events {
            if event.time_ms.is_some_and(|ts| ts < watermark_ms) {
                out.late.push((key, event));
                continue;
            }
            max_event_time_ms = max_event_time_ms.max(event.time_ms);
            let event = t::Event { event_time_ms: event.time_ms, payload: event.value };
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, events)) => events.push(event),
                None => groups.push((key, vec![event])),
            }
        }
        self.remove_expired_entries();
        let expired = self.expired_timers();

        for (key, events) in groups {
            // The call's write time on the event-time clock: its latest event, or the
            // watermark if that is later.
            let event_time_ms = events.iter().filter_map(|e| e.event_time_ms).fold(watermark_ms, i64::max);
            let call = self
                .call(&key, None, event_time_ms, |f, key, state| v2::export::run_process(Some(f), key, events, state));
            out.calls.push(call);
        }
        for (key, timer) in expired {
            if !self.keys.get(&key).is_some_and(|d| d.timers.contains(&timer)) {
                continue; // Deleted by an earlier call of this batch.
            }
            let fired = timer.clone();
            let call = self.call(&key, Some(timer), watermark_ms, |f, key, state| {
                v2::export::run_expired_timer(Some(f), key, fired, state)
            });
            out.calls.push(call);
        }

        if let Some(max) = max_event_time_ms {
            self.watermark_ms = self.watermark_ms.max(max.saturating_sub(self.watermark_delay_ms));
        }
        out
    }

    /// Removes the entries of variables with a TTL that this batch's thresholds reach,
    /// as the host does at the start of a batch (all of them: the host's
    /// `ttl_expirations_per_batch_max` is not modelled, which no read can tell).
    fn remove_expired_entries(&mut self) {
        let ctx = self.context();
        for data in self.keys.values_mut() {
            data.remove_expired(|e| ctx.expired(e));
        }
        self.keys.retain(|_, data| !data.is_empty());
    }

    /// The timers held before a batch that its threshold reaches, in firing order.
    fn expired_timers(&self) -> Vec<(String, Timer)> {
        let threshold = match self.time_mode {
            TimeMode::None => return Vec::new(),
            TimeMode::EventTime => self.watermark_ms,
            TimeMode::ProcessingTime => self.processing_time_ms,
        };
        let mut expired: Vec<(i64, String, Timer)> = self
            .keys
            .iter()
            .flat_map(|(key, data)| {
                data.timers.iter().filter(|t| t.expiry_ms <= threshold).map(|t| (t.expiry_ms, key.clone(), t.clone()))
            })
            .collect();
        expired.sort();
        expired.truncate(self.limits.timeouts_per_batch_max);
        expired.into_iter().map(|(_, key, timer)| (key, timer)).collect()
    }

    fn context(&self) -> Context {
        Context {
            time_mode: self.time_mode,
            watermark_ms: self.watermark_ms,
            processing_time_ms: self.processing_time_ms,
            event_time_ms: self.watermark_ms,
            limits: self.limits,
        }
    }

    /// One call for `key` over its entries; applied when it succeeds. A timer call
    /// removes its timer first, whatever the result.
    fn call(
        &mut self,
        key: &str,
        timer: Option<Timer>,
        event_time_ms: i64,
        run: impl FnOnce(&mut F, String, &KeyState<'_>) -> Result<Vec<String>, String>,
    ) -> Call {
        let mut before = self.keys.get(key).cloned().unwrap_or_default();
        let ctx = Context { event_time_ms, ..self.context() };
        let call = TestCall::new(key, before.clone(), &self.variables, ctx);
        if let Some(timer) = &timer {
            before.timers.remove(timer);
            let mut inner = call.inner.borrow_mut();
            inner.data.timers.remove(timer);
            inner.touched.insert(EntryId::Timer(timer.clone()));
        }
        let result = run(&mut self.function, key.to_owned(), &KeyState::from_test(&call));
        let after = if result.is_ok() { call.into_data() } else { before };
        self.store(key, after);
        if result.is_err() {
            // The host replaces the instance after a failed call.
            if let Ok(fresh) = F::init(&Params::new(self.params.clone())) {
                self.function = fresh;
            }
        }
        Call { key: key.to_owned(), timer, result }
    }

    fn store(&mut self, key: &str, data: KeyData) {
        if data.is_empty() {
            self.keys.remove(key);
        } else {
            self.keys.insert(key.to_owned(), data);
        }
    }

    /// Runs `f` over `key`'s variables and timers outside any batch, with the next
    /// batch's default watermark, the last processing time and no per-call write limit: to read them
    /// typed (`driver.key_state("u1", |s| s.map::<i64, Session>("sessions").entries())`)
    /// or to set state up before a batch. Changes are kept when `f` returns `Ok`.
    pub fn key_state<R>(&mut self, key: &str, f: impl FnOnce(&KeyState<'_>) -> Result<R, Error>) -> Result<R, Error> {
        let mut ctx = self.context();
        ctx.limits.state_writes_per_call_max = usize::MAX;
        let call = TestCall::new(key, self.keys.get(key).cloned().unwrap_or_default(), &self.variables, ctx);
        let result = f(&KeyState::from_test(&call));
        if result.is_ok() {
            self.store(key, call.into_data());
        }
        result
    }

    /// Calls `handle-initial-state` for `key` with `state_json` (the `state` of one line
    /// of the host's `--initial-state` file), with watermark 0 and the driver's
    /// processing time, as the host's load before the first batch; its writes are kept
    /// when it returns `Ok`.
    pub fn initial_state(&mut self, key: &str, state_json: &str) -> Result<(), String> {
        let mut ctx = self.context();
        ctx.watermark_ms = 0;
        // No watermark before the first batch: an event-time TTL counts from the load's
        // processing time.
        ctx.event_time_ms = self.processing_time_ms;
        let call = TestCall::new(key, self.keys.get(key).cloned().unwrap_or_default(), &self.variables, ctx);
        let result = v2::export::run_initial_state(
            Some(&mut self.function),
            key.to_owned(),
            state_json.to_owned(),
            &KeyState::from_test(&call),
        );
        if result.is_ok() {
            self.store(key, call.into_data());
        }
        result
    }

    /// What `render-state` answers for `bytes` of `variable` (as `groupstate state` shows them).
    pub fn render_state(&self, variable: &str, part: v2::StatePart, bytes: &[u8]) -> Option<String> {
        self.function.render_state(variable, part, bytes)
    }

    /// `key`'s timers in (expiry, name) order.
    pub fn timers(&self, key: &str) -> Vec<Timer> {
        self.keys.get(key).map(|d| d.timers.iter().cloned().collect()).unwrap_or_default()
    }

    /// Every key's timers, in the order they would fire: by expiry, then key, then name.
    pub fn all_timers(&self) -> Vec<(String, Timer)> {
        let mut all: Vec<(i64, String, Timer)> = self
            .keys
            .iter()
            .flat_map(|(key, data)| data.timers.iter().map(|t| (t.expiry_ms, key.clone(), t.clone())))
            .collect();
        all.sort();
        all.into_iter().map(|(_, key, timer)| (key, timer)).collect()
    }

    /// The keys that hold a value, a list element, a map entry or a timer, in order.
    pub fn keys(&self) -> Vec<String> {
        self.keys.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PluginInfo;

    /// Does what each event says: `{"register":[expiry,name]}`, `{"delete":[expiry,name]}`,
    /// `{"note":"text"}` (appends to list `notes`), `{"fail":true}`. A timer call emits
    /// `"key expiry name"`; a timer named `rearm` registers one 10 ms later, one named
    /// `sweep` deletes the key's other timers, one named `fail` notes and fails.
    struct Probe {
        instance: u32,
    }

    static INSTANCES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    impl KeyedFunction for Probe {
        type Key = String;
        type Event = serde_json::Value;
        type Output = String;

        fn info() -> PluginInfo {
            PluginInfo { name: "probe", version: "0", state_schema_version: 1 }
        }
        fn variables() -> Vec<Variable> {
            vec![Variable::list("notes"), Variable::value("v")]
        }
        fn init(_: &Params) -> Result<Self, Error> {
            Ok(Probe { instance: INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) })
        }
        fn process(
            &mut self,
            _: &String,
            events: Vec<Event<serde_json::Value>>,
            s: &KeyState<'_>,
        ) -> Result<Vec<String>, Error> {
            for e in events {
                let timer = |v: &serde_json::Value| (v[0].as_i64().unwrap_or(0), v[1].as_str().map(str::to_owned));
                if let Some(t) = e.value.get("register") {
                    let (at, name) = timer(t);
                    s.register_timer(at, name.as_deref())?;
                }
                if let Some(t) = e.value.get("delete") {
                    let (at, name) = timer(t);
                    s.delete_timer(at, name.as_deref())?;
                }
                if let Some(n) = e.value.get("note") {
                    s.list::<String>("notes").append(&n.as_str().unwrap_or_default().to_owned())?;
                }
                if e.value.get("fail").is_some() {
                    return Err(Error::msg("asked to fail"));
                }
            }
            Ok(vec![format!("instance {}", self.instance)])
        }
        fn handle_expired_timer(&mut self, key: &String, timer: Timer, s: &KeyState<'_>) -> Result<Vec<String>, Error> {
            match timer.name.as_deref() {
                Some("rearm") => s.register_timer(timer.expiry_ms + 10, Some("rearm"))?,
                Some("sweep") => {
                    for t in s.timers()? {
                        s.delete_timer(t.expiry_ms, t.name.as_deref())?;
                    }
                }
                Some("fail") => {
                    s.list::<String>("notes").append(&"from the failed call".to_owned())?;
                    return Err(Error::msg("timer failed"));
                }
                _ => {}
            }
            Ok(vec![format!("{key} {} {}", timer.expiry_ms, timer.name.unwrap_or_default())])
        }
    }

    fn driver(mode: TimeMode) -> KeyedDriver<Probe> {
        KeyedDriver::<Probe>::new(&[], mode).unwrap()
    }

    fn register(key: &str, at: i64, name: &str) -> Batch {
        Batch::new().event(key, &format!(r#"{{"register":[{at},"{name}"]}}"#))
    }

    fn timer_outputs(r: &BatchResult) -> Vec<String> {
        let outputs = r.calls.iter().filter(|c| c.timer.is_some()).filter_map(|c| c.result.clone().ok()).flatten();
        outputs.map(|o| serde_json::from_str(&o).unwrap_or(o)).collect()
    }

    #[test]
    fn timers_fire_after_the_data_calls_at_or_below_the_threshold_in_order_once() {
        let mut d = driver(TimeMode::EventTime);
        for (key, at, name) in [("b", 20, "x"), ("a", 20, "y"), ("a", 20, "x"), ("a", 10, "z"), ("c", 21, "x")] {
            d.run(register(key, at, name));
        }
        let r = d.run(Batch::new().event("z", "{}").watermark_ms(20));
        assert!(r.calls[0].timer.is_none() && r.calls[0].key == "z", "data calls first: {:?}", r.calls);
        assert_eq!(timer_outputs(&r), ["a 10 z", "a 20 x", "a 20 y", "b 20 x"]);
        assert!(timer_outputs(&d.run(Batch::new())).is_empty(), "each fires once");
        assert_eq!(d.all_timers(), [("c".to_owned(), Timer { expiry_ms: 21, name: Some("x".into()) })]);
    }

    #[test]
    fn a_timer_registered_or_deleted_in_a_batch_does_not_fire_in_it() {
        let mut d = driver(TimeMode::EventTime);
        d.run(register("a", 5, "old"));
        let r = d.run(register("a", 5, "new").event("a", r#"{"delete":[5,"old"]}"#).watermark_ms(100));
        assert!(timer_outputs(&r).is_empty(), "{:?}", r.calls);
        assert_eq!(timer_outputs(&d.run(Batch::new())), ["a 5 new"]);
        // A timer deleted by an earlier timer call of the batch does not fire either.
        d.run(register("k", 150, "sweep").event("k", r#"{"register":[160,"later"]}"#));
        assert_eq!(timer_outputs(&d.run(Batch::new().watermark_ms(200))), ["k 150 sweep"]);
        // A handler's new timer fires in a later batch only.
        d.run(register("r", 300, "rearm"));
        assert_eq!(timer_outputs(&d.run(Batch::new().watermark_ms(400))), ["r 300 rearm"]);
        assert_eq!(timer_outputs(&d.run(Batch::new())), ["r 310 rearm"]);
    }

    #[test]
    fn a_failed_call_changes_nothing_but_its_timer_is_gone_and_the_instance_is_fresh() {
        let mut d = driver(TimeMode::EventTime);
        let first = d.run(register("a", 5, "fail").event("a", r#"{"note":"kept"}"#));
        let failed = d.run(Batch::new().event("a", r#"{"note":"lost"}"#).event("a", r#"{"fail":true}"#));
        assert_eq!(failed.errors(), [("a", "asked to fail")]);
        let notes = |d: &mut KeyedDriver<Probe>| d.key_state("a", |s| s.list::<String>("notes").get()).unwrap();
        assert_eq!(notes(&mut d), ["kept"]);
        let after = d.run(Batch::new().event("b", "{}").watermark_ms(5));
        assert_ne!(after.outputs()[0], first.outputs()[0], "a fresh instance after the failure");
        assert_eq!(after.errors(), [("a", "timer failed")]);
        assert_eq!(notes(&mut d), ["kept"]);
        assert!(d.timers("a").is_empty(), "the failed timer call removed its timer");
    }

    #[test]
    fn requests_are_refused_as_the_host_refuses_them() {
        let mut d = driver(TimeMode::None);
        assert!(d.run(register("a", 5, "x")).errors()[0].1.contains("the pipeline has no timers"));
        let mut d = driver(TimeMode::ProcessingTime).with_timers_per_key_max(2).with_state_writes_per_call_max(3);
        let r =
            d.run(register("a", 5, "x").event("a", r#"{"register":[6,"y"]}"#).event("a", r#"{"register":[7,"z"]}"#));
        assert!(r.errors()[0].1.contains("timers_per_key_max (2)"), "{:?}", r.errors());
        assert!(d.timers("a").is_empty());
        // Three appends are three elements and the list's length: four entries.
        let notes = (0..3).fold(Batch::new(), |b, _| b.event("a", r#"{"note":"n"}"#));
        let r = d.run(notes);
        assert!(r.errors()[0].1.contains("state_writes_per_call_max (3)"), "{:?}", r.errors());
        assert!(d.key_state("a", |s| s.value::<u8>("nope").get()).unwrap_err().message().contains("no variable"));
        // Processing time is the threshold in a processing-time pipeline.
        d.run(register("a", 50, "x"));
        assert!(timer_outputs(&d.run(Batch::new().watermark_ms(100).processing_time_ms(49))).is_empty());
        assert_eq!(timer_outputs(&d.run(Batch::new().processing_time_ms(50))), ["a 50 x"]);
    }

    #[test]
    fn the_watermark_follows_the_earlier_batches_and_late_events_are_kept_apart() {
        let mut d = driver(TimeMode::EventTime).with_watermark_delay_ms(10);
        let r = d.run(Batch::new().event_at("a", 100, "{}"));
        assert_eq!(r.watermark_ms, 0);
        let r = d.run(Batch::new().event_at("a", 89, "{}").event_at("b", 90, "{}").event_at("c", 50, "{}"));
        assert_eq!(r.watermark_ms, 90);
        let late: Vec<&str> = r.late.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(late, ["a", "c"]);
        assert_eq!(r.calls.len(), 1);
        assert_eq!(d.watermark_ms(), 90, "90 - 10 does not move it back");
    }

    #[test]
    fn the_default_initial_state_handler_refuses_and_render_state_is_none() {
        let mut d = driver(TimeMode::EventTime);
        let err = d.initial_state("a", "{}").unwrap_err();
        assert!(err.contains("no initial-state handler"), "{err}");
        assert!(d.keys().is_empty());
        assert_eq!(d.render_state("v", v2::StatePart::Value, b"x"), None);
    }

    /// Writes TTL'd state: `{"set":"x"}` (value `v`, event-time TTL 100 ms),
    /// `{"put":["k","x"]}` (map `m`, processing-time TTL 50 ms), `{"append":"x"}` (list
    /// `l`, event-time TTL 100 ms). Each call outputs what it sees afterwards.
    struct TtlProbe;

    impl KeyedFunction for TtlProbe {
        type Key = String;
        type Event = serde_json::Value;
        type Output = serde_json::Value;

        fn info() -> PluginInfo {
            PluginInfo { name: "ttl-probe", version: "0", state_schema_version: 1 }
        }
        fn variables() -> Vec<Variable> {
            vec![
                Variable::value("v").with_ttl(Ttl::event_time(100)),
                Variable::map("m").with_ttl(Ttl::processing_time(50)),
                Variable::list("l").with_ttl(Ttl::event_time(100)),
            ]
        }
        fn init(_: &Params) -> Result<Self, Error> {
            Ok(TtlProbe)
        }
        fn process(
            &mut self,
            _: &String,
            events: Vec<Event<serde_json::Value>>,
            s: &KeyState<'_>,
        ) -> Result<Vec<serde_json::Value>, Error> {
            for e in events {
                let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
                if let Some(v) = e.value.get("set") {
                    s.value::<String>("v").set(&text(v))?;
                }
                if let Some(kv) = e.value.get("put") {
                    s.map::<String, String>("m").put(&text(&kv[0]), &text(&kv[1]))?;
                }
                if let Some(v) = e.value.get("append") {
                    s.list::<String>("l").append(&text(v))?;
                }
            }
            Ok(vec![seen(s)?])
        }
        fn handle_expired_timer(
            &mut self,
            _: &String,
            _: Timer,
            s: &KeyState<'_>,
        ) -> Result<Vec<serde_json::Value>, Error> {
            s.value::<String>("v").set(&"from a timer".to_owned())?;
            Ok(vec![seen(s)?])
        }
    }

    fn seen(s: &KeyState<'_>) -> Result<serde_json::Value, Error> {
        Ok(serde_json::json!({
            "v": s.value::<String>("v").get()?,
            "m": s.map::<String, String>("m").entries()?,
            "l": s.list::<String>("l").get()?,
            "len": s.list::<String>("l").len()?,
        }))
    }

    fn ttl_driver() -> KeyedDriver<TtlProbe> {
        KeyedDriver::<TtlProbe>::new(&[], TimeMode::EventTime).unwrap()
    }

    #[test]
    fn ttl_entries_expire_at_their_write_time_plus_the_ttl_each_on_its_clock() {
        let mut d = ttl_driver();
        // Written at event time 1000 (the call's latest event), processing time 10.
        let r = d.run(
            Batch::new()
                .processing_time_ms(10)
                .event_at("a", 990, r#"{"set":"x","append":"e1","put":["k1","1"]}"#)
                .event_at("a", 1000, "{}"),
        );
        assert_eq!(r.output_values()[0]["v"], "x");
        // k2 at processing time 40 expires at 90, k1 (written at 10) at 60.
        d.run(Batch::new().processing_time_ms(40).event_at("a", 1040, r#"{"put":["k2","2"],"append":"e2"}"#));
        let r = d.run(Batch::new().processing_time_ms(60).watermark_ms(1099).event("a", "{}"));
        let seen = &r.output_values()[0];
        assert_eq!(seen["v"], "x", "1100 is not reached yet");
        assert_eq!(seen["m"], serde_json::json!([["k2", "2"]]), "k1 expired at 60, on processing time");
        assert_eq!((seen["l"].clone(), seen["len"].clone()), (serde_json::json!(["e1", "e2"]), serde_json::json!(2)));
        let r = d.run(Batch::new().watermark_ms(1100).event("a", "{}"));
        let seen = &r.output_values()[0];
        assert_eq!(seen["v"], serde_json::Value::Null, "the value expires at 1000 + 100");
        assert_eq!((seen["l"].clone(), seen["len"].clone()), (serde_json::json!(["e2"]), serde_json::json!(1)));
        // Everything gone: the key holds nothing.
        d.run(Batch::new().processing_time_ms(90).watermark_ms(1140));
        assert!(d.keys().is_empty(), "{:?}", d.keys());
    }

    #[test]
    fn a_rewrite_renews_an_entry_and_stages_its_index_entries() {
        let mut d = ttl_driver();
        d.run(Batch::new().processing_time_ms(0).event_at("a", 1000, r#"{"put":["k","1"]}"#));
        d.run(Batch::new().processing_time_ms(30).event_at("a", 1000, r#"{"put":["k","2"]}"#));
        let r = d.run(Batch::new().processing_time_ms(60).event("a", "{}"));
        assert_eq!(r.output_values()[0]["m"], serde_json::json!([["k", "2"]]), "renewed at 30, expires at 80");
        // A first write stages the entry and its index entry; a rewrite also removes the old index entry.
        let mut d = ttl_driver().with_state_writes_per_call_max(2);
        assert!(d.run(Batch::new().event("a", r#"{"put":["k","1"]}"#)).errors().is_empty());
        let same = d.run(Batch::new().event("a", r#"{"put":["k","2"]}"#));
        assert!(same.errors().is_empty(), "the same expiry: the same index entry, {:?}", same.errors());
        let r = d.run(Batch::new().processing_time_ms(10).event("a", r#"{"put":["k","3"]}"#));
        assert!(r.errors()[0].1.contains("state_writes_per_call_max (2)"), "{:?}", r.calls);
    }

    #[test]
    fn a_timer_call_writes_at_the_watermark() {
        let mut d = ttl_driver();
        d.key_state("a", |s| s.register_timer(500, None)).unwrap();
        let r = d.run(Batch::new().watermark_ms(600));
        assert_eq!(r.output_values()[0]["v"], "from a timer");
        assert_eq!(d.run(Batch::new().watermark_ms(699).event("a", "{}")).output_values()[0]["v"], "from a timer");
        assert_eq!(
            d.run(Batch::new().watermark_ms(700).event("a", "{}")).output_values()[0]["v"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn bad_variables_are_refused_at_init() {
        assert!(
            check_variables(&[Variable::value("a").with_ttl(Ttl::processing_time(0))])
                .unwrap_err()
                .contains("greater than zero")
        );
        assert!(check_variables(&[Variable::value("a b")]).unwrap_err().contains("ASCII letters"));
        assert!(check_variables(&[Variable::value("a"), Variable::map("a")]).unwrap_err().contains("twice"));
        let zero = check_variables(&[Variable::list("a").with_schema_version(0)]).unwrap_err();
        assert!(zero.contains("schema-version 0"), "{zero}");
        assert!(check_variables(&[Variable::list("a").with_schema_version(7)]).is_ok());
    }
}
