//! The sensor-alerts plugin through the whole pipeline, against the oracle.

use groupstate::Pipeline;
use groupstate_tests::{
    assert_same_alerts, oracle, parse_alerts, run, run_and_inspect, sensor_config, sensor_input, sorted_lines,
};

const NOW_MS: i64 = 1_800_000_000_000;

#[test]
fn matches_oracle_and_expires_silent_sensors() {
    let dir = tempfile::tempdir().unwrap();
    let input = sensor_input(dir.path(), 200_000, 2_000, 11);
    let want = oracle::sensor_alerts(&input);
    assert!(want.len() > 200, "the workload should produce alerts, got {}", want.len());
    let config = sensor_config(&input, dir.path());
    let mut watermark = 0;
    let summary = run_and_inspect(config, NOW_MS, |store| {
        // No state is left for a sensor whose timeout (last event + 10 min) the final
        // watermark has passed, and the timer index agrees with the records.
        watermark = store.checkpoint().unwrap().unwrap().watermark_ms;
        store.check_consistency().unwrap();
        assert!(store.expired_timers(watermark, 1).unwrap().is_empty(), "expired timers left behind");
        let mut keys = 0;
        for entry in store.iter_keys() {
            let (key, record) = entry.unwrap();
            let deadline = record.timeout_ms.unwrap_or_else(|| panic!("key {key} has state but no timeout"));
            assert!(
                deadline >= watermark,
                "key {key} should have expired: deadline {deadline} < watermark {watermark}"
            );
            keys += 1;
        }
        assert!(keys > 0 && keys < 2_000, "{keys} keys hold state");
    });
    assert_eq!(summary.total.records, 200_000);
    assert_eq!(summary.total.events, 200_000, "sorted input has no late events");
    assert_same_alerts(&parse_alerts(&dir.path().join("out.jsonl")), &want);
    assert!(summary.total.timeout_calls > 0, "silent sensors must time out");
}

#[test]
fn resume_and_batch_sizes_give_the_same_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = sensor_input(dir.path(), 200_000, 5_000, 23);
    let want = oracle::sensor_alerts(&input);

    // One run, big batches.
    let one = dir.path().join("one");
    let mut config = sensor_config(&input, &one);
    config.batch_events_max = 50_000;
    run(config, NOW_MS);
    let one_lines = sorted_lines(&one.join("out.jsonl"));
    assert_same_alerts(&parse_alerts(&one.join("out.jsonl")), &want);

    // Small batches, stopped after 5 batches, resumed on the same state dir.
    let two = dir.path().join("two");
    let mut config = sensor_config(&input, &two);
    config.batch_events_max = 7_000;
    config.batches_max = Some(5);
    let first = run(config.clone(), NOW_MS);
    assert_eq!(first.batches, 5);
    assert_eq!(first.checkpoint.counters.records, 35_000);
    config.batches_max = None;
    let second = run(config.clone(), NOW_MS + 1000);
    assert_eq!(second.run.records, 165_000, "the resumed run reads only the rest");
    assert_eq!(sorted_lines(&two.join("out.jsonl")), one_lines);

    // Batches bounded by bytes: each ends after the line that reaches 100 kB.
    let three = dir.path().join("three");
    let mut config3 = sensor_config(&input, &three);
    config3.batch_bytes_max = 100_000;
    let bytes = std::fs::metadata(&input).unwrap().len();
    let by_bytes = run(config3, NOW_MS);
    let (fewest, most) = (bytes / (100_000 + 200), bytes.div_ceil(100_000) + 1);
    assert!((fewest..=most).contains(&by_bytes.batches), "{} batches for {bytes} bytes", by_bytes.batches);
    assert_eq!(sorted_lines(&three.join("out.jsonl")), one_lines);

    // A rerun after completion emits nothing new.
    let before = std::fs::read(two.join("out.jsonl")).unwrap();
    let third = run(config, NOW_MS + 2000);
    assert_eq!((third.batches, third.run.records, third.run.outputs), (0, 0, 0));
    assert_eq!(std::fs::read(two.join("out.jsonl")).unwrap(), before);
}

#[test]
fn state_dir_refuses_another_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let input = sensor_input(dir.path(), 1_000, 10, 1);
    let config = sensor_config(&input, dir.path());
    run(config.clone(), NOW_MS);
    let open_err = |config: groupstate::PipelineConfig| {
        let clock = std::sync::Arc::new(groupstate::ManualClock::new(NOW_MS));
        Pipeline::open(config, clock).map(|_| ()).unwrap_err().to_string()
    };
    let mut other = config.clone();
    other.key_field = "status".into();
    let err = open_err(other);
    assert!(
        err.ends_with(
            "created with --key-field sensor_id, not --key-field status; use the original setting, or a new --state-dir"
        ),
        "{err}"
    );
    // Only the setting that differs is named.
    let mut other = config.clone();
    other.output = groupstate::Stream::File(dir.path().join("elsewhere.jsonl"));
    let err = open_err(other);
    assert!(err.contains("created with --output ") && err.contains("elsewhere.jsonl; use"), "{err}");
    assert!(!err.contains("--key-field") && !err.contains("--input"), "{err}");
    // The same output named through another path is the same output.
    let mut same = config.clone();
    same.output = groupstate::Stream::File(dir.path().join(".").join("out.jsonl"));
    run(same, NOW_MS);
}

#[test]
fn bad_paths_are_refused_before_a_state_dir_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let input = sensor_input(dir.path(), 100, 10, 1);
    let check = |config: groupstate::PipelineConfig, words: &str| {
        let clock = std::sync::Arc::new(groupstate::ManualClock::new(NOW_MS));
        let err = Pipeline::open(config, clock).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains(words), "{err:?} should say {words:?}");
        assert!(!dir.path().join("state").exists(), "a state dir was made for {words}");
    };
    let mut config = sensor_config(&dir.path().join("missing.jsonl"), dir.path());
    check(config.clone(), "--input ");
    config.input = groupstate::Stream::File(dir.path().to_owned());
    check(config, "is a directory; give a JSON Lines file");
    let mut config = sensor_config(&input, dir.path());
    config.output = groupstate::Stream::File(dir.path().to_owned());
    check(config.clone(), "--output");
    let mut config = sensor_config(&input, dir.path());
    config.late = Some(groupstate::Stream::File(dir.path().to_owned()));
    check(config, "--late");
}

#[test]
fn batches_cut_at_the_key_limit_replay_and_resume_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let input = sensor_input(dir.path(), 30_000, 2_000, 31);
    let want = oracle::sensor_alerts(&input);

    let whole = dir.path().join("whole");
    run(sensor_config(&input, &whole), NOW_MS);

    let cut = dir.path().join("cut");
    let mut config = sensor_config(&input, &cut);
    config.batch_keys_max = 300;
    config.batches_max = Some(7);
    let clock = std::sync::Arc::new(groupstate::ManualClock::new(NOW_MS));
    let mut pipeline = Pipeline::open(config.clone(), clock).unwrap();
    let mut keys = Vec::new();
    pipeline.run(&mut |b| keys.push(b.keys)).unwrap();
    drop(pipeline);
    config.batches_max = None;
    let rest = run(config, NOW_MS + 1);
    assert_eq!(keys.len(), 7);
    assert!(keys.iter().all(|&k| k == 300), "every full batch stops at 300 keys: {keys:?}");
    assert!(rest.batches > 50, "30k records over 2000 keys need many 300-key batches, got {}", rest.batches);
    assert_eq!(rest.total.records, 30_000);
    assert_eq!(sorted_lines(&cut.join("out.jsonl")), sorted_lines(&whole.join("out.jsonl")));
    assert_same_alerts(&parse_alerts(&cut.join("out.jsonl")), &want);
}
