//! 2-D pooling layers with PyTorch's arguments and defaults: `MaxPool2d` (kernel, stride
//! defaulting to the kernel, padding, dilation, ceil_mode), `AvgPool2d` (plus count_include_pad
//! and divisor_override) and `AdaptiveAvgPool2d` (output size). They hold no parameters; the
//! arithmetic is `ferrite_tensor::functional`'s (one kernel pass each way).
//!
//! Arguments are validated when the layer is built — a zero kernel or stride, padding over half
//! the kernel (`TensorError::PaddingTooLarge`), a zero divisor — rather than at the first
//! forward as in PyTorch, so a model that cannot run fails where it is written; an input too
//! small for one window still fails at forward, naming the layer.

use ferrite_tensor::Tensor;
use ferrite_tensor::functional::{
    AvgPool2dOptions, MaxPool2dOptions, adaptive_avg_pool2d, avg_pool2d, max_pool2d, max_pool2d_with_indices,
};

use crate::error::{Result, in_layer};
use crate::module::{Module, training_flag};

/// Max pooling over `(N, C, H, W)` or `(C, H, W)` input (PyTorch's `nn.MaxPool2d`).
#[derive(Clone, Debug)]
pub struct MaxPool2d {
    pub options: MaxPool2dOptions,
    training: bool,
}

impl MaxPool2d {
    /// A square `kernel_size` window, stride = kernel, no padding.
    pub fn new(kernel_size: usize) -> Result<MaxPool2d> {
        MaxPool2d::with_options(MaxPool2dOptions::new([kernel_size; 2]))
    }

    /// Any [`MaxPool2dOptions`] PyTorch accepts.
    pub fn with_options(options: MaxPool2dOptions) -> Result<MaxPool2d> {
        options.validate("MaxPool2d")?;
        Ok(MaxPool2d { options, training: true })
    }

    /// The same stride in both dimensions.
    pub fn stride(mut self, stride: usize) -> Result<MaxPool2d> {
        self.options.stride = Some([stride; 2]);
        MaxPool2d::with_options(self.options)
    }

    /// The same padding in both dimensions (at most half the kernel).
    pub fn padding(mut self, padding: usize) -> Result<MaxPool2d> {
        self.options.padding = [padding; 2];
        MaxPool2d::with_options(self.options)
    }

    /// The same dilation in both dimensions.
    pub fn dilation(mut self, dilation: usize) -> Result<MaxPool2d> {
        self.options.dilation = [dilation; 2];
        MaxPool2d::with_options(self.options)
    }

    pub fn ceil_mode(mut self, ceil_mode: bool) -> MaxPool2d {
        self.options.ceil_mode = ceil_mode;
        self
    }

    /// The output and the int64 position `h·W + w` of each maximum in its plane (PyTorch's
    /// `return_indices=True`, e.g. for `MaxUnpool2d`).
    pub fn forward_with_indices(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        max_pool2d_with_indices(x, &self.options).map_err(in_layer("MaxPool2d"))
    }
}

impl Module for MaxPool2d {
    fn type_name(&self) -> &'static str {
        "MaxPool2d"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        max_pool2d(x, &self.options).map_err(in_layer("MaxPool2d"))
    }
    training_flag!();
}

/// Average pooling over `(N, C, H, W)` or `(C, H, W)` input (PyTorch's `nn.AvgPool2d`).
#[derive(Clone, Debug)]
pub struct AvgPool2d {
    pub options: AvgPool2dOptions,
    training: bool,
}

impl AvgPool2d {
    /// A square `kernel_size` window, stride = kernel, no padding, padding counted.
    pub fn new(kernel_size: usize) -> Result<AvgPool2d> {
        AvgPool2d::with_options(AvgPool2dOptions::new([kernel_size; 2]))
    }

    /// Any [`AvgPool2dOptions`] PyTorch accepts.
    pub fn with_options(options: AvgPool2dOptions) -> Result<AvgPool2d> {
        options.validate("AvgPool2d")?;
        Ok(AvgPool2d { options, training: true })
    }

    pub fn stride(mut self, stride: usize) -> Result<AvgPool2d> {
        self.options.stride = Some([stride; 2]);
        AvgPool2d::with_options(self.options)
    }

    pub fn padding(mut self, padding: usize) -> Result<AvgPool2d> {
        self.options.padding = [padding; 2];
        AvgPool2d::with_options(self.options)
    }

    pub fn ceil_mode(mut self, ceil_mode: bool) -> AvgPool2d {
        self.options.ceil_mode = ceil_mode;
        self
    }

    pub fn count_include_pad(mut self, count_include_pad: bool) -> AvgPool2d {
        self.options.count_include_pad = count_include_pad;
        self
    }

    /// Divide every window's sum by `divisor` (non-zero) instead of its size.
    pub fn divisor_override(mut self, divisor: Option<usize>) -> Result<AvgPool2d> {
        self.options.divisor_override = divisor;
        AvgPool2d::with_options(self.options)
    }
}

impl Module for AvgPool2d {
    fn type_name(&self) -> &'static str {
        "AvgPool2d"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        avg_pool2d(x, &self.options).map_err(in_layer("AvgPool2d"))
    }
    training_flag!();
}

/// Adaptive average pooling to a fixed output size (PyTorch's `nn.AdaptiveAvgPool2d`):
/// output `(oh, ow)` averages input rows `⌊oh·H/OH⌋ .. ⌈(oh+1)·H/OH⌉` and the matching columns,
/// whatever the input size.
#[derive(Clone, Debug)]
pub struct AdaptiveAvgPool2d {
    /// `[height, width]`; `None` keeps that input dimension.
    pub output_size: [Option<usize>; 2],
    training: bool,
}

impl AdaptiveAvgPool2d {
    /// A square `output_size` (1 gives global average pooling).
    pub fn new(output_size: usize) -> AdaptiveAvgPool2d {
        AdaptiveAvgPool2d::with_size([Some(output_size); 2])
    }

    pub fn with_size(output_size: [Option<usize>; 2]) -> AdaptiveAvgPool2d {
        AdaptiveAvgPool2d { output_size, training: true }
    }
}

impl Module for AdaptiveAvgPool2d {
    fn type_name(&self) -> &'static str {
        "AdaptiveAvgPool2d"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        adaptive_avg_pool2d(x, self.output_size).map_err(in_layer("AdaptiveAvgPool2d"))
    }
    training_flag!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::{DType, Device, TensorError};

    #[test]
    fn configs_are_checked_when_built() {
        let e = MaxPool2d::new(3).unwrap().padding(2).unwrap_err();
        assert!(matches!(e, crate::NnError::Tensor(TensorError::PaddingTooLarge { .. })), "{e}");
        assert!(e.to_string().starts_with("MaxPool2d: pad should be at most half of kernel size"), "{e}");
        assert!(MaxPool2d::new(0).is_err());
        assert!(MaxPool2d::new(2).unwrap().stride(0).is_err());
        assert!(AvgPool2d::new(2).unwrap().divisor_override(Some(0)).is_err());
    }

    #[test]
    fn small_or_misshaped_inputs_name_the_layer() {
        let x = Tensor::zeros(&[1, 1, 2, 2], DType::F32, &Device::Cpu).unwrap();
        let e = MaxPool2d::new(3).unwrap().forward(&x).unwrap_err();
        assert!(e.to_string().starts_with("MaxPool2d: input size [2, 2]"), "{e}");
        let e =
            AvgPool2d::new(2).unwrap().forward(&Tensor::zeros(&[4, 4], DType::F32, &Device::Cpu).unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "AvgPool2d: input has shape [4, 4], expected a 3-D tensor [C, H, W] or a 4-D tensor [N, C, H, W]"
        );
        let y = AdaptiveAvgPool2d::with_size([None, Some(1)])
            .forward(&Tensor::zeros(&[2, 3, 5], DType::F32, &Device::Cpu).unwrap());
        assert_eq!(y.unwrap().shape(), &[2, 3, 1]);
    }
}
