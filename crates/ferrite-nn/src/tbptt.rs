//! Truncated backpropagation through time: train a recurrent model on a sequence too long to
//! backpropagate through at once by cutting it into chunks of `k` steps, carrying the state from
//! one chunk into the next but *detached*, so each chunk's backward stops at its first step.
//!
//! Why a helper for three lines of loop: forgetting the `detach` is silent — training works,
//! every chunk's graph stays reachable from the carried state, and memory grows with the whole
//! sequence until it runs out. [`tbptt`] makes the cut part of the loop, so the peak memory of a
//! 10,000-step sequence is that of one chunk (the tests measure it with the allocator).
//!
//! ```
//! use ferrite_nn::tbptt::tbptt;
//! use ferrite_nn::{LSTM, Module};
//! use ferrite_tensor::{DType, Device, Generator, Tensor, no_grad};
//! # fn main() -> ferrite_nn::Result<()> {
//! let (cpu, mut g) = (Device::Cpu, Generator::new(0));
//! let lstm = LSTM::new_with(3, 8, 1, true, false, &cpu, &mut g)?;
//! let seq = Tensor::randn_with(&[100, 2, 3], DType::F32, &cpu, &mut g)?; // [time, batch, in]
//! let last = tbptt(100, 25, None, |chunk, state: Option<(Tensor, Tensor)>| {
//!     let x = chunk.of(&seq, 0)?; // steps [start, start + 25)
//!     let (y, state) = lstm.forward_with_state(&x, state.as_ref().map(|(h, c)| (h, c)))?;
//!     y.square()?.mean()?.backward()?;
//!     let _g = no_grad();
//!     for p in lstm.parameters() {
//!         p.sub_(&p.grad().unwrap().mul_scalar(0.01)?)?;
//!     }
//!     lstm.zero_grad()?;
//!     Ok(Some(state))
//! })?;
//! assert_eq!(last.unwrap().0.shape(), [1, 2, 8]);
//! # Ok(()) }
//! ```

use std::ops::Range;

use ferrite_tensor::Tensor;

use crate::error::{NnError, Result};

/// A value carried across chunk boundaries and cut from its history there.
pub trait Detach {
    /// The same values without autograd history.
    fn detach(&self) -> Self;
}

impl Detach for Tensor {
    fn detach(&self) -> Tensor {
        Tensor::detach(self)
    }
}

impl<T: Detach> Detach for Option<T> {
    fn detach(&self) -> Option<T> {
        self.as_ref().map(T::detach)
    }
}

impl<T: Detach> Detach for Vec<T> {
    fn detach(&self) -> Vec<T> {
        self.iter().map(T::detach).collect()
    }
}

impl<A: Detach, B: Detach> Detach for (A, B) {
    fn detach(&self) -> (A, B) {
        (self.0.detach(), self.1.detach())
    }
}

/// One chunk of a sequence: steps `[start, start + len)`, the `index`-th chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub index: usize,
    pub start: usize,
    pub len: usize,
}

impl Chunk {
    /// The chunk's steps as a range.
    pub fn range(&self) -> Range<usize> {
        self.start..self.start + self.len
    }

    /// The chunk's steps of `x` along its time dimension `time_dim` (a view).
    pub fn of(&self, x: &Tensor, time_dim: i64) -> Result<Tensor> {
        Ok(x.narrow(time_dim, self.start, self.len)?)
    }
}

/// The chunks of `k` steps of a `len`-step sequence (the last one shorter if `k` does not
/// divide `len`). `k` must be positive.
pub fn chunks(len: usize, k: usize) -> Result<impl Iterator<Item = Chunk>> {
    if k == 0 {
        return Err(NnError::config("tbptt", "the chunk length k must be at least 1 step"));
    }
    Ok((0..len.div_ceil(k)).map(move |index| {
        let start = index * k;
        Chunk { index, start, len: k.min(len - start) }
    }))
}

/// Run `step(chunk, state)` over the chunks of `k` steps of a `len`-step sequence, in order,
/// starting from `state`; each call returns the state after its chunk, which the next call
/// receives detached. Returns the (detached) state after the last chunk. The closure does the
/// chunk's forward, loss, backward and optimizer step; an error stops the loop and is returned.
pub fn tbptt<S: Detach>(len: usize, k: usize, state: S, mut step: impl FnMut(Chunk, S) -> Result<S>) -> Result<S> {
    let mut state = state.detach();
    for chunk in chunks(len, k)? {
        state = step(chunk, state)?.detach();
    }
    Ok(state)
}
