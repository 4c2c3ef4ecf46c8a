//! What `ferrite eval`, `generate` and `train --hf-model` share: opening a Hugging Face model
//! folder (config, weights, `tokenizer.json`) with the errors a user can act on.
use std::path::Path;

use ferrite_data::HfTokenizer;
use ferrite_models::{Decoder, HfFolder, HfLoadOptions, ModelError};
use ferrite_tensor::Device;

/// A decoder folder and its tokenizer.
pub struct HfModelDir {
    pub folder: HfFolder,
    pub tokenizer: HfTokenizer,
}

/// Opens `dir` for a command that needs a decoder-only model and its tokenizer (`command` names
/// the command in the messages).
pub fn open(dir: &Path, command: &str) -> Result<HfModelDir, ModelError> {
    let folder = HfFolder::open(dir)?;
    if folder.is_t5() {
        return Err(ModelError::HfFolder {
            path: dir.display().to_string(),
            problem: format!(
                "a T5 encoder-decoder; `ferrite {command} --hf-model` runs decoder-only models (GPT-2, Llama, Mistral, Qwen2). The library loads T5 folders (`HfFolder::load_t5`)"
            ),
        });
    }
    folder.decoder_config()?;
    let Some(path) = folder.tokenizer_file() else {
        return Err(ModelError::HfFolder {
            path: dir.display().to_string(),
            problem: format!(
                "no tokenizer.json: `ferrite {command}` needs the model's fast tokenizer file; write it with `AutoTokenizer.from_pretrained(...).save_pretrained(\"{}\")`",
                dir.display()
            ),
        });
    };
    let tokenizer = HfTokenizer::from_file(&path)
        .map_err(|e| ModelError::HfFolder { path: path.display().to_string(), problem: e.to_string() })?;
    Ok(HfModelDir { folder, tokenizer })
}

impl HfModelDir {
    /// The model with its weights on `device` (f32), every key matched.
    pub fn load(&self, device: &Device) -> Result<Decoder, ModelError> {
        Ok(self.folder.load_decoder(device, &HfLoadOptions::default())?.0)
    }

    /// `--seq` checked against the model's learned positions (GPT-2's `n_positions`).
    pub fn check_seq(&self, seq: usize) -> Result<(), ModelError> {
        let c = self.folder.decoder_config()?;
        if seq < 2 {
            return Err(ModelError::InvalidSetting {
                what: format!("--seq {seq}"),
                reason: "a block needs at least 2 tokens (one read, one predicted)".into(),
            });
        }
        if c.style == ferrite_models::HfStyle::Gpt2 && seq > c.max_positions {
            return Err(ModelError::InvalidSetting {
                what: format!("--seq {seq}"),
                reason: format!(
                    "the model has learned positions for {} tokens (`n_positions` in config.json); use --seq {} or less",
                    c.max_positions, c.max_positions
                ),
            });
        }
        Ok(())
    }
}
