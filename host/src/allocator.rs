//! The allocator settings of the binaries that use mimalloc (`groupstate`, the
//! benchmark): the one place that calls into mimalloc.

/// mimalloc's `mi_option_purge_delay` (its option enum, mimalloc 3 as built by
/// libmimalloc-sys 0.1.49, which names the option after it but not it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long mimalloc keeps memory freed before it returns it to the system. With
/// transparent huge pages off, over 10M events and 1M keys, 100 ms ran 1.23× faster
/// than 10 ms with a peak of 184 MiB instead of 155; mimalloc's default, one second,
/// 1.31× faster, but its peak of 231 MiB came close to the 256 MiB budget
/// (BENCHMARKS.md).
const PURGE_DELAY_MS: std::ffi::c_long = 100;

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
