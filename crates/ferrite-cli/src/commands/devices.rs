//! `ferrite devices`: what this machine can compute on. A user choosing `--device` (or wondering
//! why `gpu:0` is refused) needs the list ferrite itself sees: the CPU, every GPU adapter with the
//! limits that decide which tensors fit one kernel binding, and where each GPU's capacity comes
//! from (wgpu does not report VRAM size), and the CUDA devices with the driver and NVRTC (or why
//! there are none: the driver library names looked for).

use ferrite_memory::format_size;
use ferrite_memory::gpu::{AdapterSummary, GPU_MEMORY_ENV, list_adapters};

use super::CliResult;

#[derive(clap::Args, Debug, Clone)]
pub struct DevicesArgs {
    /// Print one JSON object (`{"devices": [...]}`) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also list the devices this kind gives with `--devices` (`sim:a100-40gb`: a simulated box).
    #[arg(long)]
    pub device: Option<String>,
    /// Visible devices, renumbered from 0 like CUDA_VISIBLE_DEVICES (`0,1,2,3`; default:
    /// FERRITE_VISIBLE_DEVICES).
    #[arg(long)]
    pub devices: Option<String>,
}

pub fn run(args: DevicesArgs) -> CliResult {
    // The chosen devices first: a bad list is an error before anything is printed.
    let sims = match &args.device {
        Some(d) => ferrite_memory::select_devices(&d.parse()?, args.devices.as_deref())?,
        None => {
            if let Some(l) = &args.devices {
                ferrite_memory::set_visible_devices(l)?;
            }
            Vec::new()
        }
    };
    let sims: Vec<ferrite_memory::Device> =
        sims.into_iter().filter(|d| matches!(d, ferrite_memory::Device::Sim { .. })).collect();
    let visible = ferrite_memory::list_devices(&sims)?;
    let adapters = list_adapters();
    let cuda = super::doctor::cuda::CudaFacts::observe();
    if args.json {
        let mut v = json(&adapters);
        v["visible"] = visible_json(&visible);
        v["cuda"] = cuda.json();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", visible_table(&visible));
        print!("{}", table(&adapters));
        print!("{}", cuda.text());
    }
    Ok(())
}

/// What this process may use, renumbered (`ferrite::devices()`): index, name, capacity, free.
pub fn visible_table(visible: &[ferrite_memory::DeviceInfo]) -> String {
    let mut s = String::from("Devices this process may use:\n");
    for d in visible {
        s.push_str(&format!("  {d}\n"));
    }
    s.push('\n');
    s
}

fn visible_json(visible: &[ferrite_memory::DeviceInfo]) -> serde_json::Value {
    visible
        .iter()
        .map(|d| {
            serde_json::json!({
                "device": d.device.to_string(),
                "index": d.device.index(),
                "physical_index": d.physical_index,
                "name": d.name,
                "capacity_bytes": d.capacity,
                "free_bytes": d.free,
            })
        })
        .collect()
}

fn capacity_text(a: &AdapterSummary) -> String {
    match (&a.capacity, &a.capacity_source) {
        (Some(c), Some(src)) => format!("{} ({src})", format_size(*c)),
        (Some(c), None) => format_size(*c),
        _ => format!("unknown (set {GPU_MEMORY_ENV}=24GiB to give ferrite a capacity for planning and OOM reports)"),
    }
}

/// The human-readable listing.
pub fn table(adapters: &[AdapterSummary]) -> String {
    let mut s = String::from(
        "cpu      host memory, CPU kernels\nmeta     shapes and allocations only (no data): planning\nsim:<gpu> host memory with a GPU's capacity and allocator (`ferrite memory gpus` lists them)\n",
    );
    if adapters.is_empty() && !ferrite_memory::gpu::COMPILED {
        s.push_str("\nNo GPU support in this build: ferrite was compiled without the `gpu` cargo feature, so `gpu:N` devices are refused.\nRebuild with `--features gpu` (the default of `cargo build --release -p ferrite-cli`).\n");
        return s;
    }
    if adapters.is_empty() {
        s.push_str("\nNo GPU adapter found (ferrite uses Vulkan, Metal or DX12 through wgpu).\nOn Linux install a Vulkan driver: your GPU vendor's, or Mesa's (`apt-get install mesa-vulkan-drivers libvulkan1`; lavapipe is a software GPU for testing).\n");
        return s;
    }
    for a in adapters {
        s.push_str(&format!(
            "\ngpu:{}    {}\n  backend {}, {}, driver {} {}\n  capacity: {}\n  max buffer {}, max storage binding {} (one tensor per kernel operand), offset alignment {} B, shader-f16 {}\n",
            a.index,
            a.name,
            a.backend,
            a.device_type,
            a.driver,
            a.driver_info,
            capacity_text(a),
            format_size(a.max_buffer_size),
            format_size(a.max_storage_buffer_binding_size),
            a.min_storage_buffer_offset_alignment,
            if a.shader_f16 { "yes" } else { "no" },
        ));
    }
    s
}

/// The `--json` listing.
pub fn json(adapters: &[AdapterSummary]) -> serde_json::Value {
    let mut devices = vec![
        serde_json::json!({"device": "cpu", "kind": "cpu"}),
        serde_json::json!({"device": "meta", "kind": "meta"}),
    ];
    for a in adapters {
        devices.push(serde_json::json!({
            "device": format!("gpu:{}", a.index),
            "kind": "gpu",
            "name": a.name,
            "backend": a.backend,
            "device_type": a.device_type,
            "driver": a.driver,
            "driver_info": a.driver_info,
            "capacity_bytes": a.capacity,
            "capacity_source": a.capacity_source,
            "max_buffer_size": a.max_buffer_size,
            "max_storage_buffer_binding_size": a.max_storage_buffer_binding_size,
            "min_storage_buffer_offset_alignment": a.min_storage_buffer_offset_alignment,
            "shader_f16": a.shader_f16,
        }));
    }
    serde_json::json!({ "devices": devices })
}
