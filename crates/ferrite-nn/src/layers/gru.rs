//! `GRU`: PyTorch's `nn.GRU` — parameters `weight_ih_l{k}[_reverse] [3H, in]`,
//! `weight_hh_l{k}[_reverse] [3H, H]`, `bias_ih_…`, `bias_hh_…` with gates in PyTorch's order
//! r, z, n, and PyTorch's `n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))` (the reset gate
//! applies after the hidden projection and its bias). Stacked layers, bidirectional,
//! inter-layer dropout, `h` in and out, packed input: see `layers/recurrent.rs`.

use ferrite_tensor::functional::RecurrentCell;

use crate::layers::recurrent::{RecurrentConfig, hidden_state_forwards, recurrent_layer};

recurrent_layer!(
    /// Gated recurrent unit over a sequence: `r = σ(.)`, `z = σ(.)`,
    /// `n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))`, `h' = (1 − z) ⊙ n + z ⊙ h`.
    GRU,
    "GRU",
    |_: &RecurrentConfig| RecurrentCell::Gru
);

hidden_state_forwards!(GRU);
