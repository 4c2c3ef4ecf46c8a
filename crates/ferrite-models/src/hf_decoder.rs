//! Hugging Face decoder-only models from their `config.json`, built as ferrite models with the
//! Hugging Face parameter names, so a checkpoint goes in and out of HF files without renaming
//! (T5-style encoder-decoders live in `t5.rs`; HF folders are read in `hf_folder.rs`).
//!
//! Two families cover GPT-2, Llama, Mistral and Qwen2:
//! - GPT-2 style (`model_type: gpt2`): learned positions, LayerNorm (`layer_norm_epsilon`), an
//!   MLP of `n_inner` (default 4×width) with `activation_function` (default `gelu_new`, the tanh
//!   GELU), fused QKV, biases everywhere, `Conv1D` weights stored `[in, out]`, tied head.
//!   Names: `transformer.wte.weight`, `transformer.h.0.attn.c_attn.weight`, …, `transformer.ln_f.*`.
//! - Llama style (`llama`, `mistral`, `qwen2`): rotary positions (`rope_theta`, `rope_scaling` of
//!   type `linear`, `dynamic` or `llama3`), RMSNorm, a gated MLP of `intermediate_size` with
//!   `hidden_act` (default SiLU: SwiGLU), grouped-query attention with `num_key_value_heads`
//!   (keys and values repeated to every head, as HF's `repeat_kv`), `head_dim`. Llama reads
//!   `attention_bias` and `mlp_bias`; Qwen2 has q/k/v biases; Mistral attends within
//!   `sliding_window` when set. Names: `model.embed_tokens.weight`,
//!   `model.layers.0.self_attn.q_proj.weight`, …, `model.norm.weight`, `lm_head.weight`.
//!
//! Embeddings are tied when `tie_word_embeddings` says so (default: true for GPT-2, false for
//! the Llama style, as the HF config classes default); a tied head is the embedding itself and has
//! no `lm_head.weight` of its own (stored once). An unknown `model_type` or an option ferrite does
//! not build is an error naming the key and the value, never a silently different model; sizes
//! are checked against `limits.rs` before anything is built. The parameter count equals the real
//! model's: GPT-2 small 124,439,808; Llama-2-7B 6,738,415,616; Mistral-7B 7,241,732,096 (tests).
//!
//! Each block announces itself with `mark_layer` under its HF module name (`transformer.h.3`,
//! `model.layers.3`) for the planner's activations-by-layer breakdown.
use std::path::Path;
use std::sync::Arc;

use ferrite_nn::{AttentionBackend, attention, mark_layer};
use ferrite_nn::{Embedding, LayerNorm, Linear, Module, RMSNorm, RngHandle, checkpoint};
use ferrite_tensor::{DType, Device, Generator, Tensor, is_grad_enabled};
use serde_json::{Map, Value};

use crate::ModelError;
use crate::conv1d::Conv1D;
use crate::limits::{Checked, MAX_SIZE, check_parameters, check_size, limit_of, n};

/// The architecture a config describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HfStyle {
    /// Learned positions, LayerNorm, GELU MLP, biases, `Conv1D` weights.
    Gpt2,
    /// Rotary positions, RMSNorm, gated MLP, grouped-query attention.
    Llama,
}

/// The MLP's activation (`activation_function` for GPT-2, `hidden_act` for the Llama style).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HfActivation {
    /// `gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`: 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))).
    GeluTanh,
    /// `gelu`: the exact error-function GELU.
    Gelu,
    /// `relu`.
    Relu,
    /// `silu` / `swish`.
    Silu,
}

impl HfActivation {
    fn parse(name: &str) -> Option<HfActivation> {
        Some(match name {
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => HfActivation::GeluTanh,
            "gelu" => HfActivation::Gelu,
            "relu" => HfActivation::Relu,
            "silu" | "swish" => HfActivation::Silu,
            _ => return None,
        })
    }

    fn apply(self, x: &Tensor) -> ferrite_tensor::Result<Tensor> {
        match self {
            HfActivation::GeluTanh => x.gelu_tanh(),
            HfActivation::Gelu => x.gelu(),
            HfActivation::Relu => x.relu(),
            HfActivation::Silu => x.silu(),
        }
    }
}

/// `rope_scaling` of a Llama-style config: how the rotary frequencies stretch beyond the context
/// the model was trained on (HF's `ROPE_INIT_FUNCTIONS`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "rope_type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Positions divided by `factor` (every frequency / factor).
    Linear { factor: f64 },
    /// NTK-aware: past `max_position_embeddings`, the base grows with the sequence length.
    Dynamic { factor: f64 },
    /// Llama 3.1: low frequencies / factor, high ones kept, a smooth ramp between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
}

/// What a decoder's `config.json` says, checked.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HfConfig {
    /// `gpt2`, `llama`, `mistral`, `qwen2` (empty when the file has none: then `n_embd` means GPT-2).
    pub model_type: String,
    pub style: HfStyle,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    /// Learned positions (GPT-2) or the rotary context (Llama style; `dynamic` scaling starts past it).
    pub max_positions: usize,
    pub tie_word_embeddings: bool,
    pub norm_eps: f64,
    pub activation: HfActivation,
    /// Biases on the q, k and v projections (GPT-2: always; Llama: `attention_bias`; Qwen2: always).
    pub qkv_bias: bool,
    /// A bias on the attention's output projection (GPT-2: always; Llama: `attention_bias`).
    pub out_bias: bool,
    /// Biases in the MLP (GPT-2: always; Llama: `mlp_bias`).
    pub mlp_bias: bool,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    /// Each query attends to at most this many keys, itself included (Mistral's `sliding_window`).
    pub sliding_window: Option<usize>,
    /// Dropout on the attention probabilities in training (GPT-2's `attn_pdrop`, default 0.1;
    /// the Llama style's `attention_dropout`, default 0).
    pub attention_dropout: f64,
    /// Dropout on each block's attention and MLP outputs before the residual add (GPT-2's
    /// `resid_pdrop`, default 0.1; none in the Llama style).
    pub residual_dropout: f64,
    /// Dropout on the embeddings (GPT-2's `embd_pdrop`, default 0.1; none in the Llama style).
    pub embedding_dropout: f64,
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

    /// Parse and check the text of a `config.json` (`origin` names it in errors).
    pub fn from_json(text: &str, origin: &str) -> Result<HfConfig, ModelError> {
        let err = |problem: String| ModelError::Config { path: origin.to_string(), problem };
        let v: Value = serde_json::from_str(text).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| err("expected a JSON object".into()))?;
        if crate::T5Config::describes(obj) {
            return Err(err(
                "a T5 encoder-decoder, not a decoder: read it with `T5Config` (or `hf_workload`, which picks)".into(),
            ));
        }
        let r = Reader { obj, origin };
        let model_type = r.string("model_type", "")?;
        let style = match model_type.as_str() {
            "gpt2" => HfStyle::Gpt2,
            "llama" | "mistral" | "qwen2" => HfStyle::Llama,
            "" if obj.contains_key("n_embd") => HfStyle::Gpt2,
            "" => HfStyle::Llama,
            other => {
                return Err(err(format!(
                    "`model_type` is `{other}`; ferrite builds the decoders gpt2, llama, mistral and qwen2 (and t5, mt5, umt5 as encoder-decoders)"
                )));
            }
        };
        let (hidden, layers, heads, positions) = match style {
            HfStyle::Gpt2 => (
                r.int(&["n_embd", "hidden_size"], None)?,
                r.int(&["n_layer", "num_hidden_layers"], None)?,
                r.int(&["n_head", "num_attention_heads"], None)?,
                r.int(&["n_positions", "max_position_embeddings"], None)?,
            ),
            HfStyle::Llama => {
                // The HF config classes' defaults.
                let default_positions = match model_type.as_str() {
                    "mistral" => 131_072,
                    "qwen2" => 32_768,
                    _ => 2048,
                };
                (
                    r.int(&["hidden_size"], None)?,
                    r.int(&["num_hidden_layers"], None)?,
                    r.int(&["num_attention_heads"], None)?,
                    r.int(&["max_position_embeddings"], Some(default_positions))?,
                )
            }
        };
        let vocab = r.int(&["vocab_size"], None)?;
        let kv = match style {
            HfStyle::Gpt2 => heads,
            HfStyle::Llama => r.int(&["num_key_value_heads"], Some(heads))?,
        };
        let head_dim = match (style, obj.get("head_dim")) {
            (HfStyle::Llama, Some(x)) if !x.is_null() => r.int(&["head_dim"], None)?,
            _ => {
                if !hidden.is_multiple_of(heads) {
                    return Err(err(format!(
                        "`num_attention_heads` ({heads}) does not divide `hidden_size` ({hidden}): each head needs hidden_size / heads dimensions"
                    )));
                }
                hidden / heads
            }
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
            HfStyle::Gpt2 => {
                let four = (n(4) * n(hidden)).0.unwrap_or(u64::MAX);
                let four = check_size(origin, "n_inner (4 × n_embd by default)", four, MAX_SIZE)?;
                r.int(&["n_inner"], Some(four))?
            }
            HfStyle::Llama => r.int(&["intermediate_size"], None)?,
        };
        let tie = r.boolean("tie_word_embeddings", style == HfStyle::Gpt2)?;
        let (eps, activation) = match style {
            HfStyle::Gpt2 => (r.float("layer_norm_epsilon", 1e-5)?, r.activation("activation_function", "gelu_new")?),
            HfStyle::Llama => (r.float("rms_norm_eps", 1e-6)?, r.activation("hidden_act", "silu")?),
        };
        let (qkv_bias, out_bias, mlp_bias) = match model_type.as_str() {
            "gpt2" | "" if style == HfStyle::Gpt2 => (true, true, true),
            "qwen2" => (true, false, false),
            // HF's Mistral has no bias options.
            "mistral" => (false, false, false),
            _ => {
                let attn = r.boolean("attention_bias", false)?;
                (attn, attn, r.boolean("mlp_bias", false)?)
            }
        };
        let (sliding_window, (rope_theta, rope_scaling)) = match style {
            HfStyle::Gpt2 => {
                r.refuse_true("scale_attn_by_inverse_layer_idx", "scales attention per layer")?;
                r.refuse_true("add_cross_attention", "adds cross-attention to an encoder")?;
                if !r.boolean("scale_attn_weights", true)? {
                    return Err(err(
                        "`scale_attn_weights` is false; ferrite builds GPT-2 attention scaled by 1/√head_dim".into(),
                    ));
                }
                (None, (r.float("rope_theta", 10000.0)?, None))
            }
            HfStyle::Llama => {
                let window = match model_type.as_str() {
                    "mistral" => r.optional_int("sliding_window")?,
                    "qwen2" if r.boolean("use_sliding_window", false)? => {
                        return Err(err(
                            "`use_sliding_window` is true; ferrite builds Qwen2 with full attention in every layer (its per-layer `max_window_layers` window is not supported)".into(),
                        ));
                    }
                    _ => None,
                };
                (window, r.rope()?)
            }
        };
        let (attention_dropout, residual_dropout, embedding_dropout) = match style {
            HfStyle::Gpt2 => (
                r.probability("attn_pdrop", 0.1)?,
                r.probability("resid_pdrop", 0.1)?,
                r.probability("embd_pdrop", 0.1)?,
            ),
            HfStyle::Llama => (r.probability("attention_dropout", 0.0)?, 0.0, 0.0),
        };
        let c = HfConfig {
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
            activation,
            qkv_bias,
            out_bias,
            mlp_bias,
            rope_theta,
            rope_scaling,
            sliding_window,
            attention_dropout,
            residual_dropout,
            embedding_dropout,
        };
        c.check(origin)?;
        Ok(c)
    }

    /// Every size within `limits.rs` and the parameter count within
    /// [`MAX_PARAMETERS`](crate::limits::MAX_PARAMETERS), computed with checked arithmetic;
    /// returns the count. [`HfConfig::from_json`] and [`Decoder::new`] call it (the fields are
    /// public, so a config built by hand is checked too).
    pub fn check(&self, origin: &str) -> Result<u64, ModelError> {
        let sizes = [
            ("num_hidden_layers", self.num_layers),
            ("hidden_size", self.hidden_size),
            ("vocab_size", self.vocab_size),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_positions),
        ];
        for (key, v) in sizes {
            check_size(origin, key, v as u64, limit_of(key))?;
            if v == 0 {
                return Err(ModelError::Config {
                    path: origin.into(),
                    problem: format!("`{key}` is 0; it must be a positive integer"),
                });
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(ModelError::Config {
                path: origin.into(),
                problem: format!(
                    "`num_key_value_heads` ({}) does not divide `num_attention_heads` ({})",
                    self.num_kv_heads, self.num_heads
                ),
            });
        }
        check_size(
            origin,
            "num_attention_heads × head_dim",
            (n(self.num_heads) * n(self.head_dim)).0.unwrap_or(u64::MAX),
            MAX_SIZE,
        )?;
        check_parameters(
            origin,
            self.num_parameters(),
            "vocab_size, hidden_size, num_hidden_layers, intermediate_size (the parameter count)",
        )
    }

    /// Parameters of the model, from the shapes (the built model is checked against it); `None`
    /// when the count overflows `u64`.
    pub fn num_parameters(&self) -> Option<u64> {
        let (v, h, l, i) = (n(self.vocab_size), n(self.hidden_size), n(self.num_layers), n(self.intermediate_size));
        let (q, kv) = (n(self.num_heads) * n(self.head_dim), n(self.num_kv_heads) * n(self.head_dim));
        let zero = n(0);
        let on = |b: bool, x: Checked| if b { x } else { zero };
        let head = on(!self.tie_word_embeddings, v * h);
        let total = match self.style {
            HfStyle::Gpt2 => {
                let p = n(self.max_positions);
                let block = n(4) * h + (h * n(3) * q + n(3) * q) + (q * h + h) + (h * i + i) + (i * h + h);
                v * h + p * h + l * block + n(2) * h + head
            }
            HfStyle::Llama => {
                let attn = h * q + n(2) * h * kv + q * h + on(self.qkv_bias, q + n(2) * kv) + on(self.out_bias, h);
                let mlp = n(3) * h * i + on(self.mlp_bias, n(2) * i + h);
                let block = n(2) * h + attn + mlp;
                v * h + l * block + h + head
            }
        };
        total.0
    }

    /// `transformer` (GPT-2) or `model` (Llama style): the prefix of every name but `lm_head`.
    pub fn base_model_prefix(&self) -> &'static str {
        match self.style {
            HfStyle::Gpt2 => "transformer",
            HfStyle::Llama => "model",
        }
    }
}

/// Typed reads of one config object; each error names the key and the value found.
struct Reader<'a> {
    obj: &'a Map<String, Value>,
    origin: &'a str,
}

impl Reader<'_> {
    fn err(&self, problem: String) -> ModelError {
        ModelError::Config { path: self.origin.to_string(), problem }
    }

    fn present(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// The first of `keys` present, as a positive integer within its limit.
    fn int(&self, keys: &[&str], default: Option<usize>) -> Result<usize, ModelError> {
        for k in keys {
            if let Some(x) = self.present(k) {
                let v = x
                    .as_u64()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| self.err(format!("key `{k}` must be a positive integer, found {x}")))?;
                return check_size(self.origin, k, v, limit_of(k));
            }
        }
        default.ok_or_else(|| self.err(format!("missing key `{}` (the model needs it)", keys[0])))
    }

    fn optional_int(&self, key: &str) -> Result<Option<usize>, ModelError> {
        match self.present(key) {
            None => Ok(None),
            Some(_) => self.int(&[key], None).map(Some),
        }
    }

    fn float(&self, key: &str, default: f64) -> Result<f64, ModelError> {
        self.float_in(self.obj, key, default)
    }

    fn float_in(&self, obj: &Map<String, Value>, key: &str, default: f64) -> Result<f64, ModelError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x
                .as_f64()
                .filter(|f| f.is_finite() && *f > 0.0)
                .ok_or_else(|| self.err(format!("key `{key}` must be a positive number, found {x}"))),
        }
    }

    /// A dropout probability in `[0, 1)`.
    fn probability(&self, key: &str, default: f64) -> Result<f64, ModelError> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x
                .as_f64()
                .filter(|p| (0.0..1.0).contains(p))
                .ok_or_else(|| self.err(format!("key `{key}` must be a dropout probability in [0, 1), found {x}"))),
        }
    }

    fn boolean(&self, key: &str, default: bool) -> Result<bool, ModelError> {
        match self.present(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(x) => Err(self.err(format!("key `{key}` must be true or false, found {x}"))),
        }
    }

    fn refuse_true(&self, key: &str, what: &str) -> Result<(), ModelError> {
        if self.boolean(key, false)? {
            return Err(self.err(format!("`{key}` is true (it {what}); ferrite does not build that option")));
        }
        Ok(())
    }

    fn string(&self, key: &str, default: &str) -> Result<String, ModelError> {
        match self.present(key) {
            None => Ok(default.to_string()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(x) => Err(self.err(format!("key `{key}` must be a string, found {x}"))),
        }
    }

    fn activation(&self, key: &str, default: &str) -> Result<HfActivation, ModelError> {
        let name = self.string(key, default)?;
        HfActivation::parse(&name).ok_or_else(|| {
            self.err(format!(
                "`{key}` is `{name}`; ferrite builds gelu_new, gelu_pytorch_tanh, gelu_fast, gelu, relu, silu and swish"
            ))
        })
    }

    /// `rope_theta` and the scaling: transformers 5 writes both in `rope_parameters`
    /// (`{"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, …}`), transformers 4 as
    /// `rope_theta` and `rope_scaling`.
    fn rope(&self) -> Result<(f64, Option<RopeScaling>), ModelError> {
        let theta = self.float("rope_theta", 10000.0)?;
        if let Some(x) = self.present("rope_parameters") {
            let Some(p) = x.as_object() else {
                return Err(self.err(format!("key `rope_parameters` must be an object, found {x}")));
            };
            return Ok((self.float_in(p, "rope_theta", theta)?, self.rope_scaling("rope_parameters", p)?));
        }
        match self.present("rope_scaling") {
            None => Ok((theta, None)),
            Some(Value::Object(s)) => Ok((theta, self.rope_scaling("rope_scaling", s)?)),
            Some(x) => Err(self.err(format!("key `rope_scaling` must be an object or null, found {x}"))),
        }
    }

    fn rope_scaling(&self, key: &str, s: &Map<String, Value>) -> Result<Option<RopeScaling>, ModelError> {
        let kind = match s.get("rope_type").or_else(|| s.get("type")) {
            Some(Value::String(t)) => t.as_str(),
            Some(other) => return Err(self.err(format!("`{key}.rope_type` must be a string, found {other}"))),
            None if key == "rope_parameters" => "default",
            None => return Err(self.err(format!("`{key}` has no `rope_type` (or `type`)"))),
        };
        if let Some(p) = s.get("partial_rotary_factor").filter(|p| !p.is_null())
            && p.as_f64() != Some(1.0)
        {
            return Err(self.err(format!("`{key}.partial_rotary_factor` is {p}; ferrite rotates the whole head (1.0)")));
        }
        let factor = || -> Result<f64, ModelError> {
            match s.get("factor") {
                None | Some(Value::Null) => Err(self.err(format!("`{key}` of type `{kind}` needs a `factor`"))),
                Some(_) => self.float_in(s, "factor", 1.0),
            }
        };
        Ok(match kind {
            "default" => None,
            "linear" => Some(RopeScaling::Linear { factor: factor()? }),
            "dynamic" => Some(RopeScaling::Dynamic { factor: factor()? }),
            "llama3" => {
                let low = self.float_in(s, "low_freq_factor", 1.0)?;
                let high = self.float_in(s, "high_freq_factor", 4.0)?;
                if high <= low {
                    return Err(
                        self.err(format!("`{key}.high_freq_factor` ({high}) must exceed `low_freq_factor` ({low})"))
                    );
                }
                let original = match s.get("original_max_position_embeddings") {
                    Some(v) if !v.is_null() => {
                        let o = v.as_u64().filter(|n| *n >= 1).ok_or_else(|| {
                            self.err(format!(
                                "`{key}.original_max_position_embeddings` must be a positive integer, found {v}"
                            ))
                        })?;
                        check_size(self.origin, &format!("{key}.original_max_position_embeddings"), o, MAX_SIZE)?
                    }
                    _ => 8192,
                };
                Some(RopeScaling::Llama3 {
                    factor: factor()?,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max_position_embeddings: original,
                })
            }
            other => {
                return Err(self.err(format!(
                    "`{key}.rope_type` is `{other}`; ferrite builds default, linear, dynamic and llama3"
                )));
            }
        })
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

/// The rotary embedding of a Llama-style model (HF's `LlamaRotaryEmbedding` with its scalings).
#[derive(Debug, Clone)]
struct Rope {
    head_dim: usize,
    theta: f64,
    scaling: Option<RopeScaling>,
    max_positions: usize,
}

impl Rope {
    /// The inverse frequencies for a sequence of `len` positions (`dynamic` depends on it).
    fn inv_freq(&self, len: usize) -> Vec<f64> {
        let d = self.head_dim as f64;
        let mut base = self.theta;
        if let Some(RopeScaling::Dynamic { factor }) = self.scaling
            && len > self.max_positions
        {
            let ratio = factor * len as f64 / self.max_positions as f64 - (factor - 1.0);
            base *= ratio.powf(d / (d - 2.0));
        }
        let inv: Vec<f64> = (0..self.head_dim / 2).map(|j| 1.0 / base.powf((2 * j) as f64 / d)).collect();
        match self.scaling {
            Some(RopeScaling::Linear { factor }) => inv.into_iter().map(|f| f / factor).collect(),
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let old = original_max_position_embeddings as f64;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                inv.into_iter()
                    .map(|f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen > low_wavelen {
                            f / factor
                        } else if wavelen < high_wavelen {
                            f
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            _ => inv,
        }
    }

    /// cos and sin of the rotary angles of positions `start..start + s`, `[s, d]` (HF's
    /// `cat(freqs, freqs)` layout); `dynamic` scaling sees a sequence of `start + s` positions.
    fn tables(&self, start: usize, s: usize, device: &Device) -> ferrite_tensor::Result<(Tensor, Tensor)> {
        let d = self.head_dim;
        if matches!(device, Device::Meta) {
            let z = Tensor::zeros(&[s, d], DType::F32, device)?;
            return Ok((z.clone(), z));
        }
        let inv = self.inv_freq(start + s);
        let half = d / 2;
        let mut cos = Vec::with_capacity(s * d);
        let mut sin = Vec::with_capacity(s * d);
        for p in start..start + s {
            for j in 0..d {
                // As HF: the angle in f32 (inv_freq f32 times the position), then cos/sin.
                let a = (inv[j % half] as f32) * (p as f32);
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Ok((Tensor::from_vec(cos, &[s, d], device)?, Tensor::from_vec(sin, &[s, d], device)?))
    }
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

/// `x` with each element zeroed with probability `p` and the rest scaled by `1/(1−p)`, drawn from
/// `rng` (identity when `p` is 0).
fn dropout(x: &Tensor, p: f64, rng: &RngHandle) -> ferrite_tensor::Result<Tensor> {
    if p == 0.0 {
        return Ok(x.clone());
    }
    rng.with(|g| ferrite_tensor::functional::dropout(x, p, true, g))
}

/// `[b, s, n·d]` → `[b, n, s, d]`.
fn split_heads(x: &Tensor, n: usize, d: usize) -> ferrite_tensor::Result<Tensor> {
    let (b, s) = (x.shape()[0] as i64, x.shape()[1] as i64);
    x.reshape(&[b, s, n as i64, d as i64])?.transpose(1, 2)
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

/// The boolean attend-mask `[s, offset + s]` of `s` queries at positions `offset..offset + s`
/// over every key before them: query `i` sees key `j` when `j ≤ offset + i` and, with a sliding
/// `window`, `offset + i − j < window` (HF's causal and `sliding_window_causal_mask`s).
fn causal_mask(s: usize, offset: usize, window: Option<usize>, device: &Device) -> ferrite_tensor::Result<Tensor> {
    let t = offset + s;
    if matches!(device, Device::Meta) {
        return Tensor::zeros(&[s, t], DType::Bool, device);
    }
    let mut m = Vec::with_capacity(s * t);
    for i in offset..t {
        for j in 0..t {
            m.push(j <= i && window.is_none_or(|w| i - j < w));
        }
    }
    Tensor::from_vec(m, &[s, t], device)
}

/// What every block of one model shares: the shape of its attention and its positions.
#[derive(Debug)]
struct BlockSpec {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    activation: HfActivation,
    rope: Option<Rope>,
    sliding_window: Option<usize>,
    attention_dropout: f64,
    residual_dropout: f64,
}

#[derive(Clone, Debug)]
enum BlockLayers {
    Gpt2 {
        ln_1: LayerNorm,
        c_attn: Conv1D,
        attn_proj: Conv1D,
        ln_2: LayerNorm,
        c_fc: Conv1D,
        mlp_proj: Conv1D,
    },
    Llama {
        q: Linear,
        k: Linear,
        v: Linear,
        o: Linear,
        gate: Linear,
        up: Linear,
        down: Linear,
        input_layernorm: RMSNorm,
        post_attention_layernorm: RMSNorm,
    },
}

/// One pre-norm decoder block (HF's `GPT2Block` / `LlamaDecoderLayer`).
#[derive(Clone, Debug)]
pub struct Block {
    layers: BlockLayers,
    spec: Arc<BlockSpec>,
    /// The generator the block's dropouts draw from (the decoder's, shared).
    rng: RngHandle,
    training: bool,
}

/// The keys and values one block has seen, `[batch, kv_heads, positions, head_dim]` each.
pub(crate) type LayerKv = Option<(Tensor, Tensor)>;

impl Block {
    /// Attention of `q`, `k`, `v` (`[b, s, heads·d]`, keys and values not yet repeated); with a
    /// cache, the new keys and values are appended to it and the queries (at the positions after
    /// the cached ones) attend to all of them.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, cache: Option<&mut LayerKv>) -> ferrite_nn::Result<Tensor> {
        let sp = &self.spec;
        let (b, s) = (q.shape()[0], q.shape()[1]);
        let offset = cache.as_ref().and_then(|c| c.as_ref()).map_or(0, |(k, _)| k.shape()[2]);
        let mut q = split_heads(q, sp.heads, sp.head_dim)?;
        let mut k = split_heads(k, sp.kv_heads, sp.head_dim)?;
        let mut v = split_heads(v, sp.kv_heads, sp.head_dim)?;
        if let Some(rope) = &sp.rope {
            let (cos, sin) = rope.tables(offset, s, q.device())?;
            q = apply_rotary(&q, &cos, &sin)?;
            k = apply_rotary(&k, &cos, &sin)?;
        }
        if let Some(slot) = cache {
            if let Some((pk, pv)) = slot.take() {
                k = Tensor::cat(&[&pk, &k], 2)?;
                v = Tensor::cat(&[&pv, &v], 2)?;
            }
            *slot = Some((k.clone(), v.clone()));
        }
        let t = offset + s;
        let rep = sp.heads / sp.kv_heads;
        let (k, v) = (repeat_kv(&k, rep)?, repeat_kv(&v, rep)?);
        let window = sp.sliding_window.filter(|&w| w < t);
        let a = if self.training && sp.attention_dropout > 0.0 {
            // Dropout on the probabilities needs them: the explicit path (HF's eager attention).
            let scale = 1.0 / (sp.head_dim as f64).sqrt();
            let scores = q.matmul(&k.transpose(-2, -1)?)?.mul_scalar(scale)?;
            let mask = causal_mask(s, offset, window, q.device())?;
            let p = scores.masked_fill(&mask.logical_not()?, f64::NEG_INFINITY)?.softmax(-1)?;
            let p = dropout(&p, sp.attention_dropout, &self.rng)?;
            p.to_dtype(v.dtype())?.matmul(&v)?
        } else if offset == 0 && window.is_none() {
            attention(&q, &k, &v, None, true, AttentionBackend::Auto)?
        } else if s == 1 && window.is_none() {
            // One new query sees every key.
            attention(&q, &k, &v, None, false, AttentionBackend::Auto)?
        } else {
            let mask = causal_mask(s, offset, window, q.device())?;
            attention(&q, &k, &v, Some(&mask), false, AttentionBackend::Auto)?
        };
        Ok(a.transpose(1, 2)?.reshape(&[b as i64, s as i64, (sp.heads * sp.head_dim) as i64])?)
    }

    /// The block on `x`, appending its keys and values to `cache` when given.
    fn run(&self, x: &Tensor, cache: Option<&mut LayerKv>) -> ferrite_nn::Result<Tensor> {
        let act = self.spec.activation;
        match &self.layers {
            BlockLayers::Gpt2 { ln_1, c_attn, attn_proj, ln_2, c_fc, mlp_proj } => {
                let qkv = c_attn.forward(&ln_1.forward(x)?)?;
                let w = self.spec.heads * self.spec.head_dim;
                let a =
                    self.attend(&qkv.narrow(-1, 0, w)?, &qkv.narrow(-1, w, w)?, &qkv.narrow(-1, 2 * w, w)?, cache)?;
                let p = if self.training { self.spec.residual_dropout } else { 0.0 };
                let x = x.add(&dropout(&attn_proj.forward(&a)?, p, &self.rng)?)?;
                let m = mlp_proj.forward(&act.apply(&c_fc.forward(&ln_2.forward(&x)?)?)?)?;
                Ok(x.add(&dropout(&m, p, &self.rng)?)?)
            }
            BlockLayers::Llama { q, k, v, o, gate, up, down, input_layernorm, post_attention_layernorm } => {
                let h = input_layernorm.forward(x)?;
                let a = self.attend(&q.forward(&h)?, &k.forward(&h)?, &v.forward(&h)?, cache)?;
                let x = x.add(&o.forward(&a)?)?;
                let h = post_attention_layernorm.forward(&x)?;
                let m = down.forward(&act.apply(&gate.forward(&h)?)?.mul(&up.forward(&h)?)?)?;
                Ok(x.add(&m)?)
            }
        }
    }
}

impl Module for Block {
    fn type_name(&self) -> &'static str {
        match self.layers {
            BlockLayers::Gpt2 { .. } => "GPT2Block",
            BlockLayers::Llama { .. } => "LlamaDecoderLayer",
        }
    }

    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        self.run(x, None)
    }

    /// HF's module names, in HF's registration order.
    fn children(&self) -> Vec<(String, &dyn Module)> {
        match &self.layers {
            BlockLayers::Gpt2 { ln_1, c_attn, attn_proj, ln_2, c_fc, mlp_proj } => vec![
                ("ln_1".into(), ln_1 as &dyn Module),
                ("attn.c_attn".into(), c_attn),
                ("attn.c_proj".into(), attn_proj),
                ("ln_2".into(), ln_2),
                ("mlp.c_fc".into(), c_fc),
                ("mlp.c_proj".into(), mlp_proj),
            ],
            BlockLayers::Llama { q, k, v, o, gate, up, down, input_layernorm, post_attention_layernorm } => vec![
                ("self_attn.q_proj".into(), q as &dyn Module),
                ("self_attn.k_proj".into(), k),
                ("self_attn.v_proj".into(), v),
                ("self_attn.o_proj".into(), o),
                ("mlp.gate_proj".into(), gate),
                ("mlp.up_proj".into(), up),
                ("mlp.down_proj".into(), down),
                ("input_layernorm".into(), input_layernorm),
                ("post_attention_layernorm".into(), post_attention_layernorm),
            ],
        }
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        match &mut self.layers {
            BlockLayers::Gpt2 { ln_1, c_attn, attn_proj, ln_2, c_fc, mlp_proj } => vec![
                ("ln_1".into(), ln_1 as &mut dyn Module),
                ("attn.c_attn".into(), c_attn),
                ("attn.c_proj".into(), attn_proj),
                ("ln_2".into(), ln_2),
                ("mlp.c_fc".into(), c_fc),
                ("mlp.c_proj".into(), mlp_proj),
            ],
            BlockLayers::Llama { q, k, v, o, gate, up, down, input_layernorm, post_attention_layernorm } => vec![
                ("self_attn.q_proj".into(), q as &mut dyn Module),
                ("self_attn.k_proj".into(), k),
                ("self_attn.v_proj".into(), v),
                ("self_attn.o_proj".into(), o),
                ("mlp.gate_proj".into(), gate),
                ("mlp.up_proj".into(), up),
                ("mlp.down_proj".into(), down),
                ("input_layernorm".into(), input_layernorm),
                ("post_attention_layernorm".into(), post_attention_layernorm),
            ],
        }
    }

    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

#[derive(Clone, Debug)]
enum FinalNorm {
    Layer(LayerNorm),
    Rms(RMSNorm),
}

impl FinalNorm {
    fn module(&self) -> &dyn Module {
        match self {
            FinalNorm::Layer(n) => n,
            FinalNorm::Rms(n) => n,
        }
    }
    fn module_mut(&mut self) -> &mut dyn Module {
        match self {
            FinalNorm::Layer(n) => n,
            FinalNorm::Rms(n) => n,
        }
    }
}

/// The keys and values every block of a [`Decoder`] has computed so far (HF's `DynamicCache`):
/// decoding token `t + 1` reads them instead of recomputing positions `0..=t`. Rotary positions
/// are applied before a key is cached, as in transformers.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerKv>,
    len: usize,
}

impl KvCache {
    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held by the cached keys and values.
    pub fn nbytes(&self) -> usize {
        self.layers.iter().flatten().map(|(k, v)| k.nbytes() + v.nbytes()).sum()
    }
}

/// HF's `GPT2LMHeadModel` / `LlamaForCausalLM` (and Mistral's, Qwen2's): embeddings, blocks,
/// final norm, head (or the tied embedding).
#[derive(Clone, Debug)]
pub struct Decoder {
    config: Arc<HfConfig>,
    /// `wte` / `embed_tokens`.
    embed: Embedding,
    /// GPT-2's learned positions (`wpe`).
    positions: Option<Embedding>,
    blocks: Vec<Block>,
    norm: FinalNorm,
    /// `None` when tied: the logits come from the embedding's weight.
    lm_head: Option<Linear>,
    checkpoint_activations: bool,
    /// The generator every dropout of the model draws from.
    rng: RngHandle,
    training: bool,
}

impl Decoder {
    /// The model on `device` (initialised; values do not matter on `meta`). The config is
    /// checked first ([`HfConfig::check`]): nothing is sized from a number beyond the limits.
    pub fn new(c: &HfConfig, device: &Device, checkpoint_activations: bool) -> Result<Decoder, ModelError> {
        c.check("the model's configuration")?;
        let mut g = Generator::new(0);
        let (h, q, kv, i) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size);
        let spec = Arc::new(BlockSpec {
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            activation: c.activation,
            rope: (c.style == HfStyle::Llama).then(|| Rope {
                head_dim: c.head_dim,
                theta: c.rope_theta,
                scaling: c.rope_scaling.clone(),
                max_positions: c.max_positions,
            }),
            sliding_window: c.sliding_window,
            attention_dropout: c.attention_dropout,
            residual_dropout: c.residual_dropout,
        });
        let rng = RngHandle::new(0);
        let ln = |device: &Device| LayerNorm::new_with(&[h], c.norm_eps, true, true, device);
        let rms = |device: &Device| RMSNorm::with_config(&[h], Some(c.norm_eps), true, device);
        let mut blocks = Vec::new();
        blocks.try_reserve_exact(c.num_layers).map_err(|e| ModelError::InvalidSetting {
            what: format!("num_hidden_layers {}", c.num_layers),
            reason: format!("no host memory for the list of blocks ({e})"),
        })?;
        let embed = Embedding::new_with(c.vocab_size, h, None, device, &mut g)?;
        for _ in 0..c.num_layers {
            let layers = match c.style {
                HfStyle::Gpt2 => BlockLayers::Gpt2 {
                    ln_1: ln(device)?,
                    c_attn: Conv1D::new_with(h, 3 * q, device, &mut g)?,
                    attn_proj: Conv1D::new_with(q, h, device, &mut g)?,
                    ln_2: ln(device)?,
                    c_fc: Conv1D::new_with(h, i, device, &mut g)?,
                    mlp_proj: Conv1D::new_with(i, h, device, &mut g)?,
                },
                HfStyle::Llama => BlockLayers::Llama {
                    q: Linear::new_with(h, q, c.qkv_bias, device, &mut g)?,
                    k: Linear::new_with(h, kv, c.qkv_bias, device, &mut g)?,
                    v: Linear::new_with(h, kv, c.qkv_bias, device, &mut g)?,
                    o: Linear::new_with(q, h, c.out_bias, device, &mut g)?,
                    gate: Linear::new_with(h, i, c.mlp_bias, device, &mut g)?,
                    up: Linear::new_with(h, i, c.mlp_bias, device, &mut g)?,
                    down: Linear::new_with(i, h, c.mlp_bias, device, &mut g)?,
                    input_layernorm: rms(device)?,
                    post_attention_layernorm: rms(device)?,
                },
            };
            blocks.push(Block { layers, spec: spec.clone(), rng: rng.clone(), training: true });
        }
        let positions = match c.style {
            HfStyle::Gpt2 => Some(Embedding::new_with(c.max_positions, h, None, device, &mut g)?),
            HfStyle::Llama => None,
        };
        let norm = match c.style {
            HfStyle::Gpt2 => FinalNorm::Layer(ln(device)?),
            HfStyle::Llama => FinalNorm::Rms(rms(device)?),
        };
        let lm_head =
            if c.tie_word_embeddings { None } else { Some(Linear::new_with(h, c.vocab_size, false, device, &mut g)?) };
        Ok(Decoder {
            config: Arc::new(c.clone()),
            embed,
            positions,
            blocks,
            norm,
            lm_head,
            checkpoint_activations,
            rng,
            training: true,
        })
    }

    /// Logits of `ids` (`[batch, s]`) read after the positions `cache` holds, whose keys and
    /// values are appended to it: generation without recomputing the prefix. With `last_only`,
    /// only the last position's logits (`[batch, 1, vocab]`), which is all a decoding step needs.
    /// The cache must have been made by [`Decoder::new_cache`] of this model and used with the
    /// same batch.
    pub fn forward_with_cache(&self, ids: &Tensor, cache: &mut KvCache, last_only: bool) -> ferrite_nn::Result<Tensor> {
        if cache.layers.len() != self.blocks.len() {
            return Err(ferrite_nn::NnError::InvalidConfig {
                layer: self.type_name(),
                detail: format!(
                    "a key/value cache of {} layers given to a model of {}; make it with this model's `new_cache()`",
                    cache.layers.len(),
                    self.blocks.len()
                ),
            });
        }
        let logits = self.run(ids, Some(cache), last_only)?;
        cache.len += ids.shape().get(1).copied().unwrap_or(0);
        Ok(logits)
    }

    /// Every dropout of the model draws from `rng` from now on (a trainer's dropout generator,
    /// which its checkpoints save and restore). The default is a generator seeded with 0.
    pub fn set_dropout_rng(&mut self, rng: RngHandle) {
        for b in &mut self.blocks {
            b.rng = rng.clone();
        }
        self.rng = rng;
    }

    /// An empty key/value cache for [`Decoder::forward_with_cache`].
    pub fn new_cache(&self) -> KvCache {
        KvCache { layers: vec![None; self.blocks.len()], len: 0 }
    }

    /// The forward pass, from the positions after `cache` (none without one).
    fn run(&self, ids: &Tensor, mut cache: Option<&mut KvCache>, last_only: bool) -> ferrite_nn::Result<Tensor> {
        let (embed_name, blocks_name, norm_name) = self.names();
        let s = ids.shape().get(1).copied().unwrap_or(0);
        let offset = cache.as_ref().map_or(0, |c| c.len);
        if let Some(pos) = &self.positions
            && offset + s > pos.num_embeddings
        {
            return Err(ferrite_nn::NnError::InvalidConfig {
                layer: "GPT2LMHeadModel",
                detail: format!(
                    "a sequence of {} tokens is longer than the model's {} learned positions (`n_positions`)",
                    offset + s,
                    pos.num_embeddings
                ),
            });
        }
        mark_layer(&embed_name);
        let mut h = self.embed.forward(ids)?;
        if let Some(pos) = &self.positions {
            let positions = Tensor::arange(offset as f64, (offset + s) as f64, 1.0, DType::I64, ids.device())?;
            h = h.add(&pos.forward(&positions)?)?;
        }
        if self.training {
            h = dropout(&h, self.config.embedding_dropout, &self.rng)?;
        }
        for (i, block) in self.blocks.iter().enumerate() {
            mark_layer(&format!("{blocks_name}.{i}"));
            h = match cache.as_deref_mut() {
                Some(c) => block.run(&h, c.layers.get_mut(i))?,
                None if self.checkpoint_activations && is_grad_enabled() => {
                    let b = block.clone();
                    checkpoint(move |xs| b.forward(&xs[0]), &[&h])?
                }
                None => block.forward(&h)?,
            };
        }
        if last_only && s > 1 {
            h = h.narrow(1, s - 1, 1)?;
        }
        mark_layer(&norm_name);
        let h = self.norm.module().forward(&h)?;
        mark_layer("lm_head");
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => Ok(h.matmul(&self.embed.weight.t()?)?),
        }
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &HfConfig {
        &self.config
    }

    /// The names of this model's pieces, HF's: (embedding, block prefix, final norm).
    fn names(&self) -> (String, String, String) {
        let p = self.config.base_model_prefix();
        match self.config.style {
            HfStyle::Gpt2 => (format!("{p}.wte"), format!("{p}.h"), format!("{p}.ln_f")),
            HfStyle::Llama => (format!("{p}.embed_tokens"), format!("{p}.layers"), format!("{p}.norm")),
        }
    }

    /// The learned-positions table's name (`transformer.wpe`).
    fn positions_name(&self) -> String {
        format!("{}.wpe", self.config.base_model_prefix())
    }
}

impl Module for Decoder {
    fn set_activation_checkpointing(&mut self, on: bool) -> bool {
        self.checkpoint_activations = on;
        true
    }
    fn type_name(&self) -> &'static str {
        match self.config.style {
            HfStyle::Gpt2 => "GPT2LMHeadModel",
            HfStyle::Llama => match self.config.model_type.as_str() {
                "mistral" => "MistralForCausalLM",
                "qwen2" => "Qwen2ForCausalLM",
                _ => "LlamaForCausalLM",
            },
        }
    }

    /// Token ids `[batch, seq]` to logits `[batch, seq, vocab]`.
    fn forward(&self, ids: &Tensor) -> ferrite_nn::Result<Tensor> {
        self.run(ids, None, false)
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        let (embed_name, blocks_name, norm_name) = self.names();
        let mut c: Vec<(String, &dyn Module)> = vec![(embed_name, &self.embed)];
        if let Some(p) = &self.positions {
            c.push((self.positions_name(), p));
        }
        c.extend(self.blocks.iter().enumerate().map(|(i, b)| (format!("{blocks_name}.{i}"), b as &dyn Module)));
        c.push((norm_name, self.norm.module()));
        if let Some(h) = &self.lm_head {
            c.push(("lm_head".into(), h));
        }
        c
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let (embed_name, blocks_name, norm_name) = self.names();
        let positions_name = self.positions_name();
        let mut c: Vec<(String, &mut dyn Module)> = vec![(embed_name, &mut self.embed)];
        if let Some(p) = &mut self.positions {
            c.push((positions_name, p));
        }
        c.extend(self.blocks.iter_mut().enumerate().map(|(i, b)| (format!("{blocks_name}.{i}"), b as &mut dyn Module)));
        c.push((norm_name, self.norm.module_mut()));
        if let Some(h) = &mut self.lm_head {
            c.push(("lm_head".into(), h));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2(extra: &str) -> String {
        format!(
            r#"{{"model_type": "gpt2", "n_embd": 8, "n_head": 2, "n_layer": 2, "n_positions": 16, "vocab_size": 10{extra}}}"#
        )
    }

    fn llama(model_type: &str, extra: &str) -> String {
        format!(
            r#"{{"model_type": "{model_type}", "hidden_size": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 12, "vocab_size": 10{extra}}}"#
        )
    }

    fn names(c: &HfConfig) -> Vec<String> {
        Decoder::new(c, &Device::Meta, false).unwrap().named_parameters().into_iter().map(|(n, _)| n).collect()
    }

    #[test]
    fn gpt2_parameters_carry_hf_names_and_conv1d_shapes() {
        let c = HfConfig::from_json(&gpt2(""), "c").unwrap();
        let m = Decoder::new(&c, &Device::Meta, false).unwrap();
        let sd = m.state_dict();
        let keys: Vec<&str> = sd.keys().collect();
        assert_eq!(
            &keys[..4],
            [
                "transformer.wte.weight",
                "transformer.wpe.weight",
                "transformer.h.0.ln_1.weight",
                "transformer.h.0.ln_1.bias"
            ]
        );
        assert_eq!(sd.get("transformer.h.0.attn.c_attn.weight").unwrap().shape(), [8, 24]);
        assert_eq!(sd.get("transformer.h.1.mlp.c_fc.weight").unwrap().shape(), [8, 32]);
        assert_eq!(sd.get("transformer.h.1.mlp.c_proj.weight").unwrap().shape(), [32, 8]);
        assert!(sd.contains_key("transformer.ln_f.bias"));
        assert!(!sd.contains_key("lm_head.weight"), "tied: stored once");
        let count: u64 = m.parameters().iter().map(|p| p.numel() as u64).sum();
        assert_eq!(Some(count), c.num_parameters());
        assert_eq!(c.activation, HfActivation::GeluTanh);
    }

    #[test]
    fn llama_mistral_qwen2_names_and_biases() {
        let c = HfConfig::from_json(&llama("llama", ""), "c").unwrap();
        let n = names(&c);
        for k in [
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.layers.1.mlp.down_proj.weight",
            "model.layers.1.post_attention_layernorm.weight",
            "model.norm.weight",
            "lm_head.weight",
        ] {
            assert!(n.contains(&k.to_string()), "{k} in {n:?}");
        }
        assert!(!n.iter().any(|k| k.ends_with("bias")));
        let q = HfConfig::from_json(&llama("qwen2", ""), "c").unwrap();
        let n = names(&q);
        assert!(n.contains(&"model.layers.0.self_attn.k_proj.bias".to_string()));
        assert!(!n.contains(&"model.layers.0.self_attn.o_proj.bias".to_string()));
        let b = HfConfig::from_json(&llama("llama", r#", "attention_bias": true, "mlp_bias": true"#), "c").unwrap();
        let n = names(&b);
        assert!(n.contains(&"model.layers.0.self_attn.o_proj.bias".to_string()));
        assert!(n.contains(&"model.layers.0.mlp.up_proj.bias".to_string()));
        for c in [c, q, b] {
            let m = Decoder::new(&c, &Device::Meta, false).unwrap();
            let count: u64 = m.parameters().iter().map(|p| p.numel() as u64).sum();
            assert_eq!(Some(count), c.num_parameters(), "{c:?}");
        }
        let m = HfConfig::from_json(&llama("mistral", r#", "sliding_window": 4"#), "c").unwrap();
        assert_eq!(m.sliding_window, Some(4));
        let h = HfConfig::from_json(&llama("llama", r#", "head_dim": 4"#), "c").unwrap();
        assert_eq!((h.head_dim, h.num_heads * h.head_dim), (4, 16));
    }

    #[test]
    fn dropout_follows_the_config_in_training_only() {
        let c = HfConfig::from_json(&gpt2(""), "c").unwrap();
        assert_eq!((c.attention_dropout, c.residual_dropout, c.embedding_dropout), (0.1, 0.1, 0.1));
        let l = HfConfig::from_json(&llama("llama", ""), "c").unwrap();
        assert_eq!((l.attention_dropout, l.residual_dropout, l.embedding_dropout), (0.0, 0.0, 0.0));
        let e = HfConfig::from_json(&gpt2(r#", "attn_pdrop": 1.5"#), "c.json").unwrap_err().to_string();
        assert!(e.contains("attn_pdrop") && e.contains("[0, 1)"), "{e}");
        let ids = Tensor::from_vec((0..16).map(|i| i % 10).collect::<Vec<i64>>(), &[2, 8], &Device::Cpu).unwrap();
        let mut m = Decoder::new(&c, &Device::Cpu, false).unwrap();
        m.set_dropout_rng(RngHandle::new(5));
        let a = m.forward(&ids).unwrap().to_vec::<f32>().unwrap();
        let b = m.forward(&ids).unwrap().to_vec::<f32>().unwrap();
        assert_ne!(a, b, "training draws new masks");
        m.set_dropout_rng(RngHandle::new(5));
        assert_eq!(m.forward(&ids).unwrap().to_vec::<f32>().unwrap(), a, "the same generator, the same masks");
        m.eval();
        assert_eq!(
            m.forward(&ids).unwrap().to_vec::<f32>().unwrap(),
            m.forward(&ids).unwrap().to_vec::<f32>().unwrap()
        );
    }

    /// The explicit attention path (taken for attention dropout) is the same function as the
    /// fused one: with a probability too small to drop anything, training equals evaluation —
    /// causal, and within a sliding window.
    #[test]
    fn the_explicit_attention_path_equals_the_fused_one() {
        for json in [
            gpt2(r#", "attn_pdrop": 1e-12, "resid_pdrop": 0.0, "embd_pdrop": 0.0"#),
            llama("mistral", r#", "attention_dropout": 1e-12, "sliding_window": 3"#),
        ] {
            let c = HfConfig::from_json(&json, "c").unwrap();
            let mut m = Decoder::new(&c, &Device::Cpu, false).unwrap();
            let ids =
                Tensor::from_vec((0..16).map(|i| (i * 7) % 10).collect::<Vec<i64>>(), &[2, 8], &Device::Cpu).unwrap();
            let train = m.forward(&ids).unwrap();
            m.eval();
            let eval = m.forward(&ids).unwrap();
            ferrite_test_support::assert_close("explicit vs fused attention", &train, &eval, 1e-5, 1e-6);
        }
    }

    #[test]
    fn options_ferrite_does_not_build_are_named() {
        let e = |json: String| HfConfig::from_json(&json, "c.json").unwrap_err().to_string();
        let m = e(llama("falcon", ""));
        assert!(m.contains("model_type") && m.contains("falcon"), "{m}");
        let m = e(llama("llama", r#", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#));
        assert!(m.contains("rope_type") && m.contains("yarn"), "{m}");
        let m = e(llama("llama", r#", "hidden_act": "gelu_10""#));
        assert!(m.contains("hidden_act") && m.contains("gelu_10"), "{m}");
        let m = e(gpt2(r#", "activation_function": "tanh""#));
        assert!(m.contains("activation_function") && m.contains("tanh"), "{m}");
        let m = e(gpt2(r#", "scale_attn_by_inverse_layer_idx": true"#));
        assert!(m.contains("scale_attn_by_inverse_layer_idx"), "{m}");
        let m = e(llama("qwen2", r#", "use_sliding_window": true"#));
        assert!(m.contains("use_sliding_window"), "{m}");
        let m = e(llama("llama", r#", "rope_scaling": {"rope_type": "linear"}"#));
        assert!(m.contains("factor"), "{m}");
    }

    #[test]
    fn rope_scalings_follow_hf() {
        let parse = |extra: &str| HfConfig::from_json(&llama("llama", extra), "c").unwrap();
        let rope =
            |c: &HfConfig| Rope { head_dim: 64, theta: 500000.0, scaling: c.rope_scaling.clone(), max_positions: 16 };
        let plain = rope(&parse("")).inv_freq(8);
        let v5 = parse(r#", "rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}"#);
        assert_eq!((v5.rope_theta, v5.rope_scaling.clone()), (500.0, Some(RopeScaling::Linear { factor: 2.0 })));
        let v5 = parse(r#", "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}"#);
        assert_eq!((v5.rope_theta, v5.rope_scaling), (500.0, None));
        let lin = rope(&parse(r#", "rope_scaling": {"type": "linear", "factor": 2.0}"#)).inv_freq(8);
        assert!((lin[5] - plain[5] / 2.0).abs() < 1e-15);
        let dynamic = rope(&parse(r#", "rope_scaling": {"type": "dynamic", "factor": 2.0}"#));
        assert_eq!(dynamic.inv_freq(16), plain, "unchanged within the trained context");
        assert!(dynamic.inv_freq(32)[5] < plain[5]);
        let l3 = rope(&parse(
            r#", "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#,
        ))
        .inv_freq(8);
        // Highest frequency kept, lowest divided by the factor.
        assert_eq!(l3[0], plain[0]);
        assert!((l3[31] - plain[31] / 8.0).abs() < 1e-18);
    }

    #[test]
    fn absurd_sizes_are_refused_before_anything_is_built() {
        let e = |json: String| HfConfig::from_json(&json, "c.json").unwrap_err();
        let err = e(llama("llama", "").replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 1073741824"#));
        let m = err.to_string();
        assert!(matches!(err, ModelError::ConfigLimit { .. }), "{m}");
        assert!(m.contains("num_hidden_layers") && m.contains("1073741824") && m.contains("10000"), "{m}");
        let m = e(gpt2("").replace(r#""n_embd": 8"#, r#""n_embd": 1099511627776"#)).to_string();
        assert!(m.contains("n_embd") && m.contains("1099511627776"), "{m}");
        let m = e(llama("llama", "").replace(r#""vocab_size": 10"#, r#""vocab_size": 1125899906842624"#)).to_string();
        assert!(m.contains("vocab_size") && m.contains("1125899906842624"), "{m}");
        // Each size within its limit, the product far beyond: the parameter count is refused.
        let big = llama("llama", "")
            .replace(r#""hidden_size": 8"#, r#""hidden_size": 1073741824"#)
            .replace(r#""intermediate_size": 12"#, r#""intermediate_size": 1073741824"#);
        let err = e(big);
        assert!(matches!(&err, ModelError::ConfigLimit { figure, .. } if figure.contains("parameters")), "{err}");
        // A config built by hand is checked by `Decoder::new`.
        let mut c = HfConfig::from_json(&llama("llama", ""), "c").unwrap();
        c.num_layers = 1 << 30;
        c.hidden_size = 1 << 40;
        let err = Decoder::new(&c, &Device::Meta, false).unwrap_err();
        assert!(matches!(err, ModelError::ConfigLimit { .. }), "{err}");
        c.num_layers = 2;
        c.hidden_size = usize::MAX;
        assert_eq!(c.num_parameters(), None);
        assert!(Decoder::new(&c, &Device::Meta, false).is_err());
    }
}
