//! CPU kernel primitives (strided walks, the kernel team, SIMD dispatch, the own GEMM) that the
//! CPU backend (`backend/cpu/`) builds its kernels from; used by the `cpu` and `sim` devices.

pub(crate) mod avx_state;
pub(crate) mod col_sum;
pub(crate) mod gemm;
pub(crate) mod map;
pub(crate) mod simd;
pub(crate) mod strided;
pub(crate) mod team;
pub(crate) mod vmath;
