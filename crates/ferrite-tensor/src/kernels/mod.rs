//! CPU kernels (used by the `cpu` and `sim` devices).

pub(crate) mod avx_state;
pub(crate) mod map;
pub(crate) mod strided;
