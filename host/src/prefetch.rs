//! A hint to the CPU: fetch a value's cache line now, because it will be read soon.
//! Loops over many keys at a million keys (the overlay's probes, a batch's page walk)
//! otherwise wait on memory at each key, one key after the other.

/// Asks the CPU to bring the cache line of `value` into its caches: a hint, which reads
/// nothing a program sees and cannot fault. A no-op off x86_64.
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 CPU has; it touches no
    // memory the program can observe, and the address is a live reference's.
    #[allow(unsafe_code)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(std::ptr::from_ref(value).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
