//! Helpers shared by the tests that run the `ferrite` binary: run it and read its output, and for
//! the tests that watch a running `ferrite train`, start one that serves metrics on a free port,
//! find its URL, and end it when the test ends (also on failure).

#![allow(dead_code)]

pub mod mpi;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The tiny Hugging Face folders of `ferrite-models/tests/data/hf` (made with transformers), or
/// the twin set `FERRITE_HF_FIXTURES` names.
pub fn hf_fixtures() -> std::path::PathBuf {
    ferrite_test_support::hf_fixtures()
}

/// A command's output parsed as JSON, or a panic that shows it.
pub fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// The stderr of `ferrite ARGS`, which must fail.
pub fn err_of(args: &[&str], dir: &Path) -> String {
    let o = ferrite(args, dir);
    assert!(!o.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `ferrite ARGS` in `dir` to completion.
pub fn ferrite(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrite")).args(args).current_dir(dir).output().expect("the ferrite binary runs")
}

/// Runs `ferrite ARGS` in `dir`, asserts it succeeded (printing both streams if not), and returns
/// its stdout.
pub fn ok(args: &[&str], dir: &Path) -> String {
    let o = ferrite(args, dir);
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(o.status.success(), "{args:?}\n{out}\n{err}");
    out
}

/// The figure after `test accuracy ` in an image trainer's final line, in percent.
pub fn final_accuracy(stdout: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("test accuracy "))
        .unwrap_or_else(|| panic!("no final line in:\n{stdout}"));
    line["test accuracy ".len()..].split('%').next().unwrap().parse().unwrap()
}

/// A `ferrite train` child process serving metrics; killed on drop.
pub struct LiveRun {
    pub child: Child,
    /// `http://127.0.0.1:PORT/metrics`
    pub url: String,
    /// `127.0.0.1:PORT`
    pub addr: String,
}

impl LiveRun {
    /// End the run now (as a crash or Ctrl-C would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LiveRun {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Start `ferrite train` on digits for many epochs with `--metrics-addr 127.0.0.1:0` and the
/// extra `args`, in `dir`; returns once it prints the URL it serves.
pub fn start_live_run(dir: &Path, args: &[&str]) -> LiveRun {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["train", "--metrics-addr", "127.0.0.1:0", "--epochs", "100000", "--no-progress"])
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ferrite train starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    // Read every line (so the pipe never fills and blocks the trainer); report the URL.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.trim().strip_prefix("metrics: serving ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    let url = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(url) => url,
        Err(_) => {
            let _ = child.kill();
            panic!("ferrite train did not print `metrics: serving URL` within 60 s");
        }
    };
    let addr = url.trim_start_matches("http://").trim_end_matches("/metrics").to_string();
    LiveRun { child, url, addr }
}

/// GET `url`: (status, body).
pub fn http_get(url: &str) -> (u16, String) {
    try_http_get(url).unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// GET `url`, or the client's error (nothing listening yet).
pub fn try_http_get(url: &str) -> Result<(u16, String), ureq::Error> {
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .proxy(None)
        .build()
        .new_agent();
    let mut r = agent.get(url).call()?;
    let status = r.status().as_u16();
    Ok((status, r.body_mut().read_to_string().unwrap_or_default()))
}

/// Whether a test that needs the system program `program` must fail (CI) or may skip.
pub fn require_or_skip(program: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    ferrite_test_support::present_or_skip(
        found,
        &format!("`{program}` is not installed"),
        &format!("`apt-get install {package}`"),
    )
}

/// Poll `f` every 200 ms until it returns `Some`, for at most `timeout`.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A size as ferrite prints it (`format_size`: `512 bytes`, `12.5 MiB`; memory tables also write
/// `B`), in bytes.
pub fn size(text: &str) -> f64 {
    let mut it = text.split_whitespace();
    let n: f64 = it.next().unwrap().parse().unwrap();
    n * match it.next().unwrap() {
        "B" | "bytes" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        u => panic!("unit {u}"),
    }
}
