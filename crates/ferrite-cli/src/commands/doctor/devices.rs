//! What ferrite can compute on here: `cpu`, the simulated GPUs, every GPU adapter (through the
//! same code as `ferrite devices`), and whether ferrite turned Mesa's device-select layer off.

use ferrite_memory::gpu::{AdapterSummary, GPU_MEMORY_ENV};
use ferrite_memory::{GPU_CATALOGUE, format_size};

use super::check::Check;

const SECTION: &str = "devices";

/// `device_select_quieted`: `main` set `NODEVICE_SELECT=1` for this process
/// (`crate::headless`); `xdg_runtime_dir`: that variable as the process sees it.
pub fn checks(adapters: &[AdapterSummary], device_select_quieted: bool, xdg_runtime_dir: Option<&str>) -> Vec<Check> {
    let mut out = vec![
        Check::ok(SECTION, "cpu", "host memory, CPU kernels"),
        Check::ok(
            SECTION,
            "sim",
            format!("{} GPU profiles for simulated devices (`ferrite memory gpus`)", GPU_CATALOGUE.len()),
        ),
    ];
    if adapters.is_empty() && !ferrite_memory::gpu::COMPILED {
        out.push(Check::warning(
            SECTION,
            "gpu",
            "no GPU support in this build (compiled without the `gpu` cargo feature)",
            "rebuild with `--features gpu`, the default of `cargo build --release -p ferrite-cli`",
        ));
    } else if adapters.is_empty() {
        out.push(Check::warning(
            SECTION,
            "gpu",
            "no GPU adapter (ferrite reaches GPUs through Vulkan, Metal or DX12)",
            "on Linux install a Vulkan driver: your GPU vendor's, or Mesa's (`apt-get install mesa-vulkan-drivers libvulkan1`); `ferrite devices` lists what is found",
        ));
    }
    for a in adapters {
        let name = format!("gpu:{}", a.index);
        let found = format!(
            "{} ({}, {}, driver {} {}), capacity {}",
            a.name,
            a.backend,
            a.device_type,
            a.driver,
            a.driver_info,
            match (&a.capacity, &a.capacity_source) {
                (Some(c), Some(src)) => format!("{} from {src}", format_size(*c)),
                (Some(c), None) => format_size(*c),
                _ => "unknown".into(),
            }
        );
        if a.capacity.is_none() {
            out.push(Check::warning(
                SECTION,
                name,
                found,
                format!(
                    "wgpu cannot ask the card for its memory size: set {GPU_MEMORY_ENV} (e.g. 24GiB) so OOM reports and planning know the capacity"
                ),
            ));
        } else {
            out.push(Check::ok(SECTION, name, found));
        }
    }
    if device_select_quieted {
        let why = match xdg_runtime_dir {
            None => "XDG_RUNTIME_DIR is not set".to_string(),
            Some(d) if !std::path::Path::new(d).is_absolute() => {
                format!("XDG_RUNTIME_DIR `{d}` is not an absolute path")
            }
            Some(d) => format!("XDG_RUNTIME_DIR `{d}` is not a directory"),
        };
        out.push(Check::note(
            SECTION,
            "mesa device-select",
            format!(
                "ferrite set NODEVICE_SELECT=1 for itself: {why}, where Mesa's device-select Vulkan layer makes libwayland print `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` when GPUs are listed"
            ),
            "nothing to do on a headless machine (the layer only orders GPUs for a display); to keep the layer, set XDG_RUNTIME_DIR to your runtime directory (e.g. /run/user/$(id -u)); to decide yourself, set NODEVICE_SELECT (ferrite then leaves it alone)",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::doctor::check::Verdict;

    #[test]
    fn the_device_select_note_appears_only_when_ferrite_set_the_variable() {
        assert!(checks(&[], false, None).iter().all(|c| c.name != "mesa device-select"));
        let c = checks(&[], true, None);
        let note = c.iter().find(|c| c.name == "mesa device-select").unwrap();
        assert_eq!(note.verdict, Verdict::Note);
        assert!(
            note.found.contains("XDG_RUNTIME_DIR is not set") && note.found.contains("NODEVICE_SELECT=1"),
            "{note:?}"
        );
        let c = checks(&[], true, Some("/run/user/1000"));
        assert!(c.iter().any(|c| c.found.contains("`/run/user/1000` is not a directory")), "{c:?}");
    }
}
