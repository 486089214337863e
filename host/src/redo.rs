//! The store's redo log: one file of checksummed frames, appended (and fsync'd) once per
//! committed batch, so a batch commits with one sequential write instead of a sled
//! write per key. `store.rs` folds the log into sled when it grows past its budget, at
//! the end of a run and when it opens the store; this module only writes, reads back
//! and clears the file.
//!
//! A frame is `[u32 length][u32 crc32 of payload][payload]` (little endian), the payload
//! a tag byte and a bincode record (through `codec`). A commit is its key changes, one
//! frame each (so a frame is bounded by one key record, not by the batch), then a
//! commit frame with the sequence number, the count of changes and the checkpoint. On
//! replay, changes count only once their commit frame has been read whole: a crash in
//! the middle of an append leaves a torn tail, which replay skips and the store's
//! fold on open then empties with the rest of the file. Only the tail can be torn: a
//! damaged frame that a whole commit frame follows is damage to committed data, and
//! the log refuses to open (naming the file and the offset) rather than drop the
//! commits after it.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bincode::{Decode, Encode};

use crate::codec;
use crate::records::{Checkpoint, KeyRecord};

/// The log could not be read or written, or holds what it must not.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LogError {
    /// Reading or writing the file failed.
    #[error("redo log {path}: {cause}")]
    Io {
        /// The log file.
        path: PathBuf,
        /// The I/O error.
        cause: io::Error,
    },
    /// A damaged frame before a whole commit: not a torn append.
    #[error("redo log {path} is damaged at byte {offset}, before the whole commit {commit} that follows")]
    Damaged {
        /// The log file.
        path: PathBuf,
        /// Where the damaged frame starts.
        offset: u64,
        /// The sequence number of a whole commit after it.
        commit: u64,
    },
    /// A whole frame that breaks the log's rules.
    #[error("redo log: {0}")]
    Corrupt(String),
    /// A whole frame whose record does not decode.
    #[error(transparent)]
    Decode(#[from] codec::DecodeError),
}

/// The most memory an append's buffer keeps for the next: a 0.2 batch over 50 000 keys
/// of the sensor workload writes 8 to 9 MiB (three changes a key), which grown afresh
/// by doubling for every batch was copied and faulted in again each time (a tenth of
/// a 0.2 commit at a million keys); a larger append (an initial-state load) gives its
/// buffer back.
const APPEND_BUFFER_KEPT_MAX: usize = 16 << 20;

const TAG_CHANGE: u8 = b'k';
const TAG_COMMIT: u8 = b'c';
const FRAME_HEADER: usize = 8;
/// A frame's payload is one host record at most; a larger length is a torn header.
const FRAME_BYTES_MAX: u32 = codec::RECORD_BYTES_MAX as u32 + (64 << 10);

/// A key change as the log writes it: its record encoded already (`codec`), so that
/// a commit encodes each record once for the log and the overlay.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EncodedChange<'a> {
    /// The key.
    pub key: &'a str,
    /// Its record's encoding; `None` for a deletion.
    pub record: Option<&'a [u8]>,
}

/// Written as a [`ChangeIn`] reads it back: a record's encoding is the record's.
#[derive(Encode)]
struct ChangeOut<'a> {
    key: &'a str,
    after: Option<Encoded<'a>>,
}

/// Bytes that are an encoding already, written as they are.
struct Encoded<'a>(&'a [u8]);

impl Encode for Encoded<'_> {
    fn encode<E: bincode::enc::Encoder>(&self, encoder: &mut E) -> Result<(), bincode::error::EncodeError> {
        bincode::enc::write::Writer::write(encoder.writer(), self.0)
    }
}

#[derive(Decode)]
struct ChangeIn {
    key: String,
    after: Option<KeyRecord>,
}

#[derive(Encode)]
struct CommitOut<'a> {
    seq: u64,
    changes: u64,
    checkpoint: &'a Checkpoint,
}

#[derive(Decode)]
struct CommitIn {
    seq: u64,
    changes: u64,
    checkpoint: Checkpoint,
}

/// One commit read back from the log.
pub(crate) struct Replayed {
    /// Its sequence number (one more than the commit before it).
    pub seq: u64,
    /// Its key changes: the record after the batch (`None` deletes the key).
    pub changes: Vec<(String, Option<KeyRecord>)>,
    /// The checkpoint it wrote.
    pub checkpoint: Checkpoint,
}

/// The log file, open for appending.
pub(crate) struct RedoLog {
    path: PathBuf,
    file: File,
    /// The file's length.
    len: u64,
    /// An append failed and could not be cut back: nothing more may be appended, or it
    /// would follow a torn frame and be lost on replay.
    broken: bool,
    buf: Vec<u8>,
    /// Tests only: the next durable append fails after its write, as a failed fsync.
    #[cfg(test)]
    pub(crate) fail_next_sync: bool,
}

impl RedoLog {
    /// Opens (or creates) the log at `path` and reads back its whole commits, calling
    /// `replay` for each in order. A damaged frame after which no whole commit frame
    /// follows is a torn tail (an append that a crash interrupted: its batch never
    /// committed) and is skipped; a damaged frame followed by a whole commit is damage
    /// to committed data, and the open fails without changing anything.
    pub fn open<E: From<LogError>>(path: &Path, mut replay: impl FnMut(Replayed) -> Result<(), E>) -> Result<Self, E> {
        let log_err = |cause| LogError::Io { path: path.to_owned(), cause };
        let file = OpenOptions::new().read(true).append(true).create(true).open(path).map_err(log_err)?;
        let mut reader = BufReader::with_capacity(1 << 20, &file);
        let mut frame = Vec::new();
        let mut pending = Vec::new();
        // The offset of the frame being read.
        let mut offset = 0u64;
        loop {
            let tag = match read_frame(&mut reader, &mut frame).map_err(log_err)? {
                Frame::Whole(tag) => tag,
                Frame::End => break,
                Frame::Damaged => {
                    check_torn_tail(path, &file, offset)?;
                    break;
                }
            };
            offset += (FRAME_HEADER + frame.len()) as u64;
            let payload = &frame[1..];
            match tag {
                TAG_CHANGE => {
                    let change: ChangeIn = codec::decode("redo log change", payload).map_err(LogError::from)?;
                    pending.push((change.key, change.after));
                }
                TAG_COMMIT => {
                    let commit: CommitIn = codec::decode("redo log commit", payload).map_err(LogError::from)?;
                    if commit.changes != pending.len() as u64 {
                        return Err(LogError::Corrupt(format!(
                            "commit {} counts {} changes, {} precede it",
                            commit.seq,
                            commit.changes,
                            pending.len()
                        ))
                        .into());
                    }
                    replay(Replayed {
                        seq: commit.seq,
                        changes: std::mem::take(&mut pending),
                        checkpoint: commit.checkpoint,
                    })?;
                }
                other => return Err(LogError::Corrupt(format!("frame with unknown tag {other}")).into()),
            }
        }
        drop(reader);
        // A torn tail is not cut off here: the store folds what was replayed and then
        // empties the whole file.
        let len = file.metadata().map_err(log_err)?.len();
        Ok(Self {
            path: path.to_owned(),
            file,
            len,
            broken: false,
            buf: Vec::new(),
            #[cfg(test)]
            fail_next_sync: false,
        })
    }

    /// The log's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Appends one commit; with `durable`, returns once it is on disk.
    pub fn append<'c>(
        &mut self,
        seq: u64,
        changes: impl IntoIterator<Item = EncodedChange<'c>>,
        checkpoint: &Checkpoint,
        durable: bool,
    ) -> Result<(), LogError> {
        if self.broken {
            return Err(LogError::Io {
                path: self.path.clone(),
                cause: io::Error::other("an earlier append failed and could not be undone; reopen the pipeline"),
            });
        }
        self.buf.clear();
        let mut count = 0;
        for change in changes {
            push_frame(&mut self.buf, TAG_CHANGE, &ChangeOut { key: change.key, after: change.record.map(Encoded) });
            count += 1;
        }
        push_frame(&mut self.buf, TAG_COMMIT, &CommitOut { seq, changes: count, checkpoint });
        let written = self.file.write_all(&self.buf).and_then(|()| if durable { self.sync() } else { Ok(()) });
        if let Err(cause) = written {
            // Cut the partial append off, so that later commits do not follow it.
            if self.file.set_len(self.len).is_err() {
                self.broken = true;
            }
            return Err(LogError::Io { path: self.path.clone(), cause });
        }
        self.len += self.buf.len() as u64;
        if self.buf.capacity() > APPEND_BUFFER_KEPT_MAX {
            self.buf = Vec::new();
        }
        Ok(())
    }

    /// Waits for what was written to reach the disk.
    fn sync(&mut self) -> io::Result<()> {
        #[cfg(test)]
        if std::mem::take(&mut self.fail_next_sync) {
            return Err(io::Error::other("injected fsync failure"));
        }
        self.file.sync_data()
    }

    /// Moves the log's file to `to`, for a fold on another thread to fold and then
    /// remove (see [`remove`]), and goes on in a new, empty file at its own path. A
    /// log whose last append could not be cut back is not moved: a torn frame followed
    /// by whole commits in the next file would read as damage.
    pub fn rotate(&mut self, to: &Path) -> Result<(), LogError> {
        let log_err = |cause| LogError::Io { path: self.path.clone(), cause };
        if self.broken {
            return Err(log_err(io::Error::other(
                "an earlier append failed and could not be undone; reopen the pipeline",
            )));
        }
        std::fs::rename(&self.path, to).map_err(log_err)?;
        let file = OpenOptions::new().read(true).append(true).create(true).open(&self.path).map_err(log_err)?;
        sync_parent(&self.path).map_err(log_err)?;
        self.file = file;
        self.len = 0;
        Ok(())
    }

    /// Empties the log, once everything in it is durable elsewhere (folded into sled).
    pub fn clear(&mut self) -> Result<(), LogError> {
        let log_err = |cause| LogError::Io { path: self.path.clone(), cause };
        self.file.set_len(0).map_err(log_err)?;
        self.file.sync_all().map_err(log_err)?;
        self.len = 0;
        self.broken = false;
        Ok(())
    }
}

/// Removes a rotated log (see [`RedoLog::rotate`]) once everything in it is durable
/// elsewhere; a log that is not there is already removed.
pub(crate) fn remove(path: &Path) -> Result<(), LogError> {
    let log_err = |cause| LogError::Io { path: path.to_owned(), cause };
    match std::fs::remove_file(path) {
        Ok(()) => sync_parent(path).map_err(log_err),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(log_err(e)),
    }
}

/// Makes a rename or removal in the log's directory durable.
fn sync_parent(path: &Path) -> io::Result<()> {
    File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

fn push_frame(buf: &mut Vec<u8>, tag: u8, record: &impl Encode) {
    let start = buf.len();
    buf.extend_from_slice(&[0; FRAME_HEADER]);
    buf.push(tag);
    codec::encode_into(buf, record);
    let payload = &buf[start + FRAME_HEADER..];
    let len = payload.len() as u32;
    let crc = crc32fast::hash(payload);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// What [`read_frame`] found.
enum Frame {
    /// A whole frame with this tag.
    Whole(u8),
    /// The end of the file, between two frames.
    End,
    /// A frame cut short, with an impossible length or a checksum that does not match.
    Damaged,
}

/// Reads one frame into `frame` (tag and payload).
fn read_frame(reader: &mut impl Read, frame: &mut Vec<u8>) -> io::Result<Frame> {
    let mut header = [0u8; FRAME_HEADER];
    match read_full(reader, &mut header)? {
        0 => return Ok(Frame::End),
        FRAME_HEADER => {}
        _ => return Ok(Frame::Damaged),
    }
    let (len, crc) = frame_header(&header);
    if len == 0 || len > FRAME_BYTES_MAX {
        return Ok(Frame::Damaged);
    }
    frame.resize(len as usize, 0);
    if read_full(reader, frame)? < frame.len() || crc32fast::hash(frame) != crc {
        return Ok(Frame::Damaged);
    }
    Ok(Frame::Whole(frame[0]))
}

fn frame_header(header: &[u8]) -> (u32, u32) {
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    (len, crc)
}

/// A commit frame holds a sequence number, a count and a checkpoint: far less than
/// this. The search for one after a damaged frame looks at no longer frames.
const COMMIT_FRAME_BYTES_MAX: usize = 64 << 10;

/// Called at a damaged frame at `offset`: succeeds if what follows holds no whole
/// commit frame, so the damage is the tail of an append that never completed. A whole
/// commit after it means a commit that was acknowledged is damaged (a bad disk, an
/// edit): the open must fail, or every commit after the damage would be lost.
fn check_torn_tail(path: &Path, mut file: &File, offset: u64) -> Result<(), LogError> {
    // From the byte after the damaged frame's start, not from where reading it
    // stopped: a damaged length may have swallowed the frames after it. A commit
    // frame may start at any byte.
    let mut rest = Vec::new();
    file.seek(SeekFrom::Start(offset + 1))
        .and_then(|_| file.read_to_end(&mut rest))
        .map_err(|cause| LogError::Io { path: path.to_owned(), cause })?;
    for at in 0..rest.len().saturating_sub(FRAME_HEADER) {
        if rest[at + FRAME_HEADER] != TAG_COMMIT {
            continue;
        }
        let (len, crc) = frame_header(&rest[at..]);
        let payload_start = at + FRAME_HEADER;
        let Some(payload) = rest.get(payload_start..payload_start + len as usize) else {
            continue;
        };
        if len == 0 || len as usize > COMMIT_FRAME_BYTES_MAX || crc32fast::hash(payload) != crc {
            continue;
        }
        if let Ok(commit) = codec::decode::<CommitIn>("redo log commit", &payload[1..]) {
            return Err(LogError::Damaged { path: path.to_owned(), offset, commit: commit.seq });
        }
    }
    Ok(())
}

/// Fills as much of `buf` as the file holds; returns how much.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
