//! The built-in datasets by name — what `ferrite train --dataset digits|fashion-mnist` resolves.

use std::fmt;
use std::str::FromStr;

use crate::error::DataError;
use crate::image_classification::{ImageClassification, Normalization, Split};
use crate::{digits, fashion_mnist};

/// A built-in image-classification dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DatasetKind {
    /// scikit-learn's 8×8 digits, embedded in the crate (always available).
    Digits,
    /// Fashion-MNIST from Debian's `dataset-fashion-mnist` package.
    FashionMnist,
}

impl DatasetKind {
    pub const ALL: [DatasetKind; 2] = [DatasetKind::Digits, DatasetKind::FashionMnist];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DatasetKind::Digits => "digits",
            DatasetKind::FashionMnist => "fashion-mnist",
        }
    }

    /// Normalisation constants of the training split (pixels scaled to `[0, 1]` first).
    pub fn normalization(self) -> Normalization {
        match self {
            DatasetKind::Digits => digits::NORMALIZATION,
            DatasetKind::FashionMnist => fashion_mnist::NORMALIZATION,
        }
    }

    /// Load one split.
    pub fn load(self, split: Split) -> Result<ImageClassification, DataError> {
        match self {
            DatasetKind::Digits => digits::load(split),
            DatasetKind::FashionMnist => fashion_mnist::load(split),
        }
    }
}

impl fmt::Display for DatasetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DatasetKind {
    type Err = DataError;

    fn from_str(s: &str) -> Result<DatasetKind, DataError> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "digits" => Ok(DatasetKind::Digits),
            "fashion-mnist" | "fashionmnist" => Ok(DatasetKind::FashionMnist),
            _ => Err(DataError::UnknownDataset(s.to_string())),
        }
    }
}

/// Train and test splits of a built-in dataset.
#[derive(Debug, Clone)]
pub struct Splits {
    pub train: ImageClassification,
    pub test: ImageClassification,
}

/// Both splits of `kind`. Samples are [`ImageExample`](crate::examples::ImageExample)s
/// with normalised pixels; `train.num_features()` and `train.num_classes()` size a classifier.
pub fn builtin_dataset(kind: DatasetKind) -> Result<Splits, DataError> {
    Ok(Splits { train: kind.load(Split::Train)?, test: kind.load(Split::Test)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for k in DatasetKind::ALL {
            assert_eq!(k.name().parse::<DatasetKind>().unwrap(), k);
        }
        assert_eq!("Fashion_MNIST".parse::<DatasetKind>().unwrap(), DatasetKind::FashionMnist);
        let e = "cifar".parse::<DatasetKind>().unwrap_err();
        assert!(e.to_string().contains("digits, fashion-mnist"), "{e}");
    }

    #[test]
    fn digits_splits_load() {
        let s = builtin_dataset(DatasetKind::Digits).unwrap();
        assert_eq!((s.train.num_features(), s.train.num_classes()), (64, 10));
        assert_eq!(s.train.len() + s.test.len(), 1797);
        let mut loader = s.test.loader(100).num_workers(2).build().unwrap();
        let shapes: Vec<[usize; 4]> = loader.epoch().map(|b| b.unwrap().shape()).collect();
        assert_eq!(shapes, [[100, 1, 8, 8], [100, 1, 8, 8], [100, 1, 8, 8], [55, 1, 8, 8]]);
    }

    use crate::Dataset;
}
