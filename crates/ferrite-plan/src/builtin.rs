//! The built-in models (`ferrite_models`' MLP, CNN, LSTM and transformer language models) as
//! planner workloads: the same builders `ferrite train` uses, fed with a batch of the trainer's
//! shapes, so a plan is of the model the trainer runs.
use ferrite_models::{
    CnnSpec, LstmSpec, MlpSpec, TransformerSpec, build_cnn, build_lstm, build_mlp, build_transformer,
};
use ferrite_nn::{CrossEntropyLoss, Module, RngHandle, mark_layer};
use ferrite_tensor::{DType, Device, Generator, Tensor};

use crate::PlanError;
use crate::workload::{StepConfig, Workload};

/// One of the trainer's models with its shape (checkpointing comes from the step settings).
#[derive(Debug, Clone)]
pub enum Builtin {
    Mlp { input: [usize; 3], hidden: usize, layers: usize, classes: usize, dropout: f64 },
    Cnn { input: [usize; 3], hidden: usize, layers: usize, classes: usize },
    Lstm { vocab: usize, hidden: usize, layers: usize, seq: usize, dropout: f64 },
    Transformer { vocab: usize, d_model: usize, heads: usize, layers: usize, seq: usize, dropout: f64 },
}

fn nn_err(e: ferrite_nn::NnError) -> PlanError {
    PlanError::Nn(e)
}

impl Workload for Builtin {
    fn describe(&self) -> String {
        match self {
            Builtin::Mlp { input, hidden, layers, classes, .. } => {
                format!("mlp {}-{}-{classes} ({layers} hidden layers)", input.iter().product::<usize>(), hidden)
            }
            Builtin::Cnn { input, hidden, layers, classes } => {
                format!(
                    "cnn {}x{}x{} input, {layers} conv blocks from {hidden} channels, {classes} classes",
                    input[0], input[1], input[2]
                )
            }
            Builtin::Lstm { vocab, hidden, layers, seq, .. } => {
                format!("lstm {layers}x{hidden}, vocab {vocab}, seq {seq}")
            }
            Builtin::Transformer { vocab, d_model, heads, layers, seq, .. } => {
                format!("transformer {layers}x{d_model}, {heads} heads, vocab {vocab}, seq {seq}")
            }
        }
    }

    fn build(&self, config: &StepConfig, device: &Device) -> Result<Box<dyn Module>, PlanError> {
        let mut g = Generator::new(0);
        let rng = RngHandle::new(1);
        let ckpt = config.checkpoint_activations;
        Ok(match *self {
            Builtin::Mlp { input, hidden, layers, classes, dropout } => {
                let spec = MlpSpec {
                    inputs: input.iter().product(),
                    hidden,
                    layers,
                    classes,
                    dropout,
                    checkpoint_activations: ckpt,
                };
                Box::new(build_mlp(&spec, device, &mut g, &rng).map_err(nn_err)?)
            }
            Builtin::Cnn { input, hidden, layers, classes } => {
                let spec = CnnSpec { input, hidden, layers, classes, checkpoint_activations: ckpt };
                Box::new(build_cnn(&spec, device, &mut g).map_err(nn_err)?)
            }
            Builtin::Lstm { vocab, hidden, layers, dropout, .. } => {
                let spec = LstmSpec { vocab, hidden, layers, dropout, checkpoint_activations: ckpt };
                Box::new(build_lstm(&spec, device, &mut g, &rng).map_err(nn_err)?)
            }
            Builtin::Transformer { vocab, d_model, heads, layers, seq, dropout } => {
                let spec =
                    TransformerSpec { vocab, d_model, heads, layers, seq, dropout, checkpoint_activations: ckpt };
                Box::new(build_transformer(&spec, device, &mut g, &rng).map_err(nn_err)?)
            }
        })
    }

    fn batch(&self, config: &StepConfig, device: &Device) -> Result<(Tensor, Tensor), PlanError> {
        let b = config.batch;
        Ok(match *self {
            Builtin::Mlp { input, .. } | Builtin::Cnn { input, .. } => {
                let x =
                    Tensor::randn_with(&[b, input[0], input[1], input[2]], DType::F32, device, &mut Generator::new(2))?;
                (x, Tensor::zeros(&[b], DType::I64, device)?)
            }
            Builtin::Lstm { seq, .. } | Builtin::Transformer { seq, .. } => {
                (Tensor::zeros(&[b, seq], DType::I64, device)?, Tensor::zeros(&[b, seq], DType::I64, device)?)
            }
        })
    }

    fn loss(&self, model: &dyn Module, x: &Tensor, y: &Tensor) -> Result<(Tensor, Vec<Tensor>), PlanError> {
        let loss_fn = CrossEntropyLoss::new();
        match self {
            Builtin::Mlp { .. } | Builtin::Cnn { .. } => {
                // The image trainer keeps the logits until the step ends (for the accuracy).
                let logits = model.forward(x)?;
                // What the loss saves is its own line in the activations by layer.
                mark_layer("loss");
                Ok((loss_fn.forward(&logits, y)?, vec![logits]))
            }
            Builtin::Lstm { .. } | Builtin::Transformer { .. } => {
                let logits = model.forward(x)?;
                mark_layer("loss");
                let vocab = logits.shape().last().copied().unwrap_or(1) as i64;
                let loss = loss_fn.forward(&logits.reshape(&[-1, vocab])?, &y.reshape(&[-1])?)?;
                Ok((loss, Vec::new()))
            }
        }
    }
}
