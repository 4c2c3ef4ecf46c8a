//! Device-side errors on `cuda:N`, reported as PyTorch reports them: at the next synchronisation,
//! naming the op that queued the kernel.
//!
//! Why: whether an index op (or a loss's class targets, or `binary_cross_entropy`'s inputs) is
//! valid depends on values that live on the device; only the kernel sees them, and it cannot stop
//! the run. Reading its verdict back right after each launch would make every such op a
//! synchronisation point, stalling the host once per op of a training step. Instead each such
//! launch writes its verdict into a 16-byte slot of one per-device flag slab, and the host queues
//! the op's name and what its error needs (no tensor is kept alive). At every synchronisation
//! point (`synchronize`, every device→host read: `to_vec`, `item`, `.to(cpu)`) the backend reads
//! the used slots in one copy, clears the raised ones, empties the queue and returns the CPU's
//! error for the first raised slot in queue order. The queue is bounded by the slab: when all
//! [`SLOTS`] slots are in use, the next flagged op drains it first (one synchronisation per
//! [`SLOTS`] flagged ops at most, in a loop that never reads back).
//!
//! A slot holds, for an index check, the complement of the first bad position (0: none) and that
//! index's value (index.cu's `flag_bad_index` and `flag_index_value_i64`); for
//! `binary_cross_entropy`, loss.cu's four floats (input flag and value, target flag and value).

use ferrite_cuda::{CudaError, CudaRuntime};
use parking_lot::Mutex;

use crate::error::{Result, TensorError};
use crate::{DType, Tensor};

/// Slots of one device's flag slab (16 bytes each).
pub(super) const SLOTS: usize = 256;
/// Bytes of one slot.
const SLOT_BYTES: usize = 16;

/// What a raised slot means: the error the CPU gives for the same input.
#[derive(Clone, Copy, Debug)]
pub(super) enum Check {
    /// `TensorError::IndexOutOfRange { op, index, dim, size }`, the index read from the slot.
    Index { dim: usize, size: usize },
    /// `binary_cross_entropy`'s input or target outside [0, 1].
    BceRange,
}

/// One flagged launch waiting for the next synchronisation.
struct Queued {
    op: &'static str,
    check: Check,
}

/// The flag slab of one device and the launches queued on it (slot `i` is `queued[i]`'s).
#[derive(Default)]
pub(super) struct Deferred {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// `SLOTS` zeroed slots (i64 pairs), allocated on the first flagged launch.
    slab: Option<Tensor>,
    queued: Vec<Queued>,
}

impl Deferred {
    /// Runs `launch` with the device address of a fresh zeroed slot for `op`'s flag, queued with
    /// `check`. The slot is held (the queue locked) while `launch` queues its kernels, so a drain
    /// from another thread cannot recycle it before they are queued; `launch` must not read from
    /// the device.
    pub(super) fn flagged(
        &self,
        rt: &dyn CudaRuntime,
        device: &str,
        like: &Tensor,
        op: &'static str,
        check: Check,
        launch: impl FnOnce(u64) -> Result<()>,
    ) -> Result<()> {
        let mut s = self.state.lock();
        if s.queued.len() == SLOTS {
            s.drain(rt, device)?;
        }
        let slab = match &s.slab {
            Some(t) => t.clone(),
            None => {
                let t = like.empty_like_shape(&[SLOTS * SLOT_BYTES / 8], DType::I64)?;
                let zeros = vec![0u8; SLOTS * SLOT_BYTES];
                let at = addr(&t, op)?;
                // SAFETY: `t` is a fresh contiguous device tensor of exactly `zeros.len()` bytes.
                unsafe { rt.copy_to_device(at, &zeros) }.map_err(|e| fail(device, op, e))?;
                s.slab = Some(t.clone());
                t
            }
        };
        let slot = addr(&slab, op)? + (s.queued.len() * SLOT_BYTES) as u64;
        s.queued.push(Queued { op, check });
        launch(slot)
    }

    /// The first device-side error queued since the last drain, if any; afterwards nothing is
    /// queued and every slot is zero. Reads the flags only when something is queued (that read
    /// waits for the queued work).
    pub(super) fn drain(&self, rt: &dyn CudaRuntime, device: &str) -> Result<()> {
        self.state.lock().drain(rt, device)
    }
}

impl State {
    fn drain(&mut self, rt: &dyn CudaRuntime, device: &str) -> Result<()> {
        if self.queued.is_empty() {
            return Ok(());
        }
        let queued = std::mem::take(&mut self.queued);
        let Some(slab) = &self.slab else { return Ok(()) };
        let at = addr(slab, "synchronize")?;
        let mut bytes = vec![0u8; queued.len() * SLOT_BYTES];
        // SAFETY: the slab is a live contiguous device tensor of `SLOTS * SLOT_BYTES` bytes and
        // `queued.len() <= SLOTS`.
        unsafe { rt.copy_to_host(&mut bytes, at) }.map_err(|e| fail(device, "synchronize", e))?;
        let mut first: Option<TensorError> = None;
        for (i, (q, slot)) in queued.iter().zip(bytes.chunks_exact(SLOT_BYTES)).enumerate() {
            if slot.iter().all(|b| *b == 0) {
                continue;
            }
            if first.is_none() {
                first = error(q, slot);
            }
            let zeros = [0u8; SLOT_BYTES];
            // SAFETY: slot `i < SLOTS` of the live slab; the copy above waited for every kernel
            // that could write it.
            unsafe { rt.copy_to_device(at + (i * SLOT_BYTES) as u64, &zeros) }
                .map_err(|e| fail(device, "synchronize", e))?;
        }
        first.map_or(Ok(()), Err)
    }
}

/// The device address of the slab `t` (contiguous, from its storage's start plus its offset).
fn addr(t: &Tensor, op: &'static str) -> Result<u64> {
    if t.is_storage_released() {
        return Err(TensorError::StorageReleased { op });
    }
    Ok(t.storage().addr() + (t.storage_offset() * t.dtype().size_in_bytes()) as u64)
}

/// A runtime failure of `op` on `device` as the tensor crate's error.
fn fail(device: &str, op: &'static str, e: CudaError) -> TensorError {
    TensorError::Cuda { op, device: device.to_string(), detail: e.to_string() }
}

/// The CPU's error for the raised `slot` of `q` (None for a slot that holds no verdict).
fn error(q: &Queued, slot: &[u8]) -> Option<TensorError> {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&slot[i * 8..i * 8 + 8]);
        u64::from_ne_bytes(w)
    };
    let float = |i: usize| f32::from_ne_bytes([slot[i * 4], slot[i * 4 + 1], slot[i * 4 + 2], slot[i * 4 + 3]]);
    match q.check {
        Check::Index { dim, size } => {
            (word(0) != 0).then(|| TensorError::IndexOutOfRange { op: q.op, index: word(1) as i64, dim, size })
        }
        Check::BceRange => [("input", float(0), float(1)), ("target", float(2), float(3))]
            .into_iter()
            .find(|(_, flag, _)| *flag != 0.0)
            .map(|(what, _, value)| bce_range(what, value)),
    }
}

/// The CPU backend's error for an input or a target of `binary_cross_entropy` outside [0, 1].
fn bce_range(what: &str, value: f32) -> TensorError {
    TensorError::invalid(
        "binary_cross_entropy",
        format!(
            "all elements of {what} should be between 0 and 1, found {}{}",
            value as f64,
            if what == "input" {
                "; pass probabilities (e.g. sigmoid(logits)), or logits to binary_cross_entropy_with_logits"
            } else {
                ""
            }
        ),
    )
}
