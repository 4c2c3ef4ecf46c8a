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
use std::path::PathBuf;
use std::time::Instant;

use ferrite_data::{Dataset, DistributedSampler, Seq2SeqExamples, read_seq2seq_pairs};
use ferrite_memory::{allocator, format_size, select_devices};
use ferrite_models::{HfSaveOptions, parse_shard_size, save_decoder_with};
use ferrite_nn::Module;
use ferrite_tensor::Device;
use ferrite_train::distributed::{Distributed, EvalShare};
use ferrite_train::{Metrics, Seq2SeqStep, evaluate_seq2seq, seconds, start_observer};

use super::settings::{configure, describe_settings};
use super::{LrSchedule, TrainArgs, TrainError, data_parallel};
use crate::commands::hf_model::HfModelDir;

use super::hf_trainer::{TRAIN_FRACTION, invalid, trainer_builder};

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
    let ranks = dist.map_or(1, Distributed::world_size);
    let micro_batches = n_train.div_ceil(ranks).div_ceil(args.batch_size);
    let steps_per_epoch = micro_batches.div_ceil(args.accum_steps) as u64;
    let epochs = match (args.epochs, args.steps) {
        (Some(e), _) => e,
        (None, Some(s)) => s.div_ceil(steps_per_epoch.max(1)) as usize,
        (None, None) => 1,
    };
    // The schedule's length: --steps when given (also when --epochs stops the run earlier, so an
    // interrupted run and its resumption share one schedule), else every step of the epochs.
    let total_steps = args.steps.unwrap_or(steps_per_epoch * epochs as u64);

    // --devices/--data-parallel: DataParallel over these devices, the first the primary one.
    let devices =
        data_parallel::requested(args).then(|| select_devices(device, args.devices.as_deref())).transpose()?;
    let primary = devices.as_ref().and_then(|d| d.first()).unwrap_or(device);
    let mut seeds = ferrite_tensor::Generator::new(args.seed);
    let loader_seed = seeds.next_u64();
    let sampler = match dist {
        Some(d) => Some(DistributedSampler::new(d.world_size(), d.rank())?.seed(loader_seed)),
        None => None,
    };
    let mut train_loader = {
        let b = train_blocks.tensor_loader().batch_size(args.batch_size).seed(loader_seed);
        let b = match &sampler {
            Some(s) => b.sampler(s.clone()),
            None => b.shuffle(true),
        };
        let b = b.num_workers(args.workers);
        // Under DataParallel the batches stay on the host: each replica's shard is copied to
        // its device.
        if *device == Device::Cpu || devices.is_some() { b.build()? } else { b.stage_to(device.clone()).build()? }
    };
    let mut val_loader = match val_blocks {
        Some(v) => {
            let b = v.tensor_loader().batch_size(args.batch_size).num_workers(args.workers);
            let b = match dist {
                Some(d) => b.sampler(EvalShare::new(d.world_size(), d.rank())),
                None => b,
            };
            Some(if *primary == Device::Cpu { b.build()? } else { b.stage_to(primary.clone()).build()? })
        }
        None => None,
    };

    // ---- model
    let mut model = dir.load_t5(if devices.is_some() { &Device::Cpu } else { device })?;
    // The config's dropouts draw from the trainer's generator, which checkpoints save.
    let dropout_rng = ferrite_nn::RngHandle::new(seeds.next_u64());
    model.set_dropout_rng(dropout_rng.clone());
    let parameters: usize = model.parameters().iter().map(|p| p.numel()).sum();
    // Distributed: rank 0's weights are broadcast now, and gradients are averaged in backward;
    // with --zero, AdamW over this rank's shards only (and gradients sharded at stage 2).
    let sync = match args.zero {
        Some(stage) => dist.map(|d| d.zero_for(&model, stage)).transpose()?,
        None => dist.map(|d| d.sync_for(&model)).transpose()?,
    };
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
        "ferrite train: {} on {} ({} examples: {n_train} training / {n_val} validation, inputs and targets of at most {seq} tokens, {truncated} texts cut), {name} on {}{}",
        model_dir.display(),
        data.display(),
        pairs.len(),
        match &devices {
            Some(d) => format!("DataParallel over {}", d.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
            None => device.to_string(),
        },
        dist.map_or(String::new(), |d| format!(", {} ranks", d.world_size())),
    );
    println!(
        "  {parameters} parameters: weights {}, with gradients and AdamW moments {} before activations",
        format_size(parameters as u64 * 4),
        format_size(parameters as u64 * 16)
    );
    println!(
        "  {steps_per_epoch} optimizer steps per epoch, {total_steps} in all, {}; {}",
        match args.lr_schedule {
            LrSchedule::Constant => "constant lr".to_string(),
            LrSchedule::Cosine => format!("cosine lr after {} warm-up steps", args.warmup_steps),
        },
        describe_settings(args)
    );
    if config.dropout_rate > 0.0 {
        println!("  dropout from config.json: dropout_rate {}", config.dropout_rate);
    }
    let settings: Vec<(String, String)> = vec![
        ("hf-model".into(), model_dir.display().to_string()),
        ("data".into(), data.display().to_string()),
        ("seq".into(), seq.to_string()),
        ("batch-size".into(), args.batch_size.to_string()),
        ("accum-steps".into(), args.accum_steps.to_string()),
        ("amp".into(), args.amp.map_or("none", super::Amp::name).into()),
        ("seed".into(), args.seed.to_string()),
        ("lr".into(), args.lr.to_string()),
        ("weight-decay".into(), args.weight_decay.to_string()),
        ("lr-schedule".into(), format!("{:?} warmup {}", args.lr_schedule, args.warmup_steps)),
        ("train-subset".into(), args.train_subset.map_or("all".into(), |n| n.to_string())),
    ];
    let run = start_observer(&args.observe.settings(), name.clone(), &data.display().to_string(), device)?;
    let builder = trainer_builder(args, model, devices.as_deref(), sync.as_ref(), total_steps)?;
    let mut builder = configure(args, builder, primary, epochs, settings)
        .checkpoint_activations(args.checkpoint_activations)
        .run_observer(run)
        .on_epoch(|e| {
            let val = e.eval.get("loss");
            println!(
                "epoch {:>3}/{}  loss {:.4}  {}  | {}  | {}",
                e.epoch,
                e.epochs,
                e.mean_loss,
                val.map_or("no validation blocks".to_string(), |v| format!(
                    "validation loss {v:.4} (perplexity {:.2})",
                    v.exp()
                )),
                e.memory_line,
                seconds(e.elapsed.as_secs_f64()),
            )
        });
    if let Some(s) = args.steps {
        builder = builder.max_steps(s);
    }
    if let Some(v) = val_loader.as_mut() {
        builder = builder.evaluate(move |m| {
            // (loss summed over target tokens, tokens) of this rank's examples, summed
            // over the ranks.
            let local = evaluate_seq2seq(m, &mut *v).map(|e| (e.loss * e.predicted as f64, e.predicted as f64));
            let (sum, n) = match dist {
                Some(d) => d.sum_pairs(local)?,
                None => local?,
            };
            Ok(Metrics::new().with("loss", sum / n.max(1.0)))
        });
    }
    if let Some(sync) = sync {
        builder = builder.gradient_sync(sync);
    }
    let mut trainer = builder.build()?;

    // ---- training
    let start = Instant::now();
    let report = trainer.fit(&mut train_loader, Seq2SeqStep)?;
    let sync = trainer.take_gradient_sync();
    let run = trainer.take_run_observer();
    let model = trainer.into_model();
    let out = args.out.clone().unwrap_or_else(|| {
        let stem = model_dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
        PathBuf::from(format!("ferrite-{stem}-finetuned"))
    });
    let options = HfSaveOptions { max_shard_size, copy_from: Some(dir.folder.dir.clone()) };
    if dist.is_none_or(|d| d.rank() == 0) {
        save_decoder_with(&model, &dir.folder.config_text, &out, &options)?;
    }
    let last = report.epochs.last();
    println!(
        "trained {} optimizer steps in {:.1}s{}; wrote {} (transformers: AutoModelForSeq2SeqLM.from_pretrained(\"{}\"))",
        last.map_or(0, |e| e.steps),
        start.elapsed().as_secs_f64(),
        last.and_then(|e| e.eval.get("loss")).map_or(String::new(), |v| format!(", validation loss {v:.4}")),
        out.display(),
        out.display()
    );
    println!("{}", allocator(primary).memory_summary(true));
    if let Some(d) = dist {
        d.finish_and_report(sync, device)?;
    }
    if let Some(run) = run {
        run.finish();
    }
    Ok(())
}
