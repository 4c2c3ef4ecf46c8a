//! The trainer's decoder-only transformer: character embeddings plus learned positions, causal
//! pre-norm blocks, a final layer norm and a linear head over the vocabulary (GPT's layout).
//!
//! Parameter names follow a minimal GPT in PyTorch (`tok_emb.weight`, `pos_emb.weight`,
//! `blocks.0.self_attn.in_proj_weight`, …, `norm.weight`, `head.weight`), each block with
//! `nn.TransformerEncoderLayer(norm_first=True)`'s names, so the weights load into such a model.
//! Every dropout draws from the trainer's one dropout generator, so a resumed run continues the
//! same random stream.

use ferrite_nn::{
    Dropout, Embedding, LayerNorm, Linear, Module, RngHandle, TransformerBlock, TransformerConfig, checkpoint,
};
use ferrite_tensor::{DType, Device, Generator, Tensor, is_grad_enabled};

/// Shape of the transformer language model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransformerSpec {
    pub vocab: usize,
    pub d_model: usize,
    pub heads: usize,
    pub layers: usize,
    /// Longest context (learned positions).
    pub seq: usize,
    pub dropout: f64,
    pub checkpoint_activations: bool,
}

impl TransformerSpec {
    /// Feed-forward width: four times the model width, as in GPT.
    pub fn feedforward(&self) -> usize {
        4 * self.d_model
    }

    /// Parameters the model holds; `None` when the count does not fit in 64 bits.
    pub fn num_parameters(&self) -> Option<u64> {
        let (v, d, l, s, f) = (
            self.vocab as u128,
            self.d_model as u128,
            self.layers as u128,
            self.seq as u128,
            self.feedforward() as u128,
        );
        // Attention: in_proj (3d×d + 3d) and out_proj (d×d + d); MLP: d×f + f and f×d + d; two
        // layer norms (2d each).
        let block = (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 4 * d;
        let total = v * d + s * d + l * block + 2 * d + (d * v + v);
        u64::try_from(total).ok()
    }
}

/// The decoder-only transformer language model; see the module docs.
#[derive(Clone)]
pub struct TransformerLm {
    tok_emb: Embedding,
    pos_emb: Embedding,
    blocks: Vec<TransformerBlock>,
    norm: LayerNorm,
    head: Linear,
    checkpoint_activations: bool,
    training: bool,
}

/// Builds the model on `device` from `g`; its dropouts draw from `dropout_rng`.
pub fn build_transformer(
    spec: &TransformerSpec,
    device: &Device,
    g: &mut Generator,
    dropout_rng: &RngHandle,
) -> ferrite_nn::Result<TransformerLm> {
    let config = TransformerConfig::new(spec.d_model, spec.heads)
        .dim_feedforward(spec.feedforward())
        .dropout(spec.dropout)
        .causal(true);
    let tok_emb = Embedding::new_with(spec.vocab, spec.d_model, None, device, g)?;
    let pos_emb = Embedding::new_with(spec.seq, spec.d_model, None, device, g)?;
    let mut blocks = Vec::with_capacity(spec.layers);
    for _ in 0..spec.layers {
        let mut b = TransformerBlock::new_with(config.clone(), device, g)?;
        for d in [&mut b.dropout, &mut b.dropout1, &mut b.dropout2] {
            *d = Dropout::with_rng(spec.dropout, dropout_rng.clone())?;
        }
        blocks.push(b);
    }
    let norm = LayerNorm::new_with(&[spec.d_model], 1e-5, true, true, device)?;
    let head = Linear::new_with(spec.d_model, spec.vocab, true, device, g)?;
    Ok(TransformerLm {
        tok_emb,
        pos_emb,
        blocks,
        norm,
        head,
        checkpoint_activations: spec.checkpoint_activations,
        training: true,
    })
}

impl TransformerLm {
    /// Longest context the learned positions cover.
    pub fn context(&self) -> usize {
        self.pos_emb.weight.shape()[0]
    }
}

impl Module for TransformerLm {
    fn set_activation_checkpointing(&mut self, on: bool) -> bool {
        self.checkpoint_activations = on;
        true
    }
    fn type_name(&self) -> &'static str {
        "TransformerLm"
    }

    /// Character ids `[batch, seq]` (int64) to next-character logits `[batch, seq, vocab]`.
    fn forward(&self, ids: &Tensor) -> ferrite_nn::Result<Tensor> {
        let seq = ids.shape().get(1).copied().unwrap_or(0);
        if ids.rank() != 2 || seq == 0 || seq > self.context() {
            return Err(ferrite_nn::NnError::InvalidConfig {
                layer: "TransformerLm",
                detail: format!(
                    "expected character ids [batch, seq] with 1 <= seq <= {}, got {:?}",
                    self.context(),
                    ids.shape()
                ),
            });
        }
        let positions = Tensor::arange(0.0, seq as f64, 1.0, DType::I64, ids.device())?;
        let mut h = self.tok_emb.forward(ids)?.add(&self.pos_emb.forward(&positions)?)?;
        for (i, block) in self.blocks.iter().enumerate() {
            // Names the activations of this block in a `ferrite plan` (a no-op outside a plan).
            ferrite_nn::mark_layer(&format!("blocks.{i}"));
            h = if self.checkpoint_activations && is_grad_enabled() {
                let b = block.clone();
                checkpoint(move |xs| b.forward(&xs[0]), &[&h])?
            } else {
                block.forward(&h)?
            };
        }
        ferrite_nn::mark_layer("norm and head");
        self.head.forward(&self.norm.forward(&h)?)
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut c: Vec<(String, &dyn Module)> =
            vec![("tok_emb".into(), &self.tok_emb), ("pos_emb".into(), &self.pos_emb)];
        c.extend(self.blocks.iter().enumerate().map(|(i, b)| (format!("blocks.{i}"), b as &dyn Module)));
        c.push(("norm".into(), &self.norm));
        c.push(("head".into(), &self.head));
        c
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut c: Vec<(String, &mut dyn Module)> =
            vec![("tok_emb".into(), &mut self.tok_emb), ("pos_emb".into(), &mut self.pos_emb)];
        c.extend(self.blocks.iter_mut().enumerate().map(|(i, b)| (format!("blocks.{i}"), b as &mut dyn Module)));
        c.push(("norm".into(), &mut self.norm));
        c.push(("head".into(), &mut self.head));
        c
    }

    fn is_training(&self) -> bool {
        self.training
    }

    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TransformerSpec {
        TransformerSpec {
            vocab: 11,
            d_model: 16,
            heads: 4,
            layers: 2,
            seq: 8,
            dropout: 0.0,
            checkpoint_activations: false,
        }
    }

    #[test]
    fn parameter_count_and_names_match_the_gpt_layout() {
        let m = build_transformer(&spec(), &Device::Cpu, &mut Generator::new(0), &RngHandle::new(1)).unwrap();
        assert_eq!(Some(m.num_parameters() as u64), spec().num_parameters());
        let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[..3], ["tok_emb.weight", "pos_emb.weight", "blocks.0.self_attn.in_proj_weight"]);
        assert_eq!(names[names.len() - 2..], ["head.weight", "head.bias"]);
    }

    #[test]
    fn logits_are_causal_and_checkpointing_changes_no_gradient() {
        let ids = Tensor::from_vec(vec![1i64, 4, 2, 7, 3, 3, 0, 9], &[2, 4], &Device::Cpu).unwrap();
        let run = |ckpt: bool| {
            let s = TransformerSpec { checkpoint_activations: ckpt, ..spec() };
            let m = build_transformer(&s, &Device::Cpu, &mut Generator::new(0), &RngHandle::new(1)).unwrap();
            let logits = m.forward(&ids).unwrap();
            logits.sum().unwrap().backward().unwrap();
            let grads: Vec<Vec<f32>> =
                m.parameters().iter().map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()).collect();
            (logits.to_vec::<f32>().unwrap(), grads)
        };
        let (plain, plain_grads) = run(false);
        let (ckpt, ckpt_grads) = run(true);
        assert_eq!(plain, ckpt);
        assert_eq!(plain_grads, ckpt_grads);
        // Changing the last character changes no earlier position's logits.
        let m = build_transformer(&spec(), &Device::Cpu, &mut Generator::new(0), &RngHandle::new(1)).unwrap();
        let other = Tensor::from_vec(vec![1i64, 4, 2, 5, 3, 3, 0, 9], &[2, 4], &Device::Cpu).unwrap();
        let (a, b) =
            (m.forward(&ids).unwrap().to_vec::<f32>().unwrap(), m.forward(&other).unwrap().to_vec::<f32>().unwrap());
        let v = 11;
        assert_eq!(a[..3 * v], b[..3 * v]);
        assert_ne!(a[3 * v..4 * v], b[3 * v..4 * v]);
        assert!(m.forward(&Tensor::zeros(&[1, 9], DType::I64, &Device::Cpu).unwrap()).is_err());
    }
}
