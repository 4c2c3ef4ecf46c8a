//! The processor: model, SIMD extensions and the threads ferrite's kernels will use.
//!
//! ferrite's CPU kernels pick AVX-512 or AVX2+FMA at run time (`ferrite_tensor::simd_level`); a
//! machine or a VM that hides AVX2 runs the portable kernels several times slower, which is
//! worth knowing before blaming the model.

use super::check::Check;

const SECTION: &str = "system";

/// The `model name` (x86) or `Model`/`Hardware` (ARM) line of `/proc/cpuinfo`.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        matches!(key.trim(), "model name" | "Model" | "Hardware").then(|| value.trim().to_string())
    })
}

/// The `flags` of the first processor in `/proc/cpuinfo`.
pub fn cpu_flags(cpuinfo: &str) -> Vec<String> {
    cpuinfo
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            matches!(key.trim(), "flags" | "Features").then(|| value.split_whitespace().map(str::to_string).collect())
        })
        .unwrap_or_default()
}

/// Vector extensions this process can use, as the CPU reports them to it.
fn simd_features() -> Vec<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        vec![
            ("sse4.2", is_x86_feature_detected!("sse4.2")),
            ("avx2", is_x86_feature_detected!("avx2")),
            ("fma", is_x86_feature_detected!("fma")),
            ("f16c", is_x86_feature_detected!("f16c")),
            ("avx512f", is_x86_feature_detected!("avx512f")),
            ("avx512bw", is_x86_feature_detected!("avx512bw")),
            ("avx512vl", is_x86_feature_detected!("avx512vl")),
            ("avx512_bf16", is_x86_feature_detected!("avx512bf16")),
        ]
    }
    #[cfg(target_arch = "aarch64")]
    {
        vec![("neon", std::arch::is_aarch64_feature_detected!("neon"))]
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Vec::new()
    }
}

pub fn checks(cpuinfo: Option<&str>) -> Vec<Check> {
    let mut out = Vec::new();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let model = cpuinfo.and_then(cpu_model).unwrap_or_else(|| "unknown model".into());
    out.push(Check::ok(
        SECTION,
        "cpu",
        format!("{model}, {} ({threads} threads available to this process)", std::env::consts::ARCH),
    ));

    let features = simd_features();
    let has = |name: &str| features.iter().any(|(n, yes)| *n == name && *yes);
    let mut listed: Vec<String> = features.iter().filter(|(_, yes)| *yes).map(|(n, _)| n.to_string()).collect();
    // AMX is not detectable through std yet; the kernel's flags say whether the CPU has it.
    let flags = cpuinfo.map(cpu_flags).unwrap_or_default();
    let amx: Vec<&String> = flags.iter().filter(|f| f.starts_with("amx")).collect();
    if !amx.is_empty() {
        listed.extend(amx.iter().map(|f| f.to_string()));
    }
    let level = ferrite_tensor::simd_level();
    let found = format!(
        "{} → ferrite kernels: {level}",
        if listed.is_empty() { "no vector extensions detected".to_string() } else { listed.join(" ") }
    );
    let forced = std::env::var_os("FERRITE_NO_SIMD").is_some();
    if cfg!(target_arch = "x86_64") && level == "baseline" && !forced && !(has("avx2") && has("fma")) {
        out.push(Check::warning(
            SECTION,
            "simd",
            found,
            "this CPU (or the VM) offers no AVX2+FMA, so ferrite runs its portable kernels, several times slower; on a VM, pass the host CPU model through (e.g. `-cpu host`)",
        ));
    } else {
        out.push(Check::ok(SECTION, "simd", found));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_model_and_flags() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 fma amx_tile\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\n";
        assert_eq!(cpu_model(text).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(cpu_flags(text), ["fpu", "sse", "avx2", "fma", "amx_tile"]);
        assert_eq!(cpu_model(""), None);
        assert!(cpu_flags("garbage without colons").is_empty());
    }

    #[test]
    fn the_simd_line_names_the_kernels_in_use() {
        let c = checks(None);
        assert_eq!(c.len(), 2);
        assert!(c[1].found.contains(ferrite_tensor::simd_level()), "{:?}", c[1]);
    }
}
