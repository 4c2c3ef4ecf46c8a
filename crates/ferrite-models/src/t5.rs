//! T5-style encoder-decoder models from a Hugging Face `config.json` (`model_type: t5`), built as
//! ferrite models so the planner can run their training step on `meta` like the decoders'.
//!
//! Why its own module: an encoder-decoder has two inputs (the encoder's tokens and the decoder's,
//! the labels shifted right), cross-attention, and T5's own details that change memory — a
//! relative position bias computed once per stack and added to every layer's attention scores,
//! unscaled attention, RMS-style LayerNorm without bias or mean, and a head tied to the shared
//! embedding and scaled by `d_model^-0.5` (T5 v1.0) or untied (v1.1). Module and parameter
//! names follow Hugging Face's `T5ForConditionalGeneration` (`shared.weight`,
//! `encoder.block.0.layer.0.SelfAttention.q.weight`, …), and the parameter count equals the real
//! model's: t5-small 60,506,624; t5-3b 2,851,598,336; t5-v1_1-small 76,961,152 (tests).
use ferrite_nn::{Embedding, Linear, Module, RMSNorm, RngHandle, checkpoint};
use ferrite_tensor::{DType, Device, Generator, Tensor, is_grad_enabled};
use serde_json::{Map, Value};

use ferrite_nn::mark_layer;

use crate::ModelError;
use crate::limits::{MAX_SIZE, check_parameters, check_size, limit_of, n};
use crate::t5_cache::{T5Cache, T5LayerCache};

/// The activation of T5's feed-forward (`feed_forward_proj`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum T5FeedForward {
    /// `wo(relu(wi(x)))` (T5 v1.0).
    Relu,
    /// `wo(gelu(wi(x)))`.
    Gelu,
    /// `wo(gelu_tanh(wi_0(x)) · wi_1(x))` (T5 v1.1, Flan-T5: `gated-gelu`).
    GatedGelu,
    /// `wo(relu(wi_0(x)) · wi_1(x))`.
    GatedRelu,
    /// `wo(silu(wi_0(x)) · wi_1(x))`.
    GatedSilu,
}

impl T5FeedForward {
    pub fn gated(self) -> bool {
        matches!(self, T5FeedForward::GatedGelu | T5FeedForward::GatedRelu | T5FeedForward::GatedSilu)
    }
    pub fn name(self) -> &'static str {
        match self {
            T5FeedForward::Relu => "relu",
            T5FeedForward::Gelu => "gelu",
            T5FeedForward::GatedGelu => "gated-gelu",
            T5FeedForward::GatedRelu => "gated-relu",
            T5FeedForward::GatedSilu => "gated-silu",
        }
    }
    fn act(self, x: &Tensor) -> ferrite_tensor::Result<Tensor> {
        match self {
            T5FeedForward::Relu | T5FeedForward::GatedRelu => x.relu(),
            T5FeedForward::Gelu => x.gelu(),
            // HF maps `gated-gelu` to `gelu_new`, the tanh approximation.
            T5FeedForward::GatedGelu => x.gelu_tanh(),
            T5FeedForward::GatedSilu => x.silu(),
        }
    }
}

/// What the planner reads from a T5 `config.json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct T5Config {
    pub model_type: String,
    pub vocab_size: usize,
    pub d_model: usize,
    /// Width of one attention head (`d_kv`; `num_heads · d_kv` need not equal `d_model`).
    pub d_kv: usize,
    pub d_ff: usize,
    pub num_layers: usize,
    pub num_decoder_layers: usize,
    pub num_heads: usize,
    pub relative_attention_num_buckets: usize,
    pub relative_attention_max_distance: usize,
    pub feed_forward: T5FeedForward,
    pub tie_word_embeddings: bool,
    /// The decoder's output is scaled by `d_model^-0.5` before the head: transformers ≥ 5's
    /// `scale_decoder_outputs`; older configs mean it by `tie_word_embeddings` (T5 v1.0's tied,
    /// scaled head, v1.1's untied, unscaled one), which is the default when the key is absent.
    pub scale_decoder_outputs: bool,
    pub layer_norm_epsilon: f64,
    /// `dropout_rate` (default 0.1, as transformers): every dropout of T5 in training — the
    /// embeddings, the attention weights, each sub-layer's output, the feed-forward's hidden
    /// activations and the stack's output.
    pub dropout_rate: f64,
    /// `pad_token_id` (default 0): what padded inputs hold, and what replaces the ignored
    /// labels (−100) in the decoder's input.
    pub pad_token_id: u32,
    /// `decoder_start_token_id` (default `pad_token_id`): the decoder's first input token.
    pub decoder_start_token_id: u32,
}

impl T5Config {
    /// Whether the parsed `config.json` object describes a T5-style encoder-decoder.
    pub fn describes(obj: &Map<String, Value>) -> bool {
        matches!(obj.get("model_type").and_then(Value::as_str), Some("t5" | "mt5" | "umt5"))
    }

    /// Parse the text of a T5 `config.json` (`origin` names it in errors).
    pub fn from_json(text: &str, origin: &str) -> Result<T5Config, ModelError> {
        let err = |problem: String| ModelError::Config { path: origin.to_string(), problem };
        let v: Value = serde_json::from_str(text).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| err("expected a JSON object".into()))?;
        let int = |key: &str, default: Option<usize>| -> Result<usize, ModelError> {
            match obj.get(key) {
                None | Some(Value::Null) => {
                    default.ok_or_else(|| err(format!("missing key `{key}` (a T5 config needs it)")))
                }
                Some(x) => {
                    let v = x
                        .as_u64()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| err(format!("key `{key}` must be a positive integer, found {x}")))?;
                    check_size(origin, key, v, limit_of(key))
                }
            }
        };
        if let Some(Value::String(t)) = obj.get("model_type")
            && t == "umt5"
        {
            return Err(err(
                "`model_type` is `umt5`: UMT5 gives every layer its own relative position bias, which ferrite's T5 does not build; use a `t5` or `mt5` model".into(),
            ));
        }
        let num_layers = int("num_layers", None)?;
        let buckets = int("relative_attention_num_buckets", Some(32))?;
        if buckets < 2 {
            return Err(err(format!(
                "`relative_attention_num_buckets` ({buckets}) must be at least 2: half the buckets hold exact distances"
            )));
        }
        let proj = match obj.get("feed_forward_proj") {
            None | Some(Value::Null) => "relu",
            Some(Value::String(s)) => s.as_str(),
            Some(x) => return Err(err(format!("key `feed_forward_proj` must be a string, found {x}"))),
        };
        let feed_forward = match proj {
            "relu" => T5FeedForward::Relu,
            "gelu" => T5FeedForward::Gelu,
            "gated-gelu" => T5FeedForward::GatedGelu,
            "gated-relu" => T5FeedForward::GatedRelu,
            "gated-silu" => T5FeedForward::GatedSilu,
            other => {
                return Err(err(format!(
                    "`feed_forward_proj` is `{other}`; the planner builds relu, gelu, gated-gelu, gated-relu and gated-silu"
                )));
            }
        };
        let tie_word_embeddings = match obj.get("tie_word_embeddings") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(x) => return Err(err(format!("key `tie_word_embeddings` must be true or false, found {x}"))),
        };
        let scale_decoder_outputs = match obj.get("scale_decoder_outputs") {
            None | Some(Value::Null) => tie_word_embeddings,
            Some(Value::Bool(b)) => *b,
            Some(x) => return Err(err(format!("key `scale_decoder_outputs` must be true or false, found {x}"))),
        };
        let layer_norm_epsilon = match obj.get("layer_norm_epsilon") {
            None | Some(Value::Null) => 1e-6,
            Some(x) => x
                .as_f64()
                .filter(|f| f.is_finite() && *f > 0.0)
                .ok_or_else(|| err(format!("key `layer_norm_epsilon` must be a positive number, found {x}")))?,
        };
        let dropout_rate = match obj.get("dropout_rate") {
            None | Some(Value::Null) => 0.1,
            Some(x) => x
                .as_f64()
                .filter(|p| (0.0..1.0).contains(p))
                .ok_or_else(|| err(format!("key `dropout_rate` must be a dropout probability in [0, 1), found {x}")))?,
        };
        let token = |key: &str, default: u32| -> Result<u32, ModelError> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => x
                    .as_u64()
                    .and_then(|v| u32::try_from(v).ok())
                    .ok_or_else(|| err(format!("key `{key}` must be a token id (a whole number), found {x}"))),
            }
        };
        let pad_token_id = token("pad_token_id", 0)?;
        let decoder_start_token_id = token("decoder_start_token_id", pad_token_id)?;
        let c = T5Config {
            dropout_rate,
            pad_token_id,
            decoder_start_token_id,
            model_type: obj.get("model_type").and_then(Value::as_str).unwrap_or("t5").to_string(),
            vocab_size: int("vocab_size", None)?,
            d_model: int("d_model", None)?,
            d_kv: int("d_kv", None)?,
            d_ff: int("d_ff", None)?,
            num_layers,
            num_decoder_layers: int("num_decoder_layers", Some(num_layers))?,
            num_heads: int("num_heads", None)?,
            relative_attention_num_buckets: buckets,
            relative_attention_max_distance: int("relative_attention_max_distance", Some(128))?,
            feed_forward,
            tie_word_embeddings,
            scale_decoder_outputs,
            layer_norm_epsilon,
        };
        c.check(origin)?;
        Ok(c)
    }

    /// Every size within `limits.rs` and the parameter count within
    /// [`MAX_PARAMETERS`](crate::limits::MAX_PARAMETERS), computed with checked arithmetic;
    /// returns the count. [`T5Config::from_json`] and [`T5Model::new`] call it.
    pub fn check(&self, origin: &str) -> Result<u64, ModelError> {
        let sizes = [
            ("num_layers", self.num_layers),
            ("num_decoder_layers", self.num_decoder_layers),
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("d_kv", self.d_kv),
            ("d_ff", self.d_ff),
            ("num_heads", self.num_heads),
            ("relative_attention_num_buckets", self.relative_attention_num_buckets),
            ("relative_attention_max_distance", self.relative_attention_max_distance),
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
        check_size(origin, "num_heads × d_kv", (n(self.num_heads) * n(self.d_kv)).0.unwrap_or(u64::MAX), MAX_SIZE)?;
        check_parameters(
            origin,
            self.num_parameters(),
            "vocab_size, d_model, d_ff, num_layers, num_decoder_layers (the parameter count)",
        )
    }

    /// Parameters of the model, from the shapes (the built model is checked against it); `None`
    /// when the count overflows `u64`.
    pub fn num_parameters(&self) -> Option<u64> {
        let (v, d, f) = (n(self.vocab_size), n(self.d_model), n(self.d_ff));
        let inner = n(self.num_heads) * n(self.d_kv);
        let attn = n(4) * d * inner;
        let ff = if self.feed_forward.gated() { n(3) * d * f } else { n(2) * d * f };
        let bias = n(self.relative_attention_num_buckets) * n(self.num_heads);
        let encoder = n(self.num_layers) * (attn + ff + n(2) * d) + bias + d;
        let decoder = n(self.num_decoder_layers) * (n(2) * attn + ff + n(3) * d) + bias + d;
        let head = if self.tie_word_embeddings { n(0) } else { v * d };
        (v * d + encoder + decoder + head).0
    }
}

/// T5's `_relative_position_bucket`: the bucket of `relative = key − query` positions.
/// Bidirectional (encoder): half the buckets for keys after the query. Within a direction, half
/// the buckets hold exact distances, the rest grow logarithmically up to `max_distance`.
pub fn relative_position_bucket(relative: i64, bidirectional: bool, num_buckets: usize, max_distance: usize) -> usize {
    let mut buckets = num_buckets as i64;
    let mut ret = 0i64;
    let n = if bidirectional {
        buckets /= 2;
        if relative > 0 {
            ret += buckets;
        }
        relative.abs()
    } else {
        (-relative).max(0)
    };
    let max_exact = buckets / 2;
    if n < max_exact {
        return (ret + n) as usize;
    }
    // As HF: computed in f32, truncated towards zero, capped at the last bucket.
    let large = max_exact
        + ((n as f32 / max_exact as f32).ln() / (max_distance as f32 / max_exact as f32).ln()
            * (buckets - max_exact) as f32) as i64;
    (ret + large.min(buckets - 1)) as usize
}

impl T5Model {
    /// The model on `device` (initialised; values do not matter on `meta`).
    /// The config is checked first ([`T5Config::check`]).
    pub fn new(c: &T5Config, device: &Device, checkpoint_activations: bool) -> Result<T5Model, ModelError> {
        c.check("the model's configuration")?;
        let mut g = Generator::new(0);
        let drop = DropoutSite { p: c.dropout_rate, rng: RngHandle::new(0) };
        let (d, inner) = (c.d_model, c.num_heads * c.d_kv);
        let norm = || RMSNorm::with_config(&[d], Some(c.layer_norm_epsilon), true, device);
        let attention = |has_bias: bool, g: &mut Generator| -> Result<T5Attention, ModelError> {
            Ok(T5Attention {
                q: Linear::new_with(d, inner, false, device, g)?,
                k: Linear::new_with(d, inner, false, device, g)?,
                v: Linear::new_with(d, inner, false, device, g)?,
                o: Linear::new_with(inner, d, false, device, g)?,
                relative_attention_bias: if has_bias {
                    Some(Embedding::new_with(c.relative_attention_num_buckets, c.num_heads, None, device, g)?)
                } else {
                    None
                },
                heads: c.num_heads,
                d_kv: c.d_kv,
                drop: drop.clone(),
                training: true,
            })
        };
        let ff = |g: &mut Generator| -> Result<T5DenseFf, ModelError> {
            let wi = if c.feed_forward.gated() {
                Wi::Gated {
                    wi_0: Linear::new_with(d, c.d_ff, false, device, g)?,
                    wi_1: Linear::new_with(d, c.d_ff, false, device, g)?,
                }
            } else {
                Wi::Plain(Linear::new_with(d, c.d_ff, false, device, g)?)
            };
            Ok(T5DenseFf {
                wi,
                wo: Linear::new_with(c.d_ff, d, false, device, g)?,
                act: c.feed_forward,
                drop: drop.clone(),
                training: true,
            })
        };
        let stack = |layers: usize, decoder: bool, g: &mut Generator| -> Result<T5Stack, ModelError> {
            let mut blocks = Vec::with_capacity(layers);
            for i in 0..layers {
                blocks.push(T5Block {
                    self_attn: attention(i == 0, g)?,
                    self_norm: norm()?,
                    cross: if decoder { Some((attention(false, g)?, norm()?)) } else { None },
                    ff: ff(g)?,
                    ff_norm: norm()?,
                    drop: drop.clone(),
                    training: true,
                });
            }
            Ok(T5Stack {
                blocks,
                final_layer_norm: norm()?,
                decoder,
                num_buckets: c.relative_attention_num_buckets,
                max_distance: c.relative_attention_max_distance,
                checkpoint_activations,
                drop: drop.clone(),
                training: true,
            })
        };
        let shared = Embedding::new_with(c.vocab_size, d, None, device, &mut g)?;
        let encoder = stack(c.num_layers, false, &mut g)?;
        let decoder = stack(c.num_decoder_layers, true, &mut g)?;
        let lm_head =
            if c.tie_word_embeddings { None } else { Some(Linear::new_with(d, c.vocab_size, false, device, &mut g)?) };
        Ok(T5Model {
            shared,
            encoder,
            decoder,
            lm_head,
            d_model: d,
            scale: c.scale_decoder_outputs,
            config: c.clone(),
            training: true,
        })
    }
}

/// One dropout site: its probability and the generator every dropout of the model shares.
#[derive(Clone, Debug)]
struct DropoutSite {
    p: f64,
    rng: RngHandle,
}

impl DropoutSite {
    /// `x` with elements zeroed with probability `p` (scaled by `1/(1−p)`) when `training`.
    fn apply(&self, x: &Tensor, training: bool) -> ferrite_tensor::Result<Tensor> {
        if !training || self.p == 0.0 {
            return Ok(x.clone());
        }
        self.rng.with(|g| ferrite_tensor::functional::dropout(x, self.p, true, g))
    }
}

/// `[b, s, n·d]` → `[b, n, s, d]`.
fn split_heads(x: &Tensor, n: usize, d: usize) -> ferrite_tensor::Result<Tensor> {
    let (b, s) = (x.shape()[0] as i64, x.shape()[1] as i64);
    x.reshape(&[b, s, n as i64, d as i64])?.transpose(1, 2)
}

/// HF's `T5Attention`: q, k, v, o without biases, unscaled scores, the position bias added.
#[derive(Clone, Debug)]
pub struct T5Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// Only in the first block of each stack (`has_relative_attention_bias`).
    relative_attention_bias: Option<Embedding>,
    heads: usize,
    d_kv: usize,
    drop: DropoutSite,
    training: bool,
}

impl T5Attention {
    /// Queries from `x`, keys and values from `kv` (`x` itself, or the encoder's output),
    /// `softmax(q kᵀ + bias) v`, then `o`.
    fn attend(&self, x: &Tensor, kv: &Tensor, bias: Option<&Tensor>) -> ferrite_nn::Result<Tensor> {
        let (k, v) = self.project_kv(kv)?;
        self.attend_to(x, &k, &v, bias)
    }

    /// The keys and values of `kv` `[b, s, d_model]`, `[b, heads, s, d_kv]` each (what a
    /// [`T5Cache`] keeps).
    fn project_kv(&self, kv: &Tensor) -> ferrite_nn::Result<(Tensor, Tensor)> {
        let k = split_heads(&self.k.forward(kv)?, self.heads, self.d_kv)?;
        let v = split_heads(&self.v.forward(kv)?, self.heads, self.d_kv)?;
        Ok((k, v))
    }

    /// Queries from `x` attending to keys `k` and values `v` (`[b, heads, keys, d_kv]`) with
    /// `bias` (`[.., queries, keys]`), then `o`.
    fn attend_to(&self, x: &Tensor, k: &Tensor, v: &Tensor, bias: Option<&Tensor>) -> ferrite_nn::Result<Tensor> {
        let (b, s) = (x.shape()[0] as i64, x.shape()[1] as i64);
        let q = split_heads(&self.q.forward(x)?, self.heads, self.d_kv)?;
        // T5 does not scale by 1/√d_kv (its initialisation accounts for it).
        let mut scores = q.matmul(&k.transpose(-2, -1)?)?;
        if let Some(bias) = bias {
            scores = scores.add(bias)?;
        }
        let weights = self.drop.apply(&scores.softmax(-1)?, self.training)?;
        let a = weights.to_dtype(v.dtype())?.matmul(v)?;
        let a = a.transpose(1, 2)?.reshape(&[b, s, (self.heads * self.d_kv) as i64])?;
        self.o.forward(&a)
    }

    /// HF's `compute_bias`: `[1, heads, queries, offset + queries]` from the learned bucket
    /// embedding — the rows of query positions `offset..offset + queries` against every key
    /// position from 0 (transformers' `past_seen_tokens`: a cached decoding step is the last row
    /// of the full bias) — plus (decoder) the causal mask, computed once per stack and shared by
    /// its blocks.
    fn position_bias(
        &self,
        queries: usize,
        offset: usize,
        decoder: bool,
        num_buckets: usize,
        max_distance: usize,
        device: &Device,
    ) -> ferrite_nn::Result<Option<Tensor>> {
        let Some(table) = &self.relative_attention_bias else { return Ok(None) };
        let keys = offset.saturating_add(queries);
        let (buckets, mask) = if matches!(device, Device::Meta) {
            (Tensor::zeros(&[queries, keys], DType::I64, device)?, Tensor::zeros(&[queries, keys], DType::F32, device)?)
        } else {
            let cells = queries.saturating_mul(keys);
            let (mut ids, mut mask) = (Vec::new(), Vec::new());
            if ids.try_reserve_exact(cells).is_err() || mask.try_reserve_exact(cells).is_err() {
                return Err(ferrite_nn::NnError::InvalidConfig {
                    layer: "T5Attention",
                    detail: format!(
                        "no host memory for the {queries}×{keys} position bias of {queries} queries over {keys} positions"
                    ),
                });
            }
            for q in offset as i64..keys as i64 {
                for k in 0..keys as i64 {
                    ids.push(relative_position_bucket(k - q, !decoder, num_buckets, max_distance) as i64);
                    // HF adds `finfo(dtype).min` where a decoder query may not look.
                    mask.push(if decoder && k > q { f32::MIN } else { 0.0 });
                }
            }
            (Tensor::from_vec(ids, &[queries, keys], device)?, Tensor::from_vec(mask, &[queries, keys], device)?)
        };
        let bias = table.forward(&buckets)?.permute(&[2, 0, 1])?.unsqueeze(0)?;
        Ok(Some(if decoder { bias.add(&mask)? } else { bias }))
    }
}

impl Module for T5Attention {
    fn type_name(&self) -> &'static str {
        "T5Attention"
    }
    /// Self-attention without a position bias.
    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        self.attend(x, x, None)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut c: Vec<(String, &dyn Module)> =
            vec![("q".into(), &self.q), ("k".into(), &self.k), ("v".into(), &self.v), ("o".into(), &self.o)];
        if let Some(b) = &self.relative_attention_bias {
            c.push(("relative_attention_bias".into(), b));
        }
        c
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut c: Vec<(String, &mut dyn Module)> = vec![
            ("q".into(), &mut self.q),
            ("k".into(), &mut self.k),
            ("v".into(), &mut self.v),
            ("o".into(), &mut self.o),
        ];
        if let Some(b) = &mut self.relative_attention_bias {
            c.push(("relative_attention_bias".into(), b));
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

#[derive(Clone, Debug)]
enum Wi {
    Plain(Linear),
    Gated { wi_0: Linear, wi_1: Linear },
}

/// HF's `T5DenseActDense` / `T5DenseGatedActDense`.
#[derive(Clone, Debug)]
pub struct T5DenseFf {
    wi: Wi,
    wo: Linear,
    act: T5FeedForward,
    drop: DropoutSite,
    training: bool,
}

impl Module for T5DenseFf {
    fn type_name(&self) -> &'static str {
        "T5DenseFf"
    }
    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        let h = match &self.wi {
            Wi::Plain(wi) => self.act.act(&wi.forward(x)?)?,
            Wi::Gated { wi_0, wi_1 } => self.act.act(&wi_0.forward(x)?)?.mul(&wi_1.forward(x)?)?,
        };
        self.wo.forward(&self.drop.apply(&h, self.training)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut c: Vec<(String, &dyn Module)> = match &self.wi {
            Wi::Plain(wi) => vec![("wi".into(), wi)],
            Wi::Gated { wi_0, wi_1 } => vec![("wi_0".into(), wi_0), ("wi_1".into(), wi_1)],
        };
        c.push(("wo".into(), &self.wo));
        c
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut c: Vec<(String, &mut dyn Module)> = match &mut self.wi {
            Wi::Plain(wi) => vec![("wi".into(), wi)],
            Wi::Gated { wi_0, wi_1 } => vec![("wi_0".into(), wi_0), ("wi_1".into(), wi_1)],
        };
        c.push(("wo".into(), &mut self.wo));
        c
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// One pre-norm block: self-attention, (decoder) cross-attention, feed-forward, each residual.
#[derive(Clone, Debug)]
pub struct T5Block {
    self_attn: T5Attention,
    self_norm: RMSNorm,
    cross: Option<(T5Attention, RMSNorm)>,
    ff: T5DenseFf,
    ff_norm: RMSNorm,
    drop: DropoutSite,
    training: bool,
}

impl T5Block {
    /// `bias`: the self-attention's position bias (with the causal or padding mask);
    /// `cross_bias`: the encoder's padding mask for cross-attention.
    fn run(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        encoded: Option<&Tensor>,
        cross_bias: Option<&Tensor>,
    ) -> ferrite_nn::Result<Tensor> {
        self.run_cached(x, bias, encoded, cross_bias, None)
    }

    /// [`T5Block::run`] with this layer's part of a [`T5Cache`]: the new positions' keys and
    /// values are appended to the self-attention's and `x`'s queries attend to all of them;
    /// cross-attention's keys and values are projected from `encoded` the first time only and
    /// read from the cache afterwards (transformers' `EncoderDecoderCache`).
    fn run_cached(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        encoded: Option<&Tensor>,
        cross_bias: Option<&Tensor>,
        cache: Option<&mut T5LayerCache>,
    ) -> ferrite_nn::Result<Tensor> {
        let t = self.training;
        let n = self.self_norm.forward(x)?;
        let Some(cache) = cache else {
            let mut h = x.add(&self.drop.apply(&self.self_attn.attend(&n, &n, bias)?, t)?)?;
            if let (Some((attn, norm)), Some(enc)) = (&self.cross, encoded) {
                let n = norm.forward(&h)?;
                h = h.add(&self.drop.apply(&attn.attend(&n, enc, cross_bias)?, t)?)?;
            }
            return Ok(h.add(&self.drop.apply(&self.ff.forward(&self.ff_norm.forward(&h)?)?, t)?)?);
        };
        let (mut k, mut v) = self.self_attn.project_kv(&n)?;
        if let Some((pk, pv)) = cache.self_kv.take() {
            k = Tensor::cat(&[&pk, &k], 2)?;
            v = Tensor::cat(&[&pv, &v], 2)?;
        }
        let a = self.self_attn.attend_to(&n, &k, &v, bias)?;
        cache.self_kv = Some((k, v));
        let mut h = x.add(&self.drop.apply(&a, t)?)?;
        if let Some((attn, norm)) = &self.cross {
            if cache.cross_kv.is_none()
                && let Some(enc) = encoded
            {
                cache.cross_kv = Some(attn.project_kv(enc)?);
                cache.cross_projections += 1;
            }
            if let Some((ck, cv)) = &cache.cross_kv {
                let n = norm.forward(&h)?;
                h = h.add(&self.drop.apply(&attn.attend_to(&n, ck, cv, cross_bias)?, t)?)?;
            }
        }
        Ok(h.add(&self.drop.apply(&self.ff.forward(&self.ff_norm.forward(&h)?)?, t)?)?)
    }

    /// HF's names: `layer.0` self-attention, `layer.1` cross-attention (decoder), then the
    /// feed-forward.
    fn names(&self) -> [String; 3] {
        let ff = if self.cross.is_some() { 2 } else { 1 };
        ["layer.0".into(), "layer.1".into(), format!("layer.{ff}")]
    }
}

impl Module for T5Block {
    fn type_name(&self) -> &'static str {
        "T5Block"
    }
    /// An encoder block without a position bias.
    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        self.run(x, None, None, None)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let [l0, l1, lf] = self.names();
        let mut c: Vec<(String, &dyn Module)> =
            vec![(format!("{l0}.SelfAttention"), &self.self_attn), (format!("{l0}.layer_norm"), &self.self_norm)];
        if let Some((attn, norm)) = &self.cross {
            c.extend([(format!("{l1}.EncDecAttention"), attn as &dyn Module), (format!("{l1}.layer_norm"), norm)]);
        }
        c.extend([
            (format!("{lf}.DenseReluDense"), &self.ff as &dyn Module),
            (format!("{lf}.layer_norm"), &self.ff_norm),
        ]);
        c
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let [l0, l1, lf] = self.names();
        let mut c: Vec<(String, &mut dyn Module)> = vec![
            (format!("{l0}.SelfAttention"), &mut self.self_attn),
            (format!("{l0}.layer_norm"), &mut self.self_norm),
        ];
        if let Some((attn, norm)) = &mut self.cross {
            c.extend([(format!("{l1}.EncDecAttention"), attn as &mut dyn Module), (format!("{l1}.layer_norm"), norm)]);
        }
        c.extend([
            (format!("{lf}.DenseReluDense"), &mut self.ff as &mut dyn Module),
            (format!("{lf}.layer_norm"), &mut self.ff_norm),
        ]);
        c
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// HF's `T5Stack` without its (shared) embedding: blocks and the final norm.
#[derive(Clone, Debug)]
pub struct T5Stack {
    blocks: Vec<T5Block>,
    final_layer_norm: RMSNorm,
    decoder: bool,
    num_buckets: usize,
    max_distance: usize,
    checkpoint_activations: bool,
    drop: DropoutSite,
    training: bool,
}

impl T5Stack {
    /// Embedded tokens `[b, s, d]` through the blocks; the decoder attends to `encoded`.
    /// `padding`: the encoder's additive padding mask `[b, 1, 1, s_enc]` (0 to attend, the
    /// dtype's minimum not to), added to the encoder's self-attention and the decoder's
    /// cross-attention scores, as transformers adds its extended attention mask.
    fn run(&self, h: Tensor, encoded: Option<&Tensor>, padding: Option<&Tensor>) -> ferrite_nn::Result<Tensor> {
        self.run_cached(h, encoded, padding, None)
    }

    /// [`T5Stack::run`] from the positions after those `cache` holds (the decoder's): the
    /// position bias is the rows of the new positions, and each block reads and extends its part
    /// of the cache. The caller advances [`T5Cache::len`].
    pub(crate) fn run_cached(
        &self,
        h: Tensor,
        encoded: Option<&Tensor>,
        padding: Option<&Tensor>,
        mut cache: Option<&mut T5Cache>,
    ) -> ferrite_nn::Result<Tensor> {
        let name = if self.decoder { "decoder" } else { "encoder" };
        let len = h.shape().get(1).copied().unwrap_or(0);
        let offset = cache.as_ref().map_or(0, |c| c.len);
        let bias = match self.blocks.first() {
            Some(b) => {
                mark_layer(&format!("{name}.block.0"));
                b.self_attn.position_bias(len, offset, self.decoder, self.num_buckets, self.max_distance, h.device())?
            }
            None => None,
        };
        // HF: the encoder's position bias plus its padding mask, once per stack.
        let bias = match (bias, padding, self.decoder) {
            (Some(b), Some(m), false) => Some(b.add(m)?),
            (None, Some(m), false) => Some(m.clone()),
            (b, _, _) => b,
        };
        let cross_bias = if self.decoder { padding } else { None };
        let mut h = self.drop.apply(&h, self.training)?;
        for (i, block) in self.blocks.iter().enumerate() {
            mark_layer(&format!("{name}.block.{i}"));
            h = if let Some(c) = cache.as_deref_mut() {
                let layer = c.layers.get_mut(i).ok_or_else(|| ferrite_nn::NnError::InvalidConfig {
                    layer: "T5Stack",
                    detail: format!("the cache has no layer {i}; make it with this model's `new_cache()`"),
                })?;
                block.run_cached(&h, bias.as_ref(), encoded, cross_bias, Some(layer))?
            } else if self.checkpoint_activations && is_grad_enabled() {
                let b = block.clone();
                let mut inputs = vec![&h];
                inputs.extend(bias.as_ref());
                inputs.extend(encoded);
                inputs.extend(cross_bias);
                let (has_bias, has_enc, has_cross) = (bias.is_some(), encoded.is_some(), cross_bias.is_some());
                checkpoint(
                    move |xs| {
                        let mut rest = xs[1..].iter();
                        let bias = if has_bias { rest.next() } else { None };
                        let enc = if has_enc { rest.next() } else { None };
                        let cross = if has_cross { rest.next() } else { None };
                        b.run(&xs[0], bias, enc, cross)
                    },
                    &inputs,
                )?
            } else {
                block.run(&h, bias.as_ref(), encoded, cross_bias)?
            };
        }
        mark_layer(&format!("{name}.final_layer_norm"));
        self.drop.apply(&self.final_layer_norm.forward(&h)?, self.training).map_err(Into::into)
    }
}

impl Module for T5Stack {
    fn set_activation_checkpointing(&mut self, on: bool) -> bool {
        self.checkpoint_activations = on;
        true
    }
    fn type_name(&self) -> &'static str {
        "T5Stack"
    }
    /// An encoder stack over embedded tokens.
    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        self.run(x.clone(), None, None)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut c: Vec<(String, &dyn Module)> =
            self.blocks.iter().enumerate().map(|(i, b)| (format!("block.{i}"), b as &dyn Module)).collect();
        c.push(("final_layer_norm".into(), &self.final_layer_norm));
        c
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut c: Vec<(String, &mut dyn Module)> =
            self.blocks.iter_mut().enumerate().map(|(i, b)| (format!("block.{i}"), b as &mut dyn Module)).collect();
        c.push(("final_layer_norm".into(), &mut self.final_layer_norm));
        c
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// HF's `T5ForConditionalGeneration`: shared embedding, encoder, decoder, head.
#[derive(Clone, Debug)]
pub struct T5Model {
    shared: Embedding,
    encoder: T5Stack,
    decoder: T5Stack,
    /// `None`: tied to `shared`.
    lm_head: Option<Linear>,
    d_model: usize,
    /// Scale the decoder's output by `d_model^-0.5` ([`T5Config::scale_decoder_outputs`]).
    scale: bool,
    config: T5Config,
    training: bool,
}

impl T5Model {
    /// The configuration it was built from.
    pub fn config(&self) -> &T5Config {
        &self.config
    }

    /// An empty cache for [`T5Model::decode_with_cache`].
    pub fn new_cache(&self) -> T5Cache {
        T5Cache::for_layers(self.decoder.blocks.len())
    }

    /// The logits of decoder tokens `decoder_ids` `[b, t]` at the positions after those `cache`
    /// holds, attending to `encoded` (from [`T5Model::encode`] with the same `attention_mask`);
    /// their keys and values are appended to the cache. The first call also projects `encoded`
    /// to every layer's cross-attention keys and values; later calls reuse them (`encoded` must
    /// be the same tensor each time). With `last_only`, only the last position's logits
    /// (`[b, 1, vocab]`), which is all a decoding step needs. Equals [`T5Model::decode`] over
    /// every position so far, position by position (tested).
    pub fn decode_with_cache(
        &self,
        decoder_ids: &Tensor,
        encoded: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: &mut T5Cache,
        last_only: bool,
    ) -> ferrite_nn::Result<Tensor> {
        cache.check_use(self.decoder.blocks.len(), decoder_ids, encoded)?;
        let logits = self.decode_from(decoder_ids, encoded, attention_mask, Some(cache), last_only)?;
        cache.len += decoder_ids.shape()[1];
        Ok(logits)
    }

    /// Every dropout of the model draws from `rng` from now on (a trainer's dropout generator,
    /// which its checkpoints save and restore). The default is a generator seeded with 0.
    pub fn set_dropout_rng(&mut self, rng: RngHandle) {
        for stack in [&mut self.encoder, &mut self.decoder] {
            stack.drop.rng = rng.clone();
            for b in &mut stack.blocks {
                b.drop.rng = rng.clone();
                b.self_attn.drop.rng = rng.clone();
                b.ff.drop.rng = rng.clone();
                if let Some((a, _)) = &mut b.cross {
                    a.drop.rng = rng.clone();
                }
            }
        }
    }

    /// The encoder's output `[b, s, d_model]` for token ids `[b, s]`; `attention_mask` `[b, s]`
    /// (1 for a token, 0 for padding; any integer or float dtype) as transformers' `attention_mask`.
    pub fn encode(&self, ids: &Tensor, attention_mask: Option<&Tensor>) -> ferrite_nn::Result<Tensor> {
        let padding = attention_mask.map(padding_bias).transpose()?;
        self.encoder.run(self.shared.forward(ids)?, None, padding.as_ref())
    }

    /// The logits `[b, t, vocab]` of decoder tokens `[b, t]` attending to `encoded` (from
    /// [`T5Model::encode`] with the same `attention_mask`).
    pub fn decode(
        &self,
        decoder_ids: &Tensor,
        encoded: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> ferrite_nn::Result<Tensor> {
        self.decode_from(decoder_ids, encoded, attention_mask, None, false)
    }

    /// [`T5Model::decode`], from the positions after those `cache` holds when given (see
    /// [`T5Model::decode_with_cache`]); with `last_only`, only the last position's logits.
    pub(crate) fn decode_from(
        &self,
        decoder_ids: &Tensor,
        encoded: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: Option<&mut T5Cache>,
        last_only: bool,
    ) -> ferrite_nn::Result<Tensor> {
        let padding = attention_mask.map(padding_bias).transpose()?;
        let embedded = self.shared.forward(decoder_ids)?;
        let mut h = self.decoder.run_cached(embedded, Some(encoded), padding.as_ref(), cache)?;
        let s = h.shape().get(1).copied().unwrap_or(0);
        if last_only && s > 1 {
            h = h.narrow(1, s - 1, 1)?;
        }
        mark_layer("lm_head");
        let h = if self.scale { h.mul_scalar((self.d_model as f64).powf(-0.5))? } else { h };
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => Ok(h.matmul(&self.shared.weight.t()?)?),
        }
    }
}

/// transformers' extended attention mask: `[b, s]` ones and zeros to an additive `[b, 1, 1, s]`
/// f32 bias, 0 where the mask is 1 and `f32::MIN` where it is 0.
fn padding_bias(mask: &Tensor) -> ferrite_nn::Result<Tensor> {
    if mask.rank() != 2 {
        return Err(ferrite_nn::NnError::InvalidConfig {
            layer: "T5ForConditionalGeneration",
            detail: format!("attention_mask must be [batch, seq], got {:?}", mask.shape()),
        });
    }
    Ok(mask.to_dtype(DType::F32)?.rsub_scalar(1.0)?.mul_scalar(f32::MIN as f64)?.unsqueeze(1)?.unsqueeze(1)?)
}

impl Module for T5Model {
    fn type_name(&self) -> &'static str {
        "T5ForConditionalGeneration"
    }

    /// Token ids `[batch, 2, seq]` (encoder input, decoder input) or `[batch, 3, seq]` (with the
    /// encoder's attention mask, 1 for a token and 0 for padding, as the third row) to logits
    /// `[batch, seq, vocab]`.
    fn forward(&self, ids: &Tensor) -> ferrite_nn::Result<Tensor> {
        if ids.rank() != 3 || !(ids.shape()[1] == 2 || ids.shape()[1] == 3) {
            return Err(ferrite_nn::NnError::InvalidConfig {
                layer: "T5ForConditionalGeneration",
                detail: format!(
                    "input must be [batch, 2, seq] (encoder tokens, decoder tokens) or [batch, 3, seq] (and the encoder's attention mask), got {:?}",
                    ids.shape()
                ),
            });
        }
        let enc_ids = ids.select(1, 0)?;
        let dec_ids = ids.select(1, 1)?;
        let mask = if ids.shape()[1] == 3 { Some(ids.select(1, 2)?) } else { None };
        let encoded = self.encode(&enc_ids, mask.as_ref())?;
        self.decode(&dec_ids, &encoded, mask.as_ref())
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut c: Vec<(String, &dyn Module)> =
            vec![("shared".into(), &self.shared), ("encoder".into(), &self.encoder), ("decoder".into(), &self.decoder)];
        if let Some(h) = &self.lm_head {
            c.push(("lm_head".into(), h));
        }
        c
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut c: Vec<(String, &mut dyn Module)> = vec![
            ("shared".into(), &mut self.shared),
            ("encoder".into(), &mut self.encoder),
            ("decoder".into(), &mut self.decoder),
        ];
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

    #[test]
    fn buckets_follow_t5_rules() {
        // Encoder (bidirectional, 32 buckets): 16 per direction, 8 exact distances each.
        assert_eq!(relative_position_bucket(0, true, 32, 128), 0);
        assert_eq!(relative_position_bucket(-7, true, 32, 128), 7);
        assert_eq!(relative_position_bucket(7, true, 32, 128), 16 + 7);
        // Beyond max_distance everything lands in the last bucket of its direction.
        assert_eq!(relative_position_bucket(-1000, true, 32, 128), 15);
        assert_eq!(relative_position_bucket(1000, true, 32, 128), 31);
        // Decoder (causal): future keys share bucket 0, 16 exact distances into the past.
        assert_eq!(relative_position_bucket(5, false, 32, 128), 0);
        assert_eq!(relative_position_bucket(-15, false, 32, 128), 15);
        assert_eq!(relative_position_bucket(-1000, false, 32, 128), 31);
        // Logarithmic buckets grow monotonically with distance.
        let mut last = 0;
        for n in 0..200 {
            let b = relative_position_bucket(-n, false, 32, 128);
            assert!(b >= last && b < 32);
            last = b;
        }
    }

    #[test]
    fn absurd_sizes_are_refused() {
        let base = r#"{"model_type": "t5", "d_model": 8, "d_kv": 4, "d_ff": 16, "num_heads": 2, "num_layers": 1, "vocab_size": 10}"#;
        let e = |from: &str, to: &str| T5Config::from_json(&base.replace(from, to), "config.json").unwrap_err();
        let err = e(r#""num_layers": 1"#, r#""num_layers": 1073741824"#);
        assert!(matches!(err, ModelError::ConfigLimit { .. }), "{err}");
        assert!(err.to_string().contains("num_layers") && err.to_string().contains("1073741824"), "{err}");
        let err = e(r#""d_model": 8"#, r#""d_model": 1099511627776"#);
        assert!(err.to_string().contains("d_model") && err.to_string().contains("1099511627776"), "{err}");
        let huge = base
            .replace(r#""d_ff": 16"#, r#""d_ff": 2000000000"#)
            .replace(r#""d_model": 8"#, r#""d_model": 2000000000"#);
        let err = T5Config::from_json(&huge, "config.json").unwrap_err();
        assert!(matches!(&err, ModelError::ConfigLimit { figure, .. } if figure.contains("parameters")), "{err}");
        let mut c = T5Config::from_json(base, "c").unwrap();
        c.num_decoder_layers = usize::MAX;
        assert_eq!(c.num_parameters(), None);
        assert!(matches!(T5Model::new(&c, &Device::Meta, false), Err(ModelError::ConfigLimit { .. })));
    }

    #[test]
    fn bad_configs_name_the_key() {
        let e = |json: &str| T5Config::from_json(json, "config.json").unwrap_err().to_string();
        let msg = e(r#"{"model_type": "t5", "d_model": 8, "d_kv": 4, "d_ff": 16, "num_heads": 2, "vocab_size": 10}"#);
        assert!(msg.contains("num_layers"), "{msg}");
        let msg = e(
            r#"{"model_type": "t5", "d_model": 8, "d_kv": 4, "d_ff": 16, "num_heads": 2, "num_layers": 1, "vocab_size": 10, "feed_forward_proj": "swish"}"#,
        );
        assert!(msg.contains("feed_forward_proj") && msg.contains("swish"), "{msg}");
    }
}
