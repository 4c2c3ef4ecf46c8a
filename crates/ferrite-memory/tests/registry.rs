//! The process-wide registry and `FERRITE_ALLOC_CONF` (own test binary: the variable is read once
//! per process).
use std::sync::Arc;

use ferrite_memory::{AllocatorConfig, Device, MemoryError, allocator, configure, env_alloc_config};

#[test]
fn a_bad_environment_config_is_reported_by_allocations_until_fixed() {
    // SAFETY: this is the only test of this binary and it sets the variable before any thread
    // that could read the environment is started.
    unsafe { std::env::set_var("FERRITE_ALLOC_CONF", "max_split_size_mb:12") };
    let err = env_alloc_config().unwrap_err();
    assert!(matches!(err, MemoryError::InvalidConfig { ref key, .. } if key == "max_split_size_mb"), "{err}");
    assert!(err.to_string().contains("FERRITE_ALLOC_CONF"), "{err}");

    let dev = Device::parse("sim:1GiB").unwrap();
    let a = allocator(&dev);
    assert!(Arc::ptr_eq(&a, &allocator(&Device::parse("sim:1024MiB").unwrap())), "one allocator per device");
    assert!(!Arc::ptr_eq(&a, &allocator(&Device::parse("sim:1GiB:1").unwrap())));
    let e = a.allocate(100).unwrap_err();
    assert!(matches!(e, MemoryError::InvalidConfig { ref key, .. } if key == "max_split_size_mb"), "{e}");
    assert!(a.allocate(0).is_ok(), "empty blocks need no memory");

    configure(&dev, AllocatorConfig::parse("max_split_size_mb:64").unwrap());
    let b = a.allocate(100).unwrap();
    assert_eq!(b.size(), 512);
    assert_eq!(a.config().max_split_size, 64 << 20);
    // blocks of registry allocators can move between threads
    std::thread::spawn(move || drop(b)).join().unwrap();
    assert_eq!(a.memory_allocated(), 0);
}
