//! `ferrite memory` (in progress).
use super::CliResult;

#[derive(clap::Args, Debug, Clone)]
pub struct MemoryArgs {}

pub fn run(_args: MemoryArgs) -> CliResult {
    Err("`ferrite memory` is not available in this build yet".into())
}
