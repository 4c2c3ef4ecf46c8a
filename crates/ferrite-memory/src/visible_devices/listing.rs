//! The visible-device list applied to this machine: choosing the devices of a run
//! ([`select_devices`], [`set_visible_devices`]) and listing them with their memory
//! ([`devices`], [`list_devices`]).
//!
//! Why a file of its own: applying a list needs the machine's GPU adapters (`gpu/`), while `gpu/`
//! needs the parsed list and the process's selection (`visible_devices.rs`) to number its
//! adapters. With both halves in one file, `gpu/` and `visible_devices` imported each other;
//! now the order is one way: `device.rs` (names) ← `visible_devices.rs` (the list) ← `gpu/`
//! (adapters) ← this file. Everything here is re-exported from `visible_devices`.

use super::{
    GPU_SELECTION, SIM_BOX_GPUS, VISIBLE_DEVICES_ENV, gpu_selection, parse_device_list, set_cuda_selection,
    valid_indices,
};
use crate::{Device, MemoryError, format_size, gpu};

/// One device this process may use, as `ferrite devices` and `ferrite::devices()` list it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// The device under its visible (renumbered) index.
    pub device: Device,
    /// The physical index it was chosen from (`None` for `cpu`).
    pub physical_index: Option<usize>,
    /// The hardware's name (`NVIDIA A100-SXM4-40GB`, `host memory`).
    pub name: String,
    /// Capacity in bytes, when known (a simulated card's, a GPU's from the catalogue or
    /// `FERRITE_GPU_MEMORY`, the host's total memory for `cpu`).
    pub capacity: Option<u64>,
    /// Free bytes now, when known (capacity less what this process's allocator reserves; for
    /// `cpu`, the host's available memory).
    pub free: Option<u64>,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let size = |b: Option<u64>| b.map_or_else(|| "unknown".to_string(), format_size);
        write!(
            f,
            "{:<20} {:<28} capacity {:>10}  free {:>10}",
            self.device.to_string(),
            self.name,
            size(self.capacity),
            size(self.free)
        )?;
        if let Some(p) = self.physical_index
            && p != self.device.index()
        {
            write!(f, "  (physical {p})")?;
        }
        Ok(())
    }
}

/// Choose the devices for `--device <base>` and an optional `--devices` list (falling back to
/// `FERRITE_VISIBLE_DEVICES`), renumbered from 0. `cpu` and `meta` are one device (an explicit
/// list with them is an error; the environment variable is ignored for them, as CUDA's is).
pub fn select_devices(base: &Device, list: Option<&str>) -> Result<Vec<Device>, MemoryError> {
    let from_env = std::env::var(VISIBLE_DEVICES_ENV).ok();
    match base {
        Device::Cpu | Device::Meta => match list {
            Some(l) => Err(MemoryError::InvalidDeviceList {
                list: l.to_string(),
                reason: format!("`{base}` is a single device; a device list applies to `sim:<gpu>` and `gpu`"),
                valid: "0".into(),
            }),
            None => Ok(vec![base.clone()]),
        },
        Device::Sim { profile, index } => match list.or(from_env.as_deref()) {
            None => Ok(vec![base.clone()]),
            Some(l) => {
                let chosen = parse_device_list(l, SIM_BOX_GPUS)?;
                let _ = index;
                Ok((0..chosen.len()).map(|i| Device::Sim { profile: profile.clone(), index: i }).collect())
            }
        },
        Device::Cuda { index } => {
            // The emulated device (FERRITE_CUDA_EMULATOR=1) is the only one: no list applies.
            if crate::cuda::emulator_enabled() {
                crate::cuda::cuda_ordinal(*index)?;
                return Ok(vec![base.clone()]);
            }
            // A list chooses among the devices the driver shows (after CUDA_VISIBLE_DEVICES). No
            // driver, or a driver showing nothing, is the error of the device asked for.
            let shown = crate::cuda::driver().map_err(|p| p.for_device(&base.to_string()))?.device_count;
            if shown == 0 {
                crate::cuda::cuda_ordinal(*index)?;
            }
            if let Some(l) = list {
                set_cuda_selection(l, shown)?;
                let n = crate::cuda::cuda_device_count()?;
                return Ok((0..n).map(|index| Device::Cuda { index }).collect());
            }
            if from_env.is_some() {
                let n = crate::cuda::cuda_device_count()?;
                return Ok((0..n).map(|index| Device::Cuda { index }).collect());
            }
            crate::cuda::cuda_ordinal(*index)?;
            Ok(vec![base.clone()])
        }
        Device::Gpu { .. } => {
            if !gpu::COMPILED {
                return Err(gpu::not_compiled(&base.to_string()));
            }
            if let Some(l) = list {
                set_visible_devices(l)?;
            }
            let n = gpu::list_adapters().len();
            visible_gpu_error()?;
            match (list.is_some() || from_env.is_some(), base) {
                (true, _) => Ok((0..n).map(|index| Device::Gpu { index }).collect()),
                (false, Device::Gpu { index }) if *index < n => Ok(vec![base.clone()]),
                (false, _) => Err(MemoryError::GpuUnavailable {
                    device: base.to_string(),
                    reason: format!("this process sees {n} GPU(s); `ferrite devices` lists them"),
                }),
            }
        }
    }
}

/// Choose and renumber the real GPUs this process uses (`--devices 1,3`), overriding
/// `FERRITE_VISIBLE_DEVICES`. Must run before the first GPU is listed or opened; a second call
/// with a different list is an error.
pub fn set_visible_devices(list: &str) -> Result<(), MemoryError> {
    let physical = gpu::physical_adapter_count();
    let parsed = parse_device_list(list, physical).map(Some);
    let stored = GPU_SELECTION.get_or_init(|| parsed.clone());
    if *stored != parsed {
        return Err(MemoryError::InvalidDeviceList {
            list: list.to_string(),
            reason: "the visible GPUs were already chosen for this process (set the list once, before the first GPU is used)".into(),
            valid: valid_indices(physical),
        });
    }
    stored.clone().map(|_| ())
}

/// The error of a bad GPU list, if the visible GPUs were chosen with one.
pub fn visible_gpu_error() -> Result<(), MemoryError> {
    gpu_selection(gpu::physical_adapter_count()).map(|_| ())
}

/// Every device this process may use: `cpu`, every simulated GPU created so far in this process
/// (the ones a run asked for), and the visible real GPUs (renumbered) with their capacity and
/// free memory. A bad `FERRITE_VISIBLE_DEVICES` is an error.
pub fn devices() -> Result<Vec<DeviceInfo>, MemoryError> {
    let mut sims: Vec<Device> =
        crate::registry::registered_devices().into_iter().filter(|d| matches!(d, Device::Sim { .. })).collect();
    sims.sort_by_key(|d| (d.to_string().rsplit_once(':').map(|(k, _)| k.to_string()), d.index()));
    list_devices(&sims)
}

/// [`devices`] with the simulated GPUs given explicitly (for `ferrite devices --device sim:…
/// --devices 0,1`): `cpu`, then `sims`, then the visible real GPUs (`gpu:N`), then the visible
/// CUDA devices (`cuda:N`; none without the NVIDIA driver, which [`crate::cuda::driver`] explains).
pub fn list_devices(sims: &[Device]) -> Result<Vec<DeviceInfo>, MemoryError> {
    let (host_total, host_free) = host_memory();
    let mut out = vec![DeviceInfo {
        device: Device::Cpu,
        physical_index: None,
        name: Device::Cpu.hardware_name(),
        capacity: host_total,
        free: host_free,
    }];
    for d in sims {
        let Device::Sim { profile, index } = d else { continue };
        let (free, total) =
            crate::registry::allocator(d).mem_get_info().unwrap_or((profile.usable_bytes(), profile.usable_bytes()));
        out.push(DeviceInfo {
            device: d.clone(),
            physical_index: Some(*index),
            name: profile.name.clone(),
            capacity: Some(total),
            free: Some(free),
        });
    }
    let physical = gpu::physical_adapter_count();
    let selection = gpu_selection(physical)?;
    for a in gpu::list_adapters() {
        let device = Device::Gpu { index: a.index };
        let phys = selection.as_ref().map_or(a.index, |s| s[a.index]);
        // Free memory needs the GPU's context; only report it for GPUs already opened.
        let free = a.capacity.map(|c| c.saturating_sub(reserved_if_open(&Device::Gpu { index: a.index })));
        out.push(DeviceInfo { device, physical_index: Some(phys), name: a.name, capacity: a.capacity, free });
    }
    // CUDA devices only where a driver shows some: no driver is not an error of the listing.
    if crate::cuda::emulator_enabled() || crate::cuda::driver().is_ok_and(|d| d.device_count > 0) {
        // Free memory needs the device's context: known only for devices already in use (a
        // listing that created a context on every GPU would take their memory, as
        // `torch.cuda.mem_get_info` on every device of a DDP rank does).
        for c in crate::cuda::cuda_devices(false)? {
            let free = c.free_bytes;
            out.push(DeviceInfo {
                device: c.device.clone(),
                physical_index: Some(c.ordinal),
                name: c.name,
                capacity: Some(c.total_bytes),
                free,
            });
        }
    }
    Ok(out)
}

/// Total and available host memory from `/proc/meminfo` (Linux), else unknown.
fn host_memory() -> (Option<u64>, Option<u64>) {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else { return (None, None) };
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// Bytes the caching allocator of `device` reserves, if that device was opened (0 otherwise;
/// listing devices never opens one).
fn reserved_if_open(device: &Device) -> u64 {
    let opened = crate::registry::registered_devices().contains(device);
    if opened { crate::registry::allocator(device).memory_reserved() } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_box_renumbers_its_cards() {
        let base = Device::parse("sim:a100-40gb").unwrap();
        let ds = select_devices(&base, Some("0,1,2,3")).unwrap();
        assert_eq!(ds.len(), 4);
        for (i, d) in ds.iter().enumerate() {
            assert_eq!(d.to_string(), format!("sim:a100-40gb:{i}"));
        }
        let ds = select_devices(&base, Some("5,9")).unwrap();
        assert_eq!(ds.iter().map(|d| d.index()).collect::<Vec<_>>(), vec![0, 1]);
        let e = select_devices(&base, Some("16")).unwrap_err().to_string();
        assert!(e.contains("0..=15"), "{e}");
        assert!(select_devices(&Device::Cpu, Some("0,1")).is_err());
    }

    #[test]
    fn simulated_devices_have_their_own_allocators() {
        let ds = select_devices(&Device::parse("sim:t4-16gb").unwrap(), Some("0,1")).unwrap();
        let listed = list_devices(&ds).unwrap();
        assert_eq!(listed[0].device, Device::Cpu);
        assert_eq!(listed[1].device, ds[0]);
        assert_eq!(listed[2].device, ds[1]);
        let a0 = crate::allocator(&ds[0]);
        let a1 = crate::allocator(&ds[1]);
        let b = a0.allocate(1 << 20).unwrap();
        assert_eq!(a0.memory_allocated(), 1 << 20);
        assert_eq!(a1.memory_allocated(), 0);
        let listed = list_devices(&ds).unwrap();
        assert!(listed[1].free.unwrap() < listed[2].free.unwrap());
        drop(b);
    }

    /// The no-GPU build: choosing `gpu` devices is the typed error naming the `gpu` feature.
    #[cfg(not(feature = "gpu"))]
    #[test]
    fn without_the_gpu_feature_gpu_devices_cannot_be_selected() {
        let e = select_devices(&Device::Gpu { index: 0 }, None).unwrap_err();
        assert!(matches!(e, MemoryError::GpuNotCompiled { .. }), "{e:?}");
    }
}
