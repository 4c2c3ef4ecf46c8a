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
use std::path::PathBuf;
use std::time::Instant;

use ferrite_data::{Dataset, DistributedSampler, TokenBlocks, read_documents, tokenize_documents};
use ferrite_memory::{allocator, format_size, select_devices};
use ferrite_models::{HfSaveOptions, parse_shard_size};
use ferrite_nn::Module;
use ferrite_tensor::Device;
use ferrite_train::distributed::{Distributed, EvalShare};
use ferrite_train::{CausalLmStep, Metrics, evaluate_causal_lm, seconds, start_observer};

use super::hf_trainer::{TRAIN_FRACTION, invalid, trainer_builder};
use super::settings::{configure, describe_settings};
use super::{LrSchedule, TrainArgs, TrainError, data_parallel};
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
        if args.lora != Default::default() {
            return Err(invalid(
                "lora-rank",
                "with a T5 model",
                "a decoder model (GPT-2, Llama, Mistral, Qwen2): LoRA from the command line is not wired to T5 yet; train T5 without the --lora-* / --base-dtype / --merge-lora flags",
            ));
        }
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
    let mut model = dir.load(if devices.is_some() { &Device::Cpu } else { device })?;
    // The config's dropouts draw from the trainer's generator, which checkpoints save.
    let dropout_rng = ferrite_nn::RngHandle::new(seeds.next_u64());
    model.set_dropout_rng(dropout_rng.clone());
    let lora = lora_args::prepare_training(&args.lora, &mut model, args.seed, &dropout_rng)?;
    if lora.is_some() && dist.is_some() {
        return Err(invalid(
            "lora-rank",
            "with --distributed",
            "one process: LoRA is not wired to DDP/ZeRO yet; train the adapters without --distributed",
        ));
    }
    let parameters: usize = model.parameters().iter().map(|p| p.numel()).sum();
    // Distributed: rank 0's weights are broadcast now, and gradients are averaged in backward;
    // with --zero, AdamW over this rank's shards only (and gradients sharded at stage 2).
    let sync = match args.zero {
        Some(stage) => dist.map(|d| d.zero_for(&model, stage)).transpose()?,
        None => dist.map(|d| d.sync_for(&model)).transpose()?,
    };
    let name = format!(
        "{} ({} layers x {}, vocabulary {})",
        model.type_name(),
        config.num_layers,
        config.hidden_size,
        config.vocab_size
    );
    println!(
        "ferrite train: {} on {} ({} documents, {tokens} tokens: {n_train} training / {n_val} validation blocks of {seq}), {name} on {}{}",
        model_dir.display(),
        data.display(),
        docs.len(),
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
    if let Some(l) = &lora {
        println!("{}", l.line);
    }
    if config.attention_dropout + config.residual_dropout + config.embedding_dropout > 0.0 {
        println!(
            "  dropout from config.json: attention {}, residual {}, embeddings {}",
            config.attention_dropout, config.residual_dropout, config.embedding_dropout
        );
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
            // (loss summed over predicted positions, positions) of this rank's blocks, summed
            // over the ranks.
            let local = evaluate_causal_lm(m, &mut *v).map(|e| (e.loss * e.predicted as f64, e.predicted as f64));
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
    let report = trainer.fit(&mut train_loader, CausalLmStep)?;
    let sync = trainer.take_gradient_sync();
    let run = trainer.take_run_observer();
    let model = trainer.into_model();
    let out = args.out.clone().unwrap_or_else(|| {
        let stem = model_dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
        PathBuf::from(format!("ferrite-{stem}-finetuned"))
    });
    let options = HfSaveOptions { max_shard_size, copy_from: Some(dir.folder.dir.clone()) };
    let mut how = String::new();
    if dist.is_none_or(|d| d.rank() == 0) {
        how = lora_args::save_trained(
            &args.lora,
            lora.as_ref().map(|l| &l.config),
            model,
            model_dir,
            &dir.folder.config_text,
            &out,
            &options,
        )?;
    }
    let last = report.epochs.last();
    println!(
        "trained {} optimizer steps in {:.1}s{}; wrote {} ({how})",
        last.map_or(0, |e| e.steps),
        start.elapsed().as_secs_f64(),
        last.and_then(|e| e.eval.get("loss")).map_or(String::new(), |v| format!(", validation loss {v:.4}")),
        out.display(),
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
