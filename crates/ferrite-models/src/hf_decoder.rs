//! Hugging Face decoder-only models from their `config.json`, built as ferrite models (T5-style
//! encoder-decoders live in `t5.rs`; [`hf_workload`] picks by `model_type`).
//!
//! Two families cover GPT-2, Llama, Mistral and their relatives:
//! - GPT-2 style (`model_type: gpt2`, or `n_embd`/`n_layer`/`n_head` keys): learned positions,
//!   LayerNorm, a GELU MLP of `n_inner` (default 4×width), biases everywhere, fused QKV.
//! - Llama style (everything else: `llama`, `mistral`, …): rotary positions, RMSNorm, a SwiGLU
//!   MLP of `intermediate_size`, no biases, grouped-query attention with
//!   `num_key_value_heads` (keys and values repeated to every head, as HF's `repeat_kv`).
//!
//! Embeddings are tied when `tie_word_embeddings` says so (default: true for GPT-2, false for
//! the Llama style, as the HF config classes default). The parameter count equals the real
//! model's: GPT-2 small 124,439,808; Llama-2-7B 6,738,415,616; Mistral-7B 7,241,732,096 (tests).
use std::path::Path;

use ferrite_nn::{AttentionBackend, attention, mark_layer};
use ferrite_nn::{Embedding, GELU, LayerNorm, Linear, Module, RMSNorm, checkpoint};
use ferrite_tensor::{DType, Device, Generator, Tensor, is_grad_enabled};
use serde_json::Value;

use crate::ModelError;

/// The architecture a config describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HfStyle {
    /// Learned positions, LayerNorm, GELU MLP, biases.
    Gpt2,
    /// Rotary positions, RMSNorm, SwiGLU, no biases, grouped-query attention.
    Llama,
}

/// What the planner reads from a `config.json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HfConfig {
    pub model_type: String,
    pub style: HfStyle,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    /// Learned positions (GPT-2) or the rotary context (Llama).
    pub max_positions: usize,
    pub tie_word_embeddings: bool,
    pub norm_eps: f64,
    pub rope_theta: f64,
}

impl HfConfig {
    /// Read and check `path`.
    pub fn from_file(path: &Path) -> Result<HfConfig, ModelError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::Config {
            path: name.clone(),
            problem: format!("cannot read it ({e}); pass the config.json of a Hugging Face model"),
        })?;
        HfConfig::from_json(&text, &name)
    }

    /// Parse the text of a `config.json` (`origin` names it in errors).
    pub fn from_json(text: &str, origin: &str) -> Result<HfConfig, ModelError> {
        let err = |problem: String| ModelError::Config { path: origin.to_string(), problem };
        let v: Value = serde_json::from_str(text).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| err("expected a JSON object".into()))?;
        if crate::T5Config::describes(obj) {
            return Err(err(
                "a T5 encoder-decoder, not a decoder: read it with `T5Config` (or `hf_workload`, which picks)".into(),
            ));
        }
        let model_type = obj.get("model_type").and_then(Value::as_str).unwrap_or("").to_string();
        let style = if model_type == "gpt2" || obj.contains_key("n_embd") { HfStyle::Gpt2 } else { HfStyle::Llama };
        // The first of `keys` present, as a positive integer.
        let int = |keys: &[&str], default: Option<usize>| -> Result<usize, ModelError> {
            for k in keys {
                match obj.get(*k) {
                    None | Some(Value::Null) => continue,
                    Some(x) => {
                        return x
                            .as_u64()
                            .filter(|n| *n >= 1)
                            .and_then(|n| usize::try_from(n).ok())
                            .ok_or_else(|| err(format!("key `{k}` must be a positive integer, found {x}")));
                    }
                }
            }
            default.ok_or_else(|| err(format!("missing key `{}` (a {} config needs it)", keys[0], style.name())))
        };
        let float = |key: &str, default: f64| -> Result<f64, ModelError> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => x
                    .as_f64()
                    .filter(|f| f.is_finite() && *f > 0.0)
                    .ok_or_else(|| err(format!("key `{key}` must be a positive number, found {x}"))),
            }
        };
        let (hidden, layers, heads, positions) = match style {
            HfStyle::Gpt2 => (
                int(&["n_embd", "hidden_size"], None)?,
                int(&["n_layer", "num_hidden_layers"], None)?,
                int(&["n_head", "num_attention_heads"], None)?,
                int(&["n_positions", "max_position_embeddings"], None)?,
            ),
            HfStyle::Llama => (
                int(&["hidden_size"], None)?,
                int(&["num_hidden_layers"], None)?,
                int(&["num_attention_heads"], None)?,
                int(&["max_position_embeddings"], Some(4096))?,
            ),
        };
        let vocab = int(&["vocab_size"], None)?;
        let kv = int(&["num_key_value_heads"], Some(heads))?;
        let head_dim = match obj.get("head_dim") {
            Some(Value::Null) | None => {
                if !hidden.is_multiple_of(heads) {
                    return Err(err(format!(
                        "`num_attention_heads` ({heads}) does not divide `hidden_size` ({hidden}): each head needs hidden_size / heads dimensions"
                    )));
                }
                hidden / heads
            }
            Some(_) => int(&["head_dim"], None)?,
        };
        if !heads.is_multiple_of(kv) {
            return Err(err(format!(
                "`num_key_value_heads` ({kv}) does not divide `num_attention_heads` ({heads}): grouped-query attention shares each key/value head among heads / kv_heads query heads"
            )));
        }
        if style == HfStyle::Llama && !head_dim.is_multiple_of(2) {
            return Err(err(format!("rotary positions need an even head dimension, found {head_dim}")));
        }
        let intermediate = match style {
            HfStyle::Gpt2 => int(&["n_inner"], Some(4 * hidden))?,
            HfStyle::Llama => int(&["intermediate_size"], None)?,
        };
        let tie = match obj.get("tie_word_embeddings") {
            None | Some(Value::Null) => style == HfStyle::Gpt2,
            Some(Value::Bool(b)) => *b,
            Some(x) => return Err(err(format!("key `tie_word_embeddings` must be true or false, found {x}"))),
        };
        let eps = match style {
            HfStyle::Gpt2 => float("layer_norm_epsilon", 1e-5)?,
            HfStyle::Llama => float("rms_norm_eps", 1e-6)?,
        };
        Ok(HfConfig {
            model_type,
            style,
            vocab_size: vocab,
            hidden_size: hidden,
            num_layers: layers,
            num_heads: heads,
            num_kv_heads: kv,
            head_dim,
            intermediate_size: intermediate,
            max_positions: positions,
            tie_word_embeddings: tie,
            norm_eps: eps,
            rope_theta: float("rope_theta", 10000.0)?,
        })
    }

    /// Parameters of the model, from the shapes (the built model is checked against it).
    pub fn num_parameters(&self) -> u64 {
        let (v, h, l, i) =
            (self.vocab_size as u64, self.hidden_size as u64, self.num_layers as u64, self.intermediate_size as u64);
        let (q, kv) = ((self.num_heads * self.head_dim) as u64, (self.num_kv_heads * self.head_dim) as u64);
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        match self.style {
            HfStyle::Gpt2 => {
                let p = self.max_positions as u64;
                let block = 2 * (2 * h) + (h * 3 * q + 3 * q) + (q * h + h) + (h * i + i) + (i * h + h);
                v * h + p * h + l * block + 2 * h + head
            }
            HfStyle::Llama => {
                let block = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * i;
                v * h + l * block + h + head
            }
        }
    }
}

impl HfStyle {
    /// `GPT-2 style` or `Llama style`.
    pub fn name(self) -> &'static str {
        match self {
            HfStyle::Gpt2 => "GPT-2 style",
            HfStyle::Llama => "Llama style",
        }
    }
}

impl Decoder {
    /// The model on `device` (initialised; values do not matter on `meta`).
    pub fn new(c: &HfConfig, device: &Device, checkpoint_activations: bool) -> Result<Decoder, ModelError> {
        let mut g = Generator::new(0);
        let bias = c.style == HfStyle::Gpt2;
        let (h, q, kv) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let norm = |device: &Device| -> Result<Norm, ModelError> {
            Ok(match c.style {
                HfStyle::Gpt2 => Norm::Layer(LayerNorm::new_with(&[h], c.norm_eps, true, true, device)?),
                HfStyle::Llama => Norm::Rms(RMSNorm::with_config(&[h], Some(c.norm_eps), true, device)?),
            })
        };
        let mut blocks = Vec::with_capacity(c.num_layers);
        for _ in 0..c.num_layers {
            let attn = match c.style {
                HfStyle::Gpt2 => Attn::Fused { qkv: Linear::new_with(h, 3 * q, bias, device, &mut g)? },
                HfStyle::Llama => Attn::Split {
                    q: Linear::new_with(h, q, false, device, &mut g)?,
                    k: Linear::new_with(h, kv, false, device, &mut g)?,
                    v: Linear::new_with(h, kv, false, device, &mut g)?,
                },
            };
            let mlp = match c.style {
                HfStyle::Gpt2 => Mlp::Gelu {
                    fc: Linear::new_with(h, c.intermediate_size, true, device, &mut g)?,
                    proj: Linear::new_with(c.intermediate_size, h, true, device, &mut g)?,
                },
                HfStyle::Llama => Mlp::SwiGlu {
                    gate: Linear::new_with(h, c.intermediate_size, false, device, &mut g)?,
                    up: Linear::new_with(h, c.intermediate_size, false, device, &mut g)?,
                    down: Linear::new_with(c.intermediate_size, h, false, device, &mut g)?,
                },
            };
            blocks.push(Block {
                norm1: norm(device)?,
                attn,
                out: Linear::new_with(q, h, bias, device, &mut g)?,
                norm2: norm(device)?,
                mlp,
                heads: c.num_heads,
                kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
                rope_theta: c.rope_theta,
                rotary: c.style == HfStyle::Llama,
                training: true,
            });
        }
        let tok = Embedding::new_with(c.vocab_size, h, None, device, &mut g)?;
        let pos = match c.style {
            HfStyle::Gpt2 => Some(Embedding::new_with(c.max_positions, h, None, device, &mut g)?),
            HfStyle::Llama => None,
        };
        let head =
            if c.tie_word_embeddings { None } else { Some(Linear::new_with(h, c.vocab_size, false, device, &mut g)?) };
        Ok(Decoder { tok, pos, blocks, norm: norm(device)?, head, checkpoint_activations, training: true })
    }
}

#[derive(Clone, Debug)]
enum Norm {
    Layer(LayerNorm),
    Rms(RMSNorm),
}

impl Norm {
    fn module(&self) -> &dyn Module {
        match self {
            Norm::Layer(n) => n,
            Norm::Rms(n) => n,
        }
    }
    fn module_mut(&mut self) -> &mut dyn Module {
        match self {
            Norm::Layer(n) => n,
            Norm::Rms(n) => n,
        }
    }
}

#[derive(Clone, Debug)]
enum Attn {
    Fused { qkv: Linear },
    Split { q: Linear, k: Linear, v: Linear },
}

#[derive(Clone, Debug)]
enum Mlp {
    Gelu { fc: Linear, proj: Linear },
    SwiGlu { gate: Linear, up: Linear, down: Linear },
}

/// One pre-norm decoder block.
#[derive(Clone, Debug)]
pub struct Block {
    norm1: Norm,
    attn: Attn,
    out: Linear,
    norm2: Norm,
    mlp: Mlp,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rope_theta: f64,
    rotary: bool,
    training: bool,
}

/// `[b, s, n·d]` → `[b, n, s, d]`.
fn split_heads(x: &Tensor, n: usize, d: usize) -> ferrite_tensor::Result<Tensor> {
    let (b, s) = (x.shape()[0] as i64, x.shape()[1] as i64);
    x.reshape(&[b, s, n as i64, d as i64])?.transpose(1, 2)
}

/// cos and sin of the rotary angles, `[s, d]` (HF's `cat(freqs, freqs)` layout).
fn rotary_tables(s: usize, d: usize, theta: f64, device: &Device) -> ferrite_tensor::Result<(Tensor, Tensor)> {
    if matches!(device, Device::Meta) {
        let z = Tensor::zeros(&[s, d], DType::F32, device)?;
        return Ok((z.clone(), z));
    }
    let half = d / 2;
    let mut cos = Vec::with_capacity(s * d);
    let mut sin = Vec::with_capacity(s * d);
    for p in 0..s {
        for j in 0..d {
            let inv = theta.powf(-((2 * (j % half)) as f64) / d as f64);
            let a = p as f64 * inv;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    Ok((Tensor::from_vec(cos, &[s, d], device)?, Tensor::from_vec(sin, &[s, d], device)?))
}

/// `x·cos + rotate_half(x)·sin` with `rotate_half(x) = cat(−x₂, x₁)`.
fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> ferrite_tensor::Result<Tensor> {
    let d = x.shape()[x.rank() - 1];
    let half = d / 2;
    let x1 = x.narrow(-1, 0, half)?;
    let x2 = x.narrow(-1, half, half)?;
    let rot = Tensor::cat(&[&x2.neg()?, &x1], -1)?;
    x.mul(cos)?.add(&rot.mul(sin)?)
}

/// HF's `repeat_kv`: `[b, kv, s, d]` → `[b, kv·rep, s, d]`.
fn repeat_kv(x: &Tensor, rep: usize) -> ferrite_tensor::Result<Tensor> {
    if rep == 1 {
        return Ok(x.clone());
    }
    let s = x.shape().to_vec();
    x.unsqueeze(2)?.expand(&[s[0], s[1], rep, s[2], s[3]])?.reshape(&[
        s[0] as i64,
        (s[1] * rep) as i64,
        s[2] as i64,
        s[3] as i64,
    ])
}

impl Module for Block {
    fn type_name(&self) -> &'static str {
        "DecoderBlock"
    }

    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        let (b, s) = (x.shape()[0], x.shape()[1]);
        let h = self.norm1.module().forward(x)?;
        let (q, k, v) = match &self.attn {
            Attn::Fused { qkv } => {
                let qkv = qkv.forward(&h)?;
                let w = self.heads * self.head_dim;
                (qkv.narrow(-1, 0, w)?, qkv.narrow(-1, w, w)?, qkv.narrow(-1, 2 * w, w)?)
            }
            Attn::Split { q, k, v } => (q.forward(&h)?, k.forward(&h)?, v.forward(&h)?),
        };
        let kv_heads = if matches!(self.attn, Attn::Fused { .. }) { self.heads } else { self.kv_heads };
        let mut q = split_heads(&q, self.heads, self.head_dim)?;
        let mut k = split_heads(&k, kv_heads, self.head_dim)?;
        let v = split_heads(&v, kv_heads, self.head_dim)?;
        if self.rotary {
            let (cos, sin) = rotary_tables(s, self.head_dim, self.rope_theta, x.device())?;
            q = apply_rotary(&q, &cos, &sin)?;
            k = apply_rotary(&k, &cos, &sin)?;
        }
        let rep = self.heads / kv_heads;
        let (k, v) = (repeat_kv(&k, rep)?, repeat_kv(&v, rep)?);
        let a = attention(&q, &k, &v, None, true, AttentionBackend::Auto)?;
        let a = a.transpose(1, 2)?.reshape(&[b as i64, s as i64, (self.heads * self.head_dim) as i64])?;
        let x = x.add(&self.out.forward(&a)?)?;
        let h = self.norm2.module().forward(&x)?;
        let m = match &self.mlp {
            Mlp::Gelu { fc, proj } => proj.forward(&GELU::new().forward(&fc.forward(&h)?)?)?,
            Mlp::SwiGlu { gate, up, down } => down.forward(&gate.forward(&h)?.silu()?.mul(&up.forward(&h)?)?)?,
        };
        Ok(x.add(&m)?)
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut c: Vec<(String, &dyn Module)> = vec![("norm1".into(), self.norm1.module())];
        match &self.attn {
            Attn::Fused { qkv } => c.push(("qkv".into(), qkv)),
            Attn::Split { q, k, v } => c.extend([("q".into(), q as &dyn Module), ("k".into(), k), ("v".into(), v)]),
        }
        c.push(("out".into(), &self.out));
        c.push(("norm2".into(), self.norm2.module()));
        match &self.mlp {
            Mlp::Gelu { fc, proj } => c.extend([("fc".into(), fc as &dyn Module), ("proj".into(), proj)]),
            Mlp::SwiGlu { gate, up, down } => {
                c.extend([("gate".into(), gate as &dyn Module), ("up".into(), up), ("down".into(), down)])
            }
        }
        c
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut c: Vec<(String, &mut dyn Module)> = vec![("norm1".into(), self.norm1.module_mut())];
        match &mut self.attn {
            Attn::Fused { qkv } => c.push(("qkv".into(), qkv)),
            Attn::Split { q, k, v } => c.extend([("q".into(), q as &mut dyn Module), ("k".into(), k), ("v".into(), v)]),
        }
        c.push(("out".into(), &mut self.out));
        c.push(("norm2".into(), self.norm2.module_mut()));
        match &mut self.mlp {
            Mlp::Gelu { fc, proj } => c.extend([("fc".into(), fc as &mut dyn Module), ("proj".into(), proj)]),
            Mlp::SwiGlu { gate, up, down } => {
                c.extend([("gate".into(), gate as &mut dyn Module), ("up".into(), up), ("down".into(), down)])
            }
        }
        c
    }

    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// The decoder: embeddings, blocks, final norm, head (or the tied embedding).
#[derive(Clone, Debug)]
pub struct Decoder {
    tok: Embedding,
    pos: Option<Embedding>,
    blocks: Vec<Block>,
    norm: Norm,
    head: Option<Linear>,
    checkpoint_activations: bool,
    training: bool,
}

impl Module for Decoder {
    fn type_name(&self) -> &'static str {
        "Decoder"
    }

    /// Token ids `[batch, seq]` to logits `[batch, seq, vocab]`.
    fn forward(&self, ids: &Tensor) -> ferrite_nn::Result<Tensor> {
        let mut h = self.tok.forward(ids)?;
        if let Some(pos) = &self.pos {
            let s = ids.shape().get(1).copied().unwrap_or(0);
            let positions = Tensor::arange(0.0, s as f64, 1.0, DType::I64, ids.device())?;
            h = h.add(&pos.forward(&positions)?)?;
        }
        for (i, block) in self.blocks.iter().enumerate() {
            mark_layer(&format!("layers.{i}"));
            h = if self.checkpoint_activations && is_grad_enabled() {
                let b = block.clone();
                checkpoint(move |xs| b.forward(&xs[0]), &[&h])?
            } else {
                block.forward(&h)?
            };
        }
        mark_layer("final norm and head");
        let h = self.norm.module().forward(&h)?;
        match &self.head {
            Some(head) => head.forward(&h),
            None => Ok(h.matmul(&self.tok.weight.t()?)?),
        }
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut c: Vec<(String, &dyn Module)> = vec![("tok".into(), &self.tok)];
        if let Some(p) = &self.pos {
            c.push(("pos".into(), p));
        }
        c.extend(self.blocks.iter().enumerate().map(|(i, b)| (format!("layers.{i}"), b as &dyn Module)));
        c.push(("norm".into(), self.norm.module()));
        if let Some(h) = &self.head {
            c.push(("head".into(), h));
        }
        c
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut c: Vec<(String, &mut dyn Module)> = vec![("tok".into(), &mut self.tok)];
        if let Some(p) = &mut self.pos {
            c.push(("pos".into(), p));
        }
        c.extend(self.blocks.iter_mut().enumerate().map(|(i, b)| (format!("layers.{i}"), b as &mut dyn Module)));
        c.push(("norm".into(), self.norm.module_mut()));
        if let Some(h) = &mut self.head {
            c.push(("head".into(), h));
        }
        c
    }

    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}
