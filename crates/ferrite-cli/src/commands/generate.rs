//! `ferrite generate --hf-model DIR --prompt TEXT --max-new-tokens K`: a continuation of the
//! prompt, greedy (`--greedy`, the default: transformers' `do_sample=False`, token for token) or
//! sampled (`--temperature`, `--top-k`, `--top-p`, `--seed`), with a key/value cache so each new
//! token costs one position; it stops at the model's EOS id (`generation_config.json`, else
//! `config.json`).
//!
//! A T5 folder reads the prompt as its input (tokenized with the special tokens, as in training)
//! and writes the output from `decoder_start_token_id`: the encoder runs once, and the decoder
//! one position per new token with a `T5Cache` (self-attention keys and values, plus the
//! cross-attention's projected from the encoder's output once: `ferrite_models::generate_seq2seq`).
use std::path::PathBuf;

use ferrite_models::{Decoding, GenerateOptions, generate, generate_seq2seq};
use ferrite_nn::Module;
use ferrite_tensor::Device;

use super::CliResult;
use super::hf_model;

#[derive(clap::Args, Debug, Clone)]
pub struct GenerateArgs {
    /// A Hugging Face model folder (`config.json`, weights, `tokenizer.json`).
    #[arg(long)]
    pub hf_model: PathBuf,
    /// The text to continue (tokenized without special tokens).
    #[arg(long)]
    pub prompt: String,
    /// New tokens at most (fewer when the model writes its EOS token).
    #[arg(long, default_value_t = 32)]
    pub max_new_tokens: usize,
    /// The most likely token each time (the default).
    #[arg(long, conflicts_with_all = ["temperature", "top_k", "top_p"])]
    pub greedy: bool,
    /// Sample with this softmax temperature (> 0) instead of greedy decoding.
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Sample among the K most likely tokens only.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample among the most likely tokens whose probability reaches P (nucleus sampling).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Seed of the sampling (the same seed gives the same text).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Device: `cpu`, `gpu:N`.
    #[arg(long, default_value = "cpu", value_parser = super::train::parse_device)]
    pub device: Device,
    /// Machine-readable output: ids (the new tokens), text, tokens per second.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub adapter: super::lora_args::LoraAdapterArg,
}

pub fn run(args: GenerateArgs) -> CliResult {
    let dir = hf_model::open(&args.hf_model, "generate")?;
    let t5 = dir.is_t5();
    let prompt = dir.tokenizer.encode(&args.prompt, t5)?;
    if prompt.is_empty() {
        return Err(format!("--prompt {:?} tokenizes to no tokens; give some text to continue", args.prompt).into());
    }
    let sampling = args.temperature.is_some() || args.top_k.is_some() || args.top_p.is_some();
    let decoding = if sampling {
        Decoding::Sample {
            temperature: args.temperature.unwrap_or(1.0),
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        }
    } else {
        Decoding::Greedy
    };
    let options =
        GenerateOptions { max_new_tokens: args.max_new_tokens, decoding, eos_token_ids: dir.folder.eos_token_ids() };
    let (out, adapter) = if t5 {
        let mut model = dir.load_t5(&args.device)?;
        let adapter = super::lora_args::attach_adapter(&args.adapter, &mut model)?;
        model.eval();
        (generate_seq2seq(&model, &prompt, &options)?, adapter)
    } else {
        let mut model = dir.load(&args.device)?;
        let adapter = super::lora_args::attach_adapter(&args.adapter, &mut model)?;
        model.eval();
        (generate(&model, &prompt, &options)?, adapter)
    };
    let text = dir.tokenizer.decode(&out.ids, true)?;
    let decode_tokens = out.ids.len().saturating_sub(1);
    let tokens_per_second = if out.decode.as_secs_f64() > 0.0 && decode_tokens > 0 {
        decode_tokens as f64 / out.decode.as_secs_f64()
    } else {
        f64::NAN
    };
    if args.json {
        let v = serde_json::json!({
            "prompt_ids": prompt,
            "ids": out.ids,
            "text": text,
            "stopped_at_eos": out.stopped_at_eos,
            "prefill_seconds": out.prefill.as_secs_f64(),
            "decode_seconds": out.decode.as_secs_f64(),
            "tokens_per_second": if tokens_per_second.is_finite() { serde_json::json!(tokens_per_second) } else { serde_json::Value::Null },
            "cache_bytes": out.cache_bytes,
        });
        println!("{v}");
    } else {
        if let Some(line) = &adapter {
            eprintln!("{line}");
        }
        if t5 {
            println!("{text}");
        } else {
            println!("{}{}", args.prompt, text);
        }
        eprintln!(
            "{} new tokens{} | prompt of {} tokens read in {:.3}s, then {} tokens/s | key/value cache {}{}",
            out.ids.len(),
            if out.stopped_at_eos { " (stopped at EOS)" } else { "" },
            prompt.len(),
            out.prefill.as_secs_f64(),
            if tokens_per_second.is_finite() { format!("{tokens_per_second:.1}") } else { "-".into() },
            ferrite_memory::format_size(out.cache_bytes as u64),
            if t5 { " (T5: decoder self- and cross-attention)" } else { "" },
        );
    }
    Ok(())
}
