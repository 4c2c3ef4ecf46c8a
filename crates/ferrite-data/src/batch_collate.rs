//! Collating built-in samples into contiguous, tensor-ready buffers.
//!
//! A batch of 64 Fashion-MNIST images should reach the training thread as one `[64, 1, 28, 28]`
//! buffer (one allocation, one copy to the device), not 64 small vectors. These collates build
//! exactly that in the workers; turning the buffer into a tensor is then a move, not a copy.

use ferrite_tensor::Generator;

use crate::collate::Collate;
use crate::error::BoxError;
use crate::examples::{ImageBatch, ImageExample, TextBatch, TextExample};

/// Collates [`ImageExample`]s of one shape into an [`ImageBatch`].
#[derive(Debug, Clone, Copy)]
pub struct ImageCollate {
    sample_shape: [usize; 3],
}

impl ImageCollate {
    /// For samples of `sample_shape` (e.g. `dataset.sample_shape()`).
    pub fn new(sample_shape: [usize; 3]) -> ImageCollate {
        ImageCollate { sample_shape }
    }
}

impl Collate<ImageExample> for ImageCollate {
    type Batch = ImageBatch;

    fn collate(&self, samples: Vec<ImageExample>, _rng: &mut Generator) -> Result<ImageBatch, BoxError> {
        let per = self.sample_shape.iter().product::<usize>();
        let mut pixels = Vec::with_capacity(samples.len() * per);
        let mut labels = Vec::with_capacity(samples.len());
        for (i, s) in samples.into_iter().enumerate() {
            if s.pixels.len() != per {
                return Err(format!(
                    "sample {i} of the batch has {} pixels, expected {per} for shape {:?}",
                    s.pixels.len(),
                    self.sample_shape
                )
                .into());
            }
            pixels.extend_from_slice(&s.pixels);
            labels.push(s.label);
        }
        Ok(ImageBatch { pixels, labels, sample_shape: self.sample_shape })
    }
}

/// Collates [`TextExample`]s of equal length into a [`TextBatch`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TextCollate;

impl Collate<TextExample> for TextCollate {
    type Batch = TextBatch;

    fn collate(&self, samples: Vec<TextExample>, _rng: &mut Generator) -> Result<TextBatch, BoxError> {
        let seq_len = samples.first().map_or(0, |s| s.input.len());
        let mut inputs = Vec::with_capacity(samples.len() * seq_len);
        let mut targets = Vec::with_capacity(samples.len() * seq_len);
        for (i, s) in samples.iter().enumerate() {
            if s.input.len() != seq_len || s.target.len() != seq_len {
                return Err(format!(
                    "sample {i} of the batch has length {}/{}, expected {seq_len}",
                    s.input.len(),
                    s.target.len()
                )
                .into());
            }
            inputs.extend_from_slice(&s.input);
            targets.extend_from_slice(&s.target);
        }
        Ok(TextBatch { inputs, targets, len: samples.len(), seq_len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_concatenate_and_shapes_are_checked() {
        let c = ImageCollate::new([1, 1, 2]);
        let mut g = Generator::new(0);
        let b = c
            .collate(
                vec![
                    ImageExample { pixels: vec![1.0, 2.0], label: 3 },
                    ImageExample { pixels: vec![4.0, 5.0], label: 1 },
                ],
                &mut g,
            )
            .unwrap();
        assert_eq!(b.pixels, [1.0, 2.0, 4.0, 5.0]);
        assert_eq!(b.shape(), [2, 1, 1, 2]);
        assert!(c.collate(vec![ImageExample { pixels: vec![1.0], label: 0 }], &mut g).is_err());
    }

    #[test]
    fn text_concatenates() {
        let mut g = Generator::new(0);
        let t = |a: u32| TextExample { input: vec![a, a + 1], target: vec![a + 1, a + 2] };
        let b = TextCollate.collate(vec![t(0), t(5)], &mut g).unwrap();
        assert_eq!((b.len, b.seq_len), (2, 2));
        assert_eq!(b.inputs, [0, 1, 5, 6]);
        assert_eq!(b.targets, [1, 2, 6, 7]);
        let bad = TextExample { input: vec![1], target: vec![2] };
        assert!(TextCollate.collate(vec![t(0), bad], &mut g).is_err());
    }
}
