//! The sandbox against plugins that misbehave on purpose (`tests/plugins/adversary`,
//! `raw-outputs`, `socket-probe`): each test names what the host must do and would
//! fail if that protection were missing. Limits are small so that every test is fast.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use groupstate::config::{ErrorPolicy, Limits, PipelineConfig, Stream, TimeoutKind};
use groupstate::plugin::{CallError, CallOutcome, CallRequest, Event, Plugin, PluginError, Runtime, StagedValue};
use groupstate::{ManualClock, Pipeline};
use groupstate_tests::{cache_dir, plugins, run_and_inspect};
use serde_json::{Value, json};

use super::cli::groupstate_bin;

const NOW_MS: i64 = 1_800_000_000_000;

/// Small limits: a runaway call is stopped after 100 ms, an instance grows to 32 MiB.
fn test_limits() -> Limits {
    Limits { call_cpu_ms_max: 100, instance_memory_bytes_max: 32 << 20, ..Limits::default() }
}

/// Loads `path` the way `Pipeline::open` does: the `Runtime` is gone before the first
/// call, so the CPU limit must not depend on it staying alive.
fn load(path: &str, limits: &Limits, params: &[(&str, &str)]) -> Result<Plugin, PluginError> {
    let runtime = Runtime::new(limits, Some(&cache_dir())).expect("runtime");
    let params: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    runtime.load(Path::new(path), &params)
}

fn adversary(limits: &Limits) -> Plugin {
    load(plugins::ADVERSARY, limits, &[]).unwrap_or_else(|e| panic!("load adversary: {e}"))
}

/// One `process` call for `key` with these event payloads and no prior state.
fn call(plugin: &mut Plugin, key: &str, payloads: &[Value]) -> Result<CallOutcome, CallError> {
    let payloads: Vec<String> = payloads.iter().map(Value::to_string).collect();
    let events: Vec<Event<'_>> = payloads.iter().map(|p| Event { event_time_ms: None, payload: p }).collect();
    let req = CallRequest {
        batch_id: 1,
        key,
        events: &events,
        state: None,
        has_timed_out: false,
        watermark_ms: 0,
        processing_time_ms: NOW_MS,
    };
    plugin.call(TimeoutKind::None, &req)
}

/// One [`Plugin::call_many`] with a call per entry of `calls` (keys `k0`, `k1`, ...),
/// each with those event payloads and no prior state.
fn call_many(plugin: &mut Plugin, calls: &[&[Value]]) -> Vec<Result<CallOutcome, CallError>> {
    let payloads: Vec<Vec<String>> = calls.iter().map(|c| c.iter().map(Value::to_string).collect()).collect();
    let events: Vec<Vec<Event<'_>>> = payloads
        .iter()
        .map(|payloads| payloads.iter().map(|p| Event { event_time_ms: None, payload: p }).collect())
        .collect();
    let keys: Vec<String> = (0..calls.len()).map(|i| format!("k{i}")).collect();
    let reqs: Vec<CallRequest<'_>> = keys
        .iter()
        .zip(&events)
        .map(|(key, events)| CallRequest {
            batch_id: 1,
            key,
            events,
            state: None,
            has_timed_out: false,
            watermark_ms: 0,
            processing_time_ms: NOW_MS,
        })
        .collect();
    plugin.call_many(TimeoutKind::None, &reqs)
}

/// The adversary's order to do `action`.
fn order(action: &str) -> Value {
    json!({ "do": action })
}

fn trap_message(result: Result<CallOutcome, CallError>) -> String {
    match result {
        Err(CallError::Trap(message)) => message,
        other => panic!("expected a trap, got {}", describe(&other)),
    }
}

fn bad_result_message(result: Result<CallOutcome, CallError>) -> String {
    match result {
        Err(CallError::BadResult(message)) => message,
        other => panic!("expected a refused result, got {}", describe(&other)),
    }
}

/// A call's result in a few words (outputs may be megabytes).
fn describe(result: &Result<CallOutcome, CallError>) -> String {
    match result {
        Ok(outcome) => {
            format!("ok with outputs of {:?} bytes", outcome.outputs.iter().map(String::len).collect::<Vec<_>>())
        }
        Err(e) => format!("{e:?}"),
    }
}

/// Makes the call on another thread and waits at most a minute: a plugin that blocks
/// the host fails the test instead of hanging it.
fn call_or_hang(mut plugin: Plugin, payload: Value) -> (Plugin, Result<CallOutcome, CallError>) {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = call(&mut plugin, "k", &[payload]);
        let _ = done.send((plugin, result));
    });
    result.recv_timeout(Duration::from_secs(60)).expect("the plugin blocked the host for a minute")
}

/// The outputs of a call that must succeed, parsed.
fn outputs(result: Result<CallOutcome, CallError>) -> Vec<Value> {
    let outcome = result.unwrap_or_else(|e| panic!("call failed: {e}"));
    outcome.outputs.iter().map(|o| serde_json::from_str(o).expect("json output")).collect()
}

/// The calls made on the plugin's current instance, this one included.
fn instance_calls(plugin: &mut Plugin) -> u64 {
    outputs(call(plugin, "i", &[order("instance")]))[1]["instance_calls"].as_u64().expect("instance_calls")
}

/// A trap must leave the plugin usable: the next call works on a fresh instance.
fn assert_recovers(plugin: &mut Plugin) {
    assert_eq!(outputs(call(plugin, "k", &[order("count")])), [json!({ "key": "k", "count": 1 })]);
    assert_eq!(instance_calls(plugin), 2, "the instance after a trap must be a fresh one");
}

#[test]
fn a_batch_of_calls_comes_to_what_the_calls_one_by_one_come_to() {
    // The same plugin twice: one instance takes its calls through process-batch, the
    // other one by one through process.
    let mut batched = adversary(&test_limits());
    let mut single = adversary(&Limits { batch_calls_max: 1, ..test_limits() });
    let outputs_order = json!({ "do": "outputs", "n": 3 });
    let big_state = json!({ "do": "big-state", "n": 64 });
    let calls: [&[Value]; 5] =
        [&[order("count"), order("count")], &[order("fail")], &[big_state], &[order("probe")], &[outputs_order]];
    let (b, s) = (call_many(&mut batched, &calls), call_many(&mut single, &calls));
    assert_eq!(b, s);
    assert!(matches!(b[1], Err(CallError::Returned(_))), "{}", describe(&b[1]));
    assert!([0, 2, 3, 4].iter().all(|&i| b[i].is_ok()), "{:?}", b.iter().map(describe).collect::<Vec<_>>());
    assert_eq!((batched.batches(), single.batches()), (1, 0));

    // A trap, a runaway and a panic in the middle of a batch are each one call's own:
    // the batch is redone call by call, so the calls around them succeed, as they do
    // one by one, and each gets its own CPU time limit.
    for bad in ["panic", "loop", "alloc"] {
        let calls: [&[Value]; 3] = [&[order("count")], &[order("count"), order(bad)], &[order("count")]];
        let (b, s) = (call_many(&mut batched, &calls), call_many(&mut single, &calls));
        assert_eq!(b, s, "{bad}");
        assert!(b[0].is_ok() && b[2].is_ok(), "{bad}: {:?}", b.iter().map(describe).collect::<Vec<_>>());
        let trap = trap_message(b[1].clone());
        let cause = match bad {
            "panic" => "adversary: panic on key k1",
            "loop" => "CPU time limit exceeded",
            _ => "instance_memory_bytes_max",
        };
        assert!(trap.contains(cause), "{bad}: {trap}");
    }
    assert_eq!(batched.batches(), 1, "a trapped batch is redone one by one, not used");
    let calls: [&[Value]; 2] = [&[order("count")], &[order("count")]];
    assert_eq!(call_many(&mut batched, &calls), call_many(&mut single, &calls));
    assert_eq!(batched.batches(), 2, "after a trap the next batch goes through process-batch again");
}

#[test]
fn each_call_of_a_batch_has_its_own_cpu_time_limit() {
    let limits = Limits { call_cpu_ms_max: 500, ..test_limits() };
    let mut plugin = adversary(&limits);
    // Spins that take about 100 ms a call, measured here; eight of them in one batch
    // take 800 ms, more than the limit of one call.
    let probe_spins = 20_000_000u64;
    let clock = groupstate::SystemClock;
    let started = groupstate::Clock::monotonic_ns(&clock);
    call(&mut plugin, "k", &[json!({ "do": "spin", "n": probe_spins })]).expect("a short spin");
    let elapsed_ns = groupstate::Clock::monotonic_ns(&clock) - started;
    let per_spin_ns = (elapsed_ns as f64 / probe_spins as f64).max(0.01);
    let spin = json!({ "do": "spin", "n": (100e6 / per_spin_ns) as u64 });
    let calls: Vec<&[Value]> = vec![std::slice::from_ref(&spin); 8];
    for (i, outcome) in call_many(&mut plugin, &calls).iter().enumerate() {
        assert!(outcome.is_ok(), "call {i}: {}", describe(outcome));
    }
    assert_eq!(plugin.batches(), 1, "the batch ran whole: each call had its own limit");
}

#[test]
fn a_batch_result_that_does_not_read_is_redone_call_by_call() {
    // raw-outputs' process-batch returns one byte that reads as nothing.
    let mut raw = load(plugins::RAW_OUTPUTS, &test_limits(), &[]).expect("load raw-outputs");
    let mut single =
        load(plugins::RAW_OUTPUTS, &Limits { batch_calls_max: 1, ..test_limits() }, &[]).expect("load raw-outputs");
    let text = json!({ "do": "text", "text": "[1]" });
    let not_json = json!({ "do": "text", "text": "not json" });
    let calls: [&[Value]; 3] = [&[text], &[not_json], &[order("nothing")]];
    for _ in 0..2 {
        let (b, s) = (call_many(&mut raw, &calls), call_many(&mut single, &calls));
        assert_eq!(b, s);
        assert_eq!(outputs(b[0].clone()), [json!([1])]);
        assert!(bad_result_message(b[1].clone()).contains("not JSON"));
    }
    assert_eq!(raw.batches(), 0);
}

#[test]
fn an_infinite_loop_is_stopped_at_the_cpu_limit() {
    let (mut plugin, result) = call_or_hang(adversary(&test_limits()), order("loop"));
    let message = trap_message(result);
    assert!(message.contains("CPU time limit exceeded (call_cpu_ms_max = 100 ms)"), "{message}");
    assert_recovers(&mut plugin);
}

#[test]
fn unbounded_allocation_is_stopped_at_the_memory_limit() {
    let mut plugin = adversary(&test_limits());
    let message = trap_message(call(&mut plugin, "k", &[order("alloc")]));
    assert!(message.contains("instance_memory_bytes_max = 33554432"), "{message}");
    assert_recovers(&mut plugin);
}

#[test]
fn deep_recursion_overflows_the_stack_and_traps() {
    let mut plugin = adversary(&test_limits());
    let message = trap_message(call(&mut plugin, "k", &[order("recurse")]));
    assert!(message.contains("wasm stack overflow (wasm_stack_bytes_max = 524288)"), "{message}");
    assert_recovers(&mut plugin);
    // Rust keeps large locals on a data stack in linear memory; overflowing it runs
    // out of the plugin's memory, which is a trap too.
    let message = trap_message(call(&mut plugin, "k", &[order("stack-data")]));
    assert!(message.contains("out of bounds memory access"), "{message}");
    assert_recovers(&mut plugin);
}

#[test]
fn a_panic_traps_with_its_message_and_the_instance_is_replaced() {
    let mut plugin = adversary(&test_limits());
    assert_eq!((instance_calls(&mut plugin), instance_calls(&mut plugin)), (1, 2));
    let message = trap_message(call(&mut plugin, "k", &[order("panic")]));
    assert!(message.contains("unreachable"), "{message}");
    assert!(message.contains("adversary: panic on key k"), "the panic message, from stderr: {message}");
    assert_eq!(instance_calls(&mut plugin), 1, "a trapped instance must not be reused");
}

#[test]
fn exit_ends_the_call_not_the_host() {
    let mut plugin = adversary(&test_limits());
    let message = trap_message(call(&mut plugin, "k", &[order("exit")]));
    assert!(message.contains("the plugin called exit("), "{message}");
    assert_recovers(&mut plugin);
}

#[test]
fn sleeping_returns_at_once_instead_of_blocking_the_host() {
    // wasmtime-wasi's clock would block this thread for the hour the plugin asks for,
    // out of reach of the CPU limit; the host's virtual clock makes every wait due now.
    let (_, result) = call_or_hang(adversary(&test_limits()), order("sleep"));
    assert_eq!(outputs(result)[1], json!({ "slept": true }));
}

#[test]
fn init_that_loops_or_panics_refuses_the_plugin_at_load() {
    let limits = test_limits();
    let looping = load(plugins::ADVERSARY, &limits, &[("on_init", "loop")]).expect_err("a looping init must fail");
    assert!(matches!(looping, PluginError::Init { .. }), "{looping:?}");
    assert!(looping.to_string().contains("CPU time limit exceeded"), "{looping}");
    let panicking = load(plugins::ADVERSARY, &limits, &[("on_init", "panic")]).expect_err("a panicking init must fail");
    assert!(panicking.to_string().contains("adversary: panic in init"), "{panicking}");
}

#[test]
fn a_state_value_over_the_limit_is_refused_and_the_previous_one_stays() {
    let limits = Limits { state_bytes_max: 1000, ..test_limits() };
    let mut plugin = adversary(&limits);
    let big = call(&mut plugin, "k", &[json!({ "do": "big-state", "n": 2000 })]).expect("the call itself succeeds");
    let said = &big.outputs[1];
    assert!(said.contains("update_error") && said.contains("state_bytes_max of 1000"), "{said}");
    // What stays staged is the call's first update (the count), not the refused value.
    assert!(matches!(&big.value, StagedValue::Updated(v) if v.len() < 100), "{:?}", big.value);
    let small = call(&mut plugin, "k", &[json!({ "do": "big-state", "n": 500 })]).expect("call");
    assert!(matches!(&small.value, StagedValue::Updated(v) if v.len() > 500), "a value under the limit is kept");
}

#[test]
fn too_many_outputs_are_refused() {
    let limits = Limits { outputs_per_call_max: 10, ..test_limits() };
    let mut plugin = adversary(&limits);
    // The count output plus `n` more.
    assert_eq!(outputs(call(&mut plugin, "k", &[json!({ "do": "outputs", "n": 9 })])).len(), 10);
    let message = bad_result_message(call(&mut plugin, "k", &[json!({ "do": "outputs", "n": 10 })]));
    assert!(message.contains("returned 11 outputs, over outputs_per_call_max (10)"), "{message}");
}

#[test]
fn over_long_non_json_and_multi_line_outputs_are_refused() {
    let limits = Limits { output_bytes_max: 1000, ..test_limits() };
    let mut plugin = adversary(&limits);
    let message = bad_result_message(call(&mut plugin, "k", &[json!({ "do": "long-output", "n": 2000 })]));
    assert!(message.contains("has 2002 bytes, over output_bytes_max (1000)"), "{message}");
    let mut raw = load(plugins::RAW_OUTPUTS, &limits, &[]).expect("load raw-outputs");
    let text = |t: &str| json!({ "do": "text", "text": t });
    assert_eq!(outputs(call(&mut raw, "k", &[text("{\"ok\":1}")])), [json!({ "ok": 1 })]);
    let message = bad_result_message(call(&mut raw, "k", &[text("not json")]));
    assert!(message.contains("output 0 is not JSON"), "{message}");
    let message = bad_result_message(call(&mut raw, "k", &[text("{\"a\":1}\n{\"b\":2}")]));
    assert!(message.contains("contains a line break"), "{message}");
}

#[test]
fn outputs_aliasing_one_buffer_are_stopped_at_the_transfer_limit() {
    // 16 outputs pointing at one 1 MB string cost the plugin 1 MB; copying them out
    // would cost the host 16 MB. The host stops copying at transfer_bytes_max.
    let limits = Limits { transfer_bytes_max: 8 << 20, ..test_limits() };
    let mut raw = load(plugins::RAW_OUTPUTS, &limits, &[]).expect("load raw-outputs");
    let alias = |copies: u32| json!({ "do": "alias", "copies": copies, "bytes": 1_000_000 });
    let under = call(&mut raw, "k", &[alias(4)]).expect("4 MB is under the limit");
    assert_eq!(under.outputs.iter().map(String::len).collect::<Vec<_>>(), [1_000_000; 4]);
    let message = trap_message(call(&mut raw, "k", &[alias(16)]));
    assert!(message.contains("transfer_bytes_max = 8388608"), "{message}");
}

#[test]
fn plugin_error_messages_are_clipped() {
    let mut raw = load(plugins::RAW_OUTPUTS, &test_limits(), &[]).expect("load raw-outputs");
    match call(&mut raw, "k", &[json!({ "do": "error", "bytes": 1 << 20 })]) {
        Err(CallError::Returned(message)) => {
            assert!(message.len() < 4096 && message.ends_with("(1048576 bytes)"), "{} bytes", message.len())
        }
        other => panic!("expected an error result, got {other:?}"),
    }
}

#[test]
fn the_sandbox_has_no_files_environment_arguments_or_real_time() {
    let dir = tempfile::tempdir().unwrap();
    let escape = dir.path().join("escaped.txt");
    let mut plugin = adversary(&test_limits());
    let seen = &outputs(call(&mut plugin, "k", &[json!({ "do": "probe", "path": escape })]))[1];
    for error in ["read_error", "write_error", "list_error"] {
        assert!(seen[error].is_string(), "{error}: the plugin must not reach the file system: {seen}");
    }
    assert!(!escape.exists(), "the plugin wrote a host file");
    assert_eq!((&seen["env_vars"], &seen["home"], &seen["args"]), (&json!(0), &Value::Null, &json!(0)), "{seen}");
    assert_eq!(seen["now_ms"], json!(NOW_MS), "the clock must read the batch's processing time");
}

#[test]
fn a_plugin_importing_sockets_is_refused_at_load_with_its_imports() {
    let error = load(plugins::SOCKET_PROBE, &test_limits(), &[]).expect_err("sockets must be refused");
    let PluginError::ForbiddenImports { imports, .. } = &error else { panic!("expected forbidden imports: {error}") };
    for import in ["wasi:sockets/tcp@", "wasi:sockets/udp@", "wasi:sockets/ip-name-lookup@"] {
        assert!(imports.contains(import), "{import} missing from {imports}");
    }
    assert!(!imports.contains("wasi:cli"), "only the offending imports are listed: {imports}");
}

#[test]
fn a_file_that_is_not_a_component_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 6] = [
        ("empty.wasm", b"", "the file is empty"),
        ("garbage.wasm", b"\x7fELF garbage", "not a WebAssembly file"),
        ("core.wasm", b"\0asm\x01\0\0\0", "is a core WebAssembly module, not a component"),
        ("core.wat", b"(module (func (export \"process\")))", "is a core WebAssembly module, not a component"),
        ("truncated.wasm", b"\0asm\x0d\0", "truncated WebAssembly header"),
        ("other.wat", b"(component)", "does not export the state-function world"),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let error = load(path.to_str().unwrap(), &test_limits(), &[]).expect_err(name);
        assert!(error.to_string().contains(expected), "{name}: expected {expected:?} in {error}");
    }
    let missing = load(dir.path().join("missing.wasm").to_str().unwrap(), &test_limits(), &[]).expect_err("missing");
    assert!(matches!(missing, PluginError::Read { .. }), "{missing}");
}

#[test]
fn a_healthy_plugin_keeps_working_while_another_traps_repeatedly() {
    let limits = test_limits();
    let runtime = Runtime::new(&limits, Some(&cache_dir())).expect("runtime");
    let mut healthy = runtime.load(Path::new(plugins::SENSOR_ALERTS), &[]).expect("load sensor-alerts");
    let mut bad = runtime.load(Path::new(plugins::ADVERSARY), &[]).expect("load adversary");
    for round in 0..20i64 {
        let action = ["panic", "alloc", "recurse", "exit", "loop"][round as usize % 5];
        assert!(matches!(call(&mut bad, "bad", &[order(action)]), Err(CallError::Trap(_))), "{action}");
        // Three errors in a row within a minute: exactly one alert, for this sensor.
        let sensor = format!("s-{round}");
        let t0 = 1_700_000_000_000 + round * 1000;
        let readings: Vec<Value> = (0..3)
            .map(|i| json!({ "sensor_id": sensor, "ts": t0 + i * 10_000, "status": "err", "reading": 1.0 }))
            .collect();
        let outcome = call(&mut healthy, &sensor, &readings).expect("the healthy plugin must not fail");
        assert_eq!(outcome.outputs, [format!(r#"{{"sensor_id":"{sensor}","ts":{},"first_ts":{t0}}}"#, t0 + 20_000)]);
    }
}

// The pipeline: one key traps, the others go on (or the batch stops, under `fail`).

/// The adversary pipeline in `dir` (input `in.jsonl`, output `out.jsonl`, state and
/// dead letters in `state/`), key field `k`.
fn adversary_pipeline(dir: &Path, on_error: ErrorPolicy) -> PipelineConfig {
    let mut config = PipelineConfig::new(
        PathBuf::from(plugins::ADVERSARY),
        Stream::File(dir.join("in.jsonl")),
        Stream::File(dir.join("out.jsonl")),
        dir.join("state"),
        "k".into(),
    );
    config.on_error = on_error;
    config.durable_commits = false;
    config.cache_dir = Some(cache_dir());
    config.limits = test_limits();
    config
}

fn append(path: &Path, lines: &[&str]) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("open input");
    for line in lines {
        writeln!(file, "{line}").expect("append input");
    }
}

const BATCH_1: [&str; 3] = [r#"{"k":"a"}"#, r#"{"k":"b"}"#, r#"{"k":"c"}"#];
/// Key `b` counts its event, stages the new count, then panics.
const BATCH_2: [&str; 4] = [r#"{"k":"a"}"#, r#"{"k":"b"}"#, r#"{"k":"b","do":"panic"}"#, r#"{"k":"c"}"#];
const OUTPUTS_1: &str = "{\"count\":1,\"key\":\"a\"}\n{\"count\":1,\"key\":\"b\"}\n{\"count\":1,\"key\":\"c\"}\n";
const OUTPUTS_2: &str = "{\"count\":2,\"key\":\"a\"}\n{\"count\":2,\"key\":\"c\"}\n";

/// Every key's state value after running `dir`'s pipeline to the end.
fn run_to_end(config: PipelineConfig) -> BTreeMap<String, Vec<u8>> {
    let mut states = BTreeMap::new();
    run_and_inspect(config, NOW_MS, |store| {
        for entry in store.iter_keys() {
            let (key, record) = entry.expect("read key");
            states.insert(key, record.value.unwrap_or_default());
        }
    });
    states
}

/// The states of a run where `b` behaves: what `a` and `c` must hold after batch 2.
fn healthy_states() -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().expect("tempdir");
    append(&dir.path().join("in.jsonl"), &BATCH_1);
    append(&dir.path().join("in.jsonl"), &[BATCH_2[0], BATCH_2[1], BATCH_2[3]]);
    run_to_end(adversary_pipeline(dir.path(), ErrorPolicy::Fail))
}

/// Runs batch 1, then batch 2 (where `b` traps) under `policy`; checks that the other
/// keys' outputs and states are exactly those of a healthy run and that `b` kept its
/// state from batch 1. Returns the plugin errors in the dead-letter file.
fn one_key_traps(policy: ErrorPolicy) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.jsonl");
    append(&input, &BATCH_1);
    let after_1 = run_to_end(adversary_pipeline(dir.path(), policy));
    append(&input, &BATCH_2);
    let after_2 = run_to_end(adversary_pipeline(dir.path(), policy));
    let healthy = healthy_states();
    let outputs = std::fs::read_to_string(dir.path().join("out.jsonl")).expect("outputs");
    assert_eq!(outputs, format!("{OUTPUTS_1}{OUTPUTS_2}"));
    assert_eq!((&after_2["a"], &after_2["c"]), (&healthy["a"], &healthy["c"]), "the healthy keys' states");
    assert_eq!(after_2["b"], after_1["b"], "the trapping key's state must stay as before the call");
    assert_ne!(after_2["b"], healthy["b"]);
    let dead_letter = std::fs::read_to_string(dir.path().join("state").join("dead-letter.jsonl")).unwrap_or_default();
    let errors: Vec<Value> = dead_letter.lines().map(|l| serde_json::from_str(l).expect("dead letter json")).collect();
    let state_before: String = after_1["b"].iter().map(|b| format!("{b:02x}")).collect();
    for error in &errors {
        assert_eq!(error["state_before_hex"], json!(state_before), "{error}");
    }
    errors
}

#[test]
fn under_dead_letter_a_trapping_key_is_written_off_and_the_others_go_on() {
    let errors = one_key_traps(ErrorPolicy::DeadLetter);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let error = &errors[0];
    assert_eq!((&error["kind"], &error["key"], &error["batch"]), (&json!("plugin-error"), &json!("b"), &json!(1)));
    assert_eq!(error["events"], json!([BATCH_2[1], BATCH_2[2]]));
    let cause = error["error"].as_str().unwrap();
    assert!(cause.starts_with("trapped:") && cause.contains("adversary: panic on key b"), "{cause}");
}

#[test]
fn under_skip_a_trapping_key_is_dropped_and_the_others_go_on() {
    assert_eq!(one_key_traps(ErrorPolicy::Skip), Vec::<Value>::new(), "skip writes no dead letters");
}

#[test]
fn under_fail_a_trap_stops_the_run_commits_nothing_and_a_rerun_with_skip_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    append(&input, &BATCH_1);
    let after_1 = run_to_end(adversary_pipeline(dir.path(), ErrorPolicy::Fail));
    append(&input, &BATCH_2);
    let clock = Arc::new(ManualClock::new(NOW_MS));
    let mut pipeline = Pipeline::open(adversary_pipeline(dir.path(), ErrorPolicy::Fail), clock).expect("open");
    let error = pipeline.run(&mut |_| {}).expect_err("a trap under --on-error fail stops the run").to_string();
    for needed in
        ["batch 1", "plugin adversary 0.1.0", "key \"b\"", "adversary: panic on key b", "nothing of this batch"]
    {
        assert!(error.contains(needed), "{needed:?} missing from: {error}");
    }
    let checkpoint = pipeline.store().checkpoint().unwrap().expect("batch 1 committed");
    assert_eq!(checkpoint.next_batch_id, 1, "batch 2 must not commit");
    for key in ["a", "b", "c"] {
        let value = pipeline.store().get(key).unwrap().and_then(|r| r.value).unwrap_or_default();
        assert_eq!(value, after_1[key], "key {key} changed in a failed batch");
    }
    drop(pipeline);
    assert_eq!(std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap(), OUTPUTS_1, "no output of batch 2");

    let after_rerun = run_to_end(adversary_pipeline(dir.path(), ErrorPolicy::Skip));
    assert_eq!(std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap(), format!("{OUTPUTS_1}{OUTPUTS_2}"));
    let healthy = healthy_states();
    assert_eq!((&after_rerun["a"], &after_rerun["c"]), (&healthy["a"], &healthy["c"]));
    assert_eq!(after_rerun["b"], after_1["b"]);
}

// The command line: what a plugin prints, and plugins the host refuses.

fn groupstate(args: &[&str]) -> (bool, String) {
    let out = Command::new(groupstate_bin()).args(args).output().expect("run groupstate");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "groupstate panicked: {stderr}");
    assert!(out.status.code().is_some_and(|c| c == 0 || c == 1), "exit status {:?}: {stderr}", out.status);
    (out.status.success(), stderr)
}

fn run_args(plugin: &str, dir: &str, cache: &str) -> Vec<String> {
    let p = |name: &str| format!("{dir}/{name}");
    ["run", "--plugin", plugin, "--input", &p("in.jsonl"), "--output", &p("out.jsonl"), "--state-dir", &p("state")]
        .into_iter()
        .map(str::to_owned)
        .chain(["--key-field", "k", "--cache-dir", cache, "--quiet", "--no-fsync"].map(str::to_owned))
        .collect()
}

#[test]
fn plugin_stdout_and_stderr_go_to_the_host_log_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    append(
        &dir.path().join("in.jsonl"),
        &[r#"{"k":"a","do":"print"}"#, r#"{"k":"b","do":"print","n":100000}"#, r#"{"k":"c","do":"log","n":2000}"#],
    );
    let (dir_s, cache) = (dir.path().display().to_string(), cache_dir().display().to_string());
    let args = run_args(plugins::ADVERSARY, &dir_s, &cache);
    let (ok, stderr) = groupstate(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{stderr}");
    assert!(stderr.contains("plugin adversary key=\"a\" stdout: hello on stdout from a\n"), "{stderr}");
    assert!(stderr.contains("plugin adversary key=\"a\" stderr: hello on stderr from a\n"), "{stderr}");
    // The output file holds only the plugin's outputs.
    let outputs = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap();
    assert_eq!(outputs, "{\"count\":1,\"key\":\"a\"}\n{\"count\":1,\"key\":\"b\"}\n{\"count\":1,\"key\":\"c\"}\n");

    // Key b writes 2 × 23 bytes of greetings and 1000 lines of 100 bytes to stdout: the
    // default 16 KiB budget keeps 16 384 bytes and drops and counts the rest.
    // That is 163 whole lines of x and one cut after 38 (16 384 - 46 - 16 300).
    let budget = 16 << 10;
    let x_lines: Vec<usize> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("plugin adversary key=\"b\" stdout: x"))
        .map(|rest| rest.len() + 1)
        .collect();
    assert_eq!(x_lines.len(), 164, "lines of x from key b: the budget was not applied");
    assert_eq!((x_lines[0], x_lines[163]), (99, 38));
    let dropped = 2 * 23 + 1000 * 100 - budget;
    let b_summary = format!("plugin adversary key=\"b\": dropped 0 log messages and {dropped} bytes of stdout/stderr");
    assert!(stderr.contains(&b_summary), "{b_summary:?} missing");

    // Key c logs 2000 messages through the `log` interface, each costing its length
    // plus one byte, from the same budget.
    let mut used = 0;
    let kept = (0..2000).take_while(|i| {
        used += format!("message {i} for c").len() + 1;
        used <= budget
    });
    let kept = kept.count();
    let c_summary = format!("plugin adversary key=\"c\": dropped {} log messages and 0 bytes", 2000 - kept);
    assert!(stderr.contains(&c_summary), "{c_summary:?} missing");
    assert!(stderr.contains(&format!("plugin adversary key=\"c\" info: message {} for c\n", kept - 1)));
    assert!(!stderr.contains(&format!("message {kept} for c")));
}

#[test]
fn a_batch_redone_call_by_call_after_a_trap_logs_each_call_once() {
    // The three keys go to the plugin in one process-batch; b's panic traps it, and
    // the batch is made again call by call: a's line was flushed before the trap.
    let dir = tempfile::tempdir().unwrap();
    append(
        &dir.path().join("in.jsonl"),
        &[r#"{"k":"a","do":"log","n":1}"#, r#"{"k":"b","do":"panic"}"#, r#"{"k":"c","do":"log","n":1}"#],
    );
    let (dir_s, cache) = (dir.path().display().to_string(), cache_dir().display().to_string());
    let mut args = run_args(plugins::ADVERSARY, &dir_s, &cache);
    args.extend(["--on-error", "skip"].map(str::to_owned));
    // Not `groupstate()`: the plugin's panic message says "panicked" in the log.
    let out = Command::new(groupstate_bin()).args(&args).output().expect("run groupstate");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    for key in ["a", "c"] {
        let line = format!("plugin adversary key=\"{key}\" info: message 0 for {key}\n");
        assert_eq!(stderr.matches(&line).count(), 1, "{line:?} in:\n{stderr}");
    }
    assert!(stderr.contains("adversary: panic on key b"), "{stderr}");
}

#[test]
fn the_cli_refuses_bad_plugins_with_a_clear_error_and_no_panic() {
    let dir = tempfile::tempdir().unwrap();
    append(&dir.path().join("in.jsonl"), &[r#"{"k":"a"}"#]);
    let (garbage, core) = (dir.path().join("garbage.wasm"), dir.path().join("core.wasm"));
    std::fs::write(&garbage, b"garbage").unwrap();
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let cache = cache_dir().display().to_string();
    let cases = [
        (garbage.display().to_string(), "not a WebAssembly file"),
        (core.display().to_string(), "is a core WebAssembly module, not a component"),
        (plugins::SOCKET_PROBE.to_owned(), "imports that the sandbox does not provide: wasi:sockets/"),
    ];
    for (i, (plugin, expected)) in cases.iter().enumerate() {
        let case_dir = dir.path().join(i.to_string());
        std::fs::create_dir(&case_dir).unwrap();
        std::fs::copy(dir.path().join("in.jsonl"), case_dir.join("in.jsonl")).unwrap();
        let args = run_args(plugin, case_dir.to_str().unwrap(), &cache);
        let (ok, stderr) = groupstate(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(!ok && stderr.contains(expected), "{plugin}: expected {expected:?} in {stderr}");
    }
}

// What one instance may hold, and plugin-chosen text: components written in WebAssembly
// text, since no compiler emits several memories or a hostile `info`.

/// A plugin component in WebAssembly text. It has `memories` linear memories of
/// `pages` 64 KiB pages each and `tables` tables of `table_elements` elements; its
/// `info` name is `name` followed by `name_padding` bytes of `A` (memory 0 must hold
/// them). `process` looks at the key: `g…` grows every memory by one MiB per character
/// after the `g`; `l…` asks for stdout 100 times per character after the `l` and never
/// drops the handles; anything else does nothing. It returns no outputs.
struct WatPlugin {
    memories: usize,
    pages: u32,
    tables: usize,
    table_elements: u32,
    name: &'static str,
    name_padding: u32,
}

impl Default for WatPlugin {
    fn default() -> Self {
        Self { memories: 1, pages: 1, tables: 0, table_elements: 0, name: "wat", name_padding: 0 }
    }
}

impl WatPlugin {
    fn text(&self) -> String {
        const NAME_AT: usize = 1024;
        let name_bytes = self.name.len() + self.name_padding as usize;
        let heap_at = (NAME_AT + name_bytes + 1024).next_multiple_of(8);
        let escaped_name: String = self.name.bytes().map(|b| format!("\\{b:02x}")).collect();
        let memories: String = (0..self.memories)
            .map(|i| {
                let export = if i == 0 { r#"(export "memory")"# } else { "" };
                format!("(memory $mem{i} {export} {})\n", self.pages)
            })
            .collect();
        let tables: String = (0..self.tables).map(|_| format!("(table {} funcref)\n", self.table_elements)).collect();
        let grow: String =
            (0..self.memories).map(|i| format!("(drop (memory.grow $mem{i} (local.get $n)))\n")).collect();
        format!(
            r#"(component $plugin
  (import "groupstate:plugin/state@0.1.0" (instance $state (export "group-state" (type (sub resource)))))
  (alias export $state "group-state" (type $group-state))
  (import "wasi:io/streams@0.2.0" (instance $streams (export "output-stream" (type (sub resource)))))
  (alias export $streams "output-stream" (type $output-stream))
  (import "wasi:cli/stdout@0.2.0" (instance $stdout
    (alias outer $plugin $output-stream (type $stream))
    (export "output-stream" (type $stream-export (eq $stream)))
    (export "get-stdout" (func (result (own $stream-export))))))
  (core func $drop-state (canon resource.drop $group-state))
  (core func $get-stdout (canon lower (func $stdout "get-stdout")))
  (core instance $host (export "drop-state" (func $drop-state)) (export "get-stdout" (func $get-stdout)))
  (core module $m
    (import "host" "drop-state" (func $drop-state (param i32)))
    (import "host" "get-stdout" (func $get-stdout (result i32)))
    {memories}
    {tables}
    (global $heap (mut i32) (i32.const {heap_at}))
    (data (i32.const 512) "0.1.0")
    (data (i32.const {NAME_AT}) "{escaped_name}")
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $at i32)
      (local.set $at (i32.and (i32.add (global.get $heap) (i32.sub (local.get 2) (i32.const 1)))
                              (i32.sub (i32.const 0) (local.get 2))))
      (global.set $heap (i32.add (local.get $at) (local.get 3)))
      (local.get $at))
    (func (export "info") (result i32)
      (memory.fill $mem0 (i32.const {padding_at}) (i32.const 65) (i32.const {padding}))
      (i32.store $mem0 (i32.const 256) (i32.const {NAME_AT}))
      (i32.store $mem0 (i32.const 260) (i32.const {name_bytes}))
      (i32.store $mem0 (i32.const 264) (i32.const 512))
      (i32.store $mem0 (i32.const 268) (i32.const 5))
      (i32.store $mem0 (i32.const 272) (i32.const 1))
      (i32.const 256))
    (func (export "init") (param i32 i32) (result i32)
      (i32.store8 $mem0 (i32.const 288) (i32.const 0))
      (i32.const 288))
    (func (export "process") (param $key i32) (param $key-len i32) (param i32 i32) (param $state i32) (result i32)
      (local $n i32)
      (call $drop-state (local.get $state))
      (local.set $n (i32.sub (local.get $key-len) (i32.const 1)))
      (if (i32.eq (i32.load8_u $mem0 (local.get $key)) (i32.const 103))
        (then
          (local.set $n (i32.mul (local.get $n) (i32.const 16)))
          {grow}))
      (if (i32.eq (i32.load8_u $mem0 (local.get $key)) (i32.const 108))
        (then
          (local.set $n (i32.mul (local.get $n) (i32.const 100)))
          (block $done
            (loop $again
              (br_if $done (i32.eqz (local.get $n)))
              (drop (call $get-stdout))
              (local.set $n (i32.sub (local.get $n) (i32.const 1)))
              (br $again)))))
      (i32.store8 $mem0 (i32.const 320) (i32.const 0))
      (i32.store $mem0 (i32.const 324) (i32.const 0))
      (i32.store $mem0 (i32.const 328) (i32.const 0))
      (i32.const 320))
    (func (export "migrate-state") (param i32 i32 i32) (result i32)
      (i32.store8 $mem0 (i32.const 352) (i32.const 0))
      (i32.store $mem0 (i32.const 356) (local.get 1))
      (i32.store $mem0 (i32.const 360) (local.get 2))
      (i32.const 352)))
  (core instance $i (instantiate $m (with "host" (instance $host))))
  (type $event' (record (field "event-time-ms" (option s64)) (field "payload" string)))
  (export $event "event" (type $event'))
  (type $plugin-info' (record (field "name" string) (field "version" string) (field "state-schema-version" u32)))
  (export $plugin-info "plugin-info" (type $plugin-info'))
  (func (export "info") (result $plugin-info)
    (canon lift (core func $i "info") (memory (core memory $i "memory"))))
  (func (export "init") (param "params" (list (tuple string string))) (result (result (error string)))
    (canon lift (core func $i "init") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "process")
    (param "key" string) (param "events" (list $event)) (param "state" (borrow $group-state))
    (result (result (list string) (error string)))
    (canon lift (core func $i "process") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "migrate-state") (param "from-version" u32) (param "value" (list u8))
    (result (result (list u8) (error string)))
    (canon lift (core func $i "migrate-state") (memory (core memory $i "memory")) (realloc (core func $i "realloc")))))
"#,
            padding_at = NAME_AT + self.name.len(),
            padding = self.name_padding,
        )
    }

    /// Writes the component to `dir/name.wat` and returns its path.
    fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(format!("{name}.wat"));
        std::fs::write(&path, self.text()).expect("write the component");
        path
    }

    fn load(&self, limits: &Limits) -> Result<Plugin, PluginError> {
        let dir = tempfile::tempdir().expect("tempdir");
        load(self.write(dir.path(), "plugin").to_str().expect("utf-8 path"), limits, &[])
    }
}

#[test]
fn many_memories_share_one_memory_limit() {
    // 16 memories, each far under the 32 MiB limit on its own: every one may grow a
    // little, but not all of them by 3 MiB (48 MiB together).
    let mut plugin = WatPlugin { memories: 16, ..WatPlugin::default() }.load(&test_limits()).expect("load");
    let under = call(&mut plugin, "gg", &[]);
    assert!(under.is_ok(), "16 × 1 MiB fits: {}", describe(&under));
    let message = trap_message(call(&mut plugin, "gggg", &[]));
    assert!(message.contains("growing a linear memory from"), "{message}");
    assert!(message.contains("over instance_memory_bytes_max = 33554432"), "{message}");
    // The next call runs on a fresh instance, whose memories start small again.
    assert!(call(&mut plugin, "gg", &[]).is_ok());
}

#[test]
fn a_component_that_cannot_fit_is_refused_at_load() {
    let refusal = |plugin: WatPlugin| match plugin.load(&test_limits()) {
        Err(PluginError::Instantiate { message, .. }) => message,
        Err(other) => panic!("expected an instantiate error, got {other:?}"),
        Ok(_) => panic!("a component that cannot fit was loaded"),
    };
    // Four memories of 10 MiB at start, each under the limit, 40 MiB together.
    let message = refusal(WatPlugin { memories: 4, pages: 160, ..WatPlugin::default() });
    assert!(message.contains("creating a linear memory from 0 to 10485760 bytes"), "{message}");
    assert!(message.contains("to 41943040 bytes, over instance_memory_bytes_max = 33554432"), "{message}");
    // Five tables of a million elements: 8 bytes each, 40 MB together.
    let message = refusal(WatPlugin { tables: 5, table_elements: 1_000_000, ..WatPlugin::default() });
    assert!(message.contains("creating a table") && message.contains("instance_memory_bytes_max"), "{message}");
    // More memories than any instance may have, however small.
    let message = refusal(WatPlugin { memories: 17, ..WatPlugin::default() });
    assert!(message.contains("memory count too high"), "{message}");
    assert!(message.contains("at most 16 linear memories, 64 tables"), "{message}");
}

#[test]
fn leaked_wasi_handles_are_stopped_at_the_resource_limit() {
    let limits = Limits { instance_resources_max: 100, ..test_limits() };
    let mut plugin = WatPlugin::default().load(&limits).expect("load");
    assert!(call(&mut plugin, "l", &[]).is_ok(), "no handles");
    // A thousand stdout handles, never dropped.
    let message = trap_message(call(&mut plugin, &format!("l{}", "x".repeat(10)), &[]));
    assert!(message.contains("instance_resources_max = 100"), "{message}");
    assert!(call(&mut plugin, "l", &[]).is_ok(), "a fresh instance after the trap");
}

#[test]
fn an_instance_without_room_for_the_state_handle_fails_the_call_not_the_host() {
    let limits = Limits { instance_resources_max: 0, ..test_limits() };
    let mut plugin = adversary(&limits);
    for _ in 0..2 {
        let message = trap_message(call(&mut plugin, "k", &[order("count")]));
        assert!(message.contains("no room for the group-state handle (instance_resources_max = 0"), "{message}");
    }
}

#[test]
fn plugin_chosen_name_and_version_are_escaped_and_clipped_everywhere() {
    // A name that would paint the terminal, forge a `groupstate: done:` line and fill
    // the log with 16 MiB.
    let hostile = WatPlugin {
        pages: 300,
        name: "evil\x1b[31m\r\ngroupstate: done: 999 batches (forged)\n",
        name_padding: 16 << 20,
        ..WatPlugin::default()
    };
    let info = hostile.load(&test_limits()).expect("load").info().clone();
    let start: String = info.name.chars().take(200).collect();
    assert!(info.name.len() < 200 && info.name.ends_with("… (16777266 bytes)"), "{start}");
    assert!(info.name.starts_with("evil\\u{1b}[31m\\r\\ngroupstate: done:"), "{}", info.name);

    let dir = tempfile::tempdir().unwrap();
    let plugin = hostile.write(dir.path(), "hostile");
    append(&dir.path().join("in.jsonl"), &[r#"{"k":"a"}"#]);
    let (dir_s, cache) = (dir.path().display().to_string(), cache_dir().display().to_string());
    let args: Vec<String> =
        run_args(plugin.to_str().unwrap(), &dir_s, &cache).into_iter().filter(|a| a != "--quiet").collect();
    let (ok, stderr) = groupstate(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{}", &stderr[..2000.min(stderr.len())]);
    assert!(stderr.contains("groupstate: plugin evil\\u{1b}[31m\\r\\ngroupstate: done:"), "{stderr}");
    assert!(!stderr.contains(['\x1b', '\r']), "raw control characters reached the log");
    assert_eq!(stderr.lines().filter(|l| l.starts_with("groupstate: done:")).count(), 1, "{stderr}");
    assert!(stderr.len() < 16 << 10, "the log holds {} bytes", stderr.len());
}

#[test]
fn outputs_are_one_line_for_every_json_lines_reader() {
    let mut raw = load(plugins::RAW_OUTPUTS, &test_limits(), &[]).expect("load raw-outputs");
    let text = |t: &str| json!({ "do": "text", "text": t });
    // Valid JSON with carriage returns between its tokens: split on them, as Python's
    // universal newlines and Node's readline do, the middle is a record of its own.
    let message = bad_result_message(call(&mut raw, "k", &[text("[1,\r{\"forged\":1}\r]")]));
    assert!(message.contains("output 0 contains a line break"), "{message}");
    // Line separators inside strings are the plugin's data: kept, written escaped.
    let outcome = call(&mut raw, "k", &[text("{\"s\":\"a\u{2028}b\u{2029}c\u{85}d\"}")]).expect("escaped, not refused");
    assert_eq!(outcome.outputs, ["{\"s\":\"a\\u2028b\\u2029c\\u0085d\"}"]);
    assert_eq!(outputs(Ok(outcome)), [json!({ "s": "a\u{2028}b\u{2029}c\u{85}d" })]);
}

/// Runs the adversary over `lines`, one batch each, and returns the host's log.
fn log_of_one_event_batches(lines: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    append(&dir.path().join("in.jsonl"), lines);
    let (dir_s, cache) = (dir.path().display().to_string(), cache_dir().display().to_string());
    let mut args = run_args(plugins::ADVERSARY, &dir_s, &cache);
    // A CPU limit far above the slow call, so that a busy machine cannot make it trap.
    args.extend(["--batch-events", "1", "--call-cpu-ms-max", "10000"].map(str::to_owned));
    let (ok, stderr) = groupstate(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{stderr}");
    stderr
}

#[test]
fn a_plugin_turning_slow_is_reported_and_a_steady_one_is_not() {
    let steady = [r#"{"k":"a"}"#; 24];
    assert!(!log_of_one_event_batches(&steady).contains("per call"), "a steady plugin must not warn");
    // Batch 16 spins for a few hundred milliseconds (over the 100 ms floor of the
    // warning): thousands of times the microseconds its calls take otherwise.
    let mut turning = steady.to_vec();
    turning[16] = r#"{"k":"a","do":"spin","n":2000000000}"#;
    let stderr = log_of_one_event_batches(&turning);
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("per call")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].starts_with("groupstate: warning: batch 16: plugin adversary 0.1.0"), "{}", warnings[0]);
    assert!(warnings[0].contains("the median of the last 16 batches"), "{}", warnings[0]);
    eprintln!("{}", warnings[0]);
}
