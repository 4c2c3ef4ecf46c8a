//! The wgpu side of [`super`]: the instance, the adapters in `gpu:N` order (after the visible-device
//! list), their summaries and capacities, and one device context per GPU. Compiled only with the
//! `gpu` feature; everything a build without it needs stays in `mod.rs`.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::adapter::{AdapterSummary, GPU_MEMORY_ENV};
use crate::{GpuProfile, MemoryError};

fn instance() -> &'static wgpu::Instance {
    static INSTANCE: OnceLock<wgpu::Instance> = OnceLock::new();
    INSTANCE.get_or_init(|| {
        let mut d = wgpu::InstanceDescriptor::new_without_display_handle();
        // Compute-capable modern APIs only: GL adapters lack what the kernels need.
        d.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
        wgpu::Instance::new(d)
    })
}

fn type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// The adapters this process may use, in `gpu:N` order: the physical ones, chosen and renumbered
/// by `--devices` / `FERRITE_VISIBLE_DEVICES` (see [`crate::visible_devices`]). A bad list leaves
/// none visible; opening a GPU then reports the list's error.
fn adapters() -> &'static [&'static wgpu::Adapter] {
    static VISIBLE: OnceLock<Vec<&'static wgpu::Adapter>> = OnceLock::new();
    VISIBLE.get_or_init(|| {
        let all = physical_adapters();
        match crate::visible_devices::gpu_selection(all.len()) {
            Ok(None) => all.iter().collect(),
            Ok(Some(chosen)) => chosen.into_iter().filter_map(|i| all.get(i)).collect(),
            Err(_) => Vec::new(),
        }
    })
}

/// See [`super::physical_adapter_count`].
pub(super) fn physical_adapter_count() -> usize {
    physical_adapters().len()
}

/// Every adapter ferrite can use, in physical order (enumerated once per process).
fn physical_adapters() -> &'static [wgpu::Adapter] {
    static ADAPTERS: OnceLock<Vec<wgpu::Adapter>> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        let mut v = pollster::block_on(
            instance().enumerate_adapters(wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12),
        );
        v.retain(|a| a.get_downlevel_capabilities().flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS));
        v.sort_by_key(|a| type_rank(a.get_info().device_type));
        v
    })
}

/// Parse `FERRITE_GPU_MEMORY`, if set. A malformed value is an error naming the variable.
fn env_capacity() -> Result<Option<u64>, MemoryError> {
    match std::env::var(GPU_MEMORY_ENV) {
        Ok(s) => crate::capacity::parse_capacity(&s).map(Some).ok_or_else(|| MemoryError::InvalidConfig {
            key: GPU_MEMORY_ENV.into(),
            value: s,
            reason: "expected a capacity such as `24GiB`, `16000MiB` or a number of bytes".into(),
        }),
        Err(_) => Ok(None),
    }
}

/// The catalogue entry whose marketing name matches an adapter's name (e.g. `NVIDIA H100 80GB
/// HBM3`), if any.
fn catalogue_profile(adapter_name: &str) -> Option<GpuProfile> {
    let name = adapter_name.to_ascii_lowercase();
    GpuProfile::catalogue().into_iter().find(|p| {
        let n = p.name.to_ascii_lowercase();
        name == n || name.contains(&n) || n.contains(&name)
    })
}

/// Capacity and where it came from.
fn capacity_for(info: &wgpu::AdapterInfo) -> Result<(Option<u64>, Option<String>), MemoryError> {
    if let Some(c) = env_capacity()? {
        return Ok((Some(c), Some(GPU_MEMORY_ENV.to_string())));
    }
    Ok(match catalogue_profile(&info.name) {
        Some(p) => (Some(p.usable_bytes()), Some(format!("catalogue: {}", p.key))),
        None => (None, None),
    })
}

fn summary(index: usize, a: &wgpu::Adapter) -> AdapterSummary {
    let info = a.get_info();
    let l = a.limits();
    let (capacity, capacity_source) = capacity_for(&info).unwrap_or((None, None));
    AdapterSummary {
        index,
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: info.driver.clone(),
        driver_info: info.driver_info.clone(),
        max_buffer_size: l.max_buffer_size,
        max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
        min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
        shader_f16: a.features().contains(wgpu::Features::SHADER_F16),
        capacity,
        capacity_source,
    }
}

/// See [`super::list_adapters`].
pub(super) fn list_adapters() -> Vec<AdapterSummary> {
    adapters().iter().enumerate().map(|(i, a)| summary(i, a)).collect()
}

/// One GPU's device, queue and the buffers of its memory segments.
pub struct GpuContext {
    index: usize,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    features: wgpu::Features,
    device: wgpu::Device,
    queue: wgpu::Queue,
    capacity: Option<u64>,
    capacity_source: Option<String>,
    /// Live segments by base address: (buffer, size).
    segments: Mutex<BTreeMap<u64, (wgpu::Buffer, u64)>>,
    /// Set when the driver reported the device lost.
    lost: Arc<Mutex<Option<String>>>,
    /// Validation or internal errors the driver reported outside an error scope.
    uncaptured: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuContext(gpu:{}, {})", self.index, self.info.name)
    }
}

impl GpuContext {
    fn create(index: usize, adapter: &wgpu::Adapter) -> Result<GpuContext, MemoryError> {
        let info = adapter.get_info();
        let (capacity, capacity_source) = capacity_for(&info)?;
        // Ask for everything the adapter offers: the largest buffers and bindings, and f16
        // arithmetic where it exists.
        let limits = adapter.limits();
        let features = adapter.features() & (wgpu::Features::SHADER_F16 | wgpu::Features::TIMESTAMP_QUERY);
        let desc = wgpu::DeviceDescriptor {
            label: Some("ferrite"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) =
            pollster::block_on(adapter.request_device(&desc)).map_err(|e| MemoryError::GpuUnavailable {
                device: format!("gpu:{index}"),
                reason: format!("the driver refused to create a device on {} ({:?}): {e}", info.name, info.backend),
            })?;
        let lost = Arc::new(Mutex::new(None));
        let lost2 = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            *lost2.lock() = Some(format!("{reason:?}: {msg}"));
        });
        let uncaptured = Arc::new(Mutex::new(None));
        let unc2 = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut slot = unc2.lock();
            if slot.is_none() {
                *slot = Some(e.to_string());
            }
        }));
        Ok(GpuContext {
            index,
            info,
            limits,
            features,
            device,
            queue,
            capacity,
            capacity_source,
            segments: Mutex::new(BTreeMap::new()),
            lost,
            uncaptured,
        })
    }

    pub fn index(&self) -> usize {
        self.index
    }
    pub fn info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }
    pub fn features(&self) -> wgpu::Features {
        self.features
    }
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }
    /// Bytes the allocator may reserve, if known.
    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }
    /// Where [`Self::capacity`] came from.
    pub fn capacity_source(&self) -> Option<&str> {
        self.capacity_source.as_deref()
    }

    /// The device-lost reason, once the driver reported one.
    pub fn lost(&self) -> Option<String> {
        self.lost.lock().clone()
    }

    /// Take the first error the driver reported outside an error scope (shader or validation
    /// errors), if any.
    pub fn take_uncaptured_error(&self) -> Option<String> {
        self.uncaptured.lock().take()
    }

    /// The buffer holding device address `addr`, with `addr`'s offset in it and the buffer's size.
    pub fn resolve(&self, addr: u64) -> Option<(wgpu::Buffer, u64, u64)> {
        let segs = self.segments.lock();
        let (&base, (buf, size)) = segs.range(..=addr).next_back()?;
        (addr < base + size).then(|| (buf.clone(), addr - base, *size))
    }

    pub(super) fn insert_segment(&self, addr: u64, buffer: wgpu::Buffer, size: u64) {
        self.segments.lock().insert(addr, (buffer, size));
    }

    pub(super) fn remove_segment(&self, addr: u64) -> Option<wgpu::Buffer> {
        self.segments.lock().remove(&addr).map(|(b, _)| b)
    }

    /// Buffers currently held for segments (for tests: `empty_cache` must release them all).
    pub fn live_buffers(&self) -> usize {
        self.segments.lock().len()
    }
}

/// The context of `gpu:<index>`, created on first use. Errors name the GPUs that exist.
pub fn context(index: usize) -> Result<Arc<GpuContext>, MemoryError> {
    static CONTEXTS: OnceLock<Mutex<Vec<Option<Arc<GpuContext>>>>> = OnceLock::new();
    crate::visible_devices::gpu_selection(physical_adapter_count())?;
    let all = adapters();
    if all.is_empty() {
        return Err(MemoryError::GpuUnavailable {
            device: format!("gpu:{index}"),
            reason: "no GPU adapter was found (no Vulkan, Metal or DX12 driver with compute support). On Debian/Ubuntu install `mesa-vulkan-drivers` and `libvulkan1` for a software GPU, or the vendor's driver; `ferrite devices` lists what is visible".into(),
        });
    }
    let Some(adapter) = all.get(index) else {
        let names: Vec<String> =
            all.iter().enumerate().map(|(i, a)| format!("gpu:{i} ({})", a.get_info().name)).collect();
        return Err(MemoryError::GpuUnavailable {
            device: format!("gpu:{index}"),
            reason: format!("this machine has {} GPU adapter(s): {}", all.len(), names.join(", ")),
        });
    };
    let cell = CONTEXTS.get_or_init(|| Mutex::new(vec![None; all.len()]));
    let mut v = cell.lock();
    if let Some(c) = &v[index] {
        return Ok(c.clone());
    }
    let c = Arc::new(GpuContext::create(index, adapter)?);
    v[index] = Some(c.clone());
    Ok(c)
}
