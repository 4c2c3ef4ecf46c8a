//! What `ferrite eval`, `generate` and `train --hf-model` share: opening a Hugging Face model
//! folder (config, weights, `tokenizer.json`) with the errors a user can act on.
use std::path::Path;

use ferrite_data::HfTokenizer;
use ferrite_models::{Decoder, HfFolder, HfLoadOptions, ModelError, T5Model};
use ferrite_tensor::Device;

/// A model folder (a decoder-only model or a T5) and its tokenizer.
pub struct HfModelDir {
    pub folder: HfFolder,
    pub tokenizer: HfTokenizer,
}

/// Opens `dir` for a command that needs a model and its tokenizer (`command` names the command
/// in the messages); the config is parsed, so an unsupported option is refused here.
pub fn open(dir: &Path, command: &str) -> Result<HfModelDir, ModelError> {
    let folder = HfFolder::open(dir)?;
    if folder.is_t5() {
        folder.t5_config()?;
    } else {
        folder.decoder_config()?;
    }
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

    /// Whether the folder holds a T5 encoder-decoder (sequence-to-sequence data and loss).
    pub fn is_t5(&self) -> bool {
        self.folder.is_t5()
    }

    /// The T5 model with its weights on `device` (f32), every key matched.
    pub fn load_t5(&self, device: &Device) -> Result<T5Model, ModelError> {
        Ok(self.folder.load_t5(device, &HfLoadOptions::default())?.0)
    }

    /// The pad and decoder-start ids of a T5 folder's `config.json`.
    pub fn seq2seq_tokens(&self) -> Result<ferrite_data::Seq2SeqTokens, ModelError> {
        let c = self.folder.t5_config()?;
        Ok(ferrite_data::Seq2SeqTokens { pad: c.pad_token_id, decoder_start: c.decoder_start_token_id })
    }

    /// `--seq` checked against the model's learned positions (GPT-2's `n_positions`).
    pub fn check_seq(&self, seq: usize) -> Result<(), ModelError> {
        if self.is_t5() {
            if seq < 2 {
                return Err(ModelError::InvalidSetting {
                    what: format!("--seq {seq}"),
                    reason: "a T5 input or target needs at least 2 tokens (text and the `</s>` the tokenizer adds)"
                        .into(),
                });
            }
            return Ok(());
        }
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
