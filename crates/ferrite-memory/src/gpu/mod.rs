//! Real GPUs through wgpu (Vulkan, Metal, DX12): adapter discovery, one device context per GPU,
//! and the raw memory backend whose segments are `wgpu::Buffer`s.
//!
//! ferrite names GPUs `gpu:0`, `gpu:1`, … in a fixed order: discrete GPUs first, then integrated,
//! virtual and other adapters, software rasterisers (Mesa's lavapipe) last, so `gpu:0` is the best
//! device a machine has. Each GPU's context (device, queue, limits) is created on first use and
//! lives for the process, like a CUDA context.
//!
//! Memory: a caching-allocator segment is one storage buffer and a block is (buffer, offset,
//! size), so PyTorch's rounding, pools and statistics apply unchanged (see `memory`). wgpu does
//! not report VRAM size, so the capacity comes from `FERRITE_GPU_MEMORY`, else from the GPU
//! catalogue by adapter name, else it is unknown and only the driver's refusal limits it.
//!
//! The wgpu part (`GpuContext`, [`context`], `memory`) is compiled only with the `gpu` cargo
//! feature (off by default in the library crates, on in the `ferrite` binary), so a CPU-only user
//! of the libraries does not build wgpu and naga. Without it this module still answers — no
//! adapters, [`COMPILED`] is `false` — and naming a `gpu:N` device is the typed
//! [`MemoryError::GpuNotCompiled`] that says how to turn the feature on.

mod adapter;
#[cfg(feature = "gpu")]
pub mod memory;
#[cfg(feature = "gpu")]
mod wgpu_device;

#[cfg(feature = "gpu")]
pub use wgpu_device::{GpuContext, context};

pub use adapter::{AdapterSummary, GPU_MEMORY_ENV};

use crate::MemoryError;

/// Whether this build has GPU support (the `gpu` cargo feature of ferrite-memory).
pub const COMPILED: bool = cfg!(feature = "gpu");

/// The error for a `gpu:N` device in a build without the `gpu` feature.
pub fn not_compiled(device: &str) -> MemoryError {
    MemoryError::GpuNotCompiled { device: device.to_string() }
}

// Defined here rather than in `device.rs`: naming a `gpu:N` needs the adapter list, and
// `device.rs` (parsing device names) is the leaf that this module builds on.
impl crate::Device {
    /// A human name of the hardware: the GPU model for `sim` and `gpu`, `host memory` for `cpu`.
    pub fn hardware_name(&self) -> String {
        match self {
            crate::Device::Cpu => "host memory".to_string(),
            crate::Device::Sim { profile, .. } => profile.name.clone(),
            crate::Device::Meta => "meta (no memory)".to_string(),
            crate::Device::Gpu { index } => match list_adapters().into_iter().nth(*index) {
                Some(a) => a.name,
                None => format!("gpu:{index} (no such adapter)"),
            },
            crate::Device::Cuda { index } => {
                match crate::cuda::cuda_devices(false).ok().and_then(|d| d.into_iter().nth(*index)) {
                    Some(c) => c.name,
                    None => format!("cuda:{index} (not available)"),
                }
            }
        }
    }
}

/// How many GPU adapters the machine has, before any visible-device list.
#[cfg(feature = "gpu")]
pub fn physical_adapter_count() -> usize {
    wgpu_device::physical_adapter_count()
}

/// How many GPU adapters the machine has: none that this build can use (no `gpu` feature).
#[cfg(not(feature = "gpu"))]
pub fn physical_adapter_count() -> usize {
    0
}

/// Every GPU adapter this process can use, in `gpu:N` order. Empty when there is no Vulkan,
/// Metal or DX12 driver (the Vulkan loader is opened at run time, so a machine without one still
/// runs everything else).
#[cfg(feature = "gpu")]
pub fn list_adapters() -> Vec<AdapterSummary> {
    wgpu_device::list_adapters()
}

/// Every GPU adapter this process can use: none in a build without the `gpu` feature
/// ([`COMPILED`] tells why the list is empty).
#[cfg(not(feature = "gpu"))]
pub fn list_adapters() -> Vec<AdapterSummary> {
    Vec::new()
}
