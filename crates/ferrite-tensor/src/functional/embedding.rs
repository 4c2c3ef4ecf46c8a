//! Embedding lookup as `index_select` on the weight's rows: the gradient then accumulates into
//! exactly the picked rows through `index_select`'s backward, with no embedding-specific kernel.

use crate::Tensor;
use crate::error::{ExpectedShape, Result, TensorError};

/// Rows of `weight` `[num_embeddings, dim]` picked by integer `indices` (any shape); output
/// `[*indices.shape, dim]`. Gradients accumulate into the picked rows.
pub fn embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
    if weight.rank() != 2 {
        return Err(TensorError::InvalidShape {
            op: "embedding",
            arg: "weight",
            shape: weight.shape().to_vec(),
            expected: ExpectedShape::Named(&["num_embeddings", "embedding_dim"]),
        });
    }
    let flat = indices.reshape_usize(&[indices.numel()])?;
    let rows = weight.index_select(0, &flat)?;
    let mut shape: Vec<usize> = indices.shape().to_vec();
    shape.push(weight.shape()[1]);
    rows.reshape_usize(&shape)
}
