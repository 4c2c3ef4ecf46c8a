//! Layers, one file each.

pub mod activation;
pub mod attention;
pub mod dropout;
pub mod embedding;
pub mod gru;
pub mod layer_norm;
pub mod linear;
pub mod lstm;
pub mod recurrent;
pub mod rnn;
pub mod sequential;
pub mod transformer;
// normalisation and pooling (normpool)
pub mod batch_norm;
pub mod flatten;
pub mod group_norm;
pub mod pool;
pub mod rms_norm;
// convolution (conv)
pub mod conv;
