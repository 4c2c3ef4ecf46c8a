//! Tensors, CPU kernels and the autograd engine of ferrite.
//!
//! NOTE (in progress, issue 3): `dtype` and `random` are fixed contracts other crates build on.

pub mod dtype;
pub mod random;

pub use dtype::DType;
pub use random::{manual_seed, Generator, GeneratorState};
