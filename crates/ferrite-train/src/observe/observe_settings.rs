//! Which outputs watch a run: a Prometheus endpoint and a JSON-lines file. The `ferrite` command
//! fills this from `--metrics-addr` / `--metrics-file`; a library user sets the fields.
use std::path::PathBuf;

use super::metrics_addr::ListenAddr;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObserveSettings {
    /// Serve Prometheus metrics on http://HOST:PORT/metrics while training (port 0 picks a free
    /// port, announced at start).
    pub metrics_addr: Option<ListenAddr>,
    /// Append the same figures as JSON lines to this file: at the start, every second, after each
    /// epoch and at the end.
    pub metrics_file: Option<PathBuf>,
}

impl ObserveSettings {
    /// Whether any output is on.
    pub fn any(&self) -> bool {
        self.metrics_addr.is_some() || self.metrics_file.is_some()
    }
}
