//! The dtype ZeRO's collectives carry on the wire (`--zero-comm-dtype`, DeepSpeed's
//! `communication_data_type`, PyTorch FSDP's `MixedPrecision(param_dtype, reduce_dtype)`).
//!
//! Why bf16: a sharded step moves every parameter once or twice (all-gathers) and every gradient
//! once (reduce-scatter) per step; in bf16 that is half the bytes. The values are rounded to bf16
//! (round to nearest even, as `torch.Tensor.bfloat16()`) before they leave the rank; a
//! reduce-scatter sums in bf16 as NCCL does for a bf16 tensor: every partial sum is computed in
//! f32 and rounded back to bf16, so with `W` ranks the result carries `W − 1` roundings. The f32
//! master values in each rank's shard are never rounded: only what travels is.
//!
//! The callers keep working in f32 vectors; [`pack`] and [`unpack`] convert at the edge of the
//! communication thread, and [`bf16_sum`] is the MPI reduction that adds two bf16 vectors.

#[cfg(feature = "mpi")]
use std::ffi::{c_int, c_void};

use half::bf16;
#[cfg(feature = "mpi")]
use mpi::ffi;

/// What a ZeRO collective sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommDtype {
    /// f32 values, exact.
    #[default]
    F32,
    /// Values rounded to bf16; sums in bf16.
    Bf16,
}

impl CommDtype {
    /// `f32` or `bf16` (what `--zero-comm-dtype` takes); `None` otherwise.
    pub fn parse(s: &str) -> Option<CommDtype> {
        match s {
            "f32" | "float32" | "fp32" => Some(CommDtype::F32),
            "bf16" | "bfloat16" => Some(CommDtype::Bf16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CommDtype::F32 => "f32",
            CommDtype::Bf16 => "bf16",
        }
    }

    /// Bytes one value takes on the wire.
    pub fn size_in_bytes(self) -> usize {
        match self {
            CommDtype::F32 => 4,
            CommDtype::Bf16 => 2,
        }
    }
}

/// `values` rounded to bf16, as the bit patterns MPI carries.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn pack(values: &[f32]) -> Vec<u16> {
    values.iter().map(|v| bf16::from_f32(*v).to_bits()).collect()
}

/// bf16 bit patterns back to f32 (exact).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn unpack(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|b| bf16::from_bits(*b).to_f32()).collect()
}

#[cfg(feature = "mpi")]
/// `inout[i] = bf16(f32(in[i]) + f32(inout[i]))`: the MPI user reduction of a bf16 sum.
///
/// # Safety
/// MPI calls it with `invec` and `inoutvec` pointing at `*len` values of the datatype the
/// collective was given, which is `MPI_UNSIGNED_SHORT` (a `u16`, a bf16 bit pattern) for every
/// collective that uses this operation.
pub(crate) unsafe extern "C" fn bf16_sum(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut ffi::MPI_Datatype,
) {
    // SAFETY: see the function's contract: MPI passes a valid length and two arrays of that many
    // `u16`, distinct (MPI's input buffer and its accumulator).
    let (a, b) = unsafe {
        let n = usize::try_from(*len).unwrap_or(0);
        (std::slice::from_raw_parts(invec as *const u16, n), std::slice::from_raw_parts_mut(inoutvec as *mut u16, n))
    };
    for (x, acc) in a.iter().zip(b.iter_mut()) {
        *acc = bf16_add(*x, *acc);
    }
}

/// One rounding step of a bf16 sum.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn bf16_add(a: u16, b: u16) -> u16 {
    bf16::from_f32(bf16::from_bits(a).to_f32() + bf16::from_bits(b).to_f32()).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_rounds_to_nearest_even_and_unpacks_exactly() {
        // 1 + 2^-8 is halfway between 1 and the next bf16 (1 + 2^-7): ties go to even (1.0).
        let v = [1.0f32, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5, 0.0];
        let back = unpack(&pack(&v));
        assert_eq!(back, vec![1.0, 1.0, 1.0 + 4.0 / 256.0, -2.5, 0.0]);
    }

    #[cfg(feature = "mpi")]
    #[test]
    fn a_bf16_sum_rounds_each_partial_sum() {
        use std::ffi::{c_int, c_void};
        // 256 + 1 is not a bf16 (8 significant bits): the sum rounds back to 256.
        let s = bf16_add(bf16::from_f32(256.0).to_bits(), bf16::from_f32(1.0).to_bits());
        assert_eq!(bf16::from_bits(s).to_f32(), 256.0);
        let mut acc = pack(&[1.5, 256.0]);
        let mut len: c_int = 2;
        let mut input = pack(&[2.0, 1.0]);
        // SAFETY: two arrays of `len` u16, as MPI would pass them.
        unsafe {
            bf16_sum(input.as_mut_ptr() as *mut c_void, acc.as_mut_ptr() as *mut c_void, &mut len, std::ptr::null_mut())
        };
        assert_eq!(unpack(&acc), vec![3.5, 256.0]);
    }

    #[test]
    fn parse_names() {
        assert_eq!(CommDtype::parse("bf16"), Some(CommDtype::Bf16));
        assert_eq!(CommDtype::parse("f32"), Some(CommDtype::F32));
        assert_eq!(CommDtype::parse("f16"), None);
        assert_eq!(CommDtype::Bf16.size_in_bytes(), 2);
    }
}
