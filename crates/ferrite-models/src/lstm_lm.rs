//! The trainer's LSTM language model: character embeddings, a stack of LSTM layers, a linear
//! head over the vocabulary (PyTorch's word-language-model example, per character).
//!
//! It is trained with truncated backpropagation through time: the hidden state of one chunk is
//! the initial state of the next, detached, so gradients flow through `--seq` steps while the
//! state carries information across the whole text — and the autograd graph, with its saved
//! activations, never grows past one chunk (the trainer's memory line shows it flat).
//! Parameter names: `encoder.weight`, `rnn.weight_ih_l0`, …, `decoder.weight`, as in that example.

use ferrite_nn::{Dropout, Embedding, LSTM, Linear, Module, RngHandle, checkpoint_multi};
use ferrite_tensor::{DType, Device, Generator, Tensor, is_grad_enabled};

/// Shape of the LSTM language model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LstmSpec {
    pub vocab: usize,
    /// Embedding width and hidden state size.
    pub hidden: usize,
    pub layers: usize,
    pub dropout: f64,
    pub checkpoint_activations: bool,
}

impl LstmSpec {
    /// Parameters the model holds; `None` when the count does not fit in 64 bits.
    pub fn num_parameters(&self) -> Option<u64> {
        let (v, h, l) = (self.vocab as u128, self.hidden as u128, self.layers as u128);
        // Each layer: weight_ih and weight_hh (4h × h), two biases (4h).
        let total = v * h + l * (2 * 4 * h * h + 2 * 4 * h) + (h * v + v);
        u64::try_from(total).ok()
    }
}

/// The hidden and cell states `[layers, batch, hidden]` carried from one chunk to the next.
pub type LstmState = (Tensor, Tensor);

/// The LSTM language model; see the module docs.
#[derive(Clone)]
pub struct LstmLm {
    encoder: Embedding,
    rnn: LSTM,
    decoder: Linear,
    drop: Dropout,
    checkpoint_activations: bool,
    training: bool,
}

/// Builds the model on `device` from `g`; its dropout draws from `dropout_rng`.
pub fn build_lstm(
    spec: &LstmSpec,
    device: &Device,
    g: &mut Generator,
    dropout_rng: &RngHandle,
) -> ferrite_nn::Result<LstmLm> {
    Ok(LstmLm {
        encoder: Embedding::new_with(spec.vocab, spec.hidden, None, device, g)?,
        rnn: LSTM::new_with(spec.hidden, spec.hidden, spec.layers, true, true, device, g)?,
        decoder: Linear::new_with(spec.hidden, spec.vocab, true, device, g)?,
        drop: Dropout::with_rng(spec.dropout, dropout_rng.clone())?,
        checkpoint_activations: spec.checkpoint_activations,
        training: true,
    })
}

impl LstmLm {
    /// The zero state for `batch` streams.
    pub fn zero_state(&self, batch: usize, device: &Device) -> ferrite_nn::Result<LstmState> {
        let cfg = self.rnn.config();
        let shape = [cfg.num_layers * cfg.num_directions(), batch, cfg.hidden_size];
        let z = Tensor::zeros(&shape, DType::F32, device)?;
        Ok((z.clone(), z))
    }

    /// One chunk: character ids `[batch, seq]` and the state before it, to logits
    /// `[batch, seq, vocab]` and the state after it (still attached to this chunk's graph; the
    /// trainer detaches it before the next chunk).
    pub fn forward_chunk(&self, ids: &Tensor, state: &LstmState) -> ferrite_nn::Result<(Tensor, LstmState)> {
        // Each child is marked as a layer for the planner's activations by layer (a no-op
        // outside a plan); dropout counts with the child whose output it drops.
        ferrite_nn::mark_layer("encoder");
        let x = self.drop.forward(&self.encoder.forward(ids)?)?;
        ferrite_nn::mark_layer("rnn");
        let (out, h, c) = if self.checkpoint_activations && is_grad_enabled() {
            // Keep only the chunk's input and state; backward recomputes the recurrence.
            let rnn = self.rnn.clone();
            let mut outs = checkpoint_multi(
                move |xs| {
                    let (out, (h, c)) = rnn.forward_with_state(&xs[0], Some((&xs[1], &xs[2])))?;
                    Ok(vec![out, h, c])
                },
                &[&x, &state.0, &state.1],
            )?;
            let c = outs.pop();
            let h = outs.pop();
            match (outs.pop(), h, c) {
                (Some(out), Some(h), Some(c)) => (out, h, c),
                _ => {
                    return Err(ferrite_nn::NnError::InvalidConfig {
                        layer: "LstmLm",
                        detail: "the checkpointed LSTM returned fewer than 3 outputs".into(),
                    });
                }
            }
        } else {
            let (out, (h, c)) = self.rnn.forward_with_state(&x, Some((&state.0, &state.1)))?;
            (out, h, c)
        };
        let out = self.drop.forward(&out)?;
        ferrite_nn::mark_layer("decoder");
        Ok((self.decoder.forward(&out)?, (h, c)))
    }
}

impl Module for LstmLm {
    fn set_activation_checkpointing(&mut self, on: bool) -> bool {
        self.checkpoint_activations = on;
        true
    }
    fn type_name(&self) -> &'static str {
        "LstmLm"
    }

    /// Character ids `[batch, seq]` from the zero state to logits `[batch, seq, vocab]`.
    fn forward(&self, ids: &Tensor) -> ferrite_nn::Result<Tensor> {
        let batch = ids.shape().first().copied().unwrap_or(0);
        Ok(self.forward_chunk(ids, &self.zero_state(batch, ids.device())?)?.0)
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("encoder".into(), &self.encoder), ("rnn".into(), &self.rnn), ("decoder".into(), &self.decoder)]
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![
            ("encoder".into(), &mut self.encoder),
            ("rnn".into(), &mut self.rnn),
            ("decoder".into(), &mut self.decoder),
        ]
    }

    fn is_training(&self) -> bool {
        self.training
    }

    fn set_own_training(&mut self, training: bool) {
        self.training = training;
        self.drop.set_own_training(training);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ckpt: bool) -> LstmSpec {
        LstmSpec { vocab: 7, hidden: 8, layers: 2, dropout: 0.0, checkpoint_activations: ckpt }
    }

    #[test]
    fn parameter_count_names_and_checkpointing() {
        let ids = Tensor::from_vec(vec![1i64, 4, 2, 6, 3, 3], &[2, 3], &Device::Cpu).unwrap();
        let run = |ckpt: bool| {
            let m = build_lstm(&spec(ckpt), &Device::Cpu, &mut Generator::new(0), &RngHandle::new(1)).unwrap();
            assert_eq!(Some(m.num_parameters() as u64), spec(ckpt).num_parameters());
            let state = m.zero_state(2, &Device::Cpu).unwrap();
            let (logits, (h, c)) = m.forward_chunk(&ids, &state).unwrap();
            assert_eq!((logits.shape(), h.shape(), c.shape()), (&[2, 3, 7][..], &[2, 2, 8][..], &[2, 2, 8][..]));
            logits.sum().unwrap().add(&h.sum().unwrap()).unwrap().backward().unwrap();
            let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
            let grads: Vec<Vec<f32>> =
                m.parameters().iter().map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()).collect();
            (names, logits.to_vec::<f32>().unwrap(), grads)
        };
        let (names, plain, plain_grads) = run(false);
        assert_eq!(names[..2], ["encoder.weight", "rnn.weight_ih_l0"]);
        assert_eq!(names[names.len() - 2..], ["decoder.weight", "decoder.bias"]);
        let (_, ckpt, ckpt_grads) = run(true);
        assert_eq!(plain, ckpt);
        for (a, b) in plain_grads.iter().zip(&ckpt_grads) {
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() <= 1e-6 * (1.0 + x.abs()), "{x} vs {y}");
            }
        }
    }
}
