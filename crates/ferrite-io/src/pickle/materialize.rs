//! Turning the machine's heap into a [`Value`] tree, with storages resolved to bytes.
//!
//! Memo references let a few bytes of pickle refer to a large subtree many times, so the output
//! size is metered (a budget proportional to the input) and nesting depth is bounded: a hostile
//! file gets a `LimitExceeded` error instead of exhausting memory or the stack.

use std::collections::HashMap;

use bytes::Bytes;

use super::heap::{Container, Heap, Obj, StorageRef};
use crate::error::{IoError, Result};
use crate::raw_tensor::RawTensor;
use crate::value::{Value, key_to_string};

/// Deepest nesting accepted in a checkpoint tree.
pub(crate) const MAX_DEPTH: usize = 200;

/// Fetches the bytes of a root storage (`StorageRef::key`), exactly `numel * element size` long.
pub(crate) type StorageResolver<'r> = dyn FnMut(&StorageRef) -> Result<Bytes> + 'r;

/// Converts `root` to a `Value`, resolving every storage through `resolve`.
pub(crate) fn to_value(heap: &Heap, root: &Obj, input_len: usize, resolve: &mut StorageResolver<'_>) -> Result<Value> {
    let mut m = Materializer {
        heap,
        resolve,
        storages: HashMap::new(),
        budget: 4 * input_len as u64 + 100_000,
        initial_budget: 4 * input_len as u64 + 100_000,
        path: Vec::new(),
    };
    m.value(root, 0)
}

struct Materializer<'h, 'r, 'f> {
    heap: &'h Heap,
    resolve: &'r mut StorageResolver<'f>,
    /// Resolved storage bytes by heap id (a storage shared by many views is fetched once).
    storages: HashMap<usize, Bytes>,
    budget: u64,
    initial_budget: u64,
    path: Vec<String>,
}

impl Materializer<'_, '_, '_> {
    fn spend(&mut self, units: u64) -> Result<()> {
        if units > self.budget {
            return Err(IoError::LimitExceeded {
                what: "size of the unpickled object tree (memo references used to amplify it)".to_string(),
                limit: self.initial_budget,
            });
        }
        self.budget -= units;
        Ok(())
    }

    fn path(&self) -> String {
        self.path.join("/")
    }

    fn value(&mut self, o: &Obj, depth: usize) -> Result<Value> {
        if depth > MAX_DEPTH {
            return Err(IoError::LimitExceeded { what: format!("nesting depth at `{}`", self.path()), limit: MAX_DEPTH as u64 });
        }
        self.spend(1)?;
        Ok(match o {
            Obj::None => Value::None,
            Obj::Bool(b) => Value::Bool(*b),
            Obj::Int(i) => Value::Int(*i),
            Obj::Float(f) => Value::Float(*f),
            Obj::Str(s) => {
                self.spend(s.len() as u64 / 16)?;
                Value::Str(s.to_string())
            }
            Obj::Bytes(b) => {
                self.spend(b.len() as u64 / 16)?;
                Value::Bytes(b.to_vec())
            }
            Obj::Global(g) => match g {
                super::heap::Global::TorchDtype(name) => Value::Str(format!("torch.{name}")),
                other => {
                    return Err(IoError::structure(self.path(), format!("a bare reference to {other:?} is not a value")));
                }
            },
            Obj::Ref(id) => self.container(*id, depth)?,
        })
    }

    fn seq(&mut self, items: &[Obj], depth: usize) -> Result<Vec<Value>> {
        let mut out = Vec::with_capacity(items.len().min(1 << 16));
        for (i, o) in items.iter().enumerate() {
            self.path.push(i.to_string());
            let v = self.value(o, depth + 1);
            self.path.pop();
            out.push(v?);
        }
        Ok(out)
    }

    fn container(&mut self, id: usize, depth: usize) -> Result<Value> {
        let heap = self.heap;
        let Some(c) = heap.get(id) else {
            return Err(IoError::structure(self.path(), "dangling object reference"));
        };
        Ok(match c {
            Container::Tuple(items) => Value::Tuple(self.seq(items, depth)?),
            Container::List(items) | Container::Set(items) => Value::List(self.seq(items, depth)?),
            Container::Dict(d) => {
                let mut out = Vec::with_capacity(d.items.len().min(1 << 16));
                for (k, v) in &d.items {
                    let key = self.value(k, depth + 1)?;
                    self.path.push(key_to_string(&key));
                    let val = self.value(v, depth + 1);
                    self.path.pop();
                    out.push((key, val?));
                }
                Value::Dict(out)
            }
            Container::Storage(_) => {
                return Err(IoError::structure(self.path(), "a bare storage (not wrapped in a tensor) is not supported"));
            }
            Container::Tensor(spec) => {
                self.spend(spec.shape.len() as u64 * 2)?;
                let Some(Container::Storage(sref)) = heap.get(spec.storage) else {
                    return Err(IoError::structure(self.path(), "tensor without a storage"));
                };
                let name = Some(self.path());
                let dtype = sref.dtype.map_err(|d| IoError::UnsupportedDType { dtype: d.to_string(), name: name.clone() })?;
                let bytes = self.storage_bytes(spec.storage, sref)?;
                let mut t = RawTensor::new(dtype, spec.shape.clone(), spec.strides.clone(), spec.offset, bytes).map_err(|e| match e {
                    IoError::ShapeStorageMismatch { shape, strides, offset, needed, available, .. } => {
                        IoError::ShapeStorageMismatch { name: name.clone(), shape, strides, offset, needed, available }
                    }
                    other => other,
                })?;
                t.set_requires_grad(spec.requires_grad);
                t.set_location(sref.location.clone());
                Value::Tensor(t)
            }
        })
    }

    fn storage_bytes(&mut self, id: usize, sref: &StorageRef) -> Result<Bytes> {
        if let Some(b) = self.storages.get(&id) {
            return Ok(b.clone());
        }
        let root = (self.resolve)(sref)?;
        let bytes = match sref.view {
            None => root,
            Some((off, len)) => {
                let es = sref.dtype.map(|d| d.size_in_bytes()).unwrap_or(1) as u128;
                let (start, end) = (off as u128 * es, (off as u128 + len as u128) * es);
                if end > root.len() as u128 {
                    return Err(IoError::SizeExceedsData {
                        what: format!("storage view `{}` (elements {off}..{})", sref.key, off as u128 + len as u128),
                        claimed: end,
                        available: root.len() as u128,
                    });
                }
                root.slice(start as usize..end as usize)
            }
        };
        self.storages.insert(id, bytes.clone());
        Ok(bytes)
    }
}
