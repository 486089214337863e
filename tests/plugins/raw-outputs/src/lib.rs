//! A plugin that returns results the SDK would never produce, for the sandbox tests
//! (`tests/it/sandbox.rs`). It implements the generated WIT bindings directly.
//!
//! The first event of a call says what `process` returns:
//!
//! | event                                   | result                                       |
//! | --------------------------------------- | -------------------------------------------- |
//! | `{"do": "text", "text": T}`             | `ok([T])`: one output that need not be JSON  |
//! | `{"do": "alias", "copies": C, "bytes": B}` | `ok` with C outputs that all point at the same B-byte JSON string in the plugin's memory, so the host would copy C × B bytes out of B bytes |
//! | `{"do": "error", "bytes": B}`           | `err` with a B-byte message                  |
//! | anything else                           | `ok([])`                                     |
//!
//! Its `process-batch` returns a byte that reads as no outcome, so the host makes every
//! call with `process` (the tests of that fallback use it too).

use std::alloc::{GlobalAlloc, Layout, System};

use groupstate_sdk::wit;
use serde::Deserialize;

/// Never frees: after an aliased result, the bindings free the shared buffer once per
/// copy, which would corrupt a real allocator. The plugin lives for a few calls.
struct NeverFree;

// SAFETY: allocation is System's; not freeing is always sound.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for NeverFree {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract, passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}
}

#[global_allocator]
static ALLOCATOR: NeverFree = NeverFree;

struct RawOutputs;

#[derive(Deserialize, Default)]
struct Order {
    #[serde(rename = "do", default)]
    action: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    copies: usize,
    #[serde(default)]
    bytes: usize,
}

impl wit::Guest for RawOutputs {
    fn info() -> wit::PluginInfo {
        wit::PluginInfo {
            name: "raw-outputs".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            state_schema_version: 1,
        }
    }

    fn init(_params: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn process(_key: String, events: Vec<wit::Event>, _state: &wit::GroupState) -> Result<Vec<String>, String> {
        let order: Order = events.first().and_then(|e| serde_json::from_str(&e.payload).ok()).unwrap_or_default();
        match order.action.as_str() {
            "text" => Ok(vec![order.text]),
            "alias" => Ok(aliased(order.copies, order.bytes)),
            "error" => Err("e".repeat(order.bytes)),
            _ => Ok(Vec::new()),
        }
    }

    fn process_batch(_calls: Vec<u8>) -> Vec<u8> {
        vec![7]
    }

    fn migrate_state(_from_version: u32, value: Vec<u8>) -> Result<Vec<u8>, String> {
        Ok(value)
    }
}

/// `copies` strings sharing one `bytes`-byte buffer holding a JSON string. The
/// canonical ABI lowers each as (pointer, length), so the list costs the plugin 8 bytes
/// per copy while a host that copied it out would allocate `bytes` per copy.
#[allow(unsafe_code)]
fn aliased(copies: usize, bytes: usize) -> Vec<String> {
    let text = format!("\"{}\"", "a".repeat(bytes.saturating_sub(2)));
    let mut text = std::mem::ManuallyDrop::new(text);
    let (ptr, len, capacity) = (text.as_mut_ptr(), text.len(), text.capacity());
    // SAFETY: deliberately not: every String claims the same buffer. The plugin never
    // touches them again: the bindings only read (pointer, length) to build the
    // result, and then "free" each copy, which `NeverFree` ignores.
    (0..copies).map(|_| unsafe { String::from_raw_parts(ptr, len, capacity) }).collect()
}

wit::export!(RawOutputs with_types_in groupstate_sdk::wit);
