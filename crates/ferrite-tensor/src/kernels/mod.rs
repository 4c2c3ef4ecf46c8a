//! CPU kernels (used by the `cpu` and `sim` devices).

pub(crate) mod map;
pub(crate) mod strided;
