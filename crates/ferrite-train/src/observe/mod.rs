//! Watching a training run from outside: Prometheus metrics on `/metrics`, the same figures as
//! JSON lines, and the pieces `ferrite monitor` reads them back with.
//!
//! Why a module of its own: every training loop (`ferrite train`, a library `Trainer`) reports
//! through one small hook, [`RunObserver`], and nothing here knows how a model is trained. The
//! training thread only stores numbers into atomics and two histograms; the HTTP server and the
//! JSON-lines writer run on background threads and read the allocator statistics themselves, so a
//! slow scraper or a full disk never delays a step.
//!
//! - [`ObserveSettings`]: which outputs are on (the CLI's `--metrics-addr` / `--metrics-file`).
//! - [`metrics_addr`]: parsing of a listen address (`127.0.0.1:9400`, `:9400`) and of a monitor
//!   target (`host:port` or `http://host:port/metrics`).
//! - [`run_figures`]: what a run reports (live training figures, per-device allocator figures).
//! - [`exposition`]: those figures as Prometheus metrics (names, types, units).
//! - [`metrics_server`], [`metrics_file`]: the two background outputs.
//! - [`metrics_text`]: the reading side, a parser of the Prometheus text format.

mod error;
pub mod exposition;
pub mod metrics_addr;
mod metrics_file;
mod metrics_server;
pub mod metrics_text;
mod observe_settings;
pub mod run_figures;
mod run_observer;

pub use error::ObserveError;
pub use observe_settings::ObserveSettings;
pub use run_figures::RunInfo;
pub use run_observer::{BatchReport, RunObserver, StepReport};
