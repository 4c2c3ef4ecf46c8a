//! `cuda:N` on this machine, through the real driver loader: on a machine without the NVIDIA
//! driver (CI, this project's build machines) every way of using `cuda:0` — its allocator, choosing
//! it with `--devices`, replaying a trace on it — is the typed error naming the library names tried,
//! and listing devices still works; with a driver, the caching allocator runs on the card.
//! The driver-only half skips loudly without one (failing under `FERRITE_REQUIRE_SYSTEM_DEPS=1`
//! only when `FERRITE_TEST_DEVICES` asks for `cuda:*`).
use ferrite_memory::cuda::{self, DriverProblem};
use ferrite_memory::{AllocatorConfig, CachingAllocator, Device, MemoryError, list_devices, select_devices};

/// Without a driver: the same typed error from every entry point, naming the device asked for.
#[test]
fn without_a_driver_every_use_of_cuda_is_the_typed_error_naming_the_library() {
    let Err(problem) = cuda::driver() else {
        eprintln!("SKIPPED: this machine has the NVIDIA driver; the no-driver path is tested where it is missing");
        return;
    };
    let DriverProblem::NotFound { tried } = problem else {
        panic!("a driver library loaded but cannot be used: {}", problem.for_device("cuda"));
    };
    assert!(tried.iter().any(|n| n == "libcuda.so.1" || n == "nvcuda.dll"), "{tried:?}");
    let says_not_found = |e: &MemoryError, device: &str| {
        assert!(matches!(e, MemoryError::CudaDriverNotFound { device: d, .. } if d == device), "{e:?}");
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("{device} is not available: the NVIDIA CUDA driver library was not found")));
        assert!(msg.contains("libcuda.so.1"), "{msg}");
    };

    // The allocator of `cuda:1`: created (allocators never fail to exist), refusing every request.
    let alloc = CachingAllocator::new(Device::Cuda { index: 1 });
    let e = alloc.allocate(1 << 20).unwrap_err();
    says_not_found(&e, "cuda:1");
    assert_eq!(alloc.memory_reserved(), 0);

    // Choosing it, with or without a device list.
    says_not_found(&select_devices(&Device::Cuda { index: 0 }, None).unwrap_err(), "cuda:0");
    says_not_found(&select_devices(&Device::Cuda { index: 0 }, Some("0,1")).unwrap_err(), "cuda:0");
    says_not_found(&cuda::cuda_ordinal(3).unwrap_err(), "cuda:3");
    says_not_found(&cuda::cuda_device_count().unwrap_err(), "cuda");

    // Replaying a trace on it is the same error, not an address-only replay.
    let trace =
        ferrite_memory::replay::Trace::from_json(r#"{"events": [{"action": "alloc", "id": 1, "size": 512}]}"#).unwrap();
    let e = ferrite_memory::replay::replay(&trace, Device::Cuda { index: 0 }, AllocatorConfig::default()).unwrap_err();
    says_not_found(&e, "cuda:0");

    // Listing devices is not an error: there are simply no CUDA devices in it.
    let listed = list_devices(&[]).unwrap();
    assert!(listed.iter().all(|d| !matches!(d.device, Device::Cuda { .. })), "{listed:?}");
    assert_eq!(Device::Cuda { index: 2 }.hardware_name(), "cuda:2 (not available)");
}

/// With a driver: `cuda:0` is a device with the card's capacity, and the caching allocator's
/// segments come from the driver.
#[test]
fn with_a_driver_the_caching_allocator_runs_on_the_card() {
    if !ferrite_test_support::cuda_or_skip() {
        return;
    }
    let info = cuda::cuda_devices(true).unwrap();
    let first = &info[0];
    eprintln!(
        "cuda:0 = {} ({}, {} SMs), {} bytes total, {:?} free",
        first.name,
        first.arch(),
        first.multiprocessors,
        first.total_bytes,
        first.free_bytes
    );
    assert!(first.total_bytes > 0 && first.free_bytes.is_some_and(|f| f <= first.total_bytes));
    assert!(first.uuid.starts_with("GPU-"), "{}", first.uuid);
    let alloc = CachingAllocator::new(Device::Cuda { index: 0 });
    let b = alloc.allocate(600 * 1024).unwrap();
    assert_eq!(alloc.memory_allocated(), 600 * 1024);
    assert_eq!(alloc.memory_reserved(), 2 << 20);
    drop(b);
    alloc.empty_cache();
    assert_eq!(alloc.memory_reserved(), 0);
    let past = Device::Cuda { index: info.len() + 2 };
    let e = select_devices(&past, None).unwrap_err();
    assert!(matches!(e, MemoryError::CudaDeviceMissing { .. }), "{e:?}");
    assert!(e.to_string().contains(&format!("sees {} CUDA device(s)", info.len())), "{e}");
}
