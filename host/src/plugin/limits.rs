//! What one plugin instance may hold: all its linear memories and tables together
//! within `instance_memory_bytes_max`, a fixed number of memories, tables and core
//! instances, and `instance_resources_max` resource handles. wasmtime's own
//! `StoreLimits` bounds each memory on its own, so a component with sixteen memories
//! could hold sixteen times the limit; this limiter counts their sum.

use wasmtime::ResourceLimiter;

/// Host bytes one table element costs: wasmtime keeps a pointer per element, so tables
/// count against `instance_memory_bytes_max` at this rate.
pub(super) const TABLE_ELEMENT_BYTES: usize = std::mem::size_of::<usize>();

/// Linear memories one instance may create. Each one reserves its own address space
/// and guard region in the host, whatever its size; compilers emit one (Rust, C) or a
/// few (componentize-py and -js link several modules, which share one).
pub(super) const INSTANCE_MEMORIES_MAX: usize = 16;

/// Tables one instance may create (a component's shim and adapter modules add a few
/// small ones to each compiled module's own).
pub(super) const INSTANCE_TABLES_MAX: usize = 64;

/// Core module instances one component instance may create.
pub(super) const INSTANCE_CORE_INSTANCES_MAX: usize = 64;

/// The store limiter of one plugin instance (one wasmtime `Store`). Memories and tables
/// only grow and are freed together with the store, so a running sum is exact.
#[derive(Debug)]
pub(super) struct InstanceLimiter {
    bytes_max: usize,
    /// Bytes of all memories plus [`TABLE_ELEMENT_BYTES`] per table element, as
    /// granted so far.
    used_bytes: usize,
}

impl InstanceLimiter {
    /// A limiter granting `bytes_max` in all (`instance_memory_bytes_max`).
    pub(super) fn new(bytes_max: u64) -> Self {
        Self { bytes_max: usize::try_from(bytes_max).unwrap_or(usize::MAX), used_bytes: 0 }
    }

    /// Grants growing one memory or table from `current_bytes` to `desired_bytes`, or
    /// traps with a message naming the limit. A trap rather than a failed `grow`:
    /// most guests abort on a failed allocation anyway, and the trap says why.
    fn grow(&mut self, what: &str, current_bytes: usize, desired_bytes: usize) -> wasmtime::Result<bool> {
        let total = self.used_bytes.saturating_sub(current_bytes).saturating_add(desired_bytes);
        if total > self.bytes_max {
            return Err(wasmtime::Error::msg(format!(
                "{what} from {current_bytes} to {desired_bytes} bytes would bring the instance's memories and \
                 tables to {total} bytes, over instance_memory_bytes_max = {}; make the plugin use less memory \
                 or raise the limit",
                self.bytes_max
            )));
        }
        self.used_bytes = total;
        Ok(true)
    }
}

impl ResourceLimiter for InstanceLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false); // Beyond the memory's own maximum: `memory_grow_failed` says so.
        }
        // `current` is 0 when the memory is created (its minimum size, at instantiation).
        let what = if current == 0 { "creating a linear memory" } else { "growing a linear memory" };
        self.grow(what, current, desired)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(wasmtime::Error::msg(format!("a linear memory could not grow: {error}")))
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        let what = if current == 0 { "creating a table" } else { "growing a table" };
        self.grow(what, current.saturating_mul(TABLE_ELEMENT_BYTES), desired.saturating_mul(TABLE_ELEMENT_BYTES))
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(wasmtime::Error::msg(format!("a table could not grow: {error}")))
    }

    fn instances(&self) -> usize {
        INSTANCE_CORE_INSTANCES_MAX
    }

    fn tables(&self) -> usize {
        INSTANCE_TABLES_MAX
    }

    fn memories(&self) -> usize {
        INSTANCE_MEMORIES_MAX
    }
}

/// What a trap message says about a count limit wasmtime enforced for this limiter
/// ("resource limit exceeded: memory count too high at 17"), if it is one.
pub(super) fn count_limit_hint(message: &str) -> Option<String> {
    if !message.contains("count too high") {
        return None;
    }
    Some(format!(
        " (a plugin instance may have at most {INSTANCE_MEMORIES_MAX} linear memories, {INSTANCE_TABLES_MAX} \
         tables and {INSTANCE_CORE_INSTANCES_MAX} core instances: each memory reserves address space of its own, \
         and instance_memory_bytes_max bounds their total size; link the plugin's modules to share one memory)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memories_and_tables_share_one_budget() {
        let mut limiter = InstanceLimiter::new(1 << 20);
        assert!(limiter.memory_growing(0, 512 << 10, None).unwrap());
        assert!(limiter.memory_growing(0, 256 << 10, None).unwrap());
        // 64 Ki elements of a table cost 512 KiB: one byte over.
        let over = limiter.table_growing(0, (256 << 10) / TABLE_ELEMENT_BYTES + 1, None).unwrap_err().to_string();
        assert!(over.contains("creating a table") && over.contains("instance_memory_bytes_max = 1048576"), "{over}");
        assert!(limiter.table_growing(0, (256 << 10) / TABLE_ELEMENT_BYTES, None).unwrap());
        let over = limiter.memory_growing(256 << 10, (256 << 10) + 65536, None).unwrap_err().to_string();
        assert!(over.contains("growing a linear memory from 262144 to 327680 bytes"), "{over}");
        assert!(!limiter.memory_growing(0, 65536, Some(0)).unwrap(), "beyond its own maximum: refused, no trap");
    }

    #[test]
    fn count_limits_are_explained() {
        let hint = count_limit_hint("resource limit exceeded: memory count too high at 17").unwrap();
        assert!(hint.contains("at most 16 linear memories"), "{hint}");
        assert_eq!(count_limit_hint("out of bounds memory access"), None);
    }
}
