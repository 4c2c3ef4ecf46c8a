//! `ferrite train --hf-model DIR --data FILE|DIR --seq N`: causal-LM fine-tuning of a Hugging
//! Face decoder (GPT-2, Llama, Mistral, Qwen2) on the user's text, written back as a folder
//! `transformers` loads (`--out DIR`).
//!
//! Data: a text file is one document, a JSON Lines file one document per line (its `text`
//! field), a folder one document per `.txt` file and per `.jsonl` line; documents are tokenized
//! with the folder's `tokenizer.json` (no special tokens), joined with the model's EOS id, and cut
//! into blocks of `--seq` tokens (transformers' `group_texts`); the last 10 % of the blocks (at
//! least one, when there are two) are the validation set. The loss is transformers' causal-LM
//! loss; the trainer library runs the loop, so accumulation, AMP, clipping, checkpointing of
//! activations, resumable checkpoints, the memory line and the OOM report work as for every model.
use ferrite_data::{Dataset, TokenBlocks, read_documents, tokenize_documents};
use ferrite_models::{HfLoadOptions, HfSaveOptions, parse_shard_size};
use ferrite_nn::Module;
use ferrite_tensor::Device;
use ferrite_train::distributed::Distributed;
use ferrite_train::{CausalLmStep, evaluate_causal_lm};

use super::hf_trainer::{HfRun, TRAIN_FRACTION, invalid, out_dir};
use super::{TrainArgs, TrainError};
use crate::commands::{hf_model, lora_args};

/// Fine-tunes the `--hf-model` folder on `--data` (see the module docs); with `dist`, as one rank
/// of a DistributedDataParallel job: each rank reads its share of the blocks (the same
/// permutation on every rank), gradients are averaged, the validation blocks are shared and the
/// losses summed, rank 0 prints and writes.
pub fn train(args: &TrainArgs, device: &Device, dist: Option<&Distributed>) -> Result<(), TrainError> {
    let Some(model_dir) = &args.hf_model else {
        return Err(invalid("hf-model", "", "a Hugging Face model folder"));
    };
    let Some(data) = &args.data else {
        return Err(invalid(
            "data",
            "",
            "your text with --hf-model: a .txt file, a .jsonl file with a `text` field per line, or a folder of them (T5: JSON Lines of input/target pairs)",
        ));
    };
    let dir = hf_model::open(model_dir, "train")?;
    if dir.is_t5() {
        return super::hf_t5::train(args, device, dist, dir, data);
    }
    let max_shard_size = parse_shard_size(&args.max_shard_size)?;
    let seq = args.shape.seq;
    dir.check_seq(seq)?;
    let config = dir.folder.decoder_config()?;
    let eos = dir.folder.eos_token_ids().first().copied();

    // ---- data
    let docs = read_documents(data, "text")?;
    let ids = tokenize_documents(&dir.tokenizer, &docs, eos)?;
    let tokens = ids.len();
    let all = TokenBlocks::new(ids, seq, &data.display().to_string())?;
    let (train_blocks, val_blocks) = all.split(TRAIN_FRACTION);
    let train_blocks = match args.train_subset {
        Some(n) if n < train_blocks.len() => train_blocks.split(n as f64 / train_blocks.len() as f64).0,
        _ => train_blocks,
    };
    let n_train = train_blocks.len();
    let n_val = val_blocks.as_ref().map_or(0, Dataset::len);
    let mut run = HfRun::new(args, device, dist, n_train)?;
    let (mut train_loader, mut val_loader) =
        run.loaders(args, device, train_blocks.tensor_loader(), val_blocks.map(TokenBlocks::tensor_loader))?;

    // ---- model
    // `--base-dtype bf16|f16`: the weights are built and read in that dtype from the start, so
    // the peak never holds an f32 copy of a base that LoRA keeps frozen.
    let load = HfLoadOptions { dtype: super::hf_weights_dtype(args), strict: true };
    let mut model = dir.folder.load_decoder(run.model_device(device), &load)?.0;
    // The config's dropouts draw from the trainer's generator, which checkpoints save.
    let dropout_rng = ferrite_nn::RngHandle::new(run.seeds.next_u64());
    model.set_dropout_rng(dropout_rng.clone());
    let lora = lora_args::prepare_training(&args.lora, &mut model, &config.model_type, args.seed, &dropout_rng)?;
    let sync = run.gradient_sync(args, &model)?;
    let name = format!(
        "{} ({} layers x {}, vocabulary {})",
        model.type_name(),
        config.num_layers,
        config.hidden_size,
        config.vocab_size
    );
    println!(
        "ferrite train: {} on {} ({} documents, {tokens} tokens: {n_train} training / {n_val} validation blocks of {seq}), {name} on {}",
        model_dir.display(),
        data.display(),
        docs.len(),
        run.placement(device),
    );
    run.print_sizes_and_schedule(args, &model);
    if let Some(l) = &lora {
        println!("{}", l.line);
    }
    if config.attention_dropout + config.residual_dropout + config.embedding_dropout > 0.0 {
        println!(
            "  dropout from config.json: attention {}, residual {}, embeddings {}",
            config.attention_dropout, config.residual_dropout, config.embedding_dropout
        );
    }

    // ---- training
    let (mut model, end) = run.fit(
        args,
        device,
        model,
        sync,
        &name,
        data,
        &mut train_loader,
        val_loader.as_mut(),
        CausalLmStep,
        |m, v| evaluate_causal_lm(m, v),
    )?;
    let out = out_dir(args, model_dir);
    let options = HfSaveOptions { max_shard_size, copy_from: Some(dir.folder.dir.clone()) };
    let mut how = String::new();
    if run.writes() {
        how = lora_args::save_trained(
            &args.lora,
            lora.as_ref().map(|l| &l.config),
            &mut model,
            "AutoModelForCausalLM",
            model_dir,
            &dir.folder.config_text,
            &out,
            &options,
        )?;
    }
    end.finish(&run, device, &out, &how)?;
    Ok(())
}
