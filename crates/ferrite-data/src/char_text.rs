//! A character-level language-modelling dataset over any UTF-8 text file (gzipped or not).
//!
//! Sample `i` is the window of `seq_len` characters starting at `i * stride` (input) and the same
//! window shifted by one (target), as character ids into a vocabulary of the distinct characters
//! of the text, sorted. Debian's `jargon-text` package provides a real public-domain corpus,
//! the Jargon File (1.68 MB of UTF-8), at [`JARGON_PATH`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrite_tensor::Generator;

use crate::dataset::Dataset;
use crate::error::{BoxError, DataError};
use crate::examples::TextExample;
use crate::file_bytes::read_maybe_gz;
use crate::text_files::read_text_source;

/// Where Debian's `jargon-text` package installs the Jargon File.
pub const JARGON_PATH: &str = "/usr/share/doc/jargon-text/jargon.txt.gz";
/// The Debian package that provides [`JARGON_PATH`].
pub const JARGON_PACKAGE: &str = "jargon-text";

/// A text cut into fixed-length training windows.
#[derive(Debug, Clone)]
pub struct CharText {
    name: String,
    vocab: Arc<Vec<char>>,
    ids: Arc<Vec<u32>>,
    seq_len: usize,
    stride: usize,
}

impl CharText {
    /// Read `path` (UTF-8, optionally gzipped) into windows of `seq_len` characters.
    pub fn from_file(path: &Path, seq_len: usize) -> Result<CharText, DataError> {
        let bytes = read_maybe_gz(path)?;
        let text = String::from_utf8(bytes)
            .map_err(|e| DataError::NotUtf8 { path: path.to_path_buf(), offset: e.utf8_error().valid_up_to() })?;
        CharText::from_text(&path.display().to_string(), &text, seq_len)
    }

    /// Read `path`: a text file (UTF-8, optionally gzipped), or a folder whose `.txt` files are
    /// joined in name order with a newline between them (see [`read_text_source`]).
    pub fn from_path(path: &Path, seq_len: usize) -> Result<CharText, DataError> {
        let (text, _) = read_text_source(path)?;
        CharText::from_text(&path.display().to_string(), &text, seq_len)
    }

    /// The Jargon File from Debian's `jargon-text` package.
    pub fn jargon(seq_len: usize) -> Result<CharText, DataError> {
        let path = Path::new(JARGON_PATH);
        if !path.is_file() {
            return Err(DataError::DatasetMissing {
                dataset: "Jargon File",
                path: path.to_path_buf(),
                package: JARGON_PACKAGE,
                env_var: None,
            });
        }
        CharText::from_file(path, seq_len)
    }

    /// Windows of `seq_len` characters over `text`; `name` appears in error messages.
    pub fn from_text(name: &str, text: &str, seq_len: usize) -> Result<CharText, DataError> {
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        let ids: Vec<u32> = text
            .chars()
            // Every character is in the vocabulary, which was built from this text.
            .map(|c| vocab.binary_search(&c).map(|i| i as u32).unwrap_or(0))
            .collect();
        CharText::from_ids(name, Arc::new(vocab), ids, seq_len)
    }

    fn from_ids(name: &str, vocab: Arc<Vec<char>>, ids: Vec<u32>, seq_len: usize) -> Result<CharText, DataError> {
        if seq_len == 0 {
            return Err(DataError::InvalidConfig("seq_len must be at least 1".into()));
        }
        if ids.len() < seq_len + 1 {
            return Err(DataError::TextTooShort { path: PathBuf::from(name), chars: ids.len(), needed: seq_len + 1 });
        }
        Ok(CharText { name: name.to_string(), vocab, ids: Arc::new(ids), seq_len, stride: seq_len })
    }

    /// Start a window every `stride` characters (default `seq_len`: non-overlapping windows).
    pub fn with_stride(mut self, stride: usize) -> Result<CharText, DataError> {
        if stride == 0 {
            return Err(DataError::InvalidConfig("stride must be at least 1".into()));
        }
        self.stride = stride;
        Ok(self)
    }

    /// Split the text at `fraction` of its characters into two datasets sharing one vocabulary
    /// (e.g. 0.9 for a train/validation split); windows never cross the cut.
    pub fn split(&self, fraction: f64) -> Result<(CharText, CharText), DataError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(DataError::InvalidConfig(format!("split fraction {fraction} is not in [0, 1]")));
        }
        let cut = (self.ids.len() as f64 * fraction).round() as usize;
        let first = CharText::from_ids(
            &format!("{} [..{cut}]", self.name),
            Arc::clone(&self.vocab),
            self.ids[..cut].to_vec(),
            self.seq_len,
        )?;
        let second = CharText::from_ids(
            &format!("{} [{cut}..]", self.name),
            Arc::clone(&self.vocab),
            self.ids[cut..].to_vec(),
            self.seq_len,
        )?;
        Ok((first.with_stride(self.stride)?, second.with_stride(self.stride)?))
    }

    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Distinct characters of the text, sorted; a character's id is its index here.
    pub fn vocab(&self) -> &[char] {
        &self.vocab
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The character ids of the whole text, shared (for [`TextStreams`](crate::TextStreams)).
    pub(crate) fn shared_ids(&self) -> Arc<Vec<u32>> {
        Arc::clone(&self.ids)
    }

    /// Number of characters in the text.
    pub fn num_chars(&self) -> usize {
        self.ids.len()
    }

    /// Character ids of `text`, or the first character that is not in the vocabulary.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, char> {
        text.chars().map(|c| self.vocab.binary_search(&c).map(|i| i as u32).map_err(|_| c)).collect()
    }

    /// The text of `ids` (ids outside the vocabulary become U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter().map(|&i| self.vocab.get(i as usize).copied().unwrap_or('\u{FFFD}')).collect()
    }
}

impl Dataset for CharText {
    type Sample = TextExample;

    fn len(&self) -> usize {
        (self.ids.len() - self.seq_len - 1) / self.stride + 1
    }

    fn get(&self, index: usize, _rng: &mut Generator) -> Result<TextExample, BoxError> {
        if index >= self.len() {
            return Err(format!("{}: index {index} out of range for {} windows", self.name, self.len()).into());
        }
        let start = index * self.stride;
        let input = self.ids[start..start + self.seq_len].to_vec();
        let target = self.ids[start + 1..start + self.seq_len + 1].to_vec();
        Ok(TextExample { input, target })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_targets_and_vocab() {
        let t = CharText::from_text("mem", "hello, wörld", 4).unwrap();
        assert_eq!(t.vocab(), &[' ', ',', 'd', 'e', 'h', 'l', 'o', 'r', 'w', 'ö']);
        assert_eq!(t.num_chars(), 12);
        assert_eq!(t.len(), 2); // windows at 0 and 4; the one at 8 has no next char for its last target
        let mut g = Generator::new(0);
        let s = t.get(1, &mut g).unwrap();
        assert_eq!(t.decode(&s.input), "o, w");
        assert_eq!(t.decode(&s.target), ", wö");
        assert!(t.get(2, &mut g).is_err());
        let t = t.with_stride(1).unwrap();
        assert_eq!(t.len(), 8);
        assert_eq!(t.encode("hé"), Err('é'));
        let (a, b) = CharText::from_text("mem", &"abcdefghij".repeat(3), 3).unwrap().split(0.5).unwrap();
        assert_eq!(a.vocab(), b.vocab());
        assert_eq!(a.num_chars() + b.num_chars(), 30);
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(
            CharText::from_text("mem", "abc", 3),
            Err(DataError::TextTooShort { chars: 3, needed: 4, .. })
        ));
        assert!(CharText::from_text("mem", "abcd", 0).is_err());
        let dir = std::env::temp_dir().join(format!("ferrite-data-utf8-{}", std::process::id()));
        std::fs::write(&dir, [b'o', b'k', 0xff, b'x']).unwrap();
        let e = CharText::from_file(&dir, 1).unwrap_err();
        std::fs::remove_file(&dir).ok();
        assert!(matches!(e, DataError::NotUtf8 { offset: 2, .. }), "{e}");
    }
}
