//! The WASI context a plugin gets: nothing real. No files (no preopens), no network,
//! no environment or arguments, stdin closed, stdout and stderr captured into the
//! plugin's log (`output.rs`); clocks read the batch's processing time and random
//! numbers are seeded from (batch, key), so a replayed batch is bit-identical. Time
//! does not pass inside a call: waiting on a clock (`sleep`) returns at once, so a
//! plugin cannot block the host's thread where the CPU limit cannot reach it.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder};

use super::output::{CapturedStream, PluginLog};

/// The time and randomness a plugin instance sees, set by the host before each call.
#[derive(Debug, Default)]
pub struct VirtualEnv {
    now_ms: AtomicI64,
    seed: AtomicU64,
}

impl VirtualEnv {
    /// Sets what the next call sees: the batch's processing time, and a random stream
    /// derived from the batch id and the key.
    pub fn prepare_call(&self, processing_time_ms: i64, batch_id: u64, key: &str) {
        self.now_ms.store(processing_time_ms, Ordering::Relaxed);
        self.seed.store(seed_for(batch_id, key), Ordering::Relaxed);
    }

    /// The monotonic clock: the batch's processing time, in nanoseconds.
    fn monotonic_ns(&self) -> u64 {
        let ms = self.now_ms.load(Ordering::Relaxed);
        u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000)
    }
}

/// FNV-1a over the batch id and key, then one SplitMix64 round: stable across Rust
/// versions and platforms, unlike `DefaultHasher`.
fn seed_for(batch_id: u64, key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in batch_id.to_le_bytes().iter().chain(key.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    splitmix(&mut h)
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct VirtualClock(Arc<VirtualEnv>);

impl HostWallClock for VirtualClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn now(&self) -> Duration {
        let ms = self.0.now_ms.load(Ordering::Relaxed);
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }
}

impl HostMonotonicClock for VirtualClock {
    fn resolution(&self) -> u64 {
        1_000_000
    }
    fn now(&self) -> u64 {
        self.0.monotonic_ns()
    }
}

/// A SplitMix64 stream whose state lives in the shared [`VirtualEnv`], so the host can
/// reseed it per call.
struct VirtualRandom(Arc<VirtualEnv>);

impl rand_core::TryRng for VirtualRandom {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut state = self.0.seed.load(Ordering::Relaxed);
        let out = splitmix(&mut state);
        self.0.seed.store(state, Ordering::Relaxed);
        Ok(out)
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(8) {
            let v = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ok(())
    }
}

/// Builds the WASI context of one instance.
pub(super) fn build_ctx(env: &Arc<VirtualEnv>, log: &PluginLog) -> WasiCtx {
    let mut b = WasiCtxBuilder::new();
    // The builder grants no env, args, preopens or network, and closes stdio by
    // default; only clocks and random are live, so replace them.
    b.stdout(CapturedStream::stdout(log))
        .stderr(CapturedStream::stderr(log))
        .wall_clock(VirtualClock(env.clone()))
        .monotonic_clock(VirtualClock(env.clone()))
        .secure_random(VirtualRandom(env.clone()))
        .insecure_random(VirtualRandom(env.clone()))
        .insecure_random_seed(0x6772_6f75_7073_7461_7465_0000_0000_0001)
        .allow_ip_name_lookup(false)
        .allow_tcp(false)
        .allow_udp(false);
    b.build()
}

/// wasmtime-wasi's `monotonic-clock` sleeps for real until a subscribed instant, and
/// forever for one it cannot represent, in host code that epoch interruption cannot
/// stop. This one replaces it (the linker must allow shadowing): `now` is the batch's
/// time and every subscription is ready at once.
pub(super) fn add_virtual_monotonic_clock<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> VirtualClockView<'_>,
) -> wasmtime::Result<()> {
    monotonic_clock::add_to_linker::<T, VirtualClockData>(linker, view)
}

struct VirtualClockData;

impl HasData for VirtualClockData {
    type Data<'a> = VirtualClockView<'a>;
}

/// What the virtual `monotonic-clock` needs of the store.
pub(super) struct VirtualClockView<'a> {
    /// The instance's time.
    pub(super) env: &'a VirtualEnv,
    /// Where pollables live.
    pub(super) table: &'a mut ResourceTable,
}

impl monotonic_clock::Host for VirtualClockView<'_> {
    fn now(&mut self) -> wasmtime::Result<u64> {
        Ok(self.env.monotonic_ns())
    }

    fn resolution(&mut self) -> wasmtime::Result<u64> {
        Ok(1_000_000)
    }

    fn subscribe_instant(&mut self, _when: u64) -> wasmtime::Result<Resource<DynPollable>> {
        ready_now(self.table)
    }

    fn subscribe_duration(&mut self, _duration: u64) -> wasmtime::Result<Resource<DynPollable>> {
        ready_now(self.table)
    }
}

/// A clock subscription: time does not pass inside a call, so it is always due.
struct Due;

#[wasmtime_wasi::async_trait]
impl Pollable for Due {
    async fn ready(&mut self) {}
}

fn ready_now(table: &mut ResourceTable) -> wasmtime::Result<Resource<DynPollable>> {
    let due = table.push(Due)?;
    subscribe(table, due)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::Rng;

    #[test]
    fn random_is_reseeded_per_call() {
        let env = Arc::new(VirtualEnv::default());
        let mut rng = VirtualRandom(env.clone());
        env.prepare_call(5, 1, "k");
        let a = (rng.next_u64(), rng.next_u64());
        env.prepare_call(5, 1, "k");
        assert_eq!(a, (rng.next_u64(), rng.next_u64()));
        env.prepare_call(5, 2, "k");
        assert_ne!(a.0, rng.next_u64());
        assert_eq!(HostWallClock::now(&VirtualClock(env)), Duration::from_millis(5));
    }
}
