//! `Linear`: y = x Wᵀ + b, with PyTorch's weight layout `[out, in]` and default initialisation
//! (so checkpoints and init statistics carry over).

use ferrite_tensor::random::with_default_generator;
use ferrite_tensor::{Device, Generator, Tensor, no_grad};

use crate::error::Result;
use crate::init::{FanMode, Nonlinearity, kaiming_uniform_, uniform_};
use crate::lora::Lora;
use crate::lora_host::{LoraHost, LoraParams};
use crate::module::{Module, new_parameter, training_flag, weight_and_bias, weight_and_bias_mut};

/// Fully connected layer. Parameters `weight [out_features, in_features]` and optional
/// `bias [out_features]`. Under autocast the product runs in the low-precision dtype. With a
/// LoRA adapter attached (`ferrite_nn::apply_lora`) it is PEFT's `lora.Linear`: the adapter's
/// output is added, and its factors are the children `lora_A` and `lora_B`.
#[derive(Clone, Debug)]
pub struct Linear {
    pub in_features: usize,
    pub out_features: usize,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    /// The LoRA adapter, if one is attached.
    pub lora: Option<Box<Lora>>,
    training: bool,
}

impl Linear {
    /// On the CPU, initialised from the process default generator.
    pub fn new(in_features: usize, out_features: usize) -> Result<Linear> {
        with_default_generator(|g| Linear::new_with(in_features, out_features, true, &Device::Cpu, g))
    }

    /// PyTorch's initialisation drawn from `g`, allocated directly on `device`: weight
    /// `kaiming_uniform_(a=√5)` = U(±1/√in), bias U(±1/√in).
    pub fn new_with(
        in_features: usize,
        out_features: usize,
        bias: bool,
        device: &Device,
        g: &mut Generator,
    ) -> Result<Linear> {
        let weight = new_parameter(&[out_features, in_features], device, |w| {
            if in_features == 0 {
                Ok(())
            } else {
                kaiming_uniform_(w, 5f64.sqrt(), FanMode::FanIn, Nonlinearity::LeakyRelu, g)
            }
        })?;
        let bias = if bias {
            let bound = if in_features > 0 { 1.0 / (in_features as f64).sqrt() } else { 0.0 };
            Some(new_parameter(&[out_features], device, |b| uniform_(b, -bound, bound, g))?)
        } else {
            None
        };
        Ok(Linear { in_features, out_features, weight, bias, lora: None, training: true })
    }

    /// A layer around given tensors (`weight [out, in]`, `bias [out]`), used as they are.
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        let s = weight.shape().to_vec();
        if s.len() != 2 {
            return Err(crate::NnError::config(
                "Linear",
                format!("weight must be [out_features, in_features], got {s:?}"),
            ));
        }
        if let Some(b) = &bias
            && b.shape() != [s[0]]
        {
            return Err(crate::NnError::config("Linear", format!("bias must be [{}], got {:?}", s[0], b.shape())));
        }
        Ok(Linear { in_features: s[1], out_features: s[0], weight, bias, lora: None, training: true })
    }
}

impl Module for Linear {
    fn type_name(&self) -> &'static str {
        "Linear"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.forward_base(x)?;
        match &self.lora {
            Some(l) => l.add_to(y, x, self.training),
            None => Ok(y),
        }
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_and_bias_mut(&mut self.weight, &mut self.bias)
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
    training_flag!();
}

impl LoraHost for Linear {
    fn lora_features(&self) -> (usize, usize) {
        (self.in_features, self.out_features)
    }
    fn attach_lora(&mut self, params: &LoraParams, g: &mut Generator) -> Result<()> {
        let lora = Lora::new(self.in_features, self.out_features, params, self.weight.device(), g)?;
        self.lora = Some(Box::new(lora));
        Ok(())
    }
    fn lora_factors(&self) -> Option<(&Tensor, &Tensor)> {
        self.lora.as_ref().map(|l| (&l.lora_a.weight, &l.lora_b.weight))
    }
    fn lora_params(&self) -> Option<LoraParams> {
        self.lora.as_ref().map(|l| l.params)
    }
    fn set_lora_rng(&mut self, rng: &crate::rng::RngHandle) {
        if let Some(l) = &mut self.lora {
            l.set_rng(rng);
        }
    }
    fn merge_lora(&mut self) -> Result<bool> {
        let Some(l) = self.lora.take() else { return Ok(false) };
        l.merge_into(&self.weight, false)?;
        Ok(true)
    }
}

impl Linear {
    /// The layer without its adapter: `x Wᵀ + b`.
    fn forward_base(&self, x: &Tensor) -> Result<Tensor> {
        match &self.bias {
            // Without a graph (inference), add the bias in place into the fresh product instead
            // of allocating a second output: the peak of an inference forward is one activation
            // lower.
            Some(b) if !Tensor::needs_graph(&[x, &self.weight, b]) => {
                let y = x.matmul(&self.weight.t()?)?;
                let _g = no_grad();
                y.add_(&b.to_dtype(y.dtype())?)?;
                Ok(y)
            }
            _ => Ok(x.linear(&self.weight, self.bias.as_ref())?),
        }
    }
}

#[cfg(test)]
mod skip_init_tests {
    use super::*;
    use crate::module::skip_init;

    #[test]
    fn skip_init_leaves_zeros_and_restores_itself() {
        let mut g = ferrite_tensor::Generator::new(0);
        let zero = skip_init(|| Linear::new_with(4, 3, true, &Device::Cpu, &mut g)).unwrap();
        assert!(zero.weight.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
        let drawn = Linear::new_with(4, 3, true, &Device::Cpu, &mut g).unwrap();
        assert!(drawn.weight.to_vec::<f32>().unwrap().iter().any(|&v| v != 0.0), "initialisation is back");
    }

    /// A layer built under `with_parameter_dtype(BF16)` holds bf16 parameters equal to the f32
    /// layer's from the same generator state rounded to bf16, allocates no f32 weight that
    /// outlives its initialisation, and the dtype is f32 again afterwards.
    #[test]
    fn with_parameter_dtype_builds_what_the_f32_layer_converts_to() {
        use crate::parameter_dtype::{parameter_dtype, with_parameter_dtype};
        use ferrite_tensor::DType;
        let f32_layer = Linear::new_with(48, 40, true, &Device::Cpu, &mut ferrite_tensor::Generator::new(7)).unwrap();
        let bf16 = with_parameter_dtype(DType::BF16, || {
            Linear::new_with(48, 40, true, &Device::Cpu, &mut ferrite_tensor::Generator::new(7))
        })
        .unwrap();
        assert_eq!(parameter_dtype(), DType::F32, "restored");
        for (p, q) in
            [(&bf16.weight, &f32_layer.weight), (bf16.bias.as_ref().unwrap(), f32_layer.bias.as_ref().unwrap())]
        {
            assert_eq!(p.dtype(), DType::BF16);
            assert!(p.requires_grad());
            let want = q.to_dtype(DType::BF16).unwrap().to_vec_f64().unwrap();
            assert_eq!(p.to_vec_f64().unwrap(), want, "bit for bit");
        }
        // After building, a fresh device holds the bf16 parameters only: 2 bytes a weight.
        let dev = Device::parse("sim:t4-16gb:3401").unwrap();
        let alloc = ferrite_memory::allocator(&dev);
        let before = alloc.memory_allocated();
        let m = with_parameter_dtype(DType::BF16, || {
            Linear::new_with(1024, 512, false, &dev, &mut ferrite_tensor::Generator::new(1))
        })
        .unwrap();
        assert_eq!(alloc.memory_allocated() - before, 1024 * 512 * 2);
        drop(m);
    }
}

/// LoRA on `Linear` layers (beside the layer, since `lora.rs` must not import it back).
#[cfg(test)]
mod lora_tests {
    use super::*;
    use crate::error::NnError;
    use crate::lora::{LoraConfig, LoraTargets, apply_lora, has_lora, merge_lora, trainable_parameters};
    use crate::{ReLU, Sequential};
    use ferrite_tensor::DType;

    fn mlp(g: &mut Generator) -> Sequential {
        Sequential::new()
            .append(Linear::new_with(6, 5, true, &Device::Cpu, g).unwrap())
            .append(ReLU::new())
            .append(Linear::new_with(5, 4, true, &Device::Cpu, g).unwrap())
    }

    #[test]
    fn adapters_start_as_the_identity_freeze_the_base_and_train_alone() {
        let mut g = Generator::new(0);
        let mut m = mlp(&mut g);
        let x = Tensor::randn_with(&[3, 6], DType::F32, &Device::Cpu, &mut g).unwrap();
        let before: Vec<f32> = m.forward(&x).unwrap().to_vec().unwrap();
        let chosen = apply_lora(&mut m, &LoraConfig::new(2, LoraTargets::parse("0,2")), &mut g).unwrap();
        assert_eq!(chosen, ["0", "2"]);
        let after: Vec<f32> = m.forward(&x).unwrap().to_vec().unwrap();
        assert_eq!(before, after, "B starts at zero");
        let names: Vec<String> = trainable_parameters(&m).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["0.lora_A.weight", "0.lora_B.weight", "2.lora_A.weight", "2.lora_B.weight"]);
        m.forward(&x).unwrap().sum().unwrap().backward().unwrap();
        for (n, p) in m.named_parameters() {
            assert_eq!(p.grad().is_some(), n.contains("lora_"), "{n}: the adapters get gradients, the base none");
            if n.contains("lora_A") {
                let g: Vec<f32> = p.grad().unwrap().to_vec().unwrap();
                assert!(g.iter().all(|&v| v == 0.0), "{n}: A's gradient is zero while B is");
            }
        }
    }

    #[test]
    fn merging_gives_the_same_outputs_and_the_base_keys() {
        let mut g = Generator::new(1);
        let mut m = mlp(&mut g);
        apply_lora(&mut m, &LoraConfig::new(2, LoraTargets::AllLinear), &mut g).unwrap();
        for (n, p) in m.named_parameters() {
            if n.contains("lora_B") {
                crate::init::normal_(&p, 0.0, 1.0, &mut g).unwrap();
            }
        }
        let x = Tensor::randn_with(&[3, 6], DType::F32, &Device::Cpu, &mut g).unwrap();
        let with: Vec<f32> = m.forward(&x).unwrap().to_vec().unwrap();
        assert_eq!(merge_lora(&mut m).unwrap(), 2);
        assert!(!has_lora(&m));
        let merged: Vec<f32> = m.forward(&x).unwrap().to_vec().unwrap();
        for (a, b) in with.iter().zip(&merged) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} with the adapter, {b} merged");
        }
        assert_eq!(m.state_dict().len(), 4);
    }

    #[test]
    fn bad_targets_and_ranks_are_named() {
        let mut g = Generator::new(2);
        let mut m = mlp(&mut g);
        let e = apply_lora(&mut m, &LoraConfig::new(2, LoraTargets::parse("q_proj")), &mut g).unwrap_err();
        assert!(matches!(&e, NnError::LoraTargets { unmatched, .. } if unmatched == &["q_proj"]), "{e}");
        let e = apply_lora(&mut m, &LoraConfig::new(2, LoraTargets::parse("1")), &mut g).unwrap_err();
        assert!(matches!(&e, NnError::LoraUnsupportedTarget { type_name: "ReLU", .. }), "{e}");
        let e = apply_lora(&mut m, &LoraConfig::new(5, LoraTargets::AllLinear), &mut g).unwrap_err();
        assert!(matches!(&e, NnError::LoraRank { rank: 5, in_features: 5, out_features: 4, .. }), "{e}");
        let e = apply_lora(&mut m, &LoraConfig::new(0, LoraTargets::AllLinear), &mut g).unwrap_err();
        assert!(matches!(&e, NnError::LoraRank { rank: 0, .. }), "{e}");
        assert!(m.parameters().iter().all(Tensor::requires_grad), "refused: nothing frozen");
    }
}
