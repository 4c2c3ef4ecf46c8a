//! NVIDIA GPUs through CUDA, as this process sees them: the driver library (or why there is none,
//! with the names looked for), each `cuda:N` with its name, compute capability and memory, and
//! NVRTC (the run-time compiler of the CUDA kernels). One gathering ([`CudaFacts::observe`]) for
//! both `ferrite doctor` (verdict lines) and `ferrite devices` (the listing), so the two never
//! disagree.

use ferrite_memory::cuda::{self, CudaDeviceInfo, CudaDriverInfo};
use ferrite_memory::format_size;

use super::check::Check;

const SECTION: &str = "devices";

/// NVRTC as loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvrtcFacts {
    pub version: (i32, i32),
    /// The file loaded by path; `None` when found on the loader's path.
    pub path: Option<String>,
}

/// What this process knows of CUDA.
#[derive(Debug, Clone)]
pub struct CudaFacts {
    /// The driver, or the typed error's text saying why there is none.
    pub driver: Result<CudaDriverInfo, String>,
    /// The visible `cuda:N` (empty when the driver is missing), or why they cannot be listed.
    pub devices: Result<Vec<CudaDeviceInfo>, String>,
    pub nvrtc: Result<NvrtcFacts, String>,
    /// `CUDA_VISIBLE_DEVICES` as set for this process.
    pub cuda_visible_devices: Option<String>,
}

impl CudaFacts {
    /// Ask the driver (creating each visible device's context, so that free memory is known) and
    /// NVRTC.
    pub fn observe() -> CudaFacts {
        let driver = cuda::driver().cloned().map_err(|p| p.for_device("cuda").to_string());
        let devices = match &driver {
            Ok(_) => cuda::cuda_devices(true).map_err(|e| e.to_string()),
            Err(_) => Ok(Vec::new()),
        };
        let nvrtc = ferrite_cuda::Nvrtc::load()
            .map(|n| NvrtcFacts { version: n.version, path: n.path.as_ref().map(|p| p.display().to_string()) })
            .map_err(|e| e.to_string());
        CudaFacts { driver, devices, nvrtc, cuda_visible_devices: std::env::var(cuda::CUDA_VISIBLE_DEVICES_ENV).ok() }
    }

    /// The `cuda` object of `--json` outputs.
    pub fn json(&self) -> serde_json::Value {
        let devices: Vec<serde_json::Value> =
            self.devices.as_ref().map(|ds| ds.iter().map(device_json).collect()).unwrap_or_default();
        serde_json::json!({
            "driver": self.driver.as_ref().ok().map(|d| serde_json::json!({
                "library": d.library,
                "cuda_version": d.version_text(),
                "version": d.version,
                "device_count": d.device_count,
            })),
            "error": self.driver.as_ref().err().or(self.devices.as_ref().err()),
            "cuda_visible_devices": self.cuda_visible_devices,
            "devices": devices,
            "nvrtc": match &self.nvrtc {
                Ok(n) => serde_json::json!({"version": format!("{}.{}", n.version.0, n.version.1), "path": n.path}),
                Err(e) => serde_json::json!({"error": e}),
            },
            "tensors": "not yet available: cuda:N has its caching allocator, CUDA kernels are not in this version",
        })
    }

    /// The human-readable section of `ferrite devices`.
    pub fn text(&self) -> String {
        let mut s = String::new();
        match &self.driver {
            Err(e) => {
                s.push_str(&format!("\nNo CUDA device: {e}\n"));
            }
            Ok(d) => {
                s.push_str(&format!(
                    "\nCUDA driver {} (CUDA {}){}\n",
                    d.library,
                    d.version_text(),
                    self.cuda_visible_devices
                        .as_ref()
                        .map(|v| format!(", CUDA_VISIBLE_DEVICES=`{v}`"))
                        .unwrap_or_default()
                ));
                match &self.devices {
                    Err(e) => s.push_str(&format!("  no CUDA device: {e}\n")),
                    Ok(ds) if ds.is_empty() => {
                        s.push_str("  the driver shows no GPU (`nvidia-smi` shows what it sees)\n")
                    }
                    Ok(ds) => {
                        for c in ds {
                            s.push_str(&format!("{}    {}\n  {}\n", c.device, c.name, device_line(c)));
                        }
                        s.push_str("  CUDA tensors run ferrite's CUDA kernels (NVRTC + cuBLAS) for every op, fused optimizer steps, losses and recurrent cells included\n");
                    }
                }
            }
        }
        s.push_str(&match &self.nvrtc {
            Ok(n) => format!(
                "NVRTC {}.{}{}\n",
                n.version.0,
                n.version.1,
                n.path.as_ref().map(|p| format!(" ({p})")).unwrap_or_default()
            ),
            Err(e) => format!("{e}\n"),
        });
        s
    }

    /// The doctor's lines.
    pub fn checks(&self) -> Vec<Check> {
        let mut out = Vec::new();
        match &self.driver {
            Err(e) if e.contains("driver library was not found") => out.push(Check::note(
                SECTION,
                "cuda",
                e.clone(),
                "nothing to do without an NVIDIA GPU; with one, install its driver so that `nvidia-smi` works",
            )),
            Err(e) => {
                out.push(Check::warning(SECTION, "cuda", e.clone(), "see the message; `nvidia-smi` checks the driver"))
            }
            Ok(d) => out.push(Check::ok(
                SECTION,
                "cuda driver",
                format!("{} (CUDA {}), {} device(s) shown", d.library, d.version_text(), d.device_count),
            )),
        }
        if self.driver.is_ok() {
            match &self.devices {
                Err(e) => out.push(Check::warning(
                    SECTION,
                    "cuda",
                    e.clone(),
                    "fix CUDA_VISIBLE_DEVICES / FERRITE_VISIBLE_DEVICES, or check the GPUs with `nvidia-smi`",
                )),
                Ok(ds) if ds.is_empty() => out.push(Check::warning(
                    SECTION,
                    "cuda",
                    "the NVIDIA driver is installed but shows no GPU",
                    "`nvidia-smi` shows what it sees; in a container, start it with the GPUs (`docker run --gpus all`)",
                )),
                Ok(ds) => {
                    for c in ds {
                        out.push(Check::ok(SECTION, c.device.to_string(), format!("{}, {}", c.name, device_line(c))));
                    }
                    out.push(Check::note(
                        SECTION,
                        "cuda tensors",
                        "CUDA tensors run ferrite's CUDA kernels (NVRTC, the driver, cuBLAS) for every op, fused optimizer steps, losses and recurrent cells included",
                        "`ferrite doctor --check-device cuda:0` checks this card against PyTorch's numbers",
                    ));
                }
            }
        }
        match &self.nvrtc {
            Ok(n) => out.push(Check::ok(
                SECTION,
                "nvrtc",
                format!(
                    "NVRTC {}.{}{}",
                    n.version.0,
                    n.version.1,
                    n.path.as_ref().map(|p| format!(" from {p}")).unwrap_or_else(|| " on the loader's path".into())
                ),
            )),
            Err(e) => out.push(Check::note(
                SECTION,
                "nvrtc",
                e.clone(),
                "needed only to compile CUDA kernels: `python3 -m pip install nvidia-cuda-nvrtc`",
            )),
        }
        out
    }
}

/// `compute capability 9.0 (sm_90), 132 SMs, 79.19 GiB total, 78.60 GiB free, expandable segments`.
fn device_line(c: &CudaDeviceInfo) -> String {
    format!(
        "compute capability {}.{} ({}), {} SMs, {} total, {} free{}",
        c.compute_capability.0,
        c.compute_capability.1,
        c.arch(),
        c.multiprocessors,
        format_size(c.total_bytes),
        c.free_bytes.map_or_else(|| "unknown".to_string(), format_size),
        if c.virtual_memory { ", expandable segments" } else { ", no virtual-memory API (no expandable segments)" }
    )
}

fn device_json(c: &CudaDeviceInfo) -> serde_json::Value {
    serde_json::json!({
        "device": c.device.to_string(),
        "ordinal": c.ordinal,
        "name": c.name,
        "uuid": c.uuid,
        "compute_capability": format!("{}.{}", c.compute_capability.0, c.compute_capability.1),
        "arch": c.arch(),
        "multiprocessors": c.multiprocessors,
        "total_bytes": c.total_bytes,
        "free_bytes": c.free_bytes,
        "virtual_memory": c.virtual_memory,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::doctor::check::Verdict;
    use ferrite_memory::Device;

    fn h100() -> CudaDeviceInfo {
        CudaDeviceInfo {
            device: Device::Cuda { index: 0 },
            ordinal: 2,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: "GPU-8e1c2a44-1111-2222-3333-444455556666".into(),
            compute_capability: (9, 0),
            multiprocessors: 132,
            total_bytes: 85_029_158_912,
            free_bytes: Some(84_000_000_000),
            virtual_memory: true,
        }
    }

    fn with_driver() -> CudaFacts {
        CudaFacts {
            driver: Ok(CudaDriverInfo { library: "libcuda.so.1".into(), version: 13000, device_count: 1 }),
            devices: Ok(vec![h100()]),
            nvrtc: Ok(NvrtcFacts { version: (13, 2), path: Some("/venv/nvidia/cu13/lib/libnvrtc.so.13".into()) }),
            cuda_visible_devices: Some("2".into()),
        }
    }

    #[test]
    fn a_device_is_listed_with_its_capability_and_memory() {
        let f = with_driver();
        let text = f.text();
        assert!(text.contains("CUDA driver libcuda.so.1 (CUDA 13.0), CUDA_VISIBLE_DEVICES=`2`"), "{text}");
        assert!(text.contains("cuda:0    NVIDIA H100 80GB HBM3"), "{text}");
        assert!(text.contains("compute capability 9.0 (sm_90), 132 SMs, 79.19 GiB total, 78.23 GiB free"), "{text}");
        assert!(text.contains("NVRTC 13.2 (/venv/nvidia/cu13/lib/libnvrtc.so.13)"), "{text}");
        let checks = f.checks();
        let dev = checks.iter().find(|c| c.name == "cuda:0").unwrap();
        assert_eq!(dev.verdict, Verdict::Ok);
        assert!(checks.iter().any(|c| c.name == "cuda tensors" && c.verdict == Verdict::Note));
        let j = f.json();
        assert_eq!(j["devices"][0]["arch"], "sm_90");
        assert_eq!(j["driver"]["cuda_version"], "13.0");
        assert_eq!(j["nvrtc"]["version"], "13.2");
    }

    #[test]
    fn a_driver_showing_nothing_is_a_warning() {
        let f = CudaFacts { devices: Ok(Vec::new()), ..with_driver() };
        let c = f.checks();
        assert!(c.iter().any(|c| c.name == "cuda" && c.verdict == Verdict::Warning), "{c:?}");
        assert!(f.text().contains("the driver shows no GPU"));
    }
}
