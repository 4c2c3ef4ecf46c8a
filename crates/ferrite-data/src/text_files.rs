//! The text of a language-model corpus given as a path (`ferrite train --data FILE|DIR`): one
//! file (UTF-8, gzipped or not), or every `.txt` file of a folder, sorted by name and joined
//! with a newline.
//!
//! Why a folder: corpora come as many files (a book per file, a page per file); concatenating
//! them by hand loses the order and the boundaries. Sorting makes the text, and so the run, the
//! same on every machine; the newline keeps the last line of one file from running into the
//! first of the next.

use std::path::{Path, PathBuf};

use crate::error::DataError;
use crate::file_bytes::read_maybe_gz;

/// The text at `path` and the files it was read from.
pub fn read_text_source(path: &Path) -> Result<(String, Vec<PathBuf>), DataError> {
    let meta = std::fs::metadata(path).map_err(|source| DataError::Io { path: path.to_path_buf(), source })?;
    let files = if meta.is_dir() { txt_files(path)? } else { vec![path.to_path_buf()] };
    let mut text = String::new();
    for (i, file) in files.iter().enumerate() {
        let bytes = read_maybe_gz(file)?;
        let part = String::from_utf8(bytes)
            .map_err(|e| DataError::NotUtf8 { path: file.clone(), offset: e.utf8_error().valid_up_to() })?;
        if i > 0 {
            text.push('\n');
        }
        text.push_str(&part);
    }
    Ok((text, files))
}

/// The `.txt` files directly in `dir` (not hidden), sorted.
fn txt_files(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    files_named(dir, |name| name.rsplit_once('.').is_some_and(|(_, ext)| ext.eq_ignore_ascii_case("txt")))
}

/// The files directly in `dir` whose name `wanted` accepts, hidden ones left out, sorted by name;
/// none is [`DataError::NoTextFiles`] (the corpus readers' folders: `.txt` here, `.txt` and
/// `.jsonl` in `documents.rs`).
pub(crate) fn files_named(dir: &Path, wanted: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>, DataError> {
    let io = |source| DataError::Io { path: dir.to_path_buf(), source };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if wanted(&name) && !name.starts_with('.') && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(DataError::NoTextFiles { path: dir.to_path_buf() });
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_or_a_folder_of_txt_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.txt"), "second").unwrap();
        std::fs::write(dir.path().join("a.TXT"), "first").unwrap();
        std::fs::write(dir.path().join("notes.md"), "ignored").unwrap();
        std::fs::write(dir.path().join(".hidden.txt"), "ignored").unwrap();
        let (text, files) = read_text_source(dir.path()).unwrap();
        assert_eq!(text, "first\nsecond");
        assert_eq!(files.len(), 2);
        let (text, _) = read_text_source(&dir.path().join("b.txt")).unwrap();
        assert_eq!(text, "second");
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(read_text_source(empty.path()), Err(DataError::NoTextFiles { .. })));
        assert!(matches!(read_text_source(&dir.path().join("missing")), Err(DataError::Io { .. })));
        std::fs::write(dir.path().join("c.txt"), [0xffu8]).unwrap();
        assert!(matches!(read_text_source(dir.path()), Err(DataError::NotUtf8 { .. })));
    }
}
