//! The library half of the `ferrite` command. [`observe`] is the hook a training loop reports
//! through and the metrics it serves; [`commands`] holds every subcommand (its arguments and its
//! `run`), so that `src/main.rs` is only the argument parser, and so that benchmarks and the
//! fuzz targets in `fuzz/` reach the same code a user runs (the resume reader, the doctor's
//! cgroup parser, the monitor's address and exposition parsers).

pub mod commands;
pub mod headless;
pub mod observe;
pub mod plot;
