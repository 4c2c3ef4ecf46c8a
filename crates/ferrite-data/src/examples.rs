//! The samples and batches of the built-in datasets, below both the datasets that make them and
//! the collate functions that batch them.
//!
//! Why a module of their own: a dataset (`image_classification.rs`, `char_text.rs`) produces
//! samples, a collate function (`batch_collate.rs`) turns samples into a batch, and
//! `tensor_collate.rs` turns a batch into tensors. With the types living beside one of their
//! users, those files imported each other in a circle; here every one of them looks down at the
//! same plain data.

/// One image and its class.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageExample {
    /// Normalised pixels, row-major, `channels * height * width` values.
    pub pixels: Vec<f32>,
    pub label: usize,
}

/// Input characters and the next character at every position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextExample {
    pub input: Vec<u32>,
    pub target: Vec<u32>,
}

/// A batch of images: `pixels` is row-major `[len, channels, height, width]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageBatch {
    pub pixels: Vec<f32>,
    pub labels: Vec<usize>,
    pub sample_shape: [usize; 3],
}

impl ImageBatch {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// `[len, channels, height, width]`.
    pub fn shape(&self) -> [usize; 4] {
        let [c, h, w] = self.sample_shape;
        [self.len(), c, h, w]
    }
}

/// A batch of text windows: `inputs` and `targets` are row-major `[len, seq_len]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextBatch {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
    pub len: usize,
    pub seq_len: usize,
}
