//! Environment variables that change what ferrite does, each checked with the parser ferrite
//! itself uses — including `PYTORCH_CUDA_ALLOC_CONF`, which ferrite does not read but which users
//! carry over from PyTorch: its settings mean the same in `FERRITE_ALLOC_CONF`, and a value
//! ferrite's parser rejects is reported with that parser's message.
//!
//! The checks take the variables as a list, so tests give them without touching the process
//! environment.

use ferrite_memory::{AllocatorConfig, Device, format_size};

use super::check::Check;

const SECTION: &str = "environment";

/// Every variable ferrite reads, and what it does.
pub const KNOWN: &[(&str, &str)] = &[
    ("FERRITE_ALLOC_CONF", "allocator settings, PYTORCH_CUDA_ALLOC_CONF syntax"),
    ("FERRITE_GPU_MEMORY", "capacity of every GPU adapter"),
    ("FERRITE_VISIBLE_DEVICES", "devices a multi-device run may use, renumbered (as CUDA_VISIBLE_DEVICES)"),
    ("FERRITE_DDP_TIMEOUT_S", "seconds a collective of --distributed waits for the other ranks"),
    ("FERRITE_DDP_COMM_THREAD", "0: gradient buckets all-reduced without the communication thread"),
    ("FERRITE_FASHION_MNIST_DIR", "directory of Fashion-MNIST's IDX files"),
    ("FERRITE_SPIN_US", "microseconds kernel threads spin before sleeping"),
    ("FERRITE_NO_SIMD", "forces the portable kernels"),
    ("FERRITE_TEST_DEVICES", "devices the conformance tests run on"),
    ("FERRITE_BENCH_DEVICE", "device the benchmarks run on"),
    ("FERRITE_PYTORCH_REFERENCE", "PyTorch reference fixtures for the tests"),
    ("FERRITE_REQUIRE_SYSTEM_DEPS", "tests fail instead of skipping without system packages"),
    ("FERRITE_IO_CRASH_CHILD_PATH", "internal to ferrite-io's crash-safety test"),
    ("FERRITE_FAULT_INJECT", "testing hook: the process kills itself at a named point (fault-injection tests)"),
];

/// Check `vars` (name, value; `None` for a value that is not UTF-8). `threads` is what the
/// process may run in parallel.
pub fn checks(vars: &[(String, Option<String>)], threads: usize) -> Vec<Check> {
    let mut out = Vec::new();
    let get = |name: &str| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_deref());
    for (name, value) in vars {
        let relevant = name.starts_with("FERRITE_")
            || matches!(name.as_str(), "PYTORCH_CUDA_ALLOC_CONF" | "RAYON_NUM_THREADS" | "CUDA_VISIBLE_DEVICES");
        if !relevant {
            continue;
        }
        let Some(value) = value else {
            let check =
                Check::warning(SECTION, name.clone(), "not valid UTF-8", "set it to a UTF-8 value, or unset it");
            out.push(if name == "FERRITE_ALLOC_CONF" {
                Check::error(
                    SECTION,
                    name.clone(),
                    "not valid UTF-8",
                    "every allocation fails until it is fixed or unset",
                )
            } else {
                check
            });
            continue;
        };
        out.push(check_one(name, value, get("FERRITE_ALLOC_CONF").flatten(), threads));
    }
    if out.is_empty() {
        out.push(Check::ok(SECTION, "variables", "no FERRITE_* variable set: defaults everywhere"));
    }
    out
}

fn check_one(name: &str, value: &str, ferrite_alloc_conf: Option<&str>, threads: usize) -> Check {
    let shown = format!("`{value}`");
    match name {
        "FERRITE_ALLOC_CONF" => match AllocatorConfig::parse(value) {
            Ok(_) => Check::ok(SECTION, name, shown),
            Err(e) => Check::error(
                SECTION,
                name,
                format!("{shown}: {e}"),
                "fix or unset it: while it is invalid, every allocation of ferrite's allocators fails with this error",
            ),
        },
        "PYTORCH_CUDA_ALLOC_CONF" => match AllocatorConfig::parse(value) {
            Ok(_) if ferrite_alloc_conf == Some(value) => {
                Check::ok(SECTION, name, format!("{shown}: valid, and FERRITE_ALLOC_CONF has the same settings"))
            }
            Ok(_) => Check::ok(
                SECTION,
                name,
                format!(
                    "{shown}: valid for ferrite's allocator too; ferrite reads FERRITE_ALLOC_CONF, so `export FERRITE_ALLOC_CONF=\"$PYTORCH_CUDA_ALLOC_CONF\"` applies it"
                ),
            ),
            Err(e) => Check::warning(
                SECTION,
                name,
                format!("{shown}: {e}"),
                "ferrite does not read this variable, but PyTorch does: check the key and value against PyTorch's documentation (ferrite implements PyTorch's native-allocator keys; `backend:cudaMallocAsync` has no ferrite equivalent)",
            ),
        },
        // `sim:<capacity>` is parsed by the same function as FERRITE_GPU_MEMORY; a leading digit
        // keeps GPU profile names (`sim:t4-16gb`) out.
        "FERRITE_GPU_MEMORY" => match Device::parse(&format!("sim:{}", value.trim()))
            .ok()
            .filter(|_| value.trim().starts_with(|c: char| c.is_ascii_digit()))
        {
            Some(d) => {
                let size = ferrite_memory::allocator(&d).mem_get_info().map(|(_, total)| format_size(total));
                Check::ok(SECTION, name, format!("{shown} = {}", size.unwrap_or_else(|| "?".into())))
            }
            None => Check::error(
                SECTION,
                name,
                format!("{shown} is not a capacity"),
                "write a capacity such as 24GiB, 16000MiB or a number of bytes: with this value `--device gpu:N` fails",
            ),
        },
        "FERRITE_FASHION_MNIST_DIR" => {
            if std::path::Path::new(value).is_dir() {
                Check::ok(SECTION, name, shown)
            } else {
                Check::warning(
                    SECTION,
                    name,
                    format!("{shown} is not a directory"),
                    "point it at the directory holding Fashion-MNIST's IDX files, or unset it",
                )
            }
        }
        "FERRITE_SPIN_US" => match value.trim().parse::<u64>() {
            Ok(us) => Check::ok(SECTION, name, format!("{us} µs")),
            Err(_) => Check::warning(
                SECTION,
                name,
                format!("{shown} is not a number of microseconds"),
                "it is ignored and the default (200 µs) applies; set a whole number, or unset it",
            ),
        },
        "FERRITE_DDP_TIMEOUT_S" => match value.trim().parse::<u64>() {
            Ok(s) if s > 0 => Check::ok(SECTION, name, format!("{s} s")),
            _ => Check::warning(
                SECTION,
                name,
                format!("{shown} is not a positive whole number of seconds"),
                "it is ignored and the default deadline applies; set a number of seconds, or unset it",
            ),
        },
        "FERRITE_FAULT_INJECT" => match ferrite_io::FaultPlan::parse(value) {
            Ok(plan) => Check::warning(
                SECTION,
                name,
                format!(
                    "{shown}: {} kills itself with SIGKILL at `{}` after {} pass(es)",
                    plan.rank.map_or("every process".to_string(), |r| format!("rank {r}")),
                    plan.at.name(),
                    plan.after
                ),
                "a testing hook of the fault-injection tests: unset it unless you are testing faults",
            ),
            Err(why) => Check::warning(
                SECTION,
                name,
                format!("{shown}: {why}"),
                "it is ignored (and is only a testing hook): unset it",
            ),
        },
        "FERRITE_NO_SIMD" => Check::warning(
            SECTION,
            name,
            format!("{shown}: portable kernels forced"),
            "CPU kernels run without AVX2/AVX-512, several times slower; unset it unless you are comparing kernels",
        ),
        "RAYON_NUM_THREADS" => match value.trim().parse::<usize>() {
            Ok(0) => Check::ok(SECTION, name, "0: one thread per CPU"),
            Ok(n) if n > threads => Check::warning(
                SECTION,
                name,
                format!("{n} threads on {threads} available CPUs"),
                format!(
                    "more threads than CPUs makes kernels wait for each other: set RAYON_NUM_THREADS={threads} or less"
                ),
            ),
            Ok(n) => Check::ok(SECTION, name, format!("{n} threads")),
            Err(_) => Check::warning(
                SECTION,
                name,
                format!("{shown} is not a number"),
                "set a number of threads, or unset it for one per CPU",
            ),
        },
        "CUDA_VISIBLE_DEVICES" => Check::ok(
            SECTION,
            name,
            format!(
                "{shown}: ferrite does not read it (its GPUs are wgpu adapters: `ferrite devices`; FERRITE_VISIBLE_DEVICES chooses among them)"
            ),
        ),
        known if KNOWN.iter().any(|(k, _)| *k == known) => {
            let purpose = KNOWN.iter().find(|(k, _)| *k == known).map_or("", |(_, p)| p);
            Check::ok(SECTION, name, format!("{shown} ({purpose})"))
        }
        unknown => {
            let closest = KNOWN
                .iter()
                .map(|(k, _)| (strsim::levenshtein(unknown, k), *k))
                .min()
                .filter(|(d, _)| *d <= 3)
                .map(|(_, k)| k);
            Check::warning(
                SECTION,
                name,
                format!("{shown}: ferrite reads no variable of this name"),
                match closest {
                    Some(k) => format!("did you mean {k}?"),
                    None => "remove it, or see `ferrite doctor --json` for the variables ferrite reads".to_string(),
                },
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::doctor::check::Verdict;

    fn run(vars: &[(&str, &str)]) -> Vec<Check> {
        let v: Vec<(String, Option<String>)> = vars.iter().map(|(k, v)| (k.to_string(), Some(v.to_string()))).collect();
        checks(&v, 4)
    }

    #[test]
    fn alloc_conf_variables_use_ferrites_parser() {
        let c = run(&[
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:abc"),
            ("FERRITE_ALLOC_CONF", "expandable_segments:maybe"),
        ]);
        assert_eq!(c[0].verdict, Verdict::Warning);
        let expected = AllocatorConfig::parse("max_split_size_mb:abc").unwrap_err().to_string();
        assert!(c[0].found.contains(&expected), "{c:?}");
        assert_eq!(c[1].verdict, Verdict::Error);
        assert!(c[1].found.contains("expandable_segments"), "{c:?}");
        let c = run(&[("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")]);
        assert_eq!(c[0].verdict, Verdict::Ok);
        assert!(c[0].found.contains("export FERRITE_ALLOC_CONF"), "{c:?}");
    }

    #[test]
    fn typos_and_bad_numbers_are_named() {
        let c = run(&[
            ("FERRITE_ALOC_CONF", "x"),
            ("FERRITE_SPIN_US", "fast"),
            ("RAYON_NUM_THREADS", "64"),
            ("HOME", "/root"),
        ]);
        assert_eq!(c.len(), 3, "HOME is not ferrite's: {c:?}");
        assert_eq!(c[0].fix.as_deref(), Some("did you mean FERRITE_ALLOC_CONF?"));
        assert!(
            c[1].found.contains("not a number") && c[2].fix.as_ref().unwrap().contains("RAYON_NUM_THREADS=4"),
            "{c:?}"
        );
        let c =
            run(&[("FERRITE_GPU_MEMORY", "lots"), ("FERRITE_GPU_MEMORY", "16GiB"), ("FERRITE_GPU_MEMORY", "t4-16gb")]);
        assert_eq!((c[0].verdict, c[2].verdict), (Verdict::Error, Verdict::Error));
        assert!(c[1].found.contains("16.00 GiB"), "{c:?}");
        assert_eq!(run(&[])[0].verdict, Verdict::Ok);
        let c = checks(&[("FERRITE_ALLOC_CONF".into(), None)], 4);
        assert_eq!(c[0].verdict, Verdict::Error);
    }

    #[test]
    fn every_variable_ferrite_reads_is_known() {
        // Read by ferrite-memory and ferrite-parallel: never "ferrite reads no variable of this name".
        let c = run(&[
            ("FERRITE_VISIBLE_DEVICES", "1,0"),
            ("FERRITE_DDP_TIMEOUT_S", "30"),
            ("FERRITE_DDP_COMM_THREAD", "0"),
        ]);
        assert!(c.iter().all(|c| c.verdict == Verdict::Ok), "{c:?}");
        let c = run(&[("FERRITE_DDP_TIMEOUT_S", "soon")]);
        assert_eq!(c[0].verdict, Verdict::Warning, "{c:?}");
        assert!(c[0].fix.as_ref().unwrap().contains("ignored"), "{c:?}");
    }

    #[test]
    fn an_armed_fault_injection_hook_is_a_warning_that_says_what_will_happen() {
        let c = run(&[("FERRITE_FAULT_INJECT", "rank:1,at:allreduce,after:3")]);
        assert_eq!(c[0].verdict, Verdict::Warning, "{c:?}");
        assert!(c[0].found.contains("rank 1 kills itself with SIGKILL at `allreduce` after 3"), "{c:?}");
        let c = run(&[("FERRITE_FAULT_INJECT", "at:nowhere")]);
        assert_eq!(c[0].verdict, Verdict::Warning, "{c:?}");
        assert!(c[0].found.contains("unknown point `nowhere`"), "{c:?}");
    }
}
