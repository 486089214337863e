//! The fold marker: a small file beside sled's, replaced atomically after every fold,
//! that remembers the last commit folded into sled and a digest of its checkpoint.
//! sled recovers from damaged, truncated or zeroed files by going back to an older
//! state (or an empty one) without a word; the redo log was emptied by the fold, so
//! without the marker the store would open at that older state and the pipeline would
//! cut committed output back and write it again differently. With it, the store
//! refuses to open instead.
//!
//! The file is 24 bytes: a magic, the sequence number (u64), the digest (u32) and a
//! crc32 of the 20 bytes before it, little endian. It depends on nothing else in the
//! store: `store.rs` computes the digest and maps the I/O errors.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

const FILE: &str = "fold.mark";
const TMP: &str = "fold.mark.tmp";
const MAGIC: &[u8; 8] = b"gsfold01";
const LEN: usize = 24;

/// What the marker says sled holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FoldMark {
    /// The sequence number of the last folded commit.
    pub seq: u64,
    /// A digest of the checkpoint folded with it.
    pub digest: u32,
}

/// Reads the marker in `dir`; `None` when there is none (a new store, or one written
/// before markers existed).
pub(crate) fn read(dir: &Path) -> io::Result<Option<FoldMark>> {
    let bytes = match fs::read(dir.join(FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let damaged = || io::Error::new(io::ErrorKind::InvalidData, format!("{FILE} is damaged"));
    if bytes.len() != LEN || &bytes[..8] != MAGIC {
        return Err(damaged());
    }
    let word = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    if crc32fast::hash(&bytes[..20]) != word(20) {
        return Err(damaged());
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&bytes[8..16]);
    Ok(Some(FoldMark { seq: u64::from_le_bytes(seq), digest: word(16) }))
}

/// Replaces the marker in `dir` and waits until the new one is on disk.
pub(crate) fn write(dir: &Path, mark: FoldMark) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(LEN);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&mark.seq.to_le_bytes());
    bytes.extend_from_slice(&mark.digest.to_le_bytes());
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    replace_durably(dir, FILE, TMP, &bytes)
}

/// Replaces `dir/name` with `bytes` through `dir/tmp` and a rename, and waits until
/// the new file is on disk: a crash leaves the old file or the new one, whole.
pub(crate) fn replace_durably(dir: &Path, name: &str, tmp: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(tmp);
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    // The rename is durable once the directory is.
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_detects_damage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let mark = FoldMark { seq: 42, digest: 0xdead_beef };
        write(dir.path(), mark).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(mark));
        let path = dir.path().join(FILE);
        for at in 0..LEN {
            let mut bytes = fs::read(&path).unwrap();
            bytes[at] ^= 1;
            let copy = tempfile::tempdir().unwrap();
            fs::write(copy.path().join(FILE), &bytes).unwrap();
            assert!(read(copy.path()).is_err(), "flipped byte {at} not detected");
        }
    }
}
