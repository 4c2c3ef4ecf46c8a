//! The `/metrics` endpoint: a `tiny_http` server on its own thread.
//!
//! Why a thread and not the training loop: a scrape encodes a few kilobytes and reads the
//! allocators (a short lock each); doing that between steps would tie step time to the scraper.
//! The server thread only shares atomics, two histograms and the allocators' own locks with the
//! training thread. Errors answering one scraper (it hung up) are that scraper's problem; the
//! server goes on.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::ObserveError;
use super::exposition::{CONTENT_TYPE, RunMetrics};
use super::metrics_addr::{ListenAddr, METRICS_PATH};

/// A running endpoint; stops when dropped.
pub struct MetricsServer {
    local_addr: SocketAddr,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Bind `listen` and serve `metrics` on [`METRICS_PATH`] from a background thread.
    pub fn start(listen: &ListenAddr, metrics: Arc<RunMetrics>) -> Result<MetricsServer, ObserveError> {
        let addr = listen.socket_string();
        let listener = TcpListener::bind(&addr).map_err(|e| bind_error(listen, e))?;
        let local_addr = listener.local_addr().map_err(|source| ObserveError::Bind { addr: addr.clone(), source })?;
        let server = tiny_http::Server::from_listener(listener, None)
            .map_err(|e| ObserveError::Bind { addr: addr.clone(), source: std::io::Error::other(e.to_string()) })?;
        let server = Arc::new(server);
        let serving = server.clone();
        let thread = std::thread::Builder::new()
            .name("ferrite-metrics-http".into())
            .spawn(move || serve(&serving, &metrics))
            .map_err(ObserveError::Thread)?;
        Ok(MetricsServer { local_addr, server, thread: Some(thread) })
    }

    /// The scrape URL of the address actually bound (the kernel's choice for port 0), with a
    /// host a client can connect to.
    pub fn url(&self) -> String {
        let host = match self.local_addr.ip() {
            ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
            ip if ip.is_unspecified() => "[::1]".to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            ip => ip.to_string(),
        };
        format!("http://{host}:{}{METRICS_PATH}", self.local_addr.port())
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            // A panic in the server thread has already been printed; the run's result stands.
            let _ = t.join();
        }
    }
}

fn bind_error(listen: &ListenAddr, e: std::io::Error) -> ObserveError {
    let addr = listen.socket_string();
    match e.kind() {
        ErrorKind::AddrInUse => ObserveError::PortInUse { addr, host: listen.host_in_address() },
        ErrorKind::AddrNotAvailable => ObserveError::AddressNotLocal { addr },
        ErrorKind::PermissionDenied => ObserveError::PermissionDenied { addr },
        _ => ObserveError::Bind { addr, source: e },
    }
}

fn serve(server: &tiny_http::Server, metrics: &RunMetrics) {
    for request in server.incoming_requests() {
        let path = request.url().split(['?', '#']).next().unwrap_or("");
        let method_ok = matches!(request.method(), tiny_http::Method::Get | tiny_http::Method::Head);
        let response = if !method_ok {
            text_response(405, "only GET and HEAD are served\n".into(), "text/plain; charset=utf-8")
        } else if path == METRICS_PATH {
            text_response(200, metrics.encode_text(), CONTENT_TYPE)
        } else if path == "/" {
            text_response(
                200,
                format!("ferrite training run: metrics on {METRICS_PATH}\n"),
                "text/plain; charset=utf-8",
            )
        } else {
            text_response(404, format!("not found; metrics are on {METRICS_PATH}\n"), "text/plain; charset=utf-8")
        };
        // The scraper may have gone away; nothing to do about it here.
        let _ = request.respond(response);
    }
}

fn text_response(status: u16, body: String, content_type: &str) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let mut r = tiny_http::Response::from_string(body).with_status_code(status);
    if let Ok(h) = tiny_http::Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes()) {
        r.add_header(h);
    }
    r
}
