//! The NVIDIA driver library (libcuda), found and checked once per process.
//!
//! Why ferrite checks before cudarc calls: cudarc's dynamically loaded bindings panic when the
//! library or one of its entry points is missing. ferrite promises a typed error instead, so it
//! opens the library itself first, under the same names in the same order as cudarc (whose
//! loader then opens the same file), checks the driver's CUDA version and every entry point it
//! will call, and only then initialises the driver. Each failure is a [`DriverProblem`] that
//! becomes the typed [`MemoryError`] of the device asked for: no library (with every name tried),
//! a driver too old, an initialisation failure with its `CUresult`.
use std::ffi::CStr;
use std::sync::OnceLock;

use cudarc::driver::sys;

use super::driver::CudaDriverError;
use crate::MemoryError;

/// The oldest driver ferrite uses: CUDA 12.0 (NVIDIA driver 525). The memory side needs the
/// virtual-memory API (CUDA 10.2); 12.0 is the oldest CUDA that PyTorch's current wheels and
/// the kernels' run-time compilation are built against.
pub const MIN_DRIVER_VERSION: i32 = 12000;

/// Every driver entry point ferrite calls: a driver lacking one is refused as too old, before
/// cudarc would panic on it.
pub(crate) const REQUIRED_ENTRY_POINTS: &[&str] = &[
    "cuDriverGetVersion",
    "cuInit",
    "cuGetErrorName",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceGetUuid_v2",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuStreamCreate",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
];

/// The loaded driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDriverInfo {
    /// The library name that loaded (`libcuda.so.1`).
    pub library: String,
    /// `cuDriverGetVersion`: 1000 × major + 10 × minor (12040 is CUDA 12.4).
    pub version: i32,
    /// `cuDeviceGetCount`: the GPUs the driver shows this process (after `CUDA_VISIBLE_DEVICES`).
    pub device_count: usize,
}

impl CudaDriverInfo {
    /// The CUDA version the driver supports, as `nvidia-smi` prints it (`12.4`).
    pub fn version_text(&self) -> String {
        cuda_version_text(self.version)
    }
}

/// `12040` → `12.4`.
pub fn cuda_version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// Why the CUDA driver cannot be used (whatever device was asked for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverProblem {
    /// No library under any of these names could be opened.
    NotFound { tried: Vec<String> },
    /// The driver's CUDA version is below [`MIN_DRIVER_VERSION`], or it lacks an entry point.
    TooOld { library: String, version: Option<i32>, missing: Option<String> },
    /// A call that sets the driver up failed.
    Failed { error: CudaDriverError },
}

/// The first few names of `tried` and how many more (cudarc knows two dozen spellings of
/// libcuda; the message names the ones that matter).
fn brief(tried: &[String]) -> String {
    const SHOWN: usize = 3;
    if tried.len() <= SHOWN + 1 {
        return tried.join(", ");
    }
    // The names a Linux driver installs first, then the list's own order.
    let mut shown: Vec<&String> =
        ["libcuda.so.1", "libcuda.so"].iter().filter_map(|n| tried.iter().find(|t| t == n)).collect();
    for t in tried {
        if shown.len() >= SHOWN {
            break;
        }
        if !shown.contains(&t) {
            shown.push(t);
        }
    }
    let names: Vec<&str> = shown.iter().map(|s| s.as_str()).collect();
    format!("{} and {} other names", names.join(", "), tried.len() - shown.len())
}

impl DriverProblem {
    /// The typed error for `device` (`cuda:0`, or `cuda` for a listing).
    pub fn for_device(&self, device: &str) -> MemoryError {
        let device = device.to_string();
        match self {
            DriverProblem::NotFound { tried } => MemoryError::CudaDriverNotFound { device, tried: brief(tried) },
            DriverProblem::TooOld { library, version, missing } => {
                let mut found = match version {
                    Some(v) => format!("the NVIDIA driver ({library}) supports CUDA {}", cuda_version_text(*v)),
                    None => format!("the NVIDIA driver ({library}) is of unknown version"),
                };
                if let Some(m) = missing {
                    found.push_str(&format!(" and lacks the entry point {m}"));
                }
                MemoryError::CudaDriverTooOld { device, found, required: cuda_version_text(MIN_DRIVER_VERSION) }
            }
            DriverProblem::Failed { error } => driver_failed(&device, error),
        }
    }
}

/// The typed error for a failed driver call on `device`, with advice for the codes users meet.
pub(crate) fn driver_failed(device: &str, e: &CudaDriverError) -> MemoryError {
    let advice = match e.code {
        // CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INVALID_DEVICE
        100 | 101 => {
            "`nvidia-smi` lists the GPUs the driver sees; in a container, start it with the GPUs (`docker run --gpus all`)"
        }
        // CUDA_ERROR_INSUFFICIENT_DRIVER, CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE
        35 | 804 => "update the NVIDIA driver",
        // CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
        803 => {
            "the driver library and the kernel module differ in version (typical after a driver update): reboot, or reinstall the driver"
        }
        // CUDA_ERROR_OUT_OF_MEMORY while creating the context
        2 => "the GPU has no memory left for a CUDA context: `nvidia-smi` shows which processes hold it",
        // CUDA_ERROR_DEVICES_UNAVAILABLE (exclusive compute mode), CUDA_ERROR_OPERATING_SYSTEM
        46 => "the GPU is in exclusive-process mode and another process holds it (`nvidia-smi -q -d COMPUTE`)",
        _ => {
            "`nvidia-smi` shows whether the driver and the GPU are healthy; if it fails too, reinstall the driver or reboot"
        }
    };
    MemoryError::CudaDriverFailed { device: device.to_string(), error: Box::new(e.clone()), advice }
}

static DRIVER: OnceLock<Result<CudaDriverInfo, DriverProblem>> = OnceLock::new();

/// The CUDA driver, loaded and initialised on the first call.
pub fn driver() -> Result<&'static CudaDriverInfo, DriverProblem> {
    DRIVER.get_or_init(|| load_from(&library_candidates())).as_ref().map_err(Clone::clone)
}

/// The library names tried, in cudarc's order (so that cudarc opens the same file).
pub fn library_candidates() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in ["cuda", "nvcuda"] {
        for c in cudarc::get_lib_name_candidates(name) {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// Open the first of `candidates` that loads, check it and initialise the driver.
pub(crate) fn load_from(candidates: &[String]) -> Result<CudaDriverInfo, DriverProblem> {
    let opened = candidates.iter().find_map(|name| {
        // SAFETY: opening a shared library runs its initialisers; libcuda's have no
        // preconditions. Nothing from a library is called before the version check below.
        unsafe { libloading::Library::new(name) }.ok().map(|lib| (name.clone(), lib))
    });
    let Some((library, lib)) = opened else {
        return Err(DriverProblem::NotFound { tried: candidates.to_vec() });
    };
    // Every entry point ferrite calls must be there: cudarc panics on a missing one.
    let missing = REQUIRED_ENTRY_POINTS.iter().find(|name| {
        // SAFETY: only the symbol's address is looked up; nothing is called through it.
        unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err()
    });
    // The handle stays open for the process: cudarc's loader opens the same file by the same name.
    std::mem::forget(lib);
    let has_version = !matches!(missing, Some(&"cuDriverGetVersion"));
    let version = if has_version {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: the library is loaded and exports cuDriverGetVersion (checked above); `v` is a
        // valid out-pointer. cuDriverGetVersion needs no cuInit.
        check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut v) })
            .map_err(|error| DriverProblem::Failed { error })?;
        Some(v)
    } else {
        None
    };
    if let Some(m) = missing {
        return Err(DriverProblem::TooOld { library, version, missing: Some((*m).to_string()) });
    }
    let version = version.unwrap_or_default();
    if version < MIN_DRIVER_VERSION {
        return Err(DriverProblem::TooOld { library, version: Some(version), missing: None });
    }
    // SAFETY: cuInit with flags 0 is the documented first call; the library is loaded.
    let init = unsafe { sys::cuInit(0) };
    let device_count = match init {
        // No device (none installed, or CUDA_VISIBLE_DEVICES hides every one): a working driver
        // that shows no GPU; asking for `cuda:N` then says why.
        sys::CUresult::CUDA_ERROR_NO_DEVICE => 0,
        r => {
            check("cuInit", r).map_err(|error| DriverProblem::Failed { error })?;
            let mut n: std::ffi::c_int = 0;
            // SAFETY: the driver is initialised; `n` is a valid out-pointer.
            check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })
                .map_err(|error| DriverProblem::Failed { error })?;
            usize::try_from(n).unwrap_or(0)
        }
    };
    Ok(CudaDriverInfo { library, version, device_count })
}

/// `Ok` for `CUDA_SUCCESS`, else the error with the code's name (`cuGetErrorName`).
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<(), CudaDriverError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: this is only reached after a driver call returned, so the library is loaded and
    // checked to export cuGetErrorName; `name` is a valid out-pointer that the driver sets to a
    // static string (or leaves null for an unknown code).
    let named = unsafe { sys::cuGetErrorName(r, &mut name) } == sys::CUresult::CUDA_SUCCESS && !name.is_null();
    let name = if named {
        // SAFETY: the driver returned a NUL-terminated static string.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    } else {
        format!("{r:?}")
    };
    Err(CudaDriverError { code: r as i32, name, call })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names_are_cudarcs_without_repeats() {
        let names = library_candidates();
        assert!(names.iter().any(|n| n == "libcuda.so.1" || n == "nvcuda.dll"), "{names:?}");
        let mut dedup = names.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), names.len());
    }

    /// A driver that is not there: the error lists every name tried, in order (really opened,
    /// not simulated: the files do not exist).
    #[test]
    fn a_long_list_of_names_is_said_briefly_with_the_usual_ones_first() {
        let tried: Vec<String> =
            ["libcuda.so", "libcuda64.so", "libcuda64_13.so", "libcuda.so.12", "libcuda.so.1", "libnvcuda.so"]
                .map(String::from)
                .to_vec();
        assert_eq!(brief(&tried), "libcuda.so.1, libcuda.so, libcuda64.so and 3 other names");
        assert_eq!(brief(&tried[..3]), "libcuda.so, libcuda64.so, libcuda64_13.so");
    }

    #[test]
    fn a_missing_library_lists_every_name_tried() {
        let tried = vec!["/nonexistent/libcuda.so.1".to_string(), "libcuda-ferrite-test.so.9".to_string()];
        let problem = load_from(&tried).unwrap_err();
        assert_eq!(problem, DriverProblem::NotFound { tried: tried.clone() });
        let e = problem.for_device("cuda:0");
        assert!(matches!(&e, MemoryError::CudaDriverNotFound { device, .. } if device == "cuda:0"), "{e:?}");
        let msg = e.to_string();
        assert!(msg.starts_with("cuda:0 is not available: the NVIDIA CUDA driver library was not found"), "{msg}");
        assert!(msg.contains("tried /nonexistent/libcuda.so.1, libcuda-ferrite-test.so.9"), "{msg}");
        assert!(msg.contains("LD_LIBRARY_PATH") && msg.contains("`gpu:N`") && msg.contains("`cpu`"), "{msg}");
    }

    /// A library that loads but is not a CUDA driver (the C library here) lacks the entry points:
    /// an old-driver error naming the first one missing, never a panic inside cudarc.
    #[test]
    fn a_library_without_the_entry_points_is_refused_as_too_old() {
        let problem = load_from(&["libc.so.6".to_string()]).unwrap_err();
        assert_eq!(
            problem,
            DriverProblem::TooOld {
                library: "libc.so.6".into(),
                version: None,
                missing: Some("cuDriverGetVersion".into())
            }
        );
        let msg = problem.for_device("cuda:1").to_string();
        assert!(
            msg.starts_with("cuda:1 is not available: the NVIDIA driver (libc.so.6) is of unknown version"),
            "{msg}"
        );
        assert!(
            msg.contains("lacks the entry point cuDriverGetVersion") && msg.contains("CUDA 12.0 or newer"),
            "{msg}"
        );
    }

    #[test]
    fn an_old_driver_names_its_cuda_version_and_the_required_one() {
        let p = DriverProblem::TooOld { library: "libcuda.so.1".into(), version: Some(11040), missing: None };
        let msg = p.for_device("cuda:0").to_string();
        assert!(msg.contains("supports CUDA 11.4, and ferrite needs a driver for CUDA 12.0 or newer"), "{msg}");
        assert_eq!(cuda_version_text(13000), "13.0");
        assert_eq!(cuda_version_text(12090), "12.9");
    }

    #[test]
    fn a_failed_call_names_the_call_the_code_and_what_to_do() {
        let e = CudaDriverError { code: 803, name: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH".into(), call: "cuInit" };
        let msg = DriverProblem::Failed { error: e }.for_device("cuda:0").to_string();
        assert!(
            msg.contains("cuInit failed with CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803)") && msg.contains("reboot"),
            "{msg}"
        );
    }
}
