//! Hugging Face tokenizers: a model folder's `tokenizer.json`, read and run by Hugging Face's own
//! Rust library (`tokenizers`), so ferrite's token ids are the ones `transformers` produces.
//!
//! Why a thin wrapper and not our own BPE: a tokenizer is a file format plus a long tail of
//! normalisers, pre-tokenizers and post-processors; any difference from the reference changes
//! every loss figure. The wrapper only turns the library's errors into [`DataError`]s that name
//! the file, and fixes the conventions ferrite's commands document: text is encoded *without*
//! special tokens (the `eval` definition and the training data add the EOS id themselves), and
//! decoding keeps special tokens unless asked otherwise.
use std::path::{Path, PathBuf};

use crate::error::DataError;

/// A `tokenizer.json`, loaded.
#[derive(Clone)]
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer").field("path", &self.path).field("vocab_size", &self.vocab_size()).finish()
    }
}

impl HfTokenizer {
    /// Reads `path` (a `tokenizer.json`); a missing file is [`DataError::Io`], one the library
    /// cannot parse is [`DataError::BadTokenizer`], both naming the file.
    pub fn from_file(path: &Path) -> Result<HfTokenizer, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.to_path_buf(), source })?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| DataError::BadTokenizer { path: path.to_path_buf(), reason: e.to_string() })?;
        Ok(HfTokenizer { inner, path: path.to_path_buf() })
    }

    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ids of `text`, with the post-processor's special tokens (BOS, EOS) when
    /// `add_special_tokens` (transformers' `tokenizer(text, add_special_tokens=...)`).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, DataError> {
        let enc = self.inner.encode(text, add_special_tokens).map_err(|e| DataError::Tokenize {
            what: format!("a text of {} bytes", text.len()),
            reason: e.to_string(),
        })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The ids of `text` with the special tokens, at most `max_len` of them: the text cut so
    /// that it and the post-processor's tokens fit, as `tokenizer(text, truncation=True,
    /// max_length=max_len)`. `max_len` must leave room for one token of text besides the special
    /// ones ([`HfTokenizer::special_tokens_added`]); returns the ids and whether text was cut.
    pub fn encode_truncated(&self, text: &str, max_len: usize) -> Result<(Vec<u32>, bool), DataError> {
        let added = self.special_tokens_added();
        if max_len <= added {
            return Err(DataError::InvalidConfig(format!(
                "a length of {max_len} tokens leaves no room for text: {} adds {added} special token(s) to every sequence; use a larger --seq",
                self.path.display()
            )));
        }
        let full = self.encode(text, true)?;
        if full.len() <= max_len {
            return Ok((full, false));
        }
        let mut cut = self.inner.clone();
        let params = tokenizers::TruncationParams { max_length: max_len, ..Default::default() };
        cut.with_truncation(Some(params)).map_err(|e| DataError::Tokenize {
            what: format!("truncation to {max_len} tokens"),
            reason: e.to_string(),
        })?;
        let enc = cut.encode(text, true).map_err(|e| DataError::Tokenize {
            what: format!("a text of {} bytes", text.len()),
            reason: e.to_string(),
        })?;
        Ok((enc.get_ids().to_vec(), true))
    }

    /// Special tokens the post-processor adds to one sequence (T5's `</s>`: 1; GPT-2's: 0).
    pub fn special_tokens_added(&self) -> usize {
        self.inner.get_post_processor().map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false))
    }

    /// The text of `ids` (transformers' `decode(ids, skip_special_tokens=...)`).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, DataError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| DataError::Tokenize { what: format!("{} token ids", ids.len()), reason: e.to_string() })
    }

    /// Ids the tokenizer knows, added tokens included (the largest id + 1 is at most this).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token written as in the vocabulary (`<|endoftext|>`, `</s>`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}
