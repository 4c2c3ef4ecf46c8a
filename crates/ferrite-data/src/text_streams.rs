//! A text as parallel streams of consecutive chunks: the input of truncated backpropagation
//! through time.
//!
//! Why not [`CharText`]'s shuffled windows: a recurrent language model trained with truncated
//! BPTT carries its hidden state from one chunk to the next, so chunk `c + 1` of a batch row must
//! continue the text exactly where chunk `c` of the same row ended. The text is cut into
//! `streams` equal parts (PyTorch's `batchify` in its word-language-model example); sample
//! `c * streams + b` is chunk `c` of stream `b`, so a loader with batch size `streams` and no
//! shuffling yields, as batch `c`, chunk `c` of every stream — row `b` always stream `b`. Models
//! without state (a transformer) read the same batches and simply carry nothing.

use std::sync::Arc;

use ferrite_tensor::Generator;

use crate::batch_collate::TextCollate;
use crate::char_text::CharText;
use crate::dataset::Dataset;
use crate::error::{BoxError, DataError};
use crate::examples::TextExample;
use crate::loader::{DataLoader, DataLoaderBuilder};
use crate::tensor_collate::Tensors;

/// `streams` rows of consecutive `seq_len`-character chunks over a text (see the module docs).
#[derive(Debug, Clone)]
pub struct TextStreams {
    ids: Arc<Vec<u32>>,
    streams: usize,
    seq_len: usize,
    /// Characters per stream (inputs), a whole number of chunks.
    stream_len: usize,
}

impl TextStreams {
    /// Cuts `text` into `streams` streams of chunks of `seq_len` characters; the text's tail that
    /// does not fill a chunk in every stream is dropped.
    pub fn new(text: &CharText, streams: usize, seq_len: usize) -> Result<TextStreams, DataError> {
        if streams == 0 || seq_len == 0 {
            return Err(DataError::InvalidConfig(format!(
                "text streams need at least one stream and one character per chunk, got {streams} streams of {seq_len}"
            )));
        }
        let ids = text.shared_ids();
        // Every input needs its next character as target, hence the `- 1`.
        let per_stream = ids.len().saturating_sub(1) / streams;
        let chunks = per_stream / seq_len;
        if chunks == 0 {
            return Err(DataError::InvalidConfig(format!(
                "the text has {} characters: too short for {streams} streams of at least one {seq_len}-character chunk (needs {})",
                ids.len(),
                streams * seq_len + 1
            )));
        }
        Ok(TextStreams { ids, streams, seq_len, stream_len: chunks * seq_len })
    }

    pub fn streams(&self) -> usize {
        self.streams
    }

    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Chunks per stream: the batches of one pass over the text.
    pub fn chunks(&self) -> usize {
        self.stream_len / self.seq_len
    }

    /// A loader over the streams whose batch `c` is chunk `c` of every stream, as tensors
    /// (`i64 [streams, seq_len]` inputs and targets) on `cpu`; add `.stage_to(device)` to receive
    /// them on the training device. Keep the default sequential order: shuffling would break the
    /// continuity the streams exist for.
    pub fn tensor_loader(self) -> DataLoaderBuilder<TextStreams, Tensors<TextCollate>> {
        let streams = self.streams;
        DataLoader::builder(self).batch_size(streams).collate(Tensors(TextCollate))
    }
}

impl Dataset for TextStreams {
    type Sample = TextExample;

    fn len(&self) -> usize {
        self.streams * self.chunks()
    }

    fn get(&self, index: usize, _rng: &mut Generator) -> Result<TextExample, BoxError> {
        if index >= self.len() {
            return Err(format!("index {index} out of range for {} chunks", self.len()).into());
        }
        let (chunk, stream) = (index / self.streams, index % self.streams);
        let start = stream * self.stream_len + chunk * self.seq_len;
        Ok(TextExample {
            input: self.ids[start..start + self.seq_len].to_vec(),
            target: self.ids[start + 1..start + self.seq_len + 1].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_continue_their_stream_from_batch_to_batch() {
        let text = CharText::from_text("mem", "abcdefghijklmnopqrstuvwxyz", 1).unwrap();
        // 25 inputs over 2 streams: 12 per stream, 4 chunks of 3.
        let s = TextStreams::new(&text, 2, 3).unwrap();
        assert_eq!((s.chunks(), s.len()), (4, 8));
        let mut g = Generator::new(0);
        let mut row = |i| {
            let e = s.get(i, &mut g).unwrap();
            (text.decode(&e.input), text.decode(&e.target))
        };
        assert_eq!(row(0), ("abc".into(), "bcd".into()));
        assert_eq!(row(1), ("mno".into(), "nop".into()));
        assert_eq!(row(2), ("def".into(), "efg".into()));
        assert_eq!(row(7), ("vwx".into(), "wxy".into()));
        assert!(s.get(8, &mut g).is_err());
    }

    #[test]
    fn a_text_too_short_for_the_streams_is_an_error() {
        let text = CharText::from_text("mem", "abcdef", 1).unwrap();
        let e = TextStreams::new(&text, 2, 3).unwrap_err().to_string();
        assert!(e.contains("too short") && e.contains("needs 7"), "{e}");
        assert!(TextStreams::new(&text, 0, 3).is_err());
    }
}
