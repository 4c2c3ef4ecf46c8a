//! What ferrite can compute on here: `cpu`, the simulated GPUs, every GPU adapter (through the
//! same code as `ferrite devices`), and whether this build can use MPI.

use ferrite_memory::gpu::{AdapterSummary, GPU_MEMORY_ENV};
use ferrite_memory::{GPU_CATALOGUE, format_size};

use super::check::Check;

const SECTION: &str = "devices";

pub fn checks(adapters: &[AdapterSummary]) -> Vec<Check> {
    let mut out = vec![
        Check::ok(SECTION, "cpu", "host memory, CPU kernels"),
        Check::ok(
            SECTION,
            "sim",
            format!("{} GPU profiles for simulated devices (`ferrite memory gpus`)", GPU_CATALOGUE.len()),
        ),
    ];
    if adapters.is_empty() {
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
    out.push(Check::ok(
        SECTION,
        "mpi",
        "not built in: this ferrite has no `mpi` feature, so multi-process training is unavailable (data parallelism across devices of one process works)",
    ));
    out
}
