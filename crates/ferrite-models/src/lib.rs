//! ferrite's model architectures, each once: what `ferrite train` trains, what `ferrite plan`
//! plans, and what a library user builds.
//!
//! Why a crate of its own: the planner must plan exactly the model the trainer trains, so neither
//! may own the architecture. Both sit above this crate (nn ← models ← plan ← train ← cli).
//!
//! | model | file | parameter names |
//! |---|---|---|
//! | [`Mlp`] | `mlp.rs` | PyTorch's `nn.Sequential` of `Linear`+`ReLU` blocks (`0.0.weight`, …) |
//! | [`Cnn`] | `cnn.rs` | PyTorch's `nn.Sequential` of conv-bn-relu-pool blocks (`0.0.weight`, …) |
//! | [`LstmLm`] | `lstm_lm.rs` | PyTorch's word-language-model example (`encoder.weight`, `rnn.weight_ih_l0`, …) |
//! | [`TransformerLm`] | `transformer_lm.rs` | a minimal GPT (`tok_emb.weight`, `blocks.0.self_attn.in_proj_weight`, …) |
//! | [`Decoder`] | `hf_decoder.rs` | Hugging Face's `GPT2LMHeadModel` (`transformer.h.0.attn.c_attn.weight`, …), `LlamaForCausalLM`, Mistral, Qwen2 (`model.layers.0.self_attn.q_proj.weight`, …) from `config.json` |
//! | [`T5Model`] | `t5.rs` | Hugging Face's `T5ForConditionalGeneration` |
//! | [`T5Cache`] | `t5_cache.rs` | T5's decoder key/value cache (transformers' `EncoderDecoderCache`) |
//! | [`generate`] | `generate.rs` | greedy and sampled continuation with a [`KvCache`] |
//! | [`generate_seq2seq`] | `seq2seq.rs` | T5's shifted decoder input, loss over labels ≠ −100, and generation |
//! | LoRA adapters | `lora_adapter.rs` | PEFT's adapter folder (`base_model.model.<module>.lora_A.weight`) |
//! | [`HfFolder`] | `hf_folder.rs` | a `save_pretrained` folder: `config.json`, safetensors (sharded or not) or `pytorch_model.bin` |
//!
//! Sizes read from a `config.json` are checked against [`limits`] before anything is built.
//!
//! Models announce the layer their forward pass enters with `ferrite_nn::mark_layer`, which the
//! planner listens to for its activations-by-layer breakdown (a no-op otherwise).

mod causal_lm;
mod cnn;
mod conv1d;
mod error;
mod generate;
mod hf_decoder;
mod hf_folder;
pub mod limits;
mod lora_adapter;
mod lstm_lm;
mod mlp;
mod seq2seq;
mod t5;
mod t5_cache;
mod transformer_lm;

pub use causal_lm::causal_lm_loss;
pub use cnn::{Cnn, CnnSpec, build_cnn};
pub use conv1d::Conv1D;
pub use error::ModelError;
pub use generate::{Decoding, GenerateOptions, Generated, generate};
pub use hf_decoder::{Block, Decoder, HfActivation, HfConfig, HfStyle, KvCache, RopeScaling};
pub use hf_folder::{
    COMPANION_FILES, HfFolder, HfLoadOptions, HfSaveOptions, WeightFiles, decoder_keys, parse_shard_size, save_decoder,
    save_decoder_with,
};
pub use lora_adapter::{
    ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoraAdapterConfig, PEFT_PREFIX, adapter_tensors, load_lora_adapter,
    parse_adapter_config, read_adapter_config, save_lora_adapter,
};
pub use lstm_lm::{LstmLm, LstmSpec, LstmState, build_lstm};
pub use mlp::{Mlp, MlpSpec, build_mlp};
pub use seq2seq::{IGNORE_LABEL, generate_seq2seq, scored_labels, seq2seq_loss};
pub use t5::{T5Attention, T5Block, T5Config, T5DenseFf, T5FeedForward, T5Model, T5Stack, relative_position_bucket};
pub use t5_cache::T5Cache;
pub use transformer_lm::{TransformerLm, TransformerSpec, build_transformer};
