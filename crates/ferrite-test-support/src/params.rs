//! Bit patterns of f32 tensors, for the tests that demand bit-identical results (resume from a
//! checkpoint, replicas in sync): equal bits, not merely close values.

use ferrite_tensor::{DType, Tensor};

/// The bit patterns of an F32 tensor's values, in row-major order.
pub fn bits(t: &Tensor) -> Vec<u32> {
    assert_eq!(t.dtype(), DType::F32);
    t.to_vec::<f32>().unwrap_or_else(|e| panic!("reading the tensor back: {e}")).into_iter().map(f32::to_bits).collect()
}

/// [`bits`] of every tensor of a list (a parameter list).
pub fn bits_of(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter().map(bits).collect()
}
