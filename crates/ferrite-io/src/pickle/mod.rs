//! A restricted unpickler: reads the pickles inside PyTorch checkpoints without executing them.
//!
//! Python's `pickle` is a small program that may import and call anything; that is why loading an
//! untrusted `.pt` file with `torch.load(weights_only=False)` can run arbitrary code. This module is
//! a separate implementation of the pickle machine that understands exactly what a weights-only
//! checkpoint needs — tensor rebuild functions, typed storages (via persistent ids), `OrderedDict`,
//! plain containers and scalars — and refuses every other global by name, with a reason, at the
//! moment the pickle mentions it. It has no way to call into Python or the operating system.
//!
//! Running a pickle ([`run`]) yields a heap of objects; [`Program::to_value`] then turns it into a
//! [`Value`](crate::Value) tree, asking the caller (the zip or legacy container reader) for the bytes
//! of each storage the tensors refer to.

mod allowed_globals;
mod heap;
mod machine;
mod materialize;
mod writer;

pub(crate) use heap::StorageRef;
pub(crate) use machine::{Program, run};
pub(crate) use materialize::StorageResolver;
pub use writer::to_pickle;

use crate::error::{IoError, Result};
use crate::value::Value;

impl Program {
    /// The storages the program's tensors refer to, in order of first mention.
    pub(crate) fn storage_refs(&self) -> impl Iterator<Item = &StorageRef> {
        self.heap.storages().map(|(_, s)| s)
    }

    /// The program's result as a value tree. `input_len` sizes the output budget.
    pub(crate) fn to_value(&self, input_len: usize, resolve: &mut StorageResolver<'_>) -> Result<Value> {
        materialize::to_value(&self.heap, &self.root, input_len, resolve)
    }
}

/// Unpickles data that must not reference storages (legacy headers, key lists).
pub(crate) fn unpickle_plain(data: &[u8]) -> Result<(Value, usize)> {
    let prog = run(data)?;
    let v = prog.to_value(prog.end, &mut |s: &StorageRef| {
        Err(IoError::structure("", format!("unexpected storage reference `{}` in a header pickle", s.key)))
    })?;
    Ok((v, prog.end))
}

/// Reads a pickle of plain data (dicts, lists, tuples, strings, numbers, `None`) — such as a
/// `torch.cuda.memory._dump_snapshot()` file — with the same restricted machine as checkpoints: a
/// global other than the few containers PyTorch uses is refused, nothing is executed. The output
/// may be up to 64 nodes per input byte (memo references to shared frames are legitimate in
/// snapshots); more is refused as [`IoError::LimitExceeded`].
pub fn from_pickle(data: &[u8]) -> Result<Value> {
    let prog = run(data)?;
    let budget = 64 * data.len() as u64 + (1 << 20);
    materialize::to_value_with_budget(&prog.heap, &prog.root, budget, &mut |s: &StorageRef| {
        Err(IoError::structure("", format!("unexpected tensor storage `{}` in a plain-data pickle", s.key)))
    })
}
