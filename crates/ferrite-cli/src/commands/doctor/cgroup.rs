//! Container limits from cgroups: the memory limit above which the kernel kills the process
//! (exit 137, no Python or Rust error at all: the classic "my PyTorch container just died") and
//! the CPU quota that makes a 64-core machine a 2-core one.
//!
//! cgroup v2 (`memory.max`, `cpu.max`) and v1 (`memory.limit_in_bytes`, `cpu.cfs_quota_us`)
//! are both read. The process's cgroup comes from `/proc/self/cgroup`, its directory from
//! `/proc/self/mountinfo`; inside a container whose cgroup namespace hides the path, the
//! mount point itself is the process's cgroup. Everything reads through [`CgroupFs`] so tests
//! can build a fake tree.

use std::path::{Path, PathBuf};

use ferrite_memory::format_size;

use super::check::Check;

const SECTION: &str = "container";

/// v1 reports "no limit" as a huge number (page-rounded `i64::MAX`); anything above this is none.
const V1_UNLIMITED: u64 = 1 << 62;

/// Where to read `/proc/self/...` and the cgroup mounts from (a fake root in tests).
pub struct CgroupFs {
    pub root: PathBuf,
}

impl CgroupFs {
    pub fn system() -> CgroupFs {
        CgroupFs { root: PathBuf::from("/") }
    }

    fn read(&self, absolute: &Path) -> Result<String, String> {
        let p = self.root.join(absolute.strip_prefix("/").unwrap_or(absolute));
        std::fs::read_to_string(&p).map_err(|e| format!("cannot read {}: {e}", absolute.display()))
    }
}

/// A limit as read, with the file it came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Limit<T> {
    /// No limit set (`max`, or v1's huge number).
    None {
        file: PathBuf,
    },
    Set {
        value: T,
        file: PathBuf,
    },
    /// The file exists or should, but could not be read or parsed.
    Unreadable {
        reason: String,
    },
    /// No cgroup controller of this kind (not on Linux, or not mounted).
    Absent,
}

/// One mount of `/proc/self/mountinfo`: (root inside the hierarchy, mount point, fs type, super options).
fn mounts(mountinfo: &str) -> Vec<(String, String, String, String)> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            Some((f.get(3)?.to_string(), f.get(4)?.to_string(), r.first()?.to_string(), r.get(2)?.to_string()))
        })
        .collect()
}

/// The directories where the process's cgroup files of `controller` may be (best first):
/// cgroup v2 when `controller` is None, else the v1 hierarchy holding it.
fn cgroup_dirs(proc_cgroup: &str, mountinfo: &str, controller: Option<&str>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let wanted = match controller {
            None => controllers.is_empty(),
            Some(c) => controllers.split(',').any(|x| x == c),
        };
        if !wanted {
            continue;
        }
        for (root, mount_point, fstype, options) in mounts(mountinfo) {
            let fits = match controller {
                None => fstype == "cgroup2",
                Some(c) => fstype == "cgroup" && options.split(',').any(|o| o == c),
            };
            if !fits {
                continue;
            }
            let relative = path.strip_prefix(root.as_str()).unwrap_or(path).trim_start_matches('/');
            dirs.push(Path::new(&mount_point).join(relative));
            dirs.push(PathBuf::from(&mount_point));
        }
    }
    dirs.dedup();
    dirs
}

/// Read the first of `file` in `dirs` that exists.
fn read_first(fs: &CgroupFs, dirs: &[PathBuf], file: &str) -> Option<(PathBuf, Result<String, String>)> {
    dirs.iter().map(|d| d.join(file)).find(|p| fs.root.join(p.strip_prefix("/").unwrap_or(p)).exists()).map(|p| {
        let r = fs.read(&p);
        (p, r)
    })
}

/// The memory limit in bytes.
pub fn memory_limit(fs: &CgroupFs, proc_cgroup: &str, mountinfo: &str) -> Limit<u64> {
    let v2 = cgroup_dirs(proc_cgroup, mountinfo, None);
    if let Some((file, text)) = read_first(fs, &v2, "memory.max") {
        return match text.map(|t| t.trim().to_string()) {
            Ok(t) if t == "max" => Limit::None { file },
            Ok(t) => match t.parse() {
                Ok(value) => Limit::Set { value, file },
                Err(_) => {
                    Limit::Unreadable { reason: format!("{} holds `{t}`, not a number of bytes", file.display()) }
                }
            },
            Err(reason) => Limit::Unreadable { reason },
        };
    }
    let v1 = cgroup_dirs(proc_cgroup, mountinfo, Some("memory"));
    if let Some((file, text)) = read_first(fs, &v1, "memory.limit_in_bytes") {
        return match text.map(|t| t.trim().to_string()) {
            Ok(t) => match t.parse::<u64>() {
                Ok(v) if v >= V1_UNLIMITED => Limit::None { file },
                Ok(value) => Limit::Set { value, file },
                Err(_) => {
                    Limit::Unreadable { reason: format!("{} holds `{t}`, not a number of bytes", file.display()) }
                }
            },
            Err(reason) => Limit::Unreadable { reason },
        };
    }
    if v2.is_empty() && v1.is_empty() {
        Limit::Absent
    } else {
        Limit::Unreadable { reason: "no memory limit file found in the process's cgroup".into() }
    }
}

/// The CPU quota in CPUs (quota / period).
pub fn cpu_limit(fs: &CgroupFs, proc_cgroup: &str, mountinfo: &str) -> Limit<f64> {
    let v2 = cgroup_dirs(proc_cgroup, mountinfo, None);
    if let Some((file, text)) = read_first(fs, &v2, "cpu.max") {
        return match text {
            Ok(t) => {
                // The kernel writes `max PERIOD` or two positive integers (microseconds); anything
                // else (a zero, a sign, `NaN`, a fraction) is not a quota it would enforce.
                let mut parts = t.split_whitespace();
                let positive = |s: Option<&str>| s.and_then(|s| s.parse::<u64>().ok()).filter(|&v| v > 0);
                match (parts.next(), parts.next(), parts.next()) {
                    (Some("max"), _, None) => Limit::None { file },
                    (q, p @ Some(_), None) => match (positive(q), positive(p)) {
                        (Some(quota), Some(period)) => Limit::Set { value: quota as f64 / period as f64, file },
                        _ => Limit::Unreadable {
                            reason: format!("{} holds `{}`, not two positive whole numbers", file.display(), t.trim()),
                        },
                    },
                    _ => Limit::Unreadable {
                        reason: format!("{} holds `{}`, not `QUOTA PERIOD`", file.display(), t.trim()),
                    },
                }
            }
            Err(reason) => Limit::Unreadable { reason },
        };
    }
    let v1 = cgroup_dirs(proc_cgroup, mountinfo, Some("cpu"));
    if let Some((file, quota)) = read_first(fs, &v1, "cpu.cfs_quota_us") {
        let period = file.parent().map(|d| fs.read(&d.join("cpu.cfs_period_us")));
        return match (quota.map(|q| q.trim().parse::<i64>()), period.map(|p| p.map(|p| p.trim().parse::<i64>()))) {
            (Ok(Ok(q)), _) if q < 0 => Limit::None { file },
            (Ok(Ok(q)), Some(Ok(Ok(p)))) if q > 0 && p > 0 => Limit::Set { value: q as f64 / p as f64, file },
            (Err(reason), _) | (_, Some(Err(reason))) => Limit::Unreadable { reason },
            _ => Limit::Unreadable {
                reason: format!("{} or cpu.cfs_period_us beside it is not a number", file.display()),
            },
        };
    }
    if v2.is_empty() && v1.is_empty() {
        Limit::Absent
    } else {
        Limit::Unreadable { reason: "no CPU quota file found in the process's cgroup".into() }
    }
}

/// The container checks, given the machine's RAM and the threads the process sees.
pub fn checks(fs: &CgroupFs, physical: Option<u64>, threads: usize) -> Vec<Check> {
    let (proc_cgroup, mountinfo) =
        match (fs.read(Path::new("/proc/self/cgroup")), fs.read(Path::new("/proc/self/mountinfo"))) {
            (Ok(c), Ok(m)) => (c, m),
            (Err(e), _) | (_, Err(e)) => {
                // Not Linux, or /proc is not mounted: nothing to say about containers.
                return vec![Check::ok(SECTION, "cgroup", format!("no cgroup information ({e})"))];
            }
        };
    let mut out = Vec::new();
    match memory_limit(fs, &proc_cgroup, &mountinfo) {
        Limit::Set { value, file } => {
            let found = format!("{} ({})", format_size(value), file.display());
            match physical {
                Some(p) if value < p => out.push(Check::warning(
                    SECTION,
                    "memory limit",
                    format!("{found}, below the machine's {}", format_size(p)),
                    format!(
                        "above {} the kernel kills this process without an error message (exit status 137). ferrite's `cpu` device is sized by the machine's RAM, not by this limit: keep training within it (`--batch-size`, `--accum-steps`), or raise the container's limit (`docker run --memory`, a Kubernetes memory limit)",
                        format_size(value)
                    ),
                )),
                _ => out.push(Check::ok(SECTION, "memory limit", found)),
            }
        }
        Limit::None { file } => out.push(Check::ok(SECTION, "memory limit", format!("none ({})", file.display()))),
        Limit::Absent => out.push(Check::ok(SECTION, "memory limit", "no memory cgroup")),
        Limit::Unreadable { reason } => out.push(Check::warning(
            SECTION,
            "memory limit",
            reason,
            "the container's memory limit is unknown: if the process dies with exit status 137, it hit that limit",
        )),
    }
    match cpu_limit(fs, &proc_cgroup, &mountinfo) {
        Limit::Set { value, file } => {
            let found = format!("{value:.2} CPUs ({})", file.display());
            if value + 0.5 < threads as f64 {
                out.push(Check::warning(
                    SECTION,
                    "cpu quota",
                    format!("{found}, fewer than the {threads} threads ferrite will start"),
                    format!(
                        "threads beyond the quota are throttled, not run: set RAYON_NUM_THREADS={} (and --workers accordingly)",
                        value.floor().max(1.0)
                    ),
                ));
            } else {
                out.push(Check::ok(SECTION, "cpu quota", found));
            }
        }
        Limit::None { file } => out.push(Check::ok(SECTION, "cpu quota", format!("none ({})", file.display()))),
        Limit::Absent => out.push(Check::ok(SECTION, "cpu quota", "no cpu cgroup")),
        Limit::Unreadable { reason } => out.push(Check::warning(
            SECTION,
            "cpu quota",
            reason,
            "the container's CPU quota is unknown: if training is slower than expected, check it (`cat /sys/fs/cgroup/cpu.max`)",
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::doctor::check::Verdict;

    fn fake(files: &[(&str, &str)], dirs: &[&str]) -> (tempfile::TempDir, CgroupFs) {
        let t = tempfile::tempdir().unwrap();
        for d in dirs {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
        }
        for (p, text) in files {
            let full = t.path().join(p);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, text).unwrap();
        }
        let fs = CgroupFs { root: t.path().to_path_buf() };
        (t, fs)
    }

    const V2_MOUNT: &str = "30 24 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";

    #[test]
    fn cgroup_v2_limits_in_the_process_cgroup() {
        let (_t, fs) = fake(
            &[
                ("proc/self/cgroup", "0::/kubepods/pod1\n"),
                ("proc/self/mountinfo", V2_MOUNT),
                ("sys/fs/cgroup/kubepods/pod1/memory.max", "8589934592\n"),
                ("sys/fs/cgroup/kubepods/pod1/cpu.max", "150000 100000\n"),
            ],
            &[],
        );
        let c = checks(&fs, Some(32 << 30), 16);
        assert_eq!(c[0].verdict, Verdict::Warning, "{c:?}");
        assert!(
            c[0].found.contains("8.00 GiB") && c[0].found.contains("/sys/fs/cgroup/kubepods/pod1/memory.max"),
            "{c:?}"
        );
        assert!(c[0].fix.as_ref().unwrap().contains("137"));
        assert_eq!(c[1].verdict, Verdict::Warning, "{c:?}");
        assert!(
            c[1].found.starts_with("1.50 CPUs") && c[1].fix.as_ref().unwrap().contains("RAYON_NUM_THREADS=1"),
            "{c:?}"
        );
        // Under the machine's RAM and with enough CPUs, both are fine.
        let c = checks(&fs, Some(4 << 30), 1);
        assert_eq!((c[0].verdict, c[1].verdict), (Verdict::Ok, Verdict::Ok), "{c:?}");
    }

    #[test]
    fn a_namespaced_cgroup_reads_the_mount_point_and_max_means_none() {
        let (_t, fs) = fake(
            &[
                ("proc/self/cgroup", "0::/hidden/by/namespace\n"),
                ("proc/self/mountinfo", V2_MOUNT),
                ("sys/fs/cgroup/memory.max", "max\n"),
                ("sys/fs/cgroup/cpu.max", "max 100000\n"),
            ],
            &[],
        );
        let c = checks(&fs, Some(1 << 30), 2);
        assert!(c.iter().all(|c| c.verdict == Verdict::Ok && c.found.starts_with("none")), "{c:?}");
    }

    #[test]
    fn cgroup_v1_limits() {
        let mountinfo = "40 30 0:35 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n41 30 0:36 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let (_t, fs) = fake(
            &[
                ("proc/self/cgroup", "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n"),
                ("proc/self/mountinfo", mountinfo),
                ("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "2147483648\n"),
                ("sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n"),
                ("sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n"),
            ],
            &[],
        );
        let c = checks(&fs, Some(16 << 30), 4);
        assert_eq!(c[0].verdict, Verdict::Warning);
        assert!(c[0].found.contains("2.00 GiB"), "{c:?}");
        assert!(c[1].found.starts_with("none"), "{c:?}");
        // v1's "unlimited" is a huge number.
        std::fs::write(fs.root.join("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"), "9223372036854771712\n")
            .unwrap();
        assert!(checks(&fs, Some(16 << 30), 4)[0].found.starts_with("none"));
    }

    #[test]
    fn unreadable_or_garbled_files_are_warnings_not_failures() {
        // memory.max is a directory (unreadable), cpu.max holds garbage.
        let (_t, fs) = fake(
            &[("proc/self/cgroup", "0::/\n"), ("proc/self/mountinfo", V2_MOUNT), ("sys/fs/cgroup/cpu.max", "lots\n")],
            &["sys/fs/cgroup/memory.max"],
        );
        let c = checks(&fs, Some(1 << 30), 2);
        assert_eq!((c[0].verdict, c[1].verdict), (Verdict::Warning, Verdict::Warning), "{c:?}");
        assert!(c[0].found.contains("cannot read /sys/fs/cgroup/memory.max"), "{c:?}");
        assert!(c[1].found.contains("`lots`"), "{c:?}");
        // Found by fuzzing: a zero, signed or non-integer quota is no quota the kernel enforces
        // (it was read as 0 CPUs).
        for garbled in ["0000 100000", "-5 100000", "NaN 100000", "1.5 100000", "100000 0", "100000 100000 7"] {
            std::fs::write(fs.root.join("sys/fs/cgroup/cpu.max"), garbled).unwrap();
            let c = checks(&fs, Some(1 << 30), 2);
            assert_eq!(c[1].verdict, Verdict::Warning, "{garbled}: {c:?}");
            assert!(c[1].found.contains(garbled), "{garbled}: {c:?}");
        }
        // No /proc at all (not Linux): one line, no warning.
        let (_t2, empty) = fake(&[], &[]);
        let c = checks(&empty, None, 2);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].verdict, Verdict::Ok);
    }
}
