//! The library half of the `ferrite` command. [`commands`] holds every subcommand (its arguments
//! and its `run`), so that `src/main.rs` is only the argument parser, and so that benchmarks and
//! the fuzz targets in `fuzz/` reach the same code a user runs (the doctor's cgroup parser); the
//! training loop, its checkpoints and its metrics outputs live in the `ferrite-train` library.

pub mod commands;
pub mod headless;
pub mod observe_args;
pub mod plot;
