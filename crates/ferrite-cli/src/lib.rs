//! The library half of the `ferrite` command: what other programs (and benchmarks) can reuse
//! from it. Today that is [`observe`], the hook a training loop reports through and the metrics
//! it serves; the subcommands themselves live in the binary (`src/main.rs`).

pub mod observe;
