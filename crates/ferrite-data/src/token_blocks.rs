//! Token ids cut into consecutive, non-overlapping blocks of `n` tokens, the remainder dropped:
//! the samples of causal-LM fine-tuning and of `ferrite eval` (transformers' `group_texts`).
//!
//! A block of `n` tokens predicts its last `n − 1` from the ones before, which is what
//! `model(block, labels=block).loss` averages in transformers. A sample is therefore the block
//! as input *and* as labels, as in transformers, and the loss shifts them
//! (`logits[:, :-1]` against `labels[:, 1:]`). Feeding only the first `n − 1` tokens
//! would give the same loss for most models, but not for those whose positions depend on the
//! sequence length (dynamic rotary scaling), so the whole block goes in.
use std::sync::Arc;

use ferrite_tensor::Generator;

use crate::batch_collate::TextCollate;
use crate::dataset::Dataset;
use crate::error::{BoxError, DataError};
use crate::examples::TextExample;
use crate::loader::{DataLoader, DataLoaderBuilder};
use crate::tensor_collate::Tensors;

/// Blocks of `block_len` consecutive token ids (see the module docs).
#[derive(Debug, Clone)]
pub struct TokenBlocks {
    ids: Arc<Vec<u32>>,
    block_len: usize,
    blocks: usize,
}

impl TokenBlocks {
    /// The blocks of `ids`; `what` names the text in the error when there is not one block
    /// (blocks need at least 2 tokens: one to read, one to predict).
    pub fn new(ids: Vec<u32>, block_len: usize, what: &str) -> Result<TokenBlocks, DataError> {
        if block_len < 2 {
            return Err(DataError::InvalidConfig(format!(
                "a block of {block_len} token(s) predicts nothing; blocks need at least 2 tokens"
            )));
        }
        let blocks = ids.len() / block_len;
        if blocks == 0 {
            return Err(DataError::TooFewTokens { what: what.to_string(), tokens: ids.len(), needed: block_len });
        }
        Ok(TokenBlocks { ids: Arc::new(ids), block_len, blocks })
    }

    /// Tokens per block.
    pub fn block_len(&self) -> usize {
        self.block_len
    }

    /// Every token id (the dropped remainder included).
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Positions predicted per pass over the blocks: `blocks × (block_len − 1)`.
    pub fn predicted_tokens(&self) -> usize {
        self.blocks * (self.block_len - 1)
    }

    /// The first `fraction` of the blocks (rounded, at least one if there are two) and the rest.
    pub fn split(&self, fraction: f64) -> (TokenBlocks, Option<TokenBlocks>) {
        let first = ((self.blocks as f64 * fraction).round() as usize).clamp(1, self.blocks);
        let first = if first == self.blocks && self.blocks > 1 { self.blocks - 1 } else { first };
        let head = TokenBlocks { ids: Arc::new(self.ids[..first * self.block_len].to_vec()), blocks: first, ..*self };
        let rest = (first < self.blocks).then(|| TokenBlocks {
            ids: Arc::new(self.ids[first * self.block_len..self.blocks * self.block_len].to_vec()),
            blocks: self.blocks - first,
            block_len: self.block_len,
        });
        (head, rest)
    }

    /// A loader of `i64 [batch, block_len]` input and label tensors on `cpu` (shuffle,
    /// batch size and staging are the builder's).
    pub fn tensor_loader(self) -> DataLoaderBuilder<TokenBlocks, Tensors<TextCollate>> {
        DataLoader::builder(self).collate(Tensors(TextCollate))
    }
}

impl Dataset for TokenBlocks {
    type Sample = TextExample;

    fn len(&self) -> usize {
        self.blocks
    }

    fn get(&self, index: usize, _rng: &mut Generator) -> Result<TextExample, BoxError> {
        if index >= self.blocks {
            return Err(format!("block {index} out of range for {} blocks", self.blocks).into());
        }
        let start = index * self.block_len;
        let block = &self.ids[start..start + self.block_len];
        Ok(TextExample { input: block.to_vec(), target: block.to_vec() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_blocks_remainder_dropped() {
        let b = TokenBlocks::new((0..11).collect(), 4, "t").unwrap();
        assert_eq!((b.len(), b.predicted_tokens()), (2, 6));
        let mut g = Generator::new(0);
        let e = b.get(1, &mut g).unwrap();
        assert_eq!((e.input, e.target), (vec![4, 5, 6, 7], vec![4, 5, 6, 7]));
        assert!(b.get(2, &mut g).is_err());
        let (train, val) = b.split(0.9);
        assert_eq!((train.len(), val.map(|v| v.len())), (1, Some(1)));
        let e = TokenBlocks::new(vec![1, 2], 4, "the text").unwrap_err().to_string();
        assert!(e.contains("the text has 2 tokens") && e.contains("block of 4"), "{e}");
        assert!(TokenBlocks::new(vec![1, 2], 1, "t").is_err());
    }
}
