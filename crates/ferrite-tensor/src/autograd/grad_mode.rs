//! Thread-local switch for graph recording (PyTorch's `no_grad` / `enable_grad`).

use std::cell::Cell;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops on this thread record autograd graphs.
#[inline]
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Restores the previous grad mode when dropped.
#[must_use = "grad mode is restored when the guard is dropped; bind it with `let _guard = ...`"]
pub struct GradModeGuard {
    prev: bool,
    // Grad mode is thread-local: the guard must be dropped on the thread that created it.
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Set grad mode for the lifetime of the returned guard.
pub fn set_grad_enabled(enabled: bool) -> GradModeGuard {
    let prev = GRAD_ENABLED.with(|g| g.replace(enabled));
    GradModeGuard { prev, _not_send: std::marker::PhantomData }
}

/// Disable graph recording until the guard drops: inference and parameter updates keep no
/// activations and allocate no graph.
pub fn no_grad() -> GradModeGuard {
    set_grad_enabled(false)
}

/// Re-enable graph recording inside a `no_grad` region (used by activation checkpointing).
pub fn enable_grad() -> GradModeGuard {
    set_grad_enabled(true)
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        let prev = self.prev;
        GRAD_ENABLED.with(|g| g.set(prev));
    }
}
