//! The file format of ferrite's checkpoints: a whole [`Value`] tree in one safetensors file, written
//! atomically. (What a training checkpoint holds, and why, is [`Checkpoint`](crate::Checkpoint)'s concern.)
//!
//! A training run has to resume from model weights, optimizer moments, loss-scaler state, RNG
//! states and counters together, or not at all. Rather than a pickle (code execution on load) or a
//! directory of files (no atomic replace), a checkpoint is one safetensors file: every tensor of the
//! tree is stored under its path (`model/fc1.weight`, `optimizer/state/0/exp_avg`), and the tree
//! itself — dicts with any keys, lists, tuples, ints, floats (bit-exact, NaN and infinities
//! included), strings, bytes, generator states — is JSON in the `__metadata__` entry
//! `ferrite.checkpoint`, with tensors referenced by name. Any safetensors reader can open the
//! weights; ferrite gets the exact tree back. Saving goes through [`AtomicFile`](crate::AtomicFile).

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;

use serde_json::{Map, Value as Json, json};

use crate::error::{IoError, Result, abbreviate_path};
use crate::raw_tensor::RawTensor;
use crate::safetensors_format::{SafetensorsFile, write_safetensors, write_safetensors_to};
use crate::value::{Value, key_to_string};

/// `__metadata__` key holding the JSON tree.
pub const CHECKPOINT_TREE_KEY: &str = "ferrite.checkpoint";
/// `__metadata__` key holding the encoding version.
pub const CHECKPOINT_VERSION_KEY: &str = "ferrite.checkpoint.version";
const VERSION: &str = "1";

/// Saves `tree` to `path` atomically: either the previous file or the complete new one is there,
/// whatever happens during the call.
pub fn save_checkpoint(path: impl AsRef<Path>, tree: &Value) -> Result<()> {
    let (json, tensors) = encode(tree)?;
    write_safetensors(path, tensors.iter().map(|(n, t)| (n.as_str(), *t)), &tree_metadata(json))
}

/// Streams the checkpoint file for `tree` to `out` (for callers that manage the file themselves,
/// e.g. through an [`AtomicFile`](crate::AtomicFile)).
pub fn write_checkpoint_to(out: &mut impl Write, tree: &Value) -> Result<()> {
    let (json, tensors) = encode(tree)?;
    write_safetensors_to(out, tensors.iter().map(|(n, t)| (n.as_str(), *t)), &tree_metadata(json))
}

fn tree_metadata(json: String) -> BTreeMap<String, String> {
    let mut meta = BTreeMap::new();
    meta.insert(CHECKPOINT_TREE_KEY.to_string(), json);
    meta.insert(CHECKPOINT_VERSION_KEY.to_string(), VERSION.to_string());
    meta
}

/// Splits a tree into its JSON skeleton and its named tensors.
pub(crate) fn encode(tree: &Value) -> Result<(String, Vec<(String, &RawTensor)>)> {
    let mut enc = Encoder { tensors: Vec::new(), names: HashSet::new() };
    let json = enc.encode(tree, &mut Vec::new(), 0)?;
    let text = serde_json::to_string(&json).map_err(|e| IoError::structure("", e.to_string()))?;
    Ok((text, enc.tensors))
}

/// Rebuilds the tree of a ferrite checkpoint from a safetensors file, or `None` if the file is a
/// plain safetensors file.
pub(crate) fn decode(file: SafetensorsFile) -> Result<Option<Value>> {
    let Some(text) = file.metadata.get(CHECKPOINT_TREE_KEY) else {
        return Ok(None);
    };
    if let Some(v) = file.metadata.get(CHECKPOINT_VERSION_KEY)
        && v != VERSION
    {
        return Err(IoError::structure(
            "",
            format!("checkpoint encoding version {v} is newer than this ferrite ({VERSION}); upgrade ferrite"),
        ));
    }
    let json: Json = serde_json::from_str(text)
        .map_err(|e| IoError::structure("", format!("checkpoint tree is not valid JSON: {e}")))?;
    let tensors: std::collections::HashMap<String, RawTensor> = file.tensors.into_iter().collect();
    decode_json(&json, &tensors, &mut Vec::new(), 0).map(Some)
}

struct Encoder<'a> {
    tensors: Vec<(String, &'a RawTensor)>,
    names: HashSet<String>,
}

/// Deepest nesting of JSON arrays and objects that serde_json (and so the reader) parses.
const JSON_DEPTH_LIMIT: usize = 127;

/// Deepest node of a checkpoint tree, counted from the root (depth 0). A dict costs three JSON
/// levels (`{"dict": [[key, value]]}`) and a node at the limit at most two more, so every tree
/// within this bound is written as JSON the reader parses back: saving refuses what loading
/// would. The bound is also what keeps the recursive encoder and decoder safe on a 2 MiB stack
/// in a debug build (tested in `tests/robustness.rs`).
pub(crate) const MAX_DEPTH: usize = (JSON_DEPTH_LIMIT - 2) / 3;

impl<'a> Encoder<'a> {
    fn encode(&mut self, v: &'a Value, path: &mut Vec<String>, depth: usize) -> Result<Json> {
        if depth > MAX_DEPTH {
            return Err(IoError::structure(
                abbreviate_path(path),
                format!(
                    "nests {depth} levels deep, more than the {MAX_DEPTH} a ferrite checkpoint can hold (its tree is stored as JSON, which readers parse to {JSON_DEPTH_LIMIT} levels, and a dict takes three); flatten this entry"
                ),
            ));
        }
        Ok(match v {
            Value::None => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Int(i) => json!(i),
            Value::Float(f) if f.is_finite() => json!(f),
            Value::Float(f) => json!({ "float": f.to_string() }),
            Value::Str(s) => Json::String(s.clone()),
            Value::Bytes(b) => json!({ "bytes": hex(b) }),
            Value::List(items) => Json::Array(self.seq(items, path, depth)?),
            Value::Tuple(items) => json!({ "tuple": self.seq(items, path, depth)? }),
            Value::Dict(items) => {
                let mut pairs = Vec::with_capacity(items.len());
                for (k, val) in items {
                    let kj = self.encode(k, path, depth + 1)?;
                    path.push(key_to_string(k));
                    let vj = self.encode(val, path, depth + 1);
                    path.pop();
                    pairs.push(Json::Array(vec![kj, vj?]));
                }
                json!({ "dict": pairs })
            }
            Value::Tensor(t) => {
                let base = if path.is_empty() { "tensor".to_string() } else { path.join("/") };
                let mut name = base.clone();
                let mut n = 2;
                while !self.names.insert(name.clone()) {
                    name = format!("{base}#{n}");
                    n += 1;
                }
                self.tensors.push((name.clone(), t));
                let mut m = Map::new();
                m.insert("tensor".into(), Json::String(name));
                if t.requires_grad() {
                    m.insert("requires_grad".into(), Json::Bool(true));
                }
                if t.location() != "cpu" {
                    m.insert("device".into(), Json::String(t.location().to_string()));
                }
                Json::Object(m)
            }
        })
    }

    fn seq(&mut self, items: &'a [Value], path: &mut Vec<String>, depth: usize) -> Result<Vec<Json>> {
        let mut out = Vec::with_capacity(items.len());
        for (i, v) in items.iter().enumerate() {
            path.push(i.to_string());
            let r = self.encode(v, path, depth + 1);
            path.pop();
            out.push(r?);
        }
        Ok(out)
    }
}

fn decode_json(
    j: &Json,
    tensors: &std::collections::HashMap<String, RawTensor>,
    path: &mut Vec<String>,
    depth: usize,
) -> Result<Value> {
    let bad = |path: &Vec<String>, why: &str| {
        IoError::structure(abbreviate_path(path), format!("malformed checkpoint tree: {why}"))
    };
    if depth > MAX_DEPTH {
        return Err(IoError::too_deep(path, depth, MAX_DEPTH));
    }
    let seq = |items: &Vec<Json>, path: &mut Vec<String>| -> Result<Vec<Value>> {
        let mut out = Vec::with_capacity(items.len());
        for (i, x) in items.iter().enumerate() {
            path.push(i.to_string());
            let r = decode_json(x, tensors, path, depth + 1);
            path.pop();
            out.push(r?);
        }
        Ok(out)
    };
    Ok(match j {
        Json::Null => Value::None,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) if !n.is_f64() => Value::Int(i),
            (_, Some(f)) => Value::Float(f),
            _ => return Err(bad(path, "number out of range")),
        },
        Json::String(s) => Value::Str(s.clone()),
        Json::Array(items) => Value::List(seq(items, path)?),
        Json::Object(m) => {
            if let Some(Json::String(name)) = m.get("tensor") {
                let mut t = tensors.get(name).cloned().ok_or_else(|| IoError::MissingStorage { key: name.clone() })?;
                t.set_requires_grad(m.get("requires_grad") == Some(&Json::Bool(true)));
                if let Some(Json::String(device)) = m.get("device") {
                    t.set_location(device.clone());
                }
                Value::Tensor(t)
            } else if let Some(Json::Array(items)) = m.get("tuple") {
                Value::Tuple(seq(items, path)?)
            } else if let Some(Json::Array(pairs)) = m.get("dict") {
                let mut out = Vec::with_capacity(pairs.len());
                for p in pairs {
                    let Json::Array(kv) = p else { return Err(bad(path, "dict entry is not a pair")) };
                    let [k, v] = kv.as_slice() else { return Err(bad(path, "dict entry is not a pair")) };
                    let key = decode_json(k, tensors, path, depth + 1)?;
                    path.push(key_to_string(&key));
                    let val = decode_json(v, tensors, path, depth + 1);
                    path.pop();
                    out.push((key, val?));
                }
                Value::Dict(out)
            } else if let Some(Json::String(f)) = m.get("float") {
                Value::Float(f.parse().map_err(|_| bad(path, "bad float"))?)
            } else if let Some(Json::String(h)) = m.get("bytes") {
                Value::Bytes(unhex(h).ok_or_else(|| bad(path, "bad hex bytes"))?)
            } else {
                return Err(bad(path, "unknown object"));
            }
        }
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|p| u8::from_str_radix(p, 16).ok())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors_format::read_safetensors;

    fn sample_tree() -> Value {
        let w = RawTensor::from_values(vec![2, 2], &[1.0f32, -2.0, 3.5, 4.25]).unwrap();
        let mut p =
            RawTensor::from_values(vec![3], &[half::bf16::from_f32(0.5), half::bf16::ONE, half::bf16::MAX]).unwrap();
        p.set_requires_grad(true);
        p.set_location("sim:a100-40gb:1");
        let mut model = Value::dict();
        model.insert("fc.weight", w.clone()).unwrap();
        model.insert("fc.bias", p).unwrap();
        let mut state0 = Value::dict();
        state0.insert("step", 7i64).unwrap();
        state0.insert("exp_avg", w).unwrap();
        let mut state = Value::dict();
        state.insert(0i64, state0).unwrap();
        let mut root = Value::dict();
        root.insert("model", model).unwrap();
        root.insert("optimizer", state).unwrap();
        root.insert("epoch", 3i64).unwrap();
        root.insert("loss", 1.25f64).unwrap();
        root.insert("scale", f64::INFINITY).unwrap();
        root.insert("nan", f64::NAN).unwrap();
        root.insert("neg_zero", -0.0f64).unwrap();
        root.insert("tiny", f64::MIN_POSITIVE / 3.0).unwrap();
        root.insert("big", i64::MIN).unwrap();
        root.insert("betas", Value::Tuple(vec![0.9.into(), 0.999.into()])).unwrap();
        root.insert("rng", ferrite_tensor::GeneratorState { seed: 42, word_pos: 1 << 100 }).unwrap();
        root.insert("flags", vec![Value::Bool(true), Value::None, Value::from("x")]).unwrap();
        root
    }

    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
            (Value::Dict(x), Value::Dict(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|((k1, v1), (k2, v2))| same(k1, k2) && same(v1, v2))
            }
            (Value::List(x), Value::List(y)) | (Value::Tuple(x), Value::Tuple(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
            }
            _ => a == b,
        }
    }

    #[test]
    fn tree_round_trips_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ckpt.safetensors");
        let tree = sample_tree();
        save_checkpoint(&path, &tree).unwrap();
        let file = read_safetensors(&path).unwrap();
        let names: Vec<&str> = file.tensors.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"model/fc.weight") && names.contains(&"optimizer/0/exp_avg"), "{names:?}");
        let back = decode(file).unwrap().unwrap();
        assert!(same(&tree, &back), "{tree:#?}\n!=\n{back:#?}");
        let bias = back.at("model/fc.bias").and_then(Value::as_tensor).unwrap();
        assert!(bias.requires_grad() && bias.location() == "sim:a100-40gb:1");
        assert_eq!(back.at("model/fc.weight").and_then(Value::as_tensor).unwrap().location(), "cpu");
        assert_eq!(back.at("rng").and_then(Value::as_generator_state).unwrap().word_pos, 1 << 100);
    }

    proptest::proptest! {
        /// Every f64 bit pattern and i64 survives the JSON tree (serde_json's `float_roundtrip`
        /// parsing is required for this; the default parser is off by an ulp on some values).
        #[test]
        fn numbers_round_trip_bit_exactly(bits in proptest::prelude::any::<u64>(), i in proptest::prelude::any::<i64>()) {
            let f = f64::from_bits(bits);
            let mut tree = Value::dict();
            tree.insert("f", f).unwrap();
            tree.insert("i", i).unwrap();
            let (json, _) = encode(&tree).unwrap();
            let mut meta = BTreeMap::new();
            meta.insert(CHECKPOINT_TREE_KEY.to_string(), json);
            let back = decode(SafetensorsFile { tensors: Vec::new(), metadata: meta }).unwrap().unwrap();
            let g = back.get("f").and_then(Value::as_float).unwrap();
            proptest::prop_assert!(g.to_bits() == f.to_bits() || (f.is_nan() && g.is_nan()), "{f:e} came back as {g:e}");
            proptest::prop_assert_eq!(back.get("i"), Some(&Value::Int(i)));
        }
    }

    #[test]
    fn malformed_trees_are_typed_errors() {
        for bad in [
            r#"{"tensor": "nope"}"#,
            r#"{"what": 1}"#,
            r#"{"dict": [[1]]}"#,
            r#"{"bytes": "zz"}"#,
            "[[[[",
            r#"{"float": "x"}"#,
        ] {
            let mut meta = BTreeMap::new();
            meta.insert(CHECKPOINT_TREE_KEY.to_string(), bad.to_string());
            let file = SafetensorsFile { tensors: Vec::new(), metadata: meta };
            assert!(decode(file).is_err(), "{bad}");
        }
        let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
        let mut meta = BTreeMap::new();
        meta.insert(CHECKPOINT_TREE_KEY.to_string(), deep);
        assert!(decode(SafetensorsFile { tensors: Vec::new(), metadata: meta }).is_err());
    }
}
