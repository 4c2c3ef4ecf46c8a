//! The CUDA devices this process sees: which ordinal `cuda:N` is, what each device is (name,
//! compute capability, memory), and the one context per device that every CUDA call runs in.
//!
//! Numbering: the driver applies `CUDA_VISIBLE_DEVICES` itself (its ordinals are already the
//! visible devices, renumbered); `FERRITE_VISIBLE_DEVICES` or `--devices` then choose and renumber
//! among those, as they do for `gpu:N`. So `CUDA_VISIBLE_DEVICES=2,3 FERRITE_VISIBLE_DEVICES=1`
//! makes physical GPU 3 `cuda:0`. When nothing is visible and `CUDA_VISIBLE_DEVICES` is set, the
//! error reads that list as CUDA does ([`super::visible`]) against the GPUs the kernel module
//! reports in `/proc/driver/nvidia/gpus`, and names the entry that ended it.
//!
//! Contexts: each device's *primary* context (the one the CUDA runtime, and so PyTorch, uses),
//! retained on first use and kept for the process, like `gpu:N`'s wgpu device. Creating it takes
//! device memory (a few hundred MiB), which is why [`cuda_devices`] reports free memory only for
//! devices whose context already exists unless asked to open them.
use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys;

use super::driver::CudaDriverError;
use super::library::{self, check, driver_failed};
use super::visible::parse_cuda_visible_devices;
use crate::visible_devices::{VISIBLE_DEVICES_ENV, cuda_selection};
use crate::{Device, MemoryError};

/// The variable the CUDA driver reads to hide and renumber GPUs.
pub const CUDA_VISIBLE_DEVICES_ENV: &str = "CUDA_VISIBLE_DEVICES";

/// One CUDA device this process may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDeviceInfo {
    /// `cuda:N`, under its visible (renumbered) index.
    pub device: Device,
    /// The driver's ordinal (after `CUDA_VISIBLE_DEVICES`, before `FERRITE_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// `cuDeviceGetName` (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// `GPU-…`, as `nvidia-smi -L` prints it.
    pub uuid: String,
    /// (major, minor): `(9, 0)` for an H100.
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
    /// `cuDeviceTotalMem`.
    pub total_bytes: u64,
    /// `cuMemGetInfo`'s free bytes, when the device's context exists (see the module note).
    pub free_bytes: Option<u64>,
    /// Whether the device has the virtual-memory API (expandable segments).
    pub virtual_memory: bool,
}

impl CudaDeviceInfo {
    /// `sm_90` for compute capability 9.0: the architecture kernels are compiled for.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

/// The driver's ordinal of the visible device `cuda:index`, or why there is none: no driver, a
/// driver too old or broken, `CUDA_VISIBLE_DEVICES` hiding every GPU, an index past the last
/// visible device, a bad `FERRITE_VISIBLE_DEVICES`.
pub fn cuda_ordinal(index: usize) -> Result<usize, MemoryError> {
    let name = Device::Cuda { index }.to_string();
    if super::emulator::emulator_enabled() {
        // One emulated device, whatever the driver and the device lists say.
        return if index == 0 { Ok(0) } else { Err(missing(&name, 1)) };
    }
    let visible = visible_ordinals(&name)?;
    visible.get(index).copied().ok_or_else(|| missing(&name, visible.len()))
}

/// The driver's ordinals of `cuda:0`, `cuda:1`, … (after `FERRITE_VISIBLE_DEVICES`); `device`
/// names the device asked for in errors.
fn visible_ordinals(device: &str) -> Result<Vec<usize>, MemoryError> {
    let info = library::driver().map_err(|p| p.for_device(device))?;
    let count = info.device_count;
    if count == 0
        && let Ok(value) = std::env::var(CUDA_VISIBLE_DEVICES_ENV)
    {
        let parsed = parse_cuda_visible_devices(&value, &physical_gpu_uuids());
        let reason = parsed.why_empty(&value).unwrap_or_else(|| {
            "the driver found none of the GPUs it names (the kernel module lists them in /proc/driver/nvidia/gpus)"
                .to_string()
        });
        return Err(MemoryError::CudaNoVisibleDevice { device: device.to_string(), value, reason });
    }
    Ok(cuda_selection(count)?.unwrap_or_else(|| (0..count).collect()))
}

/// The error for `device` when only `visible` CUDA devices exist.
fn missing(device: &str, visible: usize) -> MemoryError {
    let reason = match (visible, library::driver()) {
        (0, Ok(info)) => format!(
            "the NVIDIA driver ({}, CUDA {}) is installed but reports no GPU; `nvidia-smi` shows what it sees (in a container, start it with the GPUs: `docker run --gpus all`)",
            info.library,
            info.version_text()
        ),
        (n, _) => {
            let names = if n == 1 { "cuda:0".to_string() } else { format!("cuda:0..=cuda:{}", n - 1) };
            let mut r = format!("this process sees {n} CUDA device(s) ({names}); `ferrite devices` lists them");
            for var in [CUDA_VISIBLE_DEVICES_ENV, VISIBLE_DEVICES_ENV] {
                if let Ok(v) = std::env::var(var) {
                    r.push_str(&format!(" ({var}=`{v}` applies)"));
                }
            }
            r
        }
    };
    MemoryError::CudaDeviceMissing { device: device.to_string(), visible, reason }
}

/// How many `cuda:N` this process may use (0 when the driver shows none; an error when there is
/// no usable driver).
pub fn cuda_device_count() -> Result<usize, MemoryError> {
    if super::emulator::emulator_enabled() {
        return Ok(1);
    }
    visible_ordinals("cuda").map(|v| v.len())
}

/// Every `cuda:N` this process may use, with what the driver says of it. `open_contexts`: create
/// each device's context (a few hundred MiB of its memory, kept for the process) so that free
/// memory is known; without it free memory is reported only for devices already in use.
pub fn cuda_devices(open_contexts: bool) -> Result<Vec<CudaDeviceInfo>, MemoryError> {
    if super::emulator::emulator_enabled() {
        return Ok(vec![CudaDeviceInfo {
            device: Device::Cuda { index: 0 },
            ordinal: 0,
            name: super::emulator::EMULATED_DEVICE_NAME.to_string(),
            uuid: "EMULATED-0".to_string(),
            compute_capability: (0, 0),
            multiprocessors: 0,
            total_bytes: super::emulator::EMULATED_CAPACITY,
            free_bytes: None,
            virtual_memory: false,
        }]);
    }
    let ordinals = visible_ordinals("cuda")?;
    let mut out = Vec::with_capacity(ordinals.len());
    for (index, ordinal) in ordinals.into_iter().enumerate() {
        let name = format!("cuda:{index}");
        let fail = |e: CudaDriverError| driver_failed(&name, &e);
        let dev = device_handle(ordinal).map_err(fail)?;
        let attr = |a| attribute(dev, a).map_err(fail);
        use sys::CUdevice_attribute::*;
        let compute_capability =
            (attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?, attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?);
        let multiprocessors = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let virtual_memory = attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)? != 0;
        let mut total = 0usize;
        // SAFETY: the driver is initialised (`visible_ordinals` succeeded); valid out-pointer.
        check("cuDeviceTotalMem_v2", unsafe { sys::cuDeviceTotalMem_v2(&mut total, dev) }).map_err(fail)?;
        let free_bytes = if open_contexts || context_exists(ordinal) {
            let ctx = context(ordinal).map_err(fail)?;
            Some(mem_get_info(ctx).map_err(fail)?.0)
        } else {
            None
        };
        out.push(CudaDeviceInfo {
            device: Device::Cuda { index },
            ordinal,
            name: device_name(dev).map_err(fail)?,
            uuid: device_uuid(dev).map_err(fail)?,
            compute_capability,
            multiprocessors,
            total_bytes: total as u64,
            free_bytes,
            virtual_memory,
        });
    }
    Ok(out)
}

/// `cuDeviceGet`.
pub(crate) fn device_handle(ordinal: usize) -> Result<sys::CUdevice, CudaDriverError> {
    let mut dev: sys::CUdevice = 0;
    let ord = c_int::try_from(ordinal).unwrap_or(c_int::MAX);
    // SAFETY: called only after the driver is initialised; valid out-pointer.
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ord) })?;
    Ok(dev)
}

fn attribute(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32, CudaDriverError> {
    let mut v: c_int = 0;
    // SAFETY: `dev` comes from cuDeviceGet; valid out-pointer.
    check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) })?;
    Ok(v)
}

fn device_name(dev: sys::CUdevice) -> Result<String, CudaDriverError> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: `buf` holds 256 bytes, the length passed; the driver NUL-terminates within it.
    check("cuDeviceGetName", unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, dev) })?;
    let bytes: Vec<u8> = buf.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn device_uuid(dev: sys::CUdevice) -> Result<String, CudaDriverError> {
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: `dev` comes from cuDeviceGet; valid out-pointer.
    check("cuDeviceGetUuid_v2", unsafe { sys::cuDeviceGetUuid_v2(&mut uuid, dev) })?;
    Ok(format_uuid(&uuid.bytes.map(|b| b as u8)))
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as `nvidia-smi -L` prints a UUID.
fn format_uuid(b: &[u8; 16]) -> String {
    let hex: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

/// A retained primary context, kept for the process. Stored as an address so the table is `Send`.
static CONTEXTS: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();

fn contexts() -> &'static Mutex<HashMap<usize, usize>> {
    CONTEXTS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn context_exists(ordinal: usize) -> bool {
    contexts().lock().map(|m| m.contains_key(&ordinal)).unwrap_or(false)
}

/// The primary context of the device at `ordinal`, retained on first use and current on this
/// thread when this returns.
pub fn context(ordinal: usize) -> Result<sys::CUcontext, CudaDriverError> {
    let mut table = contexts().lock().unwrap_or_else(|p| p.into_inner());
    let ctx = match table.get(&ordinal) {
        Some(c) => *c as sys::CUcontext,
        None => {
            let dev = device_handle(ordinal)?;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: `dev` is a valid device; valid out-pointer. The retained context is never
            // released: it lives for the process, as PyTorch's does.
            check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) })?;
            table.insert(ordinal, ctx as usize);
            ctx
        }
    };
    make_current(ctx)?;
    Ok(ctx)
}

/// `cuCtxSetCurrent`: CUDA calls act on the calling thread's current context.
pub(crate) fn make_current(ctx: sys::CUcontext) -> Result<(), CudaDriverError> {
    // SAFETY: `ctx` is a retained primary context, valid for the process.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
}

/// `cuMemGetInfo_v2` in `ctx`: (free, total).
pub(crate) fn mem_get_info(ctx: sys::CUcontext) -> Result<(u64, u64), CudaDriverError> {
    make_current(ctx)?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: a context is current; valid out-pointers.
    check("cuMemGetInfo_v2", unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
    Ok((free as u64, total as u64))
}

/// The UUIDs of the machine's NVIDIA GPUs as the kernel module lists them
/// (`/proc/driver/nvidia/gpus/<bus id>/information`, line `GPU UUID:`), in bus order: what
/// `CUDA_VISIBLE_DEVICES` is read against when the driver shows nothing. Empty without the module.
pub fn physical_gpu_uuids() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/driver/nvidia/gpus") else { return Vec::new() };
    let mut buses: Vec<std::path::PathBuf> = dir.flatten().map(|e| e.path()).collect();
    buses.sort();
    buses
        .iter()
        .map(|b| {
            std::fs::read_to_string(b.join("information"))
                .ok()
                .and_then(|t| t.lines().find_map(|l| l.strip_prefix("GPU UUID:").map(|u| u.trim().to_string())))
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_print_like_nvidia_smi() {
        let b = [0x8e, 0x1c, 0x2a, 0x44, 0x11, 0x11, 0x22, 0x22, 0x33, 0x33, 0x44, 0x44, 0x55, 0x55, 0x66, 0x66];
        assert_eq!(format_uuid(&b), "GPU-8e1c2a44-1111-2222-3333-444455556666");
    }

    #[test]
    fn the_device_missing_error_names_the_visible_devices() {
        let e = missing("cuda:3", 1);
        assert!(matches!(&e, MemoryError::CudaDeviceMissing { visible: 1, .. }));
        let msg = e.to_string();
        assert!(msg.starts_with("cuda:3 does not exist: this process sees 1 CUDA device(s) (cuda:0)"), "{msg}");
        let msg = missing("cuda:9", 4).to_string();
        assert!(msg.contains("4 CUDA device(s) (cuda:0..=cuda:3)"), "{msg}");
    }
}
