//! Parameter-free activation modules, for use inside `Sequential`.

use ferrite_tensor::Tensor;

use crate::error::Result;
use crate::module::{Module, training_flag};

macro_rules! activation {
    ($(#[$doc:meta])* $name:ident, $pyname:literal, |$x:ident| $body:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name {
            training: bool,
        }

        impl $name {
            pub fn new() -> $name {
                $name { training: true }
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::new()
            }
        }

        impl Module for $name {
            fn type_name(&self) -> &'static str {
                $pyname
            }
            fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                Ok($body?)
            }
            training_flag!();
        }
    };
}

activation!(
    /// max(0, x).
    ReLU, "ReLU", |x| x.relu()
);
activation!(
    /// Hyperbolic tangent.
    Tanh, "Tanh", |x| x.tanh()
);
activation!(
    /// Logistic sigmoid.
    Sigmoid, "Sigmoid", |x| x.sigmoid()
);
activation!(
    /// x·sigmoid(x) (a.k.a. swish).
    SiLU, "SiLU", |x| x.silu()
);

/// Which formula [`GELU`] uses (PyTorch's `approximate='none' | 'tanh'`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GeluApproximation {
    /// x·Φ(x) with the exact error function.
    #[default]
    None,
    /// 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))).
    Tanh,
}

/// Gaussian error linear unit.
#[derive(Clone, Debug)]
pub struct GELU {
    pub approximate: GeluApproximation,
    training: bool,
}

impl GELU {
    /// Exact GELU.
    pub fn new() -> GELU {
        GELU::with_approximation(GeluApproximation::None)
    }

    pub fn with_approximation(approximate: GeluApproximation) -> GELU {
        GELU { approximate, training: true }
    }
}

impl Default for GELU {
    fn default() -> Self {
        GELU::new()
    }
}

impl Module for GELU {
    fn type_name(&self) -> &'static str {
        "GELU"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self.approximate {
            GeluApproximation::None => x.gelu()?,
            GeluApproximation::Tanh => x.gelu_tanh()?,
        })
    }
    training_flag!();
}
