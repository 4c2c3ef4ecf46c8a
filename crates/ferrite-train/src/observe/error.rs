//! What can go wrong while serving, writing or reading a run's metrics, and while checking an
//! installation. Each message says what happened and what to do; the training loop never sees
//! these after it has started (a failing output is reported once and switched off).

use std::path::PathBuf;

/// Errors of `--metrics-addr`, `--metrics-file`, `ferrite monitor` and `ferrite doctor`.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error("invalid {what} `{value}`: {reason}")]
    InvalidAddress { what: &'static str, value: String, reason: String },
    #[error(
        "cannot serve metrics on {addr}: the port is in use (another `ferrite train --metrics-addr`, or another exporter). Choose another port, or `{host}:0` for any free one"
    )]
    PortInUse { addr: String, host: String },
    #[error(
        "cannot serve metrics on {addr}: that address is not one of this machine's. Use 127.0.0.1:PORT (this machine only) or 0.0.0.0:PORT (every interface)"
    )]
    AddressNotLocal { addr: String },
    #[error(
        "cannot serve metrics on {addr}: permission denied (ports below 1024 need privileges). Use a port such as 9400"
    )]
    PermissionDenied { addr: String },
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("cannot open the metrics file `{}`: {reason}. Give a writable path to --metrics-file", path.display())]
    MetricsFile { path: PathBuf, reason: String },
    #[error("cannot start the metrics thread: {0}")]
    Thread(std::io::Error),
    #[error("no metrics at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{url} answered HTTP {status}{hint}")]
    HttpStatus { url: String, status: u16, hint: String },
    #[error("{url} is not a ferrite run's metrics endpoint: {reason}")]
    NotFerrite { url: String, reason: String },
    #[error("terminal: {0} (use --once or --dmon when there is no interactive terminal)")]
    Terminal(std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}
