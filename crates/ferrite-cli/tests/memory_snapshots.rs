//! `ferrite memory replay | snapshot | plot` on PyTorch memory snapshots, seen from outside: the
//! fixtures in tests/data/torch_snapshots (built in PyTorch's schema by make_snapshots.py beside
//! them; no GPU was available to record real ones) replay under several allocator settings, bad
//! snapshots give typed messages, ferrite's own snapshot pickle reads back, and the plot is an SVG
//! that parses and holds its peak.
mod common;

use std::path::{Path, PathBuf};

use common::{ferrite, ok};

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch_snapshots").join(name).display().to_string()
}

fn demo_trace() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../ferrite-memory/traces/split_large_block.json")
        .display()
        .to_string()
}

fn json(args: &[&str], dir: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(args, dir)).expect("JSON output")
}

#[test]
fn snapshot_what_if_compares_configurations_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture("fragmentation_v2_1.pickle");
    let v = json(
        &[
            "memory",
            "replay",
            &f,
            "--alloc-conf",
            "default",
            "--alloc-conf",
            "expandable_segments:True",
            "--alloc-conf",
            "max_split_size_mb:32",
            "--json",
        ],
        dir.path(),
    );
    assert_eq!(v["source"], "PyTorch memory snapshot (PyTorch 2.1+ layout)");
    assert_eq!(v["replay_device"], "meta");
    let d = &v["devices"][0];
    let rows = d["configs"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[1]["alloc_conf"], "expandable_segments:True");
    let recorded = d["recorded"]["peak_reserved_bytes"].as_u64().unwrap();
    let peak = |i: usize| rows[i]["peak_reserved_bytes"].as_u64().unwrap();
    // The fixture's segment events follow PyTorch's default rules, so replaying with the default
    // settings reproduces the recorded peak exactly; expandable segments need less.
    assert_eq!(peak(0), recorded);
    assert!(peak(1) < peak(0), "{rows:?}");
    let frag = |i: usize| rows[i]["fragmentation_at_peak"].as_f64().unwrap();
    assert!(frag(1) < frag(0) && frag(0) > 0.0 && frag(0) < 1.0, "{rows:?}");
    assert!(rows.iter().all(|r| r["ooms"] == 0));

    // Text: one row per configuration plus the recorded one, and the winner named.
    let text = ok(&["memory", "replay", &f], dir.path());
    assert!(text.contains("recorded (the snapshot)"), "{text}");
    for conf in ["default", "expandable_segments:True", "max_split_size_mb:128"] {
        assert!(text.lines().any(|l| l.trim_start().starts_with(conf)), "{conf} missing:\n{text}");
    }
    assert!(text.contains("lowest peak reserved: expandable_segments:True"), "{text}");
}

#[test]
fn snapshot_replays_on_a_sized_device_and_counts_ooms() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture("fragmentation_v2_1.pickle");
    let v = json(
        &[
            "memory",
            "replay",
            &f,
            "--device",
            "sim:600MiB",
            "--alloc-conf",
            "default",
            "--alloc-conf",
            "expandable_segments:True",
            "--json",
        ],
        dir.path(),
    );
    let rows = v["devices"][0]["configs"].as_array().unwrap();
    // 600 MiB is below the default's 866 MiB but above what expandable segments reserve (582 MiB):
    // the default setting fails or survives only by emptying its cache, expandable segments fit.
    assert!(rows[0]["ooms"].as_u64().unwrap() > 0 || rows[0]["alloc_retries"].as_i64().unwrap() > 0, "{rows:?}");
    assert_eq!(rows[1]["ooms"], 0, "{rows:?}");
}

#[test]
fn older_layout_and_allocations_before_recording_are_handled() {
    let dir = tempfile::tempdir().unwrap();
    let v = json(
        &["memory", "replay", &fixture("block_history_v2_0.pickle"), "--alloc-conf", "default", "--json"],
        dir.path(),
    );
    assert_eq!(v["source"], "PyTorch memory snapshot (PyTorch 2.0 layout (block history))");
    let d = &v["devices"][0];
    // One block freed inside the trace and one still live at the end were allocated before it.
    assert_eq!(d["allocated_before_trace"], 2);
    assert_eq!(d["configs"][0]["peak_reserved_bytes"], d["recorded"]["peak_reserved_bytes"]);

    let v = json(&["memory", "replay", &fixture("two_devices_v2_1.pickle"), "--json"], dir.path());
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.iter().map(|d| d["device"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 1]);
}

#[test]
fn bad_snapshots_are_typed_messages() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("segments_only_v1.pickle", "segments only"),
        ("unknown_layout.pickle", "no \"segments\" key"),
        ("truncated.pickle", "file truncated"),
        ("runs_code.pickle", "Nothing was executed"),
    ];
    for (name, words) in cases {
        let o = ferrite(&["memory", "replay", &fixture(name)], dir.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{name} was accepted");
        assert!(err.contains(words), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let o =
        ferrite(&["memory", "replay", &fixture("fragmentation_v2_1.pickle"), "--alloc-conf", "bogus:1"], dir.path());
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("bogus"));
}

#[test]
fn ferrite_snapshot_pickle_replays_as_a_pytorch_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("snap.pickle");
    let msg = ok(&["memory", "snapshot", &demo_trace(), "-o", out.to_str().unwrap()], dir.path());
    assert!(msg.contains("trace entries") && msg.contains("1 OOMs"), "{msg}");
    // The file is a PyTorch snapshot: it replays through the same path as one from PyTorch.
    // On the trace's own device the replay of the written snapshot meets the same OOM (the failed
    // request is retried as a probe) and reserves what the original run reserved.
    let v = json(
        &["memory", "replay", out.to_str().unwrap(), "--device", "sim:1GiB", "--alloc-conf", "default", "--json"],
        dir.path(),
    );
    let d = &v["devices"][0];
    assert_eq!(d["recorded"]["ooms"], 1);
    assert_eq!(d["configs"][0]["ooms"], 1);
    assert_eq!(d["configs"][0]["peak_reserved_bytes"], d["recorded"]["peak_reserved_bytes"]);
    // With max_split_size_mb the cached block is not split on the way and the request fits (the
    // setting the original demo trace shows to avoid the OOM): the what-if answer.
    let v = json(
        &[
            "memory",
            "replay",
            out.to_str().unwrap(),
            "--device",
            "sim:1GiB",
            "--alloc-conf",
            "max_split_size_mb:100",
            "--json",
        ],
        dir.path(),
    );
    assert_eq!(v["devices"][0]["configs"][0]["ooms"], 0, "{v}");
}

/// The `<text>` elements of an SVG document.
fn svg_texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("the SVG parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect()
}

#[test]
fn plot_writes_an_svg_with_the_peak_marked() {
    let dir = tempfile::tempdir().unwrap();
    let svg_path = dir.path().join("t.svg");
    let msg =
        ok(&["memory", "plot", &fixture("two_devices_v2_1.pickle"), "-o", svg_path.to_str().unwrap()], dir.path());
    assert!(msg.contains("device 1"), "{msg}");
    let texts = svg_texts(&std::fs::read_to_string(&svg_path).unwrap());
    // One panel per device, each with its peak; the peaks are the recorded ones.
    let v = json(&["memory", "replay", &fixture("two_devices_v2_1.pickle"), "--json"], dir.path());
    for d in v["devices"].as_array().unwrap() {
        let peak = d["recorded"]["peak_reserved_bytes"].as_u64().unwrap();
        let label = format!("peak reserved {}", ferrite_memory::format_size(peak));
        assert!(texts.contains(&label), "{label} not in {texts:?}");
        assert!(texts.iter().any(|t| t == &format!("device {} (as recorded)", d["device"])), "{texts:?}");
    }
    // Categories of the snapshot are stacked, with a legend.
    for c in ["activation", "parameter", "optimizer_state"] {
        assert!(texts.iter().any(|t| t == c), "{c} not in {texts:?}");
    }

    // With --alloc-conf, each setting's replay gets a panel beside the recording.
    let what_if = dir.path().join("w.svg");
    let f = fixture("fragmentation_v2_1.pickle");
    ok(
        &["memory", "plot", &f, "-o", what_if.to_str().unwrap(), "--alloc-conf", "expandable_segments:True"],
        dir.path(),
    );
    let texts = svg_texts(&std::fs::read_to_string(&what_if).unwrap());
    assert!(texts.contains(&"device 0 replayed on meta, alloc conf expandable_segments:True".to_string()), "{texts:?}");
    let v = json(&["memory", "replay", &f, "--alloc-conf", "expandable_segments:True", "--json"], dir.path());
    for peak in
        [&v["devices"][0]["recorded"]["peak_reserved_bytes"], &v["devices"][0]["configs"][0]["peak_reserved_bytes"]]
    {
        let label = format!("peak reserved {}", ferrite_memory::format_size(peak.as_u64().unwrap()));
        assert!(texts.contains(&label), "{label} not in {texts:?}");
    }

    // A ferrite trace, replayed on its device, as HTML with the capacity line.
    let html_path = dir.path().join("t.html");
    ok(&["memory", "plot", &demo_trace(), "-o", html_path.to_str().unwrap(), "--html"], dir.path());
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    let svg = &html[html.find("<svg").unwrap()..html.find("</svg>").unwrap() + 6];
    let texts = svg_texts(svg);
    assert!(texts.contains(&"peak reserved 600.00 MiB".to_string()), "{texts:?}");
    assert!(texts.contains(&"capacity".to_string()), "{texts:?}");
}

#[test]
fn plot_library_function_marks_the_peak() {
    use ferrite_cli::plot::{DeviceTimeline, TimelinePoint, memory_timeline_svg};
    let tl = |label: &str, scale: u64| DeviceTimeline {
        label: label.into(),
        capacity: Some(100 * scale),
        x_label: "op".into(),
        categories: vec!["weights".into(), "activations".into()],
        points: (0..20u64)
            .map(|i| {
                let act = (10 - i.abs_diff(10)) * scale;
                TimelinePoint {
                    t: i as f64,
                    allocated: 20 * scale + act,
                    reserved: 30 * scale + act,
                    by_category: vec![20 * scale, act],
                }
            })
            .collect(),
    };
    let svg = memory_timeline_svg(&[tl("gpu 0", 1 << 20), tl("gpu 1", 2 << 20)]).unwrap();
    let texts = svg_texts(&svg);
    assert!(texts.contains(&"peak reserved 40.00 MiB".to_string()), "{texts:?}");
    assert!(texts.contains(&"peak reserved 80.00 MiB".to_string()), "{texts:?}");
    assert!(texts.contains(&"peak allocated 30.00 MiB".to_string()), "{texts:?}");
    // The peak marker is a filled circle.
    let doc = roxmltree::Document::parse(&svg).unwrap();
    assert!(doc.descendants().filter(|n| n.has_tag_name("circle")).count() >= 4);
}

#[test]
fn train_snapshot_flag_writes_a_pytorch_snapshot_of_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("run.pickle");
    let args = [
        "train",
        "--model",
        "mlp",
        "--epochs",
        "1",
        "--train-subset",
        "128",
        "--batch-size",
        "32",
        "--device",
        "sim:t4-16gb",
        "--no-progress",
        "--snapshot",
        snap.to_str().unwrap(),
    ];
    let o = ferrite(&args, dir.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("wrote memory snapshot"));
    // The run's history replays as a PyTorch snapshot: recorded from the first allocation, so the
    // default settings reproduce its reserved peak.
    let v = json(&["memory", "replay", snap.to_str().unwrap(), "--alloc-conf", "default", "--json"], dir.path());
    let d = &v["devices"][0];
    assert!(d["trace_entries"].as_u64().unwrap() > 100, "{d}");
    assert_eq!(d["allocated_before_trace"], 0);
    let recorded = d["recorded"]["peak_reserved_bytes"].as_u64().unwrap();
    assert!(recorded > 0);
    assert_eq!(d["configs"][0]["peak_reserved_bytes"].as_u64().unwrap(), recorded);
    // And plots.
    let svg = dir.path().join("run.svg");
    ok(&["memory", "plot", snap.to_str().unwrap(), "-o", svg.to_str().unwrap()], dir.path());
    let texts = svg_texts(&std::fs::read_to_string(&svg).unwrap());
    assert!(texts.contains(&format!("peak reserved {}", ferrite_memory::format_size(recorded))), "{texts:?}");

    // A run that fails (out of memory on a tiny device) still leaves its snapshot.
    let small = dir.path().join("oom.pickle");
    let args = [
        "train",
        "--model",
        "mlp",
        "--epochs",
        "1",
        "--train-subset",
        "64",
        "--hidden",
        "4096",
        "--device",
        "sim:8MiB",
        "--no-progress",
        "--snapshot",
        small.to_str().unwrap(),
    ];
    let o = ferrite(&args, dir.path());
    assert!(!o.status.success());
    assert!(small.exists(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json(&["memory", "replay", small.to_str().unwrap(), "--json"], dir.path());
    assert!(v["devices"][0]["recorded"]["ooms"].as_u64().unwrap() >= 1, "{v}");
}

#[test]
fn output_paths_that_are_directories_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("out_dir")).unwrap();
    let trace = demo_trace();
    for args in [
        &["memory", "snapshot", &trace, "-o", "out_dir"][..],
        &["memory", "plot", &trace, "-o", "out_dir"][..],
        &["train", "--epochs", "1", "--train-subset", "64", "--no-progress", "--snapshot", "out_dir"][..],
    ] {
        let o = ferrite(args, dir.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains("`out_dir` is a directory, not a file"), "{args:?}: {err}");
        // train refuses before training (no epoch line printed).
        assert!(!String::from_utf8_lossy(&o.stdout).contains("epoch"), "{args:?}");
    }
}
