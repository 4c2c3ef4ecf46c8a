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
//! | [`models`] | `ferrite-models` | built-in MLP/CNN/LSTM/transformer LMs, Hugging Face decoders and T5 |
//! | [`plan`] | `ferrite-plan` | the memory planner: will a step fit, the largest batch, remedies |
//! | [`parallel`] | `ferrite-parallel` | DataParallel across devices; DDP over MPI (feature `mpi`) |
//! | [`train`] | `ferrite-train` | the `Trainer`: epochs, accumulation, AMP, checkpoints, metrics, remedies |
//!
//! `use ferrite::prelude::*;` brings what a training program names most: tensors and devices,
//! modules and layers, optimizers, data loaders and the `Trainer`.

pub use ferrite_data as data;
pub use ferrite_io as io;
pub use ferrite_memory as memory;
pub use ferrite_models as models;
pub use ferrite_nn as nn;
pub use ferrite_optim as optim;
pub use ferrite_parallel as parallel;
pub use ferrite_plan as plan;
pub use ferrite_tensor as tensor;
pub use ferrite_train as train;

/// The names a training program uses most, from every crate.
pub mod prelude {
    pub use ferrite_data::{DataLoader, Dataset, InMemory, StackCollate};
    pub use ferrite_memory::{Device, MemoryScope, allocator, format_size};
    pub use ferrite_nn::{
        CrossEntropyLoss, Dropout, Embedding, LayerNorm, Linear, MSELoss, Module, ReLU, RngHandle, Sequential,
        inference,
    };
    pub use ferrite_optim::{Adam, AdamConfig, LrScheduler, Optimizer, Sgd, SgdConfig};
    pub use ferrite_tensor::{DType, Generator, Tensor, no_grad};
    pub use ferrite_train::{AmpMode, Goal, Metrics, StepOutput, TrainError, Trainer};
}

pub use ferrite_memory::{Device, DeviceInfo, MemoryScope, devices};
pub use ferrite_tensor::{DType, Tensor};
