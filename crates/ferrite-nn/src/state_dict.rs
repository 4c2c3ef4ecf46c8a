//! `StateDict`: the ordered name → tensor map that checkpoints are made of.
//!
//! Order matters (PyTorch users diff key listings, and safetensors/pt writers keep it), so this is
//! an insertion-ordered map, not a hash map. Keys use PyTorch's dotted names (`fc1.weight`,
//! `layers.0.bias`); `ferrite-io` converts files to and from this type.

use std::fmt;

use ferrite_tensor::{Device, Tensor};
use indexmap::IndexMap;

use crate::error::Result;

/// Ordered map from PyTorch-style parameter/buffer names to tensors.
///
/// Values from [`Module::state_dict`](crate::Module::state_dict) are detached handles that share
/// storage with the module (no copy), as in PyTorch.
#[derive(Clone, Default)]
pub struct StateDict {
    entries: IndexMap<String, Tensor>,
}

impl StateDict {
    pub fn new() -> StateDict {
        StateDict::default()
    }

    /// Insert (or replace, keeping the original position) an entry; returns the previous value.
    pub fn insert(&mut self, key: impl Into<String>, tensor: Tensor) -> Option<Tensor> {
        self.entries.insert(key.into(), tensor)
    }

    pub fn get(&self, key: &str) -> Option<&Tensor> {
        self.entries.get(key)
    }

    /// Remove an entry, keeping the order of the others.
    pub fn remove(&mut self, key: &str) -> Option<Tensor> {
        self.entries.shift_remove(key)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(|k| k.as_str())
    }

    /// Entries in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Strip `prefix` from every key that starts with it, in place (PyTorch's
    /// `consume_prefix_in_state_dict_if_present`). Use `"module."` for checkpoints saved from a
    /// DataParallel/DDP wrapper. Returns how many keys changed.
    pub fn strip_prefix(&mut self, prefix: &str) -> usize {
        let mut changed = 0;
        let entries = std::mem::take(&mut self.entries);
        for (k, v) in entries {
            match k.strip_prefix(prefix) {
                Some(rest) if !prefix.is_empty() => {
                    changed += 1;
                    self.entries.insert(rest.to_string(), v);
                }
                _ => {
                    self.entries.insert(k, v);
                }
            }
        }
        changed
    }

    /// A copy with `prefix` prepended to every key (e.g. to nest a sub-model's weights).
    pub fn with_prefix(&self, prefix: &str) -> StateDict {
        self.iter().map(|(k, v)| (format!("{prefix}{k}"), v.clone())).collect()
    }

    /// A copy whose tensors live on `device` (PyTorch's `map_location`).
    pub fn to_device(&self, device: &Device) -> Result<StateDict> {
        let mut out = StateDict::new();
        for (k, v) in self.iter() {
            out.insert(k, v.detach().to_device(device)?);
        }
        Ok(out)
    }

    /// Total bytes of the tensors' elements.
    pub fn nbytes(&self) -> usize {
        self.entries.values().map(|t| t.nbytes()).sum()
    }
}

impl FromIterator<(String, Tensor)> for StateDict {
    fn from_iter<I: IntoIterator<Item = (String, Tensor)>>(iter: I) -> Self {
        StateDict { entries: iter.into_iter().collect() }
    }
}

impl IntoIterator for StateDict {
    type Item = (String, Tensor);
    type IntoIter = indexmap::map::IntoIter<String, Tensor>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl fmt::Debug for StateDict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (k, v) in self.iter() {
            m.entry(&k, &format_args!("{} {:?}", v.dtype(), v.shape()));
        }
        m.finish()
    }
}

/// How [`Module::load_state_dict_with`](crate::Module::load_state_dict_with) matches keys.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Missing or unexpected keys are an error (PyTorch's `strict=True`, the default).
    pub strict: bool,
    /// Strip this prefix from checkpoint keys before matching (e.g. `"module."`).
    pub strip_prefix: Option<String>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { strict: true, strip_prefix: None }
    }
}

/// Keys that did not match in a non-strict load (PyTorch's `_IncompatibleKeys`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IncompatibleKeys {
    /// In the model, not in the checkpoint (left unchanged).
    pub missing_keys: Vec<String>,
    /// In the checkpoint, not in the model (ignored).
    pub unexpected_keys: Vec<String>,
}

impl IncompatibleKeys {
    pub fn is_empty(&self) -> bool {
        self.missing_keys.is_empty() && self.unexpected_keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: f32) -> Tensor {
        Tensor::from_vec(vec![v], &[1], &Device::Cpu).unwrap()
    }

    #[test]
    fn order_is_insertion_order_and_replace_keeps_position() {
        let mut sd = StateDict::new();
        sd.insert("b", t(1.0));
        sd.insert("a", t(2.0));
        sd.insert("c", t(3.0));
        sd.insert("a", t(4.0));
        assert_eq!(sd.keys().collect::<Vec<_>>(), ["b", "a", "c"]);
        assert_eq!(sd.get("a").unwrap().item().unwrap(), 4.0);
        sd.remove("b");
        assert_eq!(sd.keys().collect::<Vec<_>>(), ["a", "c"]);
    }

    #[test]
    fn strip_prefix_only_touches_matching_keys_and_keeps_order() {
        let mut sd: StateDict = [("module.fc.weight", 1.0), ("head", 2.0), ("module.fc.bias", 3.0)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), t(v)))
            .collect();
        assert_eq!(sd.strip_prefix("module."), 2);
        assert_eq!(sd.keys().collect::<Vec<_>>(), ["fc.weight", "head", "fc.bias"]);
        assert_eq!(sd.strip_prefix(""), 0);
        let p = sd.with_prefix("module.");
        assert_eq!(p.keys().collect::<Vec<_>>(), ["module.fc.weight", "module.head", "module.fc.bias"]);
    }
}
