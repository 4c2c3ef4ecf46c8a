//! The familiar `torch.cuda.memory_summary()` table, rendered from [`MemoryStats`].
//!
//! Same rows, columns, units and widths as PyTorch's, so a user can read it at a glance; only the
//! title names the ferrite device.
use crate::stats::{MemoryStats, Stat, StatArray, StatType};

const WIDTH: usize = 75;

fn format_size(sz: i64, pref: i64) -> String {
    const PREFIXES: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut sz = sz;
    let mut pref = pref as f64;
    let mut prefix = PREFIXES[0];
    for p in &PREFIXES[1..] {
        if pref < 768.0 * 1024.0 {
            break;
        }
        prefix = p;
        sz = sz.div_euclid(1024);
        pref /= 1024.0;
    }
    format!("{sz:6} {prefix}")
}

fn format_count(cnt: i64, pref: i64) -> String {
    const PREFIXES: [&str; 3] = [" ", "K", "M"];
    let mut cnt = cnt;
    let mut pref = pref as f64;
    let mut prefix = PREFIXES[0];
    for p in &PREFIXES[1..] {
        if pref < 750.0 * 1000.0 {
            break;
        }
        prefix = p;
        cnt = cnt.div_euclid(1000);
        pref /= 1000.0;
    }
    format!("{cnt:7} {prefix} ")
}

type Formatter = fn(i64, i64) -> String;

fn row(name: &str, s: &Stat, pref: &Stat, fmt: Formatter) -> String {
    format!(
        " {name:<21} | {} | {} | {} | {} ",
        fmt(s.current, pref.current),
        fmt(s.peak, pref.peak),
        fmt(s.allocated, pref.allocated),
        fmt(s.freed, pref.freed)
    )
}

/// Render the summary table for `device` (a label such as `sim:a100-40gb:0`).
pub fn memory_summary(stats: &MemoryStats, device: &str, abbreviated: bool) -> String {
    let metrics: [(&StatArray, &str, Formatter); 9] = [
        (&stats.allocated_bytes, "Allocated memory", format_size),
        (&stats.active_bytes, "Active memory", format_size),
        (&stats.requested_bytes, "Requested memory", format_size),
        (&stats.reserved_bytes, "GPU reserved memory", format_size),
        (&stats.inactive_split_bytes, "Non-releasable memory", format_size),
        (&stats.allocation, "Allocations", format_count),
        (&stats.active, "Active allocs", format_count),
        (&stats.segment, "GPU reserved segments", format_count),
        (&stats.inactive_split, "Non-releasable allocs", format_count),
    ];
    let mut lines: Vec<String> = Vec::new();
    lines.push("=".repeat(WIDTH));
    let title = format!("ferrite memory summary, device {device}");
    lines.push(format!("{:^WIDTH$}", title));
    lines.push("-".repeat(WIDTH));
    let counters = format!(
        "  {:9} OOMs: {:<12} | {:6} segment alloc retries: {:<8}",
        "", stats.num_ooms, "", stats.num_alloc_retries
    );
    lines.push(format!("{counters:<WIDTH$}"));
    lines.push("=".repeat(WIDTH));
    lines.push("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string());
    for (arr, name, fmt) in metrics {
        lines.push("-".repeat(WIDTH));
        let all = arr.get(StatType::All);
        lines.push(row(name, all, all, fmt));
        if !abbreviated {
            lines.push(row("      from large pool", arr.get(StatType::LargePool), all, fmt));
            lines.push(row("      from small pool", arr.get(StatType::SmallPool), all, fmt));
        }
    }
    for (s, name) in
        [(&stats.oversize_allocations, "Oversize allocations"), (&stats.oversize_segments, "Oversize GPU segments")]
    {
        lines.push("-".repeat(WIDTH));
        lines.push(row(name, s, s, format_count));
    }
    lines.push("=".repeat(WIDTH));
    let mut out = String::new();
    for l in lines {
        out.push('|');
        out.push_str(&l);
        out.push_str("|\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_pytorch() {
        assert_eq!(format_size(512, 512), "   512 B  ");
        assert_eq!(format_size(2 << 20, 2 << 20), "  2048 KiB");
        assert_eq!(format_size(20 << 20, 20 << 20), " 20480 KiB");
        assert_eq!(format_size(1 << 30, 1 << 30), "  1024 MiB");
        assert_eq!(format_count(3, 3), "      3   ");
        assert_eq!(format_count(2_000_000, 2_000_000), "   2000 K ");
    }

    #[test]
    fn every_line_has_the_same_width() {
        let mut s = MemoryStats::new(u64::MAX);
        s.allocated_bytes.increase(true, 1 << 20);
        let table = memory_summary(&s, "sim:a100-40gb:0", false);
        for l in table.lines() {
            assert_eq!(l.chars().count(), WIDTH + 2, "{l:?}");
        }
        assert!(table.contains("Allocated memory"));
        assert!(table.contains("from small pool"));
        assert!(!memory_summary(&s, "cpu", true).contains("from small pool"));
    }
}
