//! The tree a checkpoint holds: dicts, lists, numbers, strings and tensors.
//!
//! A PyTorch training checkpoint is a nested dict (`{"epoch": 3, "model": {...}, "optimizer":
//! {"state": {0: {...}}, "param_groups": [...]}}`) and ferrite's own training checkpoints have the
//! same shape, so both readers and the checkpoint writer speak this one type. Dicts keep insertion
//! order and allow non-string keys (optimizer state is keyed by parameter index).

use ferrite_tensor::GeneratorState;

use crate::error::{IoError, Result};
use crate::raw_tensor::RawTensor;

/// One node of a checkpoint tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    /// Insertion-ordered key/value pairs; keys are unique.
    Dict(Vec<(Value, Value)>),
    Tensor(RawTensor),
}

/// A key in a dict path: `model`, `0`, …
pub(crate) fn key_to_string(key: &Value) -> String {
    match key {
        Value::Str(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::None => "None".to_string(),
        Value::Float(f) => f.to_string(),
        other => format!("{other:?}"),
    }
}

impl Value {
    /// Short name of the variant, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Tensor(_) => "tensor",
        }
    }

    /// An empty dict.
    pub fn dict() -> Value {
        Value::Dict(Vec::new())
    }

    /// Looks up a string key in a dict (`None` for other kinds or a missing key).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(items) => items.iter().find(|(k, _)| matches!(k, Value::Str(s) if s == key)).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Looks up an integer key in a dict, or an index in a list/tuple.
    pub fn get_index(&self, index: i64) -> Option<&Value> {
        match self {
            Value::Dict(items) => items.iter().find(|(k, _)| matches!(k, Value::Int(i) if *i == index)).map(|(_, v)| v),
            Value::List(v) | Value::Tuple(v) => usize::try_from(index).ok().and_then(|i| v.get(i)),
            _ => None,
        }
    }

    /// Follows a `/`-separated path of keys and indices: `"optimizer/state/0/exp_avg"`.
    pub fn at(&self, path: &str) -> Option<&Value> {
        let mut cur = self;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            cur = match cur.get(part) {
                Some(v) => v,
                None => cur.get_index(part.parse().ok()?)?,
            };
        }
        Some(cur)
    }

    /// Like [`at`](Self::at) but with an error naming the path.
    pub fn require(&self, path: &str) -> Result<&Value> {
        self.at(path).ok_or_else(|| IoError::structure(path, "not found in the checkpoint"))
    }

    /// Inserts or replaces `key` in a dict. Fails (with the kind found) if `self` is not a dict.
    pub fn insert(&mut self, key: impl Into<Value>, value: impl Into<Value>) -> Result<()> {
        let key = key.into();
        let value = value.into();
        match self {
            Value::Dict(items) => {
                if let Some(slot) = items.iter_mut().find(|(k, _)| *k == key) {
                    slot.1 = value;
                } else {
                    items.push((key, value));
                }
                Ok(())
            }
            other => Err(IoError::structure(key_to_string(&key), format!("cannot insert into a {}", other.kind()))),
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }
    /// Floats, and ints converted to float (PyTorch stores `lr=1` as an int).
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_tensor(&self) -> Option<&RawTensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }
    pub fn as_dict(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }
    pub fn as_list(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// Reads back a generator state stored with `Value::from(GeneratorState)`.
    pub fn as_generator_state(&self) -> Option<GeneratorState> {
        match self {
            Value::Bytes(b) => GeneratorState::from_bytes(b),
            _ => None,
        }
    }

    /// Every tensor in the tree with its `/`-joined path, depth first in insertion order.
    pub fn tensors(&self) -> Vec<(String, &RawTensor)> {
        let mut out = Vec::new();
        self.walk(|path, v| {
            if let Value::Tensor(t) = v {
                out.push((path.join("/"), t));
            }
            true
        });
        out
    }

    /// Calls `f(path, node)` for every node, parents before children, in insertion order. `path`
    /// holds the keys and indices from the root (empty for the root; `["optimizer", "state", "0"]`
    /// below it; keys as text). `f` returns whether to visit the node's children.
    ///
    /// Why not a recursive walk: a tree read from a file nests as deep as the file says (up to
    /// the readers' limit), and this walk's stack lives on the heap, so it is safe on any thread
    /// in any build profile; the path is kept incrementally, so a walk costs time linear in the
    /// size of the tree whatever its depth.
    pub fn walk<'a>(&'a self, mut f: impl FnMut(&[String], &'a Value) -> bool) {
        let mut path: Vec<String> = Vec::new();
        // (segments in the node's path, its last segment, the node)
        let mut stack: Vec<(usize, Option<String>, &'a Value)> = vec![(0, None, self)];
        while let Some((depth, key, v)) = stack.pop() {
            path.truncate(depth.saturating_sub(1));
            path.extend(key);
            if !f(&path, v) {
                continue;
            }
            match v {
                Value::Dict(items) => {
                    stack.extend(items.iter().rev().map(|(k, c)| (depth + 1, Some(key_to_string(k)), c)))
                }
                Value::List(items) | Value::Tuple(items) => {
                    stack.extend(items.iter().enumerate().rev().map(|(i, c)| (depth + 1, Some(i.to_string()), c)))
                }
                _ => {}
            }
        }
    }

    /// Calls `f` on every node, parents before children (so `f` may change a node's children
    /// before they are visited). Iterative, like [`walk`](Self::walk). Dict keys are not visited.
    pub fn walk_mut(&mut self, mut f: impl FnMut(&mut Value)) {
        let mut stack: Vec<&mut Value> = vec![self];
        while let Some(v) = stack.pop() {
            f(v);
            match v {
                Value::Dict(items) => stack.extend(items.iter_mut().rev().map(|(_, c)| c)),
                Value::List(items) | Value::Tuple(items) => stack.extend(items.iter_mut().rev()),
                _ => {}
            }
        }
    }

    /// Whether this node can hold other nodes.
    fn is_container(&self) -> bool {
        matches!(self, Value::List(_) | Value::Tuple(_) | Value::Dict(_))
    }

    /// Moves this node's children (keys included) onto `out`, leaving it empty.
    fn take_children(&mut self, out: &mut Vec<Value>) {
        match self {
            Value::List(items) | Value::Tuple(items) => out.append(items),
            Value::Dict(items) => {
                for (k, v) in items.drain(..) {
                    out.push(k);
                    out.push(v);
                }
            }
            _ => {}
        }
    }
}

/// Dropping is iterative: the compiler's drop glue would recurse once per nesting level, and a
/// tree as deep as a file may make it (or one a program builds) must not overflow the stack when
/// it is freed — in particular on a debug build's small-stacked threads.
impl Drop for Value {
    fn drop(&mut self) {
        let nested = match self {
            Value::List(items) | Value::Tuple(items) => items.iter().any(Value::is_container),
            Value::Dict(items) => items.iter().any(|(k, v)| k.is_container() || v.is_container()),
            _ => false,
        };
        if !nested {
            return; // leaves and flat containers: the drop glue goes one level down only
        }
        let mut pending = Vec::new();
        self.take_children(&mut pending);
        while let Some(mut v) = pending.pop() {
            v.take_children(&mut pending);
            // `v` is now childless; its own drop ends here.
        }
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Value {
        Value::Int(v as i64)
    }
}
impl From<usize> for Value {
    /// Saturates at `i64::MAX` (no step counter gets there).
    fn from(v: usize) -> Value {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}
impl From<f32> for Value {
    fn from(v: f32) -> Value {
        Value::Float(v as f64)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Str(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Str(v)
    }
}
impl From<RawTensor> for Value {
    fn from(v: RawTensor) -> Value {
        Value::Tensor(v)
    }
}
impl From<Vec<Value>> for Value {
    fn from(v: Vec<Value>) -> Value {
        Value::List(v)
    }
}
impl From<GeneratorState> for Value {
    /// Stored as its exact 24-byte encoding; read back with [`Value::as_generator_state`].
    fn from(s: GeneratorState) -> Value {
        Value::Bytes(s.to_bytes().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn navigation_by_path() {
        let mut opt_state = Value::dict();
        opt_state.insert(0i64, Value::Float(0.5)).unwrap();
        let mut root = Value::dict();
        root.insert("epoch", 3i64).unwrap();
        root.insert("state", opt_state).unwrap();
        root.insert("groups", vec![Value::from("a"), Value::from(1.5)]).unwrap();
        assert_eq!(root.at("epoch").and_then(Value::as_int), Some(3));
        assert_eq!(root.at("state/0").and_then(Value::as_float), Some(0.5));
        assert_eq!(root.at("groups/1").and_then(Value::as_float), Some(1.5));
        assert!(root.at("state/1").is_none());
        assert!(root.require("nope/x").unwrap_err().to_string().contains("nope/x"));
        root.insert("epoch", 4i64).unwrap();
        assert_eq!(root.get("epoch"), Some(&Value::Int(4)));
        assert!(Value::Int(1).insert("a", 1i64).is_err());
    }

    fn nested(depth: usize) -> Value {
        let mut v = Value::Int(1);
        for i in 0..depth {
            v = match i % 3 {
                0 => Value::List(vec![v, Value::None]),
                1 => Value::Tuple(vec![v]),
                _ => {
                    let mut d = Value::dict();
                    d.insert("k", v).unwrap();
                    d
                }
            };
        }
        v
    }

    #[test]
    fn deep_trees_walk_and_drop_without_recursion() {
        // Far deeper than any reader accepts: only an iterative walk and drop survive this on a
        // 256 KiB stack.
        let worker = std::thread::Builder::new().stack_size(256 << 10);
        let handle = worker
            .spawn(|| {
                let mut v = nested(300_000);
                let mut nodes = 0usize;
                v.walk(|_, _| {
                    nodes += 1;
                    true
                });
                v.walk_mut(|n| {
                    if let Value::Int(i) = n {
                        *i = 2
                    }
                });
                drop(v);
                nodes
            })
            .unwrap();
        assert_eq!(handle.join().unwrap(), 300_000 + 1 + 100_000);
    }

    #[test]
    fn walk_paths_and_order() {
        let t = RawTensor::from_values(vec![1], &[1.0f32]).unwrap();
        let mut inner = Value::dict();
        inner.insert(0i64, t.clone()).unwrap();
        let mut root = Value::dict();
        root.insert("a", t.clone()).unwrap();
        root.insert("b", vec![Value::Int(3), inner]).unwrap();
        root.insert("c", t).unwrap();
        let names: Vec<String> = root.tensors().into_iter().map(|(p, _)| p).collect();
        assert_eq!(names, ["a", "b/1/0", "c"]);
        let mut paths = Vec::new();
        root.walk(|p, v| {
            paths.push(p.join("/"));
            !matches!(v, Value::List(_))
        });
        assert_eq!(paths, ["", "a", "b", "c"]);
    }

    #[test]
    fn generator_state_round_trips() {
        let s = GeneratorState { seed: u64::MAX, word_pos: u128::MAX - 3 };
        assert_eq!(Value::from(s).as_generator_state(), Some(s));
    }
}
