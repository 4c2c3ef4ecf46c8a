//! `ferrite doctor --bench DEVICE`, the release binary's benchmark that `scripts/gpu_check.sh`
//! compares with PyTorch CUDA: with tiny sizes it runs on `cpu` and on the emulated `cuda:0`, its
//! `--json` has every field the comparison reads, the GPT-2 step's peak reserved memory measured
//! on the device is the planner's prediction within 2 % (and that prediction is `ferrite plan
//! --hf-model`'s for the same config), `bench/compare_cuda_bench.py` turns the JSON into target
//! verdicts, and bad devices, bad flags and out-of-memory are typed errors.

mod common;

use std::path::Path;
use std::process::Command;

use common::{err_of, ferrite, ok};
use serde_json::Value;

/// A small GPT-2 whose embedding and logits use the allocator's large pool (blocks over 1 MiB,
/// 20 MiB segments), not only its 2 MiB small-pool segments.
const SMALL_GPT2: [&str; 8] = ["--gpt2-vocab", "8192", "--gpt2-hidden", "128", "--gpt2-seq", "64", "--gpt2-batch", "4"];

fn bench_json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not one JSON object ({e}):\n{out}"))
}

/// Every field the comparison reads, with plausible values; the step's shape as asked.
fn check_fields(v: &Value, device: &str, f32_sizes: &[u64], bf16_sizes: &[u64], shape: &[(&str, u64)]) {
    assert_eq!(v["device"], device, "{v}");
    assert!(v["device_name"].is_string() && v["ferrite"].is_string() && v["tf32"] == false, "{v}");
    for (key, sizes) in [("matmul_f32", f32_sizes), ("matmul_bf16", bf16_sizes)] {
        let points = v[key].as_array().unwrap_or_else(|| panic!("no {key} in {v}"));
        assert_eq!(points.iter().map(|p| p["n"].as_u64().unwrap()).collect::<Vec<_>>(), sizes, "{v}");
        for p in points {
            let (tflops, ms) = (p["tflops"].as_f64().unwrap(), p["ms"].as_f64().unwrap());
            assert!(tflops > 0.0 && ms > 0.0, "{p}");
            // TFLOP/s is 2n³ over the time of one product.
            let n = p["n"].as_f64().unwrap();
            let expected = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
            assert!((tflops - expected).abs() <= 1e-9 * expected.max(1.0), "{p}");
        }
    }
    let alloc = v["alloc_free_ns"].as_array().unwrap();
    assert_eq!(alloc.iter().map(|p| p["bytes"].as_u64().unwrap()).collect::<Vec<_>>(), [4096, 1 << 20, 64 << 20]);
    assert!(alloc.iter().all(|p| p["ns"].as_f64().unwrap() > 0.0), "{v}");
    let s = &v["gpt2_step"];
    for (k, want) in shape {
        assert_eq!(s[*k].as_u64(), Some(*want), "{k} in {s}");
    }
    assert_eq!(s["amp"], "bf16");
    assert_eq!(s["planned_on"], "sim:h100-80gb");
    assert!(s["ms_per_step"].as_f64().unwrap() > 0.0 && s["parameters"].as_u64().unwrap() > 0, "{s}");
    for k in [
        "peak_reserved_bytes",
        "peak_allocated_bytes",
        "predicted_peak_reserved_bytes",
        "predicted_peak_allocated_bytes",
    ] {
        assert!(s[k].as_u64().unwrap() > 0, "{k} in {s}");
    }
}

/// The planner's promise on this device: the step's predicted peak reserved memory is the
/// measured one within 2 %.
fn check_prediction(s: &Value) -> f64 {
    let measured = s["peak_reserved_bytes"].as_f64().unwrap();
    let predicted = s["predicted_peak_reserved_bytes"].as_f64().unwrap();
    let err = (predicted - measured) / measured;
    assert!((s["relative_error"].as_f64().unwrap() - err).abs() < 1e-12, "{s}");
    assert!(err.abs() <= 0.02, "predicted {predicted} measured {measured} ({:+.3} %): {s}", err * 100.0);
    err
}

/// `ferrite plan --hf-model` for a folder holding the benchmark's GPT-2 config: its peak.
fn plan_peak(dir: &Path, s: &Value) -> u64 {
    let folder = dir.join("gpt2-config");
    std::fs::create_dir_all(&folder).unwrap();
    let config = serde_json::json!({
        "model_type": "gpt2",
        "vocab_size": s["vocab"],
        "n_positions": 1024,
        "n_embd": s["hidden"],
        "n_layer": s["layers"],
        "n_head": s["heads"],
    });
    std::fs::write(folder.join("config.json"), config.to_string()).unwrap();
    let (seq, batch) = (s["seq"].to_string(), s["batch"].to_string());
    let f = folder.display().to_string();
    let args = [
        "plan",
        "--hf-model",
        &f,
        "--seq",
        &seq,
        "--batch-size",
        &batch,
        "--amp",
        "bf16",
        "--device",
        "sim:h100-80gb",
        "--json",
    ];
    bench_json(&ok(&args, dir))["peak_reserved_bytes"].as_u64().unwrap()
}

#[test]
fn bench_on_cpu_reports_every_figure_and_the_planner_predicts_its_peak() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["doctor", "--bench", "cpu", "--quick", "--json"];
    args.extend(SMALL_GPT2);
    let out = ok(&args, dir.path());
    let v = bench_json(&out);
    let shape = [("layers", 2), ("hidden", 128), ("heads", 4), ("vocab", 8192), ("seq", 64), ("batch", 4)];
    check_fields(&v, "cpu", &[64, 128], &[64], &shape);
    let s = &v["gpt2_step"];
    let err = check_prediction(s);
    println!(
        "cpu: peak reserved predicted {} measured {} ({:+.3} %)",
        s["predicted_peak_reserved_bytes"],
        s["peak_reserved_bytes"],
        err * 100.0
    );
    assert_eq!(plan_peak(dir.path(), s), s["predicted_peak_reserved_bytes"].as_u64().unwrap());

    // The same run in words: one line per figure.
    let text = ok(&["doctor", "--bench", "cpu", "--quick", "--bench-sizes", "32", "--gpt2-steps", "1"], dir.path());
    for want in [
        "matmul f32 32:",
        "matmul bf16 64:",
        "allocate+free 4.00 KiB",
        "allocate+free 64.00 MiB",
        "GPT-2 step (2 layers x 64",
        "predicted by ferrite plan --device sim:h100-80gb",
    ] {
        assert!(text.contains(want), "no `{want}` in:\n{text}");
    }

    compare_with_pytorch_shaped_json(dir.path(), &v);
}

/// `bench/compare_cuda_bench.py` on this JSON and a hand-made PyTorch one of the same shape whose
/// figures are set to give known verdicts. Skips loudly without python3.
fn compare_with_pytorch_shaped_json(dir: &Path, fe: &Value) {
    if !common::require_or_skip("python3", "python3") {
        return;
    }
    let scaled = |key: &str, field: &str, by: f64| -> Value {
        let mut points = fe[key].clone();
        for p in points.as_array_mut().unwrap() {
            p[field] = Value::from(p[field].as_f64().unwrap() * by);
        }
        points
    };
    let step = &fe["gpt2_step"];
    let pytorch = serde_json::json!({
        "pytorch": "hand-made", "cuda": "none", "device": "cuda:0", "device_name": "test", "tf32": false,
        // PyTorch twice as fast at f32 (ferrite 0.5x: MISSED), half as fast at bf16 (2x: MET).
        "matmul_f32": scaled("matmul_f32", "tflops", 2.0),
        "matmul_bf16": scaled("matmul_bf16", "tflops", 0.5),
        // PyTorch's allocations twice as slow: ferrite 0.5x (MET).
        "alloc_free_ns": scaled("alloc_free_ns", "ns", 2.0),
        // PyTorch's step twice as fast: ferrite 2x its time (MISSED).
        "gpt2_step": {"seq": step["seq"], "batch": step["batch"], "layers": step["layers"], "hidden": step["hidden"],
                      "ms_per_step": step["ms_per_step"].as_f64().unwrap() / 2.0,
                      "peak_reserved_bytes": step["peak_reserved_bytes"]},
    });
    let (fe_path, pt_path) = (dir.join("ferrite.json"), dir.join("pytorch.json"));
    std::fs::write(&fe_path, fe.to_string()).unwrap();
    std::fs::write(&pt_path, pytorch.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/compare_cuda_bench.py");
    let o = Command::new("python3")
        .arg(&script)
        .args([&fe_path, &pt_path])
        .args(["--f32-n", "64", "--bf16-n", "64"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    let verdict = |row: &str| {
        let line = out.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no `{row}` row in:\n{out}"));
        line.split_whitespace().last().unwrap().to_string()
    };
    assert_eq!(verdict("matmul f32 (TF32 off) 64"), "MISSED", "{out}");
    assert_eq!(verdict("matmul bf16 64"), "MET", "{out}");
    assert_eq!(verdict("GPT-2 step"), "MISSED", "{out}");
    for size in [4096, 1 << 20, 64 << 20] {
        assert_eq!(verdict(&format!("allocate+free {size} B")), "MET", "{out}");
    }
    assert_eq!(verdict("ferrite peak reserved: predicted"), "MET", "{out}");
    assert!(out.contains("5 met, 2 missed, 0 not measured"), "{out}");
}

/// `ferrite doctor --bench cuda:0 --json` on the emulated `cuda:0` (`FERRITE_CUDA_EMULATOR=1`:
/// ferrite's CUDA kernels compiled by a C++ compiler and run on the host, cuBLAS emulated): the CUDA
/// backend's own code paths, allocations included. `None` (skipped loudly) without a C++ compiler.
fn emulated_bench() -> Option<Value> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".to_string());
    let has_cxx = Command::new(&cxx).arg("--version").output().is_ok_and(|o| o.status.success());
    if !ferrite_test_support::present_or_skip(
        has_cxx,
        "no C++20 compiler (`$CXX`, default g++) to run the CUDA kernels of the emulated cuda:0",
        "apt-get install g++ (or set CXX)",
    ) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    // Emulated kernels are slow: one layer, a short sequence, one timed step; the vocabulary still
    // puts the embedding in the large pool.
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["doctor", "--bench", "cuda:0", "--quick", "--json", "--bench-sizes", "32", "--bench-bf16-sizes", "32"])
        .args(["--gpt2-layers", "1", "--gpt2-hidden", "64", "--gpt2-heads", "2", "--gpt2-vocab", "8192"])
        .args(["--gpt2-seq", "16", "--gpt2-batch", "2", "--gpt2-steps", "1"])
        .env("FERRITE_CUDA_EMULATOR", "1")
        .env("NODEVICE_SELECT", "1")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("FERRITE_VISIBLE_DEVICES")
        .env_remove("FERRITE_ALLOW_TF32")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    Some(bench_json(&out))
}

/// The benchmark runs on the CUDA backend (emulated) and reports every figure the comparison reads,
/// and issue 31's memory target holds there: the planner's predicted peak reserved within 2 % of
/// the step's peak measured on `cuda:0` (27,262,976 bytes both). This missed by +7.7 % (28 MiB
/// predicted, 26 MiB measured) while `meta` widened bf16 products to f32 scratch and cuBLAS does
/// not; since `meta` and the CPU take half products themselves (commit 021fc6d) it is exact.
#[test]
fn bench_on_the_emulated_cuda_device_reports_every_figure() {
    let Some(v) = emulated_bench() else { return };
    let shape =
        [("layers", 1), ("hidden", 64), ("heads", 2), ("vocab", 8192), ("seq", 16), ("batch", 2), ("timed_steps", 1)];
    check_fields(&v, "cuda:0", &[32], &[32], &shape);
    assert!(v["device_name"].as_str().unwrap().contains("emulated"), "{v}");
    let s = &v["gpt2_step"];
    println!(
        "emulated cuda:0: peak reserved predicted {} measured {} (relative error {})",
        s["predicted_peak_reserved_bytes"], s["peak_reserved_bytes"], s["relative_error"]
    );
    check_prediction(s);
}

/// The planner's promise at GPT-2 small's width and depth (12 × 768, vocab 50257) under bf16
/// autocast, on `cpu` with a short step (seq 8, batch 1). This step once missed by −3.17 %
/// (2,367,684,608 bytes predicted, 2,445,279,232 measured: one 77,594,624-byte segment more on
/// `cpu`) although the recorded and the measured allocation sequences were the same: the caching
/// allocator breaks ties between equal free blocks by address, and `cpu`/`sim` segments had the
/// host's `mmap` addresses (top-down) where the planner's replay numbers segments in creation
/// order. Host-backed segments now get creation-order addresses too (`ferrite-memory`'s
/// `raw_memory`; the `replay_agreement` test in `caching_allocator.rs` is the small case).
#[test]
fn the_planner_predicts_a_gpt2_small_width_bf16_step_on_cpu_within_two_percent() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["doctor", "--bench", "cpu", "--json", "--bench-sizes", "64", "--bench-bf16-sizes", "64"];
    let mut args = args.to_vec();
    args.extend(["--gpt2-seq", "8", "--gpt2-batch", "1", "--gpt2-warmup", "1", "--gpt2-steps", "1"]);
    let v = bench_json(&ok(&args, dir.path()));
    check_prediction(&v["gpt2_step"]);
}

#[test]
fn bad_devices_flags_and_out_of_memory_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = err_of(&["doctor", "--bench", "tpu:0"], dir.path());
    assert!(e.contains("`--bench tpu:0`") && e.contains("devices are spelled cpu, gpu:N, cuda:N"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    for (flag, value, says) in [
        ("--gpt2-amp", "fp8", "expected bf16, f16 or none"),
        ("--gpt2-seq", "1", "expected at least 2 tokens"),
        ("--gpt2-hidden", "65", "expected a multiple of --gpt2-heads"),
        ("--gpt2-steps", "0", "expected at least 1"),
    ] {
        let e = err_of(&["doctor", "--bench", "cpu", "--quick", flag, value], dir.path());
        assert!(e.contains(&format!("`{flag} {value}`")) && e.contains(says), "{flag} {value}: {e}");
    }
    // Bench flags need --bench; --bench and --check-device are one or the other.
    let o = ferrite(&["doctor", "--quick"], dir.path());
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    let o = ferrite(&["doctor", "--bench", "cpu", "--check-device", "cpu"], dir.path());
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    // A step too large for a 1 GiB simulated GPU: the out-of-memory report with the planner's
    // remedies for this step.
    let e = err_of(
        &[
            "doctor",
            "--bench",
            "sim:1GiB",
            "--quick",
            "--gpt2-vocab",
            "50257",
            "--gpt2-batch",
            "16",
            "--gpt2-seq",
            "256",
        ],
        dir.path(),
    );
    assert!(e.contains("CUDA out of memory") && e.contains("sim:1GiB"), "{e}");
    assert!(e.contains("Ranked remedies (ferrite plan, for this model on sim:1GiB)"), "{e}");
}
