//! The allocator settings of the binaries that use mimalloc (`groupstate`, the
//! benchmark): the one place that calls into mimalloc.

/// mimalloc's `mi_option_purge_delay` (its option enum, mimalloc 3 as built by
/// libmimalloc-sys 0.1.49, which names the option after it but not it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long mimalloc keeps memory freed before it returns it to the system. Its
/// default, one second, held some 70 MiB more at the peak of a run over a million keys
/// (the folds free their chunks and pages in bursts); 10 ms costs a few percent of
/// throughput there (BENCHMARKS.md).
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// Makes mimalloc return freed memory to the system after [`PURGE_DELAY_MS`], unless
/// `MIMALLOC_PURGE_DELAY` is set (mimalloc reads its own variables). Call it first in
/// `main`, before any other thread runs.
pub fn return_freed_memory_sooner() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    #[allow(unsafe_code)]
    // SAFETY: mi_option_set stores an option value; mimalloc reads its options with
    // atomic loads, and the option number is mimalloc's own (see the test).
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option is the purge delay, just below the one libmimalloc-sys names after
    /// it, and setting it reads back.
    #[test]
    fn the_option_is_mimallocs_purge_delay() {
        assert_eq!(libmimalloc_sys::mi_option_use_numa_nodes - 1, MI_OPTION_PURGE_DELAY);
        return_freed_memory_sooner();
        #[allow(unsafe_code)]
        // SAFETY: reads an option value.
        let value = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(value, PURGE_DELAY_MS);
        }
    }
}
