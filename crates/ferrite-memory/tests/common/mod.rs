//! Helpers several of ferrite-memory's integration tests share.

use ferrite_memory::{AllocatorConfig, CachingAllocator, Device};

/// An address-only allocator for the device `spec` with the settings `conf` (the
/// `FERRITE_ALLOC_CONF` syntax): the same decisions and figures as a backed one, no memory used.
pub fn sim(spec: &str, conf: &str) -> CachingAllocator {
    CachingAllocator::unbacked(Device::parse(spec).unwrap(), AllocatorConfig::parse(conf).unwrap())
}

/// One statistic under PyTorch's flat name (`segment.small_pool.current`, …).
pub fn stat(a: &CachingAllocator, key: &str) -> i64 {
    a.memory_stats_flat()[key]
}
