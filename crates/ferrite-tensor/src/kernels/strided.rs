//! Walking N strided operands in row-major order of a common shape.
//!
//! Kernels receive whole innermost rows (base offsets + length + inner strides), so their inner
//! loops are simple and vectorise when the inner stride is 1. Dimensions that are contiguous
//! across all operands are merged first, so a contiguous tensor is a single row.

use smallvec::SmallVec;

use crate::layout::Shape;

/// Shape and per-operand strides after merging dims (outermost first).
pub(crate) struct Walk<const N: usize> {
    pub shape: Shape,
    pub strides: [Shape; N],
    pub offsets: [usize; N],
}

impl<const N: usize> Walk<N> {
    /// `strides[k]` must have `shape.len()` entries.
    pub fn new(shape: &[usize], strides: [&[usize]; N], offsets: [usize; N]) -> Walk<N> {
        let mut s: Shape = SmallVec::new();
        let mut st: [Shape; N] = std::array::from_fn(|_| SmallVec::new());
        for d in 0..shape.len() {
            if shape[d] == 1 {
                continue;
            }
            let can_merge = !s.is_empty()
                && (0..N).all(|k| {
                    let last = st[k].len() - 1;
                    st[k][last] == strides[k][d] * shape[d]
                });
            if can_merge {
                let last = s.len() - 1;
                s[last] *= shape[d];
                for k in 0..N {
                    let l = st[k].len() - 1;
                    st[k][l] = strides[k][d];
                }
            } else {
                s.push(shape[d]);
                for k in 0..N {
                    st[k].push(strides[k][d]);
                }
            }
        }
        if s.is_empty() {
            s.push(1);
            for k in st.iter_mut() {
                k.push(1);
            }
        }
        if shape.contains(&0) {
            s.clear();
            s.push(0);
            for k in st.iter_mut() {
                k.clear();
                k.push(1);
            }
        }
        Walk { shape: s, strides: st, offsets }
    }

    pub fn inner_strides(&self) -> [usize; N] {
        std::array::from_fn(|k| *self.strides[k].last().unwrap_or(&1))
    }

    /// Call `f(offsets, len, linear_index)` for each inner row segment covering linear element
    /// indices `[start, end)`.
    #[inline(always)]
    pub fn rows(&self, start: usize, end: usize, mut f: impl FnMut([usize; N], usize, usize)) {
        if start >= end {
            return;
        }
        let rank = self.shape.len();
        let inner = self.shape[rank - 1];
        // Multi-index of `start`.
        let mut idx: SmallVec<[usize; 6]> = SmallVec::from_elem(0, rank);
        let mut rem = start;
        for d in (0..rank).rev() {
            idx[d] = rem % self.shape[d];
            rem /= self.shape[d];
        }
        let mut off: [usize; N] = self.offsets;
        for k in 0..N {
            for d in 0..rank {
                off[k] += idx[d] * self.strides[k][d];
            }
        }
        let mut lin = start;
        while lin < end {
            let len = (inner - idx[rank - 1]).min(end - lin);
            f(off, len, lin);
            lin += len;
            if lin >= end {
                break;
            }
            // Advance: the inner index wraps to 0, carry into outer dims.
            for k in 0..N {
                off[k] -= idx[rank - 1] * self.strides[k][rank - 1];
            }
            idx[rank - 1] = 0;
            let mut d = rank - 1;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                for k in 0..N {
                    off[k] += self.strides[k][d];
                }
                if idx[d] < self.shape[d] {
                    break;
                }
                for k in 0..N {
                    off[k] -= idx[d] * self.strides[k][d];
                }
                idx[d] = 0;
            }
        }
    }
}

/// Elements below which kernels stay on the calling thread (thread hand-off costs more).
pub(crate) const PAR_THRESHOLD: usize = 1 << 15;

/// Split `[0, n)` into chunks for the kernel team (`kernels/team.rs`) when `n` is large enough; `f(start, end)`.
pub(crate) fn par_ranges(n: usize, cost_per_elem: usize, f: impl Fn(usize, usize) + Sync + Send) {
    let work = n.saturating_mul(cost_per_elem.max(1));
    if work < PAR_THRESHOLD {
        f(0, n);
        return;
    }
    let threads = crate::kernels::team::threads();
    if threads <= 1 {
        f(0, n);
        return;
    }
    // Chunks of at least ~4096 units of work (not 4096 items: a row kernel's item is a whole
    // row, and 4096 rows of 256 columns used to make one chunk, so softmax, norms, pooling and
    // im2col over fewer than 8192 rows or planes ran on one thread).
    let chunks = (threads * 4).min(work.div_ceil(4096)).min(n).max(1);
    let per = n.div_ceil(chunks);
    crate::kernels::team::run(chunks, &|c| {
        let start = c * per;
        let end = ((c + 1) * per).min(n);
        if start < end {
            f(start, end);
        }
    });
}

/// A raw pointer that may cross into parallel tasks (kernel team or rayon). Kernels write disjoint ranges through it.
#[derive(Copy, Clone)]
pub(crate) struct SendPtr<T>(pub *mut T);
// SAFETY: only used by kernels that give each task a disjoint output range and read inputs that
// no task writes; the pointee outlives the rayon scope that uses it.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_transposed() {
        // 2x3 transposed view of a 3x2 contiguous buffer: shape [2,3], strides [1,2]
        let w = Walk::new(&[2, 3], [&[1, 2]], [0]);
        let mut got = vec![];
        w.rows(0, 6, |o, len, _| {
            for i in 0..len {
                got.push(o[0] + i * w.inner_strides()[0]);
            }
        });
        assert_eq!(got, vec![0, 2, 4, 1, 3, 5]);
        let mut part = vec![];
        w.rows(2, 5, |o, len, lin| part.push((o[0], len, lin)));
        assert_eq!(part, vec![(4, 1, 2), (1, 2, 3)]);
    }

    #[test]
    fn merge_contiguous() {
        let w = Walk::new(&[2, 3, 4], [&[12, 4, 1], &[0, 0, 1]], [0, 0]);
        assert_eq!(w.shape.as_slice(), &[6, 4]);
        let w2 = Walk::new(&[2, 3, 4], [&[12, 4, 1], &[12, 4, 1]], [0, 0]);
        assert_eq!(w2.shape.as_slice(), &[24]);
    }
}
