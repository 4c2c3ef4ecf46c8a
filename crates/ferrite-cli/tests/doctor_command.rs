//! `ferrite doctor` as a user runs it: the report's sections, the environment checked with
//! ferrite's own parsers, `--json` for bug reports, and the exit status.

use std::process::Command;

fn doctor(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrite"));
    c.arg("doctor").args(args).env("NODEVICE_SELECT", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    // Variables of the test runner's environment must not change the verdicts checked here.
    for k in ["FERRITE_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "FERRITE_GPU_MEMORY", "FERRITE_NO_SIMD"] {
        if !env.iter().any(|(e, _)| *e == k) {
            c.env_remove(k);
        }
    }
    let o = c.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn the_report_covers_the_setup_line_by_line() {
    let (code, out, err) = doctor(&[], &[("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("ferrite doctor — ferrite 0.1.0\n"), "{out}");
    for section in ["\nferrite\n", "\nsystem\n", "\ncontainer\n", "\ndevices\n", "\ndatasets\n", "\nenvironment\n"] {
        assert!(out.contains(section), "missing section {section:?} in\n{out}");
    }
    for needle in
        ["  ok       build", "simd", "ferrite kernels: ", "memory limit", "cpu quota", "digits", "built in", "mpi"]
    {
        assert!(out.contains(needle), "missing `{needle}` in\n{out}");
    }
    let pytorch = out.lines().find(|l| l.contains("PYTORCH_CUDA_ALLOC_CONF")).unwrap();
    assert!(pytorch.starts_with("  ok ") && pytorch.contains("export FERRITE_ALLOC_CONF"), "{out}");
    // Every line carries a verdict; every warning or error is followed by its fix.
    let lines: Vec<&str> = out.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("  warning ") || l.starts_with("  error ") {
            assert!(lines[i + 1].trim_start().starts_with("fix: "), "no fix after `{l}`:\n{out}");
        }
    }
    let summary = lines.last().unwrap();
    assert!(summary.starts_with("summary: ") && summary.contains(" ok, ") && summary.ends_with(" 0 errors"), "{out}");
}

#[test]
fn malformed_alloc_conf_is_reported_with_ferrites_parser_and_fails_the_doctor() {
    let (code, out, err) = doctor(
        &[],
        &[
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:lots"),
            ("FERRITE_ALLOC_CONF", "garbage_collection_threshold:2"),
        ],
    );
    assert_eq!(code, 1, "{out}{err}");
    let pytorch = out.lines().find(|l| l.contains("PYTORCH_CUDA_ALLOC_CONF")).unwrap();
    assert!(
        pytorch.starts_with("  warning ") && pytorch.contains("max_split_size_mb") && pytorch.contains("lots"),
        "{out}"
    );
    let ferrite = out.lines().find(|l| l.contains("FERRITE_ALLOC_CONF")).unwrap();
    assert!(ferrite.starts_with("  error ") && ferrite.contains("garbage_collection_threshold"), "{out}");
    assert!(out.ends_with("1 error\n"), "{out}");
    assert!(err.contains("ferrite doctor found 1 problem(s) that make ferrite fail"), "{err}");
}

#[test]
fn json_for_bug_reports() {
    let (code, out, err) = doctor(&["--json"], &[("FERRITE_SPIN_UZ", "10")]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["ferrite"]["version"], "0.1.0");
    assert_eq!(v["ferrite"]["profile"], if cfg!(debug_assertions) { "debug" } else { "release" });
    let checks = v["checks"].as_array().unwrap();
    let typo = checks.iter().find(|c| c["name"] == "FERRITE_SPIN_UZ").unwrap();
    assert_eq!(typo["verdict"], "warning");
    assert_eq!(typo["fix"], "did you mean FERRITE_SPIN_US?");
    assert!(checks.iter().all(|c| c["verdict"] == "ok" || c["fix"].is_string()), "{out}");
    let count = |verdict: &str| checks.iter().filter(|c| c["verdict"] == verdict).count() as u64;
    assert_eq!(v["summary"]["ok"], count("ok"));
    assert_eq!(v["summary"]["warning"], count("warning"));
    assert_eq!(v["summary"]["error"], 0);
}

/// The reference fixture folder, or `None` after the shared skip-or-fail rule.
fn fixtures() -> Option<String> {
    ferrite_test_support::reference_or_skip("ops/manifest.json").map(|d| d.display().to_string())
}

#[test]
fn check_device_runs_every_reference_case_on_the_cpu_and_every_gpu_adapter() {
    let Some(dir) = fixtures() else { return };
    let mut devices = vec!["cpu".to_string()];
    devices.extend(ferrite_memory::gpu::list_adapters().iter().map(|a| format!("gpu:{}", a.index)));
    for device in devices {
        let (code, out, err) = doctor(&["--check-device", &device, "--fixtures", &dir], &[]);
        assert_eq!(code, 0, "{out}{err}");
        let summary = out.lines().last().unwrap_or_default();
        assert!(summary.starts_with(&format!("{device}: ")) && summary.contains(" passed, 0 failed"), "{out}");
        for suite in ["ops", "convolution", "norm/pool", "losses", "recurrent", "optimizers", "grad_scaler"] {
            assert!(
                out.lines().any(|l| l.split_whitespace().nth(1) == Some(suite) && l.contains(" ok (max |diff|")),
                "{suite}: {out}"
            );
        }
        // The same check as JSON, for scripts: one object per case.
        let (code, json, err) = doctor(&["--check-device", &device, "--fixtures", &dir, "--json"], &[]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let cases = v["cases"].as_array().unwrap();
        assert_eq!(cases.len() + 1, out.lines().count(), "one JSON case per text line");
        assert!(cases.iter().all(|c| c["verdict"] == "passed" && c["max_abs_diff"].is_number()), "{json}");
    }
}

#[test]
fn check_device_failures_are_typed_errors_that_say_what_to_do() {
    let Some(dir) = fixtures() else { return };
    let (code, _, err) = doctor(&["--check-device", "tpu:0", "--fixtures", &dir], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("`--check-device tpu:0`") && err.contains("cuda:N"), "{err}");
    let (code, _, err) = doctor(&["--check-device", "cpu", "--fixtures", "/nonexistent/fixtures"], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/fixtures is not a PyTorch reference fixture folder"), "{err}");
    // No folder given, none in the usual places (the test runs in an empty directory).
    let empty = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["doctor", "--check-device", "cpu"])
        .current_dir(empty.path())
        .env_remove("FERRITE_PYTORCH_REFERENCE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("no PyTorch reference fixture folder found") && err.contains("--fixtures DIR"), "{err}");
    // `--fixtures` belongs to `--check-device`.
    let (code, _, err) = doctor(&["--fixtures", &dir], &[]);
    assert_eq!(code, 2, "{err}");
    // A CUDA device where none is usable (CI: no driver): one error, not a failure per case.
    if ferrite_memory::cuda::cuda_ordinal(0).is_err() {
        let (code, out, err) = doctor(&["--check-device", "cuda:0", "--fixtures", &dir], &[]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(err.contains("cannot put a tensor on cuda:0"), "{err}");
        assert!(out.is_empty(), "{out}");
    }
}
