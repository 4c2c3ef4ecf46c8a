//! PEFT adapter folders: `adapter_config.json` and `adapter_model.safetensors`, written from a
//! model carrying LoRA adapters (`ferrite_nn::apply_lora`) so `peft.PeftModel.from_pretrained(base,
//! DIR)` loads them, and read back onto a base model (`ferrite eval/generate --lora DIR`).
//!
//! Why here: the tensor names are the model's (`transformer.h.0.attn.c_attn.lora_A.weight`), and
//! PEFT stores them under `base_model.model.` with the adapter's name removed, so the mapping
//! lives beside the models. The config is PEFT's `LoraConfig` as JSON; an option ferrite does not
//! implement (DoRA, trained biases, per-layer ranks, `modules_to_save`, regex targets) is refused
//! by name rather than silently dropped, since the loaded model would compute something else.
use std::path::Path;

use ferrite_io::LoadOptions;
use ferrite_nn::{LoraConfig, LoraTargets, Module, NnError, apply_lora};
use ferrite_tensor::{DType, Generator, Tensor, no_grad};
use serde_json::{Value, json};

use crate::ModelError;

/// The config file of an adapter folder.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The weights file of an adapter folder.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// PEFT's prefix of the adapted model's names (`PeftModel.base_model` is a `LoraModel` whose
/// `model` is the base model).
pub const PEFT_PREFIX: &str = "base_model.model.";

/// An adapter folder's config as ferrite uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraAdapterConfig {
    pub lora: LoraConfig,
    /// `base_model_name_or_path`: the base model the adapter was trained on, as recorded.
    pub base_model: Option<String>,
}

/// `adapter_config.json` keys ferrite reads, or may ignore because they do not change what the
/// adapter computes (bookkeeping, initialisation); the options refused by name are checked first.
const KNOWN_OPTIONS: &[&str] = &[
    "r",
    "lora_alpha",
    "lora_dropout",
    "use_rslora",
    "target_modules",
    "bias",
    "peft_type",
    "task_type",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
    "init_lora_weights",
    "fan_in_fan_out",
    "layers_pattern",
    "auto_mapping",
    "peft_version",
    "megatron_core",
    "qalora_group_size",
];

fn adapter_err(path: &Path, problem: impl Into<String>) -> ModelError {
    ModelError::LoraAdapter { path: path.display().to_string(), problem: problem.into() }
}

/// Reads and checks `DIR/adapter_config.json`.
pub fn read_adapter_config(dir: &Path) -> Result<LoraAdapterConfig, ModelError> {
    let path = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        adapter_err(
            &path,
            format!("cannot read it ({e}); a PEFT adapter folder holds {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}"),
        )
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| adapter_err(&path, format!("not JSON ({e})")))?;
    parse_adapter_config(&v, &path)
}

/// [`read_adapter_config`] of a parsed JSON value (`path` names it in errors).
pub fn parse_adapter_config(v: &Value, path: &Path) -> Result<LoraAdapterConfig, ModelError> {
    let unsupported = |option: &str, value: &Value, remedy: &str| ModelError::LoraUnsupported {
        path: path.display().to_string(),
        option: option.to_string(),
        value: value.to_string(),
        remedy: remedy.to_string(),
    };
    let get = |k: &str| v.get(k).filter(|x| !x.is_null());
    if let Some(t) = get("peft_type")
        && t.as_str() != Some("LORA")
    {
        return Err(unsupported("peft_type", t, "ferrite loads LoRA adapters only"));
    }
    let truthy = |k: &str| get(k).is_some_and(|x| x.as_bool() != Some(false));
    let nonempty = |k: &str| {
        get(k).is_some_and(|x| match x {
            Value::Object(m) => !m.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::String(s) => !s.is_empty(),
            _ => true,
        })
    };
    for (option, remedy) in [
        (
            "use_dora",
            "train a plain LoRA adapter (use_dora=False), or merge it in PEFT (merge_and_unload) and load the merged model",
        ),
        ("lora_bias", "train without lora_bias, or merge the adapter in PEFT and load the merged model"),
        ("use_qalora", "train a plain LoRA adapter"),
    ] {
        if truthy(option) {
            return Err(unsupported(option, &v[option], remedy));
        }
    }
    for (option, remedy) in [
        (
            "modules_to_save",
            "ferrite trains only the adapters; merge the adapter in PEFT (merge_and_unload) and load the merged model",
        ),
        ("rank_pattern", "use one rank for every layer (r)"),
        ("alpha_pattern", "use one lora_alpha for every layer"),
        ("layers_to_transform", "adapt every layer, or merge the adapter in PEFT and load the merged model"),
        ("exclude_modules", "list the target modules explicitly"),
        ("target_parameters", "target modules (target_modules), not parameters"),
        ("trainable_token_indices", "merge the adapter in PEFT and load the merged model"),
        ("layer_replication", "merge the adapter in PEFT and load the merged model"),
    ] {
        if nonempty(option) {
            return Err(unsupported(option, &v[option], remedy));
        }
    }
    // Any other option set to something (not null, false, {} or []) is one ferrite does not know.
    if let Value::Object(m) = v {
        for (k, x) in m {
            let set = match x {
                Value::Null | Value::Bool(false) => false,
                Value::Object(o) => !o.is_empty(),
                Value::Array(a) => !a.is_empty(),
                _ => true,
            };
            if set && !KNOWN_OPTIONS.contains(&k.as_str()) {
                return Err(unsupported(
                    k,
                    x,
                    "ferrite does not know this PEFT option; merge the adapter in PEFT (merge_and_unload) and load the merged model",
                ));
            }
        }
    }
    if let Some(b) = get("bias")
        && b.as_str() != Some("none")
    {
        return Err(unsupported(
            "bias",
            b,
            "ferrite trains no biases with LoRA (bias=\"none\"); merge the adapter in PEFT and load the merged model",
        ));
    }
    let r = get("r").and_then(Value::as_u64).ok_or_else(|| adapter_err(path, "no rank `r` (a positive integer)"))?;
    let alpha = get("lora_alpha").and_then(Value::as_f64).unwrap_or(8.0);
    let dropout = get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0);
    let use_rslora = get("use_rslora").and_then(Value::as_bool).unwrap_or(false);
    let targets = match get("target_modules") {
        Some(Value::Array(a)) => {
            let names: Option<Vec<String>> = a.iter().map(|x| x.as_str().map(String::from)).collect();
            LoraTargets::Modules(names.ok_or_else(|| adapter_err(path, "target_modules must be a list of names"))?)
        }
        Some(Value::String(s)) if s == "all-linear" => LoraTargets::AllLinear,
        Some(t) => {
            return Err(unsupported(
                "target_modules",
                t,
                "a regular expression is not supported; list the module names (e.g. [\"q_proj\", \"v_proj\"])",
            ));
        }
        None => return Err(adapter_err(path, "no target_modules")),
    };
    Ok(LoraAdapterConfig {
        lora: LoraConfig { r: r as usize, alpha, dropout, use_rslora, targets },
        base_model: get("base_model_name_or_path").and_then(Value::as_str).map(String::from),
    })
}

/// The adapters' tensors of `model` under PEFT's file names (`base_model.model.<module>.lora_A.weight`).
pub fn adapter_tensors(model: &dyn Module) -> Vec<(String, Tensor)> {
    model
        .named_parameters()
        .into_iter()
        .filter(|(n, _)| is_adapter_key(n))
        .map(|(n, t)| (format!("{PEFT_PREFIX}{n}"), t.detach()))
        .collect()
}

fn is_adapter_key(name: &str) -> bool {
    name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight")
}

/// Writes `model`'s adapters as a PEFT adapter folder in `dir` (created if needed): the
/// safetensors file and `adapter_config.json` (`config`'s options, `target_modules` as the
/// adapted layers' names, `base_model_name_or_path` = `base_model`), each file atomically.
pub fn save_lora_adapter(
    model: &dyn Module,
    config: &LoraConfig,
    base_model: &str,
    dir: &Path,
) -> Result<(), ModelError> {
    let tensors = adapter_tensors(model);
    if tensors.is_empty() {
        return Err(adapter_err(dir, "the model carries no LoRA adapter to save"));
    }
    std::fs::create_dir_all(dir).map_err(|e| adapter_err(dir, format!("cannot create it ({e})")))?;
    let write_err =
        |path: &Path, source| ModelError::WeightFile { path: path.display().to_string(), source: Box::new(source) };
    let weights = dir.join(ADAPTER_WEIGHTS);
    let host: Vec<(String, Tensor)> =
        tensors.into_iter().map(|(n, t)| Ok((n, t.to_dtype(DType::F32)?))).collect::<Result<_, ModelError>>()?;
    ferrite_io::save_state_dict(&weights, host.iter().map(|(n, t)| (n.as_str(), t)))
        .map_err(|e| write_err(&weights, e))?;
    let mut targets: Vec<String> = Vec::new();
    let mut fan_in_fan_out = false;
    for (n, m) in model.named_modules() {
        if m.lora_host().is_some_and(|h| h.lora_params().is_some()) {
            fan_in_fan_out |= m.type_name() == "Conv1D";
            let short = n.rsplit('.').next().unwrap_or(&n).to_string();
            if !targets.contains(&short) {
                targets.push(short);
            }
        }
    }
    targets.sort();
    // PEFT's task of the model: an encoder-decoder (T5) generates from an input sequence.
    let task_type = if model.type_name() == "T5ForConditionalGeneration" { "SEQ_2_SEQ_LM" } else { "CAUSAL_LM" };
    let cfg = json!({
        "alpha_pattern": {},
        "auto_mapping": null,
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": fan_in_fan_out,
        "inference_mode": true,
        "init_lora_weights": true,
        "layers_pattern": null,
        "layers_to_transform": null,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "modules_to_save": null,
        "peft_type": "LORA",
        "r": config.r,
        "rank_pattern": {},
        "revision": null,
        "target_modules": targets,
        "task_type": task_type,
        "use_dora": false,
        "use_rslora": config.use_rslora,
    });
    let path = dir.join(ADAPTER_CONFIG);
    let text = serde_json::to_string_pretty(&cfg).map_err(|e| adapter_err(&path, e.to_string()))?;
    ferrite_io::write_atomically(&path, |f| std::io::Write::write_all(f, text.as_bytes()))
        .map_err(|e| write_err(&path, e))?;
    Ok(())
}

/// Puts the adapter folder `dir` onto `model` (PEFT's `PeftModel.from_pretrained(base, DIR)`):
/// adapters attached where its config's `target_modules` say, their weights loaded from the
/// file; the base is frozen. Errors name the folder: a config option ferrite does not implement,
/// targets or tensors the model lacks (an adapter made for another base model), shapes that
/// differ (another size of the model, or another rank).
pub fn load_lora_adapter(model: &mut dyn Module, dir: &Path) -> Result<LoraAdapterConfig, ModelError> {
    let config = read_adapter_config(dir)?;
    let weights = dir.join(ADAPTER_WEIGHTS);
    if !weights.is_file() {
        return Err(adapter_err(
            &weights,
            "missing (adapter_model.bin is not read; save the adapter with safe_serialization=True, PEFT's default)",
        ));
    }
    let file = ferrite_io::load_state_dict(&weights, &LoadOptions { dtype: Some(DType::F32), ..LoadOptions::new() })
        .map_err(|e| ModelError::WeightFile { path: weights.display().to_string(), source: Box::new(e) })?;
    let base = config.base_model.as_deref().unwrap_or("(not recorded)");
    let mut g = Generator::new(0);
    apply_lora(model, &config.lora, &mut g).map_err(|e| match e {
        NnError::LoraTargets { .. } | NnError::LoraUnsupportedTarget { .. } | NnError::LoraRank { .. } => adapter_err(
            dir,
            format!(
                "does not fit this {} ({e}); it was made for base model {base} — load it on that model",
                model.type_name()
            ),
        ),
        other => other.into(),
    })?;
    let own = adapter_tensors(model);
    let mut pairs = Vec::new();
    for (k, t) in &file {
        let Some(name) = k.strip_prefix(PEFT_PREFIX) else {
            return Err(adapter_err(
                &weights,
                format!("tensor `{k}` is not under `{PEFT_PREFIX}`; not a PEFT adapter file"),
            ));
        };
        let name = name.replace(".default.weight", ".weight");
        if !is_adapter_key(&name) {
            return Err(ModelError::LoraUnsupported {
                path: weights.display().to_string(),
                option: format!("tensor `{k}`"),
                value: format!("{:?}", t.shape()),
                remedy: "ferrite loads lora_A/lora_B weights only; merge the adapter in PEFT and load the merged model"
                    .into(),
            });
        }
        let full = format!("{PEFT_PREFIX}{name}");
        let Some((_, dst)) = own.iter().find(|(n, _)| *n == full) else {
            return Err(adapter_err(
                &weights,
                format!(
                    "tensor `{k}` names a layer this {} does not adapt; it was made for base model {base}",
                    model.type_name()
                ),
            ));
        };
        if dst.shape() != t.shape() {
            return Err(adapter_err(
                &weights,
                format!(
                    "tensor `{k}` has shape {:?}, this model's adapter {:?} (r = {}); it was made for base model {base} — load it on that model",
                    t.shape(),
                    dst.shape(),
                    config.lora.r
                ),
            ));
        }
        pairs.push((dst.clone(), t.clone()));
    }
    if let Some((n, _)) =
        own.iter().find(|(n, _)| !file.iter().any(|(k, _)| k.replace(".default.weight", ".weight") == *n))
    {
        return Err(adapter_err(&weights, format!("has no `{n}`, which the config's target_modules ask for")));
    }
    let _g = no_grad();
    for (dst, src) in pairs {
        let src = if src.device() == dst.device() { src } else { src.to_device(dst.device())? };
        dst.copy_(&src)?;
    }
    Ok(config)
}
