//! `Sequential`: layers applied in order, named `0`, `1`, … in the state dict like PyTorch's
//! `nn.Sequential`.

use ferrite_tensor::Tensor;

use crate::error::Result;
use crate::module::{Module, training_flag};

/// A chain of single-input modules.
#[derive(Clone)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
    training: bool,
}

impl Sequential {
    pub fn new() -> Sequential {
        Sequential { layers: Vec::new(), training: true }
    }

    /// Builder: append a layer (PyTorch's `Sequential.append`, which also returns the container).
    pub fn append(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// Append a layer.
    pub fn push(&mut self, layer: impl Module + 'static) {
        self.layers.push(Box::new(layer));
    }

    pub fn from_layers(layers: Vec<Box<dyn Module>>) -> Sequential {
        Sequential { layers, training: true }
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&dyn Module> {
        self.layers.get(i).map(|b| b.as_ref())
    }

    pub fn get_mut(&mut self, i: usize) -> Option<&mut (dyn Module + 'static)> {
        self.layers.get_mut(i).map(|b| b.as_mut())
    }

    pub fn layers(&self) -> &[Box<dyn Module>] {
        &self.layers
    }

    /// Consume into the boxed layers (e.g. to regroup them into checkpointed segments).
    pub fn into_layers(self) -> Vec<Box<dyn Module>> {
        self.layers
    }
}

impl Default for Sequential {
    fn default() -> Self {
        Sequential::new()
    }
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.layers.iter().map(|l| l.type_name()).collect();
        write!(f, "Sequential({names:?})")
    }
}

impl Module for Sequential {
    fn type_name(&self) -> &'static str {
        "Sequential"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for l in &self.layers {
            h = l.forward(&h)?;
        }
        Ok(h)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        self.layers.iter().enumerate().map(|(i, l)| (i.to_string(), l.as_ref())).collect()
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        self.layers.iter_mut().enumerate().map(|(i, l)| (i.to_string(), l.as_mut() as &mut dyn Module)).collect()
    }
    training_flag!();
}
