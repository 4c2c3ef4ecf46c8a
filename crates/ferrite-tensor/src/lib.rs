//! Tensors, the ops on them, the kernel backends that compute them (CPU for `cpu` and `sim`,
//! WGSL for `gpu`, none for `meta`) and the autograd engine of ferrite.
//!
//! Every tensor's bytes are a block from its device's caching allocator (`ferrite-memory`), so
//! the allocator's statistics are the truth about what tensors hold, and a `meta` run (shapes
//! only) makes exactly the allocations a real run would.
//!
//! Where things are: an op's shape and dtype rules, output allocation and backward in `ops/`
//! (layer-level forms such as losses and attention in `functional/`); its arithmetic in
//! `backend/` behind the `KernelBackend` seam; CPU kernel building blocks in `kernels/`; the
//! graph in `autograd/`; errors, with the shapes and dtypes they concern, in `error/`.
//!
//! ```
//! use ferrite_memory::Device;
//! use ferrite_tensor::{DType, Tensor};
//! # fn main() -> Result<(), ferrite_tensor::TensorError> {
//! let cpu = Device::Cpu;
//! let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2], &cpu)?.requires_grad_(true)?;
//! let x = Tensor::ones(&[2, 2], DType::F32, &cpu)?;
//! let loss = x.matmul(&w)?.relu()?.sum()?;
//! loss.backward()?;
//! assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![2.0, 2.0, 2.0, 2.0]);
//! # Ok(()) }
//! ```

pub mod autocast;
pub mod autograd;
pub mod backend;
pub mod dtype;
pub mod element;
mod error;
mod extent;
pub mod functional;
pub(crate) mod kernels;
pub mod layout;
pub mod ops;
pub mod random;
mod storage;
mod tensor;

pub use autograd::{BackwardFn, SavedTensor, enable_grad, is_grad_enabled, no_grad};
pub use dtype::DType;
pub use element::{Bool8, Element, HostElement};
pub use error::{ExpectedShape, Result, TensorError};
pub use ferrite_memory::Device;
pub use kernels::simd::cpu_report;
pub use kernels::simd::simd_level;
pub use random::{Generator, GeneratorState, manual_seed};
pub use storage::Storage;
pub use tensor::Tensor;
