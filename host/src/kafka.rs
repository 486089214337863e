//! Kafka, and the only module that touches rdkafka: a partition's reader (what
//! `source.rs` reads one partition's records through), the consumer-group member
//! that learns which partitions this process owns, a partition's transactions (its
//! batches' outputs, changelog records and consumed offsets, each batch one
//! transaction) and the reader of a partition's changelog (what `restore.rs` applies).
//!
//! Separate clients, so that each does one thing. The group member subscribes
//! (cooperative-sticky) and takes part in rebalances, but reads nothing and commits
//! nothing: it pauses every partition it is given; offsets are committed by each
//! partition's transactions. Each partition is read by a reader
//! of its own, a consumer that is assigned that one partition at an explicit offset
//! and never joins the group, so a partition's pipeline can seek its own input
//! (re-reading a planned batch) without disturbing the others.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, ConsumerGroupMetadata, Rebalance};
use rdkafka::error::KafkaError as RdError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode;

use crate::clock::Clock;
use crate::config::KafkaInput;
use crate::export::{BatchExport, ExportBatch, ExportError, TopicRecords};
use crate::records::{BatchPlan, KeyChange};
use crate::restore::{ChangelogEntry, ChangelogRecord};
use crate::source::{Line, LineError};
use crate::store::KEY_BYTES_MAX;

/// How long a metadata or offset request to the broker may take (10 s): past it, the
/// broker counts as unreachable.
pub const BROKER_REQUEST_MS_MAX: u64 = 10_000;

/// How long re-reading a planned batch may wait for its records (30 s): they were
/// read once, so the broker has them unless retention deleted them.
const REPLAY_WAIT_MS_MAX: u64 = 30_000;

/// What a partition's reader may hold fetched ahead of the batches, in KiB (16 MiB;
/// librdkafka's default is 64 MiB per partition, too much times many partitions).
pub const FETCH_QUEUE_KIB_MAX: u64 = 16 * 1024;

/// The group's session timeout (6 s). The first join takes about half of it (tansu),
/// and a member that died loses its partitions after it.
const SESSION_TIMEOUT_MS: u64 = 6_000;

/// A Kafka operation failed.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// A client could not be created (a bad setting).
    #[error("kafka {bootstrap}: cannot create a client ({cause}); check the broker address")]
    Client {
        /// The broker.
        bootstrap: String,
        /// rdkafka's error.
        cause: RdError,
    },
    /// The broker did not answer.
    #[error(
        "kafka broker {bootstrap} is unreachable ({cause}); check that it is running and that HOST:PORT in --input is right"
    )]
    Unreachable {
        /// The broker.
        bootstrap: String,
        /// rdkafka's error.
        cause: RdError,
    },
    /// The topic does not exist.
    #[error("kafka topic {topic} does not exist on {bootstrap} ({cause}); create it, or fix the topic in --input")]
    NoTopic {
        /// The topic.
        topic: String,
        /// The broker.
        bootstrap: String,
        /// What the broker said.
        cause: String,
    },
    /// Joining the group, reading or committing failed.
    #[error(
        "kafka topic {topic} partition {partition}: {what} failed: {cause}; run again to resume from the last committed batch"
    )]
    Partition {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// What was being done.
        what: &'static str,
        /// rdkafka's error.
        cause: RdError,
    },
    /// A planned batch's records did not come back.
    #[error(
        "kafka topic {topic} partition {partition}: the planned batch up to offset {end} cannot be read again (reading stopped at {at}); the records may have been deleted by retention: use a new --state-dir"
    )]
    ReplayShort {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The planned end offset.
        end: u64,
        /// The offset reached.
        at: u64,
    },
    /// The group has consumed a partition that this process has no state for, and
    /// the changelog did not give it back.
    #[error(
        "kafka topic {topic} partition {partition}: group {group} has consumed it up to offset {offset}, but this state dir holds no state for it and the changelog {group}-changelog did not restore it (it was deleted, or the partition was consumed by a groupstate without a changelog): run with the --state-dir that holds partition-{partition}, or start over with a new --group"
    )]
    StateElsewhere {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The group.
        group: String,
        /// The group's committed offset.
        offset: u64,
    },
    /// The changelog topic exists but cannot hold the input's partitions.
    #[error(
        "kafka changelog topic {changelog} has {has} partitions, but input topic {topic} has {needs}: every input partition needs its own; delete the changelog topic (its state is lost) or use a new --group"
    )]
    ChangelogPartitions {
        /// The changelog topic.
        changelog: String,
        /// Its partitions.
        has: usize,
        /// The input topic.
        topic: String,
        /// The input's partitions.
        needs: usize,
    },
    /// Creating the changelog topic failed.
    #[error(
        "kafka {bootstrap}: cannot create changelog topic {changelog} ({cause}); create it with {partitions} partitions and cleanup.policy=compact, or check the broker"
    )]
    ChangelogCreate {
        /// The broker.
        bootstrap: String,
        /// The changelog topic.
        changelog: String,
        /// The partitions it needs.
        partitions: usize,
        /// What failed.
        cause: String,
    },
    /// The partition's transaction failed.
    #[error(
        "kafka topic {topic} partition {partition}: {what} failed: {cause}; nothing of the batch was committed: run again to resume from the last committed batch"
    )]
    Transaction {
        /// The input topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// What was being done.
        what: &'static str,
        /// rdkafka's error.
        cause: RdError,
    },
    /// Another process took the partition over: this one is a zombie and stops.
    #[error(
        "kafka topic {topic} partition {partition}: another process of group {group} now owns the partition (this producer was fenced: {cause}); this process stops, and the new owner goes on from the last committed batch"
    )]
    Fenced {
        /// The input topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The group.
        group: String,
        /// rdkafka's error, as text.
        cause: String,
    },
    /// A changelog record is not one groupstate wrote.
    #[error(
        "kafka changelog {changelog} partition {partition} offset {offset}: {why}; the topic holds records groupstate did not write: give the group a changelog of its own (a new --group)"
    )]
    ChangelogRecord {
        /// The changelog topic.
        changelog: String,
        /// The partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
        /// What is wrong with it.
        why: String,
    },
}

fn base_config(bootstrap: &str, group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // A missing topic is an error, not a topic made with the broker's defaults.
        .set("allow.auto.create.topics", "false");
    config
}

/// Checks that the broker answers and has the topic; returns its partition count.
fn topic_partitions<C: rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
    input: &KafkaInput,
) -> Result<usize, KafkaError> {
    let metadata = consumer
        .fetch_metadata(Some(&input.topic), Duration::from_millis(BROKER_REQUEST_MS_MAX))
        .map_err(|cause| KafkaError::Unreachable { bootstrap: input.bootstrap.clone(), cause })?;
    let no_topic =
        |cause: String| KafkaError::NoTopic { topic: input.topic.clone(), bootstrap: input.bootstrap.clone(), cause };
    let topic = metadata
        .topics()
        .iter()
        .find(|t| t.name() == input.topic)
        .ok_or_else(|| no_topic("not in the metadata".into()))?;
    if let Some(e) = topic.error() {
        return Err(no_topic(format!("{e:?}")));
    }
    if topic.partitions().is_empty() {
        return Err(no_topic("it has no partitions".into()));
    }
    Ok(topic.partitions().len())
}

/// Reads one partition, at explicit offsets. The offset of a line is its record's
/// Kafka offset; the offset after a line is that offset plus one.
pub struct PartitionReader {
    consumer: BaseConsumer,
    topic: String,
    partition: i32,
    /// The offset after the last record returned (where reading goes on).
    next: u64,
    /// A record read past a replayed plan's end, kept for the next batch.
    held: Option<Line>,
    /// The last poll found the partition's end (`enable.partition.eof`; tansu's
    /// ListOffsets high watermark is wrong, the fetch's end is right).
    at_end: bool,
    line_bytes_max: usize,
    clock: Arc<dyn Clock>,
}

impl PartitionReader {
    /// A reader of `input`'s partition from `offset`: the local checkpoint's, which
    /// is the truth; without one (no local state), the partition's first. A partition
    /// without local state that the group has consumed past its first offset is
    /// refused ([`KafkaError::StateElsewhere`]): its state was built by another
    /// process or in a state dir that is gone.
    pub fn open(
        input: &KafkaInput,
        offset: Option<u64>,
        line_bytes_max: usize,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, KafkaError> {
        let partition = input.partition.unwrap_or(0);
        let consumer: BaseConsumer = base_config(&input.bootstrap, &input.group)
            .set("enable.partition.eof", "true")
            .set("queued.max.messages.kbytes", FETCH_QUEUE_KIB_MAX.to_string())
            // An offset that no longer exists is an error, never a silent jump.
            .set("auto.offset.reset", "error")
            .create()
            .map_err(|cause| KafkaError::Client { bootstrap: input.bootstrap.clone(), cause })?;
        topic_partitions(&consumer, input)?;
        let fail = |what, cause| KafkaError::Partition { topic: input.topic.clone(), partition, what, cause };
        let timeout = Duration::from_millis(BROKER_REQUEST_MS_MAX);
        let start = match offset {
            Some(offset) => offset,
            None => {
                let mut list = TopicPartitionList::new();
                list.add_partition(&input.topic, partition);
                let committed =
                    consumer.committed_offsets(list, timeout).map_err(|e| fail("reading the group's offset", e))?;
                // Only the low watermark: tansu's high one is wrong.
                let first = consumer
                    .fetch_watermarks(&input.topic, partition, timeout)
                    .map_err(|e| fail("reading the partition's start", e))?
                    .0
                    .max(0) as u64;
                match committed.find_partition(&input.topic, partition).map(|e| e.offset()) {
                    // Records the group has consumed made state that is not here:
                    // starting after them without it would lose it silently.
                    Some(Offset::Offset(n)) if n >= 0 && n as u64 > first => {
                        return Err(KafkaError::StateElsewhere {
                            topic: input.topic.clone(),
                            partition,
                            group: input.group.clone(),
                            offset: n as u64,
                        });
                    }
                    _ => first,
                }
            }
        };
        let mut reader = Self {
            consumer,
            topic: input.topic.clone(),
            partition,
            next: start,
            held: None,
            at_end: false,
            line_bytes_max,
            clock,
        };
        reader.seek(start)?;
        Ok(reader)
    }

    fn fail(&self, what: &'static str, cause: RdError) -> KafkaError {
        KafkaError::Partition { topic: self.topic.clone(), partition: self.partition, what, cause }
    }

    /// The offset after the last record returned.
    pub fn offset(&self) -> u64 {
        self.next
    }

    /// Whether the last read found the partition's end.
    pub fn at_end(&self) -> bool {
        self.at_end
    }

    /// The records after the last one read, from the partition's high watermark as
    /// the consumer's last fetch reported it (no request to the broker); none before
    /// the first fetch.
    pub fn lag(&self) -> Option<u64> {
        let topic = std::ffi::CString::new(self.topic.as_str()).ok()?;
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: the client pointer is valid while `self.consumer` lives, `topic` is a
        // NUL-terminated string that outlives the call, and the out-pointers point to
        // locals. librdkafka only reads its cached offsets here. rust-rdkafka 0.39 has
        // no safe call for them (`fetch_watermarks` asks the broker).
        #[allow(unsafe_code)]
        let err = unsafe {
            rdkafka::bindings::rd_kafka_get_watermark_offsets(
                self.consumer.client().native_ptr(),
                topic.as_ptr(),
                self.partition,
                &mut low,
                &mut high,
            )
        };
        (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
            .then(|| (high as u64).saturating_sub(self.next))
    }

    /// Reads from `offset` on: Kafka keeps the records, so a planned batch is read
    /// again by fetching from its start.
    pub fn seek(&mut self, offset: u64) -> Result<(), KafkaError> {
        if self.held.as_ref().is_some_and(|l| l.offset >= offset) && self.next == offset {
            return Ok(());
        }
        let mut list = TopicPartitionList::new();
        let at = Offset::Offset(offset as i64);
        list.add_partition_offset(&self.topic, self.partition, at).map_err(|e| self.fail("seeking", e))?;
        // A fresh assignment drops what was fetched for the old position.
        self.consumer.assign(&list).map_err(|e| self.fail("seeking", e))?;
        self.next = offset;
        self.held = None;
        self.at_end = false;
        Ok(())
    }

    /// Reads up to `max` records and `bytes_max` bytes: to `end_offset` exactly if it
    /// is given (a replayed plan), else until `wait` has passed with nothing more to
    /// read. `each` returns false to stop after its line.
    pub fn read_lines(
        &mut self,
        max: usize,
        bytes_max: u64,
        end_offset: Option<u64>,
        wait: Duration,
        each: &mut dyn FnMut(Line<&str>) -> Result<bool, crate::source::SourceError>,
    ) -> Result<(), crate::source::SourceError> {
        let started = self.clock.monotonic_ns();
        let wait_ns = if end_offset.is_some() { REPLAY_WAIT_MS_MAX * 1_000_000 } else { wait.as_nanos() as u64 };
        let (mut read, mut bytes) = (0usize, 0u64);
        while read < max && bytes < bytes_max && end_offset.is_none_or(|end| self.next < end) {
            let line = match self.held.take() {
                Some(line) => line,
                None => {
                    let left = wait_ns.saturating_sub(self.clock.monotonic_ns().saturating_sub(started));
                    if left == 0 {
                        if let Some(end) = end_offset {
                            let e = KafkaError::ReplayShort {
                                topic: self.topic.clone(),
                                partition: self.partition,
                                end,
                                at: self.next,
                            };
                            return Err(e.into());
                        }
                        break;
                    }
                    // Short polls, so that a replay notices its time is up.
                    match self.consumer.poll(Duration::from_nanos(left.min(100_000_000))) {
                        None => continue,
                        Some(Err(RdError::PartitionEOF(_))) => {
                            self.at_end = true;
                            continue;
                        }
                        Some(Err(cause)) => return Err(self.fail("reading", cause).into()),
                        Some(Ok(message)) => {
                            self.at_end = false;
                            let offset = message.offset().max(0) as u64;
                            // Left from before a seek (librdkafka drops these itself).
                            if offset < self.next {
                                continue;
                            }
                            let timestamp_ms = message.timestamp().to_millis();
                            self.line(offset, message.key(), message.payload(), timestamp_ms)
                        }
                    }
                }
            };
            if end_offset.is_some_and(|end| line.offset >= end) {
                self.held = Some(line);
                break;
            }
            self.next = line.offset + 1;
            bytes += line.text.as_ref().map_or(0, |t| t.len() as u64);
            read += 1;
            if !each(line.borrowed())? {
                break;
            }
        }
        Ok(())
    }

    /// A record as a line: its value is the line, its key the line's key. A record
    /// whose key or value the pipeline cannot use becomes a line error, which the
    /// batch sends to the dead-letter output with the offset.
    fn line(&self, offset: u64, key: Option<&[u8]>, value: Option<&[u8]>, timestamp_ms: Option<i64>) -> Line {
        let key = match key {
            None => Err("is missing; produce every record with its key".to_owned()),
            Some(k) if k.is_empty() || k.len() > KEY_BYTES_MAX => {
                Err(format!("has {} bytes; keys must have 1 to {KEY_BYTES_MAX} bytes", k.len()))
            }
            Some(k) => std::str::from_utf8(k).map(str::to_owned).map_err(|_| "is not UTF-8".to_owned()),
        };
        let text = match (value, &key) {
            (_, Err(why)) => Err(LineError::KafkaKey(why.clone())),
            (None, _) => Err(LineError::KafkaValue("is missing (a tombstone)".into())),
            (Some(v), _) if v.len() > self.line_bytes_max => {
                Err(LineError::TooLong { len: v.len() as u64, max: self.line_bytes_max })
            }
            // The late and dead-letter outputs hold the record on one line.
            (Some(v), _) if memchr::memchr2(b'\n', b'\r', v).is_some() => {
                Err(LineError::KafkaValue("holds a line break; produce compact JSON".into()))
            }
            (Some(v), Ok(_)) => std::str::from_utf8(v).map(str::to_owned).map_err(|_| LineError::NotUtf8),
        };
        let key = key.ok();
        Line { offset, key, timestamp_ms, text }
    }
}

/// A change of the partitions this process owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assignment {
    /// The group gave these partitions.
    Assigned(Vec<i32>),
    /// The group takes these back: the callback returns once they are stopped.
    Revoked(Vec<i32>),
}

/// Called inside the rebalance, on the thread that polls the member.
pub type OnAssignment = Box<dyn Fn(Assignment) + Send + Sync>;

struct GroupContext {
    topic: String,
    on_assignment: OnAssignment,
    /// The member's (steady, rebalance count) in the last statistics, if they said.
    last_stats: std::sync::Mutex<Option<(bool, i64)>>,
    /// The last two statistics found the member steady (joined, no rebalance under
    /// way) after the same rebalance: its assignment is the group's, and delivered.
    settled: std::sync::atomic::AtomicBool,
}

/// How often the group member's statistics come (500 ms): they tell a rebalance
/// under way, which a process about to stop must wait for.
const MEMBER_STATS_MS: u64 = 500;

impl ClientContext for GroupContext {
    /// Reads only the consumer group's state from librdkafka's statistics: whether
    /// the member is steady, and its rebalance count. Statistics that do not say
    /// leave the member settled, as it was before they were read.
    fn stats_raw(&self, statistics: &[u8]) {
        let cgrp = serde_json::from_slice::<serde_json::Value>(statistics).ok().and_then(|s| {
            let g = s.get("cgrp")?;
            let steady = g.get("state")?.as_str()? == "up" && g.get("join_state")?.as_str()? == "steady";
            Some((steady, g.get("rebalance_cnt")?.as_i64()?))
        });
        let mut last = self.last_stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let settled = match (*last, cgrp) {
            (Some((true, before)), Some((true, now))) => before == now,
            (_, Some(_)) => false,
            (_, None) => true,
        };
        *last = cgrp;
        self.settled.store(settled, std::sync::atomic::Ordering::Release);
    }
}

impl GroupContext {
    fn partitions(&self, list: &TopicPartitionList) -> Vec<i32> {
        list.elements().iter().filter(|e| e.topic() == self.topic).map(|e| e.partition()).collect()
    }
}

impl ConsumerContext for GroupContext {
    /// A revoked partition is stopped before the rebalance completes, so that its new
    /// owner never runs a batch while this process still does.
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            (self.on_assignment)(Assignment::Revoked(self.partitions(list)));
        }
    }

    /// The default `rebalance` has assigned (incrementally, with cooperative-sticky);
    /// the member reads nothing itself, so its partitions are paused at once.
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(list) => {
                let partitions = self.partitions(list);
                if partitions.is_empty() {
                    return;
                }
                if let Err(e) = consumer.pause(list) {
                    tracing::warn!("kafka: pausing the group member's fetch of {partitions:?} failed: {e}");
                }
                (self.on_assignment)(Assignment::Assigned(partitions));
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!("kafka: rebalance error: {e}"),
        }
    }
}

/// This process's membership in the consumer group.
pub struct GroupMember {
    consumer: BaseConsumer<GroupContext>,
    input: KafkaInput,
}

impl GroupMember {
    /// Checks the broker and the topic, then subscribes; partitions arrive through
    /// `on_assignment` while [`GroupMember::poll`] runs.
    pub fn join(input: &KafkaInput, on_assignment: OnAssignment) -> Result<Self, KafkaError> {
        let context = GroupContext {
            topic: input.topic.clone(),
            on_assignment,
            last_stats: std::sync::Mutex::new(None),
            settled: std::sync::atomic::AtomicBool::new(false),
        };
        let consumer: BaseConsumer<GroupContext> = base_config(&input.bootstrap, &input.group)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", SESSION_TIMEOUT_MS.to_string())
            .set("heartbeat.interval.ms", "500")
            .set("statistics.interval.ms", MEMBER_STATS_MS.to_string())
            .create_with_context(context)
            .map_err(|cause| KafkaError::Client { bootstrap: input.bootstrap.clone(), cause })?;
        topic_partitions(&consumer, input)?;
        let fail = |cause| KafkaError::Partition {
            topic: input.topic.clone(),
            partition: -1,
            what: "joining the group",
            cause,
        };
        consumer.subscribe(&[&input.topic]).map_err(fail)?;
        Ok(Self { consumer, input: input.clone() })
    }

    /// Whether no rebalance is under way as far as this member knows: its last two
    /// statistics (`MEMBER_STATS_MS` apart) found it steady after the same rebalance.
    /// A member that has just lost a peer is not: the group is about to give it
    /// more partitions.
    pub fn settled(&self) -> bool {
        self.consumer.context().settled.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Serves the group (heartbeats, rebalances: the callbacks run here) for up to
    /// `timeout`. A record that slipped in before its partition was paused is dropped:
    /// the partition's reader reads it.
    pub fn poll(&self, timeout: Duration) -> Result<(), KafkaError> {
        match self.consumer.poll(timeout) {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(RdError::PartitionEOF(_))) => Ok(()),
            Some(Err(cause)) => Err(KafkaError::Partition {
                topic: self.input.topic.clone(),
                partition: -1,
                what: "serving the group",
                cause,
            }),
        }
    }
}

/// Header of every output and changelog record: the input partition it came from.
pub const HEADER_PARTITION: &str = "groupstate.partition";
/// Header of every output and changelog record: its batch id.
pub const HEADER_BATCH: &str = "groupstate.batch";
/// Header of every output record: its index among the batch's records to its topic.
pub const HEADER_INDEX: &str = "groupstate.index";
/// Header of every changelog record: the input offset its batch started at.
pub const HEADER_START: &str = "groupstate.start";
/// Header of every changelog record: the input offset after its batch.
pub const HEADER_END: &str = "groupstate.end";
/// Header of a changelog's checkpoint records: the plugin world (1 or 2) whose
/// state the partition holds.
pub const HEADER_STATE_API: &str = "groupstate.state-api";
/// The key of a batch's checkpoint record in the changelog. Not UTF-8, so no state
/// key (UTF-8 by rule) can be it; compaction keeps the latest.
pub const CHECKPOINT_KEY: &[u8] = b"\xffgroupstate.checkpoint";

/// How long a transaction's steps may take (60 s): producing a batch to a slow
/// broker included.
const TRANSACTION_MS_MAX: u64 = 60_000;

/// The changelog topic of `group`: every committed key change of every partition.
pub fn changelog_topic(group: &str) -> String {
    format!("{group}-changelog")
}

/// The transactional id of `partition`'s producer: one per input partition, so that
/// the partition's next owner fences this one when it starts (Kafka Streams' first
/// exactly-once design, which needs nothing of the group's generation).
fn transactional_id(input: &KafkaInput, partition: i32) -> String {
    format!("groupstate-{}-{}-{partition}", input.group, input.topic)
}

/// Runs a future to completion on this thread: rdkafka's admin client's futures are
/// driven by librdkafka's own threads, this only waits (the tests' broker uses it too).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Thread(std::thread::Thread);
    impl Wake for Thread {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Thread(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// Checks the input topic and the output topics, and makes sure the group's
/// changelog topic exists with a partition for each input partition (compacted);
/// returns the input's partition count.
pub fn prepare_topics(input: &KafkaInput, outputs: &[&KafkaInput]) -> Result<usize, KafkaError> {
    let consumer: BaseConsumer = base_config(&input.bootstrap, &input.group)
        .create()
        .map_err(|cause| KafkaError::Client { bootstrap: input.bootstrap.clone(), cause })?;
    let partitions = topic_partitions(&consumer, input)?;
    for output in outputs {
        topic_partitions(&consumer, output)?;
    }
    let changelog = KafkaInput { topic: changelog_topic(&input.group), ..input.clone() };
    let create_failed = |cause: String| KafkaError::ChangelogCreate {
        bootstrap: input.bootstrap.clone(),
        changelog: changelog.topic.clone(),
        partitions,
        cause,
    };
    match topic_partitions(&consumer, &changelog) {
        Ok(has) if has >= partitions => return Ok(partitions),
        Ok(has) => {
            return Err(KafkaError::ChangelogPartitions {
                changelog: changelog.topic,
                has,
                topic: input.topic.clone(),
                needs: partitions,
            });
        }
        Err(KafkaError::NoTopic { .. }) => {}
        Err(e) => return Err(e),
    }
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &input.bootstrap)
        .create()
        .map_err(|cause| KafkaError::Client { bootstrap: input.bootstrap.clone(), cause })?;
    let new =
        NewTopic::new(&changelog.topic, partitions as i32, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_millis(BROKER_REQUEST_MS_MAX)));
    let results = block_on(admin.create_topics([&new], &options)).map_err(|e| create_failed(e.to_string()))?;
    for result in results {
        match result {
            Ok(_) => tracing::info!("kafka: created changelog topic {} ({partitions} partitions)", changelog.topic),
            // Another member created it meanwhile.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(create_failed(format!("{code:?}"))),
        }
    }
    Ok(partitions)
}

/// What the group has committed for a partition: the offset after its last
/// committed batch and, from the offset's metadata, the id of the next batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Committed {
    /// The offset after the last committed batch (0: nothing committed).
    pub offset: u64,
    /// The next batch's id, if the commit was a groupstate transaction's.
    pub next_batch_id: Option<u64>,
}

/// The offset metadata of a transaction's commit: the next batch's id.
fn committed_metadata(next_batch_id: u64) -> String {
    format!("groupstate next-batch {next_batch_id}")
}

/// One partition's transactions: each batch's output records, its changelog
/// records and its consumed offset go to Kafka as one transaction, before the local
/// commit. Opening it fences every earlier producer of the partition (a zombie's open
/// transaction is aborted), then reads what the group has committed.
pub struct PartitionTransactions {
    producer: BaseProducer,
    input: KafkaInput,
    partition: i32,
    changelog: String,
    group_metadata: ConsumerGroupMetadata,
    committed: Committed,
}

impl PartitionTransactions {
    /// Opens `input`'s partition's transactional producer (fencing the partition's
    /// earlier owners) and reads the group's committed offset.
    pub fn open(input: &KafkaInput) -> Result<Self, KafkaError> {
        let partition = input.partition.unwrap_or(0);
        let client = |cause| KafkaError::Client { bootstrap: input.bootstrap.clone(), cause };
        let fail = |what, cause| KafkaError::Transaction { topic: input.topic.clone(), partition, what, cause };
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &input.bootstrap)
            .set("transactional.id", transactional_id(input, partition))
            .set("transaction.timeout.ms", TRANSACTION_MS_MAX.to_string())
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "1000000")
            .create()
            .map_err(client)?;
        producer
            .init_transactions(Duration::from_millis(TRANSACTION_MS_MAX))
            .map_err(|e| fail("starting the partition's producer (init_transactions)", e))?;
        // Only for the group's metadata and committed offset: it never joins the group.
        let consumer: BaseConsumer = base_config(&input.bootstrap, &input.group).create().map_err(client)?;
        let group_metadata = consumer
            .group_metadata()
            .ok_or_else(|| fail("reading the group's metadata", RdError::ClientCreation("none".into())))?;
        let mut list = TopicPartitionList::new();
        list.add_partition(&input.topic, partition);
        let timeout = Duration::from_millis(BROKER_REQUEST_MS_MAX);
        let committed = consumer.committed_offsets(list, timeout).map_err(|e| fail("reading the group's offset", e))?;
        let committed = match committed.find_partition(&input.topic, partition) {
            Some(e) => match e.offset() {
                Offset::Offset(n) if n >= 0 => Committed {
                    offset: n as u64,
                    next_batch_id: e.metadata().strip_prefix("groupstate next-batch ").and_then(|n| n.parse().ok()),
                },
                _ => Committed::default(),
            },
            None => Committed::default(),
        };
        Ok(Self {
            producer,
            input: input.clone(),
            partition,
            changelog: changelog_topic(&input.group),
            group_metadata,
            committed,
        })
    }

    /// What the group had committed for the partition when this opened, or since
    /// by this producer.
    pub fn committed(&self) -> Committed {
        self.committed
    }

    fn error(&self, what: &'static str, cause: RdError) -> KafkaError {
        let fenced = match &cause {
            RdError::Transaction(e) => {
                e.is_fatal()
                    || matches!(e.code(), RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch)
            }
            other => matches!(
                other.rdkafka_error_code(),
                Some(
                    RDKafkaErrorCode::ProducerFenced
                        | RDKafkaErrorCode::InvalidProducerEpoch
                        | RDKafkaErrorCode::Fenced
                )
            ),
        };
        if fenced {
            return KafkaError::Fenced {
                topic: self.input.topic.clone(),
                partition: self.partition,
                group: self.input.group.clone(),
                cause: cause.to_string(),
            };
        }
        KafkaError::Transaction { topic: self.input.topic.clone(), partition: self.partition, what, cause }
    }

    /// Queues one record; a full queue drains as the broker acknowledges.
    fn send(&self, mut record: BaseRecord<'_, [u8], [u8]>) -> Result<(), KafkaError> {
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((RdError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((cause, _)) => return Err(self.error("producing", cause)),
            }
        }
    }

    /// The transaction of one batch; the caller aborts on error.
    fn transact(&mut self, batch: &ExportBatch<'_>) -> Result<(), KafkaError> {
        let timeout = Duration::from_millis(TRANSACTION_MS_MAX);
        let plan = batch.plan;
        self.producer.begin_transaction().map_err(|e| self.error("beginning the transaction", e))?;
        let (partition, batch_id) = (self.partition.to_string(), plan.batch_id.to_string());
        for TopicRecords { topic, records } in batch.topics {
            for (index, out) in records.iter().enumerate() {
                let index = index.to_string();
                let headers = OwnedHeaders::new_with_capacity(3)
                    .insert(Header { key: HEADER_PARTITION, value: Some(&partition) })
                    .insert(Header { key: HEADER_BATCH, value: Some(&batch_id) })
                    .insert(Header { key: HEADER_INDEX, value: Some(&index) });
                let mut record = BaseRecord::to(topic).payload(out.line.as_bytes()).headers(headers);
                // A dead letter of a record without a key has none either.
                if !out.key.is_empty() {
                    record = record.key(out.key.as_bytes());
                }
                self.send(record)?;
            }
        }
        let (start, end) = (plan.start_offset.to_string(), plan.end_offset.to_string());
        let headers = || {
            OwnedHeaders::new_with_capacity(4)
                .insert(Header { key: HEADER_PARTITION, value: Some(&partition) })
                .insert(Header { key: HEADER_BATCH, value: Some(&batch_id) })
                .insert(Header { key: HEADER_START, value: Some(&start) })
                .insert(Header { key: HEADER_END, value: Some(&end) })
        };
        for change in batch.changes {
            let value = change.after.as_ref().map(crate::codec::encode);
            let mut record =
                BaseRecord::to(&self.changelog).partition(self.partition).key(change.key.as_bytes()).headers(headers());
            if let Some(value) = &value {
                record = record.payload(value.as_slice());
            }
            self.send(record)?;
        }
        let checkpoint = crate::codec::encode(batch.checkpoint);
        let state_api = batch.state_api.to_string();
        let record = BaseRecord::to(&self.changelog)
            .partition(self.partition)
            .key(CHECKPOINT_KEY)
            .payload(checkpoint.as_slice())
            .headers(headers().insert(Header { key: HEADER_STATE_API, value: Some(&state_api) }));
        self.send(record)?;
        let mut offsets = TopicPartitionList::new();
        let next = Offset::Offset(plan.end_offset as i64);
        offsets
            .add_partition_offset(&self.input.topic, self.partition, next)
            .map_err(|e| self.error("sending the offset", e))?;
        if let Some(mut e) = offsets.find_partition(&self.input.topic, self.partition) {
            e.set_metadata(committed_metadata(batch.checkpoint.next_batch_id));
        }
        // Every record is delivered before the offset goes to the group: a broker
        // that applies a transaction's offset commit before the transaction ends
        // (tansu does, it seems) would otherwise show the batch consumed while a
        // crash lost records still queued here.
        self.producer.flush(timeout).map_err(|e| self.error("delivering the batch's records", e))?;
        self.producer
            .send_offsets_to_transaction(&offsets, &self.group_metadata, timeout)
            .map_err(|e| self.error("sending the offset to the transaction", e))?;
        self.producer.commit_transaction(timeout).map_err(|e| self.error("committing the transaction", e))?;
        Ok(())
    }
}

impl BatchExport for PartitionTransactions {
    fn exported(&self, plan: &BatchPlan) -> bool {
        match self.committed.next_batch_id {
            Some(next) => plan.batch_id < next,
            // Not a groupstate commit: only the offset tells.
            None => plan.start_offset < plan.end_offset && plan.end_offset <= self.committed.offset,
        }
    }

    fn export(&mut self, batch: &ExportBatch<'_>) -> Result<(), ExportError> {
        if let Err(e) = self.transact(batch) {
            if !matches!(e, KafkaError::Fenced { .. })
                && let Err(abort) = self.producer.abort_transaction(Duration::from_millis(TRANSACTION_MS_MAX))
            {
                tracing::warn!("kafka: aborting the transaction of batch {} failed: {abort}", batch.plan.batch_id);
            }
            return Err(Box::new(e));
        }
        self.committed =
            Committed { offset: batch.plan.end_offset, next_batch_id: Some(batch.checkpoint.next_batch_id) };
        Ok(())
    }
}

/// Reads one partition of the group's changelog from its start to its end.
pub struct ChangelogReader {
    consumer: BaseConsumer,
    changelog: String,
    partition: i32,
    at_end: bool,
    clock: Arc<dyn Clock>,
}

impl ChangelogReader {
    /// A reader of `input`'s partition's changelog, from its first record.
    pub fn open(input: &KafkaInput, clock: Arc<dyn Clock>) -> Result<Self, KafkaError> {
        let partition = input.partition.unwrap_or(0);
        let changelog = changelog_topic(&input.group);
        let consumer: BaseConsumer = base_config(&input.bootstrap, &input.group)
            .set("enable.partition.eof", "true")
            .set("queued.max.messages.kbytes", FETCH_QUEUE_KIB_MAX.to_string())
            .set("isolation.level", "read_committed")
            .create()
            .map_err(|cause| KafkaError::Client { bootstrap: input.bootstrap.clone(), cause })?;
        let mut list = TopicPartitionList::new();
        let fail = |cause| KafkaError::Partition { topic: changelog.clone(), partition, what: "reading", cause };
        list.add_partition_offset(&changelog, partition, Offset::Beginning).map_err(fail)?;
        consumer.assign(&list).map_err(fail)?;
        Ok(Self { consumer, changelog, partition, at_end: false, clock })
    }

    /// The next record, or `None` at the partition's end.
    pub fn next_record(&mut self) -> Result<Option<ChangelogRecord>, KafkaError> {
        let started = self.clock.monotonic_ns();
        while !self.at_end {
            match self.consumer.poll(Duration::from_millis(100)) {
                None if self.clock.monotonic_ns().saturating_sub(started) > BROKER_REQUEST_MS_MAX * 1_000_000 => {
                    return Err(KafkaError::Partition {
                        topic: self.changelog.clone(),
                        partition: self.partition,
                        what: "reading",
                        cause: RdError::MessageConsumption(RDKafkaErrorCode::RequestTimedOut),
                    });
                }
                None => {}
                Some(Err(RdError::PartitionEOF(_))) => self.at_end = true,
                Some(Err(cause)) => {
                    let (topic, partition) = (self.changelog.clone(), self.partition);
                    return Err(KafkaError::Partition { topic, partition, what: "reading", cause });
                }
                Some(Ok(message)) => return self.record(&message).map(Some),
            }
        }
        Ok(None)
    }

    fn record(&self, message: &BorrowedMessage<'_>) -> Result<ChangelogRecord, KafkaError> {
        let bad = |why: String| KafkaError::ChangelogRecord {
            changelog: self.changelog.clone(),
            partition: self.partition,
            offset: message.offset(),
            why,
        };
        let optional_header = |name: &str| -> Result<Option<u64>, KafkaError> {
            let headers = message.headers().ok_or_else(|| bad("it has no headers".into()))?;
            let Some(value) = headers.iter().find(|h| h.key == name).and_then(|h| h.value) else {
                return Ok(None);
            };
            let number = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            number.map(Some).ok_or_else(|| bad(format!("header {name} is not a number")))
        };
        let header = |name: &str| optional_header(name)?.ok_or_else(|| bad(format!("header {name} is missing")));
        let key = message.key().ok_or_else(|| bad("it has no key".into()))?;
        let entry = if key == CHECKPOINT_KEY {
            let value = message.payload().ok_or_else(|| bad("the checkpoint record is empty".into()))?;
            let checkpoint = crate::codec::decode("changelog checkpoint", value).map_err(|e| bad(e.to_string()))?;
            let state_api = match optional_header(HEADER_STATE_API)? {
                Some(api @ (1 | 2)) => Some(api as u32),
                Some(other) => return Err(bad(format!("header {HEADER_STATE_API} is {other}; it is 1 or 2"))),
                None => None,
            };
            ChangelogEntry::Checkpoint { checkpoint, state_api }
        } else {
            if key.is_empty() || key.len() > KEY_BYTES_MAX {
                return Err(bad(format!("its key has {} bytes; keys have 1 to {KEY_BYTES_MAX}", key.len())));
            }
            let key = std::str::from_utf8(key).map_err(|_| bad("its key is not UTF-8".into()))?.to_owned();
            let after: Option<crate::records::KeyRecord> = match message.payload() {
                None => None,
                Some(v) => Some(crate::codec::decode("changelog record", v).map_err(|e| bad(e.to_string()))?),
            };
            if after.as_ref().is_some_and(|r| r.is_empty()) {
                return Err(bad("it holds an empty record (a removal is a record without a value)".into()));
            }
            ChangelogEntry::Key(KeyChange { key, before: None, after })
        };
        Ok(ChangelogRecord {
            batch_id: header(HEADER_BATCH)?,
            start_offset: header(HEADER_START)?,
            end_offset: header(HEADER_END)?,
            entry,
        })
    }
}
