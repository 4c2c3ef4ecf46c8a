//! The dtypes an index operand may have, the one list both the op layer's check
//! (`ops/index.rs`) and the kernels' own error (`backend/cpu/index.rs`) name. It lives on the
//! backend side because a backend reports it; the op layer depends on the backend, never the
//! reverse.

use crate::DType;

/// The dtypes an index tensor of `index_select`/`index_add` may have.
pub(crate) const INDEX_DTYPES: &[DType] = &[DType::I64, DType::I32, DType::U8];
