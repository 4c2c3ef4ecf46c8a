//! The per-device memory report: what every replica's device holds and held at its peak, so a
//! user sees at a glance whether the devices are balanced.
use std::fmt;

use ferrite_memory::{Device, format_size};

/// One device's allocator statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMemory {
    pub device: Device,
    pub allocated: u64,
    pub peak_allocated: u64,
    pub reserved: u64,
    pub peak_reserved: u64,
    /// The allocator's capacity, when the device has one.
    pub capacity: Option<u64>,
}

/// Memory of every device of a data-parallel model, primary first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryReport {
    pub devices: Vec<DeviceMemory>,
}

impl MemoryReport {
    /// Read every device's allocator now.
    pub fn of(devices: &[Device]) -> MemoryReport {
        let devices = devices
            .iter()
            .map(|d| {
                let a = ferrite_memory::allocator(d);
                DeviceMemory {
                    device: d.clone(),
                    allocated: a.memory_allocated(),
                    peak_allocated: a.max_memory_allocated(),
                    reserved: a.memory_reserved(),
                    peak_reserved: a.max_memory_reserved(),
                    capacity: a.mem_get_info().map(|(_, total)| total),
                }
            })
            .collect();
        MemoryReport { devices }
    }

    /// The spread of the peak allocated bytes: `(max - min) / max` (0 for balanced devices).
    pub fn peak_imbalance(&self) -> f64 {
        let peaks = self.devices.iter().map(|d| d.peak_allocated);
        let (max, min) = (peaks.clone().max().unwrap_or(0), peaks.min().unwrap_or(0));
        if max == 0 { 0.0 } else { (max - min) as f64 / max as f64 }
    }

    /// `peak per device 445.00 KiB / 439.00 KiB (spread 1.3 %)`: every device's peak allocated
    /// bytes, primary first, and their [spread](Self::peak_imbalance) — the per-epoch figure of
    /// a data-parallel run.
    pub fn peaks_line(&self) -> String {
        let peaks: Vec<String> = self.devices.iter().map(|d| format_size(d.peak_allocated)).collect();
        format!("peak per device {} (spread {:.1} %)", peaks.join(" / "), 100.0 * self.peak_imbalance())
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<20} {:>12} {:>12} {:>12} {:>12}",
            "device", "allocated", "peak alloc", "reserved", "peak resv"
        )?;
        for d in &self.devices {
            writeln!(
                f,
                "{:<20} {:>12} {:>12} {:>12} {:>12}",
                d.device.to_string(),
                format_size(d.allocated),
                format_size(d.peak_allocated),
                format_size(d.reserved),
                format_size(d.peak_reserved)
            )?;
        }
        write!(f, "peak spread across devices: {:.1} %", 100.0 * self.peak_imbalance())
    }
}
