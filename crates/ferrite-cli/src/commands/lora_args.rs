//! The LoRA flags (issue 34): `--lora-rank`, `--lora-alpha`, `--lora-dropout`, `--lora-targets`,
//! `--lora-rslora` and `--base-dtype` of `ferrite train --hf-model` and `ferrite plan`,
//! `--merge-lora` of `train`, `--lora DIR` of `eval` and `generate` — parsed here into
//! `ferrite_nn::LoraConfig` and handed to the libraries (`ferrite_nn::apply_lora`,
//! `ferrite_models::save_lora_adapter` / `load_lora_adapter`, `ferrite_plan::with_lora`).
//!
//! Why a file of its own: the commands that take these flags only call the hooks below, so the
//! LoRA wiring reads in one place and stays out of the commands' own logic.
use std::path::{Path, PathBuf};

use ferrite_models::{HfSaveOptions, ModelError, load_lora_adapter, save_decoder_with, save_lora_adapter};
use ferrite_nn::{LoraConfig, LoraTargets, Module, apply_lora, merge_lora, trainable_parameters};
use ferrite_plan::PlanError;
use ferrite_tensor::{DType, Generator, Tensor};

/// PEFT's default `lora_alpha`.
const DEFAULT_ALPHA: f64 = 8.0;

/// The LoRA flags shared by `train` and `plan`.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct LoraArgs {
    /// Train LoRA adapters of this rank (PEFT's `r`) instead of every weight: the base weights
    /// are frozen (no gradients, no optimizer state) and --out is a PEFT adapter folder.
    #[arg(long, value_name = "R")]
    pub lora_rank: Option<usize>,
    /// LoRA's `lora_alpha`: the adapters' output is scaled by alpha / rank (default 8, PEFT's).
    #[arg(long, value_name = "A", requires = "lora_rank")]
    pub lora_alpha: Option<f64>,
    /// Dropout on the adapters' input while training (PEFT's `lora_dropout`; default 0).
    #[arg(long, value_name = "P", requires = "lora_rank")]
    pub lora_dropout: Option<f64>,
    /// The layers that get adapters (PEFT's `target_modules`): module names matched as suffixes
    /// (`q_proj,v_proj`, `c_attn`), or `all-linear` (every linear layer but the output head).
    /// Default: PEFT's for the architecture (`c_attn` for GPT-2, `q_proj,v_proj` for Llama,
    /// Mistral and Qwen2).
    #[arg(long, value_name = "NAMES", requires = "lora_rank")]
    pub lora_targets: Option<String>,
    /// rsLoRA: scale by alpha / √rank instead of alpha / rank (PEFT's `use_rslora`).
    #[arg(long, requires = "lora_rank")]
    pub lora_rslora: bool,
    /// The dtype of the (frozen) base weights: `bf16`, `f16` or `f32` (default). Adapters and
    /// their optimizer state stay f32.
    #[arg(long, value_name = "DTYPE", value_parser = parse_base_dtype)]
    pub base_dtype: Option<DType>,
}

/// `--merge-lora` of `train`, beside the shared flags.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct TrainLoraArgs {
    #[command(flatten)]
    pub lora: LoraArgs,
    /// With --lora-rank: write the merged full model to --out (a folder `transformers` loads)
    /// instead of the adapter folder.
    #[arg(long)]
    pub merge_lora: bool,
}

/// `--lora DIR` of `eval` and `generate`.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct LoraAdapterArg {
    /// A PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`) put on the
    /// --hf-model base, as `PeftModel.from_pretrained(base, DIR)` does.
    #[arg(long, value_name = "DIR")]
    pub lora: Option<PathBuf>,
}

fn parse_base_dtype(s: &str) -> Result<DType, String> {
    match s {
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" | "fp16" => Ok(DType::F16),
        "f32" | "float32" | "fp32" => Ok(DType::F32),
        _ => Err(format!("`{s}` is not a base dtype: bf16, f16 or f32")),
    }
}

fn invalid(what: impl Into<String>, reason: impl Into<String>) -> PlanError {
    PlanError::InvalidSetting { what: what.into(), reason: reason.into() }
}

/// PEFT's default `target_modules` for a `config.json` `model_type`
/// (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`).
pub fn default_targets(model_type: &str) -> Option<&'static str> {
    match model_type {
        "gpt2" => Some("c_attn"),
        "llama" | "mistral" | "qwen2" => Some("q_proj,v_proj"),
        "t5" | "mt5" => Some("q,v"),
        _ => None,
    }
}

/// The `model_type` of a `config.json` (empty when it has none).
pub fn model_type_of(config_json: &Path) -> String {
    std::fs::read_to_string(config_json)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("model_type").and_then(|m| m.as_str()).map(String::from))
        .unwrap_or_default()
}

impl LoraArgs {
    /// The LoRA configuration of the flags (`None` without `--lora-rank`), for a model of
    /// `model_type` (which picks the default targets).
    pub fn config(&self, model_type: &str) -> Result<Option<LoraConfig>, PlanError> {
        let Some(r) = self.lora_rank else { return Ok(None) };
        if r == 0 {
            return Err(invalid("--lora-rank 0", "the rank of the adapters is at least 1; 8 or 16 are usual"));
        }
        let targets = match (&self.lora_targets, default_targets(model_type)) {
            (Some(t), _) => t.as_str(),
            (None, Some(t)) => t,
            (None, None) => {
                return Err(invalid(
                    "--lora-rank without --lora-targets",
                    format!(
                        "ferrite knows no default LoRA targets for model type `{model_type}`; name the layers, e.g. --lora-targets all-linear"
                    ),
                ));
            }
        };
        let dropout = self.lora_dropout.unwrap_or(0.0);
        if !(0.0..1.0).contains(&dropout) {
            return Err(invalid(format!("--lora-dropout {dropout}"), "a probability in [0, 1); 0 turns it off"));
        }
        Ok(Some(LoraConfig {
            r,
            alpha: self.lora_alpha.unwrap_or(DEFAULT_ALPHA),
            dropout,
            use_rslora: self.lora_rslora,
            targets: LoraTargets::parse(targets),
        }))
    }

    /// The planner's hook: `workload` with these flags' LoRA and base dtype.
    pub fn plan_workload(
        &self,
        workload: Box<dyn ferrite_plan::Workload>,
        model_type: &str,
    ) -> Result<Box<dyn ferrite_plan::Workload>, PlanError> {
        Ok(ferrite_plan::with_lora(workload, self.config(model_type)?, self.base_dtype))
    }
}

/// LoRA as `train` set it up: the configuration and the line saying what trains.
pub struct TrainingLora {
    pub config: LoraConfig,
    pub line: String,
}

/// `train`'s hook after loading the model: its weights converted to `--base-dtype`, then LoRA
/// adapters attached (drawn from a generator seeded by `seed`), their dropout drawing from the
/// trainer's `dropout_rng`. `None` without `--lora-rank`.
pub fn prepare_training(
    args: &TrainLoraArgs,
    model: &mut dyn Module,
    model_type: &str,
    seed: u64,
    dropout_rng: &ferrite_nn::RngHandle,
) -> Result<Option<TrainingLora>, PlanError> {
    let config = args.lora.config(model_type)?;
    if args.merge_lora && config.is_none() {
        return Err(invalid(
            "--merge-lora without --lora-rank",
            "--merge-lora merges trained LoRA adapters into the weights; add --lora-rank R, or drop --merge-lora (full fine-tuning already writes the whole model)",
        ));
    }
    if let Some(d) = args.lora.base_dtype.filter(|&d| d != DType::F32) {
        model.to_dtype(d)?;
    }
    let Some(c) = config else { return Ok(None) };
    let total: usize = model.parameters().iter().map(Tensor::numel).sum();
    let layers = apply_lora(model, &c, &mut Generator::new(seed ^ 0x4c6f_5241))?;
    ferrite_nn::set_lora_dropout_rng(model, dropout_rng);
    let trainable: usize = trainable_parameters(model).iter().map(|(_, p)| p.numel()).sum();
    let line = format!(
        "  LoRA r={} alpha={}{} dropout {} on {} layers ({}): {trainable} trainable parameters, {:.3}% of the {total} frozen{}",
        c.r,
        c.alpha,
        if c.use_rslora { " (rsLoRA)" } else { "" },
        c.dropout,
        layers.len(),
        c.targets.names().join(","),
        100.0 * trainable as f64 / total.max(1) as f64,
        args.lora.base_dtype.map_or(String::new(), |d| format!(" ({d})")),
    );
    Ok(Some(TrainingLora { config: c, line }))
}

/// The parameters the optimizer updates: every one without LoRA, the adapters' with it.
pub fn optimized_parameters(model: &dyn Module) -> Vec<(String, Tensor)> {
    trainable_parameters(model)
}

/// `train`'s hook at the end: with LoRA, the adapter folder (or, with `--merge-lora`, the merged
/// model) in `out`; without, the full model. Returns how to load what was written (`auto_class`:
/// transformers' class for the base, `AutoModelForCausalLM` or `AutoModelForSeq2SeqLM`).
#[allow(clippy::too_many_arguments)]
pub fn save_trained(
    args: &TrainLoraArgs,
    config: Option<&LoraConfig>,
    model: &mut dyn Module,
    auto_class: &str,
    base_dir: &Path,
    config_text: &str,
    out: &Path,
    options: &HfSaveOptions,
) -> Result<String, ModelError> {
    let full = |model: &dyn Module| -> Result<String, ModelError> {
        save_decoder_with(model, config_text, out, options)?;
        Ok(format!("transformers: {auto_class}.from_pretrained(\"{}\")", out.display()))
    };
    match config {
        None => full(model),
        Some(_) if args.merge_lora => {
            merge_lora(model)?;
            full(model)
        }
        Some(c) => {
            let base = std::fs::canonicalize(base_dir).unwrap_or_else(|_| base_dir.to_path_buf());
            save_lora_adapter(model, c, &base.display().to_string(), out)?;
            Ok(format!(
                "PEFT: PeftModel.from_pretrained({auto_class}.from_pretrained(\"{}\"), \"{}\"); ferrite: --lora {}",
                base.display(),
                out.display(),
                out.display()
            ))
        }
    }
}

/// `eval`'s and `generate`'s hook: the `--lora` adapter folder put on `model`; the line to print.
pub fn attach_adapter(arg: &LoraAdapterArg, model: &mut dyn Module) -> Result<Option<String>, ModelError> {
    let Some(dir) = &arg.lora else { return Ok(None) };
    let c = load_lora_adapter(model, dir)?;
    Ok(Some(format!(
        "LoRA adapter {}: r={} alpha={} on {}",
        dir.display(),
        c.lora.r,
        c.lora.alpha,
        c.lora.targets.names().join(",")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_become_peft_settings_with_per_architecture_defaults() {
        let a = LoraArgs { lora_rank: Some(8), ..LoraArgs::default() };
        let c = a.config("llama").unwrap().unwrap();
        assert_eq!((c.r, c.alpha, c.targets.clone()), (8, 8.0, LoraTargets::parse("q_proj,v_proj")));
        assert_eq!(a.config("gpt2").unwrap().unwrap().targets, LoraTargets::Modules(vec!["c_attn".into()]));
        assert!(a.config("bert").unwrap_err().to_string().contains("--lora-targets"));
        let zero = LoraArgs { lora_rank: Some(0), ..LoraArgs::default() };
        assert!(zero.config("llama").unwrap_err().to_string().contains("--lora-rank 0"));
        assert_eq!(LoraArgs::default().config("llama").unwrap(), None);
        assert_eq!(parse_base_dtype("bf16"), Ok(DType::BF16));
        assert!(parse_base_dtype("int8").is_err());
    }
}
