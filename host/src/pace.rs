//! Notices a plugin that turns slow: each batch's plugin time per call is compared with
//! the median of the recent batches. The CPU limit stops a call that runs away; a
//! plugin that spends most of that limit on every key is never stopped, and slows the
//! whole pipeline, so the host says so in its log.

use std::collections::VecDeque;

/// Batches whose per-call time makes up the median.
pub(crate) const PACE_WINDOW_BATCHES: usize = 32;

/// Batches seen before any warning: a median of fewer says little.
const PACE_WARMUP_BATCHES: usize = 8;

/// How far above the median a batch must be to warn.
const SLOW_RATIO: u64 = 10;

/// Plugin time of a batch below which it never warns: ten times a few microseconds
/// per call is noise (a page fault, the scheduler), not a slow plugin.
const SLOW_BATCH_PLUGIN_NS_MIN: u64 = 100_000_000;

/// A batch far slower than the recent ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlowBatch {
    /// This batch's plugin time per call.
    pub per_call_ns: u64,
    /// The median per-call time of the batches before it.
    pub median_ns: u64,
    /// How many batches the median is over.
    pub batches: usize,
}

/// The per-call plugin times of the last [`PACE_WINDOW_BATCHES`] batches.
#[derive(Debug, Default)]
pub(crate) struct PaceWatch {
    recent: VecDeque<u64>,
}

impl PaceWatch {
    /// Records a batch that spent `plugin_ns` in `calls` plugin calls; returns how slow
    /// it was if it is far above the recent median. A slow batch joins the window, so
    /// a plugin that stays slow stops warning once it is the norm.
    pub(crate) fn record(&mut self, plugin_ns: u64, calls: u64) -> Option<SlowBatch> {
        if calls == 0 {
            return None;
        }
        let per_call_ns = plugin_ns / calls;
        let slow = self.median().and_then(|median_ns| {
            let far_above = per_call_ns > median_ns.max(1).saturating_mul(SLOW_RATIO);
            (far_above && plugin_ns >= SLOW_BATCH_PLUGIN_NS_MIN).then_some(SlowBatch {
                per_call_ns,
                median_ns,
                batches: self.recent.len(),
            })
        });
        if self.recent.len() == PACE_WINDOW_BATCHES {
            self.recent.pop_front();
        }
        self.recent.push_back(per_call_ns);
        slow
    }

    /// The median of the window, once it has seen enough batches.
    fn median(&self) -> Option<u64> {
        if self.recent.len() < PACE_WARMUP_BATCHES {
            return None;
        }
        let mut sorted: Vec<u64> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        Some(sorted[sorted.len() / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_far_above_the_median_and_the_floor_is_slow() {
        let mut pace = PaceWatch::default();
        for _ in 0..PACE_WARMUP_BATCHES {
            assert_eq!(pace.record(10_000 * 100, 100), None, "steady");
        }
        // 20 ms per call is 2000 times the median, but one call is under the floor.
        assert_eq!(pace.record(20_000_000, 1), None);
        let slow = pace.record(200_000_000, 10).expect("slow");
        assert_eq!(slow, SlowBatch { per_call_ns: 20_000_000, median_ns: 10_000, batches: 9 });
        assert_eq!(pace.record(0, 0), None, "a batch without calls says nothing");
    }

    #[test]
    fn nothing_is_slow_during_warmup_and_a_slow_norm_stops_warning() {
        let mut pace = PaceWatch::default();
        assert_eq!(pace.record(500_000_000, 1), None, "no median yet");
        for _ in 0..PACE_WARMUP_BATCHES {
            pace.record(1_000, 1);
        }
        let warnings = (0..PACE_WINDOW_BATCHES).filter(|_| pace.record(500_000_000, 1).is_some()).count();
        assert!(warnings > 0 && warnings < PACE_WINDOW_BATCHES, "{warnings}");
    }
}
