//! Parameter initialisation with PyTorch's formulas (`torch.nn.init`).
//!
//! Each function fills an existing tensor in place under `no_grad` (so it also works on
//! parameters that already require grad) from an explicit [`Generator`]. Values are drawn in
//! float32 and converted, so a bf16 and an f32 parameter initialised from the same generator
//! state hold the same numbers up to rounding. The gains and fans are PyTorch's; the random
//! stream is ferrite's own, so values differ from PyTorch's for the same seed.

use ferrite_tensor::{DType, Generator, Tensor, no_grad};

use crate::error::{NnError, Result};

/// Non-linearity after a layer, for [`calculate_gain`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Nonlinearity {
    Linear,
    Sigmoid,
    Tanh,
    Relu,
    /// Negative slope given separately (PyTorch's `param`; default 0.01).
    LeakyRelu,
    Selu,
}

/// Which fan [`kaiming_uniform_`]/[`kaiming_normal_`] preserve the variance of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FanMode {
    #[default]
    FanIn,
    FanOut,
}

/// PyTorch's `calculate_gain(nonlinearity, param)`: 1 for linear/sigmoid, 5/3 for tanh, √2 for
/// ReLU, √(2/(1+slope²)) for leaky ReLU (slope = `param`, default 0.01), 3/4 for SELU.
pub fn calculate_gain(nonlinearity: Nonlinearity, param: Option<f64>) -> f64 {
    match nonlinearity {
        Nonlinearity::Linear | Nonlinearity::Sigmoid => 1.0,
        Nonlinearity::Tanh => 5.0 / 3.0,
        Nonlinearity::Relu => 2f64.sqrt(),
        Nonlinearity::LeakyRelu => {
            let s = param.unwrap_or(0.01);
            (2.0 / (1.0 + s * s)).sqrt()
        }
        Nonlinearity::Selu => 0.75,
    }
}

/// `(fan_in, fan_out)` of a weight `[out, in, *receptive_field]` (PyTorch's
/// `_calculate_fan_in_and_fan_out`); needs at least 2 dimensions.
pub fn fan_in_and_fan_out(t: &Tensor) -> Result<(usize, usize)> {
    let s = t.shape();
    if s.len() < 2 {
        return Err(NnError::config(
            "init",
            format!("fan in and fan out can not be computed for a tensor with fewer than 2 dimensions (shape {s:?})"),
        ));
    }
    let receptive: usize = s[2..].iter().product();
    Ok((s[1] * receptive, s[0] * receptive))
}

fn fill_from(t: &Tensor, src: Tensor) -> Result<()> {
    let _g = no_grad();
    t.copy_(&src)?;
    Ok(())
}

/// Fill with U(low, high).
pub fn uniform_(t: &Tensor, low: f64, high: f64, g: &mut Generator) -> Result<()> {
    if low.is_nan() || high.is_nan() || low > high {
        return Err(NnError::config("init", format!("uniform_ expects low <= high, got {low} > {high}")));
    }
    fill_from(t, Tensor::uniform_with(t.shape(), low, high, DType::F32, t.device(), g)?)
}

/// Fill with N(mean, std²).
pub fn normal_(t: &Tensor, mean: f64, std: f64, g: &mut Generator) -> Result<()> {
    if std.is_nan() || std < 0.0 {
        return Err(NnError::config("init", format!("normal_ expects std >= 0, got {std}")));
    }
    fill_from(t, Tensor::normal_with(t.shape(), mean, std, DType::F32, t.device(), g)?)
}

/// Fill with `value`.
pub fn constant_(t: &Tensor, value: f64) -> Result<()> {
    let _g = no_grad();
    t.fill_(value)?;
    Ok(())
}

pub fn zeros_(t: &Tensor) -> Result<()> {
    constant_(t, 0.0)
}

pub fn ones_(t: &Tensor) -> Result<()> {
    constant_(t, 1.0)
}

fn kaiming_std(t: &Tensor, a: f64, mode: FanMode, nonlinearity: Nonlinearity) -> Result<f64> {
    let (fan_in, fan_out) = fan_in_and_fan_out(t)?;
    let fan = match mode {
        FanMode::FanIn => fan_in,
        FanMode::FanOut => fan_out,
    };
    if fan == 0 {
        return Err(NnError::config("init", format!("kaiming init of a tensor with shape {:?} (fan is 0)", t.shape())));
    }
    Ok(calculate_gain(nonlinearity, Some(a)) / (fan as f64).sqrt())
}

/// He uniform: U(−b, b) with b = gain·√(3/fan) (PyTorch's `kaiming_uniform_(t, a, mode,
/// nonlinearity)`; `a` is the leaky-ReLU slope). `Linear` uses `a = √5`, `LeakyRelu`, `FanIn`,
/// which gives b = 1/√fan_in.
pub fn kaiming_uniform_(
    t: &Tensor,
    a: f64,
    mode: FanMode,
    nonlinearity: Nonlinearity,
    g: &mut Generator,
) -> Result<()> {
    let bound = 3f64.sqrt() * kaiming_std(t, a, mode, nonlinearity)?;
    uniform_(t, -bound, bound, g)
}

/// He normal: N(0, gain²/fan).
pub fn kaiming_normal_(t: &Tensor, a: f64, mode: FanMode, nonlinearity: Nonlinearity, g: &mut Generator) -> Result<()> {
    let std = kaiming_std(t, a, mode, nonlinearity)?;
    normal_(t, 0.0, std, g)
}

/// Glorot uniform: U(−b, b) with b = gain·√(6/(fan_in+fan_out)).
pub fn xavier_uniform_(t: &Tensor, gain: f64, g: &mut Generator) -> Result<()> {
    let (fi, fo) = fan_in_and_fan_out(t)?;
    let std = gain * (2.0 / (fi + fo).max(1) as f64).sqrt();
    let bound = 3f64.sqrt() * std;
    uniform_(t, -bound, bound, g)
}

/// Glorot normal: N(0, gain²·2/(fan_in+fan_out)).
pub fn xavier_normal_(t: &Tensor, gain: f64, g: &mut Generator) -> Result<()> {
    let (fi, fo) = fan_in_and_fan_out(t)?;
    let std = gain * (2.0 / (fi + fo).max(1) as f64).sqrt();
    normal_(t, 0.0, std, g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::Device;

    fn stats(t: &Tensor) -> (f64, f64, f64) {
        let v = t.to_vec_f64().unwrap();
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        let maxabs = v.iter().fold(0f64, |m, x| m.max(x.abs()));
        (mean, var.sqrt(), maxabs)
    }

    #[test]
    fn gains_match_pytorch() {
        assert_eq!(calculate_gain(Nonlinearity::Linear, None), 1.0);
        assert!((calculate_gain(Nonlinearity::Tanh, None) - 5.0 / 3.0).abs() < 1e-15);
        assert!((calculate_gain(Nonlinearity::Relu, None) - 2f64.sqrt()).abs() < 1e-15);
        assert!((calculate_gain(Nonlinearity::LeakyRelu, None) - (2.0 / 1.0001f64).sqrt()).abs() < 1e-15);
        // Linear's a = sqrt(5): gain = sqrt(1/3).
        assert!((calculate_gain(Nonlinearity::LeakyRelu, Some(5f64.sqrt())) - (1.0f64 / 3.0).sqrt()).abs() < 1e-15);
    }

    #[test]
    fn fans_follow_pytorch_including_receptive_field() {
        let t = Tensor::zeros(&[8, 3, 5, 5], DType::F32, &Device::Cpu).unwrap();
        assert_eq!(fan_in_and_fan_out(&t).unwrap(), (75, 200));
        let v = Tensor::zeros(&[8], DType::F32, &Device::Cpu).unwrap();
        assert!(fan_in_and_fan_out(&v).is_err());
    }

    #[test]
    fn kaiming_uniform_bounds_and_spread() {
        let t = Tensor::zeros(&[256, 400], DType::F32, &Device::Cpu).unwrap();
        let mut g = Generator::new(0);
        kaiming_uniform_(&t, 5f64.sqrt(), FanMode::FanIn, Nonlinearity::LeakyRelu, &mut g).unwrap();
        let (mean, std, maxabs) = stats(&t);
        let b = 1.0 / 20.0; // 1/sqrt(400)
        assert!(maxabs <= b, "{maxabs} > {b}");
        assert!(maxabs > 0.99 * b);
        assert!(mean.abs() < 1e-3);
        assert!((std - b / 3f64.sqrt()).abs() < 0.02 * b, "std {std}");
        // ReLU / fan_out variant.
        kaiming_normal_(&t, 0.0, FanMode::FanOut, Nonlinearity::Relu, &mut g).unwrap();
        let (_, std, _) = stats(&t);
        assert!((std - (2.0f64 / 256.0).sqrt()).abs() < 0.02 * std, "std {std}");
    }

    #[test]
    fn xavier_and_constants() {
        let t = Tensor::zeros(&[300, 100], DType::F32, &Device::Cpu).unwrap().requires_grad_(true).unwrap();
        let mut g = Generator::new(1);
        xavier_uniform_(&t, 1.0, &mut g).unwrap();
        let (_, _, maxabs) = stats(&t);
        let b = (6.0f64 / 400.0).sqrt();
        assert!(maxabs <= b && maxabs > 0.99 * b);
        xavier_normal_(&t, 2.0, &mut g).unwrap();
        let (_, std, _) = stats(&t);
        assert!((std - 2.0 * (2.0f64 / 400.0).sqrt()).abs() < 0.03 * std);
        ones_(&t).unwrap();
        assert!(t.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.0));
        zeros_(&t).unwrap();
        assert!(t.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
        assert!(t.requires_grad(), "in-place init keeps the parameter a leaf that requires grad");
        assert!(uniform_(&t, 1.0, 0.0, &mut g).is_err());
    }
}
