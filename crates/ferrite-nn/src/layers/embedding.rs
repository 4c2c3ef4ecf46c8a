//! `Embedding`: a lookup table of `num_embeddings` vectors, N(0, 1)-initialised like PyTorch,
//! with an optional padding index whose row starts at zero and never receives gradient.

use std::borrow::Cow;

use ferrite_tensor::random::with_default_generator;
use ferrite_tensor::{BackwardFn, DType, Device, Generator, SavedTensor, Tensor, TensorError, no_grad};

use crate::error::{NnError, Result};
use crate::init::normal_;
use crate::module::{Module, new_parameter, training_flag};

/// Lookup table `weight [num_embeddings, embedding_dim]`; `forward` takes integer indices of any
/// shape and returns `[*indices.shape, embedding_dim]`.
#[derive(Clone, Debug)]
pub struct Embedding {
    pub num_embeddings: usize,
    pub embedding_dim: usize,
    /// Row excluded from gradient updates (and zero-initialised).
    pub padding_idx: Option<usize>,
    pub weight: Tensor,
    training: bool,
}

impl Embedding {
    /// On the CPU, initialised from the process default generator.
    pub fn new(num_embeddings: usize, embedding_dim: usize, padding_idx: Option<i64>) -> Result<Embedding> {
        with_default_generator(|g| Embedding::new_with(num_embeddings, embedding_dim, padding_idx, &Device::Cpu, g))
    }

    /// N(0, 1) weights from `g`; a negative `padding_idx` counts from the end, as in PyTorch.
    pub fn new_with(
        num_embeddings: usize,
        embedding_dim: usize,
        padding_idx: Option<i64>,
        device: &Device,
        g: &mut Generator,
    ) -> Result<Embedding> {
        let padding_idx = match padding_idx {
            None => None,
            Some(p) => {
                let n = num_embeddings as i64;
                if p >= n || p < -n {
                    return Err(NnError::config(
                        "Embedding",
                        format!("padding_idx {p} must be within num_embeddings ({num_embeddings})"),
                    ));
                }
                Some(if p < 0 { (p + n) as usize } else { p as usize })
            }
        };
        let weight = new_parameter(&[num_embeddings, embedding_dim], device, |w| {
            normal_(w, 0.0, 1.0, g)?;
            if let Some(p) = padding_idx {
                let _g = no_grad();
                w.narrow(0, p, 1)?.fill_(0.0)?;
            }
            Ok(())
        })?;
        Ok(Embedding { num_embeddings, embedding_dim, padding_idx, weight, training: true })
    }
}

impl Module for Embedding {
    fn type_name(&self) -> &'static str {
        "Embedding"
    }
    fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        if indices.dtype().is_floating_point() {
            return Err(NnError::Tensor(TensorError::InvalidDType {
                op: "embedding",
                arg: "indices",
                dtype: indices.dtype(),
                expected: &[DType::I64, DType::I32],
            }));
        }
        match self.padding_idx {
            None => Ok(ferrite_tensor::functional::embedding(indices, &self.weight)?),
            Some(p) => embedding_with_padding(indices, &self.weight, p),
        }
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        vec![("weight".to_string(), &self.weight)]
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![("weight".to_string(), &mut self.weight)]
    }
    training_flag!();
}

/// Embedding whose backward skips rows looked up at `padding_idx`.
fn embedding_with_padding(indices: &Tensor, weight: &Tensor, padding_idx: usize) -> Result<Tensor> {
    let out = {
        let _g = no_grad();
        ferrite_tensor::functional::embedding(indices, weight)?
    };
    if !Tensor::needs_graph(&[weight]) {
        return Ok(out);
    }
    let flat = indices.reshape_usize(&[indices.numel()])?.to_dtype(DType::I64)?;
    let f = EmbeddingPaddedBackward {
        indices: SavedTensor::new(&flat),
        weight_shape: weight.shape().to_vec(),
        padding_idx,
    };
    Ok(Tensor::from_op1(out, &[weight], f))
}

struct EmbeddingPaddedBackward {
    indices: SavedTensor,
    weight_shape: Vec<usize>,
    padding_idx: usize,
}

impl BackwardFn for EmbeddingPaddedBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("EmbeddingBackward0")
    }
    fn backward(&mut self, grads: &[Option<Tensor>]) -> ferrite_tensor::Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else { return Ok(vec![None]) };
        let idx = self.indices.get("EmbeddingBackward0")?;
        let (n, dim) = (idx.numel(), self.weight_shape[1]);
        let rows = g.reshape_usize(&[n, dim])?;
        let pad = idx.eq_scalar(self.padding_idx as f64)?.unsqueeze(1)?;
        let rows = rows.masked_fill(&pad, 0.0)?;
        let index = idx.unsqueeze(1)?.expand(&[n, dim])?;
        let zeros = Tensor::zeros(&self.weight_shape, g.dtype(), g.device())?;
        Ok(vec![Some(zeros.scatter_add(0, &index, &rows)?)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_row_is_zero_and_gets_no_gradient() {
        let mut g = Generator::new(3);
        let e = Embedding::new_with(6, 4, Some(-1), &Device::Cpu, &mut g).unwrap();
        assert_eq!(e.padding_idx, Some(5));
        let w = e.weight.to_vec::<f32>().unwrap();
        assert!(w[20..24].iter().all(|&v| v == 0.0));
        let idx = Tensor::from_vec(vec![5i64, 1, 5, 1, 0, 2], &[2, 3], &Device::Cpu).unwrap();
        let y = e.forward(&idx).unwrap();
        assert_eq!(y.shape(), &[2, 3, 4]);
        y.sum().unwrap().backward().unwrap();
        let gw = e.weight.grad().unwrap().to_vec::<f32>().unwrap();
        // Row 1 twice, rows 0 and 2 once, row 5 (padding) never, rows 3-4 unused.
        let expect = [1.0, 2.0, 1.0, 0.0, 0.0, 0.0];
        for (r, want) in expect.iter().enumerate() {
            assert!(gw[r * 4..r * 4 + 4].iter().all(|v| v == want), "row {r}: {:?}", &gw[r * 4..r * 4 + 4]);
        }
        assert!(Embedding::new_with(6, 4, Some(6), &Device::Cpu, &mut g).is_err());
        assert!(e.forward(&Tensor::zeros(&[2], DType::F32, &Device::Cpu).unwrap()).is_err());
    }
}
