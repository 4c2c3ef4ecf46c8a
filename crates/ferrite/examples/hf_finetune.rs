//! Fine-tune a Hugging Face causal LM folder with ferrite's `Trainer` and save a folder that
//! `transformers` loads unchanged:
//! `cargo run --release --example hf_finetune [-- FOLDER] [--text FILE] [--out DIR] [--epochs N]`.
//!
//! FOLDER is what `save_pretrained` writes (`config.json` and `model.safetensors`, shards with
//! their index, or `pytorch_model.bin`) for GPT-2, Llama, Mistral or Qwen2; without one, the
//! tiny random GPT-2 of ferrite-models' parity fixtures is used. The weights load under their
//! Hugging Face names, the model trains on windows of the text with the next-token loss, and
//! `save_decoder` writes the fine-tuned weights next to the original `config.json`:
//! `AutoModelForCausalLM.from_pretrained(DIR)` reads them.
//!
//! Token ids: this example reads the text's bytes as ids (modulo the vocabulary), a stand-in for
//! the model's own tokenizer, which ferrite does not read yet; everything after the ids is what
//! a fine-tuning run with real tokens does.
use std::path::PathBuf;

use ferrite::models::{Decoder, HfFolder, HfLoadOptions, save_decoder};
use ferrite::prelude::*;

fn flag(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let epochs: usize = flag("--epochs").map_or(Ok(3), |n| n.parse())?;
    let folder = match std::env::args().nth(1).filter(|a| !a.starts_with("--")) {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../ferrite-models/tests/data/hf/gpt2")),
    };
    let text = match flag("--text") {
        Some(path) => std::fs::read_to_string(&path).map_err(|e| format!("cannot read --text {path}: {e}"))?,
        // This file's own source, so the example runs anywhere.
        None => include_str!("hf_finetune.rs").to_string(),
    };
    let out = flag("--out").map_or_else(|| std::env::temp_dir().join("ferrite-hf-finetuned"), PathBuf::from);

    let hf = HfFolder::open(&folder)?;
    let (model, _) = hf.load_decoder(&Device::Cpu, &HfLoadOptions::default())?;
    let config = model.config().clone();
    let vocab = config.vocab_size;
    // Windows no longer than the model's learned positions (GPT-2's `n_positions`).
    let seq = config.max_positions.clamp(2, 64) - 1;
    println!(
        "{}: {} with {} parameters, vocabulary {vocab}; training windows of {seq} tokens",
        folder.display(),
        model.type_name(),
        model.num_parameters()
    );

    let ids: Vec<i64> = text.bytes().map(|b| b as i64 % vocab as i64).collect();
    let windows: Vec<(Tensor, Tensor)> = ids
        .chunks_exact(seq + 1)
        .map(|w| {
            let x = Tensor::from_vec(w[..seq].to_vec(), &[seq], &Device::Cpu)?;
            let y = Tensor::from_vec(w[1..].to_vec(), &[seq], &Device::Cpu)?;
            Ok((x, y))
        })
        .collect::<Result<_, ferrite::tensor::TensorError>>()?;
    if windows.len() < 2 {
        return Err(format!("the text has {} bytes: too short for windows of {seq} tokens", text.len()).into());
    }
    let held_out = (windows.len() / 10).max(1);
    let (train, val) = windows.split_at(windows.len() - held_out);
    let val = val.to_vec();
    let mut loader = DataLoader::builder(InMemory::new(train.to_vec()))
        .batch_size(8)
        .shuffle(true)
        .seed(0)
        .collate(StackCollate)
        .build()?;

    // Next-token loss over every position: logits [b, s, vocab] against the shifted ids [b, s].
    let lm_loss = move |m: &Decoder, x: &Tensor, y: &Tensor| -> Result<Tensor, TrainError> {
        let logits = m.forward(x)?;
        Ok(CrossEntropyLoss::new().forward(&logits.reshape(&[-1, vocab as i64])?, &y.reshape(&[-1])?)?)
    };
    let opt = Adam::named(model.named_parameters(), AdamConfig::adamw(1e-3))?;
    let mut trainer = Trainer::builder(model, opt)
        .epochs(epochs)
        .clip_grad_norm(1.0)
        .evaluate(move |m: &mut Decoder| {
            let (xs, ys): (Vec<&Tensor>, Vec<&Tensor>) = val.iter().map(|(x, y)| (x, y)).unzip();
            let (x, y) = (Tensor::stack(&xs, 0)?, Tensor::stack(&ys, 0)?);
            let loss = inference(m, |m| {
                lm_loss(m, &x, &y)
                    .map_err(|e| ferrite::nn::NnError::InvalidConfig { layer: "evaluation", detail: e.to_string() })
            })?;
            Ok(Metrics::new().with("val_loss", loss.item()?))
        })
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
    trainer.fit(&mut loader, move |m: &Decoder, (x, y): &(Tensor, Tensor)| {
        Ok(StepOutput::new(lm_loss(m, x, y)?, y.numel()))
    })?;

    let model = trainer.into_model();
    save_decoder(&model, &hf.config_text, &out)?;
    println!(
        "fine-tuned weights written to {} with the original config.json; in Python: AutoModelForCausalLM.from_pretrained({:?})",
        out.display(),
        out.display().to_string()
    );
    Ok(())
}
