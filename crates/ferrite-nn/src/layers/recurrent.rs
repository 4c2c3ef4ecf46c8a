//! What `RNN`, `GRU` and `LSTM` share: PyTorch's configuration (`num_layers`, `bias`,
//! `batch_first`, inter-layer `dropout`, `bidirectional`), parameters under PyTorch's names and
//! layout (`weight_ih_l{k}[_reverse]`, `weight_hh_l{k}[_reverse]`, `bias_ih_…`, `bias_hh_…`, gates
//! stacked in PyTorch's order, every one initialised U(±1/√hidden_size)), the initial and final
//! state `(h, c)` of shape `[num_layers · num_directions, batch, hidden_size]`, and one driver
//! that stacks layers and directions over `functional::recurrent_scan` for padded and packed
//! input alike (a padded batch is the packed layout with every sequence full length).
//!
//! The three layers differ only in their cell, so each is this core behind a thin type
//! (`layers/lstm.rs`, `layers/gru.rs`, `layers/rnn.rs`) that keeps PyTorch's class name in
//! messages and state dicts.

use ferrite_tensor::functional::{RecurrentCell, RecurrentWeights, dropout, recurrent_scan};
use ferrite_tensor::{Device, Generator, Tensor};

use crate::error::{NnError, Result};
use crate::init::uniform_;
use crate::module::new_parameter;
use crate::packed_sequence::PackedSequence;
use crate::rng::RngHandle;

/// The plain RNN's activation (PyTorch's `nonlinearity`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Nonlinearity {
    #[default]
    Tanh,
    Relu,
}

/// Configuration of a recurrent layer (PyTorch's constructor arguments and defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentConfig {
    pub input_size: usize,
    pub hidden_size: usize,
    /// Stacked layers; layer `k > 0` reads layer `k - 1`'s output.
    pub num_layers: usize,
    /// Whether the layers have `bias_ih`/`bias_hh`.
    pub bias: bool,
    /// Input and output `[batch, seq, feature]` instead of `[seq, batch, feature]` (the state
    /// keeps `[layers · directions, batch, hidden]` either way, as in PyTorch).
    pub batch_first: bool,
    /// Dropout on every layer's output except the last, in training mode.
    pub dropout: f64,
    /// A second direction per layer that reads the sequence backwards; outputs are concatenated
    /// (`[.., 2 · hidden_size]`).
    pub bidirectional: bool,
    /// The plain RNN's activation (`RNN` only; the GRU and LSTM refuse `Relu`).
    pub nonlinearity: Nonlinearity,
}

impl RecurrentConfig {
    pub fn new(input_size: usize, hidden_size: usize) -> RecurrentConfig {
        RecurrentConfig {
            input_size,
            hidden_size,
            num_layers: 1,
            bias: true,
            batch_first: false,
            dropout: 0.0,
            bidirectional: false,
            nonlinearity: Nonlinearity::Tanh,
        }
    }
    pub fn num_layers(mut self, n: usize) -> Self {
        self.num_layers = n;
        self
    }
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }
    pub fn batch_first(mut self, batch_first: bool) -> Self {
        self.batch_first = batch_first;
        self
    }
    pub fn dropout(mut self, p: f64) -> Self {
        self.dropout = p;
        self
    }
    pub fn bidirectional(mut self, bidirectional: bool) -> Self {
        self.bidirectional = bidirectional;
        self
    }
    pub fn nonlinearity(mut self, nonlinearity: Nonlinearity) -> Self {
        self.nonlinearity = nonlinearity;
        self
    }

    /// 2 when bidirectional, else 1.
    pub fn num_directions(&self) -> usize {
        if self.bidirectional { 2 } else { 1 }
    }
}

/// The parameters of one layer in one direction (PyTorch's layout: `weight_ih [G·H, in]`,
/// `weight_hh [G·H, H]`, biases `[G·H]`, `G` gates stacked).
#[derive(Clone, Debug)]
pub struct RecurrentParams {
    pub weight_ih: Tensor,
    pub weight_hh: Tensor,
    pub bias_ih: Option<Tensor>,
    pub bias_hh: Option<Tensor>,
}

/// The shared body of `RNN`, `GRU` and `LSTM`.
#[derive(Clone, Debug)]
pub(crate) struct RecurrentCore {
    pub(crate) cell: RecurrentCell,
    pub(crate) layer: &'static str,
    pub(crate) config: RecurrentConfig,
    /// Layer-major, forward direction first: `l0`, `l0_reverse`, `l1`, …
    pub(crate) params: Vec<RecurrentParams>,
    pub(crate) rng: RngHandle,
    pub(crate) training: bool,
}

impl RecurrentCore {
    /// PyTorch's initialisation: every weight and bias U(±1/√hidden_size), drawn from `g` in
    /// parameter order; the dropout generator is seeded by one more draw.
    pub(crate) fn new(
        cell: RecurrentCell,
        layer: &'static str,
        config: RecurrentConfig,
        device: &Device,
        g: &mut Generator,
    ) -> Result<RecurrentCore> {
        let c = &config;
        if c.hidden_size == 0 || c.num_layers == 0 {
            return Err(NnError::config(
                layer,
                format!("hidden_size ({}) and num_layers ({}) must be positive", c.hidden_size, c.num_layers),
            ));
        }
        if !(0.0..=1.0).contains(&c.dropout) {
            return Err(NnError::config(
                layer,
                format!(
                    "dropout should be a number in range [0, 1] representing the probability of an element being zeroed, got {}",
                    c.dropout
                ),
            ));
        }
        let relu_ok = matches!(cell, RecurrentCell::RnnTanh | RecurrentCell::RnnRelu);
        if c.nonlinearity == Nonlinearity::Relu && !relu_ok {
            return Err(NnError::config(layer, "nonlinearity is an option of RNN only; use RNN for a relu cell"));
        }
        let k = 1.0 / (c.hidden_size as f64).sqrt();
        let gh = cell.gates() * c.hidden_size;
        let mut params = Vec::with_capacity(c.num_layers * c.num_directions());
        for l in 0..c.num_layers {
            let in_l = if l == 0 { c.input_size } else { c.hidden_size * c.num_directions() };
            for _ in 0..c.num_directions() {
                let mut p = |shape: &[usize]| new_parameter(shape, device, |t| uniform_(t, -k, k, g));
                let weight_ih = p(&[gh, in_l])?;
                let weight_hh = p(&[gh, c.hidden_size])?;
                let (bias_ih, bias_hh) = if c.bias { (Some(p(&[gh])?), Some(p(&[gh])?)) } else { (None, None) };
                params.push(RecurrentParams { weight_ih, weight_hh, bias_ih, bias_hh });
            }
        }
        let rng = RngHandle::derived_from(g);
        Ok(RecurrentCore { cell, layer, config, params, rng, training: true })
    }

    /// PyTorch's name suffix of the parameters at `index` (`l1_reverse`).
    fn suffix(&self, index: usize) -> String {
        let d = self.config.num_directions();
        format!("l{}{}", index / d, if index % d == 1 { "_reverse" } else { "" })
    }

    pub(crate) fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut v = Vec::new();
        for (i, p) in self.params.iter().enumerate() {
            let s = self.suffix(i);
            v.push((format!("weight_ih_{s}"), &p.weight_ih));
            v.push((format!("weight_hh_{s}"), &p.weight_hh));
            if let (Some(bi), Some(bh)) = (&p.bias_ih, &p.bias_hh) {
                v.push((format!("bias_ih_{s}"), bi));
                v.push((format!("bias_hh_{s}"), bh));
            }
        }
        v
    }

    pub(crate) fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let names: Vec<String> = (0..self.params.len()).map(|i| self.suffix(i)).collect();
        let mut v = Vec::new();
        for (p, s) in self.params.iter_mut().zip(names) {
            v.push((format!("weight_ih_{s}"), &mut p.weight_ih));
            v.push((format!("weight_hh_{s}"), &mut p.weight_hh));
            if let (Some(bi), Some(bh)) = (&mut p.bias_ih, &mut p.bias_hh) {
                v.push((format!("bias_ih_{s}"), bi));
                v.push((format!("bias_hh_{s}"), bh));
            }
        }
        v
    }

    /// The expected state shape for `batch` sequences (`None`: unbatched).
    fn state_shape(&self, batch: Option<usize>) -> Vec<usize> {
        let c = &self.config;
        let mut s = vec![c.num_layers * c.num_directions()];
        s.extend(batch);
        s.push(c.hidden_size);
        s
    }

    /// Check the initial states against the expected shape.
    fn check_initial(&self, h0: Option<&Tensor>, c0: Option<&Tensor>, batch: Option<usize>) -> Result<()> {
        let expected = self.state_shape(batch);
        for (arg, t) in [("h_0", h0), ("c_0", c0)] {
            if let Some(t) = t
                && t.shape() != expected.as_slice()
            {
                return Err(NnError::StateShape {
                    layer: self.layer,
                    arg,
                    shape: t.shape().to_vec(),
                    expected: expected.clone(),
                });
            }
        }
        Ok(())
    }

    fn layout(&self) -> &'static str {
        if self.config.batch_first { "batch, seq" } else { "seq, batch" }
    }

    /// Padded input `[seq, batch, in]` / `[batch, seq, in]` (or unbatched `[seq, in]`) from
    /// the initial states `h0`, `c0` (zeros when absent): the output and the final `h`, `c`.
    pub(crate) fn forward_padded(
        &self,
        x: &Tensor,
        h0: Option<&Tensor>,
        c0: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let c = &self.config;
        if !(x.rank() == 2 || x.rank() == 3) || x.shape()[x.rank() - 1] != c.input_size {
            return Err(NnError::InputShape {
                layer: self.layer,
                shape: x.shape().to_vec(),
                layout: self.layout(),
                input_size: c.input_size,
            });
        }
        let unbatched = x.rank() == 2;
        let tm = if unbatched {
            x.unsqueeze(1)?
        } else if c.batch_first {
            x.transpose(0, 1)?
        } else {
            x.clone()
        };
        let (steps, batch) = (tm.shape()[0], tm.shape()[1]);
        if steps == 0 || batch == 0 {
            let what = if steps == 0 { "the input" } else { "the batch" };
            return Err(NnError::EmptySequence { op: self.layer, what, index: 0 });
        }
        self.check_initial(h0, c0, (!unbatched).then_some(batch))?;
        let batched = |t: Option<&Tensor>| -> Result<Option<Tensor>> {
            Ok(match t {
                Some(t) if unbatched => Some(t.unsqueeze(1)?),
                Some(t) => Some(t.clone()),
                None => None,
            })
        };
        let (h0, c0) = (batched(h0)?, batched(c0)?);
        let rows = tm.reshape_usize(&[steps * batch, c.input_size])?;
        let (out, h_n, c_n) = self.run(&rows, &vec![batch; steps], h0.as_ref(), c0.as_ref())?;
        let width = out.shape()[1];
        let out = out.reshape_usize(&[steps, batch, width])?;
        let (out, h_n, c_n) = if unbatched {
            (out.squeeze(1)?, h_n.squeeze(1)?, c_n.map(|c| c.squeeze(1)).transpose()?)
        } else if c.batch_first {
            (out.transpose(0, 1)?, h_n, c_n)
        } else {
            (out, h_n, c_n)
        };
        Ok((out, h_n, c_n))
    }

    /// Packed input: the output is packed the same way; the final states are in the caller's
    /// sequence order (the initial ones are read in it too).
    pub(crate) fn forward_packed(
        &self,
        x: &PackedSequence,
        h0: Option<&Tensor>,
        c0: Option<&Tensor>,
    ) -> Result<(PackedSequence, Tensor, Option<Tensor>)> {
        let c = &self.config;
        if let Some(bf) = x.batch_first()
            && bf != c.batch_first
        {
            return Err(NnError::PackedLayout {
                layer: self.layer,
                packed_batch_first: bf,
                layer_batch_first: c.batch_first,
            });
        }
        let data = x.data();
        if data.rank() != 2 || data.shape()[1] != c.input_size {
            return Err(NnError::PackedShape {
                layer: self.layer,
                shape: data.shape().to_vec(),
                input_size: c.input_size,
            });
        }
        self.check_initial(h0, c0, Some(x.batch()))?;
        // The scan runs in packed (sorted) order; states come and go in the caller's.
        let sorted = x.sorted_tensor()?;
        let permute = |t: Option<&Tensor>, idx: &Option<Tensor>| -> Result<Option<Tensor>> {
            Ok(match (t, idx) {
                (Some(t), Some(i)) => Some(t.index_select(1, i)?),
                (Some(t), None) => Some(t.clone()),
                (None, _) => None,
            })
        };
        let (h0, c0) = (permute(h0, &sorted)?, permute(c0, &sorted)?);
        let (out, h_n, c_n) = self.run(data, x.batch_sizes(), h0.as_ref(), c0.as_ref())?;
        let unsorted = x.unsorted_tensor()?;
        let h_n = permute(Some(&h_n), &unsorted)?.unwrap_or(h_n);
        let c_n = match c_n {
            Some(c) => permute(Some(&c), &unsorted)?,
            None => None,
        };
        Ok((x.with_data(out)?, h_n, c_n))
    }

    /// Every layer and direction over packed rows `[N, in]`; returns the last layer's output
    /// `[N, directions · hidden]` and the stacked final states.
    fn run(
        &self,
        rows: &Tensor,
        batch_sizes: &[usize],
        h0: Option<&Tensor>,
        c0: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let c = &self.config;
        let dirs = c.num_directions();
        let mut input = rows.clone();
        let (mut hs, mut cs) = (Vec::new(), Vec::new());
        for l in 0..c.num_layers {
            let mut outs = Vec::with_capacity(dirs);
            for d in 0..dirs {
                let i = l * dirs + d;
                let p = &self.params[i];
                let w = RecurrentWeights {
                    w_ih: &p.weight_ih,
                    w_hh: &p.weight_hh,
                    b_ih: p.bias_ih.as_ref(),
                    b_hh: p.bias_hh.as_ref(),
                };
                let h = h0.map(|h| h.select(0, i as i64)).transpose()?;
                let cc = c0.map(|c| c.select(0, i as i64)).transpose()?;
                let r = recurrent_scan(self.cell, &input, batch_sizes, w, h.as_ref(), cc.as_ref(), d == 1)?;
                outs.push(r.output);
                hs.push(r.h_n);
                cs.extend(r.c_n);
            }
            input = if dirs == 2 { Tensor::cat(&[&outs[0], &outs[1]], 1)? } else { outs.swap_remove(0) };
            if self.training && c.dropout > 0.0 && l + 1 < c.num_layers {
                input = self.rng.with(|g| dropout(&input, c.dropout, true, g))?;
            }
        }
        let stack = |v: &[Tensor]| Tensor::stack(&v.iter().collect::<Vec<_>>(), 0);
        let h_n = stack(&hs)?;
        let c_n = if cs.is_empty() { None } else { Some(stack(&cs)?) };
        Ok((input, h_n, c_n))
    }
}

/// Defines a recurrent layer type over [`RecurrentCore`]: the struct, its constructors and
/// accessors, and its `Module` implementation (`forward` from zero state). `$cell` picks the cell
/// from the configuration. Each layer's file adds the forwards with its state type.
macro_rules! recurrent_layer {
    ($(#[$doc:meta])* $name:ident, $label:literal, $cell:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name {
            core: $crate::layers::recurrent::RecurrentCore,
        }

        impl $name {
            /// On the CPU with biases, initialised from the process default generator.
            pub fn new(
                input_size: usize,
                hidden_size: usize,
                num_layers: usize,
                batch_first: bool,
            ) -> $crate::Result<$name> {
                let config = $crate::layers::recurrent::RecurrentConfig::new(input_size, hidden_size)
                    .num_layers(num_layers)
                    .batch_first(batch_first);
                ferrite_tensor::random::with_default_generator(|g| {
                    $name::from_config(config, &ferrite_tensor::Device::Cpu, g)
                })
            }

            /// Unidirectional, without dropout, on `device`, initialised from `g`.
            pub fn new_with(
                input_size: usize,
                hidden_size: usize,
                num_layers: usize,
                bias: bool,
                batch_first: bool,
                device: &ferrite_tensor::Device,
                g: &mut ferrite_tensor::Generator,
            ) -> $crate::Result<$name> {
                let config = $crate::layers::recurrent::RecurrentConfig::new(input_size, hidden_size)
                    .num_layers(num_layers)
                    .bias(bias)
                    .batch_first(batch_first);
                $name::from_config(config, device, g)
            }

            /// Any configuration (bidirectional, dropout, …), on `device`, initialised from `g`
            /// with PyTorch's U(±1/√hidden_size).
            pub fn from_config(
                config: $crate::layers::recurrent::RecurrentConfig,
                device: &ferrite_tensor::Device,
                g: &mut ferrite_tensor::Generator,
            ) -> $crate::Result<$name> {
                let cell = ($cell)(&config);
                Ok($name { core: $crate::layers::recurrent::RecurrentCore::new(cell, $label, config, device, g)? })
            }

            /// The configuration.
            pub fn config(&self) -> &$crate::layers::recurrent::RecurrentConfig {
                &self.core.config
            }

            /// The parameters of each layer and direction (`l0`, `l0_reverse`, `l1`, …).
            pub fn params(&self) -> &[$crate::layers::recurrent::RecurrentParams] {
                &self.core.params
            }

            /// The generator inter-layer dropout draws from.
            pub fn rng(&self) -> &$crate::rng::RngHandle {
                &self.core.rng
            }

            /// Draw inter-layer dropout masks from `rng` instead of the layer's own generator.
            pub fn with_rng(mut self, rng: $crate::rng::RngHandle) -> $name {
                self.core.rng = rng;
                self
            }
        }

        impl $crate::module::Module for $name {
            fn type_name(&self) -> &'static str {
                $label
            }
            fn forward(&self, x: &ferrite_tensor::Tensor) -> $crate::Result<ferrite_tensor::Tensor> {
                Ok(self.core.forward_padded(x, None, None)?.0)
            }
            fn own_parameters(&self) -> Vec<(String, &ferrite_tensor::Tensor)> {
                self.core.own_parameters()
            }
            fn own_parameters_mut(&mut self) -> Vec<(String, &mut ferrite_tensor::Tensor)> {
                self.core.own_parameters_mut()
            }
            fn is_training(&self) -> bool {
                self.core.training
            }
            fn set_own_training(&mut self, training: bool) {
                self.core.training = training;
            }
        }
    };
}
pub(crate) use recurrent_layer;

/// The forwards of a layer whose state is `h` alone (`GRU`, `RNN`).
macro_rules! hidden_state_forwards {
    ($name:ident) => {
        impl $name {
            /// Full forward of a padded batch (`[seq, batch, in]`, or batch-first, or one
            /// unbatched `[seq, in]`) from the initial state `h_0` (`[layers · directions, batch,
            /// hidden]`; zeros when `None`): the output at every step (`[.., directions ·
            /// hidden]`) and the final state `h_n`.
            pub fn forward_with_state(
                &self,
                x: &ferrite_tensor::Tensor,
                h_0: Option<&ferrite_tensor::Tensor>,
            ) -> $crate::Result<(ferrite_tensor::Tensor, ferrite_tensor::Tensor)> {
                let (y, h, _) = self.core.forward_padded(x, h_0, None)?;
                Ok((y, h))
            }

            /// Forward of a packed batch: the output packed the same way and each sequence's
            /// state after its last valid step, in the caller's sequence order (as is `h_0`).
            pub fn forward_packed(
                &self,
                x: &$crate::packed_sequence::PackedSequence,
                h_0: Option<&ferrite_tensor::Tensor>,
            ) -> $crate::Result<($crate::packed_sequence::PackedSequence, ferrite_tensor::Tensor)> {
                let (y, h, _) = self.core.forward_packed(x, h_0, None)?;
                Ok((y, h))
            }
        }
    };
}
pub(crate) use hidden_state_forwards;
