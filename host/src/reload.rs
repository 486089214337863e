//! Hot load from a file: a thread polls the plugin file and, when its content changes,
//! offers the new version to its [`SwapTarget`] (one pipeline, or every partition of a
//! Kafka run), which compiles, instantiates and initialises it off the processing path
//! and queues it; each pipeline swaps at a batch boundary of its own.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::hot_swap::{OfferError, SwapTarget};

/// The file watcher's thread: stopped and joined when dropped (within one interval).
#[derive(Debug)]
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A panic in the watcher has been reported by the panic hook already.
            let _ = thread.join();
        }
    }
}

/// Watches `path` every `interval_ms` until the returned [`Watcher`] is dropped.
/// `running_sha256` is the version already running, so the first look does not reload
/// it.
pub fn watch(
    path: PathBuf,
    target: Arc<dyn SwapTarget>,
    running_sha256: String,
    interval_ms: u64,
) -> std::io::Result<Watcher> {
    let stop = Arc::new(AtomicBool::new(false));
    let stop_seen = stop.clone();
    let thread = std::thread::Builder::new().name("groupstate-watch".into()).spawn(move || {
        let mut seen = running_sha256;
        let mut seen_meta = None;
        while !stop_seen.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(interval_ms));
            // Cheap first: only a changed size or mtime makes us read and hash the file.
            let meta = std::fs::metadata(&path).ok().map(|m| (m.len(), m.modified().ok()));
            if meta.is_none() || meta == seen_meta {
                continue;
            }
            seen_meta = meta;
            let Ok(bytes) = std::fs::read(&path) else { continue };
            let sha = crate::plugin::sha256_hex(&bytes);
            if sha == seen {
                continue;
            }
            match target.offer(&path, &path.display().to_string()) {
                Ok(_) => seen = sha,
                Err(OfferError::Refused(e)) => {
                    seen = sha;
                    tracing::warn!("new plugin version refused, the running one goes on: {e}");
                }
                Err(OfferError::Busy(e)) => {
                    // Offered again at the next look, once the pipelines have taken
                    // what they hold.
                    seen_meta = None;
                    tracing::warn!("new plugin version in {} not queued everywhere yet: {e}", path.display());
                }
            }
        }
    })?;
    Ok(Watcher { stop, thread: Some(thread) })
}
