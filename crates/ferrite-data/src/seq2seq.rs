//! Sequence-to-sequence examples (an input text and its target, as for T5): a JSON Lines file of
//! `{"input": ..., "target": ...}` objects (the field names are the caller's), tokenized and
//! batched as transformers' `run_summarization.py` with `DataCollatorForSeq2Seq` prepares them.
//!
//! - Both texts are tokenized *with* the tokenizer's special tokens (a T5 tokenizer appends
//!   `</s>`), each cut to at most `seq` tokens as `tokenizer(..., truncation=True,
//!   max_length=seq)` cuts (the special tokens kept); the number cut is reported.
//! - Inputs are padded to `seq` with `pad_token_id`, with an attention mask (1 for a token, 0 for
//!   padding); labels are padded with −100, which the loss ignores; the decoder's input is the
//!   labels shifted right behind `decoder_start_token_id`, −100 replaced by the pad id
//!   (transformers' `_shift_right`).
//!
//! Why padding to `seq` and not to the longest of a batch: every step then has one shape, which
//! the planner predicts (`ferrite plan --hf-model` is the plan of exactly this step).
//!
//! A sample is `(ids i64 [3, seq], labels i64 [seq])`, the rows of `ids` being the encoder's
//! tokens, the decoder's input and the attention mask; batches stack them to `[b, 3, seq]` and
//! `[b, seq]` ([`StackCollate`]), the input `ferrite_models::T5Model` reads.
use std::path::Path;
use std::sync::Arc;

use ferrite_tensor::{Device, Generator, Tensor};

use crate::dataset::Dataset;
use crate::error::{BoxError, DataError};
use crate::file_bytes::read_maybe_gz;
use crate::loader::{DataLoader, DataLoaderBuilder};
use crate::tensor_collate::StackCollate;
use crate::text_files::files_named;
use crate::tokenizer::HfTokenizer;

/// The label the loss ignores (transformers' `-100`), padding the targets.
pub const IGNORED_LABEL: i64 = -100;

/// One input text and its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seq2SeqPair {
    pub input: String,
    pub target: String,
}

/// The pairs of a `.jsonl` file (gzipped or not), or of every `.jsonl` file directly in a folder
/// in name order: each non-blank line an object with the string fields `input_field` and
/// `target_field`. A line that is not JSON, lacks a field, holds a non-string or an empty
/// (blank) text is [`DataError::BadJsonl`] naming the file, the line and the field.
pub fn read_seq2seq_pairs(path: &Path, input_field: &str, target_field: &str) -> Result<Vec<Seq2SeqPair>, DataError> {
    let meta = std::fs::metadata(path).map_err(|source| DataError::Io { path: path.to_path_buf(), source })?;
    let files = if meta.is_dir() {
        files_named(path, |name| {
            let name = name.to_ascii_lowercase();
            name.ends_with(".jsonl") || name.ends_with(".jsonl.gz")
        })?
    } else {
        vec![path.to_path_buf()]
    };
    let mut pairs = Vec::new();
    for file in &files {
        let bytes = read_maybe_gz(file)?;
        let text = String::from_utf8(bytes)
            .map_err(|e| DataError::NotUtf8 { path: file.clone(), offset: e.utf8_error().valid_up_to() })?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |reason: String| DataError::BadJsonl { path: file.clone(), line: i + 1, reason };
            let value: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                bad(format!(
                    "not JSON ({e}); sequence-to-sequence data is JSON Lines, one {{\"{input_field}\": ..., \"{target_field}\": ...}} object per line"
                ))
            })?;
            let field = |name: &str, flag: &str| -> Result<String, DataError> {
                match value.get(name) {
                    Some(serde_json::Value::String(s)) if s.trim().is_empty() => Err(bad(format!(
                        "field `{name}` is empty; every example needs a non-empty {} (remove the line or fill it in)",
                        if name == target_field { "target" } else { "input" }
                    ))),
                    Some(serde_json::Value::String(s)) => Ok(s.clone()),
                    Some(other) => Err(bad(format!("field `{name}` is {other}, not a string"))),
                    None => Err(bad(format!(
                        "no field `{name}`; every line must be an object with `{input_field}` and `{target_field}` strings (name other fields with {flag})"
                    ))),
                }
            };
            pairs.push(Seq2SeqPair {
                input: field(input_field, "--input-field")?,
                target: field(target_field, "--target-field")?,
            });
        }
    }
    if pairs.is_empty() {
        return Err(DataError::InvalidConfig(format!(
            "{} holds no examples: sequence-to-sequence data is JSON Lines, one {{\"{input_field}\": ..., \"{target_field}\": ...}} object per line",
            path.display()
        )));
    }
    Ok(pairs)
}

/// The special token ids a sequence-to-sequence batch needs (a T5 `config.json`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seq2SeqTokens {
    /// `pad_token_id`: pads the inputs, and replaces −100 in the decoder's input.
    pub pad: u32,
    /// `decoder_start_token_id`: the decoder's first input.
    pub decoder_start: u32,
}

/// Tokenized pairs, padded to `seq` (see the module docs).
#[derive(Debug, Clone)]
pub struct Seq2SeqExamples {
    examples: Arc<Vec<(Vec<u32>, Vec<u32>)>>,
    seq: usize,
    tokens: Seq2SeqTokens,
    truncated: usize,
}

impl Seq2SeqExamples {
    /// `pairs` tokenized with `tok` (special tokens added), each text cut to `seq` tokens.
    pub fn tokenize(
        tok: &HfTokenizer,
        pairs: &[Seq2SeqPair],
        seq: usize,
        tokens: Seq2SeqTokens,
    ) -> Result<Seq2SeqExamples, DataError> {
        let mut examples = Vec::with_capacity(pairs.len());
        let mut truncated = 0;
        for (i, p) in pairs.iter().enumerate() {
            let (input, cut_in) = tok.encode_truncated(&p.input, seq)?;
            let (target, cut_out) = tok.encode_truncated(&p.target, seq)?;
            if input.is_empty() || target.is_empty() {
                return Err(DataError::InvalidConfig(format!(
                    "example {} tokenizes to no {} tokens with {}; give it some text",
                    i + 1,
                    if input.is_empty() { "input" } else { "target" },
                    tok.path().display()
                )));
            }
            truncated += usize::from(cut_in) + usize::from(cut_out);
            examples.push((input, target));
        }
        Ok(Seq2SeqExamples { examples: Arc::new(examples), seq, tokens, truncated })
    }

    /// Tokens per input and per target (`--seq`).
    pub fn seq(&self) -> usize {
        self.seq
    }

    /// Texts (inputs and targets) cut to `seq` tokens.
    pub fn truncated(&self) -> usize {
        self.truncated
    }

    /// Target tokens over all examples: the labels the loss scores per pass.
    pub fn target_tokens(&self) -> usize {
        self.examples.iter().map(|(_, t)| t.len()).sum()
    }

    /// The first `fraction` of the examples (rounded, at least one; one is left for the second
    /// part when there are two or more) and the rest.
    pub fn split(&self, fraction: f64) -> (Seq2SeqExamples, Option<Seq2SeqExamples>) {
        let n = self.examples.len();
        let first = ((n as f64 * fraction).round() as usize).clamp(1, n.max(1));
        let first = if first == n && n > 1 { n - 1 } else { first };
        let part = |range: std::ops::Range<usize>| Seq2SeqExamples {
            examples: Arc::new(self.examples[range].to_vec()),
            seq: self.seq,
            tokens: self.tokens,
            truncated: 0,
        };
        let head = part(0..first);
        let rest = (first < n).then(|| part(first..n));
        (head, rest)
    }

    /// The first `n` examples (all of them when there are fewer).
    pub fn take(&self, n: usize) -> Seq2SeqExamples {
        Seq2SeqExamples {
            examples: Arc::new(self.examples[..n.min(self.examples.len())].to_vec()),
            truncated: 0,
            ..self.clone()
        }
    }

    /// A loader of `(ids [b, 3, seq], labels [b, seq])` i64 batches on the CPU (shuffle, batch
    /// size and staging are the builder's).
    pub fn tensor_loader(self) -> DataLoaderBuilder<Seq2SeqExamples, StackCollate> {
        DataLoader::builder(self).collate(StackCollate)
    }

    /// Example `index` as host rows: encoder ids, decoder input, mask (each `seq`), labels.
    pub fn rows(&self, index: usize) -> Option<[Vec<i64>; 4]> {
        let (input, target) = self.examples.get(index)?;
        let (s, pad) = (self.seq, i64::from(self.tokens.pad));
        let padded = |ids: &[u32], fill: i64| -> Vec<i64> {
            ids.iter().map(|&t| i64::from(t)).chain(std::iter::repeat(fill)).take(s).collect()
        };
        let enc = padded(input, pad);
        let labels = padded(target, IGNORED_LABEL);
        let dec = shift_right(&labels, self.tokens.decoder_start, self.tokens.pad);
        let mask: Vec<i64> = (0..s).map(|i| i64::from(i < input.len())).collect();
        Some([enc, dec, mask, labels])
    }
}

/// transformers' `_shift_right`: `decoder_start` followed by `labels` without its last token,
/// every −100 replaced by `pad`.
pub fn shift_right(labels: &[i64], decoder_start: u32, pad: u32) -> Vec<i64> {
    let mut out = Vec::with_capacity(labels.len());
    if labels.is_empty() {
        return out;
    }
    out.push(i64::from(decoder_start));
    out.extend(labels[..labels.len() - 1].iter().map(|&l| if l == IGNORED_LABEL { i64::from(pad) } else { l }));
    out
}

impl Dataset for Seq2SeqExamples {
    type Sample = (Tensor, Tensor);

    fn len(&self) -> usize {
        self.examples.len()
    }

    fn get(&self, index: usize, _rng: &mut Generator) -> Result<(Tensor, Tensor), BoxError> {
        let Some([enc, dec, mask, labels]) = self.rows(index) else {
            return Err(format!("example {index} out of range for {} examples", self.examples.len()).into());
        };
        let s = self.seq;
        let ids: Vec<i64> = enc.into_iter().chain(dec).chain(mask).collect();
        Ok((Tensor::from_vec(ids, &[3, s], &Device::Cpu)?, Tensor::from_vec(labels, &[s], &Device::Cpu)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shift_right_starts_with_the_start_token_and_pads_ignored_labels() {
        assert_eq!(shift_right(&[5, 6, -100, -100], 0, 3), vec![0, 5, 6, 3]);
        assert_eq!(shift_right(&[7], 9, 0), vec![9]);
        assert!(shift_right(&[], 9, 0).is_empty());
    }

    #[test]
    fn bad_lines_name_the_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("d.jsonl");
        let read = |text: &str| {
            std::fs::write(&f, text).unwrap();
            read_seq2seq_pairs(&f, "input", "target")
        };
        let ok = read("{\"input\": \"a b\", \"target\": \"c\"}\n\n{\"input\": \"d\", \"target\": \"e\", \"id\": 1}\n")
            .unwrap();
        assert_eq!(
            ok,
            vec![
                Seq2SeqPair { input: "a b".into(), target: "c".into() },
                Seq2SeqPair { input: "d".into(), target: "e".into() }
            ]
        );
        let e = read("{\"input\": \"a\", \"target\": \"c\"}\n{\"source\": \"a\", \"target\": \"c\"}\n").unwrap_err();
        assert!(matches!(e, DataError::BadJsonl { line: 2, .. }), "{e}");
        assert!(e.to_string().contains("no field `input`") && e.to_string().contains("--input-field"), "{e}");
        let e = read("{\"input\": \"a\", \"target\": \"  \"}\n").unwrap_err().to_string();
        assert!(e.contains("field `target` is empty"), "{e}");
        let e = read("{\"input\": \"a\", \"target\": 3}\n").unwrap_err().to_string();
        assert!(e.contains("not a string"), "{e}");
        assert!(matches!(read("\n\n"), Err(DataError::InvalidConfig(_))));
        assert!(matches!(read("plain text\n"), Err(DataError::BadJsonl { line: 1, .. })));
    }
}
