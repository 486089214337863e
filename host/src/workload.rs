//! The sensor-alerts workload generator (`groupstate gen sensor`): deterministic
//! JSON Lines from (events, sensors, seed), ordered by `ts`. Sensors report at their
//! own irregular pace, errors come in bursts, and sensors sometimes go silent for more
//! than ten minutes (see WORKLOAD.md at the repository root).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Write};

/// The first event time of a generated stream (2023-11-14T22:13:20Z).
pub const START_MS: i64 = 1_700_000_000_000;

/// A small, stable PRNG (SplitMix64): the same seed gives the same stream on every
/// platform and Rust version.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x5851_f42d_4c95_7f2d)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform float in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform integer in [lo, hi).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo) as u64) as i64
    }
}

/// The shape of a generated stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SensorSpec {
    /// Events to generate.
    pub events: u64,
    /// Distinct sensors.
    pub sensors: u32,
    /// The seed.
    pub seed: u64,
}

struct Sensor {
    mean_interval_ms: i64,
    in_burst: bool,
}

/// Chance per event that an `ok` sensor starts an error burst.
const BURST_START: f64 = 0.026;
/// Chance per event that a burst ends.
const BURST_END: f64 = 0.3;
/// Chance that an event inside a burst is an error.
const BURST_ERR: f64 = 0.85;
/// Chance per event that a sensor then goes silent for 10 to 40 minutes.
const SILENCE: f64 = 0.002;

/// Writes the stream to `out`, returning the number of lines written.
pub fn generate_sensor(spec: SensorSpec, out: &mut impl Write) -> io::Result<u64> {
    let mut rng = Rng::new(spec.seed);
    let sensors = spec.sensors.max(1);
    let mut state: Vec<Sensor> =
        (0..sensors).map(|_| Sensor { mean_interval_ms: rng.range(2_000, 30_000), in_burst: false }).collect();
    // (next report time, sensor): the heap yields events in ts order, ties by sensor.
    let mut heap: BinaryHeap<Reverse<(i64, u32)>> =
        (0..sensors).map(|i| Reverse((START_MS + rng.range(0, 30_000), i))).collect();
    let mut line = String::with_capacity(96);
    for _ in 0..spec.events {
        let Some(Reverse((ts, id))) = heap.pop() else { break };
        let sensor = &mut state[id as usize];
        if sensor.in_burst {
            if rng.unit() < BURST_END {
                sensor.in_burst = false;
            }
        } else if rng.unit() < BURST_START {
            sensor.in_burst = true;
        }
        let err = sensor.in_burst && rng.unit() < BURST_ERR;
        let reading = if err { 60.0 + rng.unit() * 40.0 } else { 15.0 + rng.unit() * 15.0 };
        line.clear();
        use std::fmt::Write as _;
        let _ = write!(
            line,
            "{{\"sensor_id\":\"s-{id:06}\",\"ts\":{ts},\"status\":\"{}\",\"reading\":{reading:.1}}}",
            if err { "err" } else { "ok" }
        );
        line.push('\n');
        out.write_all(line.as_bytes())?;
        let mean = sensor.mean_interval_ms;
        let mut next = ts + rng.range(mean / 2, mean * 3 / 2 + 1);
        if rng.unit() < SILENCE {
            next += rng.range(600_001, 2_400_000);
        }
        heap.push(Reverse((next, id)));
    }
    Ok(spec.events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_ordered_and_well_formed() {
        let spec = SensorSpec { events: 5_000, sensors: 50, seed: 7 };
        let mut a = Vec::new();
        let mut b = Vec::new();
        generate_sensor(spec, &mut a).unwrap();
        generate_sensor(spec, &mut b).unwrap();
        assert_eq!(a, b);
        let text = String::from_utf8(a).unwrap();
        let mut last = i64::MIN;
        let mut errs = 0;
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let ts = v["ts"].as_i64().unwrap();
            assert!(ts >= last);
            last = ts;
            errs += usize::from(v["status"] == "err");
        }
        assert_eq!(text.lines().count(), 5_000);
        assert!(errs > 10 && errs < 1_000, "{errs} errors");
        let mut c = Vec::new();
        generate_sensor(SensorSpec { seed: 8, ..spec }, &mut c).unwrap();
        assert_ne!(text.as_bytes(), &c[..]);
    }
}
