//! state_dicts of ferrite `Tensor`s: load from any checkpoint onto devices, save as safetensors.
//!
//! This is the seam `nn`'s `state_dict()` / `load_state_dict()` and the trainer use. Loading reads
//! the file (memory-mapped; PyTorch `.pt`/`.pth` through the restricted unpickler, safetensors,
//! ferrite checkpoints), selects the entry of a nested checkpoint if asked, strips a prefix if
//! asked, and places each tensor where [`LoadOptions`] says. Saving writes safetensors that
//! PyTorch and Hugging Face tools load unchanged, atomically.

use std::collections::BTreeMap;
use std::path::Path;

use ferrite_tensor::Tensor;

use crate::error::Result;
use crate::load_options::LoadOptions;
use crate::read::read;
use crate::safetensors_format::write_entries_atomically;
use crate::state_dict::{state_dict_from_value, strip_prefix};
use crate::tensor_data::check_has_data;
use crate::tensor_loader::TensorLoader;
use crate::value::Value;

/// Parameter and buffer names → device tensors, in file order (the [`RawStateDict`](crate::RawStateDict)
/// of a file, placed on devices).
pub type TensorStateDict = Vec<(String, Tensor)>;

/// Loads the state_dict in `path` (the root, or the entry [`LoadOptions::key`] names) onto devices.
///
/// A nested checkpoint without a key is an error listing the entries that hold tensors.
pub fn load_state_dict(path: impl AsRef<Path>, options: &LoadOptions) -> Result<TensorStateDict> {
    state_dict_to_tensors(&read(path)?, options)
}

/// [`load_state_dict`] for a tree already read (e.g. one [`read`](crate::read) call, then several
/// state_dicts from it).
pub fn state_dict_to_tensors(tree: &Value, options: &LoadOptions) -> Result<TensorStateDict> {
    let node = match &options.key {
        Some(k) => tree.require(k)?,
        None => tree,
    };
    let mut sd = state_dict_from_value(node)?;
    if let Some(p) = &options.strip_prefix {
        sd = strip_prefix(sd, p);
    }
    let mut loader = TensorLoader::new(options);
    sd.iter().map(|(k, t)| Ok((k.clone(), loader.load(t)?))).collect()
}

/// Saves named tensors to `path` as safetensors (atomically; names must be unique). Each tensor is
/// copied to the host while it is written, one at a time. Tensors on `meta` are refused before
/// anything is written.
///
/// Tensors that share a storage are written as separate copies of their elements (safetensors has
/// no shared storages); loading gives independent tensors with the same values.
pub fn save_state_dict<'a>(
    path: impl AsRef<Path>,
    tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
) -> Result<()> {
    save_state_dict_with_metadata(path, tensors, &BTreeMap::new())
}

/// [`save_state_dict`] with extra `__metadata__` strings (`"format": "pt"` is always added).
pub fn save_state_dict_with_metadata<'a>(
    path: impl AsRef<Path>,
    tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let list: Vec<(&str, &Tensor)> = tensors.into_iter().collect();
    for (_, t) in &list {
        check_has_data(t)?;
    }
    write_entries_atomically(path, list, metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_memory::Device;
    use ferrite_tensor::DType;

    #[test]
    fn save_then_load_on_other_devices() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let w = Tensor::from_vec(vec![1.0f32, -2.0, 3.5, 0.25], &[2, 2], &Device::Cpu).unwrap();
        let steps = Tensor::scalar(5i64, &Device::Cpu).unwrap();
        save_state_dict(&path, [("fc.weight", &w), ("steps", &steps)]).unwrap();

        // safetensors orders tensors by alignment, then name.
        let sd = load_state_dict(&path, &LoadOptions::new()).unwrap();
        let names: Vec<&str> = sd.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["steps", "fc.weight"]);
        assert_eq!(sd[1].1.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());

        let sim = Device::parse("sim:t4-16gb:1").unwrap();
        let sd = load_state_dict(&path, &LoadOptions::new().device(sim.clone()).dtype(DType::F16)).unwrap();
        assert_eq!((sd[1].1.device(), sd[1].1.dtype(), sd[0].1.dtype()), (&sim, DType::F16, DType::I64));
        assert_eq!(sd[1].1.to_vec_f64().unwrap(), vec![1.0, -2.0, 3.5, 0.25]);

        let meta = Tensor::zeros(&[2], DType::F32, &Device::Meta).unwrap();
        let err = save_state_dict(&path, [("m", &meta)]).unwrap_err().to_string();
        assert!(err.contains("meta"), "{err}");
        assert_eq!(
            load_state_dict(&path, &LoadOptions::new()).unwrap().len(),
            2,
            "the refused save left the file alone"
        );
    }

    #[test]
    fn key_and_prefix_options() {
        let t = crate::RawTensor::from_values(vec![1], &[2.0f32]).unwrap();
        let mut model = Value::dict();
        model.insert("module.fc.bias", t).unwrap();
        let mut root = Value::dict();
        root.insert("epoch", 1i64).unwrap();
        root.insert("model", model).unwrap();
        let err = state_dict_to_tensors(&root, &LoadOptions::new()).unwrap_err().to_string();
        assert!(err.contains("`model`"), "{err}");
        let sd = state_dict_to_tensors(&root, &LoadOptions::new().key("model").strip_prefix("module.")).unwrap();
        assert_eq!(sd[0].0, "fc.bias");
        assert!(
            state_dict_to_tensors(&root, &LoadOptions::new().key("nope")).unwrap_err().to_string().contains("nope")
        );
    }
}
