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
//! fold on open then empties with the rest of the file.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use bincode::{Decode, Encode};

use crate::codec;
use crate::store::{Checkpoint, KeyChange, KeyRecord, StoreError};

const TAG_CHANGE: u8 = b'k';
const TAG_COMMIT: u8 = b'c';
const FRAME_HEADER: usize = 8;
/// A frame's payload is one host record at most; a larger length is a torn header.
const FRAME_BYTES_MAX: u32 = codec::RECORD_BYTES_MAX as u32 + (64 << 10);

#[derive(Encode)]
struct ChangeOut<'a> {
    key: &'a str,
    after: Option<&'a KeyRecord>,
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
}

impl RedoLog {
    /// Opens (or creates) the log at `path` and reads back its whole commits, calling
    /// `replay` for each in order; a torn tail is skipped.
    pub fn open(path: &Path, mut replay: impl FnMut(Replayed) -> Result<(), StoreError>) -> Result<Self, StoreError> {
        let log_err = |cause| StoreError::Log { path: path.to_owned(), cause };
        let file = OpenOptions::new().read(true).append(true).create(true).open(path).map_err(log_err)?;
        let mut reader = BufReader::with_capacity(1 << 20, &file);
        let mut frame = Vec::new();
        let mut pending = Vec::new();
        while let Some(tag) = read_frame(&mut reader, &mut frame).map_err(log_err)? {
            let payload = &frame[1..];
            match tag {
                TAG_CHANGE => {
                    let change: ChangeIn = codec::decode("redo log change", payload)?;
                    pending.push((change.key, change.after));
                }
                TAG_COMMIT => {
                    let commit: CommitIn = codec::decode("redo log commit", payload)?;
                    if commit.changes != pending.len() as u64 {
                        return Err(StoreError::Corrupt(format!(
                            "redo log commit {} counts {} changes, {} precede it",
                            commit.seq,
                            commit.changes,
                            pending.len()
                        )));
                    }
                    replay(Replayed {
                        seq: commit.seq,
                        changes: std::mem::take(&mut pending),
                        checkpoint: commit.checkpoint,
                    })?;
                }
                other => return Err(StoreError::Corrupt(format!("redo log frame with unknown tag {other}"))),
            }
        }
        drop(reader);
        // A torn tail (an append that a crash interrupted: its batch never committed)
        // is not cut off here: the store folds what was replayed and then empties
        // the whole file.
        let len = file.metadata().map_err(log_err)?.len();
        Ok(Self { path: path.to_owned(), file, len, broken: false, buf: Vec::new() })
    }

    /// The log's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Appends one commit; with `durable`, returns once it is on disk.
    pub fn append(
        &mut self,
        seq: u64,
        changes: &[KeyChange],
        checkpoint: &Checkpoint,
        durable: bool,
    ) -> Result<(), StoreError> {
        if self.broken {
            return Err(StoreError::Log {
                path: self.path.clone(),
                cause: io::Error::other("an earlier append failed and could not be undone; reopen the pipeline"),
            });
        }
        self.buf.clear();
        for change in changes {
            push_frame(&mut self.buf, TAG_CHANGE, &ChangeOut { key: &change.key, after: change.after.as_ref() });
        }
        push_frame(&mut self.buf, TAG_COMMIT, &CommitOut { seq, changes: changes.len() as u64, checkpoint });
        let written =
            self.file.write_all(&self.buf).and_then(|()| if durable { self.file.sync_data() } else { Ok(()) });
        if let Err(cause) = written {
            // Cut the partial append off, so that later commits do not follow it.
            if self.file.set_len(self.len).is_err() {
                self.broken = true;
            }
            return Err(StoreError::Log { path: self.path.clone(), cause });
        }
        self.len += self.buf.len() as u64;
        if self.buf.capacity() > 4 << 20 {
            self.buf = Vec::new();
        }
        Ok(())
    }

    /// Empties the log, once everything in it is durable elsewhere (folded into sled).
    pub fn clear(&mut self) -> Result<(), StoreError> {
        let log_err = |cause| StoreError::Log { path: self.path.clone(), cause };
        self.file.set_len(0).map_err(log_err)?;
        self.file.sync_all().map_err(log_err)?;
        self.len = 0;
        self.broken = false;
        Ok(())
    }
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

/// Reads one frame into `frame` (tag and payload) and returns its tag: `None` at the
/// end of the file or at a torn or corrupt frame.
fn read_frame(reader: &mut impl Read, frame: &mut Vec<u8>) -> io::Result<Option<u8>> {
    let mut header = [0u8; FRAME_HEADER];
    if !read_full(reader, &mut header)? {
        return Ok(None);
    }
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len == 0 || len > FRAME_BYTES_MAX {
        return Ok(None);
    }
    frame.resize(len as usize, 0);
    if !read_full(reader, frame)? || crc32fast::hash(frame) != crc {
        return Ok(None);
    }
    Ok(Some(frame[0]))
}

/// Fills `buf`; `false` if the file ends first.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    match reader.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}
