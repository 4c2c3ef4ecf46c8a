//! Convolution layers — `Conv1d`, `Conv2d`, `ConvTranspose2d` — over
//! `ferrite_tensor::functional::{conv1d, conv2d, conv_transpose2d}`, with PyTorch's constructor
//! arguments, weight layouts (`[out, in/groups, k…]`; transposed `[in, out/groups, k…]`),
//! initialisation (`kaiming_uniform_(a=√5)`, bias U(±1/√fan_in)) and state-dict keys (`weight`,
//! `bias`), so weights move between the two frameworks unchanged.
//!
//! A configuration that cannot work is refused when the layer is built, not at the first
//! forward: channels not divisible by `groups` ([`NnError::NotDivisible`]), zero sizes, or
//! `padding="same"` with a stride. Input errors at forward (rank, channel count, a kernel larger
//! than the padded input) are the tensor layer's typed shape errors, reported under the layer's
//! name. Only `padding_mode="zeros"` exists.

use ferrite_tensor::functional::{
    Conv1dOptions, Conv2dOptions, ConvOptions, ConvTranspose2dOptions, Padding, SpatialSize, conv_transpose2d, conv1d,
    conv2d,
};
use ferrite_tensor::random::with_default_generator;
use ferrite_tensor::{Device, Generator, Tensor, TensorError};

use crate::error::{NnError, Result};
use crate::init::{FanMode, Nonlinearity, fan_in_and_fan_out, kaiming_uniform_, uniform_};
use crate::module::{Module, new_parameter, training_flag, weight_and_bias, weight_and_bias_mut};

/// Constructor arguments of [`Conv1d`] / [`Conv2d`] with PyTorch's defaults (stride 1, padding 0,
/// dilation 1, groups 1, bias on): `Conv2dConfig::new(3, 64, 3).padding(1)`.
///
/// Stride, padding, dilation and groups are the functional form's [`ConvOptions`], held as
/// they are and set through its builder, so the layer and `conv1d`/`conv2d` share one
/// definition of those arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvConfig<const N: usize> {
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel_size: [usize; N],
    pub options: ConvOptions<N>,
    pub bias: bool,
}

/// Configuration of [`Conv1d`].
pub type Conv1dConfig = ConvConfig<1>;
/// Configuration of [`Conv2d`].
pub type Conv2dConfig = ConvConfig<2>;

impl<const N: usize> ConvConfig<N> {
    pub fn new(in_channels: usize, out_channels: usize, kernel_size: impl SpatialSize<N>) -> Self {
        ConvConfig {
            in_channels,
            out_channels,
            kernel_size: kernel_size.per_dim(),
            options: ConvOptions::default(),
            bias: true,
        }
    }
    /// The options changed by `f` (one of [`ConvOptions`]' setters).
    fn with(mut self, f: impl FnOnce(ConvOptions<N>) -> ConvOptions<N>) -> Self {
        self.options = f(self.options);
        self
    }
    pub fn stride(self, s: impl SpatialSize<N>) -> Self {
        self.with(|o| o.stride(s))
    }
    /// A size, a size per dimension, or [`Padding::Same`] / [`Padding::Valid`].
    pub fn padding(self, p: impl Into<Padding<N>>) -> Self {
        self.with(|o| o.padding(p))
    }
    pub fn dilation(self, d: impl SpatialSize<N>) -> Self {
        self.with(|o| o.dilation(d))
    }
    pub fn groups(self, g: usize) -> Self {
        self.with(|o| o.groups(g))
    }
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }
    /// The functional form's options.
    pub fn options(&self) -> ConvOptions<N> {
        self.options
    }
}

/// Constructor arguments of [`ConvTranspose2d`] with PyTorch's defaults (stride 1, padding 0,
/// output_padding 0, dilation 1, groups 1, bias on); the arguments after the channels and
/// kernel size are the functional form's [`ConvTranspose2dOptions`], as for [`ConvConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel_size: [usize; 2],
    pub options: ConvTranspose2dOptions,
    pub bias: bool,
}

impl ConvTranspose2dConfig {
    pub fn new(in_channels: usize, out_channels: usize, kernel_size: impl SpatialSize<2>) -> Self {
        ConvTranspose2dConfig {
            in_channels,
            out_channels,
            kernel_size: kernel_size.per_dim(),
            options: ConvTranspose2dOptions::default(),
            bias: true,
        }
    }
    /// The options changed by `f` (one of [`ConvTranspose2dOptions`]' setters).
    fn with(mut self, f: impl FnOnce(ConvTranspose2dOptions) -> ConvTranspose2dOptions) -> Self {
        self.options = f(self.options);
        self
    }
    pub fn stride(self, s: impl SpatialSize<2>) -> Self {
        self.with(|o| o.stride(s))
    }
    pub fn padding(self, p: impl SpatialSize<2>) -> Self {
        self.with(|o| o.padding(p))
    }
    pub fn output_padding(self, p: impl SpatialSize<2>) -> Self {
        self.with(|o| o.output_padding(p))
    }
    pub fn dilation(self, d: impl SpatialSize<2>) -> Self {
        self.with(|o| o.dilation(d))
    }
    pub fn groups(self, g: usize) -> Self {
        self.with(|o| o.groups(g))
    }
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }
    /// The functional form's options.
    pub fn options(&self) -> ConvTranspose2dOptions {
        self.options
    }
}

/// A convolution over `N` spatial dimensions: [`Conv1d`] (`N = 1`, input `[batch, channels,
/// length]`) or [`Conv2d`] (`N = 2`, input `[batch, channels, height, width]`); unbatched inputs
/// (no batch dimension) work too. Parameters `weight [out_channels, in_channels/groups,
/// *kernel_size]` and optional `bias [out_channels]`.
#[derive(Clone, Debug)]
pub struct ConvNd<const N: usize> {
    pub config: ConvConfig<N>,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    training: bool,
}

/// `nn.Conv1d`.
pub type Conv1d = ConvNd<1>;
/// `nn.Conv2d`.
pub type Conv2d = ConvNd<2>;

/// The layer's name (`Conv1d`, `Conv2d`) for messages and `type_name`.
const fn conv_name(n: usize) -> &'static str {
    if n == 1 { "Conv1d" } else { "Conv2d" }
}

/// Errors common to every convolution's configuration.
fn check_sizes(
    layer: &'static str,
    kernel: &[usize],
    stride: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Result<()> {
    if groups == 0 {
        return Err(NnError::config(layer, "groups must be a positive integer, got 0"));
    }
    for (arg, v) in [("kernel_size", kernel), ("stride", stride), ("dilation", dilation)] {
        if v.contains(&0) {
            return Err(NnError::config(layer, format!("{arg} must be positive in every dimension, got {v:?}")));
        }
    }
    Ok(())
}

fn check_divisible(layer: &'static str, arg: &'static str, value: usize, groups: usize) -> Result<()> {
    if value.is_multiple_of(groups) {
        Ok(())
    } else {
        Err(NnError::NotDivisible { layer, arg, value, divisor_arg: "groups", divisor: groups })
    }
}

/// PyTorch's `_ConvNd.reset_parameters`: weight `kaiming_uniform_(a=√5)` (U(±1/√fan_in)), bias
/// U(±1/√fan_in), fan_in = `weight.shape[1]·∏kernel` (for a transposed layer too, as in PyTorch).
fn init_parameters(
    weight_shape: &[usize],
    bias_len: Option<usize>,
    device: &Device,
    g: &mut Generator,
) -> Result<(Tensor, Option<Tensor>)> {
    let fan_in: usize = weight_shape[1..].iter().product();
    let weight = new_parameter(weight_shape, device, |w| {
        if fan_in == 0 { Ok(()) } else { kaiming_uniform_(w, 5f64.sqrt(), FanMode::FanIn, Nonlinearity::LeakyRelu, g) }
    })?;
    let bias = match bias_len {
        Some(len) => Some(new_parameter(&[len], device, |b| {
            let (fan_in, _) = fan_in_and_fan_out(&weight)?;
            if fan_in == 0 {
                return Ok(());
            }
            let bound = 1.0 / (fan_in as f64).sqrt();
            uniform_(b, -bound, bound, g)
        })?),
        None => None,
    };
    Ok((weight, bias))
}

/// A functional convolution's error about the input, reported under the layer's name.
fn as_layer_error(e: TensorError, layer: &'static str) -> NnError {
    match e {
        TensorError::InvalidShape { arg, shape, expected, .. } => {
            NnError::Tensor(TensorError::InvalidShape { op: layer, arg, shape, expected })
        }
        TensorError::InputTooSmall { input, kernel, .. } => {
            NnError::Tensor(TensorError::InputTooSmall { op: layer, input, kernel })
        }
        other => NnError::Tensor(other),
    }
}

impl<const N: usize> ConvNd<N> {
    /// On the CPU, initialised from the process default generator.
    pub fn new(config: ConvConfig<N>) -> Result<Self> {
        with_default_generator(|g| Self::new_with(config, &Device::Cpu, g))
    }

    /// PyTorch's initialisation drawn from `g`, allocated directly on `device`.
    pub fn new_with(config: ConvConfig<N>, device: &Device, g: &mut Generator) -> Result<Self> {
        const { assert!(N == 1 || N == 2, "ConvNd has one or two spatial dimensions") };
        let layer = conv_name(N);
        let (c, o) = (&config, &config.options);
        check_sizes(layer, &c.kernel_size, &o.stride, &o.dilation, o.groups)?;
        check_divisible(layer, "in_channels", c.in_channels, o.groups)?;
        check_divisible(layer, "out_channels", c.out_channels, o.groups)?;
        if o.padding == Padding::Same && o.stride.iter().any(|&s| s != 1) {
            return Err(NnError::config(
                layer,
                format!("padding=\"same\" is not supported for strided convolutions (stride {:?})", o.stride),
            ));
        }
        let mut shape = vec![c.out_channels, c.in_channels / o.groups];
        shape.extend_from_slice(&c.kernel_size);
        let (weight, bias) = init_parameters(&shape, c.bias.then_some(c.out_channels), device, g)?;
        Ok(ConvNd { config, weight, bias, training: true })
    }
}

/// `[usize; N]` as `[usize; M]` (the same array when `M == N`, which is the only way it is used).
fn same_len<const N: usize, const M: usize>(a: [usize; N]) -> [usize; M] {
    std::array::from_fn(|i| a[i])
}

fn same_padding<const N: usize, const M: usize>(p: Padding<N>) -> Padding<M> {
    match p {
        Padding::Valid => Padding::Valid,
        Padding::Same => Padding::Same,
        Padding::Explicit(p) => Padding::Explicit(same_len(p)),
    }
}

impl<const N: usize> Module for ConvNd<N> {
    fn type_name(&self) -> &'static str {
        conv_name(N)
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let o = self.config.options();
        let y = if N == 1 {
            let o1 = Conv1dOptions {
                stride: same_len(o.stride),
                padding: same_padding(o.padding),
                dilation: same_len(o.dilation),
                groups: o.groups,
            };
            conv1d(x, &self.weight, self.bias.as_ref(), &o1)
        } else {
            let o2 = Conv2dOptions {
                stride: same_len(o.stride),
                padding: same_padding(o.padding),
                dilation: same_len(o.dilation),
                groups: o.groups,
            };
            conv2d(x, &self.weight, self.bias.as_ref(), &o2)
        };
        y.map_err(|e| as_layer_error(e, conv_name(N)))
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_and_bias_mut(&mut self.weight, &mut self.bias)
    }
    training_flag!();
}

/// `nn.ConvTranspose2d`: `[batch, in_channels, h, w]` (or unbatched) →
/// `[batch, out_channels, (h−1)·stride − 2·padding + dilation·(k−1) + output_padding + 1, …]`.
/// Parameters `weight [in_channels, out_channels/groups, kh, kw]` and optional
/// `bias [out_channels]`.
#[derive(Clone, Debug)]
pub struct ConvTranspose2d {
    pub config: ConvTranspose2dConfig,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    training: bool,
}

impl ConvTranspose2d {
    /// On the CPU, initialised from the process default generator.
    pub fn new(config: ConvTranspose2dConfig) -> Result<Self> {
        with_default_generator(|g| Self::new_with(config, &Device::Cpu, g))
    }

    /// PyTorch's initialisation drawn from `g`, allocated directly on `device`.
    pub fn new_with(config: ConvTranspose2dConfig, device: &Device, g: &mut Generator) -> Result<Self> {
        let layer = "ConvTranspose2d";
        let (c, o) = (&config, &config.options);
        check_sizes(layer, &c.kernel_size, &o.stride, &o.dilation, o.groups)?;
        check_divisible(layer, "in_channels", c.in_channels, o.groups)?;
        check_divisible(layer, "out_channels", c.out_channels, o.groups)?;
        if (0..2).any(|d| o.output_padding[d] >= o.stride[d] && o.output_padding[d] >= o.dilation[d]) {
            return Err(NnError::config(
                layer,
                format!(
                    "output_padding {:?} must be smaller than either the stride {:?} or the dilation {:?} in every dimension",
                    o.output_padding, o.stride, o.dilation
                ),
            ));
        }
        let shape = [c.in_channels, c.out_channels / o.groups, c.kernel_size[0], c.kernel_size[1]];
        let (weight, bias) = init_parameters(&shape, c.bias.then_some(c.out_channels), device, g)?;
        Ok(ConvTranspose2d { config, weight, bias, training: true })
    }
}

impl Module for ConvTranspose2d {
    fn type_name(&self) -> &'static str {
        "ConvTranspose2d"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        conv_transpose2d(x, &self.weight, self.bias.as_ref(), &self.config.options())
            .map_err(|e| as_layer_error(e, "ConvTranspose2d"))
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_and_bias_mut(&mut self.weight, &mut self.bias)
    }
    training_flag!();
}
