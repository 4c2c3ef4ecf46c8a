//! Matrix products with PyTorch's `matmul` semantics (1-D, 2-D, batched with broadcasting).
//!
//! f32 (and f64, on the CPU backend) run natively with arbitrary strides (transposed operands
//! need no copy). f16/bf16 inputs are multiplied in f32 and rounded once — the documented
//! "computes in f32 internally" contract: by the backend itself where it can (`cuda:N`, cuBLAS
//! with f32 accumulation, no copies; the CPU, widening into workspace outside the allocator),
//! else (`gpu:N`) widened to f32 scratch tensors from the device allocator first. Under
//! autocast, float32
//! inputs are cast to the autocast dtype first. The product itself runs in the device's kernel
//! backend (on the CPU: `backend/cpu/matmul.rs`).

use std::borrow::Cow;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::error::{ExpectedShape, Result, TensorError};
use crate::layout::{Layout, Shape, broadcast_shapes};
use crate::ops::check_same_device;
use crate::ops::copy::materialize;
use crate::{DType, Tensor};

/// Product of `a [.., m, k]` and `b [.., k, n]` (ranks ≥ 2) without autograd.
pub(crate) fn matmul_raw(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    check_same_device("matmul", a, b)?;
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (k2, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    if k != k2 {
        return Err(TensorError::MatmulShapeMismatch {
            op: "matmul",
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    if a.dtype() != b.dtype() {
        return Err(TensorError::DTypeMismatch { op: "matmul", lhs: a.dtype(), rhs: b.dtype() });
    }
    let dtype = a.dtype();
    if !dtype.is_floating_point() {
        return Err(TensorError::UnsupportedDType { op: "matmul", dtype });
    }
    let batch = broadcast_shapes(&a.shape()[..ra - 2], &b.shape()[..rb - 2], "matmul")?;
    let mut out_shape: Shape = batch.clone();
    out_shape.push(m);
    out_shape.push(n);
    // Fold a batched `a` against a plain matrix `b` into one big GEMM when a's rows merge.
    if rb == 2 && ra > 2 {
        let rows: usize = a.shape()[..ra - 1].iter().product();
        if let Some(l2) = a.layout().view(&[rows, k]) {
            let o = matmul_raw(&a.view_with_layout(l2), b)?;
            return Ok(o.view_with_layout(Layout::contiguous(&out_shape)));
        }
    }
    let widen = matches!(dtype, DType::F16 | DType::BF16) && !a.kernels().matmul_takes_half();
    let (a32, b32) =
        if widen { (materialize(a, DType::F32)?, materialize(b, DType::F32)?) } else { (a.clone(), b.clone()) };
    let compute = a32.dtype();
    let out = a.empty_like_shape(&out_shape, compute)?;
    out.kernels().matmul(&out, &a32, &b32, &batch)?;
    drop((a32, b32));
    if compute != dtype {
        return materialize(&out, dtype);
    }
    Ok(out)
}

struct MatmulBackward {
    a: SavedTensor,
    b: SavedTensor,
    need: [bool; 2],
}

impl BackwardFn for MatmulBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("MmBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None, None]) };
        let a = self.a.get("MmBackward0")?;
        let b = self.b.get("MmBackward0")?;
        let g = if g.dtype() != a.dtype() { materialize(g, a.dtype())? } else { g.clone() };
        let ga = if self.need[0] {
            let bt = b.view_with_layout(b.layout().transpose(b.rank() - 2, b.rank() - 1));
            let r = matmul_raw(&g, &bt)?;
            Some(r.sum_to_shape(a.shape())?)
        } else {
            None
        };
        let gb = if self.need[1] {
            let at = a.view_with_layout(a.layout().transpose(a.rank() - 2, a.rank() - 1));
            // For a batchless b, fold the batch into the reduction: a^T [k, B*m] @ g [B*m, n].
            let r = if b.rank() == 2 && a.rank() > 2 {
                let ra = a.rank();
                let rows: usize = a.shape()[..ra - 1].iter().product();
                match (a.layout().view(&[rows, a.shape()[ra - 1]]), g.layout().view(&[rows, g.shape()[g.rank() - 1]])) {
                    (Some(la), Some(lg)) => {
                        let a2 = a.view_with_layout(la);
                        let a2t = a2.view_with_layout(a2.layout().transpose(0, 1));
                        matmul_raw(&a2t, &g.view_with_layout(lg))?
                    }
                    _ => matmul_raw(&at, &g)?.sum_to_shape(b.shape())?,
                }
            } else {
                matmul_raw(&at, &g)?.sum_to_shape(b.shape())?
            };
            Some(r)
        } else {
            None
        };
        Ok(vec![ga, gb])
    }
}

impl Tensor {
    /// Matrix product with PyTorch's `matmul` semantics: 1-D·1-D dot, 2-D·2-D, matrix-vector,
    /// and batched products with broadcast batch dimensions.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        for (arg, t) in [("self", self), ("other", other)] {
            if t.rank() == 0 {
                return Err(TensorError::InvalidShape {
                    op: "matmul",
                    arg,
                    shape: Vec::new(),
                    expected: ExpectedShape::MinRank(1),
                });
            }
        }
        let low = crate::autocast::lower(promote_float(self.dtype(), other.dtype()));
        let a = if self.dtype() != low { self.to_dtype(low)? } else { self.clone() };
        let b = if other.dtype() != low { other.to_dtype(low)? } else { other.clone() };
        let a2 = if a.rank() == 1 { a.unsqueeze(0)? } else { a.clone() };
        let b2 = if b.rank() == 1 { b.unsqueeze(-1)? } else { b.clone() };
        let out = matmul_raw(&a2, &b2)?;
        let out = if Tensor::needs_graph(&[&a2, &b2]) {
            Tensor::from_op1(
                out,
                &[&a2, &b2],
                MatmulBackward {
                    a: SavedTensor::new(&a2),
                    b: SavedTensor::new(&b2),
                    need: [a2.requires_grad(), b2.requires_grad()],
                },
            )
        } else {
            out
        };
        let out = if b.rank() == 1 { out.squeeze(-1)? } else { out };
        let out = if a.rank() == 1 { out.squeeze(if b.rank() == 1 { -1 } else { -2 })? } else { out };
        Ok(out)
    }

    /// `self @ other^T + bias` with PyTorch's `linear` layout (weight is `[out, in]`).
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        if weight.rank() != 2 {
            return Err(TensorError::InvalidShape {
                op: "linear",
                arg: "weight",
                shape: weight.shape().to_vec(),
                expected: ExpectedShape::Named(&["out_features", "in_features"]),
            });
        }
        let y = self.matmul(&weight.t()?)?;
        match bias {
            Some(b) => {
                let b = if b.dtype() != y.dtype() { b.to_dtype(y.dtype())? } else { b.clone() };
                y.add(&b)
            }
            None => Ok(y),
        }
    }
}

fn promote_float(a: DType, b: DType) -> DType {
    let p = crate::ops::promote_types(a, b);
    if p.is_floating_point() { p } else { DType::F32 }
}
