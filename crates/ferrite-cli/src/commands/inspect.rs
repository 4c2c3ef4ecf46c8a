//! `ferrite inspect` (in progress).
use super::CliResult;

#[derive(clap::Args, Debug, Clone)]
pub struct InspectArgs {}

pub fn run(_args: InspectArgs) -> CliResult {
    Err("`ferrite inspect` is not available in this build yet".into())
}
