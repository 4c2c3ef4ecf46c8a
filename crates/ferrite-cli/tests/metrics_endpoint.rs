//! `ferrite train --metrics-addr / --metrics-file` seen from outside: the endpoint a scraper
//! reads while the run trains, the JSON-lines file, and the bad inputs (port in use, an address
//! that is not this machine's, a malformed address, an unwritable file).

mod common;

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use common::{http_get, start_live_run, wait_for};

/// Value of the sample line `name` (exact name and labels) in a Prometheus text body.
fn sample(body: &str, name_and_labels: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn a_running_train_serves_memory_and_training_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let run = start_live_run(dir.path(), &["--device", "sim:t4-16gb"]);
    // Wait until a few steps have been taken.
    let body = wait_for(Duration::from_secs(60), || {
        let (status, body) = http_get(&run.url);
        assert_eq!(status, 200);
        (sample(&body, "ferrite_train_steps_total")? >= 50.0).then_some(body)
    })
    .expect("the run takes steps");
    for family in [
        "# TYPE ferrite_memory_allocated_bytes gauge",
        "# TYPE ferrite_memory_ooms_total counter",
        "# TYPE ferrite_train_batch_duration_seconds histogram",
        "# TYPE ferrite_train_loader_wait_seconds histogram",
        "# TYPE ferrite_train_samples_total counter",
    ] {
        assert!(body.contains(family), "missing `{family}` in\n{body}");
    }
    assert!(
        body.contains(
            "ferrite_run_info{version=\"0.1.0\",model=\"mlp 64-128-128-10\",dataset=\"digits\",device=\"sim:t4-16gb:0\"} 1"
        ),
        "{body}"
    );
    let t4 = |name: &str| sample(&body, &format!("{name}{{device=\"sim:t4-16gb:0\"}}")).unwrap_or(f64::NAN);
    let (allocated, reserved, capacity) = (
        t4("ferrite_memory_allocated_bytes"),
        t4("ferrite_memory_reserved_bytes"),
        t4("ferrite_memory_capacity_bytes"),
    );
    // After the first step the 26,122 f32 weights and AdamW's two moments are always allocated
    // (gradients come and go); the T4 has ~14.76 GiB.
    let floor = (3 * 26_122 * 4) as f64;
    assert!(allocated >= floor && reserved >= allocated && capacity > 14.0 * (1u64 << 30) as f64, "{body}");
    assert_eq!(t4("ferrite_memory_reserved_unallocated_bytes"), reserved - allocated);
    assert_eq!(t4("ferrite_memory_ooms_total"), 0.0);
    // The host holds the batches before they are staged to the simulated GPU.
    assert!(sample(&body, "ferrite_memory_allocations_total{device=\"cpu\"}").unwrap() > 0.0, "{body}");
    let loss = sample(&body, "ferrite_train_loss").unwrap();
    assert!(loss.is_finite() && (0.0..5.0).contains(&loss), "{body}");
    assert_eq!(sample(&body, "ferrite_train_learning_rate"), Some(0.001));
    assert!(sample(&body, "ferrite_train_samples_per_second").unwrap() > 0.0, "{body}");
    let wait = sample(&body, "ferrite_train_loader_wait_ratio").unwrap();
    assert!((0.0..=1.0).contains(&wait), "{body}");
    let batches = sample(&body, "ferrite_train_batch_duration_seconds_count").unwrap();
    assert!(
        batches >= 50.0 && sample(&body, "ferrite_train_batch_duration_seconds_bucket{le=\"+Inf\"}") == Some(batches)
    );
    assert!(sample(&body, "ferrite_train_samples_total").unwrap() >= 64.0 * 50.0, "{body}");
    // Counters only grow.
    let (_, later) = http_get(&run.url);
    assert!(
        sample(&later, "ferrite_train_steps_total").unwrap() >= sample(&body, "ferrite_train_steps_total").unwrap()
    );
    // Other paths and methods are refused politely.
    let root = run.url.trim_end_matches("/metrics");
    assert_eq!(http_get(&format!("{root}/")).0, 200);
    let (status, text) = http_get(&format!("{root}/nope"));
    assert!(status == 404 && text.contains("/metrics"), "{status} {text}");
}

#[test]
fn the_metrics_file_has_a_record_per_epoch_with_the_same_figures() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["train", "--epochs", "3", "--no-progress", "--metrics-file", "run.jsonl", "--amp", "f16"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("metrics: appending JSON lines to run.jsonl"), "{stdout}");
    let text = std::fs::read_to_string(dir.path().join("run.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let events: Vec<&str> = records.iter().map(|r| r["event"].as_str().unwrap()).collect();
    let epoch_ends: Vec<&serde_json::Value> = records.iter().filter(|r| r["event"] == "epoch_end").collect();
    assert_eq!((events[0], *events.last().unwrap(), epoch_ends.len()), ("start", "end", 3), "{events:?}");
    for (k, r) in epoch_ends.iter().enumerate() {
        let t = &r["train"];
        assert_eq!(t["epoch"], k as u64 + 1);
        assert_eq!(t["epochs"], 3);
        // 1,442 training samples per epoch, in 23 batches.
        assert_eq!(t["samples_total"], 1442 * (k as u64 + 1));
        assert_eq!(t["batches_total"], 23 * (k as u64 + 1));
        assert_eq!(
            t["steps_total"].as_u64().unwrap() + t["skipped_steps_total"].as_u64().unwrap(),
            23 * (k as u64 + 1)
        );
        // f16 autocast turns on loss scaling; its scale is a power of two.
        let scale = t["grad_scale"].as_f64().unwrap();
        assert!(scale >= 1.0 && scale.log2().fract() == 0.0, "{t}");
        assert!(t["loss"].as_f64().unwrap() > 0.0 && t["samples_per_second"].as_f64().unwrap() > 0.0, "{t}");
        let cpu = &r["devices"][0];
        assert_eq!(cpu["device"], "cpu");
        assert!(
            cpu["allocated_bytes"].as_u64().unwrap() > 0
                && cpu["reserved_bytes"].as_u64() >= cpu["allocated_bytes"].as_u64()
        );
    }
    let end = records.last().unwrap();
    assert_eq!(end["run"]["dataset"], "digits");
    assert_eq!(end["train"]["samples_total"], 3 * 1442);
}

fn ferrite(args: &[&str], dir: &std::path::Path) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite")).args(args).current_dir(dir).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

#[test]
fn outputs_that_cannot_start_stop_the_run_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let (code, out) = ferrite(&["train", "--epochs", "1", "--no-progress", "--metrics-addr", &addr], dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("cannot serve metrics on {addr}: the port is in use")), "{out}");
    assert!(out.contains("127.0.0.1:0"), "suggests a free port: {out}");
    assert!(!out.contains("epoch ") && !out.contains("panicked"), "{out}");
    assert!(!dir.path().join("ferrite-digits-mlp.safetensors").exists());

    // 192.0.2.1 (TEST-NET-1) is nobody's address: binding it fails without sending anything.
    let (code, out) = ferrite(&["train", "--epochs", "1", "--metrics-addr", "192.0.2.1:9400"], dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("not one of this machine's"), "{out}");

    let (code, out) = ferrite(&["train", "--epochs", "1", "--metrics-file", "no/such/dir/run.jsonl"], dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("cannot open the metrics file `no/such/dir/run.jsonl`: its directory does not exist"),
        "{out}"
    );
    assert!(out.contains("--metrics-file") && !out.contains("os error"), "{out}");

    for (bad, needle) in [
        ("9400", "127.0.0.1:9400"),
        ("http://127.0.0.1:9400/metrics", "without a scheme"),
        ("127.0.0.1:99999", "larger than 65535"),
    ] {
        let (code, out) = ferrite(&["train", "--metrics-addr", bad], dir.path());
        assert_eq!(code, 2, "{bad}: {out}");
        assert!(out.contains(needle) && out.contains("--metrics-addr"), "{bad}: {out}");
    }
    drop(taken);
}

#[test]
fn a_metrics_file_that_stops_taking_writes_does_not_stop_training() {
    // /dev/full opens for appending and refuses every write with "no space left on device".
    if !std::path::Path::new("/dev/full").exists() {
        eprintln!("SKIPPED: no /dev/full on this system");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["train", "--epochs", "2", "--no-progress", "--metrics-file", "/dev/full"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("test accuracy") && dir.path().join("ferrite-digits-mlp.safetensors").exists(), "{out}");
    assert_eq!(err.matches("warning: writing the metrics file `/dev/full` failed").count(), 1, "reported once: {err}");
    assert!(err.contains("training goes on without it"), "{err}");
}
