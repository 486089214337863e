//! `process-batch`: many `process` calls in one crossing of the sandbox boundary (the
//! WIT world `state-function-batched`). Each call runs on a group-state the plugin keeps
//! itself, staged by the same rules as the host's handle ([`TestState`]), so a plugin
//! behaves the same whichever way the host calls it. Used by
//! [`export_plugin!`](crate::export_plugin).

use crate::export::run_process;
use crate::testing::TestState;
use crate::{FromKey, GroupState, StateFunction, TimeoutKind, wit};

/// The layout of the `calls` argument this SDK reads.
const VERSION: u8 = 1;

/// Runs the encoded calls on `instance` in order and returns their encoded outcomes
/// (the layout is in the WIT world `state-function-batched`). Input the host should
/// never send (another version, a truncated buffer) traps: the host then makes the
/// calls one by one.
pub fn process_batch<T: StateFunction>(mut instance: Option<&mut T>, calls: &[u8]) -> Vec<u8> {
    let mut input = Reader { bytes: calls, at: 0 };
    let version = input.u8();
    assert!(version == VERSION, "process-batch input version {version}, this SDK reads {VERSION}");
    let kind = match input.u8() {
        0 => TimeoutKind::None,
        1 => TimeoutKind::ProcessingTime,
        2 => TimeoutKind::EventTime,
        other => panic!("process-batch input: unknown timeout kind {other}"),
    };
    let (watermark_ms, processing_time_ms, state_bytes_max) = (input.i64(), input.i64(), input.u64());
    let count = input.u32();
    // An outcome without outputs takes about 40 bytes.
    let mut out = Vec::with_capacity(count as usize * 64);
    // One vector for every call's events (most calls over many keys have one or two),
    // one key and one state whose buffers each call refills.
    let mut events = Vec::new();
    let mut key_slot: Option<T::Key> = None;
    let mut state = TestState::new(kind).with_state_bytes_max(state_bytes_max);
    state.watermark_ms = watermark_ms;
    state.processing_time_ms = processing_time_ms;
    for index in 0..count {
        wit::groupstate::plugin::batch::begin_call(index);
        let key = input.str();
        let value = input.option(Reader::bytes);
        let timed_out = input.u8() != 0;
        let events_count = input.u32() as usize;
        events.clear();
        events.reserve(events_count);
        for _ in 0..events_count {
            let time_ms = input.option(Reader::i64);
            events.push((time_ms, input.str()));
        }
        let Some(instance) = instance.as_deref_mut() else {
            write_err(&mut out, crate::export::NOT_INITIALISED);
            continue;
        };
        let key = match T::Key::refill(&mut key_slot, key) {
            Ok(key) => key,
            Err(error) => {
                write_err(&mut out, &error.call_message());
                continue;
            }
        };
        state.refill_value(value);
        state.begin_call(timed_out);
        match run_process(instance, key, events.drain(..), GroupState::from_test(&mut state)) {
            Ok(outputs) => {
                out.push(0);
                write_option(&mut out, state.value_bytes(), write_bytes);
                write_option(&mut out, state.timeout_ms(), |out, deadline| {
                    out.extend_from_slice(&deadline.to_le_bytes())
                });
                write_u32(&mut out, outputs.len());
                for output in &outputs {
                    write_bytes(&mut out, output.as_bytes());
                }
            }
            Err(error) => write_err(&mut out, &String::from(error)),
        }
    }
    out
}

fn write_err(out: &mut Vec<u8>, message: &str) {
    out.push(1);
    write_bytes(out, message.as_bytes());
}

fn write_option<T>(out: &mut Vec<u8>, value: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    match value {
        Some(value) => {
            out.push(1);
            write(out, value);
        }
        None => out.push(0),
    }
}

fn write_u32(out: &mut Vec<u8>, n: usize) {
    let n = u32::try_from(n).unwrap_or_else(|_| panic!("process-batch: {n} does not fit the u32 of the layout"));
    out.extend_from_slice(&n.to_le_bytes());
}

fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    write_u32(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// Reads the `calls` buffer; the host wrote it, so a short read is its bug and traps.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let Some(taken) = self.bytes.get(self.at..self.at.saturating_add(n)) else {
            panic!("process-batch input ends at byte {} of {}", self.bytes.len(), self.at.saturating_add(n));
        };
        self.at += n;
        taken
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut array = [0; N];
        array.copy_from_slice(self.take(N));
        array
    }

    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.array())
    }

    fn bytes(&mut self) -> &'a [u8] {
        let len = self.u32() as usize;
        self.take(len)
    }

    fn str(&mut self) -> &'a str {
        let bytes = self.bytes();
        std::str::from_utf8(bytes)
            .unwrap_or_else(|e| panic!("process-batch input: a key or payload is not UTF-8 ({e})"))
    }

    fn option<T>(&mut self, read: impl FnOnce(&mut Self) -> T) -> Option<T> {
        (self.u8() != 0).then(|| read(self))
    }
}
