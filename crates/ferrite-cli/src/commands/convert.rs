//! `ferrite convert` (in progress).
use super::CliResult;

#[derive(clap::Args, Debug, Clone)]
pub struct ConvertArgs {}

pub fn run(_args: ConvertArgs) -> CliResult {
    Err("`ferrite convert` is not available in this build yet".into())
}
