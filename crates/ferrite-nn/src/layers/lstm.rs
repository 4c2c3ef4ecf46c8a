//! `LSTM`: PyTorch's `nn.LSTM` — parameters `weight_ih_l{k}[_reverse] [4H, in]`,
//! `weight_hh_l{k}[_reverse] [4H, H]`, `bias_ih_…`, `bias_hh_…` with gates in PyTorch's order
//! i, f, g, o — so recurrent checkpoints load both ways. Stacked layers, bidirectional,
//! inter-layer dropout, `(h, c)` in and out, packed input: see `layers/recurrent.rs`.

use ferrite_tensor::functional::RecurrentCell;

use crate::layers::recurrent::{RecurrentConfig, recurrent_layer};

recurrent_layer!(
    /// Long short-term memory over a sequence: `c' = σ(f) ⊙ c + σ(i) ⊙ tanh(g)`,
    /// `h' = σ(o) ⊙ tanh(c')`, gates from `W_ih x + b_ih + W_hh h + b_hh`.
    ///
    /// ```
    /// use ferrite_nn::{LSTM, RecurrentConfig, RecurrentState};
    /// use ferrite_tensor::{DType, Device, Generator, Tensor};
    /// # fn main() -> ferrite_nn::Result<()> {
    /// let (cpu, mut g) = (Device::Cpu, Generator::new(0));
    /// let cfg = RecurrentConfig::new(8, 16).num_layers(2).bidirectional(true).batch_first(true);
    /// let lstm = LSTM::from_config(cfg, &cpu, &mut g)?;
    /// let x = Tensor::randn_with(&[4, 10, 8], DType::F32, &cpu, &mut g)?; // [batch, seq, in]
    /// let (y, state) = lstm.forward_with_state(&x, None)?;
    /// assert_eq!(y.shape(), [4, 10, 32]); // both directions
    /// assert_eq!(state.h.shape(), [4, 4, 16]); // [layers * directions, batch, hidden]
    /// // Continue from the final state, cut from its history (truncated BPTT).
    /// let (_y2, _) = lstm.forward_with_state(&x, Some(&state.detach()))?;
    /// # let _ = RecurrentState::new(state.h);
    /// # Ok(()) }
    /// ```
    LSTM,
    "LSTM",
    |_: &RecurrentConfig| RecurrentCell::Lstm
);
