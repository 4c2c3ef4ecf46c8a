//! Device names: where memory lives (`cpu`, `sim:<gpu>[:index]`, `meta`, `gpu:N`, `cuda:N`).
use std::fmt;
use std::str::FromStr;

use crate::capacity::parse_capacity;
use crate::device_kind::DeviceKind;
use crate::{GpuProfile, MemoryError};

/// Where memory lives: `cpu`, `sim:<gpu-profile|capacity>[:index]`, `meta`, `gpu:<index>` or
/// `cuda:<index>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    /// A simulated GPU: host-backed memory with a real card's capacity.
    Sim {
        profile: GpuProfile,
        index: usize,
    },
    /// Shape-only execution: addresses without backing memory.
    Meta,
    /// A real GPU through wgpu (Vulkan, Metal, DX12), numbered as `ferrite devices` lists them.
    Gpu {
        index: usize,
    },
    /// An NVIDIA GPU through the CUDA driver (loaded at run time), numbered as CUDA numbers it
    /// after `CUDA_VISIBLE_DEVICES`, then renumbered by `FERRITE_VISIBLE_DEVICES`/`--devices`.
    Cuda {
        index: usize,
    },
}

impl Device {
    /// The device index (`N` of `sim:<gpu>:N`; 0 for `cpu` and `meta`).
    pub fn index(&self) -> usize {
        match self {
            Device::Sim { index, .. } | Device::Gpu { index } | Device::Cuda { index } => *index,
            _ => 0,
        }
    }

    pub fn kind(&self) -> DeviceKind {
        match self {
            Device::Cpu => DeviceKind::Cpu,
            Device::Sim { .. } => DeviceKind::Sim,
            Device::Meta => DeviceKind::Meta,
            Device::Gpu { .. } => DeviceKind::Gpu,
            Device::Cuda { .. } => DeviceKind::Cuda,
        }
    }

    /// Parse a device string such as `cpu`, `meta`, `gpu`, `gpu:1`, `sim:a100-40gb`,
    /// `sim:a100-40gb:1`, `sim:1GiB`, `cuda`, `cuda:1`. (Whether a `gpu:N` or `cuda:N` exists is
    /// checked when it is first used; in a build without the `gpu` feature a `gpu:N` is
    /// [`MemoryError::GpuNotCompiled`].)
    pub fn parse(spec: &str) -> Result<Device, MemoryError> {
        let bad = |reason: &str| MemoryError::InvalidDevice { spec: spec.to_string(), reason: reason.to_string() };
        let s = spec.trim();
        match s {
            "cpu" => return Ok(Device::Cpu),
            "meta" => return Ok(Device::Meta),
            "gpu" => return Device::gpu(0, s),
            "cuda" => return Ok(Device::Cuda { index: 0 }),
            _ => {}
        }
        if let Some(i) = s.strip_prefix("gpu:") {
            let index = i.parse::<usize>().map_err(|_| bad("GPU index must be a non-negative integer (`gpu:0`)"))?;
            return Device::gpu(index, s);
        }
        if let Some(i) = s.strip_prefix("cuda:") {
            // `usize::from_str` accepts a leading `+`; a device name is digits only.
            let index = i
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| i.parse::<usize>().ok())
                .flatten()
                .ok_or_else(|| bad("CUDA device index must be a non-negative integer (`cuda:0`)"))?;
            return Ok(Device::Cuda { index });
        }
        let Some(rest) = s.strip_prefix("sim:") else {
            return Err(bad("expected `cpu`, `meta`, `gpu[:index]`, `cuda[:index]` or `sim:<gpu>[:index]`"));
        };
        let (name, index) = match rest.rsplit_once(':') {
            Some((n, i)) => (n, i.parse::<usize>().map_err(|_| bad("device index must be a non-negative integer"))?),
            None => (rest, 0),
        };
        let profile = match GpuProfile::lookup(name) {
            Some(p) => p,
            None => {
                let bytes = parse_capacity(name).ok_or_else(|| {
                    let keys: Vec<&str> = crate::GPU_CATALOGUE.iter().map(|g| g.0).collect();
                    bad(&format!("unknown GPU `{name}`; known: {} (or a capacity such as `1GiB`)", keys.join(", ")))
                })?;
                GpuProfile::custom(bytes)
            }
        };
        Ok(Device::Sim { profile, index })
    }
}

impl Device {
    /// `gpu:<index>` when this build has GPU support, else the typed error naming the feature
    /// (and quoting `spec`, the name as the user wrote it).
    fn gpu(index: usize, spec: &str) -> Result<Device, MemoryError> {
        // `cfg!` rather than `crate::gpu::COMPILED`: device names are the leaf the GPU code builds on.
        if cfg!(feature = "gpu") {
            Ok(Device::Gpu { index })
        } else {
            Err(MemoryError::GpuNotCompiled { device: spec.to_string() })
        }
    }
}

impl FromStr for Device {
    type Err = MemoryError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Device::parse(s)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Meta => write!(f, "meta"),
            Device::Sim { profile, index } => write!(f, "sim:{}:{}", profile.key, index),
            Device::Gpu { index } => write!(f, "gpu:{index}"),
            Device::Cuda { index } => write!(f, "cuda:{index}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capacity_below_one_byte_is_refused() {
        // Fuzzing found `sim:0.90b`: a device of 0 bytes whose printed name did not parse back.
        for spec in ["sim:0.90b", "sim:0.5", "sim:0b", "sim:0.0001KiB"] {
            let e = Device::parse(spec).unwrap_err().to_string();
            assert!(e.contains(&spec[4..]), "{spec}: {e}");
        }
        let d = Device::parse("sim:1.5b").unwrap();
        assert_eq!(Device::parse(&d.to_string()).unwrap(), d);
    }

    #[test]
    fn parses_and_displays_devices() {
        assert_eq!(Device::parse("cpu").unwrap(), Device::Cpu);
        assert_eq!(Device::parse("meta").unwrap(), Device::Meta);
        let d = Device::parse("sim:a100-40gb").unwrap();
        assert_eq!(d.to_string(), "sim:a100-40gb:0");
        assert_eq!(Device::parse(&d.to_string()).unwrap(), d);
        let d = Device::parse("sim:h100-80gb:3").unwrap();
        assert_eq!(d.index(), 3);
        let d = Device::parse("sim:1GiB").unwrap();
        assert_eq!(d, Device::parse("sim:1024MiB").unwrap());
        assert_eq!(d.to_string(), "sim:1GiB:0");
        match &d {
            Device::Sim { profile, .. } => {
                assert_eq!(profile.total_bytes, 1 << 30);
                assert_eq!(profile.context_overhead_bytes, 0);
            }
            _ => unreachable!(),
        }
        assert!(Device::parse("sim:nope").is_err());
        assert!(Device::parse("sim:a100-40gb:x").is_err());
        assert!(Device::parse("gpu:x").is_err());
        assert!(Device::parse("gpu:-1").is_err());
        assert!(Device::parse("sim:0GiB").is_err());
    }

    #[cfg(feature = "gpu")]
    #[test]
    fn gpu_devices_parse_with_the_gpu_feature() {
        assert_eq!(Device::parse("gpu").unwrap(), Device::Gpu { index: 0 });
        assert_eq!(Device::parse("gpu:3").unwrap().to_string(), "gpu:3");
    }

    /// The no-GPU build: `gpu:N` is a typed error that names the feature and how to turn it on.
    #[cfg(not(feature = "gpu"))]
    #[test]
    fn a_gpu_device_without_the_gpu_feature_is_a_typed_error_naming_it() {
        for (spec, device) in [("gpu", "gpu"), ("gpu:3", "gpu:3"), (" gpu:+1 ", "gpu:+1")] {
            let e = Device::parse(spec).unwrap_err();
            assert!(matches!(&e, MemoryError::GpuNotCompiled { device: d } if d == device), "{spec}: {e:?}");
            let msg = e.to_string();
            assert!(msg.contains("`gpu` cargo feature") && msg.contains("--features gpu"), "{msg}");
        }
        // A malformed index is still a malformed device name, not a missing feature.
        assert!(matches!(Device::parse("gpu:x"), Err(MemoryError::InvalidDevice { .. })));
    }

    /// `cuda:N` parses in every build (the driver is looked for when the device is first used)
    /// and prints back as it was written.
    #[test]
    fn cuda_devices_parse_and_print_back() {
        assert_eq!(Device::parse("cuda").unwrap(), Device::Cuda { index: 0 });
        assert_eq!(Device::parse(" cuda:1 ").unwrap(), Device::Cuda { index: 1 });
        assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::Cuda { index: 1 });
        for i in [0usize, 1, 7, 15, 1000] {
            let d = Device::Cuda { index: i };
            assert_eq!(d.to_string(), format!("cuda:{i}"));
            assert_eq!(Device::parse(&d.to_string()).unwrap(), d);
            assert_eq!(d.index(), i);
            assert_eq!(d.kind(), DeviceKind::Cuda);
        }
        for bad in ["cuda:", "cuda:x", "cuda:-1", "cuda:+1", "cuda:1.0", "cuda:0:1", "cuda0", "CUDA:0"] {
            let e = Device::parse(bad).unwrap_err();
            assert!(matches!(&e, MemoryError::InvalidDevice { spec, .. } if spec == bad), "{bad}: {e:?}");
        }
        let msg = Device::parse("cuda:x").unwrap_err().to_string();
        assert!(msg.contains("`cuda:0`"), "{msg}");
        assert!(Device::parse("tpu:0").unwrap_err().to_string().contains("`cuda[:index]`"));
    }

    #[test]
    fn a_mig_slice_is_a_simulated_device() {
        let d = Device::parse("sim:a100-40gb-mig-3g.20gb").unwrap();
        assert_eq!(d.to_string(), "sim:a100-40gb-mig-3g.20gb:0");
    }
}
