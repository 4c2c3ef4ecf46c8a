//! A user's text corpus as documents, for tokenized training (`ferrite train --hf-model --data`):
//! a text file is one document, a JSON Lines file holds one document per line (its `text` field),
//! and a folder holds one document per `.txt` file and per line of each `.jsonl` file, in file-name
//! order.
//!
//! Why documents and not one string: a tokenized corpus marks where one document ends and the
//! next begins with the tokenizer's end-of-sequence id, as Hugging Face's fine-tuning scripts do,
//! so the model is not taught that unrelated texts continue each other. The files are read in a
//! fixed (sorted) order, so a run is the same on every machine.
use std::path::{Path, PathBuf};

use crate::error::DataError;
use crate::file_bytes::read_maybe_gz;
use crate::text_files::files_named;
use crate::tokenizer::HfTokenizer;

/// The documents at `path` (see the module docs); `.jsonl` lines are read from `field`.
pub fn read_documents(path: &Path, field: &str) -> Result<Vec<String>, DataError> {
    let meta = std::fs::metadata(path).map_err(|source| DataError::Io { path: path.to_path_buf(), source })?;
    let files = if meta.is_dir() { corpus_files(path)? } else { vec![path.to_path_buf()] };
    let mut docs = Vec::new();
    for file in &files {
        let bytes = read_maybe_gz(file)?;
        let text = String::from_utf8(bytes)
            .map_err(|e| DataError::NotUtf8 { path: file.clone(), offset: e.utf8_error().valid_up_to() })?;
        if is_jsonl(file) {
            docs.extend(jsonl_field(file, &text, field)?);
        } else {
            docs.push(text);
        }
    }
    Ok(docs)
}

/// Every document of `docs` tokenized without special tokens and joined with `eos` (between
/// documents, as `group_texts` in transformers' `run_clm.py` sees them after an EOS is appended).
pub fn tokenize_documents(tok: &HfTokenizer, docs: &[String], eos: Option<u32>) -> Result<Vec<u32>, DataError> {
    let mut ids = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        if i > 0
            && let Some(e) = eos
        {
            ids.push(e);
        }
        ids.extend(tok.encode(doc, false)?);
    }
    Ok(ids)
}

fn is_jsonl(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    name.ends_with(".jsonl") || name.ends_with(".jsonl.gz")
}

/// The `field` of each non-blank line of a JSON Lines text.
fn jsonl_field(path: &Path, text: &str, field: &str) -> Result<Vec<String>, DataError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| DataError::BadJsonl { path: path.to_path_buf(), line: i + 1, reason };
        let value: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON ({e})")))?;
        match value.get(field) {
            Some(serde_json::Value::String(s)) => out.push(s.clone()),
            Some(other) => return Err(bad(format!("field `{field}` is {other}, not a string"))),
            None => {
                return Err(bad(format!("no field `{field}`; every line must be an object with a `{field}` string")));
            }
        }
    }
    Ok(out)
}

/// The `.txt` and `.jsonl` files (gzipped or not) directly in `dir`, not hidden, sorted.
fn corpus_files(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    files_named(dir, |name| {
        let name = name.to_ascii_lowercase();
        let stem = name.strip_suffix(".gz").unwrap_or(&name);
        stem.ends_with(".txt") || stem.ends_with(".jsonl")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_lines_and_folders_are_documents() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.jsonl"), "{\"text\": \"two\"}\n\n{\"text\": \"three\", \"id\": 3}\n")
            .unwrap();
        std::fs::write(dir.path().join("a.txt"), "one").unwrap();
        std::fs::write(dir.path().join("notes.md"), "ignored").unwrap();
        assert_eq!(read_documents(dir.path(), "text").unwrap(), vec!["one", "two", "three"]);
        assert_eq!(read_documents(&dir.path().join("a.txt"), "text").unwrap(), vec!["one"]);
        std::fs::write(dir.path().join("c.jsonl"), "{\"body\": \"x\"}\n").unwrap();
        let e = read_documents(dir.path(), "text").unwrap_err().to_string();
        assert!(e.contains("c.jsonl, line 1") && e.contains("no field `text`"), "{e}");
        std::fs::write(dir.path().join("c.jsonl"), "not json\n").unwrap();
        assert!(matches!(read_documents(dir.path(), "text"), Err(DataError::BadJsonl { line: 1, .. })));
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(read_documents(empty.path(), "text"), Err(DataError::NoTextFiles { .. })));
    }
}
