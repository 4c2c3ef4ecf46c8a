//! The flags that turn a run's outputs on. A trainer adds them with `#[command(flatten)]`, so
//! every model's trainer has the same `--metrics-addr` and `--metrics-file`.

use std::path::PathBuf;

use ferrite_train::observe::ObserveSettings;
use ferrite_train::observe::metrics_addr::{ListenAddr, parse_listen_addr};

#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct ObserveArgs {
    /// Serve Prometheus metrics on http://HOST:PORT/metrics while training (`127.0.0.1:9400`;
    /// `:9400` listens on every interface; port 0 picks a free port, printed at start).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen_addr)]
    pub metrics_addr: Option<ListenAddr>,
    /// Append the same figures as JSON lines to this file: at the start, every second, after each
    /// epoch and at the end.
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,
}

impl ObserveArgs {
    /// Whether any output is on.
    pub fn any(&self) -> bool {
        self.settings().any()
    }

    /// The trainer's settings of these flags.
    pub fn settings(&self) -> ObserveSettings {
        ObserveSettings { metrics_addr: self.metrics_addr.clone(), metrics_file: self.metrics_file.clone() }
    }
}
