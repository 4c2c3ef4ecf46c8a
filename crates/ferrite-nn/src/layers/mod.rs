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
