//! The 0.2 state API's rules through the pipeline, with the scriptable `keyed-probe`:
//! staged and atomic calls, timers after the data calls at `expiry <= threshold`,
//! a timer deleted in a data call not firing, and the limits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use groupstate::clock::ManualClock;
use groupstate::pipeline::Pipeline;
use groupstate::{ErrorPolicy, PipelineConfig, Stream, TimeoutKind};
use groupstate_tests::{cache_dir, plugins, run, store_contents};
use serde_json::{Value, json};

const NOW: i64 = 1_800_000_000_000;

/// A pipeline of the keyed-probe over `input` (key `k`, time `ts`, processing-time
/// timers), with its output and state in `dir`.
fn probe_config(dir: &Path, input: PathBuf) -> PipelineConfig {
    let mut config = PipelineConfig::new(
        PathBuf::from(plugins::KEYED_PROBE),
        Stream::File(input),
        Stream::File(dir.join("out.jsonl")),
        dir.join("state"),
        "k".into(),
    );
    config.timeout = TimeoutKind::ProcessingTime;
    // The probe declares event-time TTLs, which need a time field.
    config.time_field = Some("ts".into());
    config.durable_commits = false;
    config.cache_dir = Some(cache_dir());
    config
}

#[test]
fn keyed_calls_are_atomic_and_timers_follow_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let script = [
        json!({"k": "a", "ops": ["set:x", "append:1", "put:k=1", format!("timer:{}", NOW - 10), format!("timer:{}:n", NOW - 5), "badvar"]}),
        // Fails: none of it stays; both timers fire after this data call.
        json!({"k": "a", "ops": [format!("untimer:{}", NOW - 10), "append:2", "put:k=2", "clear", "fail"]}),
        // Traps: none of it stays.
        json!({"k": "a", "ops": ["append:3", "clearlist", "trap"]}),
        json!({"k": "a", "ops": ["append:4", format!("timer:{}", NOW + 100_000)]}),
        json!({"k": "b", "ops": ["timer:1", "timer:2", "timer:3", "timer:4"]}),
        json!({"k": "c", "ops": ["appendn:4000"]}),
        json!({"k": "c", "ops": ["appendn:4000", "put:z=1", "del:z"]}),
        json!({"k": "d", "ops": ["appendn:11000"]}),
        json!({"k": "e", "ops": [format!("timer:{}", NOW - 1)]}),
        // Deleted in a data call of the batch it would fire in: it never fires.
        json!({"k": "e", "ops": [format!("untimer:{}", NOW - 1)]}),
    ];
    let input = dir.path().join("in.jsonl");
    // The probe declares event-time TTLs, which need a time field.
    let with_time = |l: &Value| {
        let mut l = l.clone();
        l["ts"] = json!(NOW);
        l.to_string() + "\n"
    };
    std::fs::write(&input, script.iter().map(with_time).collect::<String>()).unwrap();
    let mut config = probe_config(dir.path(), input);
    config.on_error = ErrorPolicy::Skip;
    config.batch_events_max = 1;
    config.limits.timers_per_key_max = 3;
    let mut pipeline = Pipeline::open(config, Arc::new(ManualClock::new(NOW))).unwrap();
    let (mut keys, mut timers) = (0, 0);
    let summary = pipeline
        .run(&mut |batch| {
            keys += batch.keys_delta;
            timers += batch.timers_delta;
        })
        .unwrap();
    assert_eq!(summary.total.failed_calls, 2, "the failing and the trapping call");
    // The batches' changes moved the store's entries and timers by what it now holds:
    // each change's record before is the one the store held.
    let (entries, held) = store_contents(pipeline.store());
    assert_eq!((keys, timers), (entries.len() as i64, held.len() as i64));
    drop(pipeline);
    let out: Vec<Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |key: &str| out.iter().filter(|o| o["key"] == key).cloned().collect::<Vec<_>>();

    let a = of("a");
    assert_eq!(a.len(), 4, "{a:#?}");
    assert_eq!(a[0]["value"], "x");
    assert_eq!(a[0]["list_tail"], json!(["1"]));
    assert_eq!(a[0]["map"], json!([["k", "1"]]));
    assert_eq!(a[0]["timers"], json!([[NOW - 10, null], [NOW - 5, "n"]]));
    let badvar = a[0]["errors"][0].as_str().unwrap();
    assert!(badvar.contains("\"nope\"") && badvar.contains("declared"), "{badvar}");
    // The timers of batch 1 fire in batch 2, after its (failed) data call, in expiry
    // order; each no longer sees itself, and sees the state as the failure left it.
    assert_eq!(a[1]["timer"], json!([NOW - 10, null]));
    assert_eq!(a[1]["timers"], json!([[NOW - 5, "n"]]));
    assert_eq!(a[1]["list_tail"], json!(["1"]));
    assert_eq!(a[1]["map"], json!([["k", "1"]]));
    assert_eq!(a[1]["value"], "x");
    assert_eq!(a[2]["timer"], json!([NOW - 5, "n"]));
    assert_eq!(a[2]["timers"], json!([]));
    // After the failed and the trapped call: only what the successful calls did.
    assert_eq!(a[3]["list_tail"], json!(["1", "4"]));
    assert_eq!(a[3]["list_len"], 2);
    assert_eq!(a[3]["value"], "x");
    assert_eq!(a[3]["timers"], json!([[NOW + 100_000, null]]));

    let b = of("b");
    let too_many = b[0]["errors"][0].as_str().unwrap();
    assert!(too_many.starts_with("timer:4") && too_many.contains("timers_per_key_max (3)"), "{too_many}");
    assert_eq!(b[0]["timers"], json!([[1, null], [2, null], [3, null]]));
    let fired: Vec<&Value> = b[1..].iter().map(|o| &o["timer"]).collect();
    assert_eq!(fired, [&json!([1, null]), &json!([2, null]), &json!([3, null])]);

    let c = of("c");
    assert_eq!(c[1]["list_len"], 8000, "{:?}", c[1]["errors"]);
    assert_eq!(c[1]["list_tail"], json!(["3995", "3996", "3997", "3998", "3999"]));
    assert_eq!(c[1]["map"], json!([]));

    // 11 000 appends stage 11 000 elements and the list's length: the limit stops
    // them at 10 000 store entries, the length among them.
    let d = of("d");
    let limit = d[0]["errors"][0].as_str().unwrap();
    assert!(limit.contains("state_writes_per_call_max (10000)"), "{limit}");
    assert_eq!(d[0]["list_len"], 9999);

    assert_eq!(of("e").len(), 2, "the deleted timer must not fire: {:#?}", of("e"));
}

/// A failed call among many keys of one batch is dead-lettered with its own key's
/// events (a batch's calls are matched to their groups by position).
#[test]
fn a_failed_call_is_dead_lettered_with_its_own_events() {
    let dir = tempfile::tempdir().unwrap();
    let line = |key: &str, i: usize, ops: &[&str]| json!({"k": key, "ts": NOW, "n": i, "ops": ops}).to_string();
    let mut lines = Vec::new();
    for i in 0..3 {
        for key in ["a", "b", "c", "d"] {
            let fail = key == "c" && i == 1;
            lines.push(line(key, i, if fail { &["append:x", "fail"] } else { &["append:x"] }));
        }
    }
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let mut config = probe_config(dir.path(), input);
    config.on_error = ErrorPolicy::DeadLetter;
    let summary = run(config, NOW);
    assert_eq!(summary.total.failed_calls, 1);
    let dead = std::fs::read_to_string(dir.path().join("state").join("dead-letter.jsonl")).unwrap();
    let failures: Vec<Value> = dead
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["kind"] == "plugin-error")
        .collect();
    assert_eq!(failures.len(), 1, "{dead}");
    assert_eq!(failures[0]["key"], "c");
    let want: Vec<&str> = lines.iter().filter(|l| l.contains(r#""k":"c""#)).map(String::as_str).collect();
    assert_eq!(failures[0]["events"], json!(want), "all of c's events, in arrival order, and no other key's");
}
