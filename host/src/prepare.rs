//! The first stage of a batch: reading its input lines, decoding them, setting late
//! and bad records aside and grouping the rest by key.
//!
//! A prepared batch depends on its [`Request`] (input range, watermark, limits) and
//! the input (near the end of a file read to its end, on how much is left, judged by
//! the lines of the batch before: see [`ramped_down`]), and it has no effect of its
//! own: late and bad records are handed back, to be written by the batch that commits
//! them, and the plan written after it fixes the batch's range, which a replay reads
//! exactly. So for a file input the stage runs on its own thread, one batch ahead of
//! the plugin calls and the commit (the second core), and a prefetched batch that turns
//! out not to be the one the pipeline asks for (after a rollback, say) is simply
//! dropped and prepared again. Stdin is prepared in line: its lines cannot be read
//! twice.

use std::sync::{Arc, mpsc};
use std::time::Duration;

use crate::clock::Clock;
use crate::decode::Decoder;
use crate::groups::KeyNumber;
pub(crate) use crate::groups::{Groups, Scratch};
use crate::source::{Rotation, Source, SourceError};
use crate::store::{PageReader, StoredAhead};

/// What to prepare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// The batch id (named in dead-letter entries).
    pub batch_id: u64,
    /// Where the batch starts in the input.
    pub start_offset: u64,
    /// A replayed plan's end: read exactly to here. `None` for a new batch.
    pub end_offset: Option<u64>,
    /// Records with an event time below it are late.
    pub watermark_ms: i64,
    /// At most this many records (a new batch near the end of a file read to its end
    /// may read fewer: see [`ramped_down`]).
    pub records_max: usize,
    /// The records to make room for: the most a batch of the run may read
    /// (`batch_events_max`, also while a run's first batches ramp up to it). The memory
    /// a batch is read into is used again by later batches, and is given by the system
    /// only as far as a batch fills it; with room made for each ramped batch in turn,
    /// twice the one before, every batch was read into memory given afresh (a third of
    /// the input thread's time over 1M events and 10k sensors).
    pub records_room: usize,
    /// Ends after the line that reaches this many input bytes.
    pub bytes_max: u64,
    /// Cut before the record that would bring one more distinct key.
    pub keys_max: usize,
    /// How long stdin may wait for a first line.
    pub wait: Duration,
    /// Read the stored records of the batch's keys ahead too (for a 0.1 plugin, which
    /// `Store::get_many` loads them for; a seekable input's batches only, prepared on
    /// a thread of their own).
    pub read_stored: bool,
}

/// A prepared batch.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    /// Where the batch ends in the input (after a cut, where the next one starts).
    pub end_offset: u64,
    pub groups: Groups,
    /// Lines for the late-data output.
    pub late_lines: Vec<String>,
    /// Entries for the dead-letter output (records that could not be decoded).
    pub bad_lines: Vec<String>,
    /// Records read (good, late and bad).
    pub records: u64,
    /// The largest event time among the grouped records.
    pub max_event_time_ms: Option<i64>,
    /// Stdin has closed.
    pub closed: bool,
    /// A Kafka partition's read found its end.
    pub at_end: bool,
    /// The Kafka partition's records after the batch, as its consumer knows them.
    pub lag: Option<u64>,
    /// A digest of the input before `end_offset` (see `Source::digest_before`),
    /// committed with it.
    pub input_digest: u32,
    /// The followed input file was read to its end and then found rotated.
    pub input_rotation: Option<Rotation>,
    /// The records sled held for the groups' keys, read ahead (see
    /// [`Request::read_stored`]; empty otherwise).
    pub stored: StoredAhead,
    /// Time spent reading lines, decoding and grouping them and reading their keys'
    /// stored records, in nanoseconds.
    pub read_decode_ns: u64,
}

/// The fewest records a batch ramped up or down reads: a smaller `batch_events_max` is
/// not ramped up (see `pipeline::ramped_records_max`), and the end of a file is not
/// ramped down into batches smaller than this ([`ramped_down`]).
pub(crate) const RAMP_RECORDS_MIN: usize = 16_384;

/// The records a new batch of a file read to its end may read, `lines_left` being about
/// the lines left in it: half of those, at least [`RAMP_RECORDS_MIN`] and at most
/// `records_max` (so the whole batch while two or more batches are left). The last
/// batch of a run is processed with nothing left to read meanwhile; halving what is left
/// ends a run with a few small batches, the later read while the earlier are processed,
/// instead of one as large as the rest (over 1M events and 10k sensors, a 500 000-record
/// batch processed alone was about a third of the run).
fn ramped_down(records_max: usize, lines_left: Option<u64>) -> usize {
    let Some(left) = lines_left else { return records_max };
    let left = usize::try_from(left).unwrap_or(usize::MAX);
    records_max.min(left.div_ceil(2).max(RAMP_RECORDS_MIN))
}

/// Lines read between two calls of the `idle` callback of [`prepare`].
const LINES_BETWEEN_IDLE: u64 = 4096;

/// The most keys a batch reserves room for up front (`batch_keys_max` may be far more).
const KEYS_RESERVED_MAX: usize = 1 << 16;

/// Reads and prepares one batch from `source` into `spare` (emptied first: the memory
/// of a batch done with), calling `idle` every few thousand lines (the input thread
/// takes back recycled batches there), and reads its keys' stored records with `pages`
/// when the request asks for them.
#[allow(clippy::too_many_arguments)]
fn prepare(
    source: &mut Source,
    decoder: &Decoder,
    clock: &dyn Clock,
    req: &Request,
    spare: Spare,
    pages: Option<&PageReader>,
    scratch: &mut Scratch,
    idle: &mut dyn FnMut(),
) -> Result<Prepared, SourceError> {
    let started = clock.monotonic_ns();
    // A rotated input goes on from the start of the new file, even after an empty old one.
    if source.offset() != req.start_offset || (req.start_offset == 0 && source.rotation().is_some()) {
        source.rewind_to(req.start_offset)?;
    }
    let Spare { mut groups, mut stored } = spare;
    groups.clear();
    stored.clear();
    let mut out = Prepared { groups, stored, ..Prepared::default() };
    // Room for the whole batch at once: a batch over many keys used to grow its groups
    // by doubling, copying as it went (a fifth of the input thread's time at a million
    // keys).
    let keys_expected = req.keys_max.min(req.records_room).min(KEYS_RESERVED_MAX);
    let (records_expected, text_expected) = scratch.expected_batch(req.records_room, req.bytes_max);
    out.groups.reserve(keys_expected, records_expected, text_expected);
    scratch.start_batch();
    // A replay reads its planned range, whatever is left after it.
    let records_max = match req.end_offset {
        Some(_) => req.records_max,
        None => ramped_down(req.records_max, source.bytes_left().and_then(|b| scratch.lines_in(b))),
    };
    let mut cut = None;
    source.read_lines(records_max, req.bytes_max, req.end_offset, req.wait, |line| {
        if out.records.is_multiple_of(LINES_BETWEEN_IDLE) {
            idle();
        }
        let text = match line.text {
            Ok(text) => text,
            Err(e) => {
                out.records += 1;
                out.bad_lines.push(bad_record(req.batch_id, line.offset, &e.to_string(), None));
                return Ok(true);
            }
        };
        let decoded = match decoder.decode(text) {
            Ok(d) => d,
            Err(e) => {
                out.records += 1;
                out.bad_lines.push(bad_record(req.batch_id, line.offset, &e.to_string(), Some(text)));
                return Ok(true);
            }
        };
        let event_time_ms = match (decoder.uses_kafka_timestamp(), line.timestamp_ms) {
            (false, _) => decoded.event_time_ms,
            (true, Some(t)) => Some(t),
            (true, None) => {
                out.records += 1;
                let why = "the record has no Kafka timestamp, which --kafka-timestamp takes as its event time";
                out.bad_lines.push(bad_record(req.batch_id, line.offset, why, Some(text)));
                return Ok(true);
            }
        };
        if let Some(t) = event_time_ms
            && t < req.watermark_ms
        {
            out.records += 1;
            out.late_lines.push(format!(
                "{{\"offset\":{},\"event_time_ms\":{t},\"watermark_ms\":{},\"record\":{}}}",
                line.offset, req.watermark_ms, text
            ));
            return Ok(true);
        }
        // A Kafka record's key is its group key; a key field, when named, must agree,
        // since the key's state lives in the one partition its Kafka key picks.
        let key = match (line.key, decoder.key_field()) {
            (None, _) => decoded.key,
            (Some(kafka_key), None) => std::borrow::Cow::Borrowed(kafka_key),
            (Some(kafka_key), Some(_)) if kafka_key == decoded.key => decoded.key,
            (Some(kafka_key), Some(field)) => {
                let reason = format!(
                    "key field {field:?} is {:?} but the record's kafka key is {kafka_key:?}; a key's state lives in the partition its kafka key picks, so produce each record with its key field as its kafka key",
                    decoded.key
                );
                out.records += 1;
                out.bad_lines.push(bad_record(req.batch_id, line.offset, &reason, Some(text)));
                return Ok(true);
            }
        };
        let groups = &mut out.groups;
        let slot = match scratch.number_of(groups, &key) {
            KeyNumber::Known(i) => i,
            KeyNumber::New(_) if groups.len() == req.keys_max => {
                // This record starts the next batch.
                cut = Some(line.offset);
                return Ok(false);
            }
            KeyNumber::New(hash) => {
                scratch.add_key(groups, hash);
                groups.len()
            }
        };
        groups.push(slot, &key, text, event_time_ms);
        out.records += 1;
        // `None` orders below every `Some`.
        out.max_event_time_ms = out.max_event_time_ms.max(event_time_ms);
        Ok(true)
    })?;
    out.groups.finish(scratch);
    if let Some(pages) = pages.filter(|_| req.read_stored) {
        let keys: Vec<&str> = out.groups.keys().collect();
        // A failed read leaves the records to the batch loop, which reads them itself
        // and reports the error.
        if pages.read(&keys, out.groups.key_order(), &mut out.stored).is_err() {
            out.stored.clear();
        }
    }
    if let Some(offset) = cut {
        source.rewind_to(offset)?;
    }
    if let Some(planned) = req.end_offset
        && source.offset() != planned
    {
        return Err(SourceError::Changed { planned, read: source.offset() });
    }
    out.end_offset = source.offset();
    out.closed = source.is_closed();
    out.at_end = source.at_end();
    out.lag = source.lag();
    out.input_digest = source.digest_before(out.end_offset)?;
    out.input_rotation = source.rotation();
    out.read_decode_ns = clock.monotonic_ns().saturating_sub(started);
    Ok(out)
}

impl Prepared {
    /// Moves the records whose event time is above `bound` (the batch's processing
    /// time plus `event_time_ahead_max_ms`) to the dead-letter lines, so that they do
    /// not move the watermark: one record from a clock years ahead would make every
    /// later record late. This runs once the batch's processing time is fixed (it is
    /// not known when a batch is read ahead); a replay has the same plan, so it sets
    /// aside the same records.
    pub fn set_aside_far_ahead(&mut self, batch_id: u64, bound: i64, ahead_max_ms: i64) {
        if self.max_event_time_ms.is_none_or(|t| t <= bound) {
            return;
        }
        let Self { groups, bad_lines, max_event_time_ms, stored, .. } = self;
        *max_event_time_ms = None;
        // The records read ahead are numbered as the keys were.
        stored.clear();
        groups.retain(|key, event| match event.event_time_ms {
            Some(t) if t > bound => {
                bad_lines.push(
                    serde_json::json!({
                        "kind": "event-time-ahead",
                        "batch": batch_id,
                        "key": key,
                        "event_time_ms": t,
                        "reason": format!(
                            "event time {t} is more than event_time_ahead_max_ms ({ahead_max_ms}) ahead of the batch's processing time; fix the producer's clock, or raise --event-time-ahead-max-ms"
                        ),
                        "line": event.payload,
                    })
                    .to_string(),
                );
                false
            }
            other => {
                *max_event_time_ms = (*max_event_time_ms).max(other);
                true
            }
        });
    }
}

/// A dead-letter entry for a record that could not be decoded.
fn bad_record(batch_id: u64, offset: u64, reason: &str, line: Option<&str>) -> String {
    serde_json::json!({
        "kind": "bad-record",
        "batch": batch_id,
        "offset": offset,
        "reason": reason,
        "line": line,
    })
    .to_string()
}

type Reply = Result<Prepared, SourceError>;

/// The memory of a batch done with, which the next one is read into.
#[derive(Debug, Default)]
struct Spare {
    groups: Groups,
    stored: StoredAhead,
}

impl From<Prepared> for Spare {
    fn from(done: Prepared) -> Self {
        Self { groups: done.groups, stored: done.stored }
    }
}

/// Prepares batches: on a thread of its own, one batch ahead, for a file; in line for
/// stdin.
pub(crate) enum Preparer {
    InLine {
        source: Source,
        decoder: Decoder,
        clock: Arc<dyn Clock>,
        scratch: Box<Scratch>,
    },
    Ahead {
        requests: mpsc::Sender<Request>,
        /// Batches done with, for the input thread to free.
        recycled: mpsc::Sender<Prepared>,
        replies: mpsc::Receiver<Reply>,
        /// The request sent and not yet answered.
        outstanding: Option<Request>,
    },
}

impl std::fmt::Debug for Preparer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InLine { source, .. } => write!(f, "Preparer::InLine({source:?})"),
            Self::Ahead { outstanding, .. } => write!(f, "Preparer::Ahead({outstanding:?})"),
        }
    }
}

impl Preparer {
    /// A preparer for `source`: a thread of its own for a seekable input, which reads
    /// the stored records of each batch's keys with `pages` too when asked.
    pub fn new(
        source: Source,
        decoder: Decoder,
        clock: Arc<dyn Clock>,
        pages: PageReader,
    ) -> Result<Self, SourceError> {
        if !source.is_seekable() {
            return Ok(Self::InLine { source, decoder, clock, scratch: Box::default() });
        }
        let (requests, requests_rx) = mpsc::channel::<Request>();
        let (recycled, recycled_rx) = mpsc::channel::<Prepared>();
        let (replies_tx, replies) = mpsc::sync_channel::<Reply>(1);
        let mut source = source;
        std::thread::Builder::new()
            .name("groupstate-input".into())
            .spawn(move || {
                // Ends when the pipeline drops its end of the channels.
                // Recycled batches are taken back before each request and every few
                // thousand lines: the last one's groups are filled again by the next
                // request, the others freed.
                let (mut spare, mut scratch) = (Spare::default(), Scratch::default());
                for req in requests_rx {
                    let take_recycled = |spare: &mut Spare| {
                        if let Some(done) = recycled_rx.try_iter().last() {
                            *spare = done.into();
                        }
                    };
                    take_recycled(&mut spare);
                    let batch = std::mem::take(&mut spare);
                    let (clock, pages) = (clock.as_ref(), Some(&pages));
                    let prepared = prepare(&mut source, &decoder, clock, &req, batch, pages, &mut scratch, &mut || {
                        take_recycled(&mut spare)
                    });
                    if replies_tx.send(prepared).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| SourceError::Thread(format!("cannot start the input thread: {e}")))?;
        Ok(Self::Ahead { requests, recycled, replies, outstanding: None })
    }

    /// Whether the input can be read again from an earlier offset.
    pub fn is_seekable(&self) -> bool {
        matches!(self, Self::Ahead { .. })
    }

    /// Starts preparing `req` in the background (a file input only), if nothing else
    /// is being prepared.
    pub fn prefetch(&mut self, req: Request) {
        if let Self::Ahead { requests, outstanding: outstanding @ None, .. } = self
            && requests.send(req.clone()).is_ok()
        {
            *outstanding = Some(req);
        }
    }

    /// Hands a batch that is done with back to the thread that allocated it, which
    /// fills its groups again for a later batch (or frees it).
    pub fn recycle(&mut self, prepared: Prepared) {
        if let Self::Ahead { recycled, .. } = self {
            // If the thread has stopped, the batch is dropped here instead.
            let _ = recycled.send(prepared);
        }
    }

    /// The batch for `req`: the prefetched one if it was prepared for exactly this
    /// request, else prepared now.
    pub fn get(&mut self, req: Request) -> Result<Prepared, SourceError> {
        match self {
            Self::InLine { source, decoder, clock, scratch } => {
                prepare(source, decoder, clock.as_ref(), &req, Spare::default(), None, scratch, &mut || {})
            }
            Self::Ahead { requests, replies, outstanding, .. } => {
                let gone = || {
                    SourceError::Thread(
                        "the input thread stopped; run again to resume from the last committed batch".into(),
                    )
                };
                match outstanding.take() {
                    Some(sent) if sent == req => return replies.recv().map_err(|_| gone())?,
                    // Not the batch wanted: wait for it and drop it.
                    Some(_) => drop(replies.recv()),
                    None => {}
                }
                requests.send(req).map_err(|_| gone())?;
                replies.recv().map_err(|_| gone())?
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;

    fn request(start_offset: u64, watermark_ms: i64) -> Request {
        Request {
            batch_id: 7,
            start_offset,
            end_offset: None,
            watermark_ms,
            records_max: 3,
            records_room: 3,
            bytes_max: u64::MAX,
            keys_max: 2,
            wait: Duration::ZERO,
            read_stored: true,
        }
    }

    #[test]
    fn the_end_of_a_file_is_read_in_halves_down_to_the_ramps_least() {
        let max = 500_000;
        assert_eq!(ramped_down(max, None), max, "not a file read to its end, or no line read yet");
        assert_eq!(ramped_down(max, Some(2_000_000)), max);
        assert_eq!(ramped_down(max, Some(1_000_000)), max, "two whole batches left");
        assert_eq!(ramped_down(max, Some(999_999)), 500_000);
        assert_eq!(ramped_down(max, Some(531_999)), 266_000);
        assert_eq!(ramped_down(max, Some(20_001)), RAMP_RECORDS_MIN);
        assert_eq!(ramped_down(max, Some(0)), RAMP_RECORDS_MIN);
        // A batch smaller than the ramp's least is never made larger.
        assert_eq!(ramped_down(40, Some(50)), 40);
        assert_eq!(ramped_down(40, Some(7)), 40);
    }

    fn keys(p: &Prepared) -> Vec<(String, usize)> {
        p.groups.ranges().map(|(k, e)| (k.to_owned(), e.len())).collect()
    }

    #[test]
    fn a_prefetched_batch_is_used_only_for_the_request_it_was_made_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        let lines = [
            r#"{"k":"a","t":10}"#,
            r#"{"k":"a","t":11}"#,
            r#"{"k":"b","t":5}"#,
            r#"{"k":"c","t":12}"#,
            "not json",
            r#"{"k":"c","t":13}"#,
        ];
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let offset = |i: usize| lines[..i].iter().map(|l| l.len() as u64 + 1).sum::<u64>();
        let source = Source::open_file(&path, 0, 0, 1 << 10, false).unwrap();
        let store = crate::store::Store::open(&dir.path().join("store"), 1 << 20, 1 << 20, 1 << 20).unwrap();
        let pages = store.page_reader();
        let mut input = Preparer::new(source, Decoder::new("k", Some("t")), Arc::new(SystemClock), pages).unwrap();

        // Batch 0: three records, two keys.
        let first = input.get(request(0, 0)).unwrap();
        assert_eq!(keys(&first), vec![("a".into(), 2), ("b".into(), 1)]);
        assert_eq!(first.end_offset, offset(3));
        assert_eq!(first.max_event_time_ms, Some(11));

        // A prefetch made for another watermark is dropped: under 13 the first "c" is
        // late, in the batch that is asked for it is not.
        input.prefetch(request(offset(3), 13));
        let second = input.get(request(offset(3), 0)).unwrap();
        assert!(second.late_lines.is_empty());
        assert_eq!(keys(&second), vec![("c".into(), 2)]);
        assert_eq!(second.bad_lines.len(), 1);
        assert!(second.bad_lines[0].contains("\"batch\":7") && second.bad_lines[0].contains("not json"));

        // A prefetch that matches is what `get` returns; going back (a rollback) reads
        // the same range again.
        input.prefetch(request(0, 11));
        let again = input.get(request(0, 11)).unwrap();
        assert_eq!(keys(&again), vec![("a".into(), 1)], "10 is late under 11");
        assert_eq!(again.late_lines.len(), 2);
        assert_eq!(again.end_offset, offset(3));

        // A cut at keys_max ends the batch before the record with a third key, and
        // the next batch starts there.
        let mut cut = request(offset(1), 0);
        cut.records_max = 10;
        let cut = input.get(cut).unwrap();
        assert_eq!(keys(&cut), vec![("a".into(), 1), ("b".into(), 1)]);
        assert_eq!((cut.records, cut.end_offset), (2, offset(3)));
    }
}
