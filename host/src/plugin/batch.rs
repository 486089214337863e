//! Many `process` calls in one crossing of the sandbox boundary: a plugin of the world
//! `state-function-batched` exports `process-batch`, which takes the calls encoded in
//! one buffer and returns their outcomes in another (the layout is in the WIT), and
//! keeps each call's group-state itself. A `process` call crosses the boundary some
//! ten times (the call, an allocation in the plugin for the key, the event list and
//! each payload, the state handle's `get`, `update` and timeout, the handle's drop);
//! a batch crosses it three times, plus one `begin-call` per call, through which the
//! host gives each call what a `process` call gets: its own CPU time limit, virtual
//! clock and random stream, and log lines tagged with its key.
//!
//! A batch is an optimisation, never a change of meaning: what the plugin returns is
//! checked against the same limits as a `process` call's, and a batch that traps, or
//! whose result does not read, is redone key by key with `process` on a fresh
//! instance, so that each call's outcome, error or trap is its own.

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, TypedFunc};

use super::output::Activity;
use super::{
    CallError, CallOutcome, CallRequest, HostState, Plugin, StagedValue, check_outputs, clip_message, set_deadline,
};
use crate::config::{Limits, TimeoutKind};

/// The export, as its type is checked once per instance.
pub(super) type ProcessBatch = TypedFunc<(&'static [u8],), (Vec<u8>,)>;

/// The name of the export.
const EXPORT: &str = "process-batch";

/// The host interface the plugin calls between the calls of a batch.
const BATCH_INTERFACE: &str = "groupstate:plugin/batch@0.1.0";

/// The layout of the input this host writes (the WIT's version byte).
const VERSION: u8 = 1;

/// The input bytes one batch carries at most (a call with more goes alone).
const INPUT_BYTES_MAX: usize = 1 << 20;

/// The export of an instance, if its component has one of the right type.
pub(super) fn export(
    store: &mut wasmtime::Store<HostState>,
    instance: &wasmtime::component::Instance,
) -> Option<ProcessBatch> {
    instance.get_export_index(&mut *store, None, EXPORT)?;
    instance.get_typed_func(store, EXPORT).ok()
}

/// Adds `begin-call` to the linker.
pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker
        .instance(BATCH_INTERFACE)?
        .func_wrap("begin-call", |store: StoreContextMut<'_, HostState>, (index,): (u32,)| begin_call(store, index))
}

/// The batch running in an instance: which call's turn it is, and what each call needs
/// when its turn starts.
pub(super) struct Turns {
    /// The keys of the calls, one after the other.
    keys: String,
    /// Where each key ends in `keys`.
    ends: Vec<usize>,
    /// The call whose turn is next.
    next: usize,
    batch_id: u64,
    processing_time_ms: i64,
    deadline_ticks: Option<u64>,
}

impl Turns {
    fn key(&self, index: usize) -> &str {
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        &self.keys[start..self.ends[index]]
    }
}

/// `begin-call(index)`: ends the previous call's turn (its log lines go out tagged with
/// its key) and starts the next one's.
fn begin_call(mut store: StoreContextMut<'_, HostState>, index: u32) -> wasmtime::Result<()> {
    let state = store.data_mut();
    let Some(turns) = &mut state.batch else {
        return Err(wasmtime::Error::msg("begin-call outside process-batch"));
    };
    if usize::try_from(index).ok() != Some(turns.next) || turns.next == turns.ends.len() {
        return Err(wasmtime::Error::msg(format!(
            "begin-call({index}) out of order: the next call of the batch is {} of {}",
            turns.next,
            turns.ends.len()
        )));
    }
    if turns.next > 0 {
        state.log.flush(Activity::Key(turns.key(turns.next - 1)));
    }
    state.env.prepare_call(turns.processing_time_ms, turns.batch_id, turns.key(turns.next));
    turns.next += 1;
    let ticks = turns.deadline_ticks;
    set_deadline(&mut store, ticks);
    Ok(())
}

impl Plugin {
    /// The `process-batch` calls whose outcomes were used (a batch redone one by one
    /// does not count).
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Calls `process` for each request, in order, as [`Plugin::call`] would, through
    /// `process-batch` where the plugin exports it.
    pub fn call_many(&mut self, kind: TimeoutKind, reqs: &[CallRequest<'_>]) -> Vec<Result<CallOutcome, CallError>> {
        let mut outcomes = Vec::with_capacity(reqs.len());
        let mut rest = reqs;
        while !rest.is_empty() {
            // Without the export, the rest goes one by one, its input never encoded.
            let (chunk, batched) = match self.batch_export() {
                Some(process_batch) => {
                    let limits = &self.recipe.limits;
                    let (input, count) = encode(kind, rest, limits.state_bytes_max, limits.batch_calls_max);
                    let chunk = &rest[..count];
                    (chunk, (count > 1).then(|| self.call_batch(process_batch, kind, chunk, &input)).flatten())
                }
                None => (rest, None),
            };
            match batched {
                Some(batch) => outcomes.extend(batch),
                None => outcomes.extend(chunk.iter().map(|req| self.call(kind, req))),
            }
            rest = &rest[chunk.len()..];
        }
        outcomes
    }

    /// The live instance's `process-batch`, unless the component has none, its
    /// results once did not read, or `batch_calls_max` is 1.
    fn batch_export(&mut self) -> Option<ProcessBatch> {
        if self.batch_unreadable || self.recipe.limits.batch_calls_max < 2 {
            return None;
        }
        match self.live().ok()?.bindings {
            super::Bindings::V1(_, _, process_batch) => process_batch,
            super::Bindings::V2(..) => None,
        }
    }

    /// One `process-batch` call; `None` when the batch failed and must be redone key
    /// by key.
    fn call_batch(
        &mut self,
        process_batch: ProcessBatch,
        kind: TimeoutKind,
        reqs: &[CallRequest<'_>],
        input: &[u8],
    ) -> Option<Vec<Result<CallOutcome, CallError>>> {
        let ticks = self.deadline_ticks();
        let live = self.live().ok()?;
        let (mut keys, mut ends) = (String::new(), Vec::with_capacity(reqs.len()));
        for req in reqs {
            keys.push_str(req.key);
            ends.push(keys.len());
        }
        let first = &reqs[0];
        live.store.data_mut().batch = Some(Turns {
            keys,
            ends,
            next: 0,
            batch_id: first.batch_id,
            processing_time_ms: first.processing_time_ms,
            deadline_ticks: ticks,
        });
        set_deadline(&mut live.store, ticks);
        let log = live.store.data().log.clone();
        log.hold();
        let result = process_batch.call(&mut live.store, (input,));
        let turns = live.store.data_mut().batch.take();
        if let Some(turns) = turns.as_ref().filter(|t| t.next > 0) {
            log.flush(Activity::Key(turns.key(turns.next - 1)));
        }
        let called_all = turns.is_some_and(|t| t.next == reqs.len());
        let outcomes = self.batch_outcomes(result, called_all, kind, reqs);
        // A batch redone call by call logs again as it goes.
        log.release(outcomes.is_some());
        outcomes
    }

    /// The outcomes of a `process-batch` call, or `None` when it must be redone.
    fn batch_outcomes(
        &mut self,
        result: wasmtime::Result<(Vec<u8>,)>,
        called_all: bool,
        kind: TimeoutKind,
        reqs: &[CallRequest<'_>],
    ) -> Option<Vec<Result<CallOutcome, CallError>>> {
        match result {
            Ok((output,)) if called_all => match decode(&output, kind, reqs, &self.recipe.limits) {
                Ok(outcomes) => {
                    self.batches += 1;
                    Some(outcomes)
                }
                Err(why) => {
                    tracing::warn!(
                        "plugin {}: its process-batch result does not read ({why}); its keys are called one by one from now on",
                        self.info.name
                    );
                    self.batch_unreadable = true;
                    None
                }
            },
            Ok(_) => {
                tracing::warn!(
                    "plugin {}: process-batch returned before calling begin-call for each call; its keys are called one by one from now on",
                    self.info.name
                );
                self.batch_unreadable = true;
                None
            }
            Err(_) => {
                // The trap is the plugin's, in one of the calls: redone one by one, that
                // call traps again and is reported as its own.
                self.live = None;
                None
            }
        }
    }
}

/// Encodes the first requests of `reqs` (at least one, at most `calls_max` and about
/// [`INPUT_BYTES_MAX`]) as the input of `process-batch`; returns it and how many.
fn encode(kind: TimeoutKind, reqs: &[CallRequest<'_>], state_bytes_max: u64, calls_max: usize) -> (Vec<u8>, usize) {
    let first = &reqs[0];
    let mut out = Vec::with_capacity(INPUT_BYTES_MAX.min(4096 * reqs.len().min(calls_max)));
    out.push(VERSION);
    out.push(match kind {
        TimeoutKind::None => 0,
        TimeoutKind::ProcessingTime => 1,
        TimeoutKind::EventTime => 2,
    });
    out.extend_from_slice(&first.watermark_ms.to_le_bytes());
    out.extend_from_slice(&first.processing_time_ms.to_le_bytes());
    out.extend_from_slice(&state_bytes_max.to_le_bytes());
    let count_at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut count = 0;
    for req in reqs.iter().take(calls_max) {
        if count > 0 && out.len() >= INPUT_BYTES_MAX {
            break;
        }
        put_bytes(&mut out, req.key.as_bytes());
        match req.state {
            Some(value) => {
                out.push(1);
                put_bytes(&mut out, value);
            }
            None => out.push(0),
        }
        out.push(u8::from(req.has_timed_out));
        put_len(&mut out, req.events.len());
        for event in req.events {
            match event.event_time_ms {
                Some(ms) => {
                    out.push(1);
                    out.extend_from_slice(&ms.to_le_bytes());
                }
                None => out.push(0),
            }
            put_bytes(&mut out, event.payload.as_bytes());
        }
        count += 1;
    }
    out[count_at..count_at + 4].copy_from_slice(&(count as u32).to_le_bytes());
    (out, count)
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    // Keys, values and payloads are far below 4 GiB: the store, `state_bytes_max` and
    // `line_bytes_max` bound them.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// Reads the outcomes of `reqs` from a `process-batch` result, each checked as a
/// `process` call's is. `Err` says why the result does not read as a whole.
fn decode(
    output: &[u8],
    kind: TimeoutKind,
    reqs: &[CallRequest<'_>],
    limits: &Limits,
) -> Result<Vec<Result<CallOutcome, CallError>>, String> {
    let mut input = Reader { bytes: output, at: 0 };
    let mut outcomes = Vec::with_capacity(reqs.len());
    for req in reqs {
        let outcome = match input.u8()? {
            0 => {
                let value = match input.option(Reader::bytes)? {
                    Some(value) => StagedValue::Updated(value.to_vec()),
                    None => StagedValue::Removed,
                };
                let timeout_ms = input.option(Reader::i64)?;
                let count = input.u32()? as usize;
                let mut outputs = Vec::with_capacity(count.min(limits.outputs_per_call_max.saturating_add(1)));
                for _ in 0..count {
                    let text =
                        std::str::from_utf8(input.bytes()?).map_err(|e| format!("an output is not UTF-8 ({e})"))?;
                    outputs.push(text.to_owned());
                }
                checked(CallOutcome { value, timeout_ms, outputs }, kind, req, limits)
            }
            1 => {
                let message = String::from_utf8_lossy(input.bytes()?);
                Err(CallError::Returned(clip_message(&message)))
            }
            tag => return Err(format!("outcome tag {tag}")),
        };
        outcomes.push(outcome);
    }
    if input.at != output.len() {
        return Err(format!("{} bytes after the last outcome", output.len() - input.at));
    }
    Ok(outcomes)
}

/// A batch call's outcome, held to what the host's group-state handle allows a
/// `process` call: a value within `state_bytes_max`, a timeout its setters could set.
fn checked(
    outcome: CallOutcome,
    kind: TimeoutKind,
    req: &CallRequest<'_>,
    limits: &Limits,
) -> Result<CallOutcome, CallError> {
    if let StagedValue::Updated(value) = &outcome.value
        && value.len() as u64 > limits.state_bytes_max
    {
        return Err(CallError::BadResult(format!(
            "process-batch returned a state value of {} bytes, over state_bytes_max ({})",
            value.len(),
            limits.state_bytes_max
        )));
    }
    if let Some(deadline) = outcome.timeout_ms {
        let settable = match kind {
            TimeoutKind::None => false,
            TimeoutKind::ProcessingTime => deadline > req.processing_time_ms,
            TimeoutKind::EventTime => deadline > 0 && deadline >= req.watermark_ms,
        };
        if !settable {
            return Err(CallError::BadResult(format!(
                "process-batch returned a timeout at {deadline}, which a {kind:?} pipeline's group-state does not allow (watermark {}, processing time {})",
                req.watermark_ms, req.processing_time_ms
            )));
        }
    }
    let outputs = check_outputs(outcome.outputs, limits)?;
    Ok(CallOutcome { outputs, ..outcome })
}

/// Reads a `process-batch` result; the plugin wrote it, so every read is checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let taken = self.bytes.get(self.at..self.at.saturating_add(n));
        let taken =
            taken.ok_or_else(|| format!("it ends at byte {}, before byte {}", self.bytes.len(), self.at + n))?;
        self.at += n;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i64(&mut self) -> Result<i64, String> {
        let mut array = [0; 8];
        array.copy_from_slice(self.take(8)?);
        Ok(i64::from_le_bytes(array))
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    fn option<T>(&mut self, read: impl FnOnce(&mut Self) -> Result<T, String>) -> Result<Option<T>, String> {
        match self.u8()? {
            0 => Ok(None),
            1 => read(self).map(Some),
            flag => Err(format!("option flag {flag}")),
        }
    }
}
