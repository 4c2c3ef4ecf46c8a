//! `RNN`: PyTorch's `nn.RNN` (Elman) with `nonlinearity` tanh or relu — parameters
//! `weight_ih_l{k}[_reverse] [H, in]`, `weight_hh_l{k}[_reverse] [H, H]`, `bias_ih_…`,
//! `bias_hh_…`. Stacked layers, bidirectional, inter-layer dropout, `h` in and out, packed
//! input: see `layers/recurrent.rs`.

use ferrite_tensor::functional::RecurrentCell;

use crate::layers::recurrent::{Nonlinearity, RecurrentConfig, hidden_state_forwards, recurrent_layer};

recurrent_layer!(
    /// Elman recurrence over a sequence: `h' = act(W_ih x + b_ih + W_hh h + b_hh)`, `act` tanh
    /// (default) or relu ([`RecurrentConfig::nonlinearity`]).
    RNN,
    "RNN",
    |c: &RecurrentConfig| match c.nonlinearity {
        Nonlinearity::Tanh => RecurrentCell::RnnTanh,
        Nonlinearity::Relu => RecurrentCell::RnnRelu,
    }
);

hidden_state_forwards!(RNN);
