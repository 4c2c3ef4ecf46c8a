//! Turning the machine's heap into a [`Value`] tree, with storages resolved to bytes.
//!
//! Memo references let a few bytes of pickle refer to a large subtree many times, so the output
//! size is metered (a budget proportional to the input) and nesting depth is bounded: a hostile
//! file gets a `LimitExceeded` error instead of exhausting memory. The walk keeps its own stack of
//! open containers instead of recursing, so the Rust stack it needs does not grow with the
//! nesting of the file, whatever the build profile or the caller's thread stack size.

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
    to_value_with_budget(heap, root, 4 * input_len as u64 + 100_000, resolve)
}

/// [`to_value`] with an explicit output budget (nodes of the tree), for data whose memo sharing is
/// legitimately heavy (a memory snapshot refers to the same stack frames thousands of times).
pub(crate) fn to_value_with_budget(
    heap: &Heap,
    root: &Obj,
    budget: u64,
    resolve: &mut StorageResolver<'_>,
) -> Result<Value> {
    let mut m =
        Materializer { heap, resolve, storages: HashMap::new(), budget, initial_budget: budget, path: Vec::new() };
    m.run(root)
}

struct Materializer<'h, 'r, 'f> {
    heap: &'h Heap,
    resolve: &'r mut StorageResolver<'f>,
    /// Resolved storage bytes by heap id (a storage shared by many views is fetched once).
    storages: HashMap<usize, Bytes>,
    budget: u64,
    initial_budget: u64,
    /// Keys and indices from the root to the node being converted (for error messages).
    path: Vec<String>,
}

/// What converting one object gives: a finished value, or a container whose children come next.
enum Node<'h> {
    Done(Value),
    Open(Frame<'h>),
}

/// A container being filled, on the materialiser's own stack.
enum Frame<'h> {
    Seq {
        tuple: bool,
        items: &'h [Obj],
        out: Vec<Value>,
    },
    /// `key` is the converted key of `items[out.len()]` while its value is being converted.
    Dict {
        items: &'h [(Obj, Obj)],
        out: Vec<(Value, Value)>,
        key: Option<Value>,
    },
}

impl<'h> Frame<'h> {
    /// The next object to convert, pushing its path segment; `None` when the container is full.
    fn next_child(&self, path: &mut Vec<String>) -> Option<&'h Obj> {
        match self {
            Frame::Seq { items, out, .. } => {
                let child = items.get(out.len())?;
                path.push(out.len().to_string());
                Some(child)
            }
            Frame::Dict { items, out, key } => {
                let (k, v) = items.get(out.len())?;
                // A key is converted at the dict's own path; its value under the key's name.
                Some(if key.is_some() { v } else { k })
            }
        }
    }

    /// Takes the converted child that [`next_child`](Self::next_child) asked for.
    fn accept(&mut self, v: Value, path: &mut Vec<String>) {
        match self {
            Frame::Seq { out, .. } => {
                path.pop();
                out.push(v);
            }
            Frame::Dict { out, key, .. } => match key.take() {
                None => {
                    path.push(key_to_string(&v));
                    *key = Some(v);
                }
                Some(k) => {
                    path.pop();
                    out.push((k, v));
                }
            },
        }
    }

    fn finish(self) -> Value {
        match self {
            Frame::Seq { tuple: true, out, .. } => Value::Tuple(out),
            Frame::Seq { tuple: false, out, .. } => Value::List(out),
            Frame::Dict { out, .. } => Value::Dict(out),
        }
    }
}

impl<'h> Materializer<'h, '_, '_> {
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

    /// Depth-first conversion with an explicit stack of open containers.
    fn run(&mut self, root: &'h Obj) -> Result<Value> {
        let mut stack: Vec<Frame<'h>> = match self.node(root, 0)? {
            Node::Done(v) => return Ok(v),
            Node::Open(f) => vec![f],
        };
        while let Some(top) = stack.last() {
            match top.next_child(&mut self.path) {
                Some(child) => match self.node(child, stack.len())? {
                    Node::Open(f) => stack.push(f),
                    Node::Done(v) => {
                        if let Some(top) = stack.last_mut() {
                            top.accept(v, &mut self.path);
                        }
                    }
                },
                None => {
                    let Some(full) = stack.pop() else { break };
                    let v = full.finish();
                    match stack.last_mut() {
                        Some(parent) => parent.accept(v, &mut self.path),
                        None => return Ok(v),
                    }
                }
            }
        }
        Err(IoError::structure(self.path(), "internal error: the object tree ended without a root"))
    }

    /// Converts a scalar or tensor, or opens a container; `depth` is the number of open ancestors.
    fn node(&mut self, o: &'h Obj, depth: usize) -> Result<Node<'h>> {
        if depth > MAX_DEPTH {
            return Err(IoError::too_deep(&self.path, depth, MAX_DEPTH));
        }
        self.spend(1)?;
        Ok(Node::Done(match o {
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
                    return Err(IoError::structure(
                        self.path(),
                        format!("a bare reference to {other:?} is not a value"),
                    ));
                }
            },
            Obj::Ref(id) => return self.container(*id),
        }))
    }

    fn container(&mut self, id: usize) -> Result<Node<'h>> {
        let heap = self.heap;
        let Some(c) = heap.get(id) else {
            return Err(IoError::structure(self.path(), "dangling object reference"));
        };
        let cap = |n: usize| n.min(1 << 16);
        Ok(match c {
            Container::Tuple(items) => {
                Node::Open(Frame::Seq { tuple: true, items, out: Vec::with_capacity(cap(items.len())) })
            }
            Container::List(items) | Container::Set(items) => {
                Node::Open(Frame::Seq { tuple: false, items, out: Vec::with_capacity(cap(items.len())) })
            }
            Container::Dict(d) => {
                Node::Open(Frame::Dict { items: &d.items, out: Vec::with_capacity(cap(d.items.len())), key: None })
            }
            Container::Storage(_) => {
                return Err(IoError::structure(
                    self.path(),
                    "a bare storage (not wrapped in a tensor) is not supported",
                ));
            }
            Container::Tensor(spec) => {
                self.spend(spec.shape.len() as u64 * 2)?;
                let Some(Container::Storage(sref)) = heap.get(spec.storage) else {
                    return Err(IoError::structure(self.path(), "tensor without a storage"));
                };
                let name = Some(self.path());
                let dtype =
                    sref.dtype.map_err(|d| IoError::UnsupportedDType { dtype: d.to_string(), name: name.clone() })?;
                let bytes = self.storage_bytes(spec.storage, sref)?;
                let mut t = RawTensor::new(dtype, spec.shape.clone(), spec.strides.clone(), spec.offset, bytes)
                    .map_err(|e| match e {
                        IoError::ShapeStorageMismatch { shape, strides, offset, needed, available, .. } => {
                            IoError::ShapeStorageMismatch {
                                name: name.clone(),
                                shape,
                                strides,
                                offset,
                                needed,
                                available,
                            }
                        }
                        other => other,
                    })?;
                t.set_requires_grad(spec.requires_grad);
                t.set_location(sref.location.clone());
                Node::Done(Value::Tensor(t))
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
