//! Multi-head self-attention over `functional::scaled_dot_product_attention`, with PyTorch's
//! `nn.MultiheadAttention` parameter names (`in_proj_weight`, `in_proj_bias`, `out_proj.*`) and
//! a switch between the memory-efficient chunked kernel, which never materialises the L×S score
//! matrix, and the plain "math" composition, which does.

use ferrite_tensor::functional::{scaled_dot_product_attention, scaled_dot_product_attention_chunked};
use ferrite_tensor::random::with_default_generator;
use ferrite_tensor::{DType, Device, Generator, Tensor};

use crate::error::{NnError, Result};
use crate::init::{xavier_uniform_, zeros_};
use crate::layers::linear::Linear;
use crate::module::{Module, new_parameter, training_flag};

/// Which attention kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttentionBackend {
    /// `functional::scaled_dot_product_attention`: math below 257 queries, chunked above.
    #[default]
    Auto,
    /// Always the memory-efficient path, `chunk` query rows at a time (peak `chunk × S` scores;
    /// backward recomputes them from the saved log-sum-exp).
    Chunked { chunk: usize },
    /// Always the plain composition `softmax(q kᵀ·scale + mask) v`, which keeps the full
    /// `L × S` probability matrix for backward (PyTorch's math backend).
    Math,
}

/// Attention `softmax(q kᵀ·scale + mask) v` on `[.., L, E]` tensors through the chosen backend.
/// `attend_mask` is boolean (`true` = may attend — the `scaled_dot_product_attention`
/// convention, the opposite of `nn.MultiheadAttention`'s `attn_mask`) or additive float.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attend_mask: Option<&Tensor>,
    is_causal: bool,
    backend: AttentionBackend,
) -> Result<Tensor> {
    Ok(match backend {
        AttentionBackend::Auto => scaled_dot_product_attention(q, k, v, attend_mask, is_causal, None)?,
        AttentionBackend::Chunked { chunk } => {
            scaled_dot_product_attention_chunked(q, k, v, attend_mask, is_causal, None, chunk)?
        }
        AttentionBackend::Math => math_attention(q, k, v, attend_mask, is_causal)?,
    })
}

fn math_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attend_mask: Option<&Tensor>,
    is_causal: bool,
) -> ferrite_tensor::Result<Tensor> {
    if q.rank() < 2 || k.rank() < 2 {
        // Let the functional op produce its shape error.
        return scaled_dot_product_attention(q, k, v, attend_mask, is_causal, None);
    }
    let e = q.shape()[q.rank() - 1];
    let scale = 1.0 / (e as f64).sqrt();
    let mut s = q.matmul(&k.transpose(-2, -1)?)?.mul_scalar(scale)?;
    let (l, sl) = (q.shape()[q.rank() - 2], k.shape()[k.rank() - 2]);
    if is_causal {
        let rows = Tensor::arange(0.0, l as f64, 1.0, DType::I64, q.device())?.unsqueeze(1)?;
        let cols = Tensor::arange(0.0, sl as f64, 1.0, DType::I64, q.device())?.unsqueeze(0)?;
        s = s.masked_fill(&cols.gt(&rows)?, f64::NEG_INFINITY)?;
    } else if let Some(m) = attend_mask {
        s = if m.dtype() == DType::Bool { s.masked_fill(&m.logical_not()?, f64::NEG_INFINITY)? } else { s.add(m)? };
    }
    let p = s.softmax(-1)?;
    p.to_dtype(v.dtype())?.matmul(v)
}

/// Configuration of [`MultiheadAttention`].
#[derive(Clone, Debug)]
pub struct AttentionConfig {
    pub embed_dim: usize,
    pub num_heads: usize,
    /// Biases on the input and output projections.
    pub bias: bool,
    /// `forward` applies a causal mask (query i sees keys 0..=i).
    pub causal: bool,
    pub backend: AttentionBackend,
}

impl AttentionConfig {
    pub fn new(embed_dim: usize, num_heads: usize) -> AttentionConfig {
        AttentionConfig { embed_dim, num_heads, bias: true, causal: false, backend: AttentionBackend::Auto }
    }
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }
    pub fn backend(mut self, backend: AttentionBackend) -> Self {
        self.backend = backend;
        self
    }
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }
}

/// Batch-first multi-head self-attention: `x [B, L, E]` → `[B, L, E]`.
///
/// Parameters as in `nn.MultiheadAttention`: `in_proj_weight [3E, E]` (Xavier-uniform),
/// `in_proj_bias [3E]` (zeros), `out_proj.weight [E, E]` (Linear default), `out_proj.bias`
/// (zeros), so a PyTorch state dict loads unchanged. No dropout on the attention weights (the
/// chunked kernel never forms them); put `Dropout` after the block instead.
#[derive(Clone, Debug)]
pub struct MultiheadAttention {
    pub config: AttentionConfig,
    pub in_proj_weight: Tensor,
    pub in_proj_bias: Option<Tensor>,
    pub out_proj: Linear,
    training: bool,
}

impl MultiheadAttention {
    /// On the CPU, initialised from the process default generator.
    pub fn new(config: AttentionConfig) -> Result<MultiheadAttention> {
        with_default_generator(|g| MultiheadAttention::new_with(config, &Device::Cpu, g))
    }

    pub fn new_with(config: AttentionConfig, device: &Device, g: &mut Generator) -> Result<MultiheadAttention> {
        let (e, h) = (config.embed_dim, config.num_heads);
        if h == 0 || e == 0 || e % h != 0 {
            return Err(NnError::config(
                "MultiheadAttention",
                format!("embed_dim ({e}) must be a positive multiple of num_heads ({h})"),
            ));
        }
        if let AttentionBackend::Chunked { chunk: 0 } = config.backend {
            return Err(NnError::config("MultiheadAttention", "the chunked backend needs chunk > 0"));
        }
        let in_proj_weight = new_parameter(&[3 * e, e], device, |w| xavier_uniform_(w, 1.0, g))?;
        let in_proj_bias = if config.bias { Some(new_parameter(&[3 * e], device, zeros_)?) } else { None };
        let mut out_proj = Linear::new_with(e, e, config.bias, device, g)?;
        if let Some(b) = &mut out_proj.bias {
            zeros_(b)?;
        }
        Ok(MultiheadAttention { config, in_proj_weight, in_proj_bias, out_proj, training: true })
    }

    /// Self-attention with an explicit mask: boolean `true` = may attend, or additive float;
    /// broadcastable to `[B, heads, L, L]` (e.g. `[L, L]` or `[B, 1, 1, L]` for key padding).
    /// Ignores `config.causal` when a mask is given.
    pub fn forward_masked(&self, x: &Tensor, attend_mask: Option<&Tensor>) -> Result<Tensor> {
        let (e, h) = (self.config.embed_dim, self.config.num_heads);
        if x.rank() != 3 || x.shape()[2] != e {
            return Err(NnError::config(
                "MultiheadAttention",
                format!("expected input [batch, seq, {e}], got {:?}", x.shape()),
            ));
        }
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let d = e / h;
        let qkv = x.linear(&self.in_proj_weight, self.in_proj_bias.as_ref())?;
        // [B, L, 3E] -> [B, L, 3, H, D] -> [3, B, H, L, D]
        let qkv = qkv.reshape_usize(&[b, l, 3, h, d])?.permute(&[2, 0, 3, 1, 4])?;
        let (q, k, v) = (qkv.select(0, 0)?, qkv.select(0, 1)?, qkv.select(0, 2)?);
        let causal = attend_mask.is_none() && self.config.causal;
        let o = attention(&q, &k, &v, attend_mask, causal, self.config.backend)?;
        let o = o.transpose(1, 2)?.reshape_usize(&[b, l, e])?;
        self.out_proj.forward(&o)
    }
}

impl Module for MultiheadAttention {
    fn type_name(&self) -> &'static str {
        "MultiheadAttention"
    }
    /// Self-attention, causal if `config.causal`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None)
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut v = vec![("in_proj_weight".to_string(), &self.in_proj_weight)];
        if let Some(b) = &self.in_proj_bias {
            v.push(("in_proj_bias".to_string(), b));
        }
        v
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = vec![("in_proj_weight".to_string(), &mut self.in_proj_weight)];
        if let Some(b) = &mut self.in_proj_bias {
            v.push(("in_proj_bias".to_string(), b));
        }
        v
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("out_proj".to_string(), &self.out_proj)]
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![("out_proj".to_string(), &mut self.out_proj)]
    }
    training_flag!();
}
