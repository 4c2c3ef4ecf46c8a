//! On a headless machine (no `XDG_RUNTIME_DIR`, or a relative one), Mesa's device-select Vulkan
//! layer makes libwayland print `error: XDG_RUNTIME_DIR is invalid or not set in the environment.`
//! when wgpu lists GPUs (reproduced on Debian 12 with lavapipe: `XDG_RUNTIME_DIR=tmp ferrite
//! devices` from `/` printed it twice before the fix). ferrite sets `NODEVICE_SELECT=1` for itself
//! in that case, unless the user set it, so no `error:` line appears that is not ferrite's;
//! `ferrite doctor` says it did so. Without Vulkan there is no layer and the assertions hold
//! trivially.

use std::process::Command;

fn headless(args: &[&str], nodevice_select: Option<&str>) -> (bool, String, String) {
    run(args, None, nodevice_select)
}

/// `ferrite ARGS` with `XDG_RUNTIME_DIR` as given (removed for None), from `/`.
fn run(args: &[&str], xdg_runtime_dir: Option<&str>, nodevice_select: Option<&str>) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrite"));
    c.args(args).current_dir("/").env_remove("XDG_RUNTIME_DIR").env_remove("NODEVICE_SELECT");
    if let Some(v) = xdg_runtime_dir {
        c.env("XDG_RUNTIME_DIR", v);
    }
    if let Some(v) = nodevice_select {
        c.env("NODEVICE_SELECT", v);
    }
    let o = c.output().expect("ferrite runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn no_driver_error_lines_on_a_headless_machine() {
    for args in [&["devices"][..], &["doctor"][..]] {
        let (ok, out, err) = headless(args, None);
        assert!(ok, "{args:?}: {out}{err}");
        let stray: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert!(stray.is_empty(), "{args:?} printed {stray:?}");
    }
    let (_, out, _) = headless(&["doctor"], None);
    let note = out.lines().find(|l| l.contains("mesa device-select")).unwrap_or_else(|| panic!("no note in\n{out}"));
    assert!(note.starts_with("  note ") && note.contains("XDG_RUNTIME_DIR is not set"), "{note}");
    // A relative XDG_RUNTIME_DIR is as invalid to libwayland, even naming a directory (`tmp` from `/`).
    let (ok, out, err) = run(&["devices"], Some("tmp"), None);
    assert!(ok, "{out}{err}");
    assert!(!err.lines().any(|l| l.starts_with("error:")), "{err}");
}

#[test]
fn a_usable_runtime_directory_keeps_the_layer() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = run(&["doctor"], dir.path().to_str(), None);
    assert!(ok, "{out}{err}");
    assert!(!out.contains("mesa device-select"), "{out}");
    assert!(!err.lines().any(|l| l.starts_with("error:")), "{err}");
}

#[test]
fn the_users_choice_stands() {
    // NODEVICE_SELECT given by the user (any value): ferrite neither overrides it nor claims it.
    let (ok, out, err) = headless(&["doctor"], Some("0"));
    assert!(ok, "{out}{err}");
    assert!(!out.contains("mesa device-select"), "{out}");
}
