//! Output streams (results, late data, dead letters) with a committed length. A batch's
//! lines are buffered, written before the store commit, and the commit records the new
//! length; on restart a file is truncated back to its committed length, so a file sink
//! holds every committed batch exactly once. Stdout cannot be taken back: it is
//! at-least-once across a crash. A Kafka topic output only collects the batch's
//! records with their keys: the batch's export (`export.rs`) sends them in the same
//! transaction as the rest of the batch.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::export::{OutputRecord, TopicRecords};

/// A batch's buffered bytes are written out early past this size (a file sink still
/// truncates them away if the batch is not committed).
const BUFFER_BYTES_MAX: usize = 4 << 20;

/// A sink failed.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Opening, truncating or writing failed.
    #[error("{what} {path}: {cause}")]
    Io {
        /// Which sink and operation.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        cause: io::Error,
    },
    /// The file is shorter than what was committed to it.
    #[error(
        "{path} has {len} bytes but {committed} were committed to it; it was truncated or replaced outside groupstate: restore it or use a new --state-dir"
    )]
    Shrunk {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The committed length.
        committed: u64,
    },
}

enum Target {
    File {
        path: PathBuf,
        file: File,
    },
    Stdout,
    /// A Kafka topic: the batch's records, handed to the export at commit.
    Exported {
        topic: String,
        records: Vec<OutputRecord>,
    },
}

/// One output stream.
pub struct Sink {
    target: Target,
    buf: Vec<u8>,
    /// Bytes of committed batches.
    committed_len: u64,
    /// Bytes written to the target (committed, plus this batch's early writes).
    written_len: u64,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sink({}, committed {})", self.describe(), self.committed_len)
    }
}

impl Sink {
    /// Opens a file sink, cutting off anything after `committed_len` (the output of a
    /// batch that did not commit).
    pub fn open_file(path: &Path, committed_len: u64) -> Result<Self, SinkError> {
        let err = |what| move |cause| SinkError::Io { what, path: path.to_owned(), cause };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err("create directory of"))?;
        }
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(err("open"))?;
        let len = file.metadata().map_err(err("stat"))?.len();
        if len < committed_len {
            return Err(SinkError::Shrunk { path: path.to_owned(), len, committed: committed_len });
        }
        if len > committed_len {
            file.set_len(committed_len).map_err(err("truncate uncommitted output of"))?;
        }
        file.seek(SeekFrom::Start(committed_len)).map_err(err("seek"))?;
        Ok(Self {
            target: Target::File { path: path.to_owned(), file },
            buf: Vec::new(),
            committed_len,
            written_len: committed_len,
        })
    }

    /// A stdout sink.
    pub fn stdout(committed_len: u64) -> Self {
        Self { target: Target::Stdout, buf: Vec::new(), committed_len, written_len: committed_len }
    }

    /// A sink whose records go out with the batch's export, to Kafka topic `topic`.
    pub fn exported(topic: &str) -> Self {
        let target = Target::Exported { topic: topic.to_owned(), records: Vec::new() };
        Self { target, buf: Vec::new(), committed_len: 0, written_len: 0 }
    }

    fn describe(&self) -> String {
        match &self.target {
            Target::File { path, .. } => path.display().to_string(),
            Target::Stdout => "stdout".to_owned(),
            Target::Exported { topic, .. } => format!("kafka topic {topic}"),
        }
    }

    /// Appends the line `key`'s call emitted to the current batch (a file or stdout
    /// keeps the line only).
    pub fn push_record(&mut self, key: &str, line: &str) -> Result<(), SinkError> {
        if let Target::Exported { records, .. } = &mut self.target {
            records.push(OutputRecord { key: key.to_owned(), line: line.to_owned() });
            return Ok(());
        }
        self.buf.extend_from_slice(line.as_bytes());
        self.buf.push(b'\n');
        if self.buf.len() >= BUFFER_BYTES_MAX {
            self.write_buf()?;
        }
        Ok(())
    }

    /// The topic and the current batch's records of a sink exported to a topic.
    pub fn topic_records(&self) -> Option<TopicRecords<'_>> {
        match &self.target {
            Target::Exported { topic, records } => Some(TopicRecords { topic, records }),
            _ => None,
        }
    }

    fn io_err(&self, what: &'static str) -> impl FnOnce(io::Error) -> SinkError + '_ {
        move |cause| SinkError::Io { what, path: PathBuf::from(self.describe()), cause }
    }

    /// Appends one line (a newline is added) to the current batch.
    pub fn push_line(&mut self, line: &str) -> Result<(), SinkError> {
        self.push_record("", line)
    }

    fn write_buf(&mut self) -> Result<(), SinkError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let result = match &mut self.target {
            Target::File { file, .. } => file.write_all(&self.buf),
            Target::Stdout => io::stdout().lock().write_all(&self.buf),
            Target::Exported { .. } => Ok(()),
        };
        result.map_err(self.io_err("write"))?;
        self.written_len += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes the batch out (and with `durable`, to disk) and returns the length the
    /// commit must record. The length becomes committed with [`Sink::committed`].
    pub fn prepare_commit(&mut self, durable: bool) -> Result<u64, SinkError> {
        self.write_buf()?;
        let result = match &mut self.target {
            Target::File { file, .. } if durable => file.sync_data(),
            Target::File { .. } | Target::Exported { .. } => Ok(()),
            Target::Stdout => io::stdout().lock().flush(),
        };
        result.map_err(self.io_err("flush"))?;
        Ok(self.written_len)
    }

    /// Records that the store committed everything written so far.
    pub fn committed(&mut self) {
        self.committed_len = self.written_len;
        if let Target::Exported { records, .. } = &mut self.target {
            records.clear();
        }
    }

    /// Drops the current batch: buffered lines, and for a file what was written early.
    pub fn abort_batch(&mut self) -> Result<(), SinkError> {
        self.buf.clear();
        if let Target::Exported { records, .. } = &mut self.target {
            records.clear();
        }
        if let Target::File { file, path } = &mut self.target {
            let cut = |cause| SinkError::Io { what: "truncate", path: path.clone(), cause };
            file.set_len(self.committed_len).map_err(cut)?;
            file.seek(SeekFrom::Start(self.committed_len)).map_err(cut)?;
            self.written_len = self.committed_len;
        }
        Ok(())
    }
}

/// The committed lengths of a pipeline's three outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkLengths {
    /// The results.
    pub output: u64,
    /// The late records.
    pub late: u64,
    /// The dead letters.
    pub dead_letter: u64,
}

/// A pipeline's three outputs (results, late records, dead letters), committed and
/// taken back as one: a batch's lines reach all three or, after an abort, none.
#[derive(Debug)]
pub struct Sinks {
    /// The results.
    pub output: Sink,
    /// The late records.
    pub late: Sink,
    /// The dead letters.
    pub dead_letter: Sink,
}

impl Sinks {
    /// Writes what the three hold and returns their lengths, to be committed (with
    /// `durable`, on disk first).
    pub fn prepare_commit(&mut self, durable: bool) -> Result<SinkLengths, SinkError> {
        Ok(SinkLengths {
            output: self.output.prepare_commit(durable)?,
            late: self.late.prepare_commit(durable)?,
            dead_letter: self.dead_letter.prepare_commit(durable)?,
        })
    }

    /// Records that the store committed the lengths [`Sinks::prepare_commit`] gave.
    pub fn committed(&mut self) {
        for sink in self.all() {
            sink.committed();
        }
    }

    /// Takes back the batch from all three; the first failure is returned after all
    /// three were tried.
    pub fn abort_batch(&mut self) -> Result<(), SinkError> {
        let mut first = Ok(());
        for sink in self.all() {
            if let Err(e) = sink.abort_batch()
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }

    /// The current batch's records of the sinks that are Kafka topics, for the
    /// batch's export.
    pub fn exported(&self) -> Vec<TopicRecords<'_>> {
        [&self.output, &self.late, &self.dead_letter].into_iter().filter_map(Sink::topic_records).collect()
    }

    fn all(&mut self) -> [&mut Sink; 3] {
        [&mut self.output, &mut self.late, &mut self.dead_letter]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reopen_truncates_uncommitted_and_refuses_shrunk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out").join("o.jsonl");
        let mut sink = Sink::open_file(&path, 0).unwrap();
        sink.push_line("{\"a\":1}").unwrap();
        let len = sink.prepare_commit(true).unwrap();
        sink.committed();
        sink.push_line("{\"b\":2}").unwrap();
        sink.prepare_commit(false).unwrap(); // written but never committed
        drop(sink);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":1}\n{\"b\":2}\n");
        let mut sink = Sink::open_file(&path, len).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":1}\n");
        sink.push_line("{\"c\":3}").unwrap();
        sink.prepare_commit(false).unwrap();
        sink.abort_batch().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":1}\n");
        let err = Sink::open_file(&path, 100).unwrap_err().to_string();
        assert!(err.contains("were committed"), "{err}");
    }
}
