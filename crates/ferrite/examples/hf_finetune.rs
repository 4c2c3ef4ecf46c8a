//! Fine-tune a Hugging Face causal LM folder with ferrite's `Trainer` and save a folder that
//! `transformers` loads unchanged — the library calls behind `ferrite train --hf-model`:
//! `cargo run --release --example hf_finetune [-- FOLDER] [--text FILE] [--out DIR] [--epochs N] [--seq N]`.
//!
//! FOLDER is what `save_pretrained` writes (`config.json`, `model.safetensors` or shards with their
//! index or `pytorch_model.bin`, and the fast tokenizer's `tokenizer.json`) for GPT-2, Llama,
//! Mistral or Qwen2; without one, the tiny random GPT-2 of ferrite-models' parity fixtures is
//! used on its own corpus. The text is tokenized with the folder's tokenizer, cut into blocks
//! (`TokenBlocks`, transformers' `group_texts`), trained with transformers' causal-LM loss
//! (`CausalLmStep`), evaluated with `evaluate_causal_lm`, and written with `save_decoder_with`
//! (config, weights, tokenizer and generation config): `AutoModelForCausalLM.from_pretrained(DIR)`
//! reads it.
use std::path::PathBuf;

use ferrite::data::{HfTokenizer, TokenBlocks};
use ferrite::models::{HfFolder, HfLoadOptions, HfSaveOptions, save_decoder_with};
use ferrite::prelude::*;
use ferrite::train::{CausalLmStep, evaluate_causal_lm};

fn flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let epochs: usize = flag("--epochs").map_or(Ok(2), |n| n.parse())?;
    let seq: usize = flag("--seq").map_or(Ok(16), |n| n.parse())?;
    let fixtures = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../ferrite-models/tests/data/hf"));
    let folder = match std::env::args().nth(1).filter(|a| !a.starts_with("--")) {
        Some(path) => PathBuf::from(path),
        None => fixtures.join("gpt2"),
    };
    let text_path = flag("--text").map_or_else(|| fixtures.join("text.txt"), PathBuf::from);
    let text = std::fs::read_to_string(&text_path).map_err(|e| format!("cannot read {}: {e}", text_path.display()))?;
    let out = flag("--out").map_or_else(|| std::env::temp_dir().join("ferrite-hf-finetuned"), PathBuf::from);

    let hf = HfFolder::open(&folder)?;
    let tokenizer_file = hf.tokenizer_file().ok_or("the folder has no tokenizer.json")?;
    let tokenizer = HfTokenizer::from_file(&tokenizer_file)?;
    let (model, _) = hf.load_decoder(&Device::Cpu, &HfLoadOptions::default())?;
    let blocks = TokenBlocks::new(tokenizer.encode(&text, false)?, seq, &text_path.display().to_string())?;
    let (train, val) = blocks.split(0.9);
    let val = val.ok_or("the text makes one block only; give a longer text or a smaller --seq")?;
    println!(
        "{}: {} with {} parameters; {} training / {} held-out blocks of {seq} tokens",
        folder.display(),
        model.type_name(),
        model.num_parameters(),
        train.len(),
        val.len()
    );
    let mut loader = train.tensor_loader().batch_size(8).shuffle(true).seed(0).build()?;
    let mut val_loader = val.tensor_loader().batch_size(8).build()?;

    let opt = Adam::named(model.named_parameters(), AdamConfig::adamw(1e-3))?;
    let mut trainer = Trainer::builder(model, opt)
        .epochs(epochs)
        .clip_grad_norm(1.0)
        .evaluate(move |m| Ok(Metrics::new().with("val_loss", evaluate_causal_lm(m, &mut val_loader)?.loss)))
        .on_epoch(|e| {
            let val = e.eval.get("val_loss").unwrap_or(f64::NAN);
            println!(
                "epoch {:>2}/{}  loss {:.4}  held-out loss {:.4} (perplexity {:.1})  | {}",
                e.epoch,
                e.epochs,
                e.mean_loss,
                val,
                val.exp(),
                e.memory_line
            )
        })
        .build()?;
    trainer.fit(&mut loader, CausalLmStep)?;

    let model = trainer.into_model();
    let options = HfSaveOptions { copy_from: Some(hf.dir.clone()), ..HfSaveOptions::default() };
    save_decoder_with(&model, &hf.config_text, &out, &options)?;
    println!(
        "fine-tuned model written to {} (config, weights, tokenizer); in Python: AutoModelForCausalLM.from_pretrained({:?})",
        out.display(),
        out.display().to_string()
    );
    Ok(())
}
