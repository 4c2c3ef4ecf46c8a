//! A pre-norm transformer block, x + Attn(LN(x)) then x + MLP(LN(x)), laid out as PyTorch's
//! `nn.TransformerEncoderLayer(norm_first=True, activation="gelu", batch_first=True)` so their
//! state dicts share key names.

use ferrite_tensor::random::with_default_generator;
use ferrite_tensor::{Device, Generator, Tensor};

use crate::error::{NnError, Result};
use crate::layers::activation::GELU;
use crate::layers::attention::{AttentionBackend, AttentionConfig, MultiheadAttention};
use crate::layers::dropout::Dropout;
use crate::layers::layer_norm::LayerNorm;
use crate::layers::linear::Linear;
use crate::module::{Module, training_flag};

/// Configuration of [`TransformerBlock`] (PyTorch's defaults: feed-forward 2048, dropout 0.1,
/// eps 1e-5).
#[derive(Clone, Debug)]
pub struct TransformerConfig {
    pub d_model: usize,
    pub nhead: usize,
    pub dim_feedforward: usize,
    pub dropout: f64,
    pub layer_norm_eps: f64,
    pub causal: bool,
    pub attention_backend: AttentionBackend,
}

impl TransformerConfig {
    pub fn new(d_model: usize, nhead: usize) -> TransformerConfig {
        TransformerConfig {
            d_model,
            nhead,
            dim_feedforward: 2048,
            dropout: 0.1,
            layer_norm_eps: 1e-5,
            causal: false,
            attention_backend: AttentionBackend::Auto,
        }
    }
    pub fn dim_feedforward(mut self, d: usize) -> Self {
        self.dim_feedforward = d;
        self
    }
    pub fn dropout(mut self, p: f64) -> Self {
        self.dropout = p;
        self
    }
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }
    pub fn attention_backend(mut self, b: AttentionBackend) -> Self {
        self.attention_backend = b;
        self
    }
}

/// Pre-norm block on `x [B, L, d_model]`:
/// `x = x + dropout1(self_attn(norm1(x)))`, `x = x + dropout2(linear2(dropout(gelu(linear1(norm2(x))))))`.
#[derive(Clone, Debug)]
pub struct TransformerBlock {
    pub self_attn: MultiheadAttention,
    pub linear1: Linear,
    pub dropout: Dropout,
    pub linear2: Linear,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
    pub dropout1: Dropout,
    pub dropout2: Dropout,
    pub activation: GELU,
    training: bool,
}

impl TransformerBlock {
    /// On the CPU, initialised from the process default generator.
    pub fn new(config: TransformerConfig) -> Result<TransformerBlock> {
        with_default_generator(|g| TransformerBlock::new_with(config, &Device::Cpu, g))
    }

    pub fn new_with(config: TransformerConfig, device: &Device, g: &mut Generator) -> Result<TransformerBlock> {
        if config.dim_feedforward == 0 {
            return Err(NnError::config("TransformerBlock", "dim_feedforward must be positive"));
        }
        let d = config.d_model;
        let attn_cfg = AttentionConfig::new(d, config.nhead).causal(config.causal).backend(config.attention_backend);
        Ok(TransformerBlock {
            self_attn: MultiheadAttention::new_with(attn_cfg, device, g)?,
            linear1: Linear::new_with(d, config.dim_feedforward, true, device, g)?,
            dropout: Dropout::new_with(config.dropout, g)?,
            linear2: Linear::new_with(config.dim_feedforward, d, true, device, g)?,
            norm1: LayerNorm::new_with(&[d], config.layer_norm_eps, true, true, device)?,
            norm2: LayerNorm::new_with(&[d], config.layer_norm_eps, true, true, device)?,
            dropout1: Dropout::new_with(config.dropout, g)?,
            dropout2: Dropout::new_with(config.dropout, g)?,
            activation: GELU::new(),
            training: true,
        })
    }

    /// The block with an explicit attention mask (see [`MultiheadAttention::forward_masked`]).
    pub fn forward_masked(&self, x: &Tensor, attend_mask: Option<&Tensor>) -> Result<Tensor> {
        let a = self.self_attn.forward_masked(&self.norm1.forward(x)?, attend_mask)?;
        let x = x.add(&self.dropout1.forward(&a)?)?;
        let h = self.activation.forward(&self.linear1.forward(&self.norm2.forward(&x)?)?)?;
        let f = self.linear2.forward(&self.dropout.forward(&h)?)?;
        Ok(x.add(&self.dropout2.forward(&f)?)?)
    }
}

impl Module for TransformerBlock {
    fn type_name(&self) -> &'static str {
        "TransformerBlock"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None)
    }
    // PyTorch's registration order: self_attn, linear1, dropout, linear2, norm1, norm2,
    // dropout1, dropout2 (the activation is a plain function there, so it is not listed).
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![
            ("self_attn".into(), &self.self_attn),
            ("linear1".into(), &self.linear1),
            ("dropout".into(), &self.dropout),
            ("linear2".into(), &self.linear2),
            ("norm1".into(), &self.norm1),
            ("norm2".into(), &self.norm2),
            ("dropout1".into(), &self.dropout1),
            ("dropout2".into(), &self.dropout2),
        ]
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![
            ("self_attn".into(), &mut self.self_attn),
            ("linear1".into(), &mut self.linear1),
            ("dropout".into(), &mut self.dropout),
            ("linear2".into(), &mut self.linear2),
            ("norm1".into(), &mut self.norm1),
            ("norm2".into(), &mut self.norm2),
            ("dropout1".into(), &mut self.dropout1),
            ("dropout2".into(), &mut self.dropout2),
        ]
    }
    training_flag!();
}
