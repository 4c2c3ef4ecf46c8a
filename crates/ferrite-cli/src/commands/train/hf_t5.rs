//! `ferrite train --hf-model DIR --data FILE.jsonl --seq N` for a T5 folder: sequence-to-sequence
//! fine-tuning on input/target pairs, written back as a folder `transformers` loads with
//! `AutoModelForSeq2SeqLM.from_pretrained` (`--out DIR`).
//!
//! Data: JSON Lines (a file, or a folder of `.jsonl` files), one `{"input": ..., "target": ...}`
//! object per line (`--input-field`, `--target-field` name other fields), each text tokenized
//! with the folder's `tokenizer.json` *with* its special tokens (T5's `</s>`) and cut to `--seq`
//! tokens; inputs padded with the pad id and an attention mask, labels padded with −100, the
//! decoder's input the labels shifted right behind `decoder_start_token_id`
//! ([`ferrite_data::Seq2SeqExamples`], transformers' `DataCollatorForSeq2Seq`). The last 10 % of
//! the examples are the validation set. The loss is T5's, the mean over the target tokens
//! ([`ferrite_train::Seq2SeqStep`]); everything else is the decoder path's (`hf.rs`): the trainer
//! library's loop, schedule, AMP, checkpoints, the memory line, DDP over MPI.
use ferrite_data::{Dataset, Seq2SeqExamples, read_seq2seq_pairs};
use ferrite_models::{HfLoadOptions, HfSaveOptions, parse_shard_size};
use ferrite_nn::Module;
use ferrite_tensor::Device;
use ferrite_train::distributed::Distributed;
use ferrite_train::{Seq2SeqStep, evaluate_seq2seq};

use super::hf_trainer::{HfRun, TRAIN_FRACTION, invalid, out_dir};
use super::{TrainArgs, TrainError};
use crate::commands::hf_model::HfModelDir;
use crate::commands::lora_args;

/// Fine-tunes the T5 folder `dir` (opened by `hf::train`) on `--data` (see the module docs);
/// with `dist`, as one rank of a DistributedDataParallel job, as the decoders are.
pub(super) fn train(
    args: &TrainArgs,
    device: &Device,
    dist: Option<&Distributed>,
    dir: HfModelDir,
    data: &std::path::Path,
) -> Result<(), TrainError> {
    let Some(model_dir) = &args.hf_model else {
        return Err(invalid("hf-model", "", "a Hugging Face model folder"));
    };
    let max_shard_size = parse_shard_size(&args.max_shard_size)?;
    let seq = args.shape.seq;
    dir.check_seq(seq)?;
    let config = dir.folder.t5_config()?;

    // ---- data
    let pairs = read_seq2seq_pairs(data, &args.input_field, &args.target_field)?;
    let all = Seq2SeqExamples::tokenize(&dir.tokenizer, &pairs, seq, dir.seq2seq_tokens()?)?;
    let truncated = all.truncated();
    let (train_blocks, val_blocks) = all.split(TRAIN_FRACTION);
    let train_blocks = match args.train_subset {
        Some(n) if n < train_blocks.len() => train_blocks.take(n),
        _ => train_blocks,
    };
    let n_train = train_blocks.len();
    let n_val = val_blocks.as_ref().map_or(0, Dataset::len);
    let mut run = HfRun::new(args, device, dist, n_train)?;
    let (mut train_loader, mut val_loader) =
        run.loaders(args, device, train_blocks.tensor_loader(), val_blocks.map(Seq2SeqExamples::tensor_loader))?;

    // ---- model
    // `--base-dtype`: built and read in that dtype from the start (see hf.rs).
    let load = HfLoadOptions { dtype: super::hf_weights_dtype(args), strict: true };
    let mut model = dir.folder.load_t5(run.model_device(device), &load)?.0;
    // The config's dropouts draw from the trainer's generator, which checkpoints save.
    let dropout_rng = ferrite_nn::RngHandle::new(run.seeds.next_u64());
    model.set_dropout_rng(dropout_rng.clone());
    let lora = lora_args::prepare_training(&args.lora, &mut model, &config.model_type, args.seed, &dropout_rng)?;
    let sync = run.gradient_sync(args, &model)?;
    let name = format!(
        "{} ({}+{} layers x {}, {}, vocabulary {})",
        model.type_name(),
        config.num_layers,
        config.num_decoder_layers,
        config.d_model,
        config.feed_forward.name(),
        config.vocab_size
    );
    println!(
        "ferrite train: {} on {} ({} examples: {n_train} training / {n_val} validation, inputs and targets of at most {seq} tokens, {truncated} texts cut), {name} on {}",
        model_dir.display(),
        data.display(),
        pairs.len(),
        run.placement(device),
    );
    run.print_sizes_and_schedule(args, &model);
    if let Some(l) = &lora {
        println!("{}", l.line);
    }
    if config.dropout_rate > 0.0 {
        println!("  dropout from config.json: dropout_rate {}", config.dropout_rate);
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
        Seq2SeqStep,
        |m, v| evaluate_seq2seq(m, v),
    )?;
    let out = out_dir(args, model_dir);
    let options = HfSaveOptions { max_shard_size, copy_from: Some(dir.folder.dir.clone()) };
    let mut how = String::new();
    if run.writes() {
        how = lora_args::save_trained(
            &args.lora,
            lora.as_ref().map(|l| &l.config),
            &mut model,
            "AutoModelForSeq2SeqLM",
            model_dir,
            &dir.folder.config_text,
            &out,
            &options,
        )?;
    }
    end.finish(&run, device, &out, &how)?;
    Ok(())
}
