//! Rows of numeric features with a class each — tabular data for the MLP — served as
//! [`ImageExample`]s (a row is a one-pixel-high "image" of its features) so the image models'
//! collate, loaders and training loop take them unchanged.
//!
//! Why standardise here, per sample: the mean and standard deviation come from the training
//! split and travel with both splits, so evaluation uses exactly the training statistics (a
//! validation split standardised with its own would be a quiet leak), and the same numbers are
//! what a user saves next to the weights to prepare new rows.

use std::sync::Arc;

use ferrite_tensor::Generator;

use crate::batch_collate::ImageCollate;
use crate::dataset::Dataset;
use crate::error::{BoxError, DataError};
use crate::examples::ImageExample;
use crate::loader::{DataLoader, DataLoaderBuilder};
use crate::tensor_collate::Tensors;

/// Per-feature `(x - mean) / std`.
#[derive(Debug, Clone, PartialEq)]
pub struct Standardization {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

impl Standardization {
    /// Mean and (population) standard deviation of each of `num_features` columns of the
    /// row-major `rows`; a constant column gets std 1 (it is only centred).
    pub fn fit(rows: &[f32], num_features: usize) -> Standardization {
        let n = rows.len().checked_div(num_features).unwrap_or(0);
        let mut sum = vec![0.0f64; num_features];
        let mut sum_sq = vec![0.0f64; num_features];
        for row in rows.chunks_exact(num_features.max(1)) {
            for (j, &x) in row.iter().enumerate() {
                sum[j] += f64::from(x);
                sum_sq[j] += f64::from(x) * f64::from(x);
            }
        }
        let n = n.max(1) as f64;
        let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
        let std = sum_sq
            .iter()
            .zip(&mean)
            .map(|(q, m)| {
                let s = (q / n - m * m).max(0.0).sqrt();
                if s > 1e-12 { s as f32 } else { 1.0 }
            })
            .collect();
        Standardization { mean: mean.into_iter().map(|m| m as f32).collect(), std }
    }
}

/// A classification table in memory.
#[derive(Debug, Clone)]
pub struct TabularClassification {
    name: String,
    features: Arc<Vec<f32>>,
    labels: Arc<Vec<u32>>,
    num_features: usize,
    class_names: Arc<Vec<String>>,
    standardization: Arc<Standardization>,
}

impl TabularClassification {
    /// `features` row-major (`n * num_features`, raw values), `labels` below `class_names.len()`.
    pub fn new(
        name: &str,
        features: Vec<f32>,
        labels: Vec<u32>,
        num_features: usize,
        class_names: Vec<String>,
        standardization: Standardization,
    ) -> Result<TabularClassification, DataError> {
        if num_features == 0 || !features.len().is_multiple_of(num_features) {
            return Err(DataError::InvalidConfig(format!(
                "{name}: {} values do not divide into rows of {num_features} features",
                features.len()
            )));
        }
        if features.len() / num_features != labels.len() {
            return Err(DataError::LengthMismatch {
                dataset: name.to_string(),
                images: features.len() / num_features,
                labels: labels.len(),
            });
        }
        if let Some((index, &label)) = labels.iter().enumerate().find(|(_, l)| **l as usize >= class_names.len()) {
            return Err(DataError::BadLabel {
                dataset: name.to_string(),
                index,
                label: label.into(),
                num_classes: class_names.len(),
            });
        }
        if standardization.mean.len() != num_features || standardization.std.len() != num_features {
            return Err(DataError::InvalidConfig(format!(
                "{name}: the standardisation has {} means and {} stds for {num_features} features",
                standardization.mean.len(),
                standardization.std.len()
            )));
        }
        Ok(TabularClassification {
            name: name.to_string(),
            features: Arc::new(features),
            labels: Arc::new(labels),
            num_features,
            class_names: Arc::new(class_names),
            standardization: Arc::new(standardization),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn num_features(&self) -> usize {
        self.num_features
    }

    /// `[1, 1, num_features]`: a row as a one-pixel-high image, for [`ImageCollate`].
    pub fn sample_shape(&self) -> [usize; 3] {
        [1, 1, self.num_features]
    }

    pub fn num_classes(&self) -> usize {
        self.class_names.len()
    }

    pub fn class_names(&self) -> &[String] {
        &self.class_names
    }

    pub fn labels(&self) -> &[u32] {
        &self.labels
    }

    pub fn standardization(&self) -> &Standardization {
        &self.standardization
    }

    /// Raw (not standardised) features of row `index`.
    pub fn raw_row(&self, index: usize) -> Option<&[f32]> {
        self.features.get(index * self.num_features..(index + 1) * self.num_features)
    }

    /// Only the first `n` rows (or all, if fewer).
    pub fn take(&self, n: usize) -> TabularClassification {
        let n = n.min(self.labels.len());
        let mut out = self.clone();
        out.features = Arc::new(self.features[..n * self.num_features].to_vec());
        out.labels = Arc::new(self.labels[..n].to_vec());
        out
    }

    /// A loader builder whose batches are tensors `(f32 [n, 1, 1, features], i64 [n])`.
    pub fn tensor_loader(self, batch_size: usize) -> DataLoaderBuilder<TabularClassification, Tensors<ImageCollate>> {
        let shape = self.sample_shape();
        DataLoader::builder(self).batch_size(batch_size).collate(Tensors(ImageCollate::new(shape)))
    }
}

impl Dataset for TabularClassification {
    type Sample = ImageExample;

    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize, _rng: &mut Generator) -> Result<ImageExample, BoxError> {
        let row = self
            .raw_row(index)
            .ok_or_else(|| format!("{}: index {index} out of range for {} rows", self.name, self.labels.len()))?;
        let Standardization { mean, std } = &*self.standardization;
        let pixels = row.iter().zip(mean).zip(std).map(|((x, m), s)| (x - m) / s).collect();
        Ok(ImageExample { pixels, label: self.labels[index] as usize })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standardises_with_the_given_statistics() {
        let rows = vec![1.0, 10.0, 3.0, 10.0];
        let s = Standardization::fit(&rows, 2);
        assert_eq!(s.mean, [2.0, 10.0]);
        assert_eq!(s.std, [1.0, 1.0]); // the second column is constant
        let t = TabularClassification::new("t", rows, vec![0, 1], 2, vec!["a".into(), "b".into()], s).unwrap();
        let mut g = Generator::new(0);
        assert_eq!(t.get(0, &mut g).unwrap(), ImageExample { pixels: vec![-1.0, 0.0], label: 0 });
        assert_eq!(t.get(1, &mut g).unwrap().pixels, [1.0, 0.0]);
        assert!(t.get(2, &mut g).is_err());
        assert_eq!(t.take(1).len(), 1);
        let bad = Standardization { mean: vec![0.0], std: vec![1.0] };
        assert!(TabularClassification::new("t", vec![0.0; 2], vec![0], 2, vec!["a".into()], bad).is_err());
    }
}
