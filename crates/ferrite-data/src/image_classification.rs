//! Labelled images held in memory as bytes — digits, Fashion-MNIST, a user's image folder —
//! served as normalised `f32` pixels ready to become tensors, optionally augmented.

//!
//! Pixels stay `u8` in memory (Fashion-MNIST's 60,000 training images are 47 MB as bytes, 188 MB
//! as `f32`) and are converted per sample, in the workers.

use std::sync::Arc;

use ferrite_tensor::Generator;

use crate::augment::Augment;
use crate::batch_collate::ImageCollate;
use crate::dataset::Dataset;
use crate::error::{BoxError, DataError};
use crate::examples::ImageExample;
use crate::loader::{DataLoader, DataLoaderBuilder};
use crate::tensor_collate::Tensors;

/// Per-channel normalisation applied after scaling pixels to `[0, 1]`: `(x - mean) / std`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalization {
    pub mean: f32,
    pub std: f32,
}

impl Normalization {
    /// No normalisation: pixels in `[0, 1]`.
    pub const IDENTITY: Normalization = Normalization { mean: 0.0, std: 1.0 };
}

/// Which part of a dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    Train,
    Test,
}

/// An image-classification dataset in memory.
#[derive(Debug, Clone)]
pub struct ImageClassification {
    name: String,
    split: Split,
    images: Arc<Vec<u8>>,
    labels: Arc<Vec<u32>>,
    channels: usize,
    height: usize,
    width: usize,
    max_value: u8,
    class_names: Arc<Vec<String>>,
    normalization: Normalization,
    augment: Option<Augment>,
}

/// Everything an [`ImageClassification`] is made of, for datasets whose class names and channel
/// count are only known at run time (an image folder); see [`ImageClassification::from_parts`].
#[derive(Debug, Clone)]
pub struct ImageParts {
    pub name: String,
    pub split: Split,
    /// `n * channels * height * width` bytes, each image channel-major (`[c, h, w]`).
    pub images: Vec<u8>,
    /// `n` class indices below `class_names.len()`.
    pub labels: Vec<u32>,
    /// `[channels, height, width]` of one image.
    pub shape: [usize; 3],
    /// Largest raw pixel value (the value that scales to 1.0).
    pub max_value: u8,
    pub class_names: Vec<String>,
    pub normalization: Normalization,
}

impl ImageClassification {
    /// Build from raw single-channel pixels (`n * height * width` bytes, values
    /// `0..=max_value`) and labels (`n` values below `class_names.len()`). Inconsistent inputs
    /// are errors.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        split: Split,
        images: Vec<u8>,
        labels: Vec<u8>,
        height: usize,
        width: usize,
        max_value: u8,
        class_names: &'static [&'static str],
        normalization: Normalization,
    ) -> Result<ImageClassification, DataError> {
        ImageClassification::from_parts(ImageParts {
            name: name.to_string(),
            split,
            images,
            labels: labels.into_iter().map(u32::from).collect(),
            shape: [1, height, width],
            max_value,
            class_names: class_names.iter().map(|c| c.to_string()).collect(),
            normalization,
        })
    }

    /// Build from [`ImageParts`] (any number of channels, class names owned). Inconsistent
    /// inputs are errors.
    pub fn from_parts(parts: ImageParts) -> Result<ImageClassification, DataError> {
        let ImageParts { name, split, images, labels, shape, max_value, class_names, normalization } = parts;
        let [channels, height, width] = shape;
        let per_image = channels * height * width;
        if per_image == 0 || !images.len().is_multiple_of(per_image) {
            return Err(DataError::InvalidConfig(format!(
                "{name}: {} pixel bytes do not divide into {channels}x{height}x{width} images",
                images.len()
            )));
        }
        let n = images.len() / per_image;
        if n != labels.len() {
            return Err(DataError::LengthMismatch { dataset: name.to_string(), images: n, labels: labels.len() });
        }
        if let Some((index, &label)) = labels.iter().enumerate().find(|(_, l)| **l as usize >= class_names.len()) {
            return Err(DataError::BadLabel {
                dataset: name.to_string(),
                index,
                label: label.into(),
                num_classes: class_names.len(),
            });
        }
        if max_value == 0 || normalization.std.is_nan() || normalization.std <= 0.0 {
            return Err(DataError::InvalidConfig(format!(
                "{name}: max pixel value and normalisation std must be positive"
            )));
        }
        Ok(ImageClassification {
            name,
            split,
            images: Arc::new(images),
            labels: Arc::new(labels),
            channels,
            height,
            width,
            max_value,
            class_names: Arc::new(class_names),
            normalization,
            augment: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn split(&self) -> Split {
        self.split
    }

    /// `[channels, height, width]` of one sample.
    pub fn sample_shape(&self) -> [usize; 3] {
        [self.channels, self.height, self.width]
    }

    /// Values per sample (`channels * height * width`), the input size of an MLP.
    pub fn num_features(&self) -> usize {
        self.channels * self.height * self.width
    }

    pub fn num_classes(&self) -> usize {
        self.class_names.len()
    }

    /// Class names; a label is an index into this list.
    pub fn class_names(&self) -> &[String] {
        &self.class_names
    }

    /// Largest raw pixel value (16 for digits, 255 for Fashion-MNIST).
    pub fn max_value(&self) -> u8 {
        self.max_value
    }

    pub fn normalization(&self) -> Normalization {
        self.normalization
    }

    /// The same data with another normalisation (e.g. [`Normalization::IDENTITY`]).
    pub fn with_normalization(mut self, normalization: Normalization) -> ImageClassification {
        self.normalization = normalization;
        self
    }

    /// Raw pixel bytes of image `index`, if it exists.
    pub fn raw_image(&self, index: usize) -> Option<&[u8]> {
        let n = self.num_features();
        self.images.get(index * n..(index + 1) * n)
    }

    pub fn label(&self, index: usize) -> Option<usize> {
        self.labels.get(index).map(|&l| l as usize)
    }

    /// Labels of all samples, in order.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }

    /// The samples at `indices`, in that order, as a dataset of `split` (how a held-out share is
    /// cut out of one folder). An index out of range is an error.
    pub fn select(&self, indices: &[usize], split: Split) -> Result<ImageClassification, DataError> {
        let n = self.num_features();
        let len = self.labels.len();
        let mut images = Vec::with_capacity(indices.len() * n);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            if i >= len {
                return Err(DataError::IndexOutOfRange { index: i, len });
            }
            images.extend_from_slice(&self.images[i * n..(i + 1) * n]);
            labels.push(self.labels[i]);
        }
        let mut out = self.clone();
        out.split = split;
        out.images = Arc::new(images);
        out.labels = Arc::new(labels);
        Ok(out)
    }

    /// The same data, each sample randomly cropped and flipped by `augment` when it is loaded
    /// (drawn from the sample's own generator: reproducible for any number of workers).
    pub fn with_augment(mut self, augment: Augment) -> ImageClassification {
        self.augment = Some(augment);
        self
    }

    /// The augmentation `get` applies, if any.
    pub fn augment(&self) -> Option<Augment> {
        self.augment
    }

    /// Only the first `n` samples (or all, if fewer) — quick runs on a slice of the data.
    pub fn take(&self, n: usize) -> ImageClassification {
        let n = n.min(self.labels.len());
        let mut out = self.clone();
        out.images = Arc::new(self.images[..n * self.num_features()].to_vec());
        out.labels = Arc::new(self.labels[..n].to_vec());
        out
    }

    /// A loader builder over this dataset that collates into contiguous [`ImageBatch`]es
    /// (set workers, shuffle and seed on the returned builder).
    ///
    /// [`ImageBatch`]: crate::batch_collate::ImageBatch
    pub fn loader(self, batch_size: usize) -> DataLoaderBuilder<ImageClassification, ImageCollate> {
        let shape = self.sample_shape();
        DataLoader::builder(self).batch_size(batch_size).collate(ImageCollate::new(shape))
    }

    /// A loader builder over this dataset whose batches are tensors: `(f32 [n, c, h, w],
    /// i64 [n])` on `cpu` — add `.stage_to(device)` to receive them on the training device.
    pub fn tensor_loader(self, batch_size: usize) -> DataLoaderBuilder<ImageClassification, Tensors<ImageCollate>> {
        let shape = self.sample_shape();
        DataLoader::builder(self).batch_size(batch_size).collate(Tensors(ImageCollate::new(shape)))
    }

    /// Mean and standard deviation of all pixels scaled to `[0, 1]` (how the published
    /// normalisation constants are computed, over the training split).
    pub fn pixel_statistics(&self) -> Normalization {
        let scale = 1.0 / f64::from(self.max_value);
        let n = self.images.len() as f64;
        let (sum, sum_sq) = self.images.iter().fold((0.0f64, 0.0f64), |(s, q), &p| {
            let x = f64::from(p) * scale;
            (s + x, q + x * x)
        });
        let mean = sum / n;
        let var = (sum_sq / n - mean * mean).max(0.0);
        Normalization { mean: mean as f32, std: var.sqrt() as f32 }
    }
}

impl Dataset for ImageClassification {
    type Sample = ImageExample;

    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize, rng: &mut Generator) -> Result<ImageExample, BoxError> {
        let raw = self
            .raw_image(index)
            .ok_or_else(|| format!("{}: index {index} out of range for {} samples", self.name, self.labels.len()))?;
        let Normalization { mean, std } = self.normalization;
        let scale = 1.0 / (f32::from(self.max_value) * std);
        let shift = mean / std;
        let normalise = |p: &u8| f32::from(*p) * scale - shift;
        let pixels = match &self.augment {
            Some(a) => a.apply(raw, self.sample_shape(), rng).iter().map(normalise).collect(),
            None => raw.iter().map(normalise).collect(),
        };
        Ok(ImageExample { pixels, label: self.labels[index] as usize })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &[&str] = &["a", "b"];

    #[test]
    fn normalises_and_validates() {
        let d = ImageClassification::new(
            "t",
            Split::Train,
            vec![0, 4, 2, 2],
            vec![1, 0],
            1,
            2,
            4,
            TWO,
            Normalization { mean: 0.5, std: 0.5 },
        )
        .unwrap();
        let mut g = Generator::new(0);
        assert_eq!(d.get(0, &mut g).unwrap(), ImageExample { pixels: vec![-1.0, 1.0], label: 1 });
        assert_eq!(d.get(1, &mut g).unwrap().pixels, vec![0.0, 0.0]);
        assert!(d.get(2, &mut g).is_err());
        let s = d.pixel_statistics();
        assert!((s.mean - 0.5).abs() < 1e-6 && (s.std - 0.125f32.sqrt()).abs() < 1e-6, "{s:?}");
        assert_eq!(d.take(1).len(), 1);
        assert!(matches!(
            ImageClassification::new("t", Split::Train, vec![0; 4], vec![0], 1, 2, 4, TWO, Normalization::IDENTITY),
            Err(DataError::LengthMismatch { images: 2, labels: 1, .. })
        ));
        assert!(matches!(
            ImageClassification::new("t", Split::Train, vec![0; 2], vec![2], 1, 2, 4, TWO, Normalization::IDENTITY),
            Err(DataError::BadLabel { label: 2, .. })
        ));
        assert!(
            ImageClassification::new("t", Split::Train, vec![0; 3], vec![0], 1, 2, 4, TWO, Normalization::IDENTITY)
                .is_err()
        );
    }
}
