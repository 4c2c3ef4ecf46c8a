//! Which devices this process may use, and under which numbers: `FERRITE_VISIBLE_DEVICES` and
//! `--devices` work like `CUDA_VISIBLE_DEVICES`.
//!
//! A list such as `1,3` picks physical devices 1 and 3 *and renumbers them*: the process sees
//! them as `gpu:0` and `gpu:1` (or `sim:<gpu>:0` and `sim:<gpu>:1`), in the order given. A user
//! asking "how do I train on GPUs 1 and 3 only" writes exactly what they would write for CUDA.
//!
//! - Real GPUs: the physical devices are the wgpu adapters in `ferrite devices` order; the list
//!   is applied once per process, before the first GPU is opened ([`set_visible_devices`] from
//!   the command line, else the environment variable).
//! - Simulated GPUs: `sim:<gpu>` models a box of [`SIM_BOX_GPUS`] identical cards. Without a list
//!   the process uses one of them; `--device sim:a100-40gb --devices 0,1,2,3` gives four, each
//!   with its own caching allocator and statistics (`sim:a100-40gb:0` … `:3`).
//! - CUDA devices: the driver has already applied `CUDA_VISIBLE_DEVICES`; the list chooses among
//!   the devices it shows, so `cuda:N` is numbered like PyTorch's `cuda:N` and then renumbered.
//! - `cpu` and `meta` are one device each; a list does not apply to them.
//!
//! A bad list (garbage, an empty entry, a duplicate, an index the machine does not have) is a
//! [`MemoryError::InvalidDeviceList`] naming the valid indices, never a silent fallback.
//!
//! This file parses lists and holds the process's GPU selection, which `gpu/` reads to number
//! its adapters; applying a list to the adapters and listing devices is `visible_devices/listing.rs`,
//! above `gpu/`.
use std::sync::OnceLock;

use crate::MemoryError;

mod listing;

pub use listing::{DeviceInfo, devices, list_devices, select_devices, set_visible_devices, visible_gpu_error};

/// Environment variable choosing and renumbering devices (`FERRITE_VISIBLE_DEVICES=1,3`).
pub const VISIBLE_DEVICES_ENV: &str = "FERRITE_VISIBLE_DEVICES";

/// How many cards a simulated box (`sim:<gpu>`) has: a 16-GPU node, the largest common one.
pub const SIM_BOX_GPUS: usize = 16;

/// Parse a device list (`"1,3"`) against `available` physical devices: the physical indices in
/// the order given. Garbage, empty entries, duplicates and indices `>= available` are errors
/// naming the valid indices.
pub fn parse_device_list(list: &str, available: usize) -> Result<Vec<usize>, MemoryError> {
    let valid = valid_indices(available);
    let bad = |reason: String| MemoryError::InvalidDeviceList { list: list.to_string(), reason, valid: valid.clone() };
    if list.trim().is_empty() {
        return Err(bad("the list is empty".into()));
    }
    let mut out: Vec<usize> = Vec::new();
    for entry in list.split(',') {
        let e = entry.trim();
        if e.is_empty() {
            return Err(bad("it has an empty entry (two commas, or a comma at an end)".into()));
        }
        let i: usize = e.parse().map_err(|_| bad(format!("`{e}` is not a device index (a non-negative integer)")))?;
        if i >= available {
            return Err(bad(format!("there is no device {i}")));
        }
        if out.contains(&i) {
            return Err(bad(format!("device {i} is listed twice")));
        }
        out.push(i);
    }
    Ok(out)
}

fn valid_indices(available: usize) -> String {
    match available {
        0 => "none (no such device on this machine)".to_string(),
        1 => "0".to_string(),
        n => format!("0..={} ({n} devices)", n - 1),
    }
}

/// The visible CUDA device list chosen on the command line (`--device cuda:0 --devices 1,3`).
static CUDA_SELECTION: OnceLock<Result<Option<Vec<usize>>, MemoryError>> = OnceLock::new();

/// The CUDA ordinals visible to this process as `cuda:0`, `cuda:1`, … (`None`: all `physical` of
/// them, the devices the driver shows after `CUDA_VISIBLE_DEVICES`), from
/// [`set_visible_cuda_devices`] or else `FERRITE_VISIBLE_DEVICES`.
pub(crate) fn cuda_selection(physical: usize) -> Result<Option<Vec<usize>>, MemoryError> {
    CUDA_SELECTION
        .get_or_init(|| match std::env::var(VISIBLE_DEVICES_ENV) {
            Ok(l) => parse_device_list(&l, physical).map(Some),
            Err(_) => Ok(None),
        })
        .clone()
}

/// Choose and renumber the CUDA devices this process uses (`--devices 1,3` with `--device
/// cuda:0`), over the devices the driver shows (`physical`), overriding `FERRITE_VISIBLE_DEVICES`.
/// A second call with a different list is an error.
pub(crate) fn set_cuda_selection(list: &str, physical: usize) -> Result<(), MemoryError> {
    let parsed = parse_device_list(list, physical).map(Some);
    let stored = CUDA_SELECTION.get_or_init(|| parsed.clone());
    if *stored != parsed {
        return Err(MemoryError::InvalidDeviceList {
            list: list.to_string(),
            reason: "the visible CUDA devices were already chosen for this process (set the list once, before the first CUDA device is used)".into(),
            valid: valid_indices(physical),
        });
    }
    stored.clone().map(|_| ())
}

/// The visible GPU list chosen on the command line (set once, before any GPU is opened).
static GPU_SELECTION: OnceLock<Result<Option<Vec<usize>>, MemoryError>> = OnceLock::new();

/// The physical GPU indices visible to this process, in visible order (`None`: all of them), from
/// [`set_visible_devices`] or else `FERRITE_VISIBLE_DEVICES`.
pub(crate) fn gpu_selection(physical: usize) -> Result<Option<Vec<usize>>, MemoryError> {
    GPU_SELECTION
        .get_or_init(|| match std::env::var(VISIBLE_DEVICES_ENV) {
            Ok(l) => parse_device_list(&l, physical).map(Some),
            Err(_) => Ok(None),
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_parsed_in_the_order_given() {
        assert_eq!(parse_device_list("1,3", 4).unwrap(), vec![1, 3]);
        assert_eq!(parse_device_list(" 3 , 0 ", 4).unwrap(), vec![3, 0]);
    }

    #[test]
    fn bad_lists_name_the_valid_indices() {
        for (list, says) in [
            ("", "empty"),
            ("  ", "empty"),
            ("0,,1", "empty entry"),
            ("0,", "empty entry"),
            ("1,1", "listed twice"),
            ("4", "no device 4"),
            ("a", "`a` is not a device index"),
            ("-1", "`-1` is not"),
            ("1.5", "`1.5` is not"),
        ] {
            let e = parse_device_list(list, 4).unwrap_err();
            assert!(matches!(e, MemoryError::InvalidDeviceList { .. }), "{list}: {e:?}");
            let msg = e.to_string();
            assert!(msg.contains(says), "{list}: {msg}");
            assert!(msg.contains("0..=3"), "{list}: {msg}");
        }
        assert!(parse_device_list("0", 0).unwrap_err().to_string().contains("none"));
    }
}
