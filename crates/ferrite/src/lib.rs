//! ferrite: a deep-learning training framework built around predictable device memory.
//!
//! One dependency for users: every ferrite crate re-exported under a short name, so a training
//! program writes `use ferrite::{tensor::Tensor, nn, optim};` and gets versions that agree.
//!
//! | module | crate | holds |
//! |---|---|---|
//! | [`memory`] | `ferrite-memory` | devices, the caching allocator, statistics, OOM diagnosis |
//! | [`tensor`] | `ferrite-tensor` | tensors, ops, autograd, autocast |
//! | [`nn`] | `ferrite-nn` | modules, losses, activation checkpointing |
//! | [`optim`] | `ferrite-optim` | optimizers, LR schedules, GradScaler, accumulation |
//! | [`data`] | `ferrite-data` | datasets, samplers, the worker-thread DataLoader |
//! | [`io`] | `ferrite-io` | safetensors, safe `.pt` reading, training checkpoints |

pub use ferrite_data as data;
pub use ferrite_io as io;
pub use ferrite_memory as memory;
pub use ferrite_nn as nn;
pub use ferrite_optim as optim;
pub use ferrite_tensor as tensor;

pub use ferrite_memory::{Device, DeviceInfo, MemoryScope, devices};
pub use ferrite_tensor::{DType, Tensor};
