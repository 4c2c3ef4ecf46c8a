//! One row times a matrix (`m = 1`): a token's step in generation with a key/value cache, where
//! every linear layer multiplies a single row by its weight.
//!
//! Why apart from the GEMM: the packed path copies B into panels before multiplying, which for
//! one row of A means reading and writing the whole weight matrix to use each element once; the
//! product is bound by memory bandwidth, so that copy roughly halves its speed. Here B is read
//! once, in place:
//! - B's columns contiguous (`x @ W.T` with `W [n, k]` row-major, a `Linear`): one dot product
//!   per output, over a contiguous row of `W`;
//! - B's rows contiguous (`x @ W`, GPT-2's `Conv1D`): the output accumulates `a[k]·B[k, :]`
//!   row by row.
//!
//! Outputs are split over threads in contiguous ranges, and every output is computed by one
//! thread in a fixed order, so the result does not depend on the thread count (the library's
//! determinism rule). The loops keep 16 independent accumulators so the compiler vectorises them;
//! they are compiled inside AVX2 (+FMA off) functions where the CPU has AVX2.
use super::micro_kernel::MatPtr;
use crate::kernels::strided::SendPtr;
use crate::kernels::team::split;

/// Below this many multiply-adds the product stays on the calling thread.
const PAR_FLOPS: usize = 1 << 16;

/// Whether [`sgemv`] serves a product whose B has these strides: one of them must be 1.
pub(crate) fn applies(b: &MatPtr) -> bool {
    b.rs == 1 || b.cs == 1
}

/// `c[0..n] = a[0, 0..k] · B[0..k, 0..n]`.
///
/// # Safety
/// `a` is a readable row of `k` values at stride `a.cs`, `b` a readable `k × n` matrix with
/// `applies(b)`, `c` valid for `n` writes not overlapping either.
pub(crate) unsafe fn sgemv(n: usize, k: usize, a: MatPtr, b: MatPtr, c: *mut f32, threads: usize) {
    // A's row, contiguous (a strided row is copied once; it is k values).
    let copied: Vec<f32>;
    let a_row: &[f32] = if a.cs == 1 {
        // SAFETY: k readable values (caller's contract).
        unsafe { std::slice::from_raw_parts(a.ptr, k) }
    } else {
        // SAFETY: element i at a.ptr + i·cs (caller's contract).
        copied = (0..k).map(|i| unsafe { *a.ptr.offset(i as isize * a.cs) }).collect();
        &copied
    };
    let threads = if n.saturating_mul(k) < PAR_FLOPS { 1 } else { threads.max(1) };
    let (a_ptr, c_ptr, b_ptr) = (SendPtr(a_row.as_ptr() as *mut f32), SendPtr(c), SendPtr(b.ptr as *mut f32));
    let (rs, cs) = (b.rs, b.cs);
    split(n, threads, &|j0, j1| {
        let (a_ptr, c_ptr, b_ptr) = (&a_ptr, &c_ptr, &b_ptr);
        // SAFETY: a_row outlives the split; c's range j0..j1 is this task's alone; B's elements
        // read are inside the k × n matrix.
        unsafe {
            let a = std::slice::from_raw_parts(a_ptr.0 as *const f32, k);
            let c = std::slice::from_raw_parts_mut(c_ptr.0.add(j0), j1 - j0);
            if rs == 1 {
                for (o, j) in (j0..j1).enumerate() {
                    let col = std::slice::from_raw_parts(b_ptr.0.offset(j as isize * cs) as *const f32, k);
                    c[o] = dot(a, col);
                }
            } else {
                c.fill(0.0);
                for (kk, &x) in a.iter().enumerate() {
                    let row =
                        std::slice::from_raw_parts(b_ptr.0.offset(kk as isize * rs).add(j0) as *const f32, j1 - j0);
                    axpy(x, row, c);
                }
            }
        }
    });
}

/// `Σ a[i]·b[i]`, 16 running sums combined pairwise.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if matches!(crate::kernels::simd::simd_level(), "avx2" | "avx512") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { dot_avx2(a, b) };
    }
    dot_portable(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_portable(a, b)
}

#[inline(always)]
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ta.iter().zip(tb).enumerate() {
        acc[l] += x * y;
    }
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    acc[0]
}

/// `c += x·row`.
fn axpy(x: f32, row: &[f32], c: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(crate::kernels::simd::simd_level(), "avx2" | "avx512") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { axpy_avx2(x, row, c) };
    }
    axpy_portable(x, row, c)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn axpy_avx2(x: f32, row: &[f32], c: &mut [f32]) {
    axpy_portable(x, row, c)
}

#[inline(always)]
fn axpy_portable(x: f32, row: &[f32], c: &mut [f32]) {
    for (o, r) in c.iter_mut().zip(row) {
        *o += x * r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both layouts, odd sizes, against a plain f64 product; any thread count gives the same bits.
    #[test]
    fn both_layouts_match_the_plain_product_for_any_thread_count() {
        let (n, k) = (37, 301);
        let a: Vec<f32> = (0..k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 11 % 17) as f32 - 8.0) / 9.0).collect(); // [n, k]
        let wt: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect(); // [k, n]
        let want: Vec<f64> = (0..n).map(|j| (0..k).map(|i| a[i] as f64 * w[j * k + i] as f64).sum()).collect();
        let a_ptr = MatPtr { ptr: a.as_ptr(), rs: k as isize, cs: 1 };
        let mut results = Vec::new();
        for threads in [1, 2, 3] {
            for (b, name) in [
                (MatPtr { ptr: w.as_ptr(), rs: 1, cs: k as isize }, "columns contiguous"),
                (MatPtr { ptr: wt.as_ptr(), rs: n as isize, cs: 1 }, "rows contiguous"),
            ] {
                assert!(applies(&b));
                let mut c = vec![f32::NAN; n];
                // SAFETY: a has k values, b is k × n, c has n.
                unsafe { sgemv(n, k, a_ptr, b, c.as_mut_ptr(), threads) };
                for (j, (&got, &w)) in c.iter().zip(&want).enumerate() {
                    assert!(
                        (got as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "{name}, {threads} threads, {j}: {got} vs {w}"
                    );
                }
                results.push((name, threads, c));
            }
        }
        for (name, _, c) in &results {
            let first = results.iter().find(|(n2, _, _)| n2 == name).unwrap();
            assert_eq!(&first.2, c, "{name}: the thread count changed the bits");
        }
    }
}
