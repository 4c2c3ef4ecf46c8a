//! The dtype new parameters are created in, scoped to a closure on this thread
//! ([`with_parameter_dtype`]), like PyTorch's `torch.set_default_dtype` around a model's
//! construction or transformers' `from_pretrained(torch_dtype=torch.bfloat16)`.
//!
//! Why: a model built in f32 and converted afterwards holds its f32 copy at the peak — for a 7B
//! decoder 27 GiB, more than a 24 GB card has, although its bf16 weights (13.5 GiB) fit. Built
//! under `with_parameter_dtype(BF16, ..)` every layer's parameters are bf16 from the start, so
//! only what is created afterwards (LoRA adapters, always f32) and their optimizer state are f32.
//! Initialisation draws f32 values and rounds them into the parameter (`init`), so a layer built
//! in bf16 holds exactly what the f32 layer converted to bf16 holds.
use std::cell::Cell;

use ferrite_tensor::DType;

thread_local! {
    static PARAMETER_DTYPE: Cell<DType> = const { Cell::new(DType::F32) };
}

/// The dtype the layers built now on this thread give their parameters: f32, or what an
/// enclosing [`with_parameter_dtype`] set.
pub fn parameter_dtype() -> DType {
    PARAMETER_DTYPE.with(Cell::get)
}

/// Runs `build` with the parameters it creates on this thread in `dtype` (a floating-point
/// dtype: `bf16`, `f16`, `f32`, `f64`); the previous dtype is restored afterwards, also when
/// `build` panics. Buffers keep the dtype their layer gives them: call `Module::to_dtype` after
/// building when they should follow (it leaves parameters already in `dtype` untouched, without
/// a copy).
pub fn with_parameter_dtype<R>(dtype: DType, build: impl FnOnce() -> R) -> R {
    struct Restore(DType);
    impl Drop for Restore {
        fn drop(&mut self) {
            PARAMETER_DTYPE.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(PARAMETER_DTYPE.with(|c| c.replace(dtype)));
    build()
}
