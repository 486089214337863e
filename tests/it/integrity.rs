//! Damaged state, replaced or rotated input, hostile settings and records: each is
//! refused with the file and what to do, or handled as documented, and never costs a
//! committed batch or passes silently.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use groupstate::config::PipelineConfig;
use groupstate::{ManualClock, Pipeline};
use groupstate_tests::{
    assert_same_alerts, copy_dir, oracle, parse_alerts, run, sensor_config, sensor_input, store_contents,
};

const NOW_MS: i64 = 1_800_000_000_000;

fn open(config: &PipelineConfig) -> Result<Pipeline, groupstate::pipeline::Error> {
    Pipeline::open(config.clone(), Arc::new(ManualClock::new(NOW_MS)))
}

/// The sensor pipeline in `dir` over `input`, in batches of 2000 records.
fn small_batches(input: &Path, dir: &Path) -> PipelineConfig {
    let mut config = sensor_config(input, dir);
    config.batch_events_max = 2_000;
    config
}

/// [`small_batches`], with budgets so large that nothing is folded into sled before
/// the end of the run.
fn logged_config(input: &Path, dir: &Path) -> PipelineConfig {
    let mut config = small_batches(input, dir);
    config.limits.store_buffer_bytes = 256 << 20;
    config.limits.store_log_bytes = 256 << 20;
    config
}

/// Runs `batches` batches and drops the pipeline without the end-of-run fold, as a
/// kill would: the commits stay in the redo log.
fn run_batches_then_stop(config: &PipelineConfig, batches: usize) {
    let mut pipeline = open(config).unwrap();
    for _ in 0..batches {
        assert!(pipeline.next_batch().unwrap().is_some(), "the input should last {batches} batches");
    }
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

#[test]
fn damage_inside_the_redo_log_is_refused_with_file_and_offset_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let input = sensor_input(dir.path(), 20_000, 500, 3);
    let config = logged_config(&input, dir.path());
    run_batches_then_stop(&config, 5);
    let log = dir.path().join("state/store/redo.log");
    let whole = std::fs::read(&log).unwrap();
    assert!(!whole.is_empty(), "the commits should still be in the redo log");
    let output_len = file_len(&dir.path().join("out.jsonl"));

    // One flipped byte in the first commit's first frame: four whole commits follow.
    let mut damaged = whole.clone();
    damaged[20] ^= 0x01;
    std::fs::write(&log, &damaged).unwrap();
    let err = open(&config).map(|_| ()).unwrap_err().to_string();
    assert!(
        err.contains("redo.log") && err.contains("damaged at byte 0") && err.contains("restore"),
        "unexpected error: {err}"
    );
    assert_eq!(std::fs::read(&log).unwrap(), damaged, "a refused open must not change the log");
    assert_eq!(file_len(&dir.path().join("out.jsonl")), output_len, "nor the output");

    // Put right, the state dir resumes with every commit and finishes exactly.
    std::fs::write(&log, &whole).unwrap();
    run(config, NOW_MS);
    assert_same_alerts(&parse_alerts(&dir.path().join("out.jsonl")), &oracle::sensor_alerts(&input));
}

/// The files of sled's directory, without the redo log and the fold marker.
fn sled_files(store: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![store.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if !matches!(path.file_name().and_then(|n| n.to_str()), Some("redo.log" | "fold.mark")) {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn a_damaged_sled_is_refused_never_taken_for_an_older_state() {
    let dir = tempfile::tempdir().unwrap();
    let input = sensor_input(dir.path(), 20_000, 2_000, 5);
    let done = dir.path().join("done");
    run(small_batches(&input, &done), NOW_MS);
    let output = std::fs::read(done.join("out.jsonl")).unwrap();
    let store = done.join("state/store");
    let files = sled_files(&store);
    let db = files.iter().find(|p| p.ends_with("db")).expect("sled's db file").clone();
    let db_len = file_len(&db);
    assert!(db_len > 4096, "db file of {db_len} bytes");

    type Damage = Box<dyn Fn(&Path)>;
    let damages: Vec<(&str, Damage)> = vec![
        ("db truncated to half", Box::new(move |db: &Path| truncate(db, db_len / 2))),
        ("db truncated to 0", Box::new(|db: &Path| truncate(db, 0))),
        ("db zeroed", Box::new(move |db: &Path| std::fs::write(db, vec![0u8; db_len as usize]).unwrap())),
        ("db deleted", Box::new(|db: &Path| std::fs::remove_file(db).unwrap())),
        (
            "db bytes flipped every 4 KiB",
            Box::new(|db: &Path| {
                let mut bytes = std::fs::read(db).unwrap();
                for at in (100..bytes.len()).step_by(4096) {
                    bytes[at] ^= 0x5a;
                }
                std::fs::write(db, bytes).unwrap();
            }),
        ),
        (
            "every sled file deleted",
            Box::new(|db: &Path| {
                for file in sled_files(db.parent().unwrap()) {
                    std::fs::remove_file(file).unwrap();
                }
            }),
        ),
    ];
    for (name, damage) in damages {
        let copy = dir.path().join(format!("copy-{}", name.replace(' ', "-")));
        copy_dir(&done, &copy);
        damage(&copy.join("state/store").join(db.strip_prefix(&store).unwrap()));
        let config = small_batches(&input, &copy);
        // sled itself reports none of these: it opens empty. The fold marker must.
        let err = open(&config).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("every commit up to") && err.contains("restore the state dir"), "{name}: {err}");
        assert_eq!(std::fs::read(copy.join("out.jsonl")).unwrap(), output, "{name}: the output was changed");
    }
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

/// The contents of the finished store in `dir`, and its checkpoint.
fn store_contents_of(dir: &Path) -> (groupstate_tests::StoreContents, groupstate::store::Checkpoint) {
    let store = groupstate::store::Store::open(&dir.join("state/store"), 1 << 20, 1 << 20, 1 << 20).unwrap();
    (store_contents(&store), store.checkpoint().unwrap().unwrap())
}

#[test]
fn a_fold_that_fails_after_a_commit_keeps_the_batch_and_the_next_start_replays_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = sensor_input(dir.path(), 20_000, 500, 9);
    let whole = dir.path().join("whole");
    run(small_batches(&input, &whole), NOW_MS);

    let failed = dir.path().join("failed");
    let mut config = small_batches(&input, &failed);
    // A fold is due after every commit.
    config.limits.store_buffer_bytes = 0;
    {
        let mut pipeline = open(&config).unwrap();
        pipeline.next_batch().unwrap();
        pipeline.next_batch().unwrap();
        let output_len = file_len(&failed.join("out.jsonl"));
        pipeline.store().fail_next_fold();
        let err = pipeline.next_batch().unwrap_err().to_string();
        assert!(err.contains("batch 2 committed") && err.contains("run again"), "{err}");
        // The batch's outputs stay: it committed.
        assert!(file_len(&failed.join("out.jsonl")) >= output_len);
        assert_eq!(pipeline.store().checkpoint().unwrap().unwrap().next_batch_id, 3);
    }
    let reopened = open(&config).unwrap();
    assert_eq!(reopened.store().checkpoint().unwrap().unwrap().next_batch_id, 3, "the log kept batch 2");
    drop(reopened);
    run(config, NOW_MS);
    for name in ["out.jsonl", "state/late.jsonl", "state/dead-letter.jsonl"] {
        assert_eq!(std::fs::read(failed.join(name)).ok(), std::fs::read(whole.join(name)).ok(), "{name} differs");
    }
    assert_eq!(store_contents_of(&failed), store_contents_of(&whole));
}

#[test]
fn a_replaced_input_is_refused_and_an_appended_one_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let first = sensor_input(dir.path(), 10_000, 300, 1);
    let other = sensor_input(dir.path(), 30_000, 300, 2);
    let input = dir.path().join("in.jsonl");
    std::fs::copy(&first, &input).unwrap();
    let config = sensor_config(&input, dir.path());
    run(config.clone(), NOW_MS);
    let output = std::fs::read(dir.path().join("out.jsonl")).unwrap();

    // A longer, different file under the same name.
    std::fs::copy(&other, &input).unwrap();
    let err = open(&config).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("is not the input this state dir consumed") && err.contains("in.jsonl"), "{err}");
    assert_eq!(std::fs::read(dir.path().join("out.jsonl")).unwrap(), output, "the output was changed");

    // The same file with more lines after it resumes where it stopped.
    let mut grown = std::fs::read(&first).unwrap();
    let tail = std::fs::read_to_string(&other).unwrap();
    // Later events than the first file's, so none is late.
    let shift = 100_000_000;
    for line in tail.lines() {
        let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
        v["ts"] = (v["ts"].as_i64().unwrap() + shift).into();
        grown.extend_from_slice(format!("{v}\n").as_bytes());
    }
    std::fs::write(&input, &grown).unwrap();
    let summary = run(config, NOW_MS);
    assert_eq!(summary.run.records, 30_000, "only the appended records are read");
    assert_same_alerts(&parse_alerts(&dir.path().join("out.jsonl")), &oracle::sensor_alerts(&input));
}

/// Runs batches until the pipeline has had nothing to do a few times in a row.
fn drain(pipeline: &mut Pipeline) {
    let mut idle = 0;
    while idle < 3 {
        match pipeline.next_batch().unwrap() {
            Some(_) => idle = 0,
            None => idle += 1,
        }
    }
}

fn append(path: &Path, lines: &[&str]) {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    for line in lines {
        writeln!(file, "{line}").unwrap();
    }
}

#[test]
fn follow_goes_on_after_rename_and_copytruncate_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let all = sensor_input(dir.path(), 30_000, 300, 4);
    let text = std::fs::read_to_string(&all).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let part = |i: usize| &lines[i * 5_000..(i + 1) * 5_000];
    let input = dir.path().join("app.log");
    let mut config = small_batches(&input, dir.path());
    config.follow = true;
    append(&input, part(0));
    let mut pipeline = open(&config).unwrap();
    drain(&mut pipeline);

    // Rename rotation; the writer still appends to the old file before it moves on.
    append(&input, part(1));
    std::fs::rename(&input, dir.path().join("app.log.1")).unwrap();
    append(&dir.path().join("app.log.1"), part(2));
    append(&input, part(3));
    drain(&mut pipeline);

    // copytruncate rotation: the file is emptied in place, then written again.
    truncate(&input, 0);
    drain(&mut pipeline);
    append(&input, part(4));
    append(&input, part(5));
    drain(&mut pipeline);
    drop(pipeline);

    assert_eq!(file_len(&dir.path().join("state/late.jsonl")), 0);
    assert_eq!(file_len(&dir.path().join("state/dead-letter.jsonl")), 0);
    assert_same_alerts(&parse_alerts(&dir.path().join("out.jsonl")), &oracle::sensor_alerts(&all));

    // A rotation while no pipeline runs cannot be followed: it is refused, not skipped.
    std::fs::rename(&input, dir.path().join("app.log.2")).unwrap();
    append(&input, part(0));
    let err = open(&config).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("rotated while groupstate was stopped") || err.contains("truncated or replaced"), "{err}");
}

#[test]
fn limits_outside_their_range_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let input = sensor_input(dir.path(), 100, 10, 1);
    let config = sensor_config(&input, dir.path());
    config.validate().unwrap();
    let refused = |change: &dyn Fn(&mut PipelineConfig), words: &[&str]| {
        let mut config = config.clone();
        change(&mut config);
        let err = open(&config).map(|_| ()).unwrap_err().to_string();
        for word in words {
            assert!(err.contains(word), "{err:?} should mention {word:?}");
        }
        assert!(!dir.path().join("state").exists(), "nothing may be written before the settings are checked");
    };
    // Above what the store can read back: it would wedge the state dir.
    refused(&|c| c.limits.state_bytes_max = 270 << 20, &["state_bytes_max is 283115520", "..=134217728"]);
    refused(
        &|c| {
            c.limits.state_bytes_max = 32 << 20;
            c.limits.transfer_bytes_max = 16 << 20;
        },
        &["state_bytes_max (33554432) is above transfer_bytes_max (16777216)"],
    );
    refused(&|c| c.limits.instance_memory_bytes_max = 1 << 40, &["instance_memory_bytes_max"]);
    refused(&|c| c.limits.call_cpu_ms_max = 0, &["call_cpu_ms_max is 0"]);
    refused(&|c| c.watermark_delay_ms = -1, &["watermark_delay_ms is a negative number"]);
    refused(&|c| c.event_time_ahead_max_ms = 0, &["event_time_ahead_max_ms"]);
    refused(&|c| c.limits.store_cache_bytes = 1 << 50, &["store_cache_bytes"]);
}

#[test]
fn a_record_far_ahead_in_event_time_is_dead_lettered_and_does_not_move_the_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let clean = sensor_input(dir.path(), 20_000, 200, 8);
    let want = oracle::sensor_alerts(&clean);
    let text = std::fs::read_to_string(&clean).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let rogue = format!(r#"{{"sensor_id":"s-rogue","ts":{},"status":"err","reading":1.0}}"#, i64::MAX);
    lines.insert(1_000, rogue.clone());
    let input = dir.path().join("rogue.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let summary = run(small_batches(&input, dir.path()), NOW_MS);
    assert_eq!(summary.total.late, 0, "the rogue record must not make later records late");
    assert_eq!(summary.total.bad_records, 1);
    let dead = std::fs::read_to_string(dir.path().join("state/dead-letter.jsonl")).unwrap();
    let entry: serde_json::Value = serde_json::from_str(dead.trim()).unwrap();
    assert_eq!(entry["kind"], "event-time-ahead");
    assert_eq!(entry["key"], "s-rogue");
    assert_eq!(entry["line"], rogue.as_str());
    assert!(entry["reason"].as_str().unwrap().contains("--event-time-ahead-max-ms"));
    assert_same_alerts(&parse_alerts(&dir.path().join("out.jsonl")), &want);
}

#[test]
fn a_byte_order_mark_before_the_first_record_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let clean = sensor_input(dir.path(), 5_000, 50, 6);
    let mut bytes = b"\xEF\xBB\xBF".to_vec();
    bytes.extend(std::fs::read(&clean).unwrap());
    let input = dir.path().join("bom.jsonl");
    std::fs::write(&input, bytes).unwrap();
    let summary = run(sensor_config(&input, dir.path()), NOW_MS);
    assert_eq!((summary.total.bad_records, summary.total.events), (0, 5_000));
    assert_same_alerts(&parse_alerts(&dir.path().join("out.jsonl")), &oracle::sensor_alerts(&clean));
}
