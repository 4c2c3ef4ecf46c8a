//! Fashion-MNIST (Zalando, MIT licence) read from the IDX files that Debian's
//! `dataset-fashion-mnist` package installs under `/usr/share/datasets/fashion-mnist/`:
//! 60,000 training and 10,000 test images of 28×28 greyscale clothing items in 10 classes.
//!
//! The directory can be overridden with `FERRITE_FASHION_MNIST_DIR`; files may be gzipped (as
//! Debian ships them) or not. When they are missing the error names the package to install.

use std::path::{Path, PathBuf};

use crate::error::DataError;
use crate::idx::read_idx;
use crate::image_classification::{ImageClassification, Normalization, Split};

/// Where Debian's `dataset-fashion-mnist` puts the files.
pub const DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";
/// Environment variable naming another directory holding the four IDX files.
pub const DIR_ENV_VAR: &str = "FERRITE_FASHION_MNIST_DIR";
/// The Debian package that provides the files.
pub const DEBIAN_PACKAGE: &str = "dataset-fashion-mnist";

pub const CLASS_NAMES: &[&str] =
    &["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"];
/// Mean and standard deviation of the training pixels scaled to `[0, 1]` — the constants
/// PyTorch examples use (0.2860, 0.3530); checked against the data by a test.
pub const NORMALIZATION: Normalization = Normalization { mean: 0.2860, std: 0.3530 };

/// The directory the loader reads: `$FERRITE_FASHION_MNIST_DIR` if set, else [`DEFAULT_DIR`].
pub fn data_dir() -> PathBuf {
    std::env::var_os(DIR_ENV_VAR).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}

/// True if the training images can be found (for tests that skip without the package).
pub fn is_available() -> bool {
    find(&data_dir(), "train-images-idx3-ubyte").is_ok()
}

/// Load one split from [`data_dir`].
pub fn load(split: Split) -> Result<ImageClassification, DataError> {
    load_from(&data_dir(), split)
}

/// Load one split from `dir`.
pub fn load_from(dir: &Path, split: Split) -> Result<ImageClassification, DataError> {
    let prefix = match split {
        Split::Train => "train",
        Split::Test => "t10k",
    };
    let images_path = find(dir, &format!("{prefix}-images-idx3-ubyte"))?;
    let labels_path = find(dir, &format!("{prefix}-labels-idx1-ubyte"))?;
    let images = read_idx(&images_path)?;
    let labels = read_idx(&labels_path)?;
    let [n, h, w] = images.dims[..] else {
        return Err(DataError::InvalidIdx {
            path: images_path,
            reason: format!("image file has dimensions {:?}, expected [n, rows, cols]", images.dims),
        });
    };
    if labels.dims.len() != 1 {
        return Err(DataError::InvalidIdx {
            path: labels_path,
            reason: format!("label file has dimensions {:?}, expected [n]", labels.dims),
        });
    }
    if labels.dims[0] != n {
        return Err(DataError::LengthMismatch {
            dataset: format!("fashion-mnist ({prefix})"),
            images: n,
            labels: labels.dims[0],
        });
    }
    ImageClassification::new("fashion-mnist", split, images.data, labels.data, h, w, 255, CLASS_NAMES, NORMALIZATION)
}

/// `dir/stem.gz` or `dir/stem`, or the error that says which package provides them.
fn find(dir: &Path, stem: &str) -> Result<PathBuf, DataError> {
    let gz = dir.join(format!("{stem}.gz"));
    if gz.is_file() {
        return Ok(gz);
    }
    let plain = dir.join(stem);
    if plain.is_file() {
        return Ok(plain);
    }
    Err(DataError::DatasetMissing {
        dataset: "Fashion-MNIST",
        path: gz,
        package: DEBIAN_PACKAGE,
        env_var: Some(DIR_ENV_VAR),
    })
}
