//! Time as an input. The engine never reads the real clock: it is handed a [`Clock`].
//! This module is the only place that reads the system time (clippy's
//! `disallowed-methods` enforces it), so tests drive time with [`ManualClock`] and a
//! replayed batch sees exactly the time it was planned with.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// A source of processing time in epoch milliseconds, and of waiting.
pub trait Clock: Send + Sync {
    /// The current processing time in epoch milliseconds.
    fn now_ms(&self) -> i64;
    /// Waits `ms` milliseconds of this clock's time (a manual clock just advances).
    fn sleep_ms(&self, ms: u64);
    /// A monotonic instant in nanoseconds, only for measuring durations (progress and
    /// the run summary), never for anything that reaches the state or the output.
    fn monotonic_ns(&self) -> u64;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // The one place that may read the real time.
    fn now_ms(&self) -> i64 {
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or(Duration::ZERO);
        i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
    }

    fn sleep_ms(&self, ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    #[allow(clippy::disallowed_methods)] // The one place that may read the real time.
    fn monotonic_ns(&self) -> u64 {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let start = START.get_or_init(std::time::Instant::now);
        u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to: for tests and deterministic runs.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now_ms: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        Self { now_ms: Arc::new(AtomicI64::new(now_ms)) }
    }

    /// Moves the clock to `now_ms`.
    pub fn set_ms(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the clock forward by `ms`.
    pub fn advance_ms(&self, ms: i64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn sleep_ms(&self, ms: u64) {
        self.advance_ms(i64::try_from(ms).unwrap_or(i64::MAX));
    }

    fn monotonic_ns(&self) -> u64 {
        u64::try_from(self.now_ms()).unwrap_or(0).saturating_mul(1_000_000)
    }
}
