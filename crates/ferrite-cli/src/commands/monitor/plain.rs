//! The monitor's text outputs for scripts and logs: `--once` (one snapshot) and `--dmon` (one
//! line per device per interval with fixed columns, like `nvidia-smi dmon`).

use ferrite_memory::format_size;

use super::run_view::RunView;

/// `1.0e-3`-style for learning rates, `-` when unknown.
pub fn float_or_dash(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) => format!("{x:.digits$}"),
        None => "-".into(),
    }
}

/// A loss: four decimals, or three significant digits once it is below 0.01 (a loss of
/// `0.0000` says nothing).
pub fn loss_text(v: Option<f64>) -> String {
    match v {
        Some(x) if x != 0.0 && x.abs() < 0.01 => format!("{x:.2e}"),
        other => float_or_dash(other, 4),
    }
}

pub fn lr_text(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.1e}"))
}

/// The one-snapshot report of `--once`.
pub fn snapshot(url: &str, v: &RunView) -> String {
    let t = &v.train;
    let mut s = format!(
        "ferrite run at {url}: {} on {}, device {} (ferrite {})\n",
        v.info.model, v.info.dataset, v.info.device, v.info.version
    );
    s.push_str(&format!(
        "epoch {}/{}  steps {}  loss {}  lr {}  {:.0} samples/s  loader wait {:.1}%  grad scale {}  skipped steps {}\n",
        t.epoch,
        t.epochs,
        t.steps_total,
        loss_text(t.loss),
        lr_text(t.learning_rate),
        t.samples_per_second,
        100.0 * t.loader_wait_ratio,
        t.grad_scale.map_or("-".into(), |g| format!("{g}")),
        t.skipped_steps_total,
    ));
    s.push_str(&format!(
        "{:<18} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>5} {:>7}\n",
        "device", "allocated", "reserved", "peak alloc", "capacity", "largest free", "segments", "ooms", "retries"
    ));
    for d in &v.devices {
        s.push_str(&format!(
            "{:<18} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>5} {:>7}\n",
            d.device,
            format_size(d.allocated_bytes),
            format_size(d.reserved_bytes),
            format_size(d.peak_allocated_bytes),
            d.capacity_bytes.map_or("-".into(), format_size),
            format_size(d.largest_free_block_bytes),
            d.segments,
            d.ooms_total,
            d.alloc_retries_total,
        ));
    }
    s
}

/// The `--dmon` header (two comment lines, as `nvidia-smi dmon` prints).
pub fn dmon_header() -> String {
    format!(
        "# {:<8} {:<18} {:>6} {:>9} {:>9} {:>10} {:>6} {:>10} {:>10} {:>10} {:>10} {:>5}\n# {:<8} {:<18} {:>6} {:>9} {:>9} {:>10} {:>6} {:>10} {:>10} {:>10} {:>10} {:>5}\n",
        "time",
        "device",
        "epoch",
        "step",
        "loss",
        "samples",
        "wait",
        "alloc",
        "resv",
        "peak",
        "capacity",
        "ooms",
        "UTC",
        "",
        "",
        "",
        "",
        "/s",
        "%",
        "MiB",
        "MiB",
        "MiB",
        "MiB",
        "",
    )
}

fn mib(b: u64) -> String {
    format!("{:.2}", b as f64 / (1u64 << 20) as f64)
}

/// One `--dmon` line per device.
pub fn dmon_lines(clock: &str, v: &RunView) -> String {
    let t = &v.train;
    let mut s = String::new();
    for d in &v.devices {
        s.push_str(&format!(
            "  {:<8} {:<18} {:>6} {:>9} {:>9} {:>10.0} {:>6.1} {:>10} {:>10} {:>10} {:>10} {:>5}\n",
            clock,
            d.device,
            t.epoch,
            t.steps_total,
            loss_text(t.loss),
            t.samples_per_second,
            100.0 * t.loader_wait_ratio,
            mib(d.allocated_bytes),
            mib(d.reserved_bytes),
            mib(d.peak_allocated_bytes),
            d.capacity_bytes.map_or("-".into(), mib),
            d.ooms_total,
        ));
    }
    s
}

/// Wall-clock time `HH:MM:SS` in UTC (what containers and CI logs use).
pub fn clock() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let day = secs % 86_400;
    format!("{:02}:{:02}:{:02}", day / 3600, (day / 60) % 60, day % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_train::observe::RunInfo;
    use ferrite_train::observe::run_figures::{DeviceFigures, TrainFigures};

    fn view() -> RunView {
        RunView {
            info: RunInfo {
                version: "0.1.0".into(),
                model: "mlp 64-10".into(),
                dataset: "digits".into(),
                device: "cpu".into(),
            },
            train: TrainFigures {
                steps_total: 69,
                skipped_steps_total: 0,
                samples_total: 4416,
                epoch: 3,
                epochs: 20,
                loss: Some(0.41234),
                learning_rate: Some(1e-3),
                samples_per_second: 12345.4,
                loader_wait_ratio: 0.032,
                grad_scale: None,
                batches_total: 69,
                batch_seconds_total: 0.5,
                loader_wait_seconds_total: 0.01,
            },
            devices: vec![DeviceFigures {
                device: "cpu".into(),
                allocated_bytes: 315_392,
                reserved_bytes: 2 << 20,
                peak_allocated_bytes: 538_112,
                peak_reserved_bytes: 2 << 20,
                capacity_bytes: None,
                reserved_unallocated_bytes: (2 << 20) - 315_392,
                largest_free_block_bytes: 1 << 20,
                segments: 1,
                allocations_total: 10,
                frees_total: 5,
                ooms_total: 0,
                alloc_retries_total: 0,
            }],
        }
    }

    #[test]
    fn dmon_columns_line_up_with_the_header() {
        let header = dmon_header();
        let line = dmon_lines("12:00:01", &view());
        let widths: Vec<usize> = header.lines().map(str::len).chain(line.lines().map(str::len)).collect();
        assert!(widths.iter().all(|w| *w == widths[0]), "{header}{line}");
        assert!(line.contains(" 0.4123 ") && line.contains(" 12345 ") && line.contains(" 3.2 "), "{line}");
        assert!(line.contains(" 2.00 ") && line.contains(" - "), "{line}");
    }

    #[test]
    fn snapshot_names_the_run_and_each_device() {
        let s = snapshot("http://127.0.0.1:9400/metrics", &view());
        assert!(s.starts_with("ferrite run at http://127.0.0.1:9400/metrics: mlp 64-10 on digits, device cpu"), "{s}");
        assert!(s.contains("epoch 3/20") && s.contains("loss 0.4123") && s.contains("lr 1.0e-3"), "{s}");
        assert!(s.contains("308.00 KiB") && s.contains("2.00 MiB"), "{s}");
    }

    #[test]
    fn small_losses_keep_their_digits() {
        assert_eq!(loss_text(Some(0.41234)), "0.4123");
        assert_eq!(loss_text(Some(0.000123)), "1.23e-4");
        assert_eq!(loss_text(Some(0.0)), "0.0000");
        assert_eq!(loss_text(None), "-");
    }

    #[test]
    fn clock_is_hh_mm_ss() {
        let c = clock();
        assert_eq!(c.len(), 8, "{c}");
        assert_eq!(&c[2..3], ":");
    }
}
