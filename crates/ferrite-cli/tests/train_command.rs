//! `ferrite train` seen from outside: the binary is run as a user runs it.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{ferrite, final_accuracy};

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn default_demo_reaches_95_percent_prints_memory_and_writes_weights() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ferrite")).current_dir(dir.path()).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let acc = final_accuracy(&out);
    println!("digits default demo: test accuracy {acc}%");
    assert!(acc >= 95.0, "{out}");
    let epochs: Vec<&str> = out.lines().filter(|l| l.starts_with("epoch ")).collect();
    assert_eq!(epochs.len(), 20);
    assert!(
        epochs.iter().all(|l| l.contains("loss ")
            && l.contains("test acc")
            && l.contains("allocated")
            && l.contains("reserved")
            && l.contains("peak")),
        "{out}"
    );
    assert!(out.contains("ferrite memory summary, device cpu"), "{out}");
    // The weights load back with PyTorch's names and shapes.
    let weights = ferrite_io::read(dir.path().join("ferrite-digits-mlp.safetensors")).unwrap();
    let mut names: Vec<String> = weights.tensors().into_iter().map(|(n, t)| format!("{n} {:?}", t.shape())).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "0.0.bias [128]",
            "0.0.weight [128, 64]",
            "1.0.bias [128]",
            "1.0.weight [128, 128]",
            "2.bias [10]",
            "2.weight [10, 128]"
        ]
    );
}

#[test]
fn a_model_that_does_not_fit_a_sim_gpu_is_a_diagnosed_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let o = ferrite(&["train", "--device", "sim:t4-16gb", "--hidden", "200000"], dir.path());
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    for needle in [
        "out of memory",
        "Tesla T4",
        "Diagnosis: exhausted",
        "Ranked remedies (ferrite plan, for this model on sim:t4-16gb)",
        "The model alone does not fit",
        "596.27 GiB",
    ] {
        assert!(err.contains(needle), "missing `{needle}` in:\n{err}");
    }
    assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
    assert!(!dir.path().join("ferrite-digits-mlp.safetensors").exists(), "no weights from a failed run");
}

#[test]
fn activations_that_do_not_fit_fail_in_the_pass_with_the_allocator_diagnosis() {
    let dir = tempfile::tempdir().unwrap();
    // The model and its AdamW state fit in 48 MiB (33 MiB); with full-batch activations they do not.
    let o = ferrite(
        &[
            "train",
            "--device",
            "sim:48MiB",
            "--hidden",
            "1024",
            "--layers",
            "3",
            "--batch-size",
            "1442",
            "--no-progress",
        ],
        dir.path(),
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(
        err.contains("out of memory")
            && err.contains("Diagnosis:")
            && (err.contains("forward pass") || err.contains("backward pass") || err.contains("optimizer step")),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // The same model trains with a smaller micro-batch and accumulation.
    let o = ferrite(
        &[
            "train",
            "--device",
            "sim:48MiB",
            "--hidden",
            "1024",
            "--layers",
            "3",
            "--batch-size",
            "64",
            "--accum-steps",
            "4",
            "--epochs",
            "2",
            "--no-progress",
        ],
        dir.path(),
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
}

#[test]
fn resume_continues_bit_identically_with_dropout_f16_scaling_accumulation_and_workers() {
    let dir = tempfile::tempdir().unwrap();
    let common = [
        "train",
        "--dropout",
        "0.1",
        "--amp",
        "f16",
        "--accum-steps",
        "3",
        "--batch-size",
        "32",
        "--workers",
        "2",
        "--checkpoint-activations",
        "--no-progress",
    ];
    let run = |extra: &[&str]| {
        let args: Vec<&str> = common.iter().copied().chain(extra.iter().copied()).collect();
        let o = ferrite(&args, dir.path());
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}\n{out}\n{err}");
        out
    };
    run(&["--epochs", "4", "--out", "straight.safetensors"]);
    run(&["--epochs", "2", "--out", "half.safetensors", "--save-checkpoint", "run.ckpt"]);
    let resumed = run(&[
        "--epochs",
        "4",
        "--out",
        "resumed.safetensors",
        "--resume",
        "run.ckpt",
        "--save-checkpoint",
        "run.ckpt",
    ]);
    assert!(resumed.contains("resumed from run.ckpt after epoch 2"), "{resumed}");
    assert_eq!(resumed.lines().filter(|l| l.starts_with("epoch ")).count(), 2);
    let a = std::fs::read(dir.path().join("straight.safetensors")).unwrap();
    let b = std::fs::read(dir.path().join("resumed.safetensors")).unwrap();
    let half = std::fs::read(dir.path().join("half.safetensors")).unwrap();
    assert_ne!(a, half, "the first half alone differs");
    assert_eq!(a, b, "2 + 2 epochs with a resume between them equal 4 epochs, byte for byte");

    // A resume with a different model is refused with the setting named.
    let o = ferrite(&["train", "--resume", "run.ckpt", "--hidden", "64"], dir.path());
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("--hidden 128") && err.contains("--hidden 64"), "{err}");
    // So is a file that is not a training checkpoint.
    let o = ferrite(&["train", "--resume", "straight.safetensors"], dir.path());
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("not a `ferrite train` checkpoint"), "{err}");
}

#[test]
fn sim_devices_train_like_the_cpu_and_bad_flags_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = ferrite(&["train", "--epochs", "2", "--no-progress", "--out", "cpu.safetensors"], dir.path());
    let sim = ferrite(
        &["train", "--epochs", "2", "--no-progress", "--device", "sim:a100-40gb", "--out", "sim.safetensors"],
        dir.path(),
    );
    assert!(cpu.status.success() && sim.status.success(), "{:?}", text(&sim));
    assert_eq!(
        std::fs::read(dir.path().join("cpu.safetensors")).unwrap(),
        std::fs::read(dir.path().join("sim.safetensors")).unwrap()
    );
    let (sim_out, _) = text(&sim);
    assert!(sim_out.contains("device sim:a100-40gb"), "{sim_out}");

    // Exit 1: a run the flags describe cannot go ahead; exit 2: the command line itself does not
    // parse (clap's usage errors — `--device` is parsed into a device by the argument parser).
    for (args, needle, code) in [
        (&["train", "--device", "meta"][..], "cannot train on `meta`", 1),
        (&["train", "--batch-size", "0"][..], "--batch-size 0", 1),
        (&["train", "--dropout", "1.5"][..], "--dropout 1.5", 1),
        (&["train", "--dataset", "imagenet"][..], "imagenet", 1),
        (&["train", "--device", "sim:no-such-gpu"][..], "unknown GPU `no-such-gpu`; known: t4-16gb", 2),
        (&["train", "--alloc-conf", "bogus_key:1"][..], "bogus_key", 1),
        (&["train", "--hidden", "10000000000000"][..], "does not fit in 64 bits", 1),
        (&["train", "--layers", "100000"][..], "--layers 100000", 1),
    ] {
        let o = ferrite(args, dir.path());
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {out}{err}");
        assert!(err.contains(needle) && !err.contains("panicked"), "{args:?}: {err}");
    }
}

/// Advice belongs to one kind of error: a configuration mistake gets the configuration error
/// and nothing about memory (it used to get "The model alone does not fit").
#[test]
fn a_bad_allocator_setting_gets_no_memory_advice() {
    let dir = tempfile::tempdir().unwrap();
    for device in ["cpu", "sim:t4-16gb"] {
        let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
            .args(["train", "--device", device, "--epochs", "1", "--no-progress"])
            .env("FERRITE_ALLOC_CONF", "max_split_size_mb:abc")
            .current_dir(dir.path())
            .output()
            .unwrap();
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{device}: {out}{err}");
        assert!(
            err.contains("max_split_size_mb") && err.contains("abc") && err.contains("FERRITE_ALLOC_CONF"),
            "{device}: {err}"
        );
        for advice in ["does not fit", "out of memory", "Suggestions", "--hidden", "more memory"] {
            assert!(
                !err.contains(advice) && !out.contains(advice),
                "{device}: `{advice}` after a configuration error:\n{out}{err}"
            );
        }
    }
}

#[test]
fn fashion_mnist_subset_trains() {
    let present = Path::new("/usr/share/datasets/fashion-mnist").exists()
        || std::env::var_os("FERRITE_FASHION_MNIST_DIR").is_some();
    if !ferrite_test_support::present_or_skip(
        present,
        "Fashion-MNIST is missing",
        "run bash .ci/run or install the Debian package dataset-fashion-mnist",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = ferrite(
        &[
            "train",
            "--dataset",
            "fashion-mnist",
            "--train-subset",
            "6000",
            "--epochs",
            "2",
            "--workers",
            "2",
            "--no-progress",
        ],
        dir.path(),
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let acc = final_accuracy(&out);
    println!("fashion-mnist, 6,000-image subset, 2 epochs: test accuracy {acc}%");
    assert!(acc >= 75.0, "{out}");
}

/// `--device gpu:0` trains the demo to the CPU's accuracy on a real (or Mesa's software) GPU, a
/// capacity set with FERRITE_GPU_MEMORY gives the CPU's diagnosed out-of-memory error, and a GPU
/// that is not there is named with the ones that are. Skips loudly without an adapter.
#[test]
fn gpu_devices_train_like_the_cpu_and_fail_like_a_card() {
    if !ferrite_test_support::gpu_adapter_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cpu = ferrite(&["train", "--epochs", "3", "--no-progress", "--out", "cpu.safetensors"], dir.path());
    let gpu = ferrite(
        &["train", "--epochs", "3", "--no-progress", "--device", "gpu:0", "--out", "gpu.safetensors"],
        dir.path(),
    );
    let ((cpu_out, _), (gpu_out, gpu_err)) = (text(&cpu), text(&gpu));
    assert!(gpu.status.success(), "{gpu_out}{gpu_err}");
    assert!(gpu_out.contains("device gpu:0"), "the memory summary is the GPU's: {gpu_out}");
    let (a, b) = (final_accuracy(&cpu_out), final_accuracy(&gpu_out));
    assert!((a - b).abs() <= 0.6, "test accuracy on gpu:0 {b}% vs cpu {a}%");

    let o = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["train", "--device", "gpu:0", "--hidden", "20000", "--epochs", "1", "--no-progress"])
        .env("FERRITE_GPU_MEMORY", "64MiB")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        err.contains("GPU out of memory")
            && err.contains("64.00 MiB")
            && err.contains("Diagnosis")
            && !err.contains("panicked"),
        "{err}"
    );

    let missing = format!("gpu:{}", ferrite_memory::gpu::list_adapters().len() + 3);
    let o = ferrite(&["train", "--device", &missing, "--epochs", "1", "--no-progress"], dir.path());
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(err.contains(&format!("{missing} is not available")) && err.contains("gpu:0"), "{err}");
}
