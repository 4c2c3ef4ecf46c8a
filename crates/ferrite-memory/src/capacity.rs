//! Capacities as people write them (`1GiB`, `512MiB`, `2GB`, a number of bytes): parsing and the
//! canonical spelling. A leaf on plain numbers, so that device names (`sim:1GiB`), the GPU
//! catalogue (a custom card's key) and `FERRITE_GPU_MEMORY` share it without importing each
//! other (with it in `device.rs`, the device and the catalogue imported each other).

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
    // At least one whole byte: `0.9b` would be a device of capacity 0 (found by fuzzing).
    if (1.0..1.0e18).contains(&v) { Some(v as u64) } else { None }
}

/// Canonical spelling of a capacity: the largest binary unit that divides it exactly.
pub(crate) fn format_capacity(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}
