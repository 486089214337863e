//! `groupstate run --input kafka://...` against a real broker (tansu, see
//! `kafka_broker.rs`): one process over an 8-partition topic of the sensor workload
//! gives the oracle's alerts, also when it is killed with SIGKILL and started again;
//! and a bad URL or a missing --group is refused with a message that says what to do.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use groupstate_tests::{assert_same_alerts, oracle, parse_alerts, sensor_input};

use crate::cli::{groupstate_bin, sensor_run_args};
use groupstate_tests::kafka_broker::Broker;

const PARTITIONS: i32 = 8;

/// A broker with topic `sensors` holding the sensor workload (100 000 events from
/// 2 000 sensors), each record keyed by its sensor id, in the order of the file.
fn broker_with_sensors(dir: &Path) -> (Broker, std::collections::BTreeSet<(String, i64, i64)>) {
    broker_with(dir, 100_000, 2_000)
}

/// `broker_with_sensors` with `events` events from `sensors` sensors.
fn broker_with(dir: &Path, events: u64, sensors: u32) -> (Broker, std::collections::BTreeSet<(String, i64, i64)>) {
    let input = sensor_input(dir, events, sensors, 31);
    let want = oracle::sensor_alerts(&input);
    assert!(want.len() > 100, "the workload should produce alerts, got {}", want.len());
    let broker = Broker::start();
    broker.create_topic("sensors", PARTITIONS);
    broker.produce_keyed_lines("sensors", PARTITIONS, &input, "sensor_id", None);
    (broker, want)
}

/// `groupstate run` of the sensor plugin over the topic, until idle for 3 s.
fn run_command(broker: &Broker, dir: &Path) -> Command {
    run_command_to(broker, dir, &dir.join("out.jsonl").display().to_string())
}

/// `run_command` with `--output output`.
fn run_command_to(broker: &Broker, dir: &Path, output: &str) -> Command {
    run_in(broker, &dir.join("state"), output, "alerts")
}

/// `groupstate run` of the sensor plugin over the topic in consumer group `group`,
/// until idle for 3 s.
fn run_in(broker: &Broker, state_dir: &Path, output: &str, group: &str) -> Command {
    let url = format!("kafka://{}/sensors", broker.bootstrap());
    let mut args = sensor_run_args(&url, output, &state_dir.display().to_string());
    args.extend(["--group", group, "--until-idle-ms", "3000", "--batch-events", "5000"].map(String::from));
    let mut command = Command::new(groupstate_bin());
    command.args(args).stdin(Stdio::null());
    command
}

/// The alerts of all partitions' output files, as one sorted multiset.
fn alerts_of_all_partitions(dir: &Path) -> Vec<(String, i64, i64)> {
    let mut alerts = Vec::new();
    for p in 0..PARTITIONS {
        let file = dir.join(format!("out.jsonl.p{p}"));
        assert!(file.exists(), "{} is missing: partition {p} never ran", file.display());
        alerts.extend(parse_alerts(&file));
    }
    alerts.sort();
    alerts
}

fn assert_success(output: &Output) {
    assert!(output.status.success(), "groupstate run failed: {}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn one_process_over_eight_partitions_gives_the_oracles_alerts() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, want) = broker_with_sensors(dir.path());
    // A record whose key field differs from its Kafka key would split the key's state
    // over two partitions: it goes to the dead-letter output, with the reason.
    let stray = r#"{"sensor_id":"s-elsewhere","ts":4102444800000,"status":"err"}"#;
    broker.produce("sensors", [(3, "s-here", stray)]);
    assert_success(&run_command(&broker, dir.path()).output().unwrap());
    assert_same_alerts(&alerts_of_all_partitions(dir.path()), &want);
    let dead = std::fs::read_to_string(dir.path().join("state/partition-3/dead-letter.jsonl")).unwrap();
    assert!(
        dead.lines().count() == 1 && dead.contains(r#"is \"s-elsewhere\" but the record's kafka key is \"s-here\""#),
        "{dead}"
    );
    // Each partition has its own state dir, with its own checkpoint.
    for p in 0..PARTITIONS {
        assert!(dir.path().join(format!("state/partition-{p}/store")).is_dir(), "partition {p} has no store");
    }
    // A second run finds nothing new: the local checkpoints hold every offset.
    let before: Vec<_> =
        (0..PARTITIONS).map(|p| std::fs::read(dir.path().join(format!("out.jsonl.p{p}"))).unwrap()).collect();
    assert_success(&run_command(&broker, dir.path()).output().unwrap());
    let after: Vec<_> =
        (0..PARTITIONS).map(|p| std::fs::read(dir.path().join(format!("out.jsonl.p{p}"))).unwrap()).collect();
    assert!(before == after, "a rerun over a fully read topic changed the outputs");
    // A partition whose state dir is gone is restored from the changelog, exactly:
    // the same keys, values and timers, and the same checkpoint.
    let shown = |what: &str| groupstate_state(&dir.path().join("state/partition-5"), what);
    let (keys, timers, checkpoint) = (shown("keys"), shown("timers"), shown("checkpoint"));
    assert!(keys.lines().count() > 100, "partition 5 should hold keys: {keys}");
    std::fs::remove_dir_all(dir.path().join("state/partition-5")).unwrap();
    let restored = run_command(&broker, dir.path()).output().unwrap();
    assert_success(&restored);
    let stderr = String::from_utf8_lossy(&restored.stderr);
    assert!(stderr.contains("partition 5") && stderr.contains("restored from the changelog"), "{stderr}");
    assert!(shown("keys") == keys, "partition 5's restored keys differ");
    assert!(shown("timers") == timers, "partition 5's restored timers differ");
    // The output files are this process's own: the output file was kept (its length
    // is taken as committed), the late and dead-letter files went with the state dir.
    let fields = |text: &str| -> serde_json::Value {
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
        let c = v.as_object_mut().unwrap();
        c.remove("dead_letter_len");
        c.remove("late_len");
        v
    };
    assert_eq!(fields(&shown("checkpoint")), fields(&checkpoint), "partition 5's restored checkpoint differs");
    assert!(std::fs::read(dir.path().join("out.jsonl.p5")).unwrap() == before[5], "partition 5's output changed");
}

/// `groupstate state --show <what>` of a partition's state dir.
fn groupstate_state(state_dir: &Path, what: &str) -> String {
    let out = Command::new(groupstate_bin())
        .args(["state", "--state-dir", &state_dir.display().to_string(), "--show", what])
        .output()
        .unwrap();
    assert_success(&out);
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn kill_9_mid_run_and_restart_loses_and_doubles_no_alert() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, want) = broker_with_sensors(dir.path());
    // Killed as soon as some partition has committed output, twice, then run to the end.
    for kill in 0..2 {
        let mut child = run_command(&broker, dir.path()).stderr(Stdio::null()).spawn().unwrap();
        let committed_len = || -> u64 {
            (0..PARTITIONS)
                .filter_map(|p| std::fs::metadata(dir.path().join(format!("out.jsonl.p{p}"))).ok())
                .map(|m| m.len())
                .sum()
        };
        let before = committed_len();
        let mut waited = 0;
        while committed_len() == before && waited < 60_000 {
            assert!(child.try_wait().unwrap().is_none(), "run {kill} ended before it was killed");
            std::thread::sleep(Duration::from_millis(20));
            waited += 20;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        assert!(waited < 60_000, "run {kill} wrote no output within 60 s");
    }
    assert_success(&run_command(&broker, dir.path()).output().unwrap());
    assert_same_alerts(&alerts_of_all_partitions(dir.path()), &want);
}

#[test]
fn an_output_topic_killed_mid_run_holds_each_alert_once_by_its_headers() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, want) = broker_with_sensors(dir.path());
    broker.create_topic("alerts", 4);
    broker.create_topic("dead-letters", 1);
    let stray = r#"{"sensor_id":"s-elsewhere","ts":4102444800000,"status":"err"}"#;
    broker.produce("sensors", [(3, "s-here", stray)]);
    let topic_run = || {
        let mut command = run_command_to(&broker, dir.path(), &format!("kafka://{}/alerts", broker.bootstrap()));
        command.args(["--dead-letter", &format!("kafka://{}/dead-letters", broker.bootstrap())]);
        command
    };
    // Killed while it runs, once its metrics show committed batches and 8 s have
    // passed, then run to the end. The admin endpoint serves each partition's metrics.
    let socket = dir.path().join("admin.sock");
    let mut child = topic_run().args(["--admin", &format!("unix:{}", socket.display())]).spawn().unwrap();
    let mut waited_ms = 0;
    let metrics = loop {
        if child.try_wait().unwrap().is_some() {
            panic!("the run ended before it was killed: {}", child.wait_with_output().unwrap().status);
        }
        let text = http_get(&socket, "/metrics").map(|(_, body)| body).unwrap_or_default();
        if text.contains("groupstate_last_batch_id{partition=") {
            break text;
        }
        assert!(waited_ms < 60_000, "no batch in the metrics within 60 s: {text}");
        std::thread::sleep(Duration::from_millis(100));
        waited_ms += 100;
    };
    let (status, body) = http_get(&socket, "/plugin").unwrap();
    // Killed 8 s in, mid-run (the group join takes about 3 s, the run about 20 s).
    while waited_ms < 8_000 && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(100));
        waited_ms += 100;
    }
    child.kill().unwrap(); // SIGKILL
    for family in ["groupstate_input_lag_records{partition=", "groupstate_last_batch_duration_seconds{partition="] {
        assert!(metrics.contains(family), "the metrics lack {family}: {metrics}");
    }
    // Each running partition's plugin, as hot load sees it.
    let plugin: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let running = plugin["partitions"].as_array().cloned().unwrap_or_default();
    assert!(
        status == 200
            && !running.is_empty()
            && running.iter().all(|p| p["partition"].is_i64() && p["running"].as_str().is_some_and(|r| !r.is_empty())),
        "GET /plugin: {status} {body}"
    );
    child.wait().unwrap();
    assert_success(&topic_run().output().unwrap());
    let out = dir.path().join("alerts.jsonl");
    std::fs::write(&out, records_once(&broker, "alerts").iter().map(|v| format!("{v}\n")).collect::<String>()).unwrap();
    let mut alerts = parse_alerts(&out);
    alerts.sort();
    assert_same_alerts(&alerts, &want);
    // The dead-letter output is a topic too, in the same transactions.
    let dead = records_once(&broker, "dead-letters");
    assert!(dead.len() == 1 && dead[0].contains("s-elsewhere"), "{dead:?}");
    assert!(!dir.path().join("state/partition-3/dead-letter.jsonl").exists(), "the dead letter went to a file too");
}

/// `GET path` over the admin socket: the status and the body; none if the socket does
/// not answer (yet).
fn http_get(socket: &Path, path: &str) -> Option<(u16, String)> {
    http(socket, "GET", path, b"")
}

/// `method path` with `body` over the admin socket: the status and the body; none if
/// the socket does not answer (yet).
fn http(socket: &Path, method: &str, path: &str, body: &[u8]) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket).ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: groupstate\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body).ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    let (head, body) = reply.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The records of `topic`, each once: a transaction aborted by a kill and replayed
/// from its plan repeats its records with the same headers, and tansu's
/// read_committed still shows aborted records, so they are dropped here by
/// (partition, batch, index), as a reader would on tansu. Records with the same
/// headers must be identical.
fn records_once(broker: &Broker, topic: &str) -> Vec<String> {
    records_once_as(broker, topic, "read_committed")
}

/// `records_once` at `isolation`.
fn records_once_as(broker: &Broker, topic: &str, isolation: &str) -> Vec<String> {
    let mut seen = std::collections::BTreeMap::new();
    for (headers, value) in broker.read_all_as(topic, isolation) {
        let id: Vec<u64> = ["groupstate.partition", "groupstate.batch", "groupstate.index"]
            .iter()
            .map(|h| {
                let v = headers.get(*h).unwrap_or_else(|| panic!("a record of {topic} lacks header {h}: {headers:?}"));
                v.parse().unwrap_or_else(|_| panic!("header {h} of a record of {topic} is not a number: {v}"))
            })
            .collect();
        if let Some(earlier) = seen.insert(id.clone(), value.clone()) {
            assert_eq!(earlier, value, "two different records of {topic} carry the headers {id:?}");
        }
    }
    seen.into_values().collect()
}

/// Three processes in one group over 1M events, one killed with SIGKILL mid-run and
/// started again: the output topic holds the oracle's alerts once (after dropping
/// replays of aborted transactions by their headers), and every partition's state,
/// including the ones that moved between processes and were restored from the
/// changelog, equals that of a single-process run: the same keys, values and timers.
///
/// On tansu the restarted process may be left the group's only member with no
/// partition and a rebalance that never completes: it stops once it has held no
/// partition for `--until-idle-ms` and waited out the rebalance's 30 s cap.
#[test]
fn three_processes_one_killed_give_the_oracles_alerts_and_restore_moved_partitions_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, want) = broker_with(dir.path(), 1_000_000, 20_000);
    broker.create_topic("alerts", 4);
    let output = format!("kafka://{}/alerts", broker.bootstrap());
    // Batches end at 5 000 records, never on the trigger interval (a partition's
    // last one does, at its end), so that every run cuts a partition's batches alike
    // and its state after the last batch is the same.
    let process = |name: &str, log: &str| {
        let mut command = run_in(&broker, &dir.path().join(name), &output, "alerts");
        command.args(["--trigger-interval-ms", "5000"]);
        command.stderr(std::fs::File::create(dir.path().join(log)).unwrap()).spawn().unwrap()
    };
    let (mut a, mut b, mut c) = (process("a", "a.log"), process("b", "b.log"), process("c", "c.log"));
    // Killed once it has run batches for a while (the group settles in a few seconds),
    // early enough that the others still have work when the group notices (after its
    // session timeout) and gives them its partitions.
    let mut waited_ms = 0;
    let partitions_of =
        |name: &str| std::fs::read_dir(dir.path().join(name)).map_or(0, |d| d.filter(|e| e.is_ok()).count());
    while partitions_of("b") == 0 || waited_ms < 8_000 {
        assert!(b.try_wait().unwrap().is_none(), "process b ended before it was killed: see b.log");
        assert!(waited_ms < 120_000, "process b ran no partition within 120 s");
        std::thread::sleep(Duration::from_millis(100));
        waited_ms += 100;
    }
    b.kill().unwrap(); // SIGKILL
    b.wait().unwrap();
    // Started again once another process has taken over one of its partitions (after
    // the group's session timeout), while the others still run; or once they have
    // ended. On tansu, a process that joins the group after its last members left
    // with a dead member's rebalance behind them never gets an assignment (JoinGroup
    // names a departed leader, SyncGroup answers REBALANCE_IN_PROGRESS for good), so
    // the takeover is what this waits for: the kill comes early enough for it.
    let started = || -> usize {
        ["a.log", "c.log"]
            .iter()
            .map(|l| std::fs::read_to_string(dir.path().join(l)).unwrap_or_default())
            .map(|log| log.matches("assigned, started").count())
            .sum()
    };
    // Partitions started while the group formed do not count: a takeover comes after
    // the kill.
    let started_at_kill = started();
    let moved = || started() > started_at_kill;
    let mut waited_ms = 0;
    let others_ended = |a: &mut std::process::Child, c: &mut std::process::Child| {
        a.try_wait().unwrap().is_some() && c.try_wait().unwrap().is_some()
    };
    while !moved() && !others_ended(&mut a, &mut c) {
        assert!(waited_ms < 60_000, "no process took over a partition of the killed one within 60 s");
        std::thread::sleep(Duration::from_millis(100));
        waited_ms += 100;
    }
    let mut b = process("b", "b-again.log");
    for (name, child) in [("a", &mut a), ("b-again", &mut b), ("c", &mut c)] {
        let mut waited_ms = 0;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if waited_ms >= 180_000 {
                let _ = child.kill();
                let log = std::fs::read_to_string(dir.path().join(format!("{name}.log"))).unwrap();
                panic!(
                    "process {name} did not end within 180 s: {}\n{log}",
                    describe_group_at(&broker.bootstrap(), "alerts")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
            waited_ms += 100;
        };
        let log = std::fs::read_to_string(dir.path().join(format!("{name}.log"))).unwrap();
        assert!(status.success(), "process {name} failed: {log}");
    }
    // Read uncommitted: tansu's read_committed shows aborted records anyway, so the
    // headers are what tells a replay here; a batch that was lost would also fail the
    // state check below.
    let out = dir.path().join("alerts.jsonl");
    let once = records_once_as(&broker, "alerts", "read_uncommitted");
    std::fs::write(&out, once.iter().map(|v| format!("{v}\n")).collect::<String>()).unwrap();
    let mut alerts = parse_alerts(&out);
    alerts.sort();
    assert_same_alerts(&alerts, &want);
    let logs: String = ["a", "b", "b-again", "c"]
        .iter()
        .map(|n| std::fs::read_to_string(dir.path().join(format!("{n}.log"))).unwrap())
        .collect();
    let restores = logs.matches("restored from the changelog").count();
    assert!(restores > 0, "no partition moved between processes: {logs}");
    // One process in a group of its own reads the topic once more, alone.
    let solo = run_in(&broker, &dir.path().join("solo"), &dir.path().join("solo.jsonl").display().to_string(), "solo")
        .args(["--trigger-interval-ms", "5000"])
        .output()
        .unwrap();
    assert_success(&solo);
    for p in 0..PARTITIONS {
        let state = |name: &str| dir.path().join(name).join(format!("partition-{p}"));
        let next_batch = |name: &str| -> u64 {
            if !state(name).join("store").exists() {
                return 0;
            }
            let checkpoint: serde_json::Value =
                serde_json::from_str(&groupstate_state(&state(name), "checkpoint")).unwrap();
            checkpoint["next_batch_id"].as_u64().unwrap()
        };
        // The process that ran the partition last holds its latest state.
        let last = ["a", "b", "c"].into_iter().max_by_key(|n| next_batch(n)).unwrap();
        assert_eq!(next_batch(last), next_batch("solo"), "partition {p} ran a different number of batches");
        for what in ["keys", "timers"] {
            let (got, want) = (groupstate_state(&state(last), what), groupstate_state(&state("solo"), what));
            assert!(got.lines().count() > 100 || what == "timers", "partition {p} holds few keys: {got}");
            assert!(got == want, "partition {p}'s {what} in {last} differ from a single process's");
        }
    }
    eprintln!("three processes: {restores} partition restores from the changelog");
}

#[test]
fn event_time_can_be_the_records_kafka_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let input = sensor_input(dir.path(), 50_000, 1_000, 31);
    let want = oracle::sensor_alerts(&input);
    let broker = Broker::start();
    broker.create_topic("sensors", PARTITIONS);
    // Each record's timestamp is its ts field; the run is told to take event time from
    // the timestamps, not from a field. Without event times no timeout would fire, and
    // the oracle's timeout alerts would be missing.
    broker.produce_keyed_lines("sensors", PARTITIONS, &input, "sensor_id", Some("ts"));
    let url = format!("kafka://{}/sensors", broker.bootstrap());
    let mut args = sensor_run_args(
        &url,
        &dir.path().join("out.jsonl").display().to_string(),
        &dir.path().join("state").display().to_string(),
    );
    let at = args.iter().position(|a| a == "--time-field").unwrap();
    args.drain(at..at + 2);
    args.extend(
        ["--kafka-timestamp", "--group", "ts", "--until-idle-ms", "3000", "--batch-events", "5000"].map(String::from),
    );
    assert_success(&Command::new(groupstate_bin()).args(&args).stdin(Stdio::null()).output().unwrap());
    assert_same_alerts(&alerts_of_all_partitions(dir.path()), &want);
    // The same state as a run that reads event time from the ts field: the same
    // watermark, keys and timers in every partition.
    let by_field =
        run_in(&broker, &dir.path().join("by-field"), &dir.path().join("f.jsonl").display().to_string(), "f")
            .output()
            .unwrap();
    assert_success(&by_field);
    for p in 0..PARTITIONS {
        let state =
            |name: &str, what: &str| groupstate_state(&dir.path().join(name).join(format!("partition-{p}")), what);
        let times = |name: &str| {
            let c: serde_json::Value = serde_json::from_str(&state(name, "checkpoint")).unwrap();
            (c["max_event_time_ms"].as_i64(), c["watermark_ms"].as_i64())
        };
        assert!(times("state").0.is_some(), "partition {p} saw no event time");
        assert_eq!(times("state"), times("by-field"), "partition {p}'s event times differ");
        assert!(state("state", "keys") == state("by-field", "keys"), "partition {p}'s keys differ");
    }
    // The state dir remembers where its event times come from.
    args.extend(["--time-field", "ts"].map(String::from));
    let at = args.iter().position(|a| a == "--kafka-timestamp").unwrap();
    args.remove(at);
    let out = Command::new(groupstate_bin()).args(&args).stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("(kafka timestamp)"), "{stderr}");
}

/// A 0.2 plugin (sessions: map state, a timer per open session) over Kafka: a
/// partition whose state dir is gone is restored from the changelog as a 0.2 state
/// dir, its entries and timers exactly as they were, and runs on.
#[test]
fn a_0_2_plugins_missing_or_damaged_partition_is_restored_with_its_world_and_entries() {
    let dir = tempfile::tempdir().unwrap();
    let input = crate::sessions::write_input(dir.path(), &crate::sessions::views(20_000, 300, 5));
    let broker = Broker::start();
    broker.create_topic("views", 4);
    broker.produce_keyed_lines("views", 4, &input, "user", None);
    let run = || {
        let p = |name: &str| dir.path().join(name).display().to_string();
        let args = [
            "run",
            "--plugin",
            groupstate_tests::plugins::SESSIONS,
            "--input",
            &format!("kafka://{}/views", broker.bootstrap()),
            "--group",
            "sessions",
            "--output",
            &p("out.jsonl"),
            "--state-dir",
            &p("state"),
            "--time-field",
            "ts",
            "--timeout",
            "event-time",
            "--watermark-delay-ms",
            &crate::sessions::DELAY_MS.to_string(),
            "--batch-events",
            "2000",
            "--until-idle-ms",
            "3000",
            "--cache-dir",
            &groupstate_tests::cache_dir().display().to_string(),
        ];
        Command::new(groupstate_bin()).args(args).stdin(Stdio::null()).output().unwrap()
    };
    assert_success(&run());
    // Partition 1's dir is deleted; partition 2's sled file is cut to nothing, and
    // sled finds it corrupt at open (as after the kill that once left one so).
    let partition = |p: i32| dir.path().join(format!("state/partition-{p}"));
    let before: Vec<(String, String)> = [1, 2]
        .iter()
        .map(|&p| (groupstate_state(&partition(p), "keys"), groupstate_state(&partition(p), "timers")))
        .collect();
    for (keys, timers) in &before {
        assert!(
            keys.lines().count() > 10 && timers.lines().count() > 0,
            "a partition holds too little: {keys} {timers}"
        );
    }
    std::fs::remove_dir_all(partition(1)).unwrap();
    std::fs::OpenOptions::new().write(true).open(partition(2).join("store/db")).unwrap().set_len(0).unwrap();
    let restored = run();
    assert_success(&restored);
    let stderr = String::from_utf8_lossy(&restored.stderr);
    assert_eq!(stderr.matches("restored from the changelog").count(), 2, "{stderr}");
    assert!(stderr.contains("damaged; moved it to"), "{stderr}");
    let aside: Vec<_> = std::fs::read_dir(partition(2))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("store.damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "partition 2's damaged store is kept beside the new one");
    for (p, (keys, timers)) in [1, 2].into_iter().zip(&before) {
        assert!(&groupstate_state(&partition(p), "keys") == keys, "partition {p}'s restored entries differ");
        assert!(&groupstate_state(&partition(p), "timers") == timers, "partition {p}'s restored timers differ");
    }
}

#[test]
fn a_bad_url_and_a_missing_group_are_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let run = |input: &str, group: Option<&str>| {
        let mut args = sensor_run_args(input, &p("out.jsonl"), &p("state"));
        if let Some(group) = group {
            args.extend(["--group".to_owned(), group.to_owned()]);
        }
        let out = Command::new(groupstate_bin()).args(args).output().unwrap();
        assert!(!out.status.success(), "{input} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let no_topic = run("kafka://127.0.0.1:9092", Some("g"));
    assert!(no_topic.contains("the topic is missing") && no_topic.contains("kafka://HOST:PORT/TOPIC"), "{no_topic}");
    let no_port = run("kafka://localhost/events", Some("g"));
    assert!(no_port.contains("port is missing"), "{no_port}");
    let bad_topic = run("kafka://127.0.0.1:9092/a topic", Some("g"));
    assert!(bad_topic.contains("is not a topic name"), "{bad_topic}");
    let no_group = run("kafka://127.0.0.1:9092/events", None);
    assert!(no_group.contains("needs --group NAME"), "{no_group}");
    // Nothing was started on a state dir.
    assert!(!dir.path().join("state").exists(), "a refused run left a state dir");
}

#[test]
fn an_unreachable_broker_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut args = sensor_run_args(&format!("kafka://127.0.0.1:{port}/events"), &p("out.jsonl"), &p("state"));
    args.extend(["--group", "g"].map(String::from));
    let out = Command::new(groupstate_bin()).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("is unreachable") && stderr.contains("check that it is running"),
        "{stderr}"
    );
}

/// Keys of the hot-load test: each phase sends every key the same number of records.
const COUNTER_KEYS: usize = 40;

/// `(partition, key, line)` of phase `phase`'s `n` records of the counter plugin, over
/// [`COUNTER_KEYS`] keys, each sent to its key's partition.
fn counter_records(phase: usize, n: usize, partitions: i32) -> Vec<(i32, String, String)> {
    (0..n)
        .map(|i| {
            let key = format!("c-{}", i % COUNTER_KEYS);
            let line = format!(r#"{{"k":"{key}","phase":{phase},"n":{i}}}"#);
            (groupstate_tests::kafka_broker::partition_of(&key, partitions), key, line)
        })
        .collect()
}

/// One output line of the counter plugin: its version (1 or 2), key and count
/// (v1's `count`, v2's `total`).
fn counter_line(line: &str) -> (u64, String, u64) {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let (version, n) = match (v.get("v"), v.get("version")) {
        (Some(_), None) => (1, v["count"].as_u64().unwrap()),
        (None, Some(_)) => (2, v["total"].as_u64().unwrap()),
        _ => panic!("not a counter line: {line}"),
    };
    (version, v["key"].as_str().unwrap().to_owned(), n)
}

/// The counter lines of partition `p`'s output file, in order.
fn counter_lines(dir: &Path, p: i32) -> Vec<(u64, String, u64)> {
    let text = std::fs::read_to_string(dir.join(format!("out.jsonl.p{p}"))).unwrap_or_default();
    // A line being written is not one yet.
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    whole.lines().map(counter_line).collect()
}

/// The last (version, count) of each key over all partitions' output files.
fn last_counts(dir: &Path, partitions: i32) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut last = std::collections::BTreeMap::new();
    for p in 0..partitions {
        for (version, key, n) in counter_lines(dir, p) {
            last.insert(key, (version, n));
        }
    }
    last
}

/// A running `groupstate run --watch --admin` of the counter plugin over topic
/// `counts`, kept from going idle by one record of key `beat` to partition 0 every
/// half second while the test waits for it.
struct HotLoadRun<'a> {
    broker: &'a Broker,
    dir: &'a Path,
    child: std::process::Child,
    beats: u64,
    /// Milliseconds waited since the last beat.
    since_beat_ms: u64,
}

impl HotLoadRun<'_> {
    fn socket(&self) -> std::path::PathBuf {
        self.dir.join("admin.sock")
    }

    /// Waits (beating) until `done`, failing after 120 s with `what`.
    fn wait_for(&mut self, what: &str, mut done: impl FnMut(&mut Self) -> bool) {
        let mut waited_ms = 0;
        while !done(self) {
            if let Some(status) = self.child.try_wait().unwrap() {
                let log = std::fs::read_to_string(self.dir.join("run.log")).unwrap_or_default();
                panic!("the run ended ({status}) while waiting for {what}: {log}");
            }
            assert!(waited_ms < 120_000, "waited 120 s for {what}: {}", self.plugin());
            if self.since_beat_ms >= 500 {
                self.broker.produce("counts", [(0, "beat", r#"{"k":"beat"}"#)]);
                self.beats += 1;
                self.since_beat_ms = 0;
            }
            std::thread::sleep(Duration::from_millis(100));
            waited_ms += 100;
            self.since_beat_ms += 100;
        }
    }

    /// `GET /plugin`, as JSON (null while the endpoint does not answer).
    fn plugin(&self) -> serde_json::Value {
        http_get(&self.socket(), "/plugin").map_or(serde_json::Value::Null, |(_, b)| serde_json::from_str(&b).unwrap())
    }

    /// Waits until every key's last output shows `want`, with plugin version `version`.
    fn wait_for_counts(&mut self, want: &std::collections::BTreeMap<String, u64>, version: u64) {
        let dir = self.dir.to_owned();
        self.wait_for(&format!("the counts {want:?} by v{version}"), |_| {
            let last = last_counts(&dir, 4);
            want.iter().all(|(k, n)| last.get(k) == Some(&(version, *n)))
        });
    }

    /// Waits until `GET /plugin` shows each of the 4 partitions running a plugin whose
    /// label contains `label`, after `swaps` swaps; returns the statuses.
    fn wait_for_swaps(&mut self, label: &str, swaps: usize) -> Vec<serde_json::Value> {
        self.wait_for(&format!("every partition running {label}"), |run| {
            let partitions = run.plugin()["partitions"].as_array().cloned().unwrap_or_default();
            partitions.len() == 4
                && partitions.iter().all(|p| {
                    p["running"].as_str().is_some_and(|r| r.contains(label))
                        && p["swaps"].as_array().is_some_and(|s| s.len() == swaps)
                })
        });
        self.plugin()["partitions"].as_array().cloned().unwrap()
    }
}

/// Hot load with a Kafka input: the counter plugin over 4 partitions, replaced mid-run
/// twice, first through `--watch` (v1 -> v2, which migrates the stored counts), then
/// through `POST /plugin` (v2 -> v1). Every partition swaps, each at a boundary of its
/// own, and its output is the oracle's: the records sent before the first swap
/// counted by v1, those between the swaps by v2, those after by v1 again, each once
/// (a key's counts go up by its records, and end at the number sent).
#[test]
fn hot_load_by_watch_and_upload_reaches_every_partition_and_counts_each_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start();
    broker.create_topic("counts", 4);
    let plugin = dir.path().join("plugin.wasm");
    std::fs::copy(groupstate_tests::plugins::COUNTER_V1, &plugin).unwrap();
    let phases: Vec<Vec<(i32, String, String)>> = (0..3).map(|phase| counter_records(phase, 2_000, 4)).collect();
    let partitions_used: std::collections::BTreeSet<i32> = phases[0].iter().map(|(p, _, _)| *p).collect();
    assert_eq!(partitions_used.len(), 4, "every partition should get keys");
    let produce = |records: &[(i32, String, String)]| {
        broker.produce("counts", records.iter().map(|(p, k, v)| (*p, k.as_str(), v.as_str())));
    };
    // The count each key must show after phases 0..=n.
    let counts_after = |n: usize| -> std::collections::BTreeMap<String, u64> {
        let mut counts = std::collections::BTreeMap::new();
        for (_, key, _) in phases[..=n].iter().flatten() {
            *counts.entry(key.clone()).or_default() += 1;
        }
        counts
    };
    produce(&phases[0]);
    let p = |path: &Path| path.display().to_string();
    let child = Command::new(groupstate_bin())
        .args(["run", "--plugin", &p(&plugin), "--input", &format!("kafka://{}/counts", broker.bootstrap())])
        .args(["--group", "hot", "--output", &p(&dir.path().join("out.jsonl"))])
        .args(["--state-dir", &p(&dir.path().join("state")), "--batch-events", "100"])
        .args(["--trigger-interval-ms", "200", "--until-idle-ms", "3000", "--watch"])
        .args(["--admin", &format!("unix:{}", p(&dir.path().join("admin.sock")))])
        .args(["--cache-dir", &p(&groupstate_tests::cache_dir())])
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("run.log")).unwrap())
        .spawn()
        .unwrap();
    let mut run = HotLoadRun { broker: &broker, dir: dir.path(), child, beats: 0, since_beat_ms: 0 };
    run.wait_for_counts(&counts_after(0), 1);

    // v2 replaces the file (renamed into place, so the watcher never reads half of it).
    let staged = dir.path().join("plugin.wasm.new");
    std::fs::copy(groupstate_tests::plugins::COUNTER_V2, &staged).unwrap();
    std::fs::rename(&staged, &plugin).unwrap();
    let statuses = run.wait_for_swaps("counter 2.0.0", 1);
    for s in &statuses {
        let swap = &s["swaps"][0];
        assert!(swap["from"].as_str().unwrap().contains("counter 1.0.0"), "{s}");
        assert!(s["last_refusal"].is_null(), "{s}");
    }
    produce(&phases[1]);
    run.wait_for_counts(&counts_after(1), 2);

    // v1 again, uploaded.
    let wasm = std::fs::read(groupstate_tests::plugins::COUNTER_V1).unwrap();
    let (status, body) = http(&run.socket(), "POST", "/plugin", &wasm).unwrap();
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(status == 202 && reply["partitions"] == serde_json::json!([0, 1, 2, 3]), "POST /plugin: {status} {body}");
    let statuses = run.wait_for_swaps("counter 1.0.0", 2);
    assert!(run.plugin()["newest"].as_str().unwrap().starts_with("admin upload"), "{}", run.plugin());
    produce(&phases[2]);
    // Every partition's next batch reports its two swaps.
    run.wait_for("groupstate_plugin_swaps_total 2 at every partition", |run| {
        let metrics = http_get(&run.socket(), "/metrics").map(|(_, body)| body).unwrap_or_default();
        (0..4).all(|p| metrics.lines().any(|l| l == format!("groupstate_plugin_swaps_total{{partition=\"{p}\"}} 2")))
    });
    let beats = run.beats;
    let status = run.child.wait().unwrap();
    let log = std::fs::read_to_string(dir.path().join("run.log")).unwrap();
    assert!(status.success(), "the run failed: {log}");

    // Per partition: v1 lines, then v2 lines, then v1 lines, each swap at a batch of
    // the partition's own.
    let mut sent: std::collections::BTreeMap<String, u64> = counts_after(2);
    sent.insert("beat".into(), beats);
    let phase_ends = [counts_after(0), counts_after(1)];
    let mut seen = std::collections::BTreeMap::new();
    for partition in 0..4 {
        let lines = counter_lines(dir.path(), partition);
        let mut versions: Vec<u64> = lines.iter().map(|(v, _, _)| *v).collect();
        versions.dedup();
        assert_eq!(versions, [1, 2, 1], "partition {partition}'s versions, in output order");
        let swaps: Vec<u64> = statuses
            .iter()
            .find(|s| s["partition"] == partition)
            .map(|s| s["swaps"].as_array().unwrap().iter().map(|w| w["batch"].as_u64().unwrap()).collect())
            .unwrap();
        assert!(swaps[0] < swaps[1], "partition {partition}'s swaps: {swaps:?}");
        for (version, key, n) in lines {
            let (phase, last) = seen.entry(key.clone()).or_insert((0usize, 0u64));
            // The phase whose records this line counts: the version switches with it.
            while *phase < 2 && key != "beat" && phase_ends[*phase].get(&key).is_some_and(|end| n > *end) {
                *phase += 1;
            }
            assert!(n > *last, "key {key}: count {n} after {last}: a record counted twice or a line repeated");
            if key != "beat" {
                let want = if *phase == 1 { 2 } else { 1 };
                assert_eq!(version, want, "key {key}: count {n} (phase {phase}) by v{version}");
            }
            *last = n;
        }
    }
    let last: std::collections::BTreeMap<String, u64> = seen.into_iter().map(|(k, (_, n))| (k, n)).collect();
    assert_eq!(last, sent, "each key's last count is the records sent to it");
}

/// The group as the broker describes it (DescribeGroups): its state and members.
fn describe_group_at(bootstrap: &str, group: &str) -> String {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap).create().unwrap();
    match consumer.fetch_group_list(Some(group), Duration::from_secs(5)) {
        Ok(list) => list
            .groups()
            .iter()
            .map(|g| {
                let members: Vec<String> = g
                    .members()
                    .iter()
                    .map(|m| format!("{}({} B assigned)", m.id(), m.assignment().map_or(0, <[u8]>::len)))
                    .collect();
                format!("group {} state {} protocol {} members {members:?}", g.name(), g.state(), g.protocol())
            })
            .collect(),
        Err(e) => format!("cannot describe group {group}: {e}"),
    }
}
