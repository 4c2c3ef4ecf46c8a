//! What `ferrite train` does with its parsed flags: checks them, resolves `--batch-size auto`
//! with the planner, chooses the run (one device, DataParallel, one MPI rank; image or language
//! model), and attaches the planner's remedies to an out-of-memory error.
//!
//! Why apart from `mod.rs`: the flags (`TrainArgs`) are read by every run mode, and the dispatch
//! calls every run mode — in one file they would import each other.
use ferrite_memory::allocator;
use ferrite_parallel::distributed::CommDtype;
use ferrite_tensor::Device;
use ferrite_train::distributed;

use super::{Amp, BATCH_SIZE_AUTO, TrainArgs, TrainError, data_parallel, hf, image, language, plan_context};
use crate::commands::CliResult;

/// More hidden layers than any MLP worth training; bounds the work done before the first
/// allocation.
const MAX_LAYERS: usize = 10_000;

/// `args` with `--batch-size auto` replaced by the planner's answer.
fn resolve_batch_size(args: &TrainArgs) -> Result<Option<TrainArgs>, TrainError> {
    if args.batch_size != BATCH_SIZE_AUTO {
        return Ok(None);
    }
    let mut a = args.clone();
    a.batch_size = plan_context::auto_batch_size(args)?;
    Ok(Some(a))
}

pub fn run(args: TrainArgs) -> CliResult {
    check_own_data(&args)?;
    let args = resolve_batch_size(&args)?.unwrap_or(args);
    // Out of memory: the report's ranked suggestions become the planner's, with the bytes each
    // saves for this model (the fixed rules stay, saying why, where the planner cannot model it).
    train(&args).map_err(|e| {
        if own_images(&args) {
            ferrite_train::planned::with_planned_remedies(e, Err(OWN_IMAGES_UNPLANNED.to_string())).into()
        } else {
            plan_context::with_planned_remedies(e, &args).into()
        }
    })
}

/// Why the planner is not asked about a run on `--data` images or tables.
const OWN_IMAGES_UNPLANNED: &str = "it trains on --data, whose sample shape the planner does not know";

/// Whether an image model trains on the user's own data (`--data`).
fn own_images(args: &TrainArgs) -> bool {
    args.hf_model.is_none() && args.data.is_some() && !args.model.is_language_model()
}

/// The `--data` flags that cannot work together with the rest, refused before anything runs.
fn check_own_data(args: &TrainArgs) -> Result<(), TrainError> {
    check(
        "val-split",
        args.val_split > 0.0 && args.val_split < 1.0,
        args.val_split,
        "must be between 0 and 1 (exclusive), e.g. 0.1",
    )?;
    if let Some(n) = args.image_size {
        check("image-size", n >= 1, n, "must be at least 1")?;
    }
    if args.hf_model.is_some() {
        let unsupported = [
            ("target", args.target.is_some(), "an image model's CSV data; --hf-model reads text"),
            ("image-size", args.image_size.is_some(), "an image model's data; --hf-model reads text"),
            ("augment", args.augment, "image models; --hf-model reads text"),
            ("skip-bad-files", args.skip_bad_files, "image folders; --hf-model reads text"),
        ];
        if let Some((flag, _, expected)) = unsupported.into_iter().find(|(_, given, _)| *given) {
            return Err(TrainError::InvalidArgument { flag, value: "given with --hf-model".into(), expected });
        }
        if let Some(s) = args.steps {
            check("steps", s >= 1, s, "must be at least 1")?;
        }
        return Ok(());
    }
    if args.steps.is_some() || args.warmup_steps > 0 || args.lr_schedule != super::LrSchedule::Constant {
        return Err(TrainError::InvalidArgument {
            flag: "steps",
            value: "--steps/--lr-schedule/--warmup-steps".into(),
            expected: "--hf-model training; the built-in models train for --epochs at a constant rate",
        });
    }
    if args.model.is_language_model() {
        let image_only = [
            ("target", args.target.is_some()),
            ("image-size", args.image_size.is_some()),
            ("augment", args.augment),
            ("skip-bad-files", args.skip_bad_files),
        ];
        if let Some((flag, _)) = image_only.into_iter().find(|(_, given)| *given) {
            return Err(TrainError::InvalidArgument {
                flag,
                value: args.model.name().to_string(),
                expected: "an image model (mlp, cnn); a language model reads a text file or a folder of .txt files",
            });
        }
        return Ok(());
    }
    if own_images(args) {
        if data_parallel::requested(args) {
            return Err(TrainError::InvalidArgument {
                flag: "data",
                value: args.data.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                expected: "a built-in --dataset with --devices/--data-parallel (DataParallel reads those only); train on one device or with --distributed",
            });
        }
        if args.batch_size == BATCH_SIZE_AUTO {
            return Err(TrainError::InvalidArgument {
                flag: "batch-size",
                value: "auto".to_string(),
                expected: "a number with --data: the planner knows the built-in datasets' shapes only",
            });
        }
    } else if args.augment && data_parallel::requested(args) {
        return Err(TrainError::InvalidArgument {
            flag: "augment",
            value: "true".to_string(),
            expected: "one device or --distributed; DataParallel does not augment",
        });
    }
    Ok(())
}

/// `--zero` shards what DDP replicates across MPI ranks: it needs `--distributed` and a stage
/// this build has (1, 2 or 3). `--save-checkpoint` then names a directory of shards (see
/// `ferrite_train::sharded`), which `--resume` reads at any world size.
fn check_zero(args: &TrainArgs) -> Result<(), TrainError> {
    if let Some(dtype) = args.zero_comm_dtype {
        let refuse = |expected: &'static str| {
            Err(TrainError::InvalidArgument { flag: "zero-comm-dtype", value: dtype.name().into(), expected })
        };
        if args.zero.is_none() {
            return refuse(
                "--zero 1|2|3 as well: it sets what ZeRO's collectives carry (DDP's all-reduce is always f32)",
            );
        }
        if dtype == CommDtype::Bf16 && args.amp != Some(Amp::Bf16) {
            return refuse(
                "--amp bf16 as well: bf16 parameters and gradients need the step autocast to bf16 (or use --zero-comm-dtype f32)",
            );
        }
        if dtype == CommDtype::Bf16 && args.lora.lora.lora_rank.is_some() {
            return refuse(
                "no LoRA: with --lora-rank only the f32 adapters train (use --base-dtype bf16 for a bf16 base)",
            );
        }
    }
    let Some(stage) = args.zero else { return Ok(()) };
    let refuse =
        |expected: &'static str| Err(TrainError::InvalidArgument { flag: "zero", value: stage.to_string(), expected });
    if !args.distributed {
        return refuse(
            "--distributed as well: ZeRO shards training state over the ranks of an MPI job (mpirun -np N ferrite train --distributed --zero 1)",
        );
    }
    if !(1..=3).contains(&stage) {
        return refuse("1 (optimizer state sharded), 2 (and gradients) or 3 (and parameters)");
    }
    Ok(())
}

fn check(flag: &'static str, ok: bool, value: impl ToString, expected: &'static str) -> Result<(), TrainError> {
    if ok { Ok(()) } else { Err(TrainError::InvalidArgument { flag, value: value.to_string(), expected }) }
}

/// `--distributed`: join the MPI job and train; a failure is reported to the other ranks, which
/// then stop with an error naming this rank.
fn train_distributed(args: &TrainArgs, device: &Device) -> Result<(), TrainError> {
    let dist = distributed::Distributed::init()?;
    let quiet;
    let args = if dist.rank() == 0 {
        args
    } else {
        quiet = TrainArgs { no_progress: true, ..args.clone() };
        &quiet
    };
    let result = if args.hf_model.is_some() {
        hf::train(args, device, Some(&dist))
    } else if args.model.is_language_model() {
        language::train(args, device, Some(&dist))
    } else {
        image::train(args, device, Some(&dist))
    };
    // Rank 0 writes the memory snapshot; the others only stop recording.
    let result = if dist.rank() == 0 {
        write_snapshot(args, device, result)
    } else {
        allocator(device).record_memory_history(None);
        result
    };
    if result.as_ref().is_err_and(|e| !e.is_peer_failure()) {
        // This rank's own failure, announced to the others: let them print their report before
        // mpirun ends the job on this exit. Not when another rank failed or died: the others
        // learn that by themselves, and a survivor must stop within FERRITE_DDP_TIMEOUT_S + 1 s.
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    result
}

/// Runs training as configured; prints progress to stdout/stderr.
pub fn train(args: &TrainArgs) -> Result<(), TrainError> {
    check_own_data(args)?;
    check_zero(args)?;
    let device = args.device.clone();
    if matches!(device, Device::Meta) {
        return Err(TrainError::MetaDevice);
    }
    let resolved = resolve_batch_size(args)?;
    let args = resolved.as_ref().unwrap_or(args);
    check("batch-size", args.batch_size >= 1, args.batch_size, "must be at least 1")?;
    check("accum-steps", args.accum_steps >= 1, args.accum_steps, "must be at least 1")?;
    check("hidden", args.hidden() >= 1, args.hidden(), "must be at least 1")?;
    check("layers", (1..=MAX_LAYERS).contains(&args.layers()), args.layers(), "must be between 1 and 10000")?;
    check("dropout", (0.0..1.0).contains(&args.shape.dropout), args.shape.dropout, "must be in [0, 1)")?;
    check("lr", args.lr.is_finite() && args.lr > 0.0, args.lr, "must be a positive number")?;
    check(
        "weight-decay",
        args.weight_decay.is_finite() && args.weight_decay >= 0.0,
        args.weight_decay,
        "must be a non-negative number",
    )?;
    if let Some(c) = args.clip_grad_norm {
        check("clip-grad-norm", c.is_finite() && c > 0.0, c, "must be a positive number")?;
    }
    if let Some(n) = args.train_subset {
        check("train-subset", n >= 1, n, "must be at least 1")?;
    }
    check("seq", args.shape.seq >= 1, args.shape.seq, "must be at least 1")?;
    check("d-model", args.shape.d_model >= 1, args.shape.d_model, "must be at least 1")?;
    if let Some(e) = args.epochs {
        check("epochs", e >= 1, e, "must be at least 1")?;
    }
    let alloc = allocator(&device);
    // The settings the planner uses too (FERRITE_ALLOC_CONF, then --alloc-conf on top); a bad
    // value is reported now, not as the failure of the first allocation.
    alloc.set_config(ferrite_train::planned::allocator_config(args.alloc_conf.as_deref())?);
    if let Some(path) = &args.snapshot {
        // Refused now rather than after the run it was meant to record.
        if path.is_dir() {
            return Err(ferrite_io::IoError::NotAFile { path: path.clone(), found: "directory" }.into());
        }
        alloc.record_memory_history(Some(SNAPSHOT_MAX_ENTRIES));
    }
    if args.distributed {
        return train_distributed(args, &device);
    }
    // --hf-model runs DataParallel itself (hf.rs); the built-in image models here.
    if data_parallel::requested(args) && args.hf_model.is_none() {
        return data_parallel::train(args, &device);
    }
    let result = if args.hf_model.is_some() {
        hf::train(args, &device, None)
    } else if args.model.is_language_model() {
        language::train(args, &device, None)
    } else {
        image::train(args, &device, None)
    };
    write_snapshot(args, &device, result)
}

/// With `--snapshot`: writes the allocator's history and segments after the run, also after a
/// failed one (the snapshot of an out-of-memory run is the one wanted); returns the run's result.
fn write_snapshot(args: &TrainArgs, device: &Device, result: Result<(), TrainError>) -> Result<(), TrainError> {
    let alloc = allocator(device);
    if let Some(path) = &args.snapshot {
        // Written after a failure too: the snapshot of an out-of-memory run is the one wanted.
        let written = ferrite_io::write_torch_snapshot(path, &alloc.snapshot());
        alloc.record_memory_history(None);
        match (&result, written) {
            (_, Ok(())) => eprintln!(
                "wrote memory snapshot {} (ferrite memory replay|plot, or pytorch.org/memory_viz)",
                path.display()
            ),
            (Ok(()), Err(e)) => return Err(e.into()),
            (Err(_), Err(e)) => eprintln!("could not write memory snapshot {}: {e}", path.display()),
        }
    }
    result
}

/// History entries `--snapshot` keeps (the newest; PyTorch's docs suggest 100,000).
const SNAPSHOT_MAX_ENTRIES: usize = 100_000;
