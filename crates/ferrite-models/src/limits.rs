//! The limits on the numbers a model description (`config.json`) may hold, checked before
//! anything is sized from them.
//!
//! Why: a `config.json` is user input. Without limits, `num_hidden_layers: 1073741824` sized a
//! host `Vec` of blocks and aborted the process, and a width of 2^40 overflowed the parameter
//! count (issue 33). Every size read from a config is checked against these limits, and the
//! parameter count is computed with checked arithmetic, before a single structure is built:
//!
//! | what | limit | why this figure |
//! |---|---|---|
//! | layers of one stack ([`MAX_LAYERS`]) | 10,000 | the deepest published models have ~100–200 layers |
//! | any one size: width, vocabulary, positions, heads, … ([`MAX_SIZE`]) | 2^31 | far above any real model; keeps every product of two sizes inside `u64` |
//! | parameters ([`MAX_PARAMETERS`]) | 10^13 | ten trillion, ~5× the largest models announced; 40 TB of f32 weights |
//!
//! A figure beyond a limit is [`ModelError::ConfigLimit`](crate::ModelError::ConfigLimit),
//! naming the key and the figure.
use std::ops::{Add, Mul};

use crate::ModelError;

/// Most layers one stack may have.
pub const MAX_LAYERS: u64 = 10_000;
/// Largest single size (width, vocabulary, positions, heads, head width, feed-forward width).
pub const MAX_SIZE: u64 = 1 << 31;
/// Most parameters a model may have.
pub const MAX_PARAMETERS: u64 = 10_000_000_000_000;

/// A count computed with checked arithmetic: `None` once anything overflowed `u64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Checked(pub(crate) Option<u64>);

/// `x` as a [`Checked`] count.
pub(crate) fn n(x: usize) -> Checked {
    Checked(u64::try_from(x).ok())
}

impl Add for Checked {
    type Output = Checked;
    fn add(self, o: Checked) -> Checked {
        Checked(self.0.zip(o.0).and_then(|(a, b)| a.checked_add(b)))
    }
}

impl Mul for Checked {
    type Output = Checked;
    fn mul(self, o: Checked) -> Checked {
        Checked(self.0.zip(o.0).and_then(|(a, b)| a.checked_mul(b)))
    }
}

/// The error for a parameter count beyond [`MAX_PARAMETERS`] (or beyond `u64`).
pub(crate) fn check_parameters(origin: &str, count: Option<u64>, keys: &str) -> Result<u64, ModelError> {
    match count {
        Some(c) if c <= MAX_PARAMETERS => Ok(c),
        other => Err(ModelError::ConfigLimit {
            path: origin.to_string(),
            key: keys.to_string(),
            figure: match other {
                Some(c) => format!("{c} parameters"),
                None => "more parameters than 2^64".to_string(),
            },
            limit: format!("{MAX_PARAMETERS} parameters (10^13)"),
        }),
    }
}

/// The error for one size beyond its limit.
pub(crate) fn check_size(origin: &str, key: &str, value: u64, limit: u64) -> Result<usize, ModelError> {
    match usize::try_from(value) {
        Ok(v) if value <= limit => Ok(v),
        _ => Err(ModelError::ConfigLimit {
            path: origin.to_string(),
            key: key.to_string(),
            figure: value.to_string(),
            limit: if limit == MAX_LAYERS { format!("{limit} layers") } else { format!("{limit} (2^31)") },
        }),
    }
}

/// The limit that applies to `key`: [`MAX_LAYERS`] for layer counts, [`MAX_SIZE`] otherwise.
pub(crate) fn limit_of(key: &str) -> u64 {
    if key.contains("layer") && !key.contains("norm") && !key.contains("epsilon") { MAX_LAYERS } else { MAX_SIZE }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_counts_overflow_to_none() {
        assert_eq!((n(3) * n(4) + n(1)).0, Some(13));
        assert_eq!((n(usize::MAX) * n(2)).0, None);
        assert_eq!((n(usize::MAX) + n(1)).0, None);
        assert_eq!((Checked(None) * n(0)).0, None);
    }

    #[test]
    fn limits_name_key_and_figure() {
        let e = check_size("c.json", "num_hidden_layers", 1 << 30, MAX_LAYERS).unwrap_err().to_string();
        assert!(e.contains("num_hidden_layers") && e.contains("1073741824") && e.contains("10000"), "{e}");
        let e = check_parameters("c.json", None, "hidden_size").unwrap_err().to_string();
        assert!(e.contains("2^64") && e.contains("hidden_size"), "{e}");
        assert_eq!(limit_of("n_layer"), MAX_LAYERS);
        assert_eq!(limit_of("num_decoder_layers"), MAX_LAYERS);
        assert_eq!(limit_of("hidden_size"), MAX_SIZE);
    }
}
