//! `LSTM`: PyTorch's `nn.LSTM` — parameters `weight_ih_l{k}[_reverse] [4H, in]`,
//! `weight_hh_l{k}[_reverse] [4H, H]`, `bias_ih_…`, `bias_hh_…` with gates in PyTorch's order
//! i, f, g, o — so recurrent checkpoints load both ways. Stacked layers, bidirectional,
//! inter-layer dropout, `(h, c)` in and out, packed input: see `layers/recurrent.rs`.

use ferrite_tensor::Tensor;
use ferrite_tensor::functional::RecurrentCell;

use crate::error::Result;
use crate::layers::recurrent::{RecurrentConfig, recurrent_layer};
use crate::packed_sequence::PackedSequence;

recurrent_layer!(
    /// Long short-term memory over a sequence: `c' = σ(f) ⊙ c + σ(i) ⊙ tanh(g)`,
    /// `h' = σ(o) ⊙ tanh(c')`, gates from `W_ih x + b_ih + W_hh h + b_hh`.
    ///
    /// ```
    /// use ferrite_nn::{LSTM, RecurrentConfig};
    /// use ferrite_tensor::{DType, Device, Generator, Tensor};
    /// # fn main() -> ferrite_nn::Result<()> {
    /// let (cpu, mut g) = (Device::Cpu, Generator::new(0));
    /// let cfg = RecurrentConfig::new(8, 16).num_layers(2).bidirectional(true).batch_first(true);
    /// let lstm = LSTM::from_config(cfg, &cpu, &mut g)?;
    /// let x = Tensor::randn_with(&[4, 10, 8], DType::F32, &cpu, &mut g)?; // [batch, seq, in]
    /// let (y, (h, c)) = lstm.forward_with_state(&x, None)?;
    /// assert_eq!(y.shape(), [4, 10, 32]); // both directions
    /// assert_eq!(h.shape(), [4, 4, 16]); // [layers * directions, batch, hidden]
    /// // Continue from the final state, cut from its history (truncated BPTT).
    /// let (_y2, _) = lstm.forward_with_state(&x, Some((&h.detach(), &c.detach())))?;
    /// # Ok(()) }
    /// ```
    LSTM,
    "LSTM",
    |_: &RecurrentConfig| RecurrentCell::Lstm
);

impl LSTM {
    /// Full forward of a padded batch (`[seq, batch, in]`, or batch-first, or one unbatched
    /// `[seq, in]`) from the initial state `(h_0, c_0)` (each `[layers · directions, batch,
    /// hidden]`; zeros when `None`): the output at every step (`[.., directions · hidden]`) and
    /// the final `(h_n, c_n)`.
    pub fn forward_with_state(
        &self,
        x: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let (y, h, c) = self.core.forward_padded(x, state.map(|s| s.0), state.map(|s| s.1))?;
        Ok((y, (h, cell_state(c)?)))
    }

    /// Forward of a packed batch: the output packed the same way and each sequence's `(h, c)`
    /// after its last valid step, in the caller's sequence order (as is the initial state).
    pub fn forward_packed(
        &self,
        x: &PackedSequence,
        state: Option<(&Tensor, &Tensor)>,
    ) -> Result<(PackedSequence, (Tensor, Tensor))> {
        let (y, h, c) = self.core.forward_packed(x, state.map(|s| s.0), state.map(|s| s.1))?;
        Ok((y, (h, cell_state(c)?)))
    }
}

fn cell_state(c: Option<Tensor>) -> Result<Tensor> {
    c.ok_or_else(|| crate::error::NnError::config("LSTM", "internal: the scan returned no cell state"))
}
