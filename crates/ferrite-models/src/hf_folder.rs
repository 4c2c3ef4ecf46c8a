//! Hugging Face model folders: `config.json` plus weights, read into a [`Decoder`] (or a
//! [`T5Model`]) with the HF parameter names, and written back so `from_pretrained` loads them.
//!
//! Why here: the names and layouts of the models are this crate's (`hf_decoder.rs`, `t5.rs`), so
//! the mapping from a folder to a model lives next to them; the file formats themselves are
//! ferrite-io's (safetensors, and `pytorch_model.bin` through its restricted unpickler, which
//! runs no code from the file).
//!
//! Weights are found as `save_pretrained` writes them, first match wins:
//! 1. `model.safetensors`;
//! 2. `model.safetensors.index.json` and the shards its `weight_map` names;
//! 3. `pytorch_model.bin`;
//! 4. `pytorch_model.bin.index.json` and its shards.
//!
//! Floating-point tensors are converted to the requested dtype (f32 by default: bf16/f16 files
//! become f32 master weights). Keys are matched as `transformers` matches them: a checkpoint of
//! the bare base model (`h.0.attn.c_attn.weight`, no `transformer.`) gets the prefix; buffers
//! HF also ignores (`attn.bias`/`attn.masked_bias` of old GPT-2 files, `rotary_emb.inv_freq`) are
//! dropped; a tied head's `lm_head.weight` (and T5's `encoder/decoder.embed_tokens.weight`) is the
//! embedding and is not loaded twice. Missing and unexpected keys are reported as PyTorch's
//! `load_state_dict` reports them (an error when strict, returned otherwise); a shape mismatch
//! names the key and both shapes; a file that cannot be read (truncated, corrupt) names the file.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ferrite_io::LoadOptions;
use ferrite_nn::{IncompatibleKeys, Module, StateDict};
use ferrite_tensor::{DType, Device};
use serde_json::Value;

use crate::{Decoder, HfConfig, HfStyle, ModelError, T5Config, T5Model};

/// The weight files of a folder, as found by [`HfFolder::open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightFiles {
    /// One `model.safetensors`.
    Safetensors(PathBuf),
    /// One `pytorch_model.bin`.
    PytorchBin(PathBuf),
    /// Shards named by an index file (`model.safetensors.index.json` or
    /// `pytorch_model.bin.index.json`), in the order of their first appearance in it.
    Sharded { index: PathBuf, shards: Vec<PathBuf> },
}

impl WeightFiles {
    /// Every file holding weights.
    pub fn files(&self) -> Vec<&Path> {
        match self {
            WeightFiles::Safetensors(p) | WeightFiles::PytorchBin(p) => vec![p.as_path()],
            WeightFiles::Sharded { shards, .. } => shards.iter().map(PathBuf::as_path).collect(),
        }
    }
}

/// How [`HfFolder::load_decoder`] loads.
#[derive(Debug, Clone, PartialEq)]
pub struct HfLoadOptions {
    /// The dtype of the model's floating-point parameters (default f32).
    pub dtype: DType,
    /// Missing or unexpected keys are an error (default, as PyTorch's `strict=True`); otherwise
    /// they are returned.
    pub strict: bool,
}

impl Default for HfLoadOptions {
    fn default() -> Self {
        HfLoadOptions { dtype: DType::F32, strict: true }
    }
}

/// A Hugging Face model folder: its `config.json` (kept as read) and where its weights are.
#[derive(Debug, Clone)]
pub struct HfFolder {
    pub dir: PathBuf,
    /// The text of `config.json`, unchanged (written back as it was by [`save_decoder`]).
    pub config_text: String,
    pub weights: WeightFiles,
}

fn folder_err(path: &Path, problem: impl Into<String>) -> ModelError {
    ModelError::HfFolder { path: path.display().to_string(), problem: problem.into() }
}

impl HfFolder {
    /// Find `config.json` and the weights in `dir` (nothing is read beyond the config and an index).
    pub fn open(dir: impl AsRef<Path>) -> Result<HfFolder, ModelError> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(folder_err(
                &dir,
                "not a folder; pass the folder `save_pretrained` wrote (it holds config.json)",
            ));
        }
        let config = dir.join("config.json");
        let config_text = std::fs::read_to_string(&config).map_err(|e| {
            folder_err(&config, format!("cannot read it ({e}); a Hugging Face model folder holds its config.json"))
        })?;
        let weights = if dir.join("model.safetensors").is_file() {
            WeightFiles::Safetensors(dir.join("model.safetensors"))
        } else if dir.join("model.safetensors.index.json").is_file() {
            read_index(&dir, &dir.join("model.safetensors.index.json"))?
        } else if dir.join("pytorch_model.bin").is_file() {
            WeightFiles::PytorchBin(dir.join("pytorch_model.bin"))
        } else if dir.join("pytorch_model.bin.index.json").is_file() {
            read_index(&dir, &dir.join("pytorch_model.bin.index.json"))?
        } else {
            return Err(folder_err(
                &dir,
                "no weights: expected model.safetensors, model.safetensors.index.json with its shards, or pytorch_model.bin",
            ));
        };
        Ok(HfFolder { dir, config_text, weights })
    }

    fn config_name(&self) -> String {
        self.dir.join("config.json").display().to_string()
    }

    /// The folder's `tokenizer.json`, when it has one.
    pub fn tokenizer_file(&self) -> Option<PathBuf> {
        Some(self.dir.join("tokenizer.json")).filter(|p| p.is_file())
    }

    /// The ids that end a generated text: `eos_token_id` of `generation_config.json` when the
    /// folder has one (transformers' `generate` reads it there first), else of `config.json`; a
    /// number or a list. Empty when neither says.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        let ids = |v: &Value| -> Vec<u32> {
            match v.get("eos_token_id") {
                Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()).into_iter().collect(),
                Some(Value::Array(a)) => {
                    a.iter().filter_map(|n| n.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
                }
                _ => Vec::new(),
            }
        };
        let generation = std::fs::read_to_string(self.dir.join("generation_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .map(|v| ids(&v))
            .unwrap_or_default();
        if !generation.is_empty() {
            return generation;
        }
        serde_json::from_str::<Value>(&self.config_text).map(|v| ids(&v)).unwrap_or_default()
    }

    /// Whether `config.json` describes a T5-style encoder-decoder.
    pub fn is_t5(&self) -> bool {
        serde_json::from_str::<Value>(&self.config_text)
            .ok()
            .and_then(|v| v.as_object().map(T5Config::describes))
            .unwrap_or(false)
    }

    /// The decoder configuration in `config.json`.
    pub fn decoder_config(&self) -> Result<HfConfig, ModelError> {
        HfConfig::from_json(&self.config_text, &self.config_name())
    }

    /// The T5 configuration in `config.json`.
    pub fn t5_config(&self) -> Result<T5Config, ModelError> {
        T5Config::from_json(&self.config_text, &self.config_name())
    }

    /// Every tensor of every weight file on the CPU, floating-point ones as `dtype`, keys as
    /// stored. A file that cannot be read, or a key in two shards, names the file(s).
    pub fn read_state_dict(&self, dtype: DType) -> Result<StateDict, ModelError> {
        let options = LoadOptions::new().device(Device::Cpu).dtype(dtype);
        let mut sd = StateDict::new();
        let mut origin: BTreeMap<String, PathBuf> = BTreeMap::new();
        for file in self.weights.files() {
            let tensors = ferrite_io::load_state_dict(file, &options).map_err(|source| ModelError::WeightFile {
                path: file.display().to_string(),
                source: Box::new(source),
            })?;
            for (k, t) in tensors {
                if let Some(first) = origin.insert(k.clone(), file.to_path_buf()) {
                    return Err(folder_err(
                        file,
                        format!("`{k}` is also in {}; each weight belongs to one shard", first.display()),
                    ));
                }
                sd.insert(k, t);
            }
        }
        Ok(sd)
    }

    /// The decoder of this folder on `device`, its weights loaded (see the module's notes on keys).
    /// Returns the keys that did not match when `options.strict` is false.
    pub fn load_decoder(
        &self,
        device: &Device,
        options: &HfLoadOptions,
    ) -> Result<(Decoder, IncompatibleKeys), ModelError> {
        let config = self.decoder_config()?;
        // Strict: every parameter is loaded below, so none is drawn at random first. Built in
        // the load's dtype: a 7B model in bf16 never holds an f32 copy of its weights.
        let mut model = ferrite_nn::with_parameter_dtype(options.dtype, || {
            if options.strict {
                ferrite_nn::skip_init(|| Decoder::new(&config, device, false))
            } else {
                Decoder::new(&config, device, false)
            }
        })?;
        if options.dtype != DType::F32 {
            model.to_dtype(options.dtype)?;
        }
        let sd = decoder_keys(self.read_state_dict(options.dtype)?, &config);
        let keys = model.load_state_dict(&sd, options.strict)?;
        Ok((model, keys))
    }

    /// The T5 model of this folder on `device`, its weights loaded.
    pub fn load_t5(&self, device: &Device, options: &HfLoadOptions) -> Result<(T5Model, IncompatibleKeys), ModelError> {
        let config = self.t5_config()?;
        let mut model = ferrite_nn::with_parameter_dtype(options.dtype, || {
            if options.strict {
                ferrite_nn::skip_init(|| T5Model::new(&config, device, false))
            } else {
                T5Model::new(&config, device, false)
            }
        })?;
        if options.dtype != DType::F32 {
            model.to_dtype(options.dtype)?;
        }
        let mut sd = self.read_state_dict(options.dtype)?;
        for k in ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"] {
            sd.remove(k);
        }
        if config.tie_word_embeddings {
            sd.remove("lm_head.weight");
        }
        let keys = model.load_state_dict(&sd, options.strict)?;
        Ok((model, keys))
    }
}

/// Read an index file: its `weight_map`'s files must be plain names inside `dir`, and exist.
fn read_index(dir: &Path, index: &Path) -> Result<WeightFiles, ModelError> {
    let text = std::fs::read_to_string(index).map_err(|e| folder_err(index, format!("cannot read it ({e})")))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| folder_err(index, format!("not valid JSON: {e}")))?;
    let Some(map) = v.get("weight_map").and_then(Value::as_object) else {
        return Err(folder_err(index, "no `weight_map` object (tensor name → shard file)"));
    };
    let mut shards: Vec<PathBuf> = Vec::new();
    for (key, file) in map {
        let Some(name) = file.as_str() else {
            return Err(folder_err(index, format!("`weight_map.{key}` must be a file name, found {file}")));
        };
        let plain = Path::new(name).file_name().is_some_and(|f| f == name) && name != "..";
        if !plain {
            return Err(folder_err(
                index,
                format!(
                    "`weight_map.{key}` is `{name}`; shards must be files in the model's folder, named without a path"
                ),
            ));
        }
        let path = dir.join(name);
        if !shards.contains(&path) {
            if !path.is_file() {
                return Err(folder_err(
                    index,
                    format!("names the shard `{name}` (for `{key}`), which is not in the folder; download it again"),
                ));
            }
            shards.push(path);
        }
    }
    if shards.is_empty() {
        return Err(folder_err(index, "its `weight_map` is empty"));
    }
    Ok(WeightFiles::Sharded { index: index.to_path_buf(), shards })
}

/// The keys of a decoder checkpoint as [`Decoder`] names them: the base model's prefix added when
/// the file has none, HF's ignorable buffers dropped, a tied `lm_head.weight` dropped.
pub fn decoder_keys(sd: StateDict, config: &HfConfig) -> StateDict {
    let prefix = format!("{}.", config.base_model_prefix());
    let bare = !sd.keys().any(|k| k.starts_with(&prefix));
    let mut out = StateDict::new();
    for (k, t) in sd.iter() {
        let ignorable = match config.style {
            HfStyle::Gpt2 => k.ends_with(".attn.bias") || k.ends_with(".attn.masked_bias"),
            HfStyle::Llama => k.ends_with(".rotary_emb.inv_freq"),
        };
        if ignorable || (config.tie_word_embeddings && k == "lm_head.weight") {
            continue;
        }
        let key = if bare && !k.starts_with("lm_head.") { format!("{prefix}{k}") } else { k.to_string() };
        out.insert(key, t.clone());
    }
    out
}

/// How [`save_decoder_with`] writes a folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfSaveOptions {
    /// Weights above this many bytes are split into `model-0000N-of-0000M.safetensors` shards with
    /// a `model.safetensors.index.json` (transformers' `max_shard_size`, default 5 GB = 5·10⁹
    /// bytes). A tensor larger than the limit gets a shard of its own.
    pub max_shard_size: u64,
    /// Files copied from the source folder when present (`tokenizer.json`,
    /// `generation_config.json`, …; see [`HfSaveOptions::default`]).
    pub copy_from: Option<PathBuf>,
}

/// The files besides config and weights that make a folder usable as it was: the tokenizer and
/// the generation defaults.
pub const COMPANION_FILES: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
];

impl Default for HfSaveOptions {
    fn default() -> Self {
        HfSaveOptions { max_shard_size: 5_000_000_000, copy_from: None }
    }
}

/// `--max-shard-size`: a byte count with an optional unit, as transformers writes them (`5GB`,
/// `500MB`, `2GiB`, `1000`; GB/MB/KB are powers of 10, GiB/MiB/KiB of 2).
pub fn parse_shard_size(text: &str) -> Result<u64, ModelError> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        _ => 0,
    };
    let value: f64 = num.parse().unwrap_or(f64::NAN);
    let bytes = value * scale as f64;
    if scale == 0 || !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(ModelError::InvalidSetting {
            what: format!("max-shard-size `{text}`"),
            reason: "expected a positive size such as 5GB, 500MB, 2GiB or a byte count".into(),
        });
    }
    Ok(bytes as u64)
}

/// Write `model` as a Hugging Face folder in `dir` (created if needed): `config_text` as
/// `config.json`, the weights as one `model.safetensors` (`format: pt` metadata, a tied head
/// stored once, as `save_pretrained` does), each file atomically.
pub fn save_decoder(model: &Decoder, config_text: &str, dir: impl AsRef<Path>) -> Result<(), ModelError> {
    save_decoder_with(model, config_text, dir, &HfSaveOptions::default())
}

/// [`save_decoder`] (of any model with Hugging Face parameter names: a [`Decoder`], a
/// [`T5Model`]) with shards above `options.max_shard_size` and the source folder's
/// companion files ([`COMPANION_FILES`]) copied. A weight file of the other layout left in `dir`
/// by an earlier save is removed, so `from_pretrained` cannot read stale weights.
pub fn save_decoder_with(
    model: &dyn Module,
    config_text: &str,
    dir: impl AsRef<Path>,
    options: &HfSaveOptions,
) -> Result<(), ModelError> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| folder_err(dir, format!("cannot create it ({e})")))?;
    let sd = model.state_dict();
    let write_err =
        |path: &Path, source| ModelError::WeightFile { path: path.display().to_string(), source: Box::new(source) };
    // Shards in key order, each up to the limit (a tensor alone when it is larger).
    let mut shards: Vec<Vec<(&str, &ferrite_tensor::Tensor)>> = vec![Vec::new()];
    let mut size = 0u64;
    let mut total = 0u64;
    for (k, t) in sd.iter() {
        let bytes = t.nbytes() as u64;
        total += bytes;
        if size > 0 && size + bytes > options.max_shard_size {
            shards.push(Vec::new());
            size = 0;
        }
        size += bytes;
        if let Some(last) = shards.last_mut() {
            last.push((k, t));
        }
    }
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    let remove_stale = |p: &Path| -> Result<(), ModelError> {
        match std::fs::remove_file(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(folder_err(p, format!("cannot remove the stale file ({e})")))
            }
            _ => Ok(()),
        }
    };
    if shards.len() == 1 {
        ferrite_io::save_state_dict(&single, sd.iter()).map_err(|e| write_err(&single, e))?;
        remove_stale(&index)?;
    } else {
        let n = shards.len();
        let mut weight_map = serde_json::Map::new();
        for (i, shard) in shards.iter().enumerate() {
            let name = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
            let path = dir.join(&name);
            ferrite_io::save_state_dict(&path, shard.iter().copied()).map_err(|e| write_err(&path, e))?;
            for (k, _) in shard {
                weight_map.insert(k.to_string(), Value::String(name.clone()));
            }
        }
        let json = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        let text = serde_json::to_string_pretty(&json).map_err(|e| folder_err(&index, e.to_string()))?;
        ferrite_io::write_atomically(&index, |f| std::io::Write::write_all(f, text.as_bytes()))
            .map_err(|e| write_err(&index, e))?;
        remove_stale(&single)?;
    }
    let config = dir.join("config.json");
    ferrite_io::write_atomically(&config, |f| std::io::Write::write_all(f, config_text.as_bytes()))
        .map_err(|e| write_err(&config, e))?;
    if let Some(src) = &options.copy_from {
        for name in COMPANION_FILES {
            let (from, to) = (src.join(name), dir.join(name));
            if from.is_file() && from != to {
                let bytes = std::fs::read(&from).map_err(|e| folder_err(&from, format!("cannot read it ({e})")))?;
                ferrite_io::write_atomically(&to, |f| std::io::Write::write_all(f, &bytes))
                    .map_err(|e| write_err(&to, e))?;
            }
        }
    }
    Ok(())
}
