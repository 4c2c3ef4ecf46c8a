//! The recent past of a run, kept by the monitor between scrapes for its sparklines.

use std::collections::VecDeque;

use super::run_view::RunView;

/// Scrapes remembered (ten minutes at one per second; more than any terminal is wide).
const KEEP: usize = 600;

/// Series of the figures the dashboard draws over time.
#[derive(Debug, Default)]
pub struct History {
    /// The training device's allocated and reserved bytes.
    pub allocated: VecDeque<u64>,
    pub reserved: VecDeque<u64>,
    pub loss: VecDeque<f64>,
    pub samples_per_second: VecDeque<f64>,
    pub loader_wait_ratio: VecDeque<f64>,
}

fn push<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() == KEEP {
        q.pop_front();
    }
    q.push_back(v);
}

impl History {
    pub fn record(&mut self, v: &RunView) {
        let d = v.main_device();
        push(&mut self.allocated, d.allocated_bytes);
        push(&mut self.reserved, d.reserved_bytes);
        if let Some(l) = v.train.loss {
            push(&mut self.loss, l);
        }
        push(&mut self.samples_per_second, v.train.samples_per_second);
        push(&mut self.loader_wait_ratio, v.train.loader_wait_ratio);
    }

    pub fn len(&self) -> usize {
        self.allocated.len()
    }
}

/// Integer heights of a sparkline: the last `n` values of `q` as thousandths of their largest
/// (so a loss falling from 2.3 to 0.001 stays visible); non-finite and negative values are 0.
pub fn tail_scaled(q: &VecDeque<f64>, n: usize) -> Vec<u64> {
    let shown: Vec<f64> =
        q.iter().skip(q.len().saturating_sub(n)).map(|v| if v.is_finite() { v.max(0.0) } else { 0.0 }).collect();
    let max = shown.iter().copied().fold(0.0, f64::max);
    if max <= 0.0 {
        return vec![0; shown.len()];
    }
    shown.iter().map(|v| (v / max * 1000.0).round() as u64).collect()
}

/// The last `n` values of `q`.
pub fn tail(q: &VecDeque<u64>, n: usize) -> Vec<u64> {
    q.iter().skip(q.len().saturating_sub(n)).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recent_values() {
        let mut q = VecDeque::new();
        for i in 0..(KEEP as u64 + 5) {
            push(&mut q, i);
        }
        assert_eq!(q.len(), KEEP);
        assert_eq!(tail(&q, 3), [KEEP as u64 + 2, KEEP as u64 + 3, KEEP as u64 + 4]);
        let f: VecDeque<f64> = [0.5, f64::NAN, -1.0, 2.0].into_iter().collect();
        assert_eq!(tail_scaled(&f, 10), [250, 0, 0, 1000]);
        assert_eq!(tail_scaled(&f, 1), [1000]);
        assert_eq!(tail_scaled(&[0.0, f64::NAN].into_iter().collect(), 5), [0, 0]);
    }
}
