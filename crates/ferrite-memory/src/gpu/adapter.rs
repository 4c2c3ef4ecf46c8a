//! What ferrite reports about a GPU adapter, in a file of its own: both the listing in `mod.rs`
//! (with or without the `gpu` feature) and the wgpu side (`wgpu_device.rs`) need it, and neither
//! should import the other for it.

/// Environment variable that sets the capacity of every GPU (`24GiB`, `16000MiB`, bytes).
pub const GPU_MEMORY_ENV: &str = "FERRITE_GPU_MEMORY";

/// What ferrite knows about one GPU adapter (for listings and `ferrite devices`).
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    /// ferrite's index (`gpu:<index>`).
    pub index: usize,
    pub name: String,
    /// `Vulkan`, `Metal`, `Dx12`.
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub min_storage_buffer_offset_alignment: u32,
    pub shader_f16: bool,
    /// Capacity in bytes as ferrite will use it (see the module documentation), if known.
    pub capacity: Option<u64>,
    /// Where the capacity comes from (`FERRITE_GPU_MEMORY`, `catalogue: <key>`), if known.
    pub capacity_source: Option<String>,
}
