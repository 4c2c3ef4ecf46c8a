//! T5's key/value cache for generation (transformers' `EncoderDecoderCache`): per decoder layer,
//! the self-attention's keys and values, which grow by one position per new token, and the
//! cross-attention's, projected from the encoder's output once (at the first step) and read at
//! every later one.
//!
//! Why its own file: the decoder-only [`crate::KvCache`] holds one kind of entry and advances by
//! the tokens it is given; an encoder-decoder's cache has two kinds that behave differently (one
//! grows, one is fixed by the encoder's output), and T5's relative position bias must be read at
//! the new positions: a cached step's bias is the row of the query at position `len` against
//! every key position `0..=len` (transformers' `compute_bias(..., past_seen_tokens)`), the last
//! row of the full decoder's. The model code that fills it lives in `t5.rs`
//! ([`crate::T5Model::decode_with_cache`], `T5Block::run_cached`); this file holds the cache, its
//! sizes and the checks that it fits the call it is given to (it knows nothing of the model).
use ferrite_tensor::Tensor;

/// One decoder layer's part of a [`T5Cache`].
#[derive(Debug, Clone, Default)]
pub(crate) struct T5LayerCache {
    /// Self-attention keys and values, `[batch, heads, positions, d_kv]` each.
    pub(crate) self_kv: Option<(Tensor, Tensor)>,
    /// Cross-attention keys and values, `[batch, heads, encoder positions, d_kv]` each.
    pub(crate) cross_kv: Option<(Tensor, Tensor)>,
    /// Times `cross_kv` was projected from the encoder's output (1 once filled).
    pub(crate) cross_projections: usize,
}

/// The keys and values a [`T5Model`]'s decoder has computed so far: decoding token `t + 1` reads
/// them instead of rerunning the decoder over positions `0..=t`, and the cross-attention never
/// projects the encoder's output again. Made by [`crate::T5Model::new_cache`], filled by
/// [`crate::T5Model::decode_with_cache`]. After an error, make a new one.
#[derive(Debug, Clone)]
pub struct T5Cache {
    pub(crate) layers: Vec<T5LayerCache>,
    pub(crate) len: usize,
}

impl T5Cache {
    /// Decoder positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the self-attention keys and values (grows with every new position).
    pub fn self_attention_bytes(&self) -> usize {
        self.layers.iter().filter_map(|l| l.self_kv.as_ref()).map(|(k, v)| k.nbytes() + v.nbytes()).sum()
    }

    /// Bytes of the cross-attention keys and values (fixed by the encoder's output).
    pub fn cross_attention_bytes(&self) -> usize {
        self.layers.iter().filter_map(|l| l.cross_kv.as_ref()).map(|(k, v)| k.nbytes() + v.nbytes()).sum()
    }

    /// Bytes held by every cached key and value, self- and cross-attention.
    pub fn nbytes(&self) -> usize {
        self.self_attention_bytes() + self.cross_attention_bytes()
    }

    /// How many times a layer projected the encoder's output to cross-attention keys and values,
    /// summed over the layers: the number of decoder layers once the first step has run, however
    /// many steps follow.
    pub fn cross_projections(&self) -> usize {
        self.layers.iter().map(|l| l.cross_projections).sum()
    }
}

impl T5Cache {
    /// An empty cache for a decoder of `layers` blocks.
    pub(crate) fn for_layers(layers: usize) -> T5Cache {
        T5Cache { layers: vec![T5LayerCache::default(); layers], len: 0 }
    }

    /// That this cache fits a decoder of `layers` blocks given `decoder_ids` `[b, t]` and the
    /// encoder's output `encoded` `[b, s, d_model]`: the batch it was filled with, and the
    /// encoder output its cross-attention was projected from.
    pub(crate) fn check_use(&self, layers: usize, decoder_ids: &Tensor, encoded: &Tensor) -> ferrite_nn::Result<()> {
        let bad =
            |detail: String| Err(ferrite_nn::NnError::InvalidConfig { layer: "T5ForConditionalGeneration", detail });
        if self.layers.len() != layers {
            return bad(format!(
                "a T5 cache of {} decoder layers given to a model of {layers}; make it with this model's `new_cache()`",
                self.layers.len()
            ));
        }
        if decoder_ids.rank() != 2 || encoded.rank() != 3 {
            return bad(format!(
                "decoder ids must be [batch, seq] and the encoder's output [batch, seq, d_model], got {:?} and {:?}",
                decoder_ids.shape(),
                encoded.shape()
            ));
        }
        let Some(first) = self.layers.first() else { return Ok(()) };
        let batch = decoder_ids.shape()[0];
        let cached = |kv: &Option<(Tensor, Tensor)>| kv.as_ref().map(|(k, _)| (k.shape()[0], k.shape()[2]));
        if let Some((b, _)) = cached(&first.self_kv)
            && b != batch
        {
            return bad(format!(
                "a batch of {batch} given to a cache filled with a batch of {b}; use one cache per batch"
            ));
        }
        let (eb, es) = (encoded.shape()[0], encoded.shape()[1]);
        if let Some((b, s)) = cached(&first.cross_kv)
            && (b, s) != (eb, es)
        {
            return bad(format!(
                "the encoder's output is [{eb}, {es}, ..] but the cache's cross-attention was made from [{b}, {s}, ..]; pass the same encoder output at every step"
            ));
        }
        Ok(())
    }
}
