//! The machine's memory (`/proc/meminfo`): what the `cpu` device may use, and what is free now.

use ferrite_memory::format_size;

use super::check::Check;

const SECTION: &str = "system";

/// A `Key:   1234 kB` line of `/proc/meminfo`, in bytes.
pub fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let mut parts = rest.split_whitespace();
        let n: u64 = parts.next()?.parse().ok()?;
        let mult = match parts.next() {
            Some("kB") => 1024,
            None => 1,
            Some(_) => return None,
        };
        n.checked_mul(mult)
    })
}

/// Below this much available memory, a warning.
const LOW_AVAILABLE: u64 = 1 << 30;

pub fn checks(meminfo: Option<&str>) -> Vec<Check> {
    let Some(text) = meminfo else {
        return vec![Check::warning(
            SECTION,
            "memory",
            "/proc/meminfo is not readable",
            "the `cpu` device cannot know the machine's RAM, so only the kernel limits host allocations",
        )];
    };
    let (Some(total), available) = (meminfo_bytes(text, "MemTotal"), meminfo_bytes(text, "MemAvailable")) else {
        return vec![Check::warning(
            SECTION,
            "memory",
            "/proc/meminfo has no MemTotal line",
            "the `cpu` device cannot know the machine's RAM, so only the kernel limits host allocations",
        )];
    };
    let found = match available {
        Some(a) => format!("{} total, {} available", format_size(total), format_size(a)),
        None => format!("{} total", format_size(total)),
    };
    match available {
        Some(a) if a < LOW_AVAILABLE => vec![Check::warning(
            SECTION,
            "memory",
            found,
            "less than 1 GiB is available: close other programs, or train with smaller batches (`--batch-size`)",
        )],
        _ => vec![Check::ok(SECTION, "memory", found)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_lines() {
        let m =
            "MemTotal:       24680000 kB\nMemFree:  100 kB\nMemAvailable:     512000 kB\nHugePages_Total:       0\n";
        assert_eq!(meminfo_bytes(m, "MemTotal"), Some(24_680_000 * 1024));
        assert_eq!(meminfo_bytes(m, "HugePages_Total"), Some(0));
        assert_eq!(meminfo_bytes(m, "Mem"), None);
        let c = checks(Some(m));
        assert_eq!(c[0].verdict, super::super::check::Verdict::Warning, "{c:?}");
        assert!(checks(Some("nonsense")).iter().all(|c| c.fix.is_some()));
        assert!(checks(None)[0].found.contains("not readable"));
    }
}
