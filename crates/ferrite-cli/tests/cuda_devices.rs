//! CUDA as a user meets it through the `ferrite` binary: `ferrite devices` and `ferrite doctor`
//! list the CUDA devices or say plainly why there are none (no driver: the library names looked
//! for), and `--device cuda:0` is a typed error, never a panic or a run on another device; on the
//! emulated `cuda:0` (`FERRITE_CUDA_EMULATOR=1`) training runs through and matches the CPU.
//! On a machine without the NVIDIA driver (this project's build machines, CI) the no-driver half
//! runs; with a driver, the listing half does and the no-driver half skips loudly.

use std::process::{Command, Output};

fn ferrite(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(args)
        .env("NODEVICE_SELECT", "1")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("FERRITE_VISIBLE_DEVICES")
        .current_dir(dir)
        .output()
        .unwrap()
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Whether this machine has the NVIDIA driver, as `ferrite devices --json` reports it.
fn driver_present(dir: &std::path::Path) -> bool {
    let o = ferrite(&["devices", "--json"], dir);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    !v["cuda"]["driver"].is_null()
}

#[test]
fn without_the_driver_the_listings_say_which_library_was_looked_for() {
    let dir = tempfile::tempdir().unwrap();
    if driver_present(dir.path()) {
        eprintln!("SKIPPED: this machine has the NVIDIA driver; the no-driver listing is tested where it is missing");
        return;
    }
    let o = ferrite(&["devices"], dir.path());
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains(
            "No CUDA device: cuda is not available: the NVIDIA CUDA driver library was not found (tried libcuda.so"
        ),
        "{out}"
    );
    assert!(out.contains("libcuda.so.1") && out.contains("LD_LIBRARY_PATH"), "{out}");

    let o = ferrite(&["devices", "--json"], dir.path());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["cuda"]["error"].as_str().unwrap().contains("libcuda.so.1"), "{v}");
    assert_eq!(v["cuda"]["devices"], serde_json::json!([]));
    assert!(v["cuda"]["nvrtc"].is_object(), "{v}");
    assert!(v["visible"].as_array().unwrap().iter().all(|d| !d["device"].as_str().unwrap().starts_with("cuda")));

    let o = ferrite(&["doctor", "--json"], dir.path());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    let cuda = checks.iter().find(|c| c["name"] == "cuda").unwrap_or_else(|| panic!("no cuda line in {v}"));
    assert_eq!(cuda["verdict"], "note", "{cuda}");
    assert!(cuda["found"].as_str().unwrap().contains("tried libcuda.so"), "{cuda}");
    assert!(checks.iter().any(|c| c["name"] == "nvrtc"), "{v}");
    assert!(v["cuda"]["error"].as_str().unwrap().contains("libcuda.so.1"), "{v}");
}

#[test]
fn with_the_driver_the_listings_show_each_device() {
    let dir = tempfile::tempdir().unwrap();
    let present = driver_present(dir.path());
    if !ferrite_test_support::present_or_skip(
        present || !ferrite_test_support::cuda_requested(),
        "no NVIDIA driver but FERRITE_TEST_DEVICES asks for cuda",
        "run on a machine with an NVIDIA GPU and its driver",
    ) || !present
    {
        eprintln!("SKIPPED: no NVIDIA driver on this machine; the CUDA listing needs one");
        return;
    }
    let o = ferrite(&["devices", "--json"], dir.path());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let devices = v["cuda"]["devices"].as_array().unwrap();
    for d in devices {
        assert!(d["arch"].as_str().unwrap().starts_with("sm_"), "{d}");
        assert!(d["total_bytes"].as_u64().unwrap() > 0 && d["free_bytes"].as_u64().is_some(), "{d}");
    }
    let (out, _) = text(&ferrite(&["devices"], dir.path()));
    assert!(out.contains("CUDA driver "), "{out}");
}

/// `--device cuda:N` where it cannot work: the typed error naming the device, exit status 1,
/// nothing computed elsewhere.
#[test]
fn a_cuda_device_that_cannot_be_used_is_a_typed_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let present = driver_present(dir.path());
    if !present {
        let o = ferrite(&["devices", "--device", "cuda:0", "--devices", "0,1"], dir.path());
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{out}{err}");
        assert!(err.contains("cuda:0 is not available: the NVIDIA CUDA driver library was not found (tried"), "{err}");
    }
    // Training without the driver: one typed error naming the library and the devices to use,
    // never a run on another device.
    if !present {
        let o = ferrite(&["train", "--device", "cuda:0", "--epochs", "1", "--no-progress"], dir.path());
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{out}{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains("cuda:0 is not available: the NVIDIA CUDA driver library was not found")
                && err.contains("`gpu:N`"),
            "{out}{err}"
        );
        assert!(!out.contains("epoch"), "a run happened on another device:\n{out}");
    }
    // A malformed index is the parser's error.
    let o = ferrite(&["train", "--device", "cuda:x"], dir.path());
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("CUDA device index must be a non-negative integer (`cuda:0`)"), "{err}");
}

/// Training on the emulated `cuda:0` (`FERRITE_CUDA_EMULATOR=1`: ferrite's CUDA kernels compiled by
/// g++ and run on CPU threads) goes through the forward, backward and fused AdamW steps on the CUDA
/// backend and ends with the CPU run's loss and accuracies. Skips loudly without a C++ compiler.
#[test]
fn training_on_the_emulated_cuda_device_takes_optimizer_steps_like_the_cpu() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".to_string());
    let has_cxx = Command::new(&cxx).arg("--version").output().is_ok_and(|o| o.status.success());
    if !ferrite_test_support::present_or_skip(
        has_cxx,
        "no C++20 compiler (`$CXX`, default g++) to run the CUDA kernels of the emulated cuda:0",
        "apt-get install g++ (or set CXX)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Four optimizer steps of 64 samples.
    let args = ["train", "--epochs", "1", "--train-subset", "256", "--no-progress", "--device"];
    let epoch_line = |device: &str, emulated: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ferrite"));
        c.args(args).arg(device).env("NODEVICE_SELECT", "1").current_dir(dir.path());
        if emulated {
            c.env("FERRITE_CUDA_EMULATOR", "1");
        }
        let o = c.output().unwrap();
        let (out, err) = text(&o);
        assert!(o.status.success(), "{device}: {out}{err}");
        let line =
            out.lines().find(|l| l.starts_with("epoch")).unwrap_or_else(|| panic!("{device}: no epoch line:\n{out}"));
        // "epoch 1/1  loss …  train acc …  test acc …  | memory …": the numbers before the memory.
        line.split('|').next().unwrap_or_default().trim().to_string()
    };
    assert_eq!(epoch_line("cuda:0", true), epoch_line("cpu", false));
}
