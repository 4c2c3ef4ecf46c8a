//! Tensors saved for backward, with the version check that catches in-place modification.

use std::borrow::Cow;

use crate::Tensor;
use crate::error::{Result, TensorError};

/// A tensor saved by an op for its backward. Holds a graph-less alias (never the op's own output
/// with its `grad_fn`, which would form a reference cycle) and the storage version at save time.
pub struct SavedTensor {
    tensor: Tensor,
    version: u64,
    output_nr: usize,
}

impl SavedTensor {
    /// Save `t` (input or output of the op).
    pub fn new(t: &Tensor) -> SavedTensor {
        SavedTensor { tensor: t.detach(), version: t.storage().version(), output_nr: t.output_nr() }
    }

    /// The saved tensor, or an error naming `op` if it was modified in place since it was saved.
    pub fn get(&self, op: impl Into<Cow<'static, str>>) -> Result<&Tensor> {
        let current = self.tensor.storage().version();
        if current != self.version {
            return Err(TensorError::ModifiedByInplace {
                op: op.into().into_owned(),
                dtype: self.tensor.dtype(),
                shape: self.tensor.shape().to_vec(),
                output_nr: self.output_nr,
                current,
                saved: self.version,
            });
        }
        Ok(&self.tensor)
    }
}
