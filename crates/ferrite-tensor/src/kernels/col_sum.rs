//! Column sums of a block of f32 rows with the accumulators in vector registers: the inner step
//! of `x.sum(0)` (bias and norm-weight gradients, `BENCHMARKS.md` "row sums").
//!
//! Why its own kernel: summed as plain slices (`acc[j] += row[j]` for each row), every row costs
//! a load, an add *and a store* of the accumulator row, and on the 2-core AVX2 EPYC that ran at a
//! third of PyTorch's speed. Here a strip of up to 8 vectors of columns is summed down all the
//! block's rows in registers (one load and one add per vector and row, eight independent add
//! chains), then widened to f64 once per block. The body is written once over the GEMM's
//! [`Vector`] trait and instantiated for AVX-512 (16 lanes), AVX2 (8) and the portable 4-lane
//! vector, like the GEMM micro-kernels.
//!
//! Order: each column is summed in f32 from row 0 to the last row, one row at a time (the order a
//! scalar loop uses), whatever the instruction set — so the result is the same on every machine
//! and for every split of the columns among threads.

use super::gemm::Isa;
use super::gemm::vector::{Portable, Vector};

/// Vectors of columns summed together (eight independent add chains per strip).
const STRIP: usize = 8;

/// `acc[j] += Σ_{r < rows} x[r·ld + j]` for `j < cols`, each column summed in f32 in row order
/// and widened to f64 once.
///
/// # Safety
/// `x` is readable for `rows` rows of `cols` values at row stride `ld`; `acc.len() >= cols`.
pub(crate) unsafe fn add_column_sums(x: *const f32, ld: usize, rows: usize, cols: usize, acc: &mut [f64]) {
    // SAFETY: forwarded; `best` is the instruction set this CPU runs.
    unsafe { add_column_sums_with(Isa::best().unwrap_or(Isa::Scalar), x, ld, rows, cols, acc) }
}

/// [`add_column_sums`] with the given instruction set (tests run each one this CPU supports).
///
/// # Safety
/// As [`add_column_sums`], and `isa` is [supported](Isa::supported) here.
pub(crate) unsafe fn add_column_sums_with(
    isa: Isa,
    x: *const f32,
    ld: usize,
    rows: usize,
    cols: usize,
    acc: &mut [f64],
) {
    debug_assert!(acc.len() >= cols);
    // SAFETY: the caller's contract, and the CPU runs `isa`.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512(x, ld, rows, cols, acc),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2(x, ld, rows, cols, acc),
            _ => column_sums::<Portable>(x, ld, rows, cols, acc),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,avx,fma")]
unsafe fn avx512(x: *const f32, ld: usize, rows: usize, cols: usize, acc: &mut [f64]) {
    // SAFETY: forwarded; the CPU has AVX-512 (the caller dispatched on it).
    unsafe { column_sums::<super::gemm::vector::Avx512>(x, ld, rows, cols, acc) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx,fma")]
unsafe fn avx2(x: *const f32, ld: usize, rows: usize, cols: usize, acc: &mut [f64]) {
    // SAFETY: forwarded; the CPU has AVX2 + FMA (the caller dispatched on it).
    unsafe { column_sums::<super::gemm::vector::Avx2>(x, ld, rows, cols, acc) }
}

/// The strips: `STRIP` vectors at a time, then 4, 2 and 1 (the remainder of a narrow input still
/// gets several chains), then one masked vector for the last `< LANES` columns.
///
/// # Safety
/// As [`add_column_sums`]; the CPU runs `V`.
#[inline(always)]
unsafe fn column_sums<V: Vector>(x: *const f32, ld: usize, rows: usize, cols: usize, acc: &mut [f64]) {
    let l = V::LANES;
    let mut c0 = 0;
    // SAFETY: every strip reads columns [c0, c0 + width) ⊆ [0, cols) of the rows (caller's
    // contract) and adds into acc[c0..c0 + width].
    unsafe {
        while cols - c0 >= STRIP * l {
            strip::<V, STRIP>(x.add(c0), ld, rows, l, &mut acc[c0..]);
            c0 += STRIP * l;
        }
        if cols - c0 >= 4 * l {
            strip::<V, 4>(x.add(c0), ld, rows, l, &mut acc[c0..]);
            c0 += 4 * l;
        }
        if cols - c0 >= 2 * l {
            strip::<V, 2>(x.add(c0), ld, rows, l, &mut acc[c0..]);
            c0 += 2 * l;
        }
        if cols - c0 >= l {
            strip::<V, 1>(x.add(c0), ld, rows, l, &mut acc[c0..]);
            c0 += l;
        }
        if cols > c0 {
            strip::<V, 1>(x.add(c0), ld, rows, cols - c0, &mut acc[c0..]);
        }
    }
}

/// `NV` vectors of columns (the last one `last` lanes wide, `last <= LANES`) summed over `rows`
/// rows in registers, then added as f64 into `acc[..(NV-1)·LANES + last]`.
///
/// # Safety
/// `x` is readable for `rows` rows of `(NV-1)·LANES + last` values at stride `ld`; the CPU runs `V`.
#[inline(always)]
unsafe fn strip<V: Vector, const NV: usize>(x: *const f32, ld: usize, rows: usize, last: usize, acc: &mut [f64]) {
    let l = V::LANES;
    let width = (NV - 1) * l + last;
    // SAFETY: loads stay in the strip's columns of each row (caller's contract); the spill
    // buffer holds NV·LANES ≤ 8·16 values.
    unsafe {
        let mut s = [V::zero(); NV];
        let mut p = x;
        if last == l {
            for _ in 0..rows {
                for (v, a) in s.iter_mut().enumerate() {
                    *a = V::add(*a, V::load(p.add(v * l)));
                }
                p = p.add(ld);
            }
        } else {
            for _ in 0..rows {
                for (v, a) in s.iter_mut().enumerate() {
                    let x = if v + 1 == NV { V::load_first(p.add(v * l), last) } else { V::load(p.add(v * l)) };
                    *a = V::add(*a, x);
                }
                p = p.add(ld);
            }
        }
        let mut spill = [0f32; STRIP * 16];
        for (v, a) in s.iter().enumerate() {
            V::store(spill.as_mut_ptr().add(v * l), *a);
        }
        for (a, &b) in acc[..width].iter_mut().zip(&spill[..width]) {
            *a += b as f64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each column summed in f32, row by row, then widened: the order the kernel promises.
    fn reference(x: &[f32], ld: usize, rows: usize, cols: usize, acc: &mut [f64]) {
        for (j, a) in acc.iter_mut().enumerate().take(cols) {
            let mut s = 0f32;
            for r in 0..rows {
                s += x[r * ld + j];
            }
            *a += s as f64;
        }
    }

    #[test]
    fn every_instruction_set_matches_the_row_order_f32_sum_bit_for_bit() {
        // Widths around every strip size of 4-, 8- and 16-lane vectors (tails of 1..LANES-1),
        // a row stride wider than the block, and row counts 1, odd, and a full 64-row block.
        let mut state = 12345u32;
        let mut next = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        };
        for isa in Isa::ALL.into_iter().filter(|i| i.supported()) {
            for cols in [1usize, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 200, 257] {
                for rows in [1usize, 5, 64] {
                    let ld = cols + 3;
                    let x: Vec<f32> = (0..rows * ld).map(|_| next() * 100.0).collect();
                    let init: Vec<f64> = (0..cols + 2).map(|j| j as f64 * 0.5).collect();
                    let (mut got, mut want) = (init.clone(), init.clone());
                    // SAFETY: `x` holds `rows` rows of `ld >= cols` values; the ISA is supported.
                    unsafe { add_column_sums_with(isa, x.as_ptr(), ld, rows, cols, &mut got) };
                    reference(&x, ld, rows, cols, &mut want);
                    assert_eq!(got, want, "{isa:?} rows {rows} cols {cols}");
                }
            }
        }
    }
}
