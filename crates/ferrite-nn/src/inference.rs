//! Inference in one line: eval mode plus `no_grad`, so no graph is recorded and every
//! activation is freed as soon as the next layer has consumed it.

use ferrite_tensor::no_grad;

use crate::module::Module;

/// Run `f` on `module` in eval mode (dropout off) with grad recording off, then restore the
/// module's previous mode (the whole tree gets the root's previous flag).
///
/// ```
/// # use ferrite_nn::{inference, Linear, Module};
/// # use ferrite_tensor::{DType, Device, Tensor};
/// # fn main() -> ferrite_nn::Result<()> {
/// let mut model = Linear::new(4, 2)?;
/// let x = Tensor::ones(&[3, 4], DType::F32, &Device::Cpu)?;
/// let y = inference(&mut model, |m| m.forward(&x))?;
/// assert!(!y.requires_grad() && model.is_training());
/// # Ok(()) }
/// ```
pub fn inference<M: Module + ?Sized, R>(module: &mut M, f: impl FnOnce(&M) -> R) -> R {
    let was_training = module.is_training();
    module.eval();
    let r = {
        let _g = no_grad();
        f(module)
    };
    module.train(was_training);
    r
}
