//! One module per subcommand. Each exposes `XxxArgs` (clap) and `run(args) -> CliResult`.

pub mod convert;
pub mod devices;
pub mod doctor;
pub mod eval;
pub mod generate;
pub mod hf_model;
pub mod inspect;
pub mod lora_args;
pub mod memory;
pub mod model_args;
pub mod monitor;
pub mod plan;
pub mod train;

/// Errors reach `main` as displayable values; `main` prints them and exits non-zero.
pub type CliResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;
