//! `LSTM` with PyTorch's parameter layout (`weight_ih_l0 [4H, I]`, `weight_hh_l0 [4H, H]`,
//! `bias_ih_l0`, `bias_hh_l0`, gate order i, f, g, o) so recurrent checkpoints load unchanged.
//! Built from tensor ops: the input projection of all time steps is one matmul, then one
//! recurrent matmul per step.

use ferrite_tensor::random::with_default_generator;
use ferrite_tensor::{Device, Generator, Tensor};

use crate::error::{NnError, Result};
use crate::init::uniform_;
use crate::module::{Module, new_parameter, training_flag};

/// Parameters of one LSTM layer.
#[derive(Clone, Debug)]
pub struct LstmLayer {
    pub weight_ih: Tensor,
    pub weight_hh: Tensor,
    pub bias_ih: Option<Tensor>,
    pub bias_hh: Option<Tensor>,
}

/// Unidirectional multi-layer LSTM. `forward` takes `[B, T, I]` when `batch_first`, else
/// `[T, B, I]`, starts from zero state, and returns the last layer's hidden state at every step
/// (`[B, T, H]` / `[T, B, H]`). Inter-layer dropout is not supported.
#[derive(Clone, Debug)]
pub struct LSTM {
    pub input_size: usize,
    pub hidden_size: usize,
    pub batch_first: bool,
    pub layers: Vec<LstmLayer>,
    training: bool,
}

impl LSTM {
    /// On the CPU, initialised from the process default generator.
    pub fn new(input_size: usize, hidden_size: usize, num_layers: usize, batch_first: bool) -> Result<LSTM> {
        with_default_generator(|g| {
            LSTM::new_with(input_size, hidden_size, num_layers, true, batch_first, &Device::Cpu, g)
        })
    }

    /// PyTorch's initialisation: every weight and bias U(±1/√hidden_size), drawn from `g`.
    pub fn new_with(
        input_size: usize,
        hidden_size: usize,
        num_layers: usize,
        bias: bool,
        batch_first: bool,
        device: &Device,
        g: &mut Generator,
    ) -> Result<LSTM> {
        if hidden_size == 0 || num_layers == 0 {
            return Err(NnError::config(
                "LSTM",
                format!("hidden_size ({hidden_size}) and num_layers ({num_layers}) must be positive"),
            ));
        }
        let k = 1.0 / (hidden_size as f64).sqrt();
        let mut layers = Vec::with_capacity(num_layers);
        for l in 0..num_layers {
            let in_l = if l == 0 { input_size } else { hidden_size };
            let mut p = |shape: &[usize]| new_parameter(shape, device, |t| uniform_(t, -k, k, g));
            let weight_ih = p(&[4 * hidden_size, in_l])?;
            let weight_hh = p(&[4 * hidden_size, hidden_size])?;
            let (bias_ih, bias_hh) =
                if bias { (Some(p(&[4 * hidden_size])?), Some(p(&[4 * hidden_size])?)) } else { (None, None) };
            layers.push(LstmLayer { weight_ih, weight_hh, bias_ih, bias_hh });
        }
        Ok(LSTM { input_size, hidden_size, batch_first, layers, training: true })
    }

    /// Full forward: output sequence and the final `(h_n, c_n)`, each `[num_layers, B, H]`.
    /// `state` is the initial `(h_0, c_0)` with the same shapes (zeros if `None`).
    pub fn forward_with_state(
        &self,
        x: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        if x.rank() != 3 || x.shape()[2] != self.input_size {
            let layout = if self.batch_first { "batch, seq" } else { "seq, batch" };
            return Err(NnError::config(
                "LSTM",
                format!("expected input [{layout}, {}], got {:?}", self.input_size, x.shape()),
            ));
        }
        // Work time-major: [T, B, I].
        let mut seq = if self.batch_first { x.transpose(0, 1)? } else { x.clone() };
        let (t_len, b) = (seq.shape()[0], seq.shape()[1]);
        let hsz = self.hidden_size;
        let nl = self.layers.len();
        if let Some((h0, c0)) = state {
            for (n, s) in [("h_0", h0), ("c_0", c0)] {
                if s.shape() != [nl, b, hsz] {
                    return Err(NnError::config(
                        "LSTM",
                        format!("{n} must be [{nl}, {b}, {hsz}], got {:?}", s.shape()),
                    ));
                }
            }
        }
        let mut h_n = Vec::with_capacity(nl);
        let mut c_n = Vec::with_capacity(nl);
        for (l, p) in self.layers.iter().enumerate() {
            let (mut h, mut c) = match state {
                Some((h0, c0)) => (h0.select(0, l as i64)?, c0.select(0, l as i64)?),
                None => {
                    let z = Tensor::zeros(&[b, hsz], x.dtype(), x.device())?;
                    (z.clone(), z)
                }
            };
            // Input projection of every step at once: [T, B, 4H].
            let xw = seq.linear(&p.weight_ih, p.bias_ih.as_ref())?;
            let mut outs = Vec::with_capacity(t_len);
            for t in 0..t_len {
                let mut gates = xw.select(0, t as i64)?.add(&h.linear(&p.weight_hh, None)?)?;
                if let Some(bh) = &p.bias_hh {
                    gates = gates.add(bh)?;
                }
                let g4 = gates.chunk(4, -1)?;
                let (i, f, g, o) = (g4[0].sigmoid()?, g4[1].sigmoid()?, g4[2].tanh()?, g4[3].sigmoid()?);
                c = f.mul(&c)?.add(&i.mul(&g)?)?;
                h = o.mul(&c.tanh()?)?;
                outs.push(h.clone());
            }
            let refs: Vec<&Tensor> = outs.iter().collect();
            seq = Tensor::stack(&refs, 0)?;
            h_n.push(h);
            c_n.push(c);
        }
        let out = if self.batch_first { seq.transpose(0, 1)? } else { seq };
        let hr: Vec<&Tensor> = h_n.iter().collect();
        let cr: Vec<&Tensor> = c_n.iter().collect();
        Ok((out, (Tensor::stack(&hr, 0)?, Tensor::stack(&cr, 0)?)))
    }
}

impl Module for LSTM {
    fn type_name(&self) -> &'static str {
        "LSTM"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward_with_state(x, None)?.0)
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut v = Vec::new();
        for (l, p) in self.layers.iter().enumerate() {
            v.push((format!("weight_ih_l{l}"), &p.weight_ih));
            v.push((format!("weight_hh_l{l}"), &p.weight_hh));
            if let (Some(bi), Some(bh)) = (&p.bias_ih, &p.bias_hh) {
                v.push((format!("bias_ih_l{l}"), bi));
                v.push((format!("bias_hh_l{l}"), bh));
            }
        }
        v
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = Vec::new();
        for (l, p) in self.layers.iter_mut().enumerate() {
            v.push((format!("weight_ih_l{l}"), &mut p.weight_ih));
            v.push((format!("weight_hh_l{l}"), &mut p.weight_hh));
            if let (Some(bi), Some(bh)) = (&mut p.bias_ih, &mut p.bias_hh) {
                v.push((format!("bias_ih_l{l}"), bi));
                v.push((format!("bias_hh_l{l}"), bh));
            }
        }
        v
    }
    training_flag!();
}
