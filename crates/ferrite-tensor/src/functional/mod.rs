//! Functional forms of the layers and losses of `torch.nn.functional` that need more than a
//! composition of tensor ops: fused layer norm, cross-entropy with ignore_index and label
//! smoothing, scaled-dot-product attention with a memory-efficient chunked path, and the recurrent scans
//! (RNN, GRU, LSTM).
//!
//! They live beside the tensor ops (as in PyTorch's `torch.nn.functional`) so the op-parity suite
//! can check them against PyTorch directly; `ferrite-nn` layers call them.
//!
//! One file per family, every public item re-exported here so callers write
//! `ferrite_tensor::functional::cross_entropy` whatever file holds it:
//! - `norm` — normalisation (layer, batch, group and RMS norm; instance norm goes here too),
//! - `pool` — 2-D pooling (max, average, adaptive average),
//! - `loss` — losses and their shared [`Reduction`],
//! - `attention` — scaled dot-product attention,
//! - `rnn` — recurrent layers (one layer and direction of RNN, GRU and LSTM over packed rows),
//! - `embedding`, `dropout` — one function each,
//! - `conv` — convolutions (conv1d, conv2d, conv_transpose2d) as unfold + GEMM.
//!
//! A new family (convolution, pooling, …) gets a new file named after it, with a `//!` doc on
//! why it is shaped the way it is, and a `pub use` line below; a new member of an existing family
//! goes into that family's file.

mod attention;
mod dropout;
mod embedding;
mod loss;
mod norm;
mod rnn;
// normalisation and pooling (normpool)
mod pool;
// convolution (conv)
mod conv;

pub use attention::{scaled_dot_product_attention, scaled_dot_product_attention_chunked};
pub use dropout::dropout;
pub use embedding::embedding;
pub use loss::{
    CrossEntropyOptions, KlDivReduction, Reduction, binary_cross_entropy, binary_cross_entropy_with_logits,
    cross_entropy, huber_loss, kl_div, mse_loss, mse_loss_with, nll_loss, smooth_l1_loss,
};
pub use norm::layer_norm;
pub use rnn::{RecurrentCell, RecurrentOutput, RecurrentWeights, lstm, recurrent, recurrent_scan};
// normalisation and pooling (normpool)
pub use norm::{BatchNormOptions, batch_norm, dtype_epsilon, group_norm, rms_norm};
pub use pool::{
    AvgPool2dOptions, MaxPool2dOptions, adaptive_avg_pool2d, avg_pool2d, max_pool2d, max_pool2d_with_indices,
};
// convolution (conv)
pub use conv::{
    Conv1dOptions, Conv2dOptions, ConvOptions, ConvTranspose2dOptions, ConvTransposeOptions, Padding, SpatialSize,
    UNFOLD_BUDGET, conv_transpose2d, conv1d, conv2d,
};
