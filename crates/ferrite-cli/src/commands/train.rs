//! `ferrite train` (in progress).
use super::CliResult;

#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {}

pub fn run(_args: TrainArgs) -> CliResult {
    Err("`ferrite train` is not available in this build yet".into())
}

impl TrainArgs {
    /// The configuration `ferrite` with no arguments runs.
    pub fn default_demo() -> Self {
        TrainArgs {}
    }
}
