//! The trainer's CNN: `--layers` blocks of 3×3 convolution → batch norm → ReLU → 2×2 max pool,
//! channels doubling from `--hidden`, then a linear head on the flattened maps.
//!
//! Why this shape: it is the smallest network that shows what convolutional training does to
//! memory — the unfolded (im2col) temporaries, batch norm's saved statistics, the pools' argmax
//! indices — and still reaches 90 % on Fashion-MNIST in a few epochs on two CPU cores. The
//! module tree is PyTorch's `nn.Sequential(nn.Sequential(conv, bn, relu, pool), …, nn.Flatten(),
//! nn.Linear)`, so the state dict's keys (`0.0.weight`, `0.1.running_mean`, …, `3.weight`) load
//! into that PyTorch model as they are, and do not change with `--checkpoint-activations`, which
//! recomputes each block in backward (batch norm updates its running statistics once per
//! forward even so; see `ferrite_nn::is_recomputing`).

use ferrite_nn::{
    BatchNorm2d, BatchNormConfig, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module, ReLU, Sequential,
    checkpoint_with_params,
};
use ferrite_tensor::{Device, Generator, Tensor, is_grad_enabled};

/// Shape of the CNN.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CnnSpec {
    /// `[channels, height, width]` of one image.
    pub input: [usize; 3],
    /// Channels of the first block; each further block doubles them.
    pub hidden: usize,
    /// Conv blocks, each halving the image (floor, as `MaxPool2d(2)`).
    pub layers: usize,
    pub classes: usize,
    pub checkpoint_activations: bool,
}

impl CnnSpec {
    /// The most blocks an image of this size takes: each pool needs at least 2×2 to read.
    pub fn max_layers(input: [usize; 3]) -> usize {
        let mut side = input[1].min(input[2]);
        let mut n = 0;
        while side >= 2 {
            side /= 2;
            n += 1;
        }
        n
    }

    /// Output channels of block `i`; `None` when doubling overflows.
    fn channels(&self, i: usize) -> Option<usize> {
        u32::try_from(i).ok().and_then(|i| 1usize.checked_shl(i)).and_then(|f| self.hidden.checked_mul(f))
    }

    /// Features the head reads: the last block's channels times the pooled map's area.
    fn flat_features(&self) -> Option<usize> {
        let (h, w) = (self.input[1] >> self.layers, self.input[2] >> self.layers);
        self.channels(self.layers - 1)?.checked_mul(h)?.checked_mul(w)
    }

    /// Parameters the model holds (conv weights and biases, batch norm's affine pair, the
    /// head); `None` when the count does not fit in 64 bits.
    pub fn num_parameters(&self) -> Option<u64> {
        let mut total: u128 = 0;
        let mut cin = self.input[0] as u128;
        for i in 0..self.layers {
            let c = self.channels(i)? as u128;
            total = total.checked_add(c.checked_mul(cin)?.checked_mul(9)? + c + 2 * c)?;
            cin = c;
        }
        let (f, k) = (self.flat_features()? as u128, self.classes as u128);
        total = total.checked_add(f.checked_mul(k)? + k)?;
        u64::try_from(total).ok()
    }

    /// `1x28x28 → conv 32-64 → 10` style summary for the banner.
    pub fn describe(&self) -> String {
        let widths: Vec<String> = (0..self.layers).map(|i| self.channels(i).unwrap_or(0).to_string()).collect();
        format!(
            "CNN {}x{}x{} → conv3x3-bn-relu-pool {} → {}",
            self.input[0],
            self.input[1],
            self.input[2],
            widths.join("-"),
            self.classes
        )
    }
}

/// The CNN; see the module docs.
#[derive(Clone)]
pub struct Cnn {
    blocks: Vec<Sequential>,
    flatten: Flatten,
    head: Linear,
    checkpointed: bool,
    training: bool,
}

/// Builds the CNN on `device` with PyTorch's default initialisation drawn from `g`.
pub fn build_cnn(spec: &CnnSpec, device: &Device, g: &mut Generator) -> ferrite_nn::Result<Cnn> {
    let overflow = || ferrite_nn::NnError::InvalidConfig {
        layer: "CNN",
        detail: format!("{} channels doubled over {} blocks do not fit in memory sizes", spec.hidden, spec.layers),
    };
    let mut blocks = Vec::with_capacity(spec.layers);
    let mut cin = spec.input[0];
    for i in 0..spec.layers {
        let c = spec.channels(i).ok_or_else(overflow)?;
        blocks.push(
            Sequential::new()
                .append(Conv2d::new_with(Conv2dConfig::new(cin, c, 3).padding(1), device, g)?)
                .append(BatchNorm2d::with_config(c, &BatchNormConfig::default(), device)?)
                .append(ReLU::new())
                .append(MaxPool2d::new(2)?),
        );
        cin = c;
    }
    let head = Linear::new_with(spec.flat_features().ok_or_else(overflow)?, spec.classes, true, device, g)?;
    Ok(Cnn { blocks, flatten: Flatten::new(), head, checkpointed: spec.checkpoint_activations, training: true })
}

impl Module for Cnn {
    fn set_activation_checkpointing(&mut self, on: bool) -> bool {
        self.checkpointed = on;
        true
    }
    fn type_name(&self) -> &'static str {
        "Sequential"
    }

    /// `x` is an image batch `[batch, channels, height, width]`.
    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        let mut h = x.clone();
        // Each child is marked as a layer for the planner's activations by layer (a no-op
        // outside a plan); the names are the children's.
        for (i, block) in self.blocks.iter().enumerate() {
            ferrite_nn::mark_layer(&i.to_string());
            h = if self.checkpointed && is_grad_enabled() {
                // The clone shares the parameters and buffers; the graph keeps it until backward.
                let region = block.clone();
                let params = block.parameters();
                checkpoint_with_params(move |xs| region.forward(&xs[0]), &[&h], &params)?
            } else {
                block.forward(&h)?
            };
        }
        let n = self.blocks.len();
        ferrite_nn::mark_layer(&n.to_string());
        let flat = self.flatten.forward(&h)?;
        ferrite_nn::mark_layer(&(n + 1).to_string());
        self.head.forward(&flat)
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        let n = self.blocks.len();
        let mut c: Vec<(String, &dyn Module)> =
            self.blocks.iter().enumerate().map(|(i, b)| (i.to_string(), b as &dyn Module)).collect();
        c.push((n.to_string(), &self.flatten));
        c.push(((n + 1).to_string(), &self.head));
        c
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let n = self.blocks.len();
        let mut c: Vec<(String, &mut dyn Module)> =
            self.blocks.iter_mut().enumerate().map(|(i, b)| (i.to_string(), b as &mut dyn Module)).collect();
        c.push((n.to_string(), &mut self.flatten));
        c.push(((n + 1).to_string(), &mut self.head));
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
mod tests {
    use super::*;
    use ferrite_tensor::DType;

    fn spec(input: [usize; 3], layers: usize) -> CnnSpec {
        CnnSpec { input, hidden: 4, layers, classes: 10, checkpoint_activations: false }
    }

    #[test]
    fn pytorch_keys_and_parameter_count() {
        let s = spec([1, 8, 8], 2);
        let m = build_cnn(&s, &Device::Cpu, &mut Generator::new(0)).unwrap();
        let keys: Vec<String> = m.state_dict().iter().map(|(k, _)| k.to_string()).collect();
        for k in ["0.0.weight", "0.0.bias", "0.1.weight", "0.1.running_mean", "0.1.num_batches_tracked", "1.0.weight"] {
            assert!(keys.iter().any(|x| x == k), "{k} missing from {keys:?}");
        }
        assert!(keys.iter().any(|x| x == "3.weight"), "head after the flatten: {keys:?}");
        let count: usize = m.parameters().iter().map(|p| p.numel()).sum();
        assert_eq!(Some(count as u64), s.num_parameters());
        // 8 → 4 → 2: the head reads 8 channels of 2x2.
        assert_eq!(m.head.in_features, 8 * 2 * 2);
        let y = m.forward(&Tensor::zeros(&[3, 1, 8, 8], DType::F32, &Device::Cpu).unwrap()).unwrap();
        assert_eq!(y.shape(), [3, 10]);
    }

    #[test]
    fn how_many_blocks_an_image_takes() {
        assert_eq!(CnnSpec::max_layers([1, 8, 8]), 3);
        assert_eq!(CnnSpec::max_layers([1, 28, 28]), 4);
        assert_eq!(CnnSpec::max_layers([1, 1, 28]), 0);
        assert_eq!(spec([1, 28, 28], 2).describe(), "CNN 1x28x28 → conv3x3-bn-relu-pool 4-8 → 10");
    }

    #[test]
    fn checkpointed_blocks_lower_the_peak_and_keep_gradients_and_statistics() {
        // A device of its own: tests run in parallel, and another test's allocations on a shared
        // device would count in this one's peak.
        let dev = Device::parse("sim:1GiB:1").unwrap();
        let x = Tensor::randn_with(&[64, 1, 28, 28], DType::F32, &dev, &mut Generator::new(1)).unwrap();
        let run = |ckpt: bool| {
            let s = CnnSpec { hidden: 8, checkpoint_activations: ckpt, ..spec([1, 28, 28], 2) };
            let m = build_cnn(&s, &dev, &mut Generator::new(0)).unwrap();
            let scope = ferrite_memory::MemoryScope::with_allocator("step", ferrite_memory::allocator(&dev)).quiet();
            m.forward(&x).unwrap().sum().unwrap().backward().unwrap();
            let peak = scope.finish().peak_above_entry();
            let grads: Vec<Vec<f32>> =
                m.parameters().iter().map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()).collect();
            let stats: Vec<Vec<f32>> = m
                .named_buffers()
                .iter()
                .map(|(_, b)| b.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap())
                .collect();
            (peak, grads, stats)
        };
        let (plain_peak, plain_grads, plain_stats) = run(false);
        let (ckpt_peak, ckpt_grads, ckpt_stats) = run(true);
        println!("CNN 8-16, batch 64: peak above entry {plain_peak} B plain, {ckpt_peak} B checkpointed");
        assert!(ckpt_peak < plain_peak, "{ckpt_peak} >= {plain_peak}");
        assert_eq!(plain_grads, ckpt_grads);
        assert_eq!(plain_stats, ckpt_stats, "running statistics updated once per forward");
    }
}
