//! `ferrite eval --hf-model DIR --data FILE --seq N`: a Hugging Face model's loss and perplexity
//! on a text, defined so other tools can be compared with it:
//!
//! the whole text is tokenized with the model's `tokenizer.json`, adding no special tokens; the
//! ids are cut into consecutive, non-overlapping blocks of N tokens and the remainder is dropped;
//! the loss is the mean cross-entropy over every predicted position (N − 1 per block) — exactly
//! what `model(block, labels=block).loss` averages in transformers (tests compare with it).
//!
//! A T5 folder is evaluated on sequence-to-sequence data instead: a JSON Lines file of
//! `--input-field`/`--target-field` objects, each text tokenized with the special tokens and cut
//! to `--seq` tokens, as `ferrite train` reads it; the loss is the mean cross-entropy over every
//! target token (transformers' `model(input_ids, attention_mask, labels).loss`, weighted by each
//! example's target tokens).
use std::path::PathBuf;
use std::time::Instant;

use ferrite_data::{
    Collate, DataError, DataLoader, DataLoaderBuilder, Dataset, ToDevice, TokenBlocks, read_text_source,
};
use ferrite_memory::{allocator, format_size};
use ferrite_tensor::Device;
use ferrite_train::{evaluate_causal_lm, evaluate_seq2seq};

use super::CliResult;
use super::hf_model;

#[derive(clap::Args, Debug, Clone)]
pub struct EvalArgs {
    /// A Hugging Face model folder (`config.json`, weights, `tokenizer.json`): GPT-2, Llama,
    /// Mistral, Qwen2, or T5 (then --data is JSON Lines of input/target pairs).
    #[arg(long)]
    pub hf_model: PathBuf,
    /// The text: a UTF-8 file (gzipped or not), or a folder whose .txt files are joined in name
    /// order with a newline.
    #[arg(long)]
    pub data: PathBuf,
    /// Tokens per block (T5: tokens per input and per target, longer texts cut).
    #[arg(long)]
    pub seq: usize,
    /// T5: the JSON Lines field holding each example's input text.
    #[arg(long, default_value = "input")]
    pub input_field: String,
    /// T5: the JSON Lines field holding each example's target text.
    #[arg(long, default_value = "target")]
    pub target_field: String,
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
    if dir.is_t5() {
        return run_seq2seq(&args, &dir);
    }
    let (text, _) = read_text_source(&args.data)?;
    let start = Instant::now();
    let ids = dir.tokenizer.encode(&text, false)?;
    let tokens = ids.len();
    let blocks = TokenBlocks::new(ids, args.seq, &args.data.display().to_string())?;
    let n_blocks = ferrite_data::Dataset::len(&blocks);
    let mut model = dir.load(&args.device)?;
    let adapter = super::lora_args::attach_adapter(&args.adapter, &mut model)?;
    let mut loader = staged_loader(blocks.tensor_loader(), &args)?;
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

/// The evaluation loader: `--batch-size` examples per batch, moved to `--device` by the loader.
fn staged_loader<D, C>(builder: DataLoaderBuilder<D, C>, args: &EvalArgs) -> Result<DataLoader<D, C>, DataError>
where
    D: Dataset,
    C: Collate<D::Sample>,
    C::Batch: ToDevice,
{
    let b = builder.batch_size(args.batch_size);
    if args.device == Device::Cpu { b.build() } else { b.stage_to(args.device.clone()).build() }
}

/// `ferrite eval` of a T5 folder on input/target pairs (see the module docs).
fn run_seq2seq(args: &EvalArgs, dir: &hf_model::HfModelDir) -> CliResult {
    let start = Instant::now();
    let pairs = ferrite_data::read_seq2seq_pairs(&args.data, &args.input_field, &args.target_field)?;
    let examples = ferrite_data::Seq2SeqExamples::tokenize(&dir.tokenizer, &pairs, args.seq, dir.seq2seq_tokens()?)?;
    let truncated = examples.truncated();
    let mut model = dir.load_t5(&args.device)?;
    let adapter = super::lora_args::attach_adapter(&args.adapter, &mut model)?;
    let mut loader = staged_loader(examples.tensor_loader(), args)?;
    let result = evaluate_seq2seq(&mut model, &mut loader)?;
    let seconds = start.elapsed().as_secs_f64();
    let peak = allocator(&args.device).max_memory_reserved();
    if args.json {
        let v = serde_json::json!({
            "model": args.hf_model.display().to_string(),
            "data": args.data.display().to_string(),
            "loss": result.loss,
            "perplexity": result.perplexity,
            "examples": pairs.len(),
            "target_tokens": result.predicted,
            "truncated_texts": truncated,
            "seq": args.seq,
            "device": args.device.to_string(),
            "peak_reserved_bytes": peak,
            "seconds": seconds,
            "lora": args.adapter.lora.as_ref().map(|d| d.display().to_string()),
        });
        println!("{v}");
    } else {
        println!(
            "ferrite eval: {} on {} ({} examples, inputs and targets of at most {} tokens, {truncated} texts cut) on {}",
            args.hf_model.display(),
            args.data.display(),
            pairs.len(),
            args.seq,
            args.device
        );
        if let Some(line) = &adapter {
            println!("{line}");
        }
        println!(
            "loss {:.4}  perplexity {:.2}  over {} target tokens  | peak reserved {}  | {seconds:.1}s",
            result.loss,
            result.perplexity,
            result.predicted,
            format_size(peak)
        );
    }
    Ok(())
}
