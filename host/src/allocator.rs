//! The global allocator of the binaries (`groupstate`, the benchmark): mimalloc, its
//! settings, and the one place that calls into it.

use std::alloc::{GlobalAlloc, Layout};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use mimalloc::MiMalloc;

use crate::store::SEGMENT_BYTES;

/// mimalloc's `mi_option_purge_delay` (its option enum, mimalloc 3 as built by
/// libmimalloc-sys 0.1.49, which names the option after it but not it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long mimalloc keeps memory freed before it returns it to the system. With
/// transparent huge pages off, over 10M events and 1M keys, 100 ms ran 1.23× faster
/// than 10 ms with a peak of 184 MiB instead of 155; mimalloc's default, one second,
/// 1.31× faster, but its peak of 231 MiB came close to the 256 MiB budget
/// (BENCHMARKS.md).
const PURGE_DELAY_MS: std::ffi::c_long = 100;

/// sled's log buffer: one segment of a new store ([`SEGMENT_BYTES`]; a store created
/// with sled's default, 512 KiB, keeps it, and its buffers go straight to mimalloc),
/// 8 KiB-aligned. sled allocates one each time the previous fills, and frees it once
/// written: over 10M events and 1M keys, gigabytes that mimalloc handed back to the
/// system after its purge delay and the fold faulted in again, page by page.
const IO_BUFFER_BYTES: usize = SEGMENT_BYTES;
const IO_BUFFER_ALIGN: usize = 8192;

/// Freed log buffers kept for the next ones, 8 MiB at most. sled has many in flight
/// during a fold, and frees them in bursts as its I/O threads write them: over 1M
/// events and 1M keys, 4 kept (of 512 KiB) served a fifth of the 621 buffers asked
/// for, 16 kept 69%, and a 10M-event run took 5% less CPU time (BENCHMARKS.md). With
/// 1 MiB segments, 8 kept ran at least as fast as 2 MiB segments with 4 or 8 kept, and
/// peaked lower.
const IO_BUFFERS_KEPT: usize = 8;

static KEPT: [AtomicPtr<u8>; IO_BUFFERS_KEPT] = [const { AtomicPtr::new(ptr::null_mut()) }; IO_BUFFERS_KEPT];

/// The global allocator of the binaries: mimalloc, in front of which this keeps a few
/// of sled's freed log buffers for the next ones ([`IO_BUFFER_BYTES`]). Everything
/// else goes straight to mimalloc.
pub struct Allocator;

fn is_io_buffer(layout: Layout) -> bool {
    layout.size() == IO_BUFFER_BYTES && layout.align() == IO_BUFFER_ALIGN
}

// SAFETY: every block comes from mimalloc, with the layout it is freed with; a kept
// block is owned by its slot until one `swap` takes it out, so it is handed out once.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_io_buffer(layout) {
            for slot in &KEPT {
                let kept = slot.swap(ptr::null_mut(), Ordering::Acquire);
                if !kept.is_null() {
                    return kept;
                }
            }
        }
        // SAFETY: the caller's layout, as GlobalAlloc requires.
        unsafe { MiMalloc.alloc(layout) }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if is_io_buffer(layout) {
            for slot in &KEPT {
                if slot.compare_exchange(ptr::null_mut(), block, Ordering::Release, Ordering::Relaxed).is_ok() {
                    return;
                }
            }
        }
        // SAFETY: allocated by mimalloc with this layout.
        unsafe { MiMalloc.dealloc(block, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { MiMalloc.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: every block is mimalloc's, a kept one included.
        unsafe { MiMalloc.realloc(block, layout, new_size) }
    }
}

/// Makes mimalloc return freed memory to the system after [`PURGE_DELAY_MS`], unless
/// `MIMALLOC_PURGE_DELAY` is set (mimalloc reads its own variables), and turns
/// transparent huge pages off for the process, unless `MIMALLOC_ALLOW_THP` is set.
/// mimalloc asks for huge pages on its arenas, so every page its purge returned was
/// faulted back in as 2 MiB that the kernel zeroes: over 10 000 keys a run took 15%
/// more CPU time, and over a million keys its peak held 48 MiB more (BENCHMARKS.md). mimalloc's own `allow_thp` option comes too late
/// here (its first arena is reserved before `main`), so the process opts out with
/// `prctl`, which holds for every later fault. Call it first in `main`, before any
/// other thread runs.
pub fn configure() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        #[allow(unsafe_code)]
        // SAFETY: mi_option_set stores an option value; mimalloc reads its options with
        // atomic loads, and the option number is mimalloc's own (see the test).
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
        }
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        disable_transparent_huge_pages();
    }
}

/// `prctl(PR_SET_THP_DISABLE, 1)`: no transparent huge pages for this process (and its
/// children). A kernel that refuses leaves them on, which costs only speed.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    {
        #[allow(unsafe_code)]
        // SAFETY: PR_SET_THP_DISABLE takes plain integers and changes only a flag of
        // this process's memory map.
        let refused = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0;
        if refused {
            tracing::debug!("the kernel kept transparent huge pages on for this process");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A freed log buffer is the next one handed out; other blocks are not kept.
    #[test]
    #[allow(unsafe_code)]
    fn a_freed_io_buffer_is_handed_out_again() {
        let io = Layout::from_size_align(IO_BUFFER_BYTES, IO_BUFFER_ALIGN).unwrap();
        let other = Layout::from_size_align(IO_BUFFER_BYTES, 8).unwrap();
        // SAFETY: blocks allocated and freed with their own layouts, each once.
        unsafe {
            let first = Allocator.alloc(io);
            assert!(!first.is_null());
            assert_eq!(first as usize % IO_BUFFER_ALIGN, 0);
            first.write_bytes(7, IO_BUFFER_BYTES);
            Allocator.dealloc(first, io);
            let again = Allocator.alloc(io);
            assert_eq!(again, first, "the kept buffer is handed out");
            let next = Allocator.alloc(io);
            assert_ne!(next, again);
            Allocator.dealloc(again, io);
            Allocator.dealloc(next, io);
            let block = Allocator.alloc(other);
            Allocator.dealloc(block, other);
            assert!(KEPT.iter().all(|slot| slot.load(Ordering::Relaxed) != block), "only log buffers are kept");
        }
    }

    /// The option is the purge delay, just below the one libmimalloc-sys names after
    /// it, and setting it reads back; the process has THP off afterwards.
    #[test]
    fn the_option_is_mimallocs_purge_delay_and_thp_is_off() {
        assert_eq!(libmimalloc_sys::mi_option_use_numa_nodes - 1, MI_OPTION_PURGE_DELAY);
        configure();
        #[allow(unsafe_code)]
        // SAFETY: reads an option value.
        let value = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(value, PURGE_DELAY_MS);
        }
        #[cfg(target_os = "linux")]
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
            #[allow(unsafe_code)]
            // SAFETY: PR_GET_THP_DISABLE reads a flag of this process.
            let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
            assert_eq!(disabled, 1);
        }
    }
}
