//! `ferrite convert IN OUT [--strip-prefix module.] [--key model] [--dtype float16]`: a PyTorch
//! checkpoint to safetensors, or a sharded checkpoint (`train --zero --save-checkpoint DIR`) to
//! the ordinary one-file training checkpoint (`--key model`: the weights alone).
//! `ferrite convert CKPT OUT_DIR --hf-model BASE`: a training checkpoint of an `--hf-model` run
//! (sharded or one file) to a Hugging Face folder that `from_pretrained` loads without MPI.
//!
//! A flat state_dict becomes a plain safetensors file with the same parameter names and dtypes,
//! loadable by PyTorch (`safetensors.torch.load_file`) and Hugging Face tools. A nested training
//! checkpoint becomes a ferrite checkpoint (tensors named by path, the rest of the tree in the
//! metadata) unless `--key` selects one state_dict inside it. Files that would run code on load
//! are refused with the reason, and the output is written atomically.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ferrite_io::Value;
use ferrite_models::{HfSaveOptions, save_decoder_with};
use ferrite_nn::{Module, StateDict};
use ferrite_tensor::{DType, Device};

use super::{CliResult, hf_model};

#[derive(clap::Args, Debug, Clone)]
pub struct ConvertArgs {
    /// Input: .pt/.pth (zip or legacy), .safetensors, a ferrite checkpoint, or the directory of a
    /// sharded checkpoint (`train --zero N --save-checkpoint DIR`).
    pub input: PathBuf,
    /// Output safetensors file (replaced atomically).
    pub output: PathBuf,
    /// Remove this prefix from state_dict keys, e.g. `module.` from DataParallel checkpoints.
    #[arg(long, value_name = "PREFIX")]
    pub strip_prefix: Option<String>,
    /// Convert only this entry of a nested checkpoint (`model`, `optimizer/state/0`, …).
    #[arg(long, value_name = "PATH")]
    pub key: Option<String>,
    /// Convert floating-point tensors to this dtype (float32, float16, bfloat16, float64).
    #[arg(long, value_name = "DTYPE")]
    pub dtype: Option<String>,
    /// Write a Hugging Face model folder to OUTPUT instead: the weights of IN, a training
    /// checkpoint of `train --hf-model` (`--save-checkpoint`, sharded under `--zero` or one
    /// file), loaded into this base folder's model (every key and shape checked) and saved with
    /// its config.json, tokenizer and generation config, for `from_pretrained`.
    #[arg(long, value_name = "DIR")]
    pub hf_model: Option<PathBuf>,
}

pub fn run(args: ConvertArgs) -> CliResult {
    if let Some(base) = &args.hf_model {
        return to_hf_folder(&args, base);
    }
    let dtype = match &args.dtype {
        Some(s) => {
            let d = DType::parse(s)
                .ok_or_else(|| format!("unknown dtype `{s}`; use float32, float16, bfloat16 or float64"))?;
            if !d.is_floating_point() {
                return Err(format!(
                    "--dtype must be a floating-point type (got {d}); integer tensors are always kept as they are"
                )
                .into());
            }
            Some(d)
        }
        None => None,
    };
    let mut tree = if ferrite_train::sharded::is_sharded(&args.input) {
        // A `--zero` run's sharded checkpoint: joined into the ordinary one-file training
        // checkpoint (no MPI needed); `--key model` keeps the weights only.
        let state = ferrite_train::sharded::consolidate(&args.input)?;
        println!(
            "joined the sharded checkpoint {} (epoch {}, {} steps) into the single-device layout",
            args.input.display(),
            state.epoch,
            state.step
        );
        ferrite_train::resume::to_checkpoint(&state)?.into_tree()
    } else {
        ferrite_io::read(&args.input)?
    };
    if let Some(key) = &args.key {
        tree = tree.require(key)?.clone();
    }
    if let Some(prefix) = &args.strip_prefix {
        let n = ferrite_io::strip_prefix_in_tree(&mut tree, prefix);
        if n == 0 {
            eprintln!("note: no state_dict key starts with `{prefix}`; nothing stripped");
        }
    }
    if let Some(d) = dtype {
        convert_floats(&mut tree, d);
    }
    let tensors = tree.tensors();
    let bytes: usize = tensors.iter().map(|(_, t)| t.nbytes()).sum();
    let count = tensors.len();
    drop(tensors);
    match ferrite_io::state_dict_from_value(&tree) {
        Ok(sd) => {
            ferrite_io::write_safetensors(&args.output, sd.iter().map(|(k, t)| (k.as_str(), t)), &BTreeMap::new())?;
            println!(
                "wrote {count} tensors ({:.2} MiB) to {} (safetensors state_dict)",
                bytes as f64 / (1 << 20) as f64,
                args.output.display()
            );
        }
        Err(_) if count > 0 => {
            ferrite_io::save_checkpoint(&args.output, &tree)?;
            println!(
                "wrote {count} tensors ({:.2} MiB) to {} (ferrite checkpoint: nested tree kept; tensors named by path; use --key to extract one state_dict)",
                bytes as f64 / (1 << 20) as f64,
                args.output.display()
            );
        }
        Err(e) => return Err(format!("nothing to convert: {e}").into()),
    }
    Ok(())
}

/// `--hf-model BASE`: the training checkpoint `args.input` as a Hugging Face folder in
/// `args.output` (see [`ConvertArgs::hf_model`]).
fn to_hf_folder(args: &ConvertArgs, base: &Path) -> CliResult {
    for (flag, given) in [
        ("--key", args.key.is_some()),
        ("--strip-prefix", args.strip_prefix.is_some()),
        ("--dtype", args.dtype.is_some()),
    ] {
        if given {
            return Err(format!(
                "{flag} with --hf-model: the folder is written with the base model's parameter names and dtypes; drop {flag}, or convert without --hf-model"
            )
            .into());
        }
    }
    let state = if ferrite_train::sharded::is_sharded(&args.input) {
        ferrite_train::sharded::consolidate(&args.input)?
    } else {
        ferrite_train::resume::load(&args.input, &Device::Cpu, &[])?
    };
    if let Some((_, trained)) = state.settings.iter().find(|(k, _)| k == "hf-model")
        && Path::new(trained) != base
    {
        println!(
            "note: the checkpoint was trained from {trained}; its weights go into the model of {}",
            base.display()
        );
    }
    let weights: StateDict = state.model.into_iter().collect();
    let dir = hf_model::open(base, "convert")?;
    let options = HfSaveOptions { copy_from: Some(dir.folder.dir.clone()), ..HfSaveOptions::default() };
    let (count, params) = (weights.len(), weights.iter().map(|(_, t)| t.numel()).sum::<usize>());
    let into = |model: &mut dyn Module| -> CliResult {
        model.load_state_dict(&weights, true).map_err(|e| {
            format!(
                "{} does not fit the model of {}: {e}. Pass the --hf-model folder the run trained (a LoRA run's checkpoint holds adapters: merge them with `ferrite train ... --merge-lora`)",
                args.input.display(),
                base.display()
            )
        })?;
        Ok(())
    };
    let load_with = if dir.is_t5() {
        let mut model = dir.load_t5(&Device::Cpu)?;
        into(&mut model)?;
        save_decoder_with(&model, &dir.folder.config_text, &args.output, &options)?;
        "AutoModelForSeq2SeqLM"
    } else {
        let mut model = dir.load(&Device::Cpu)?;
        into(&mut model)?;
        save_decoder_with(&model, &dir.folder.config_text, &args.output, &options)?;
        "AutoModelForCausalLM"
    };
    println!(
        "wrote the weights of {} (epoch {}, {} steps: {count} tensors, {params} parameters) as a Hugging Face folder {} (transformers: {load_with}.from_pretrained(\"{}\"))",
        args.input.display(),
        state.epoch,
        state.step,
        args.output.display(),
        args.output.display()
    );
    Ok(())
}

fn convert_floats(v: &mut Value, dtype: DType) {
    v.walk_mut(|node| {
        if let Value::Tensor(t) = node
            && t.dtype().is_floating_point()
        {
            *t = t.to_dtype(dtype);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(input: PathBuf, output: PathBuf) -> ConvertArgs {
        ConvertArgs { input, output, strip_prefix: None, key: None, dtype: None, hf_model: None }
    }

    #[test]
    fn dataparallel_state_dict_converts_with_prefix_stripped() {
        let Some(input) = ferrite_test_support::pytorch_file_or_skip("dataparallel_state_dict.pt") else { return };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("model.safetensors");
        run(ConvertArgs { strip_prefix: Some("module.".into()), ..args(input.clone(), out.clone()) }).unwrap();
        let original = ferrite_io::state_dict_from_value(&ferrite_io::read(&input).unwrap()).unwrap();
        let converted = ferrite_io::read_safetensors(&out).unwrap();
        assert_eq!(converted.tensors.len(), original.len());
        for (k, t) in &original {
            let name = k.strip_prefix("module.").unwrap();
            let c = &converted.tensors.iter().find(|(n, _)| n == name).unwrap().1;
            assert_eq!(c.dtype(), t.dtype());
            assert_eq!(c.to_f64_vec(), t.to_f64_vec(), "{name}");
        }
    }

    #[test]
    fn nested_checkpoints_keep_their_tree_or_give_one_entry() {
        let Some(input) = ferrite_test_support::pytorch_file_or_skip("training_checkpoint.pt") else { return };
        let dir = tempfile::tempdir().unwrap();
        let whole = dir.path().join("ckpt.safetensors");
        run(args(input.clone(), whole.clone())).unwrap();
        let back = ferrite_io::read(&whole).unwrap();
        assert_eq!(back, ferrite_io::read(&input).unwrap());

        let model = dir.path().join("model.safetensors");
        run(ConvertArgs { key: Some("model".into()), dtype: Some("float16".into()), ..args(input, model.clone()) })
            .unwrap();
        let sd = ferrite_io::read_safetensors(&model).unwrap();
        assert_eq!(sd.tensors.len(), 7);
        assert!(sd.tensors.iter().all(|(_, t)| t.dtype() == DType::F16));
    }

    #[test]
    fn refused_inputs_and_bad_options_are_errors() {
        let Some(input) = ferrite_test_support::pytorch_file_or_skip("malicious_reduce.pt") else { return };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x.safetensors");
        let err = run(args(input, out.clone())).unwrap_err().to_string();
        assert!(err.contains("posix.system"), "{err}");
        assert!(!out.exists());
        let plain = ferrite_test_support::pytorch_file_or_skip("plain_state_dict.pt").unwrap();
        assert!(run(ConvertArgs { dtype: Some("int64".into()), ..args(plain.clone(), out.clone()) }).is_err());
        assert!(run(ConvertArgs { key: Some("nope".into()), ..args(plain, out) }).is_err());
    }
}
