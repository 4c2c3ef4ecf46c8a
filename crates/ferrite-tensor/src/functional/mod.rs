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
//! - `norm` — normalisation (layer norm; batch/group/instance norm go here too),
//! - `loss` — losses and their shared [`Reduction`],
//! - `attention` — scaled dot-product attention,
//! - `rnn` — recurrent layers (one layer and direction of RNN, GRU and LSTM over packed rows),
//! - `embedding`, `dropout` — one function each.
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

pub use attention::{scaled_dot_product_attention, scaled_dot_product_attention_chunked};
pub use dropout::dropout;
pub use embedding::embedding;
pub use loss::{
    CrossEntropyOptions, KlDivReduction, Reduction, binary_cross_entropy, binary_cross_entropy_with_logits,
    cross_entropy, huber_loss, kl_div, mse_loss, mse_loss_with, nll_loss, smooth_l1_loss,
};
pub use norm::layer_norm;
pub use rnn::{RecurrentCell, RecurrentOutput, RecurrentWeights, lstm, recurrent, recurrent_scan};
