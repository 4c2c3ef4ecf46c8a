//! The training checkpoint a trainer writes and resumes from: everything in one atomic file.
//!
//! Resuming must continue bit-identically, so a checkpoint carries all state a step depends on —
//! model weights, optimizer moments and step counts, the GradScaler's scale and growth tracker,
//! every RNG state (exactly, as [`GeneratorState`]s), epoch, step, learning-rate schedule — and
//! carries it exactly (floats bit-for-bit, tensors byte-for-byte). A `Checkpoint` is a tree of
//! named entries addressed by `/`-separated paths (`model`, `optimizer/state/0/exp_avg`,
//! `rng/data_loader`); it is saved as one safetensors file through an atomic replace (see
//! [`save_checkpoint`](crate::save_checkpoint)), so a crash during a save leaves the previous
//! checkpoint loadable. Reading also accepts PyTorch training checkpoints (`.pt`), so a run can
//! start from PyTorch's weights and optimizer state.

use std::path::Path;

use ferrite_tensor::{Generator, GeneratorState, Tensor};

use crate::checkpoint_format::save_checkpoint;
use crate::error::{IoError, Result};
use crate::load_options::LoadOptions;
use crate::raw_tensor::RawTensor;
use crate::read::read;
use crate::state_dict::state_dict_from_value;
use crate::tensor_loader::TensorLoader;
use crate::tensor_state_dict::{TensorStateDict, state_dict_to_tensors};
use crate::value::Value;

/// A training checkpoint under construction or read back.
///
/// ```
/// use ferrite_io::{Checkpoint, LoadOptions};
/// use ferrite_memory::Device;
/// use ferrite_tensor::{Generator, Tensor};
/// # fn main() -> Result<(), ferrite_io::IoError> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("last.ckpt");
/// let w = Tensor::from_vec(vec![0.5f32, -1.0], &[2], &Device::Cpu)?;
/// let mut rng = Generator::new(7);
/// let mut ckpt = Checkpoint::new();
/// ckpt.set_state_dict("model", [("fc.weight", &w)])?;
/// ckpt.set("epoch", 3i64)?;
/// ckpt.set("scaler/scale", 65536.0)?;
/// ckpt.set_generator("rng/data", &rng)?;
/// ckpt.save(&path)?;                              // atomic
///
/// let back = Checkpoint::load(&path)?;
/// assert_eq!(back.int("epoch")?, 3);
/// let model = back.state_dict("model", &LoadOptions::new())?;
/// assert_eq!(model[0].1.to_vec::<f32>()?, vec![0.5, -1.0]);
/// let mut resumed = Generator::new(0);
/// back.restore_generator("rng/data", &mut resumed)?;
/// assert_eq!(resumed.next_u64(), rng.next_u64());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    tree: Value,
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint::new()
    }
}

impl Checkpoint {
    /// An empty checkpoint (a dict at the root).
    pub fn new() -> Checkpoint {
        Checkpoint { tree: Value::dict() }
    }

    /// Wraps a tree (its root must be a dict, as every training checkpoint's is).
    pub fn from_value(tree: Value) -> Result<Checkpoint> {
        match tree {
            Value::Dict(_) => Ok(Checkpoint { tree }),
            other => Err(IoError::structure(
                "",
                format!("a training checkpoint is a dict at its root, this is a {}", other.kind()),
            )),
        }
    }

    /// Reads a ferrite checkpoint or a PyTorch training checkpoint (`.pt`, weights-only).
    pub fn load(path: impl AsRef<Path>) -> Result<Checkpoint> {
        Checkpoint::from_value(read(path)?)
    }

    /// Writes the checkpoint atomically: afterwards `path` holds either the previous file or this
    /// complete checkpoint, whatever happened during the call.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        save_checkpoint(path, &self.tree)
    }

    pub fn tree(&self) -> &Value {
        &self.tree
    }

    pub fn into_tree(self) -> Value {
        self.tree
    }

    // ------------------------------------------------------------------ writing

    /// Sets the entry at `path` (creating dicts along the way), replacing what was there.
    pub fn set(&mut self, path: &str, value: impl Into<Value>) -> Result<()> {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let Some((last, parents)) = parts.split_last() else {
            return Err(IoError::structure(path, "an entry needs a non-empty path"));
        };
        let mut node = &mut self.tree;
        for (i, part) in parents.iter().enumerate() {
            let Value::Dict(items) = node else {
                return Err(IoError::structure(
                    parts[..i].join("/"),
                    format!("is a {}, not a dict, so `{path}` cannot be set", node.kind()),
                ));
            };
            let idx = match items.iter().position(|(k, _)| matches!(k, Value::Str(s) if s == part)) {
                Some(idx) => idx,
                None => {
                    items.push((Value::from(*part), Value::dict()));
                    items.len() - 1
                }
            };
            node = &mut items[idx].1;
        }
        node.insert(*last, value).map_err(|_| {
            IoError::structure(
                parents.join("/"),
                format!("is a {}, not a dict, so `{path}` cannot be set", node.kind()),
            )
        })
    }

    /// Stores a host copy of `tensor` at `path` (dtype, shape, values, `requires_grad`, device).
    pub fn set_tensor(&mut self, path: &str, tensor: &Tensor) -> Result<()> {
        self.set(path, RawTensor::from_tensor(tensor)?)
    }

    /// Stores named tensors as a state_dict (a dict name → tensor) at `path`. Names are keys, not
    /// paths: `encoder.layers.0.weight` stays one key.
    pub fn set_state_dict<'a>(
        &mut self,
        path: &str,
        tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
    ) -> Result<()> {
        let mut sd = Value::dict();
        for (name, t) in tensors {
            sd.insert(name, RawTensor::from_tensor(t)?)?;
        }
        self.set(path, sd)
    }

    /// Stores the exact state of `generator` (seed and stream position).
    pub fn set_generator(&mut self, path: &str, generator: &Generator) -> Result<()> {
        self.set(path, generator.state())
    }

    // ------------------------------------------------------------------ reading

    /// The entry at `path`, if present.
    pub fn get(&self, path: &str) -> Option<&Value> {
        self.tree.at(path)
    }

    /// The entry at `path`, or an error naming the path.
    pub fn require(&self, path: &str) -> Result<&Value> {
        self.tree.require(path)
    }

    pub fn int(&self, path: &str) -> Result<i64> {
        let v = self.require(path)?;
        v.as_int().ok_or_else(|| wrong_kind(path, "an int", v))
    }

    /// A float (ints are accepted: PyTorch stores `lr=1` as an int).
    pub fn float(&self, path: &str) -> Result<f64> {
        let v = self.require(path)?;
        v.as_float().ok_or_else(|| wrong_kind(path, "a float", v))
    }

    pub fn bool(&self, path: &str) -> Result<bool> {
        let v = self.require(path)?;
        v.as_bool().ok_or_else(|| wrong_kind(path, "a bool", v))
    }

    pub fn str(&self, path: &str) -> Result<&str> {
        let v = self.require(path)?;
        v.as_str().ok_or_else(|| wrong_kind(path, "a string", v))
    }

    pub fn generator_state(&self, path: &str) -> Result<GeneratorState> {
        let v = self.require(path)?;
        v.as_generator_state().ok_or_else(|| wrong_kind(path, "a generator state", v))
    }

    /// Puts `generator` back exactly where it was when the checkpoint was made.
    pub fn restore_generator(&self, path: &str, generator: &mut Generator) -> Result<()> {
        generator.set_state(self.generator_state(path)?);
        Ok(())
    }

    /// The tensor at `path`, placed according to `options` (`map_location`, `dtype`).
    pub fn tensor(&self, path: &str, options: &LoadOptions) -> Result<Tensor> {
        let v = self.require(path)?;
        let raw = v.as_tensor().ok_or_else(|| wrong_kind(path, "a tensor", v))?;
        TensorLoader::new(options).load(raw)
    }

    /// The state_dict at `path` (a dict of tensors), placed according to `options`
    /// (`strip_prefix` applies; `key` is ignored in favour of `path`).
    pub fn state_dict(&self, path: &str, options: &LoadOptions) -> Result<TensorStateDict> {
        let node = self.require(path)?;
        // Validate the shape first so the error names `path` rather than the root.
        state_dict_from_value(node).map_err(|e| match e {
            IoError::Structure { reason, .. } => IoError::structure(path, reason),
            other => other,
        })?;
        let opts = LoadOptions { key: None, ..options.clone() };
        state_dict_to_tensors(node, &opts)
    }
}

fn wrong_kind(path: &str, wanted: &str, found: &Value) -> IoError {
    IoError::structure(path, format!("expected {wanted} but found a {}", found.kind()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_memory::Device;
    use ferrite_tensor::DType;

    #[test]
    fn paths_create_dicts_and_refuse_to_overwrite_leaves_as_dicts() {
        let mut c = Checkpoint::new();
        c.set("optimizer/param_groups/lr", 0.1).unwrap();
        c.set("optimizer/param_groups/lr", 0.05).unwrap();
        c.set("epoch", 2i64).unwrap();
        assert_eq!(c.float("optimizer/param_groups/lr").unwrap(), 0.05);
        let err = c.set("epoch/x", 1i64).unwrap_err().to_string();
        assert!(err.contains("epoch") && err.contains("int"), "{err}");
        assert!(c.set("", 1i64).is_err());
        assert!(c.int("optimizer").unwrap_err().to_string().contains("expected an int but found a dict"));
        assert!(c.float("missing/x").unwrap_err().to_string().contains("missing/x"));
        assert!(Checkpoint::from_value(Value::Int(1)).is_err());
    }

    #[test]
    fn tensors_come_back_exactly_on_the_chosen_device() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.ckpt");
        let sim = Device::parse("sim:1GiB").unwrap();
        let m = Tensor::from_vec(vec![f32::MIN_POSITIVE, -0.0, f32::NAN, 1e30], &[2, 2], &sim).unwrap();
        let step = Tensor::scalar(11i64, &Device::Cpu).unwrap();
        let mut c = Checkpoint::new();
        c.set_tensor("optimizer/state/0/exp_avg", &m).unwrap();
        c.set_tensor("optimizer/state/0/step", &step).unwrap();
        c.save(&path).unwrap();
        let back = Checkpoint::load(&path).unwrap();
        let t = back.tensor("optimizer/state/0/exp_avg", &LoadOptions::new()).unwrap();
        assert_eq!(t.device(), &sim, "restored where it was saved");
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(bits(t.to_vec::<f32>().unwrap()), bits(m.to_vec::<f32>().unwrap()));
        let on_meta = back.tensor("optimizer/state/0/exp_avg", &LoadOptions::new().device(Device::Meta)).unwrap();
        assert!(on_meta.is_meta());
        assert_eq!(
            back.tensor("optimizer/state/0/step", &LoadOptions::new().dtype(DType::F16)).unwrap().dtype(),
            DType::I64
        );
        assert!(back.state_dict("optimizer", &LoadOptions::new()).unwrap_err().to_string().contains("optimizer"));
    }
}
