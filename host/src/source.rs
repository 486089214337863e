//! JSON Lines input with byte offsets: a file (seekable, so a planned batch can be
//! re-read exactly) or stdin (read by a thread into a bounded queue, so a batch can
//! close on a timer while no line arrives), or one partition of a Kafka topic
//! (`kafka.rs` reads it; offsets are Kafka offsets, a planned batch is re-read by
//! seeking to its start, and each line carries its record's Kafka key).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// The UTF-8 byte order mark, skipped at the start of an input.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// The buffer a file input is read through. Each read brings this much into the
/// caches, then its lines are decoded and copied: 1 MiB was pushed out of them before
/// its last lines were reached, and 128 KiB read 10M lines over 10k sensors 4% faster
/// (32 KiB no faster again).
const FILE_BUFFER_BYTES: usize = 128 << 10;

/// Lines queued from stdin at most, before the reader thread waits.
const STDIN_QUEUE_LINES_MAX: usize = 65_536;

/// One input line: owned (`Line<String>`, the default) where it is queued or held, and
/// borrowed (`Line<&str>`) where [`Source::read_lines`] hands it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<T = String> {
    /// Byte offset of the line's first byte; for Kafka, the record's offset.
    pub offset: u64,
    /// The record's Kafka key (a Kafka input only): the record's group key.
    pub key: Option<T>,
    /// The record's Kafka timestamp in epoch milliseconds (a Kafka input only).
    pub timestamp_ms: Option<i64>,
    /// The line without its terminator, or why it could not be read.
    pub text: Result<T, LineError>,
}

impl Line {
    /// The line, borrowed.
    pub fn borrowed(&self) -> Line<&str> {
        Line {
            offset: self.offset,
            key: self.key.as_deref(),
            timestamp_ms: self.timestamp_ms,
            text: self.text.as_deref().map_err(Clone::clone),
        }
    }
}

impl Line<&str> {
    /// The line, owned.
    pub fn to_owned_line(&self) -> Line {
        Line {
            offset: self.offset,
            key: self.key.map(str::to_owned),
            timestamp_ms: self.timestamp_ms,
            text: self.text.clone().map(str::to_owned),
        }
    }
}

/// A line that is not text the decoder can look at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// Longer than `line_bytes_max`.
    #[error("line of {len} bytes is longer than line_bytes_max ({max}); split the record or raise the limit")]
    TooLong {
        /// The line's length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// Not UTF-8.
    #[error("line is not valid UTF-8")]
    NotUtf8,
    /// A Kafka record's key cannot be a group key.
    #[error("the record's kafka key {0}")]
    KafkaKey(String),
    /// A Kafka record's value cannot be a line.
    #[error("the record's kafka value {0}")]
    KafkaValue(String),
}

/// An input failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Opening failed.
    #[error("input {path}: cannot open ({cause}); check the path")]
    Open {
        /// The input path.
        path: PathBuf,
        /// The error.
        cause: io::Error,
    },
    /// Reading failed.
    #[error("input: read failed at offset {offset}: {cause}")]
    Read {
        /// Where.
        offset: u64,
        /// The error.
        cause: io::Error,
    },
    /// The input is shorter than the committed position: it was replaced or truncated.
    #[error(
        "input {path} has {len} bytes but {committed} were already committed from it; it was truncated or replaced: use a new --state-dir for a new input"
    )]
    Shrunk {
        /// The input path.
        path: PathBuf,
        /// Its length now.
        len: u64,
        /// The committed offset.
        committed: u64,
    },
    /// A planned batch could not be read again as planned.
    #[error(
        "input changed under a planned batch: it should end at offset {planned}, reading stopped at {read}; restore the input or use a new --state-dir"
    )]
    Changed {
        /// The planned end offset.
        planned: u64,
        /// Where reading stopped.
        read: u64,
    },
    /// The input is not the one the state dir consumed.
    #[error(
        "input {path} is not the input this state dir consumed: the {bytes} bytes before the committed offset {offset} differ from those committed; it was replaced or rewritten (or rotated while groupstate was stopped): restore the original file, or use a new --state-dir for a new input"
    )]
    Replaced {
        /// The input path.
        path: PathBuf,
        /// The committed offset.
        offset: u64,
        /// How many bytes before it were compared.
        bytes: u64,
    },
    /// A batch plan cannot be replayed from stdin.
    #[error("cannot re-read a planned batch from stdin")]
    NotSeekable,
    /// The thread that reads the input failed.
    #[error("input: {0}")]
    Thread(String),
    /// Reading a Kafka partition failed (boxed: rdkafka's error is large).
    #[error(transparent)]
    Kafka(Box<crate::kafka::KafkaError>),
}

impl From<crate::kafka::KafkaError> for SourceError {
    fn from(e: crate::kafka::KafkaError) -> Self {
        Self::Kafka(Box::new(e))
    }
}

/// Reads lines of at most `max` bytes from a `BufRead`, tracking the offset.
struct LineReader<R> {
    inner: R,
    /// Offset after the last line read.
    offset: u64,
    line_bytes_max: usize,
    /// Whether a final line without a newline counts as a line (a finished file) or
    /// must wait for its newline (a file still being written).
    accept_unterminated: bool,
    /// The line being read, kept across calls while it waits for its newline; then the
    /// line read, until the next call (one buffer for every line: no allocation each).
    buf: Vec<u8>,
    consumed: u64,
    too_long: bool,
    /// `buf` holds a whole line, handed out by [`LineReader::line`].
    done: Option<ReadLine>,
}

/// Where the line in a [`LineReader`]'s buffer was, and whether it was too long.
#[derive(Debug, Clone, Copy)]
struct ReadLine {
    offset: u64,
    /// The bytes it took, when more than `line_bytes_max`.
    too_long: Option<u64>,
}

impl<R: BufRead> LineReader<R> {
    fn new(inner: R, offset: u64, line_bytes_max: usize, accept_unterminated: bool) -> Self {
        Self {
            inner,
            offset,
            line_bytes_max,
            accept_unterminated,
            buf: Vec::new(),
            consumed: 0,
            too_long: false,
            done: None,
        }
    }

    /// Reads the next line (see [`LineReader::line`]); returns the bytes it took, or
    /// `None` at the end of the input (or before an unterminated final line that must
    /// wait for its newline).
    fn advance(&mut self) -> io::Result<Option<u64>> {
        if self.done.take().is_some() {
            self.buf.clear();
        }
        loop {
            let chunk = self.inner.fill_buf()?;
            if chunk.is_empty() {
                if self.consumed == 0 || !self.accept_unterminated {
                    return Ok(None);
                }
                break;
            }
            let (part, done) = match memchr::memchr(b'\n', chunk) {
                Some(i) => (&chunk[..=i], true),
                None => (chunk, false),
            };
            let n = part.len();
            // Keep at most the limit plus a CR LF; past that, only count.
            if !self.too_long && self.buf.len() + n <= self.line_bytes_max + 2 {
                self.buf.extend_from_slice(part);
            } else {
                self.too_long = true;
                self.buf.clear();
            }
            self.inner.consume(n);
            self.consumed += n as u64;
            if done {
                break;
            }
        }
        let mut start = self.offset;
        let consumed = std::mem::take(&mut self.consumed);
        let too_long = std::mem::take(&mut self.too_long);
        self.offset += consumed;
        strip_terminator(&mut self.buf);
        // A byte order mark (editors on Windows write one) marks the encoding, it is
        // not part of the first record.
        if start == 0 && self.buf.starts_with(UTF8_BOM) {
            self.buf.drain(..UTF8_BOM.len());
            start = UTF8_BOM.len() as u64;
        }
        let too_long = if too_long {
            Some(consumed)
        } else {
            (self.buf.len() > self.line_bytes_max).then_some(self.buf.len() as u64)
        };
        self.done = Some(ReadLine { offset: start, too_long });
        Ok(Some(consumed))
    }

    /// The line the last [`LineReader::advance`] read, borrowed from the reader.
    fn line(&self) -> Option<Line<&str>> {
        let ReadLine { offset, too_long } = self.done?;
        let text = match too_long {
            Some(len) => Err(LineError::TooLong { len, max: self.line_bytes_max }),
            None => std::str::from_utf8(&self.buf).map_err(|_| LineError::NotUtf8),
        };
        Some(Line { offset, key: None, timestamp_ms: None, text })
    }

    /// The next line, owned, and the bytes it took (for the stdin thread's queue).
    fn next_line(&mut self) -> io::Result<Option<(Line, u64)>> {
        let Some(consumed) = self.advance()? else { return Ok(None) };
        Ok(self.line().map(|line| (line.to_owned_line(), consumed)))
    }

    /// Forgets the line being read (after a seek).
    fn reset(&mut self, offset: u64) {
        self.offset = offset;
        self.buf.clear();
        self.consumed = 0;
        self.too_long = false;
        self.done = None;
    }
}

fn strip_terminator(buf: &mut Vec<u8>) {
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
}

/// Bytes before the committed offset whose digest the checkpoint keeps: a resumed
/// run compares them, so that a replaced input is refused, not read from the middle.
const INPUT_DIGEST_BYTES: u64 = 4096;

/// How a followed file was replaced under its name (log rotation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// The path now names another file (rename rotation: `mv log log.1`, new `log`).
    Renamed,
    /// The file became shorter than what was read (copytruncate rotation).
    Truncated,
}

impl std::fmt::Display for Rotation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Renamed => "renamed away and replaced by a new file",
            Self::Truncated => "truncated",
        })
    }
}

/// An input of JSON Lines.
pub struct Source {
    inner: Inner,
}

enum Inner {
    File {
        path: PathBuf,
        reader: LineReader<BufReader<File>>,
        /// Follow the path as `tail -F` does: at the end of the file, check whether
        /// it was rotated.
        follow: bool,
        /// Device and inode of the open file.
        identity: (u64, u64),
        /// The open file was read to its end and then found rotated: the next rewind
        /// to offset 0 opens the path anew.
        rotation: Option<Rotation>,
    },
    Stdin {
        /// Lines from the thread; `Ok(None)` when stdin closed.
        rx: mpsc::Receiver<io::Result<Option<(Line, u64)>>>,
        /// Offset after the last line received.
        offset: u64,
        closed: bool,
    },
    Kafka(Box<crate::kafka::PartitionReader>),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::File { path, .. } => write!(f, "Source::File({})", path.display()),
            Inner::Stdin { offset, .. } => write!(f, "Source::Stdin(@{offset})"),
            Inner::Kafka(reader) => write!(f, "Source::Kafka(@{})", reader.offset()),
        }
    }
}

impl Source {
    /// Opens a file positioned at `offset`, checking that the bytes before it have the
    /// `digest` committed with it (see [`Source::digest_before`]). With `follow`, a
    /// final line without a newline waits for it, and a rotated file is followed.
    pub fn open_file(
        path: &Path,
        offset: u64,
        digest: u32,
        line_bytes_max: usize,
        follow: bool,
    ) -> Result<Self, SourceError> {
        let open_err = |cause| SourceError::Open { path: path.to_owned(), cause };
        let mut file = File::open(path).map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        if meta.len() < offset {
            return Err(SourceError::Shrunk { path: path.to_owned(), len: meta.len(), committed: offset });
        }
        if file_digest(&file, offset).map_err(|cause| SourceError::Read { offset, cause })? != digest {
            return Err(SourceError::Replaced { path: path.to_owned(), offset, bytes: offset.min(INPUT_DIGEST_BYTES) });
        }
        file.seek(SeekFrom::Start(offset)).map_err(|cause| SourceError::Read { offset, cause })?;
        let reader =
            LineReader::new(BufReader::with_capacity(FILE_BUFFER_BYTES, file), offset, line_bytes_max, !follow);
        let identity = (meta.dev(), meta.ino());
        Ok(Self { inner: Inner::File { path: path.to_owned(), reader, follow, identity, rotation: None } })
    }

    /// A digest of the up to 4 KiB before `offset` (0 for stdin, which cannot be
    /// read again): committed with the offset, and checked when a run resumes.
    pub fn digest_before(&self, offset: u64) -> Result<u32, SourceError> {
        match &self.inner {
            // The bytes are gone. The pipeline commits offset 0 of the truncated file
            // next; a restart before that finds the file shorter, or with another
            // digest, and refuses it.
            Inner::File { rotation: Some(Rotation::Truncated), .. } => Ok(0),
            Inner::File { reader, .. } => {
                file_digest(reader.inner.get_ref(), offset).map_err(|cause| SourceError::Read { offset, cause })
            }
            Inner::Stdin { .. } => Ok(0),
            // The digest guards a file replaced under its name. A Kafka partition's
            // offsets name records of an append-only log, never rewritten in place,
            // and a deleted topic's offsets fail to fetch, so there is nothing to
            // compare.
            Inner::Kafka(_) => Ok(0),
        }
    }

    /// The bytes of a file read to its end (not followed) after the last line read, as
    /// the file is now; `None` for other inputs, which may grow.
    pub fn bytes_left(&self) -> Option<u64> {
        match &self.inner {
            Inner::File { reader, follow: false, .. } => {
                let len = reader.inner.get_ref().metadata().ok()?.len();
                Some(len.saturating_sub(reader.offset))
            }
            _ => None,
        }
    }

    /// How the followed file was rotated, once it has been read to its end.
    pub fn rotation(&self) -> Option<Rotation> {
        match &self.inner {
            Inner::File { rotation, .. } => *rotation,
            Inner::Stdin { .. } | Inner::Kafka(_) => None,
        }
    }

    /// Reads one Kafka partition from `offset` (see `PartitionReader::open`).
    pub fn kafka(
        input: &crate::config::KafkaInput,
        offset: Option<u64>,
        line_bytes_max: usize,
        clock: std::sync::Arc<dyn crate::clock::Clock>,
    ) -> Result<Self, SourceError> {
        let reader = crate::kafka::PartitionReader::open(input, offset, line_bytes_max, clock)?;
        Ok(Self { inner: Inner::Kafka(Box::new(reader)) })
    }

    /// The records of a Kafka partition after the last one read, as its consumer last
    /// learned (none for other inputs).
    pub fn lag(&self) -> Option<u64> {
        match &self.inner {
            Inner::Kafka(reader) => reader.lag(),
            _ => None,
        }
    }

    /// Whether a Kafka partition's last read found its end (false for other inputs).
    pub fn at_end(&self) -> bool {
        matches!(&self.inner, Inner::Kafka(reader) if reader.at_end())
    }

    /// Starts reading stdin on a thread; offsets count from `offset` (stdin cannot be
    /// re-read, so a resumed run continues the count).
    pub fn stdin(offset: u64, line_bytes_max: usize) -> Self {
        let (tx, rx) = mpsc::sync_channel(STDIN_QUEUE_LINES_MAX);
        std::thread::Builder::new()
            .name("groupstate-stdin".into())
            .spawn(move || {
                let mut reader = LineReader::new(BufReader::new(io::stdin().lock()), offset, line_bytes_max, true);
                loop {
                    let next = reader.next_line();
                    let end = !matches!(next, Ok(Some(_)));
                    if tx.send(next).is_err() || end {
                        return;
                    }
                }
            })
            .ok();
        Self { inner: Inner::Stdin { rx, offset, closed: false } }
    }

    /// The offset after the last line returned.
    pub fn offset(&self) -> u64 {
        match &self.inner {
            Inner::File { reader, .. } => reader.offset,
            Inner::Stdin { offset, .. } => *offset,
            Inner::Kafka(reader) => reader.offset(),
        }
    }

    /// Moves a file input back to `offset` (the start of a batch to run again); stdin
    /// cannot go back.
    pub fn rewind_to(&mut self, offset: u64) -> Result<(), SourceError> {
        match &mut self.inner {
            Inner::File { path, reader, rotation: rotation @ Some(_), identity, .. } if offset == 0 => {
                // The rotated file is done with: continue with the one at the path.
                let open_err = |cause| SourceError::Open { path: path.clone(), cause };
                let file = File::open(&*path).map_err(open_err)?;
                let meta = file.metadata().map_err(open_err)?;
                *identity = (meta.dev(), meta.ino());
                reader.inner = BufReader::with_capacity(FILE_BUFFER_BYTES, file);
                reader.reset(0);
                *rotation = None;
                Ok(())
            }
            Inner::File { reader, .. } => {
                reader.inner.seek(SeekFrom::Start(offset)).map_err(|cause| SourceError::Read { offset, cause })?;
                reader.reset(offset);
                Ok(())
            }
            Inner::Stdin { .. } => Err(SourceError::NotSeekable),
            Inner::Kafka(reader) => Ok(reader.seek(offset)?),
        }
    }

    /// Whether a planned range can be read again (files can, stdin cannot).
    pub fn is_seekable(&self) -> bool {
        matches!(self.inner, Inner::File { .. } | Inner::Kafka(_))
    }

    /// Reads up to `max` lines, stopping at `end_offset` if given (a replayed plan), or
    /// after the line that brings the bytes read to `bytes_max`, handing each line to
    /// `each` until it answers `false`. With stdin, waits at most `wait` for the first
    /// line and then takes only what is already queued. Reads nothing at the end of the
    /// input (for now).
    pub fn read_lines(
        &mut self,
        max: usize,
        bytes_max: u64,
        end_offset: Option<u64>,
        wait: Duration,
        mut each: impl FnMut(Line<&str>) -> Result<bool, SourceError>,
    ) -> Result<(), SourceError> {
        let start = self.offset();
        let full = |offset: u64| offset - start >= bytes_max;
        let mut read = 0;
        match &mut self.inner {
            Inner::File { path, reader: r, follow, identity, rotation } => {
                while read < max && !full(r.offset) && end_offset.is_none_or(|end| r.offset < end) {
                    let offset = r.offset;
                    let mut next = r.advance().map_err(|cause| SourceError::Read { offset, cause })?;
                    if next.is_none() && *follow && rotation.is_none() && end_offset.is_none() {
                        *rotation = rotated(path, *identity, r.offset);
                        if rotation.is_some() {
                            // A line written to the old file before it was replaced is
                            // still read: the old file ends only when it has none left.
                            next = r.advance().map_err(|cause| SourceError::Read { offset, cause })?;
                            if next.is_some() {
                                *rotation = None;
                            }
                        }
                    }
                    match next.and_then(|_| r.line()) {
                        Some(line) => {
                            read += 1;
                            if !each(line)? {
                                break;
                            }
                        }
                        None => break,
                    }
                }
            }
            Inner::Kafka(reader) => reader.read_lines(max, bytes_max, end_offset, wait, &mut each)?,
            Inner::Stdin { rx, offset, closed } => {
                if end_offset.is_some() {
                    return Err(SourceError::NotSeekable);
                }
                let mut timeout = wait;
                while read < max && !full(*offset) && !*closed {
                    match rx.recv_timeout(timeout) {
                        Ok(Ok(Some((line, consumed)))) => {
                            *offset = line.offset + consumed;
                            read += 1;
                            timeout = Duration::ZERO;
                            if !each(line.borrowed())? {
                                break;
                            }
                        }
                        Ok(Ok(None)) | Err(mpsc::RecvTimeoutError::Disconnected) => *closed = true,
                        Ok(Err(cause)) => return Err(SourceError::Read { offset: *offset, cause }),
                        Err(mpsc::RecvTimeoutError::Timeout) => break,
                    }
                }
            }
        }
        Ok(())
    }

    /// The lines [`Source::read_lines`] reads, collected (for tests).
    #[cfg(test)]
    fn read_batch(
        &mut self,
        max: usize,
        bytes_max: u64,
        end_offset: Option<u64>,
        wait: Duration,
    ) -> Result<Vec<Line>, SourceError> {
        let mut lines = Vec::new();
        self.read_lines(max, bytes_max, end_offset, wait, |line| {
            lines.push(line.to_owned_line());
            Ok(true)
        })?;
        Ok(lines)
    }

    /// Whether stdin has closed (always false for files: a file may grow).
    pub fn is_closed(&self) -> bool {
        matches!(self.inner, Inner::Stdin { closed: true, .. })
    }
}

/// Whether the file at `path` is no longer the open one (`identity`), or is shorter
/// than `offset`, what was read of it. A path that is missing for now (between the
/// rename and the creation of the new file) is not a rotation yet.
fn rotated(path: &Path, identity: (u64, u64), offset: u64) -> Option<Rotation> {
    let meta = std::fs::metadata(path).ok()?;
    if (meta.dev(), meta.ino()) != identity {
        Some(Rotation::Renamed)
    } else if meta.len() < offset {
        Some(Rotation::Truncated)
    } else {
        None
    }
}

/// The crc32 of the up to [`INPUT_DIGEST_BYTES`] of `file` before `offset`.
fn file_digest(file: &File, offset: u64) -> io::Result<u32> {
    let len = offset.min(INPUT_DIGEST_BYTES);
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset - len)?;
    Ok(crc32fast::hash(&buf))
}

/// Reads everything from `r` into lines (for tests of the line splitting).
#[cfg(test)]
fn split_all<R: io::Read>(r: R, max: usize, accept_unterminated: bool) -> Vec<Line> {
    let mut reader = LineReader::new(BufReader::with_capacity(7, r), 0, max, accept_unterminated);
    let mut out = Vec::new();
    while let Some((line, _)) = reader.next_line().unwrap() {
        out.push(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_with_offsets_limits_and_terminators() {
        let input = b"{\"a\":1}\r\n\nabcdefghijklmnopqrstuvwxyz\n\xff\xfe\nlast";
        let lines = split_all(&input[..], 10, true);
        let got: Vec<(u64, Result<String, LineError>)> = lines.into_iter().map(|l| (l.offset, l.text)).collect();
        assert_eq!(
            got,
            vec![
                (0, Ok("{\"a\":1}".to_owned())),
                (9, Ok(String::new())),
                (10, Err(LineError::TooLong { len: 27, max: 10 })),
                (37, Err(LineError::NotUtf8)),
                (40, Ok("last".to_owned())),
            ]
        );
    }

    #[test]
    fn a_byte_order_mark_at_the_start_is_skipped() {
        let lines = split_all(&b"\xEF\xBB\xBF{\"k\":\"a\"}\n\xEF\xBB\xBFx\n"[..], 100, true);
        let got: Vec<(u64, Result<String, LineError>)> = lines.into_iter().map(|l| (l.offset, l.text)).collect();
        // Only at the start of the input: elsewhere it is data (and a bad record).
        assert_eq!(got, vec![(3, Ok("{\"k\":\"a\"}".to_owned())), (13, Ok("\u{feff}x".to_owned()))]);
    }

    #[test]
    fn unterminated_last_line_waits_when_following() {
        let lines = split_all(&b"a\nb"[..], 10, false);
        assert_eq!(lines.len(), 1);
        // The partial line is kept and completed by a later read.
        let mut reader = LineReader::new(io::Cursor::new(b"a\nbc".to_vec()), 0, 10, false);
        assert!(reader.next_line().unwrap().is_some());
        assert!(reader.next_line().unwrap().is_none());
        assert_eq!(reader.offset, 2);
        let mut rest = reader.inner.into_inner();
        rest.extend_from_slice(b"d\n");
        let mut cursor = io::Cursor::new(rest);
        cursor.set_position(4);
        reader.inner = cursor;
        let (line, consumed) = reader.next_line().unwrap().unwrap();
        assert_eq!((line.offset, line.text, consumed), (2, Ok("bcd".to_owned()), 4));
    }

    #[test]
    fn a_file_read_to_its_end_tells_what_is_left_a_followed_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(&path, "a\nbb\nccc\n").unwrap();
        let mut src = Source::open_file(&path, 0, 0, 100, false).unwrap();
        assert_eq!(src.bytes_left(), Some(9));
        assert_eq!(src.read_batch(1, u64::MAX, None, Duration::ZERO).unwrap().len(), 1);
        assert_eq!(src.bytes_left(), Some(7));
        let followed = Source::open_file(&path, 0, 0, 100, true).unwrap();
        assert_eq!(followed.bytes_left(), None, "a followed file may grow");
    }

    #[test]
    fn file_source_resumes_and_stops_at_plan_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(&path, "a\nbb\nccc\ndddd\n").unwrap();
        let mut src = Source::open_file(&path, 2, crc32fast::hash(b"a\n"), 100, false).unwrap();
        let lines = src.read_batch(10, u64::MAX, Some(9), Duration::ZERO).unwrap();
        assert_eq!(lines.iter().map(|l| l.offset).collect::<Vec<_>>(), vec![2, 5]);
        assert_eq!(src.offset(), 9);
        let rest = src.read_batch(10, u64::MAX, None, Duration::ZERO).unwrap();
        assert_eq!(rest.len(), 1);
        assert!(src.read_batch(10, u64::MAX, None, Duration::ZERO).unwrap().is_empty());
        // A batch ends after the line that reaches the byte limit.
        let mut src = Source::open_file(&path, 0, 0, 100, false).unwrap();
        let lines = src.read_batch(10, 4, None, Duration::ZERO).unwrap();
        assert_eq!(lines.iter().map(|l| l.offset).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(src.offset(), 5);
        let err = Source::open_file(&path, 100, 0, 100, false).unwrap_err().to_string();
        assert!(err.contains("truncated or replaced"), "{err}");
    }
}
