//! Kafka, and the only module that touches rdkafka: a partition's reader (what
//! `source.rs` reads one partition's records through) and the consumer-group member
//! that learns which partitions this process owns and commits the group's offsets.
//!
//! Two kinds of client, so that each does one thing. The group member subscribes
//! (cooperative-sticky), takes part in rebalances and commits offsets, but reads
//! nothing: it pauses every partition it is given. Each partition is read by a reader
//! of its own, a consumer that is assigned that one partition at an explicit offset
//! and never joins the group, so a partition's pipeline can seek its own input
//! (re-reading a planned batch) without disturbing the others.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError as RdError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::clock::Clock;
use crate::config::KafkaInput;
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
    /// The group has consumed a partition that this process has no state for.
    #[error(
        "kafka topic {topic} partition {partition}: group {group} has consumed it up to offset {offset}, but this state dir holds no state for it (it was built elsewhere, and restoring a partition from a changelog is not there yet): run with the --state-dir that holds partition-{partition}, or start over with a new --group"
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
        each: &mut dyn FnMut(Line) -> Result<bool, crate::source::SourceError>,
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
                            self.line(offset, message.key(), message.payload())
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
            if !each(line)? {
                break;
            }
        }
        Ok(())
    }

    /// A record as a line: its value is the line, its key the line's key. A record
    /// whose key or value the pipeline cannot use becomes a line error, which the
    /// batch sends to the dead-letter output with the offset.
    fn line(&self, offset: u64, key: Option<&[u8]>, value: Option<&[u8]>) -> Line {
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
        Line { offset, key, text }
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
}

impl ClientContext for GroupContext {}

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
        let context = GroupContext { topic: input.topic.clone(), on_assignment };
        let consumer: BaseConsumer<GroupContext> = base_config(&input.bootstrap, &input.group)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", SESSION_TIMEOUT_MS.to_string())
            .set("heartbeat.interval.ms", "500")
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

    /// Commits `next` (the offset after the last committed record) as the group's
    /// offset of `partition`, without waiting: for monitoring, and the resume point of
    /// a partition that has no local state.
    pub fn commit(&self, partition: i32, next: u64) -> Result<(), KafkaError> {
        let mut list = TopicPartitionList::new();
        let fail =
            |cause| KafkaError::Partition { topic: self.input.topic.clone(), partition, what: "committing", cause };
        list.add_partition_offset(&self.input.topic, partition, Offset::Offset(next as i64)).map_err(fail)?;
        self.consumer.commit(&list, CommitMode::Async).map_err(fail)
    }

    /// Serves the member for a moment, so that the commits made without waiting reach
    /// the broker before the member leaves the group.
    pub fn flush_commits(&self) {
        for _ in 0..5 {
            let _ = self.consumer.poll(Duration::from_millis(100));
        }
    }
}
