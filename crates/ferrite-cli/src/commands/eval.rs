//! `ferrite eval --hf-model DIR --data FILE --seq N`: a Hugging Face model's loss and perplexity
//! on a text, defined so other tools can be compared with it:
//!
//! the whole text is tokenized with the model's `tokenizer.json`, adding no special tokens; the
//! ids are cut into consecutive, non-overlapping blocks of N tokens and the remainder is dropped;
//! the loss is the mean cross-entropy over every predicted position (N − 1 per block) — exactly
//! what `model(block, labels=block).loss` averages in transformers (tests compare with it).
use std::path::PathBuf;
use std::time::Instant;

use ferrite_data::{TokenBlocks, read_text_source};
use ferrite_memory::{allocator, format_size};
use ferrite_tensor::Device;
use ferrite_train::evaluate_causal_lm;

use super::CliResult;
use super::hf_model;

#[derive(clap::Args, Debug, Clone)]
pub struct EvalArgs {
    /// A Hugging Face model folder (`config.json`, weights, `tokenizer.json`): GPT-2, Llama,
    /// Mistral or Qwen2.
    #[arg(long)]
    pub hf_model: PathBuf,
    /// The text: a UTF-8 file (gzipped or not), or a folder whose .txt files are joined in name
    /// order with a newline.
    #[arg(long)]
    pub data: PathBuf,
    /// Tokens per block.
    #[arg(long)]
    pub seq: usize,
    /// Blocks per forward pass (memory, not the result).
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Device: `cpu`, `gpu:N`, or a simulated GPU (`sim:t4-16gb`).
    #[arg(long, default_value = "cpu", value_parser = super::train::parse_device)]
    pub device: Device,
    /// Machine-readable output: loss, perplexity, tokens, blocks, …
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub adapter: super::lora_args::LoraAdapterArg,
}

pub fn run(args: EvalArgs) -> CliResult {
    if args.batch_size == 0 {
        return Err("--batch-size 0: give at least 1 block per forward pass".into());
    }
    let dir = hf_model::open(&args.hf_model, "eval")?;
    dir.check_seq(args.seq)?;
    let (text, _) = read_text_source(&args.data)?;
    let start = Instant::now();
    let ids = dir.tokenizer.encode(&text, false)?;
    let tokens = ids.len();
    let blocks = TokenBlocks::new(ids, args.seq, &args.data.display().to_string())?;
    let n_blocks = ferrite_data::Dataset::len(&blocks);
    let mut model = dir.load(&args.device)?;
    let adapter = super::lora_args::attach_adapter(&args.adapter, &mut model)?;
    let mut loader = {
        let b = blocks.tensor_loader().batch_size(args.batch_size);
        if args.device == Device::Cpu { b.build()? } else { b.stage_to(args.device.clone()).build()? }
    };
    let result = evaluate_causal_lm(&mut model, &mut loader)?;
    let seconds = start.elapsed().as_secs_f64();
    let peak = allocator(&args.device).max_memory_reserved();
    if args.json {
        let v = serde_json::json!({
            "model": args.hf_model.display().to_string(),
            "data": args.data.display().to_string(),
            "loss": result.loss,
            "perplexity": result.perplexity,
            "tokens": tokens,
            "blocks": n_blocks,
            "seq": args.seq,
            "predicted_tokens": result.predicted,
            "dropped_tokens": tokens - n_blocks * args.seq,
            "device": args.device.to_string(),
            "peak_reserved_bytes": peak,
            "seconds": seconds,
            "lora": args.adapter.lora.as_ref().map(|d| d.display().to_string()),
        });
        println!("{v}");
    } else {
        println!(
            "ferrite eval: {} on {} ({tokens} tokens: {n_blocks} blocks of {}, {} dropped) on {}",
            args.hf_model.display(),
            args.data.display(),
            args.seq,
            tokens - n_blocks * args.seq,
            args.device
        );
        if let Some(line) = &adapter {
            println!("{line}");
        }
        println!(
            "loss {:.4}  perplexity {:.2}  over {} predicted tokens  | peak reserved {}  | {seconds:.1}s",
            result.loss,
            result.perplexity,
            result.predicted,
            format_size(peak)
        );
    }
    Ok(())
}
