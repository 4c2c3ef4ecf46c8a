//! The trainer's MLP, whose hidden blocks can be checkpointed in segments.
//!
//! Why segments: checkpointing a single `Linear → ReLU` block saves nothing — the block's input
//! is the previous ReLU's output, which autograd keeps anyway. Checkpointing runs of
//! ⌈√layers⌉ blocks keeps only each run's input and recomputes the run in backward (Chen et al.,
//! "Training deep nets with sublinear memory cost"), which is what lowers the peak. The module
//! tree does not change with the flag: children are the blocks `0 … layers-1` and the head
//! `layers`, exactly the names of PyTorch's `nn.Sequential(nn.Sequential(nn.Linear, nn.ReLU),
//! …, nn.Linear)`, so weights move between the two modes and to PyTorch key for key.

use ferrite_nn::{Dropout, Linear, Module, ReLU, RngHandle, Sequential, checkpoint_with_params};
use ferrite_tensor::{Device, Generator, Tensor, is_grad_enabled};

/// Shape of the MLP.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlpSpec {
    pub inputs: usize,
    pub hidden: usize,
    pub layers: usize,
    pub classes: usize,
    pub dropout: f64,
    pub checkpoint_activations: bool,
}

impl MlpSpec {
    /// Parameters the model holds (weights and biases); `None` when the count does not fit in
    /// 64 bits (a mistyped `--hidden`), so no figure derived from it can wrap around.
    pub fn num_parameters(&self) -> Option<u64> {
        let (i, h, l, c) = (self.inputs as u128, self.hidden as u128, self.layers as u128, self.classes as u128);
        let total = (i * h + h) + (l - 1) * (h * h + h) + (h * c + c);
        u64::try_from(total).ok()
    }
}

/// The MLP: hidden blocks and a linear head; see the module docs for checkpointing.
#[derive(Clone)]
pub struct Mlp {
    blocks: Vec<Sequential>,
    head: Linear,
    /// Blocks per checkpointed segment; 0 = keep activations.
    segment: usize,
    training: bool,
}

impl Mlp {
    /// Blocks per checkpointed segment (0 when checkpointing is off).
    #[cfg(test)]
    fn segment_len(&self) -> usize {
        self.segment
    }
}

/// Builds the MLP on `device` with PyTorch's default initialisation drawn from `g`. Dropout
/// layers (if any) all draw from `dropout_rng`, so a checkpoint saves one generator state.
pub fn build_mlp(
    spec: &MlpSpec,
    device: &Device,
    g: &mut Generator,
    dropout_rng: &RngHandle,
) -> ferrite_nn::Result<Mlp> {
    let mut blocks = Vec::with_capacity(spec.layers);
    let mut width = spec.inputs;
    for _ in 0..spec.layers {
        let mut block =
            Sequential::new().append(Linear::new_with(width, spec.hidden, true, device, g)?).append(ReLU::new());
        if spec.dropout > 0.0 {
            block = block.append(Dropout::with_rng(spec.dropout, dropout_rng.clone())?);
        }
        blocks.push(block);
        width = spec.hidden;
    }
    let head = Linear::new_with(width, spec.classes, true, device, g)?;
    let segment = if spec.checkpoint_activations { (spec.layers as f64).sqrt().ceil() as usize } else { 0 };
    Ok(Mlp { blocks, head, segment, training: true })
}

/// Runs `blocks`, the first of which is child `first` of the model; each is marked as a layer
/// for the planner's activations by layer (a no-op outside a plan).
fn run_blocks(blocks: &[Sequential], first: usize, x: &Tensor) -> ferrite_nn::Result<Tensor> {
    let mut h = x.clone();
    for (i, b) in blocks.iter().enumerate() {
        ferrite_nn::mark_layer(&(first + i).to_string());
        h = b.forward(&h)?;
    }
    Ok(h)
}

impl Module for Mlp {
    /// Segments of ⌈√blocks⌉ hidden blocks (see the module docs), or none.
    fn set_activation_checkpointing(&mut self, on: bool) -> bool {
        self.segment = if on { (self.blocks.len() as f64).sqrt().ceil() as usize } else { 0 };
        true
    }
    fn type_name(&self) -> &'static str {
        "Sequential"
    }

    /// `x` is `[batch, features]` or an image batch `[batch, channels, height, width]`, flattened.
    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        let x = &x.flatten(1, -1)?;
        let h = if self.segment == 0 || !is_grad_enabled() {
            run_blocks(&self.blocks, 0, x)?
        } else {
            let mut h = x.clone();
            for (n, chunk) in self.blocks.chunks(self.segment).enumerate() {
                // Clones share the parameters; the autograd node keeps them until backward.
                let seg: Vec<Sequential> = chunk.to_vec();
                let first = n * self.segment;
                let params: Vec<Tensor> = seg.iter().flat_map(|b| b.parameters()).collect();
                h = checkpoint_with_params(move |xs| run_blocks(&seg, first, &xs[0]), &[&h], &params)?;
            }
            h
        };
        ferrite_nn::mark_layer(&self.blocks.len().to_string());
        self.head.forward(&h)
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut c: Vec<(String, &dyn Module)> =
            self.blocks.iter().enumerate().map(|(i, b)| (i.to_string(), b as &dyn Module)).collect();
        c.push((self.blocks.len().to_string(), &self.head));
        c
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let n = self.blocks.len();
        let mut c: Vec<(String, &mut dyn Module)> =
            self.blocks.iter_mut().enumerate().map(|(i, b)| (i.to_string(), b as &mut dyn Module)).collect();
        c.push((n.to_string(), &mut self.head));
        c
    }

    fn is_training(&self) -> bool {
        self.training
    }

    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

#[cfg(test)]
fn parameter_names(model: &dyn Module) -> Vec<String> {
    model.named_parameters().into_iter().map(|(n, _)| n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_do_not_depend_on_checkpointing_and_count_matches() {
        let spec =
            MlpSpec { inputs: 64, hidden: 16, layers: 2, classes: 10, dropout: 0.1, checkpoint_activations: false };
        let rng = RngHandle::new(0);
        let plain = build_mlp(&spec, &Device::Cpu, &mut Generator::new(0), &rng).unwrap();
        let ckpt =
            build_mlp(&MlpSpec { checkpoint_activations: true, ..spec }, &Device::Cpu, &mut Generator::new(0), &rng)
                .unwrap();
        assert_eq!((plain.segment_len(), ckpt.segment_len()), (0, 2));
        // The switch a trainer flips: the same segments as the spec's flag, and off again.
        let mut switched = plain.clone();
        assert!(switched.set_activation_checkpointing(true));
        assert_eq!(switched.segment_len(), ckpt.segment_len());
        assert!(switched.set_activation_checkpointing(false));
        assert_eq!(switched.segment_len(), 0);
        let names = parameter_names(&plain);
        assert_eq!(names, vec!["0.0.weight", "0.0.bias", "1.0.weight", "1.0.bias", "2.weight", "2.bias"]);
        assert_eq!(names, parameter_names(&ckpt));
        let count: usize = plain.parameters().iter().map(|p| p.numel()).sum();
        assert_eq!(Some(count as u64), spec.num_parameters());
    }

    #[test]
    fn checkpointed_segments_lower_the_peak_and_keep_gradients_identical() {
        // A device of its own: tests run in parallel, and another test's allocations on a shared
        // device would count in this one's peak.
        let dev = Device::parse("sim:1GiB:2").unwrap();
        let spec =
            MlpSpec { inputs: 64, hidden: 256, layers: 8, classes: 10, dropout: 0.1, checkpoint_activations: false };
        let x = Tensor::randn_with(&[256, 64], ferrite_tensor::DType::F32, &dev, &mut Generator::new(1)).unwrap();
        let run = |ckpt: bool| {
            let m = build_mlp(
                &MlpSpec { checkpoint_activations: ckpt, ..spec },
                &dev,
                &mut Generator::new(0),
                &RngHandle::new(3),
            )
            .unwrap();
            let alloc = ferrite_memory::allocator(&dev);
            let scope = ferrite_memory::MemoryScope::with_allocator("step", alloc).quiet();
            m.forward(&x).unwrap().sum().unwrap().backward().unwrap();
            let peak = scope.finish().peak_above_entry();
            let grads: Vec<Vec<f32>> =
                m.parameters().iter().map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()).collect();
            (peak, grads)
        };
        let (plain_peak, plain_grads) = run(false);
        let (ckpt_peak, ckpt_grads) = run(true);
        println!("8x256 MLP, batch 256: peak above entry {plain_peak} B plain, {ckpt_peak} B checkpointed");
        assert!(ckpt_peak < plain_peak, "{ckpt_peak} >= {plain_peak}");
        assert_eq!(plain_grads, ckpt_grads, "bit-identical gradients (dropout replayed)");
    }
}
