//! `groupstate state` of a 0.2 state dir: every group key's variables (values, list
//! elements, map entries, each with its expiry if it has one) and timers, one JSON
//! line per key, the bytes decoded through the plugin's `render-state` when `--plugin`
//! is given and it answers, in hex otherwise. An entry stored under another layout
//! than its variable's current one (the plugin's declared one, or the first without
//! `--plugin`) shows its `schema_version`, and with `--plugin` is converted through
//! the plugin's `migrate-state` before it is rendered (the store is not changed).

use std::io::Write;

use anyhow::{Result, bail};
use groupstate::codec::hex;
use groupstate::keyed::{StatePart, unpack_entry};
use groupstate::plugin::Plugin;
use groupstate::state_keys::{self as sk, Entry};
use groupstate::store::{KeyRecord, Store};
use serde_json::{Map, Value, json};

/// Renders a variable's bytes: through the plugin when it answers, hex otherwise.
struct Renderer {
    plugin: Option<Plugin>,
}

impl Renderer {
    /// `{field: JSON}` from the plugin, or `{field_hex: "..."}`.
    fn put(&mut self, out: &mut Map<String, Value>, field: &str, variable: &str, part: StatePart, bytes: &[u8]) {
        let rendered = self.plugin.as_mut().and_then(|p| p.render_state(variable, part, bytes));
        match rendered.and_then(|text| serde_json::from_str::<Value>(&text).ok()) {
            Some(value) => drop(out.insert(field.to_owned(), value)),
            None => drop(out.insert(format!("{field}_hex"), Value::String(hex(bytes)))),
        }
    }

    /// [`Self::put`] for bytes stored under layout `stored_schema`. When that is not
    /// the variable's current layout (the plugin's declared one, or the first without
    /// `--plugin`), `schema_version` shows it, and the plugin converts the bytes before
    /// they are rendered (hex of the stored bytes when it cannot).
    fn put_stored(
        &mut self,
        out: &mut Map<String, Value>,
        variable: &str,
        part: StatePart,
        bytes: &[u8],
        stored_schema: u32,
    ) {
        let declared = self
            .plugin
            .as_ref()
            .and_then(|p| p.variables().iter().find(|v| v.name == variable).map(|v| v.schema_version));
        if stored_schema == declared.unwrap_or(1) {
            return self.put(out, "value", variable, part, bytes);
        }
        out.insert("schema_version".into(), stored_schema.into());
        let converted = match (declared, self.plugin.as_mut()) {
            (Some(_), Some(p)) => p.migrate_entry(variable, part, stored_schema, bytes).ok(),
            _ => None,
        };
        match converted {
            Some(converted) => self.put(out, "value", variable, part, &converted),
            None if declared.is_none() => self.put(out, "value", variable, part, bytes),
            None => drop(out.insert("value_hex".into(), Value::String(hex(bytes)))),
        }
    }
}

/// One group key's entries, gathered in store order.
struct KeyView {
    key: String,
    variables: Map<String, Value>,
    timers: Vec<Value>,
}

impl KeyView {
    fn new(key: String) -> Self {
        Self { key, variables: Map::new(), timers: Vec::new() }
    }

    fn variable(&mut self, name: &str, kind: &str) -> &mut Map<String, Value> {
        let slot = self.variables.entry(name.to_owned()).or_insert_with(|| {
            let items = if kind == "value" { Value::Null } else { json!([]) };
            let field = match kind {
                "list" => "elements",
                "map" => "entries",
                _ => "value",
            };
            let mut m = Map::new();
            m.insert("kind".into(), kind.into());
            if kind != "value" {
                m.insert(field.into(), items);
            }
            Value::Object(m)
        });
        slot.as_object_mut().expect("a variable is an object")
    }

    fn into_json(self) -> Value {
        json!({ "key": self.key, "variables": self.variables, "timers": self.timers })
    }
}

fn expiry_fields(out: &mut Map<String, Value>, expiry: Option<groupstate::keyed::Expiry>) {
    if let Some(e) = expiry {
        out.insert("expiry_ms".into(), e.at_ms.into());
        out.insert("expiry_clock".into(), if e.event_time { "event-time" } else { "processing-time" }.into());
    }
}

/// Adds one store entry to its key's view.
fn add(view: &mut KeyView, store_key: &str, entry: Entry, record: &KeyRecord, render: &mut Renderer) -> Result<()> {
    let stored = record.value.as_deref().unwrap_or_default();
    match entry {
        Entry::Value(name) => {
            let (expiry, bytes) = unpack_entry(store_key, stored)?;
            let slot = view.variable(&name, "value");
            render.put_stored(slot, &name, StatePart::Value, bytes, record.schema_version);
            expiry_fields(slot, expiry);
        }
        Entry::ListElement(name, index) => {
            let (expiry, bytes) = unpack_entry(store_key, stored)?;
            let mut element = Map::new();
            element.insert("index".into(), index.into());
            render.put_stored(&mut element, &name, StatePart::ListElement, bytes, record.schema_version);
            expiry_fields(&mut element, expiry);
            push(view.variable(&name, "list"), "elements", element);
        }
        Entry::MapEntry(name, map_key) => {
            let (expiry, bytes) = unpack_entry(store_key, stored)?;
            let mut entry = Map::new();
            render.put(&mut entry, "key", &name, StatePart::MapKey, &map_key);
            render.put_stored(&mut entry, &name, StatePart::MapValue, bytes, record.schema_version);
            expiry_fields(&mut entry, expiry);
            push(view.variable(&name, "map"), "entries", entry);
        }
        Entry::Timer(expiry_ms, name) => view.timers.push(json!({ "expiry_ms": expiry_ms, "name": name })),
        // The list's next index is the host's bookkeeping.
        Entry::ListNext(_) => {}
    }
    Ok(())
}

fn push(variable: &mut Map<String, Value>, field: &str, item: Map<String, Value>) {
    if let Some(Value::Array(items)) = variable.get_mut(field) {
        items.push(Value::Object(item));
    }
}

/// Writes the keys of a 0.2 store (only `key` when given), one JSON line each.
pub fn show_keys(store: &Store, key: Option<&str>, plugin: Option<Plugin>, out: &mut impl Write) -> Result<()> {
    let mut render = Renderer { plugin };
    let mut current: Option<KeyView> = None;
    let mut found = false;
    let entries: Box<dyn Iterator<Item = _>> = match key {
        Some(key) => Box::new(store.reader()?.scan_prefix(&sk::group_prefix(key), usize::MAX - 1)?.into_iter().map(Ok)),
        None => Box::new(store.iter_keys()),
    };
    for entry in entries {
        let (store_key, record) = entry?;
        if sk::parse_expiry_index(&store_key).is_some() {
            continue; // The index is the host's bookkeeping.
        }
        let Some((group, parsed)) = sk::parse(&store_key) else {
            bail!("store key {store_key:?} is not one of 0.2 state: is this a 0.1 state dir?");
        };
        if current.as_ref().is_none_or(|v| v.key != group) {
            if let Some(done) = current.take() {
                writeln!(out, "{}", done.into_json())?;
            }
            current = Some(KeyView::new(group));
        }
        found = true;
        let view = current.as_mut().expect("set above");
        add(view, &store_key, parsed, &record, &mut render)?;
    }
    if let Some(done) = current {
        writeln!(out, "{}", done.into_json())?;
    }
    if let (Some(key), false) = (key, found) {
        bail!("no state for key {key:?}");
    }
    Ok(())
}

/// Writes the timers of a 0.2 store in expiry order, one JSON line each.
pub fn show_timers(store: &Store, out: &mut impl Write) -> Result<()> {
    for entry in store.iter_timers() {
        let (expiry_ms, store_key) = entry?;
        let Some((key, Entry::Timer(_, name))) = sk::parse(&store_key) else {
            bail!("the timer index names {store_key:?}, which is not a 0.2 timer");
        };
        writeln!(out, "{}", json!({ "expiry_ms": expiry_ms, "key": key, "name": name }))?;
    }
    Ok(())
}
