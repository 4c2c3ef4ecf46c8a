//! `ferrite doctor`'s container limits: `/proc/self/cgroup`, `/proc/self/mountinfo` and the limit
//! files (`memory.max`, `cpu.max` and their cgroup v1 names), all taken from the input (four parts
//! split at blank lines), read as a limit or a warning, never a panic; a memory limit is the
//! file's number, a CPU limit a positive quota over a positive period. The CI
//! counterpart is `crates/ferrite-cli/tests/parser_fuzz.rs`.
#![no_main]

use std::sync::OnceLock;

use ferrite_cli::commands::doctor::cgroup::{CgroupFs, Limit, cpu_limit, memory_limit};
use libfuzzer_sys::fuzz_target;

fn root() -> &'static std::path::Path {
    static ROOT: OnceLock<std::path::PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("ferrite-fuzz-cgroup-{}", std::process::id()));
        std::fs::create_dir_all(&p).expect("a scratch directory");
        p
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(4, "\n\n");
    let [proc_cgroup, mountinfo, memory, cpu] = [(); 4].map(|_| parts.next().unwrap_or(""));
    for dir in ["sys/fs/cgroup", "sys/fs/cgroup/memory", "sys/fs/cgroup/cpu,cpuacct"] {
        let d = root().join(dir);
        std::fs::create_dir_all(&d).expect("a scratch directory");
        for (file, contents) in [
            ("memory.max", memory),
            ("memory.limit_in_bytes", memory),
            ("cpu.max", cpu),
            ("cpu.cfs_quota_us", cpu),
            ("cpu.cfs_period_us", "100000"),
        ] {
            std::fs::write(d.join(file), contents).expect("a scratch file");
        }
    }
    let fs = CgroupFs { root: root().to_path_buf() };
    if let Limit::Set { value, .. } = memory_limit(&fs, proc_cgroup, mountinfo) {
        assert_eq!(memory.trim().parse::<u64>().ok(), Some(value), "a memory limit from `{memory}`");
    }
    if let Limit::Set { value, .. } = cpu_limit(&fs, proc_cgroup, mountinfo) {
        assert!(value.is_finite() && value > 0.0, "a CPU limit of {value} from `{cpu}`");
    }
});
