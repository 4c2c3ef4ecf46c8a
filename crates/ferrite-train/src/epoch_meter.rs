//! One epoch as the user sees it: the progress bar (only on a terminal), the mean loss, the
//! allocator's figures of the training pass (`MemoryScope`) and the clock.
use std::io::IsTerminal;
use std::time::Instant;

use ferrite_memory::{MemoryScope, ScopeReport, format_size};
use ferrite_tensor::Device;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One epoch's progress bar, loss average, memory scope and clock.
pub struct EpochMeter {
    start: Instant,
    scope: MemoryScope,
    bar: ProgressBar,
    loss_sum: f64,
    batches: usize,
    pass_peak: u64,
}

impl EpochMeter {
    /// Starts measuring epoch `epoch` (0-based) of `epochs`, `len` batches long.
    /// The bar shows when `progress` is set and stderr is a terminal.
    pub fn start(progress: bool, device: &Device, len: usize, epoch: usize, epochs: usize) -> EpochMeter {
        let show = progress && std::io::stderr().is_terminal();
        EpochMeter {
            start: Instant::now(),
            scope: MemoryScope::new(format!("epoch {}", epoch + 1), device).quiet(),
            bar: progress_bar(show, len as u64, epoch + 1, epochs),
            loss_sum: 0.0,
            batches: 0,
            pass_peak: 0,
        }
    }

    /// Records a batch: the peak of its forward+backward `pass` and its loss.
    pub fn batch(&mut self, pass: MemoryScope, loss: f64) {
        self.pass_peak = self.pass_peak.max(pass.finish().peak_allocated);
        self.loss_sum += loss;
        self.batches += 1;
        self.bar.inc(1);
        self.bar.set_message(format!("loss {loss:.4}"));
    }

    /// Ends the epoch's training pass: (mean loss, the memory line, when the epoch started). The memory
    /// figures are the training pass's; call before evaluation.
    pub fn finish(self) -> (f64, String, Instant) {
        self.bar.finish_and_clear();
        let mem = self.scope.finish();
        (self.loss_sum / self.batches.max(1) as f64, memory_line(&mem, self.pass_peak), self.start)
    }
}

/// `memory: allocated …, reserved …, peak … (forward+backward …)` for an epoch's scope.
fn memory_line(mem: &ScopeReport, pass_peak: u64) -> String {
    format!(
        "memory: allocated {}, reserved {}, peak {} (forward+backward {})",
        format_size(mem.allocated_after),
        format_size(mem.reserved_after),
        format_size(mem.peak_allocated),
        format_size(pass_peak),
    )
}

/// `12.3 ms` below a second, `1.23 s` above.
pub fn seconds(s: f64) -> String {
    if s < 1.0 { format!("{:.1} ms", s * 1e3) } else { format!("{s:.2} s") }
}

fn progress_bar(show: bool, len: u64, epoch: usize, epochs: usize) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(format!("epoch {epoch}/{epochs}"));
    bar
}
