//! GPT-2's `Conv1D`: a linear layer whose weight is stored `[in, out]` (not a convolution).
//!
//! Why: Hugging Face's GPT-2 (and GPT-J-era relatives) keep the original TensorFlow layout,
//! `y = x @ W + b` with `W: [in, out]`, while `nn.Linear` stores `[out, in]`. Keeping the layer as
//! it is lets a GPT-2 state dict load and save key for key and shape for shape, with no
//! transposes on the way in or out. It carries a LoRA adapter as PEFT's `lora.Linear` does over a
//! `Conv1D` (`fan_in_fan_out`: `A [r, in]`, `B [out, r]`, the merge transposed into `[in, out]`).
use ferrite_nn::init::normal_;
use ferrite_nn::{Lora, LoraHost, LoraParams, Module};
use ferrite_tensor::{Device, Generator, Tensor, no_grad};

/// `y = x @ weight + bias`, `weight [nx, nf]` (inputs × outputs), `bias [nf]`: Hugging Face's
/// `transformers.pytorch_utils.Conv1D`, initialised as GPT-2 does (weight N(0, 0.02), bias 0).
#[derive(Clone, Debug)]
pub struct Conv1D {
    /// Input features.
    pub nx: usize,
    /// Output features.
    pub nf: usize,
    pub weight: Tensor,
    pub bias: Tensor,
    /// The LoRA adapter, if one is attached.
    pub lora: Option<Box<Lora>>,
    training: bool,
}

impl Conv1D {
    /// A layer of `nx` inputs and `nf` outputs on `device`, weights drawn from `g`.
    pub fn new_with(nx: usize, nf: usize, device: &Device, g: &mut Generator) -> ferrite_nn::Result<Conv1D> {
        // f32, or the dtype of an enclosing `ferrite_nn::with_parameter_dtype` (a bf16 base).
        let dtype = ferrite_nn::parameter_dtype();
        let weight = Tensor::zeros(&[nx, nf], dtype, device)?;
        // Left zero under `ferrite_nn::skip_init` (a folder's weights are loaded right after).
        if !ferrite_nn::init_skipped() {
            normal_(&weight, 0.0, 0.02, g)?;
        }
        let bias = Tensor::zeros(&[nf], dtype, device)?;
        Ok(Conv1D {
            nx,
            nf,
            weight: weight.requires_grad_(true)?,
            bias: bias.requires_grad_(true)?,
            lora: None,
            training: true,
        })
    }
}

impl Module for Conv1D {
    fn type_name(&self) -> &'static str {
        "Conv1D"
    }

    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        let y = self.forward_base(x)?;
        match &self.lora {
            Some(l) => l.add_to(y, x, self.training),
            None => Ok(y),
        }
    }

    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        vec![("weight".into(), &self.weight), ("bias".into(), &self.bias)]
    }

    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![("weight".into(), &mut self.weight), ("bias".into(), &mut self.bias)]
    }

    fn children(&self) -> Vec<(String, &dyn Module)> {
        self.lora.as_ref().map_or_else(Vec::new, |l| l.children())
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        self.lora.as_mut().map_or_else(Vec::new, |l| l.children_mut())
    }

    fn lora_host(&self) -> Option<&dyn LoraHost> {
        Some(self)
    }

    fn lora_host_mut(&mut self) -> Option<&mut dyn LoraHost> {
        Some(self)
    }

    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

impl LoraHost for Conv1D {
    fn lora_features(&self) -> (usize, usize) {
        (self.nx, self.nf)
    }
    fn attach_lora(&mut self, params: &LoraParams, g: &mut Generator) -> ferrite_nn::Result<()> {
        self.lora = Some(Box::new(Lora::new(self.nx, self.nf, params, self.weight.device(), g)?));
        Ok(())
    }
    fn lora_factors(&self) -> Option<(&Tensor, &Tensor)> {
        self.lora.as_ref().map(|l| (&l.lora_a.weight, &l.lora_b.weight))
    }
    fn lora_params(&self) -> Option<LoraParams> {
        self.lora.as_ref().map(|l| l.params)
    }
    fn set_lora_rng(&mut self, rng: &ferrite_nn::RngHandle) {
        if let Some(l) = &mut self.lora {
            l.set_rng(rng);
        }
    }
    fn merge_lora(&mut self) -> ferrite_nn::Result<bool> {
        let Some(l) = self.lora.take() else { return Ok(false) };
        l.merge_into(&self.weight, true)?;
        Ok(true)
    }
}

impl Conv1D {
    /// The layer without its adapter: `x W + b`.
    fn forward_base(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        let y = x.matmul(&self.weight)?;
        let b = if self.bias.dtype() != y.dtype() { self.bias.to_dtype(y.dtype())? } else { self.bias.clone() };
        if Tensor::needs_graph(&[x, &self.weight, &self.bias]) {
            Ok(y.add(&b)?)
        } else {
            // Without a graph, add the bias into the fresh product (one activation fewer).
            let _g = no_grad();
            y.add_(&b)?;
            Ok(y)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::DType;

    #[test]
    fn skip_init_leaves_the_weights_zero_and_draws_nothing() {
        let mut g = Generator::new(0);
        let drawn = Conv1D::new_with(4, 3, &Device::Cpu, &mut g).unwrap();
        assert!(drawn.weight.to_vec::<f32>().unwrap().iter().any(|&v| v != 0.0));
        let mut g2 = Generator::new(0);
        let skipped = ferrite_nn::skip_init(|| Conv1D::new_with(4, 3, &Device::Cpu, &mut g2)).unwrap();
        assert!(skipped.weight.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
        assert!(skipped.weight.requires_grad() && skipped.bias.requires_grad());
        // Nothing was drawn: the generator is where a fresh one starts.
        let (a, b) = (
            Tensor::randn_with(&[4], DType::F32, &Device::Cpu, &mut g2).unwrap(),
            Tensor::randn_with(&[4], DType::F32, &Device::Cpu, &mut Generator::new(0)).unwrap(),
        );
        assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    }

    #[test]
    fn computes_x_at_w_plus_b_with_w_stored_in_out() {
        let mut g = Generator::new(0);
        let mut c = Conv1D::new_with(3, 2, &Device::Cpu, &mut g).unwrap();
        assert_eq!(c.weight.shape(), [3, 2]);
        c.weight = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2], &Device::Cpu).unwrap();
        c.bias = Tensor::from_vec(vec![0.5f32, -0.5], &[2], &Device::Cpu).unwrap();
        let x = Tensor::from_vec(vec![1.0f32, 0.0, 1.0], &[1, 3], &Device::Cpu).unwrap();
        let y: Vec<f32> = c.forward(&x).unwrap().to_vec().unwrap();
        assert_eq!(y, vec![1.0 + 5.0 + 0.5, 2.0 + 6.0 - 0.5]);
        let names: Vec<String> = c.named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["weight", "bias"]);
    }
}
