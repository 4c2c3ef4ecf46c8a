//! `ferrite monitor` against live runs, other servers and nothing at all — and the live view in a
//! real terminal: tmux runs the monitor, `capture-pane` reads the screen a person would see,
//! `send-keys q` quits it.

mod common;

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use common::{require_or_skip, start_live_run, wait_for};

fn ferrite(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite")).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn once_and_dmon_print_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = start_live_run(dir.path(), &["--device", "sim:t4-16gb"]);
    let (code, out, err) = ferrite(&["monitor", &run.addr, "--once"]);
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with(&format!("ferrite run at {}: mlp 64-128-128-10 on digits, device sim:t4-16gb:0", run.url)),
        "{out}"
    );
    assert!(lines[1].starts_with("epoch ") && lines[1].contains(" loss ") && lines[1].contains("samples/s"), "{out}");
    assert!(lines[2].starts_with("device") && lines[2].contains("allocated") && lines[2].contains("capacity"), "{out}");
    assert!(lines[3].starts_with("sim:t4-16gb:0") && lines[3].contains("14.76 GiB"), "{out}");
    assert!(lines[4].starts_with("cpu "), "{out}");

    // Three samples one interval apart, two devices each, under a two-line header.
    let (code, out, err) = ferrite(&["monitor", &run.url, "--dmon", "-c", "3", "--interval", "0.2"]);
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2 + 3 * 2, "{out}");
    assert!(lines[0].starts_with("# time") && lines[1].starts_with("# UTC"), "{out}");
    let width = lines[0].len();
    assert!(lines.iter().all(|l| l.len() == width), "fixed columns:\n{out}");
    let steps: Vec<u64> = lines[2..]
        .iter()
        .filter(|l| l.contains("sim:t4-16gb:0"))
        .map(|l| l.split_whitespace().nth(3).unwrap().parse().unwrap())
        .collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]) && steps.len() == 3, "{out}");

    // The live view needs a terminal; a pipe gets a sentence naming the text modes.
    let (code, out, err) = ferrite(&["monitor", &run.addr]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("not a terminal") && err.contains("--once or --dmon"), "{err}");
}

#[test]
fn nothing_there_or_something_else_is_one_clear_line() {
    // A port nothing listens on.
    let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (code, out, err) = ferrite(&["monitor", &free.to_string(), "--once"]);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no metrics at http://") && err.contains("nothing is listening there"), "{err}");

    // Another exporter's metrics, an HTML page and a 404, served by a small server here.
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let addr = server.server_addr().to_ip().unwrap();
    let serve = std::thread::spawn(move || {
        for _ in 0..3 {
            let Ok(req) = server.recv() else { return };
            let (status, body) = match req.url() {
                "/metrics" => (200, "# TYPE node_load1 gauge\nnode_load1 0.25\nnode_load5 0.5\n"),
                "/page" => (200, "<!DOCTYPE html>\n<html><body>hello</body></html>\n"),
                _ => (404, "not here\n"),
            };
            let _ = req.respond(tiny_http::Response::from_string(body).with_status_code(status));
        }
    });
    let (code, _, err) = ferrite(&["monitor", &addr.to_string(), "--once"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is not a ferrite run's metrics endpoint") && err.contains("another exporter"), "{err}");
    let (code, _, err) = ferrite(&["monitor", &format!("http://{addr}/page"), "--once"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not in the Prometheus text format (line 1"), "{err}");
    let (code, _, err) = ferrite(&["monitor", &format!("http://{addr}/other"), "--once"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("answered HTTP 404"), "{err}");
    serve.join().unwrap();

    // Malformed addresses are refused by the argument parser.
    let (code, _, err) = ferrite(&["monitor", "https://127.0.0.1:9400"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("plain HTTP"), "{err}");
    let (code, _, err) = ferrite(&["monitor", "127.0.0.1:9400", "--interval", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("outside 0.2 to 3600"), "{err}");
}

/// A private tmux server for one test; killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().expect("tmux runs")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "mon"]).stdout).into_owned()
    }

    /// The screen with lines the terminal wrapped joined back (`capture-pane -J`).
    fn screen_joined(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-J", "-t", "mon"]).stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[test]
fn the_live_view_in_a_real_terminal() {
    if !require_or_skip("tmux", "tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut run = start_live_run(dir.path(), &["--device", "sim:a100-40gb"]);
    let tmux = Tmux { socket: format!("ferrite-monitor-test-{}", std::process::id()) };
    // The shell keeps the pane open after the monitor exits, so its last words stay readable.
    let addr = run.addr.clone();
    let command = |phase: &str| {
        format!("{} monitor {addr}; echo \"{phase} monitor exited with $?\"; sleep 120", env!("CARGO_BIN_EXE_ferrite"))
    };
    let o = tmux.run(&["new-session", "-d", "-s", "mon", "-x", "120", "-y", "40", &command("first")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // What a person sees after a few refreshes.
    let screen = wait_for(Duration::from_secs(30), || {
        let s = tmux.screen();
        (s.contains("3 scrapes") || s.contains("4 scrapes")).then_some(s)
    })
    .unwrap_or_else(|| panic!("the dashboard did not refresh:\n{}", tmux.screen()));
    for needle in [
        format!("ferrite monitor · {}", run.url),
        "mlp 64-128-128-10 on digits · device sim:a100-40gb:0".to_string(),
        "memory: █ allocated ▒ reserved ░ capacity".to_string(),
        "sim:a100-40gb:0 allocated".to_string(),
        "reserved 2.00 MiB of 39.59 GiB".to_string(),
        "loader wait".to_string(),
        "samples/s".to_string(),
        "q quit".to_string(),
    ] {
        assert!(screen.contains(&needle), "missing `{needle}` on the screen:\n{screen}");
    }
    let epoch_line = screen.lines().find(|l| l.contains("epoch ") && l.contains("steps ")).unwrap();
    assert!(epoch_line.contains("lr 1.0e-3"), "{screen}");
    println!("{screen}");

    // `q` quits, the terminal is given back, and the monitor exits 0.
    tmux.run(&["send-keys", "-t", "mon", "q"]);
    let after =
        wait_for(Duration::from_secs(10), || Some(tmux.screen()).filter(|s| s.contains("first monitor exited with")))
            .unwrap_or_else(|| panic!("`q` did not quit:\n{}", tmux.screen()));
    assert!(after.contains("first monitor exited with 0") && !after.contains("ferrite monitor ·"), "{after}");

    // Watching a run that then ends: one line saying so, not a frozen screen.
    tmux.run(&["respawn-pane", "-k", "-t", "mon", &command("second")]);
    wait_for(Duration::from_secs(30), || Some(tmux.screen()).filter(|s| s.contains("2 scrapes")))
        .unwrap_or_else(|| panic!("the dashboard did not come back:\n{}", tmux.screen()));
    run.kill();
    let gone =
        wait_for(Duration::from_secs(15), || Some(tmux.screen()).filter(|s| s.contains("second monitor exited with")))
            .unwrap_or_else(|| panic!("the monitor did not notice the run ended:\n{}", tmux.screen()));
    // The message may wrap at the pane's width; read it as one line.
    let joined = tmux.screen_joined();
    assert!(joined.contains("ferrite monitor: the run at") && joined.contains("stopped answering at"), "{gone}");
    assert!(joined.contains("nothing is listening there); last seen at epoch"), "{gone}");
    assert!(gone.contains("second monitor exited with 0"), "{gone}");

    // A monitor started on a run that never existed says so and exits 1 without taking the screen.
    tmux.run(&["respawn-pane", "-k", "-t", "mon", &command("third")]);
    let never =
        wait_for(Duration::from_secs(15), || Some(tmux.screen()).filter(|s| s.contains("third monitor exited with")))
            .unwrap_or_else(|| panic!("{}", tmux.screen()));
    assert!(never.contains("error: no metrics at") && never.contains("third monitor exited with 1"), "{never}");
}
