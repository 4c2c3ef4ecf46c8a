use std::fmt;
use std::str::FromStr;

use crate::{GpuProfile, MemoryError};

/// Which backend a device's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu,
    Sim,
    Meta,
}

/// Where memory lives: `cpu`, `sim:<gpu-profile|capacity>[:index]` or `meta`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    /// A simulated GPU: host-backed memory with a real card's capacity.
    Sim { profile: GpuProfile, index: usize },
    /// Shape-only execution: addresses without backing memory.
    Meta,
}

impl Device {
    pub fn kind(&self) -> DeviceKind {
        match self {
            Device::Cpu => DeviceKind::Cpu,
            Device::Sim { .. } => DeviceKind::Sim,
            Device::Meta => DeviceKind::Meta,
        }
    }

    /// Parse a device string such as `cpu`, `meta`, `sim:a100-40gb`, `sim:a100-40gb:1`, `sim:1GiB`.
    pub fn parse(spec: &str) -> Result<Device, MemoryError> {
        let bad = |reason: &str| MemoryError::InvalidDevice { spec: spec.to_string(), reason: reason.to_string() };
        let s = spec.trim();
        match s {
            "cpu" => return Ok(Device::Cpu),
            "meta" => return Ok(Device::Meta),
            _ => {}
        }
        let Some(rest) = s.strip_prefix("sim:") else {
            return Err(bad("expected `cpu`, `meta` or `sim:<gpu>[:index]`"));
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
                GpuProfile { key: name.to_string(), name: format!("simulated {name}"), total_bytes: bytes, context_overhead_bytes: 0 }
            }
        };
        Ok(Device::Sim { profile, index })
    }
}

/// Parse `1GiB`, `512MiB`, `2GB`, `1048576` into bytes.
pub(crate) fn parse_capacity(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    let v = n * mult;
    if v.is_finite() && v > 0.0 && v < 1.0e18 { Some(v as u64) } else { None }
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
        }
    }
}
