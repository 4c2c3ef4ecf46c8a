use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::{CachingAllocator, Device};

/// The allocator of `device`: one per device per process, created on first use.
pub fn allocator(device: &Device) -> Arc<CachingAllocator> {
    static REGISTRY: OnceLock<Mutex<HashMap<Device, Arc<CachingAllocator>>>> = OnceLock::new();
    let map = REGISTRY.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    map.entry(device.clone()).or_insert_with(|| Arc::new(CachingAllocator::new(device.clone()))).clone()
}
