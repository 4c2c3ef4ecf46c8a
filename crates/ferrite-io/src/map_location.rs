//! Where loaded tensors go: PyTorch's `map_location`, for ferrite's devices.
//!
//! A `.pt` file remembers where each storage lived (`cpu`, `cuda:0`, `cuda:1`, …). A checkpoint
//! saved on a GPU box must load on a laptop, onto a simulated GPU for planning, or onto `meta` to
//! check shapes without reading the weights, so the target is chosen at load time: one device for
//! everything, or a remapping of saved location tags. Without an explicit choice, tensors saved on
//! the CPU come back on the CPU and tensors saved on a CUDA device are an error that names the
//! option, as in PyTorch on a machine without CUDA.

use ferrite_memory::Device;

use crate::error::{IoError, Result};

/// How saved locations map to ferrite devices.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum MapLocation {
    /// Restore where saved: `cpu` and ferrite device strings (`sim:a100-40gb:1`, `meta`) are
    /// honoured; `cuda:N` is an error (ferrite cannot hold tensors on CUDA devices yet) naming
    /// this option.
    #[default]
    Saved,
    /// Every tensor onto this device (PyTorch: `map_location="cpu"` or a `torch.device`).
    To(Device),
    /// Saved tag → device (PyTorch: `map_location={"cuda:1": "cuda:0"}`). A tag without an index
    /// (`cuda`) matches every index (`cuda:0`, `cuda:1`, …); exact tags win. Unlisted tags are
    /// restored as with [`MapLocation::Saved`].
    Remap(Vec<(String, Device)>),
}

impl MapLocation {
    /// Parses `DEVICE` (everything there) or `TAG=DEVICE[,TAG=DEVICE…]` (a remapping), e.g.
    /// `cpu`, `sim:a100-40gb:0`, `cuda:1=cpu,cuda:0=sim:h100-80gb`.
    pub fn parse(spec: &str) -> Result<MapLocation> {
        let bad = |device: &str, e: ferrite_memory::MemoryError| IoError::Device {
            device: device.to_string(),
            reason: e.to_string(),
        };
        if !spec.contains('=') {
            return Device::parse(spec).map(MapLocation::To).map_err(|e| bad(spec, e));
        }
        let mut pairs = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((tag, dev)) = part.split_once('=') else {
                return Err(IoError::Device {
                    device: part.to_string(),
                    reason: "expected TAG=DEVICE, e.g. cuda:1=cpu".into(),
                });
            };
            pairs.push((tag.trim().to_string(), Device::parse(dev.trim()).map_err(|e| bad(dev.trim(), e))?));
        }
        Ok(MapLocation::Remap(pairs))
    }

    /// The device for a tensor saved at `tag`.
    pub fn resolve(&self, tag: &str) -> Result<Device> {
        match self {
            MapLocation::To(d) => Ok(d.clone()),
            MapLocation::Saved => restore(tag),
            MapLocation::Remap(pairs) => {
                if let Some((_, d)) = pairs.iter().find(|(t, _)| t == tag) {
                    return Ok(d.clone());
                }
                let kind = tag.split(':').next().unwrap_or(tag);
                if let Some((_, d)) = pairs.iter().find(|(t, _)| !t.contains(':') && t == kind) {
                    return Ok(d.clone());
                }
                restore(tag)
            }
        }
    }
}

fn restore(tag: &str) -> Result<Device> {
    if tag.starts_with("cuda") || tag.starts_with("mps") || tag.starts_with("xpu") {
        return Err(IoError::Device {
            device: tag.to_string(),
            reason: format!(
                "the tensor was saved on `{tag}` and ferrite cannot hold tensors there (it has no such device, or no CUDA kernels yet); choose where it goes with a map location, e.g. `MapLocation::To(Device::Cpu)` or `MapLocation::parse(\"{tag}=cpu\")`"
            ),
        });
    }
    Device::parse(tag).map_err(|e| IoError::Device { device: tag.to_string(), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_locations_and_cuda_refusal() {
        assert_eq!(MapLocation::Saved.resolve("cpu").unwrap(), Device::Cpu);
        assert_eq!(MapLocation::Saved.resolve("meta").unwrap(), Device::Meta);
        let err = MapLocation::Saved.resolve("cuda:0").unwrap_err().to_string();
        assert!(err.contains("cuda:0") && err.contains("map location"), "{err}");
    }

    #[test]
    fn remapping_exact_then_by_kind() {
        let m = MapLocation::parse("cuda:1=sim:a100-40gb:1, cuda=cpu").unwrap();
        assert!(matches!(m.resolve("cuda:1").unwrap(), Device::Sim { index: 1, .. }));
        assert_eq!(m.resolve("cuda:0").unwrap(), Device::Cpu);
        assert_eq!(m.resolve("cpu").unwrap(), Device::Cpu);
        assert_eq!(MapLocation::parse("meta").unwrap().resolve("cuda:3").unwrap(), Device::Meta);
        // `cuda:0` names ferrite's CUDA device; its tensors are refused when they are created.
        assert_eq!(MapLocation::parse("cuda:0").unwrap(), MapLocation::To(Device::Cuda { index: 0 }));
        assert!(MapLocation::parse("cuda:1=").is_err());
        assert!(MapLocation::parse("x").is_err());
    }
}
