//! Small models that several test files train the same way; defined once so that the suites
//! comparing them (one device against several, one process against several) build the same model.

use ferrite_nn::{Linear, Sequential, Tanh};
use ferrite_tensor::{Device, Generator};

/// `Linear(6,16) - Tanh - Linear(16,3)` on the CPU, initialised from `Generator::new(seed)`.
pub fn mlp(seed: u64) -> Sequential {
    let mut g = Generator::new(seed);
    Sequential::new()
        .append(Linear::new_with(6, 16, true, &Device::Cpu, &mut g).expect("Linear(6,16)"))
        .append(Tanh::new())
        .append(Linear::new_with(16, 3, true, &Device::Cpu, &mut g).expect("Linear(16,3)"))
}
