//! Layers, one file each.

pub mod activation;
pub mod attention;
pub mod dropout;
pub mod embedding;
pub mod layer_norm;
pub mod linear;
pub mod lstm;
pub mod sequential;
pub mod transformer;
pub mod recurrent;
pub mod gru;
pub mod rnn;
