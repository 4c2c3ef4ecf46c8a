//! The process-wide allocator of each device.
//!
//! Tensors find their device's allocator here, so all memory of a device is accounted in one
//! place. Registry allocators read `FERRITE_ALLOC_CONF` once; an invalid value does not panic:
//! every allocation then fails with the configuration error until [`configure`] sets valid
//! settings.
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::{AllocatorConfig, CachingAllocator, Device, MemoryError};

fn env_config() -> &'static Result<AllocatorConfig, MemoryError> {
    static ENV: OnceLock<Result<AllocatorConfig, MemoryError>> = OnceLock::new();
    ENV.get_or_init(AllocatorConfig::from_env)
}

fn registry() -> &'static Mutex<HashMap<Device, Arc<CachingAllocator>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<Device, Arc<CachingAllocator>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The devices whose allocator exists in this process (those used so far), in no fixed order.
pub fn registered_devices() -> Vec<Device> {
    registry().lock().keys().cloned().collect()
}

/// The allocator of `device`: one per device per process, created on first use.
pub fn allocator(device: &Device) -> Arc<CachingAllocator> {
    let mut map = registry().lock();
    map.entry(device.clone())
        .or_insert_with(|| {
            let a = match env_config() {
                Ok(cfg) => CachingAllocator::process_lifetime(device.clone(), cfg.clone()),
                Err(e) => {
                    let a = CachingAllocator::process_lifetime(device.clone(), AllocatorConfig::default());
                    a.set_config_error(e.clone());
                    a
                }
            };
            Arc::new(a)
        })
        .clone()
}

/// Set the settings of the registry allocator of `device` (replacing those from the environment).
pub fn configure(device: &Device, config: AllocatorConfig) {
    allocator(device).set_config(config);
}

/// The settings `FERRITE_ALLOC_CONF` gives the registry allocators (read once per process), or
/// the error naming the bad key.
pub fn env_alloc_config() -> Result<AllocatorConfig, MemoryError> {
    env_config().clone()
}
