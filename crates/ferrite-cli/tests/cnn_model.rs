//! `ferrite train --model cnn` seen from outside: the conv-bn-relu-pool network on digits (8×8)
//! and Fashion-MNIST (28×28), with PyTorch's state-dict keys, checkpointed blocks that leave the
//! result unchanged, bit-identical resume, and the errors a user meets.

mod common;

use std::path::Path;

use common::{ferrite, final_accuracy, ok};

fn weights(path: &Path) -> Vec<(String, Vec<u8>)> {
    let file = ferrite_io::read(path).unwrap();
    let mut out: Vec<(String, Vec<u8>)> =
        file.tensors().into_iter().map(|(n, t)| (n, t.contiguous_bytes().to_vec())).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn the_cnn_learns_digits_with_pytorch_keys_and_checkpointing_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["train", "--model", "cnn", "--hidden", "8", "--epochs", "4", "--no-progress"];
    let out = ok(&base, dir.path());
    assert!(out.contains("CNN 1x8x8 → conv3x3-bn-relu-pool 8-16 → 10"), "{out}");
    assert!(out.contains("ferrite memory summary, device cpu"), "{out}");
    let acc = final_accuracy(&out);
    println!("digits, CNN 8-16, 4 epochs: test accuracy {acc}%");
    assert!(acc > 90.0, "{out}");
    let plain = weights(&dir.path().join("ferrite-digits-cnn.safetensors"));
    let names: Vec<&str> = plain.iter().map(|(n, _)| n.as_str()).collect();
    for key in ["0.0.weight", "0.1.running_var", "0.1.num_batches_tracked", "1.0.bias", "3.weight", "3.bias"] {
        assert!(names.contains(&key), "no {key} in {names:?}");
    }
    let out = ok(&[&base[..], &["--checkpoint-activations", "--out", "ckpt.safetensors"]].concat(), dir.path());
    assert!(out.contains("activation checkpointing"), "{out}");
    assert_eq!(plain, weights(&dir.path().join("ckpt.safetensors")), "same weights and running statistics");
}

#[test]
fn resume_continues_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let base =
        ["train", "--model", "cnn", "--hidden", "4", "--no-progress", "--train-subset", "400", "--batch-size", "32"];
    ok(&[&base[..], &["--epochs", "2", "--out", "straight.safetensors"]].concat(), dir.path());
    ok(
        &[&base[..], &["--epochs", "1", "--save-checkpoint", "run.ckpt", "--out", "half.safetensors"]].concat(),
        dir.path(),
    );
    ok(&[&base[..], &["--epochs", "2", "--resume", "run.ckpt", "--out", "resumed.safetensors"]].concat(), dir.path());
    assert_eq!(weights(&dir.path().join("straight.safetensors")), weights(&dir.path().join("resumed.safetensors")));
}

#[test]
fn too_many_blocks_for_the_image_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = ferrite(&["train", "--model", "cnn", "--layers", "4", "--no-progress"], dir.path());
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--layers") && err.contains('4') && err.contains("3 for 8x8 digits"), "{err}");
}

#[test]
fn fashion_mnist_subset_trains_the_cnn() {
    let present = Path::new("/usr/share/datasets/fashion-mnist").exists();
    if !ferrite_test_support::present_or_skip(
        present,
        "Fashion-MNIST is missing",
        "run bash .ci/run or install the Debian package dataset-fashion-mnist",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = ok(
        &[
            "train",
            "--model",
            "cnn",
            "--dataset",
            "fashion-mnist",
            "--hidden",
            "8",
            "--train-subset",
            "6000",
            "--epochs",
            "2",
            "--no-progress",
        ],
        dir.path(),
    );
    assert!(out.contains("CNN 1x28x28 → conv3x3-bn-relu-pool 8-16 → 10"), "{out}");
    let acc = final_accuracy(&out);
    println!("fashion-mnist, 6,000-image subset, CNN 8-16, 2 epochs: test accuracy {acc}%");
    assert!(acc > 75.0, "{out}");
}
