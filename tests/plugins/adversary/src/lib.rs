//! A plugin that misbehaves on request, for the sandbox tests (`tests/it/sandbox.rs`).
//!
//! Each event is a JSON object `{"do": ACTION, "n": N, "path": P}` (besides the key);
//! `do` defaults to `count`. A call first counts its events into the key's state
//! (`state.update`, so the host has a staged change to throw away), emits
//! `{"key": K, "count": C}`, then runs each event's action in order:
//!
//! | action        | what the plugin does                                               |
//! | ------------- | ------------------------------------------------------------------ |
//! | `count`       | nothing more                                                       |
//! | `instance`    | emits `{"instance_calls": N}`, the calls made on this instance     |
//! | `loop`        | spins forever                                                      |
//! | `spin`        | spins `n` times, then goes on (a call that is slow, not stuck)     |
//! | `alloc`       | allocates 1 MiB blocks forever                                     |
//! | `recurse`     | recurses forever (the wasm stack overflows)                        |
//! | `stack-data`  | recurses forever with a buffer per frame (the data stack that Rust |
//! |               | keeps in linear memory overflows)                                  |
//! | `panic`       | panics                                                             |
//! | `exit`        | calls `std::process::exit(3)`                                      |
//! | `fail`        | returns an error                                                   |
//! | `sleep`       | sleeps `n` seconds (default: an hour), emits `{"slept": true}`     |
//! | `big-state`   | stores an `n`-byte state, emits what `update` said                 |
//! | `outputs`     | emits `n` more outputs                                             |
//! | `long-output` | emits one JSON string of `n` bytes                                 |
//! | `print`       | writes a line to stdout and to stderr, then `n` bytes to stdout    |
//! | `log`         | writes `n` messages through the `log` interface                    |
//! | `probe`       | tries files (writing `path`), environment, arguments, clocks       |
//!
//! With the parameter `on_init=loop|panic`, `init` misbehaves instead.

use std::hint::black_box;
use std::io::Write;

use groupstate_sdk::{Error, Event, GroupState, Params, PluginInfo, StateFunction, log};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The plugin: counts the calls made on this instance (a fresh instance starts at 0).
pub struct Adversary {
    calls: u64,
}

/// One event: what to do.
#[derive(Deserialize)]
pub struct Order {
    #[serde(rename = "do", default = "count")]
    action: String,
    #[serde(default)]
    n: u64,
    #[serde(default)]
    path: String,
}

fn count() -> String {
    "count".to_owned()
}

/// A key's state: the events counted so far, and whatever `big-state` stored.
#[derive(Serialize, Deserialize, Default)]
pub struct Tally {
    events: u64,
    blob: Vec<u8>,
}

impl StateFunction for Adversary {
    type Key = String;
    type Event = Order;
    type State = Tally;
    type Output = Value;

    fn info() -> PluginInfo {
        PluginInfo { name: "adversary", version: env!("CARGO_PKG_VERSION"), state_schema_version: 1 }
    }

    fn init(params: &Params) -> Result<Self, Error> {
        params.reject_unknown(&["on_init"])?;
        match params.get_str("on_init") {
            Some("loop") => spin(),
            Some("panic") => panic!("adversary: panic in init"),
            _ => Ok(Adversary { calls: 0 }),
        }
    }

    fn process(
        &mut self,
        key: &String,
        events: Vec<Event<Order>>,
        state: &mut GroupState<'_, Tally>,
    ) -> Result<Vec<Value>, Error> {
        self.calls += 1;
        let mut tally = state.get()?.unwrap_or_default();
        tally.events += events.len() as u64;
        state.update(&tally)?;
        let mut outputs = vec![json!({ "key": key, "count": tally.events })];
        for event in &events {
            self.act(key, &event.value, &mut tally, state, &mut outputs)?;
        }
        Ok(outputs)
    }
}

impl Adversary {
    fn act(
        &self,
        key: &str,
        order: &Order,
        tally: &mut Tally,
        state: &mut GroupState<'_, Tally>,
        outputs: &mut Vec<Value>,
    ) -> Result<(), Error> {
        let n = order.n;
        match order.action.as_str() {
            "count" => {}
            "instance" => outputs.push(json!({ "instance_calls": self.calls })),
            "loop" => spin(),
            "spin" => {
                let mut x = 0u64;
                for _ in 0..n {
                    x = black_box(x.wrapping_add(1));
                }
            }
            "alloc" => allocate_forever(),
            "recurse" => {
                black_box(recurse(black_box(u64::MAX)));
            }
            "stack-data" => {
                black_box(recurse_with_buffers(black_box(u64::MAX)));
            }
            "panic" => panic!("adversary: panic on key {key}"),
            "exit" => std::process::exit(3),
            "fail" => return Err(Error::msg(format_args!("adversary: refusing key {key}"))),
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(if n == 0 { 3600 } else { n }));
                outputs.push(json!({ "slept": true }));
            }
            "big-state" => {
                tally.blob = vec![7; n as usize];
                match state.update(tally) {
                    Ok(()) => outputs.push(json!({ "updated": n })),
                    Err(e) => outputs.push(json!({ "update_error": e.to_string() })),
                }
            }
            "outputs" => outputs.extend((0..n).map(|i| json!({ "i": i }))),
            "long-output" => outputs.push(Value::String("x".repeat(n as usize))),
            "print" => print(key, n),
            "log" => (0..n).for_each(|i| log::info!("message {i} for {key}")),
            "probe" => outputs.push(probe(&order.path)),
            other => return Err(Error::msg(format_args!("adversary: unknown action {other:?}"))),
        }
        Ok(())
    }
}

fn spin() -> ! {
    let mut x = 0u64;
    loop {
        x = black_box(x.wrapping_add(1));
    }
}

fn allocate_forever() -> ! {
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    loop {
        blocks.push(vec![1; 1 << 20]);
        black_box(&blocks);
    }
}

/// Plain recursion: wasm locals only, on the wasm stack (`wasm_stack_bytes_max`). The
/// rotate-xor keeps LLVM from turning it into a loop.
fn recurse(depth: u64) -> u64 {
    if depth == 0 { 1 } else { recurse(depth - 1).rotate_left(7) ^ depth }
}

/// Each frame holds a 256-byte buffer, which Rust keeps on its data stack in linear
/// memory, below the plugin's static data.
fn recurse_with_buffers(depth: u64) -> u64 {
    let buf = black_box([depth as u8; 256]);
    if depth == 0 { 0 } else { recurse_with_buffers(depth - 1).wrapping_add(u64::from(buf[255])) }
}

fn print(key: &str, n: u64) {
    println!("hello on stdout from {key}");
    eprintln!("hello on stderr from {key}");
    let line = [b'x'; 99];
    let mut out = std::io::stdout().lock();
    for _ in 0..n / 100 {
        // A full stdout is the host's business: it drops and counts, never errors.
        let _ = out.write_all(&line).and_then(|()| out.write_all(b"\n"));
    }
}

/// What the sandbox lets the plugin see: every capability should be missing.
#[allow(clippy::disallowed_methods)] // The point is to read the (virtual) clock.
fn probe(path: &str) -> Value {
    let err = |r: std::io::Result<()>| r.err().map(|e| e.to_string());
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    json!({
        "read_error": err(std::fs::read("/etc/passwd").map(drop)),
        "write_error": err(std::fs::write(path, b"escaped")),
        "list_error": err(std::fs::read_dir("/").map(drop)),
        "env_vars": std::env::vars().count(),
        "home": std::env::var("HOME").ok(),
        "args": std::env::args().count(),
        "cwd": std::env::current_dir().ok().map(|p| p.display().to_string()),
        "now_ms": now_ms,
    })
}

groupstate_sdk::export_plugin!(Adversary);
