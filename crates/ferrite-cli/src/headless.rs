//! Keeping a driver layer's noise out of ferrite's output on a headless machine.
//!
//! Mesa's Vulkan device-select layer (`VK_LAYER_MESA_device_select`, an implicit layer every
//! Mesa install enables) asks Wayland for the default GPU when wgpu enumerates adapters; where
//! `XDG_RUNTIME_DIR` is unset or not an absolute path (a container, an ssh session without a
//! login seat, CI), libwayland prints `error: XDG_RUNTIME_DIR is invalid or not set in the
//! environment.` to stderr (twice per `ferrite devices` with Mesa 22.3) — a line that reads like
//! ferrite's own error although nothing failed. The layer only orders GPUs for a display
//! (`DRI_PRIME`); `NODEVICE_SELECT=1` is its off switch (the `disable_environment` of its layer
//! manifest; Debian 12's loader disables it for any value). `src/main.rs` sets it first thing,
//! only where the user has not set it and `XDG_RUNTIME_DIR` is unset, relative or not a
//! directory, and records that here so `ferrite doctor` can say so.

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};

/// The variable that disables Mesa's device-select layer (value `1`).
pub const NODEVICE_SELECT: &str = "NODEVICE_SELECT";
/// The variable whose absence makes the layer complain.
pub const XDG_RUNTIME_DIR: &str = "XDG_RUNTIME_DIR";

static QUIETED: AtomicBool = AtomicBool::new(false);

/// Whether to set `NODEVICE_SELECT=1`, given the two variables as the process sees them: only
/// when the user has not set `NODEVICE_SELECT` (to any value) and `XDG_RUNTIME_DIR` is not a
/// usable runtime directory (unset, relative — libwayland's own test — or not a directory).
pub fn should_quiet_device_select(nodevice_select: Option<&OsStr>, xdg_runtime_dir: Option<&OsStr>) -> bool {
    nodevice_select.is_none()
        && !xdg_runtime_dir.map(std::path::Path::new).is_some_and(|d| d.is_absolute() && d.is_dir())
}

/// Records that `main` set `NODEVICE_SELECT=1` for this process.
pub fn mark_device_select_quieted() {
    QUIETED.store(true, Ordering::Relaxed);
}

/// Whether `main` set `NODEVICE_SELECT=1` for this process.
pub fn device_select_quieted() -> bool {
    QUIETED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiets_only_when_the_user_has_not_chosen_and_the_directory_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        let os = |s: &std::path::Path| s.as_os_str().to_owned();
        assert!(should_quiet_device_select(None, None));
        assert!(should_quiet_device_select(None, Some(OsStr::new(""))));
        assert!(should_quiet_device_select(None, Some(OsStr::new("/nonexistent/run/user/0"))));
        assert!(should_quiet_device_select(None, Some(&os(&file))));
        assert!(!should_quiet_device_select(None, Some(&os(dir.path()))));
        // A relative path is invalid to libwayland even where it names a directory.
        assert!(should_quiet_device_select(None, Some(OsStr::new("."))));
        // The user's choice stands, whatever it is.
        assert!(!should_quiet_device_select(Some(OsStr::new("0")), None));
        assert!(!should_quiet_device_select(Some(OsStr::new("1")), None));
    }
}
