//! Getting parameters and gradients into the shape fused kernels need (contiguous, one dtype),
//! without the update rules caring. Parameters are nearly always contiguous already; the rare
//! strided one is updated through a contiguous copy written back afterwards.

use ferrite_tensor::{DType, Tensor, TensorError};

use crate::error::{OptimError, Result};

/// `grad` as a contiguous tensor of `param`'s dtype (a handle clone in the common case).
pub(crate) fn grad_like(grad: &Tensor, param: &Tensor) -> Result<Tensor> {
    let g = if grad.dtype() != param.dtype() { grad.detach().to_dtype(param.dtype())? } else { grad.detach() };
    Ok(if g.is_contiguous() { g } else { g.contiguous()? })
}

/// Run `f` on a contiguous tensor whose values end up in `param`.
pub(crate) fn with_contiguous(param: &Tensor, f: impl FnOnce(&Tensor) -> Result<()>) -> Result<()> {
    let p = param.detach();
    if p.is_contiguous() {
        return f(&p);
    }
    let tmp = p.contiguous()?;
    f(&tmp)?;
    p.copy_(&tmp)?;
    Ok(())
}

pub(crate) fn unsupported(op: &'static str, dtype: DType) -> OptimError {
    OptimError::Tensor(TensorError::UnsupportedDType { op, dtype })
}
