//! The flags that choose and shape a built-in model, shared by `ferrite train` and `ferrite plan`
//! (`#[command(flatten)]`), so that a plan is of exactly the model the trainer builds and neither
//! command copies the other's fields.
use ferrite_plan::{AmpMode, Builtin, PlanError};

/// The model family (`--model`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// Multi-layer perceptron on flattened images.
    Mlp,
    /// Convolutional network: conv3x3-batchnorm-ReLU-maxpool blocks, then a linear head.
    Cnn,
    /// Character-level LSTM language model, trained with truncated BPTT.
    Lstm,
    /// Character-level decoder-only transformer language model.
    Transformer,
}

impl ModelKind {
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
            ModelKind::Lstm => "lstm",
            ModelKind::Transformer => "transformer",
        }
    }

    /// Whether the model reads text (else images).
    pub fn is_language_model(self) -> bool {
        matches!(self, ModelKind::Lstm | ModelKind::Transformer)
    }
}

/// Low-precision autocast for `--amp`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amp {
    Bf16,
    F16,
}

impl Amp {
    pub fn name(self) -> &'static str {
        self.mode().name()
    }

    /// The low-precision dtype autocast runs linears in.
    pub fn dtype(self) -> ferrite_tensor::DType {
        self.mode().dtype()
    }

    /// The trainer's (and planner's) precision of this flag.
    pub fn mode(self) -> AmpMode {
        match self {
            Amp::Bf16 => AmpMode::Bf16,
            Amp::F16 => AmpMode::F16,
        }
    }
}

/// The shape of a built-in model: `ferrite train` and `ferrite plan` flatten these flags.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct ModelArgs {
    /// Width of each hidden layer (MLP; the hidden state of the LSTM; the first conv block's
    /// channels of the CNN, doubling per block). Default: 128 (MLP), 256 (LSTM), 32 (CNN).
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Number of hidden layers (MLP), conv blocks (CNN, each halving the image), stacked LSTM
    /// layers, or transformer blocks. Default: 2 (MLP, CNN, transformer), 1 (LSTM).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Width of the transformer (embedding and residual stream).
    #[arg(long, default_value_t = 128)]
    pub d_model: usize,
    /// Attention heads of the transformer (must divide --d-model).
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Tokens per sample: the characters per chunk of a language model (the transformer's
    /// context, the LSTM's truncated-BPTT length), or of a Hugging Face model.
    #[arg(long, visible_alias = "bptt", default_value_t = 64)]
    pub seq: usize,
    /// Dropout probability (after each hidden activation; in every transformer block; between
    /// the LSTM's input and output projections) (0 = none).
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
}

impl Default for ModelArgs {
    fn default() -> Self {
        ModelArgs { hidden: None, layers: None, d_model: 128, heads: 4, seq: 64, dropout: 0.0 }
    }
}

impl ModelArgs {
    /// `--hidden`, or `kind`'s default width.
    pub fn hidden(&self, kind: ModelKind) -> usize {
        self.hidden.unwrap_or(match kind {
            ModelKind::Lstm => 256,
            ModelKind::Cnn => 32,
            ModelKind::Mlp | ModelKind::Transformer => 128,
        })
    }

    /// `--layers`, or `kind`'s default depth.
    pub fn layers(&self, kind: ModelKind) -> usize {
        self.layers.unwrap_or(if kind == ModelKind::Lstm { 1 } else { 2 })
    }

    /// The planner's workload of this model: image models read the images of `dataset`
    /// (`digits` or `fashion-mnist`), language models a vocabulary of `vocab` characters.
    pub fn builtin(&self, kind: ModelKind, dataset: &str, vocab: usize) -> Result<Builtin, PlanError> {
        let bad = |what: String, reason: &str| PlanError::InvalidSetting { what, reason: reason.to_string() };
        let (hidden, layers) = (self.hidden(kind), self.layers(kind));
        if hidden == 0 || layers == 0 || self.seq == 0 || vocab == 0 {
            return Err(bad(
                format!("--hidden {hidden} --layers {layers} --seq {} --vocab {vocab}", self.seq),
                "every size must be at least 1",
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(bad(format!("--dropout {}", self.dropout), "must be in [0, 1)"));
        }
        let image = image_shape(dataset)?;
        Ok(match kind {
            ModelKind::Mlp => Builtin::Mlp { input: image, hidden, layers, classes: 10, dropout: self.dropout },
            ModelKind::Cnn => {
                if layers > ferrite_models::CnnSpec::max_layers(image) {
                    return Err(bad(
                        format!("--layers {layers}"),
                        "more conv blocks than 2x2 poolings the images allow",
                    ));
                }
                Builtin::Cnn { input: image, hidden, layers, classes: 10 }
            }
            ModelKind::Lstm => Builtin::Lstm { vocab, hidden, layers, seq: self.seq, dropout: self.dropout },
            ModelKind::Transformer => {
                if self.heads == 0 || self.d_model == 0 || !self.d_model.is_multiple_of(self.heads) {
                    return Err(bad(
                        format!("--heads {} with --d-model {}", self.heads, self.d_model),
                        "the heads must divide the width (each head gets d_model / heads dimensions)",
                    ));
                }
                Builtin::Transformer {
                    vocab,
                    d_model: self.d_model,
                    heads: self.heads,
                    layers,
                    seq: self.seq,
                    dropout: self.dropout,
                }
            }
        })
    }
}

/// The image shape of a built-in image dataset the planner knows (`digits`, `fashion-mnist`).
pub fn image_shape(dataset: &str) -> Result<[usize; 3], PlanError> {
    match dataset {
        "digits" => Ok([1, 8, 8]),
        "fashion-mnist" => Ok([1, 28, 28]),
        other => Err(PlanError::InvalidSetting {
            what: format!("--dataset {other}"),
            reason: "the image models plan for `digits` or `fashion-mnist`".into(),
        }),
    }
}
