//! What an op expected of an argument's shape, as a value rather than a sentence: a caller can
//! match on it, and the message ("expected a 2-D tensor", "expected shape [*, 4, 5]") is written
//! in one place, so every op words the same requirement the same way.

use std::fmt;

/// The shape an op required of one argument; carried by [`TensorError::InvalidShape`].
///
/// [`TensorError::InvalidShape`]: crate::TensorError::InvalidShape
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpectedShape {
    /// Exactly this many dimensions.
    Rank(usize),
    /// At least this many dimensions.
    MinRank(usize),
    /// At most this many dimensions.
    MaxRank(usize),
    /// Exactly this shape.
    Exact(Vec<usize>),
    /// Any leading dimensions, then exactly these (`[*, 4, 5]`).
    Trailing(Vec<usize>),
    /// One dimension per name, sizes free (`[out_features, in_features]`).
    Named(&'static [&'static str]),
    /// Exactly this many elements, any shape.
    Numel(usize),
    /// Size `size` in dimension `dim`.
    SizeAt { dim: usize, size: usize },
    /// A multiple of `factor` in dimension `dim` (e.g. stacked gates).
    MultipleAt { dim: usize, factor: usize },
    /// The same rank as `shape`, and no dimension larger than `shape`'s, except `except_dim`.
    NoLargerThan { shape: Vec<usize>, except_dim: Option<usize> },
    /// Any one of these (`a 3-D tensor [C, H, W] or a 4-D tensor [N, C, H, W]`).
    AnyOf(Vec<ExpectedShape>),
    /// Any shape that broadcasts to this one (a per-element weight of a loss).
    BroadcastsTo(Vec<usize>),
}

impl fmt::Display for ExpectedShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpectedShape::Rank(n) => write!(f, "a {n}-D tensor"),
            ExpectedShape::MinRank(n) => write!(f, "a tensor of at least {n} dimension{}", plural(*n)),
            ExpectedShape::MaxRank(n) => write!(f, "a tensor of at most {n} dimension{}", plural(*n)),
            ExpectedShape::Exact(s) => write!(f, "shape {s:?}"),
            ExpectedShape::Trailing(s) => {
                write!(f, "shape [*")?;
                for d in s {
                    write!(f, ", {d}")?;
                }
                write!(f, "]")
            }
            ExpectedShape::Named(names) => write!(f, "a {}-D tensor [{}]", names.len(), names.join(", ")),
            ExpectedShape::Numel(n) => write!(f, "exactly {n} element{}", plural(*n)),
            ExpectedShape::SizeAt { dim, size } => write!(f, "size {size} in dimension {dim}"),
            ExpectedShape::MultipleAt { dim, factor } => write!(f, "a multiple of {factor} in dimension {dim}"),
            ExpectedShape::NoLargerThan { shape, except_dim: Some(d) } => {
                write!(f, "{}-D and no larger than {shape:?} in every dimension but {d}", shape.len())
            }
            ExpectedShape::NoLargerThan { shape, except_dim: None } => {
                write!(f, "{}-D and no larger than {shape:?} in every dimension", shape.len())
            }
            ExpectedShape::BroadcastsTo(s) => write!(f, "a shape that broadcasts to {s:?}"),
            ExpectedShape::AnyOf(options) => {
                for (i, o) in options.iter().enumerate() {
                    if i > 0 {
                        write!(f, " or ")?;
                    }
                    write!(f, "{o}")?;
                }
                Ok(())
            }
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

impl ExpectedShape {
    /// Whether `shape` satisfies the expectation (ops check with this, so the check and the
    /// message cannot disagree).
    pub fn admits(&self, shape: &[usize]) -> bool {
        match self {
            ExpectedShape::Rank(n) => shape.len() == *n,
            ExpectedShape::MinRank(n) => shape.len() >= *n,
            ExpectedShape::MaxRank(n) => shape.len() <= *n,
            ExpectedShape::Exact(s) => shape == s.as_slice(),
            ExpectedShape::Trailing(s) => shape.len() >= s.len() && shape[shape.len() - s.len()..] == s[..],
            ExpectedShape::Named(names) => shape.len() == names.len(),
            ExpectedShape::Numel(n) => shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) == Some(*n),
            ExpectedShape::SizeAt { dim, size } => shape.get(*dim) == Some(size),
            ExpectedShape::MultipleAt { dim, factor } => shape.get(*dim).is_some_and(|d| d.is_multiple_of(*factor)),
            ExpectedShape::NoLargerThan { shape: max, except_dim } => {
                shape.len() == max.len()
                    && shape.iter().zip(max).enumerate().all(|(i, (d, m))| Some(i) == *except_dim || d <= m)
            }
            ExpectedShape::AnyOf(options) => options.iter().any(|o| o.admits(shape)),
            ExpectedShape::BroadcastsTo(target) => {
                shape.len() <= target.len()
                    && shape.iter().rev().zip(target.iter().rev()).all(|(&d, &t)| d == t || d == 1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wording() {
        assert_eq!(ExpectedShape::Rank(2).to_string(), "a 2-D tensor");
        assert_eq!(ExpectedShape::MinRank(1).to_string(), "a tensor of at least 1 dimension");
        assert_eq!(ExpectedShape::MaxRank(2).to_string(), "a tensor of at most 2 dimensions");
        assert_eq!(ExpectedShape::Trailing(vec![4, 5]).to_string(), "shape [*, 4, 5]");
        assert_eq!(
            ExpectedShape::Named(&["out_features", "in_features"]).to_string(),
            "a 2-D tensor [out_features, in_features]"
        );
        assert_eq!(ExpectedShape::Numel(1).to_string(), "exactly 1 element");
        assert_eq!(
            ExpectedShape::NoLargerThan { shape: vec![3, 4], except_dim: Some(1) }.to_string(),
            "2-D and no larger than [3, 4] in every dimension but 1"
        );
    }

    #[test]
    fn admits_matches_the_wording() {
        assert!(ExpectedShape::Trailing(vec![4, 5]).admits(&[2, 4, 5]));
        assert!(ExpectedShape::Trailing(vec![4, 5]).admits(&[4, 5]));
        assert!(!ExpectedShape::Trailing(vec![4, 5]).admits(&[5]));
        assert!(!ExpectedShape::Trailing(vec![4, 5]).admits(&[2, 5, 4]));
        assert!(ExpectedShape::Numel(6).admits(&[2, 3]));
        assert!(!ExpectedShape::Numel(6).admits(&[usize::MAX, 2]));
        assert!(ExpectedShape::SizeAt { dim: 1, size: 3 }.admits(&[9, 3]));
        assert!(!ExpectedShape::SizeAt { dim: 2, size: 3 }.admits(&[9, 3]));
        assert!(ExpectedShape::MultipleAt { dim: 0, factor: 4 }.admits(&[8, 3]));
        assert!(!ExpectedShape::MultipleAt { dim: 0, factor: 4 }.admits(&[6, 3]));
        let nl = ExpectedShape::NoLargerThan { shape: vec![3, 4], except_dim: Some(1) };
        assert!(nl.admits(&[2, 9]));
        assert!(!nl.admits(&[4, 1]));
        assert!(!nl.admits(&[1]));
        assert!(ExpectedShape::MaxRank(1).admits(&[]));
        assert!(ExpectedShape::Named(&["a", "b"]).admits(&[0, 7]));
        let b = ExpectedShape::BroadcastsTo(vec![2, 3]);
        assert_eq!(b.to_string(), "a shape that broadcasts to [2, 3]");
        assert!(b.admits(&[3]) && b.admits(&[1, 3]) && b.admits(&[2, 1]) && b.admits(&[]));
        assert!(!b.admits(&[5]) && !b.admits(&[1, 2, 3]) && !b.admits(&[2]));
        let either = ExpectedShape::AnyOf(vec![ExpectedShape::Rank(3), ExpectedShape::Rank(4)]);
        assert!(either.admits(&[1, 2, 3]) && either.admits(&[1, 2, 3, 4]) && !either.admits(&[1, 2]));
        assert_eq!(
            ExpectedShape::AnyOf(vec![ExpectedShape::Named(&["N", "C"]), ExpectedShape::Named(&["N", "C", "L"])])
                .to_string(),
            "a 2-D tensor [N, C] or a 3-D tensor [N, C, L]"
        );
    }
}
