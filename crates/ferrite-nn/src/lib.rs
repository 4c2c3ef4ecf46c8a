//! Neural-network modules for ferrite: the [`Module`] tree with PyTorch's parameter names and
//! state dicts, layers with PyTorch's default initialisations, losses, and the memory-saving
//! techniques — activation [`checkpoint`]ing, [`autocast`], and [`inference`] without
//! activations — each usable in one line.
//!
//! ```
//! use ferrite_nn::{CrossEntropyLoss, Linear, Module, ReLU, Sequential};
//! use ferrite_tensor::{Device, Generator, Tensor};
//! # fn main() -> ferrite_nn::Result<()> {
//! let mut g = Generator::new(0);
//! let cpu = Device::Cpu;
//! let model = Sequential::new()
//!     .append(Linear::new_with(64, 32, true, &cpu, &mut g)?)
//!     .append(ReLU::new())
//!     .append(Linear::new_with(32, 10, true, &cpu, &mut g)?);
//! let keys: Vec<String> = model.state_dict().keys().map(String::from).collect();
//! assert_eq!(keys, ["0.weight", "0.bias", "2.weight", "2.bias"]);
//! let x = Tensor::randn_with(&[8, 64], ferrite_tensor::DType::F32, &cpu, &mut g)?;
//! let y = Tensor::from_vec(vec![1i64, 0, 3, 9, 2, 2, 5, 7], &[8], &cpu)?;
//! let loss = CrossEntropyLoss::new().forward(&model.forward(&x)?, &y)?;
//! loss.backward()?;
//! model.zero_grad()?; // frees the gradients
//! # Ok(()) }
//! ```

pub mod activation_checkpoint;
mod error;
pub mod inference;
pub mod init;
pub mod layer_marks;
pub mod layers;
pub mod lora;
pub mod lora_host;
pub mod loss;
pub mod module;
pub mod packed_sequence;
pub mod parameter_dtype;
pub mod rng;
pub mod state_dict;
pub mod tbptt;

pub use activation_checkpoint::{Checkpointed, checkpoint, checkpoint_multi, checkpoint_with_params, is_recomputing};
pub use error::{LoadStateDictError, NnError, Result, SizeMismatch};
/// Autocast lives in `ferrite-tensor` beside the ops that read it; re-exported for model code.
pub use ferrite_tensor::autocast;
pub use ferrite_tensor::autocast::{AutocastGuard, autocast, autocast_disabled};
pub use inference::inference;
pub use layer_marks::{LayerMarkGuard, listen_for_layer_marks, mark_layer};
pub use layers::activation::{GELU, GeluApproximation, ReLU, SiLU, Sigmoid, Tanh};
pub use layers::attention::{AttentionBackend, AttentionConfig, MultiheadAttention, attention};
pub use layers::dropout::Dropout;
pub use layers::embedding::Embedding;
pub use layers::gru::GRU;
pub use layers::layer_norm::LayerNorm;
pub use layers::linear::Linear;
pub use layers::lstm::LSTM;
pub use layers::recurrent::{Nonlinearity, RecurrentConfig, RecurrentParams};
pub use layers::rnn::RNN;
pub use layers::sequential::Sequential;
pub use layers::transformer::{TransformerBlock, TransformerConfig};
pub use lora::{
    Lora, LoraConfig, LoraFactor, LoraTargets, apply_lora, has_lora, lora_target_names, merge_lora,
    set_lora_dropout_rng, trainable_parameters,
};
pub use lora_host::{LoraHost, LoraParams};
pub use loss::{
    BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, KLDivLoss, KlDivReduction, MSELoss, NLLLoss, Reduction,
    SmoothL1Loss,
};
pub use module::{Module, init_skipped, skip_init};
pub use packed_sequence::{PackedSequence, pack_padded_sequence, pack_sequence, pad_packed_sequence};
pub use parameter_dtype::{parameter_dtype, with_parameter_dtype};
pub use rng::RngHandle;
pub use state_dict::{IncompatibleKeys, LoadOptions, StateDict};
// normalisation and pooling (normpool)
pub use layers::batch_norm::{BatchNorm, BatchNorm1d, BatchNorm2d, BatchNormConfig};
pub use layers::flatten::Flatten;
pub use layers::group_norm::GroupNorm;
pub use layers::pool::{AdaptiveAvgPool2d, AvgPool2d, MaxPool2d};
pub use layers::rms_norm::RMSNorm;
// convolution (conv)
pub use layers::conv::{
    Conv1d, Conv1dConfig, Conv2d, Conv2dConfig, ConvConfig, ConvNd, ConvTranspose2d, ConvTranspose2dConfig,
};
pub use tbptt::tbptt;
