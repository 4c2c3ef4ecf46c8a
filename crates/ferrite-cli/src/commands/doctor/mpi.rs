//! Multi-process training for this binary: whether the `mpi` feature is compiled in, the MPI
//! library it loaded (its own description, asked without initializing MPI), whether `mpirun` is
//! on `PATH`, and — when `mpirun` launched this process — the rank and world size it gave.
//!
//! Everything is observed here, not assumed: the feature from `cfg!`, the library from
//! `MPI_Get_library_version` (callable before `MPI_Init`), `mpirun` by searching `PATH`, the rank
//! from the variables the launcher sets (Open MPI's `OMPI_COMM_WORLD_*`, MPICH/Hydra's `PMI_*`,
//! PMIx's `PMIX_RANK`). MPI itself is not initialized: outside `mpirun` that can be slow or noisy.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::check::Check;

const SECTION: &str = "ferrite";

/// What to install and build for `--distributed`.
pub const HOW_TO_BUILD: &str = "rebuild with `cargo build --release -p ferrite-cli --features mpi` (needs `apt-get install libopenmpi-dev openmpi-bin libclang-dev`)";

/// The MPI facts of this binary and process (`doctor --json`'s `mpi`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MpiFacts {
    /// The `mpi` feature is compiled into this binary.
    pub compiled: bool,
    /// The MPI library's description of itself (only when compiled in).
    pub library: Option<String>,
    /// Where `mpirun` is on `PATH`, if it is.
    pub mpirun: Option<PathBuf>,
    /// This process's rank, when a launcher set it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// The number of ranks, when a launcher set it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world: Option<u64>,
    /// The variable the rank was read from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank_from: Option<&'static str>,
}

/// The launchers' (rank, world size) variables, best first.
const LAUNCHERS: &[(&str, Option<&str>)] =
    &[("OMPI_COMM_WORLD_RANK", Some("OMPI_COMM_WORLD_SIZE")), ("PMI_RANK", Some("PMI_SIZE")), ("PMIX_RANK", None)];

impl MpiFacts {
    /// The facts of this process.
    pub fn observe() -> MpiFacts {
        let path = std::env::var_os("PATH");
        let var = |k: &str| std::env::var(k).ok();
        MpiFacts::from_parts(cfg!(feature = "mpi"), library_version(), find_on_path("mpirun", path.as_deref()), var)
    }

    /// The facts from what was observed; `var` reads an environment variable.
    pub fn from_parts(
        compiled: bool,
        library: Option<String>,
        mpirun: Option<PathBuf>,
        var: impl Fn(&str) -> Option<String>,
    ) -> MpiFacts {
        let number = |k: &str| var(k).and_then(|v| v.trim().parse::<u64>().ok());
        let (rank_from, rank, world) = LAUNCHERS
            .iter()
            .find_map(|(r, w)| number(r).map(|rank| (Some(*r), Some(rank), w.and_then(number))))
            .unwrap_or((None, None, None));
        MpiFacts { compiled, library, mpirun, rank, world, rank_from }
    }
}

#[cfg(feature = "mpi")]
fn library_version() -> Option<String> {
    ferrite_parallel::distributed::mpi_library_version()
}

#[cfg(not(feature = "mpi"))]
fn library_version() -> Option<String> {
    None
}

/// The first executable file named `name` in the directories of `path` (a `PATH` value).
pub fn find_on_path(name: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path?).map(|dir| dir.join(name)).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(p) else { return false };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        meta.is_file() && meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        meta.is_file()
    }
}

/// The report's lines about MPI.
pub fn checks(f: &MpiFacts) -> Vec<Check> {
    let mut out = Vec::new();
    let mpirun = match &f.mpirun {
        Some(p) => format!("mpirun at {}", p.display()),
        None => "no mpirun on PATH".to_string(),
    };
    let launched = match (f.rank, f.world, f.rank_from) {
        (Some(rank), Some(world), Some(from)) => Some(format!("rank {rank} of {world} (from {from})")),
        (Some(rank), None, Some(from)) => Some(format!("rank {rank}, world size not given (from {from})")),
        _ => None,
    };
    if f.compiled {
        let library = f.library.as_deref().unwrap_or("its description is not UTF-8");
        let found = format!("built in (`mpi` feature); library: {library}; {mpirun}");
        if f.mpirun.is_none() && launched.is_none() {
            out.push(Check::warning(
                SECTION,
                "mpi",
                found,
                "`ferrite train --distributed` is launched as `mpirun -np N ferrite train --distributed`: `apt-get install openmpi-bin`, or put your MPI's bin directory on PATH",
            ));
        } else {
            out.push(Check::ok(SECTION, "mpi", found));
        }
        if let Some(l) = launched {
            out.push(Check::ok(SECTION, "mpi rank", format!("launched by mpirun: {l}")));
        }
    } else {
        let found = format!(
            "not built in: this ferrite was built without the `mpi` feature, so `ferrite train --distributed` is unavailable (data parallelism across the devices of one process works); {mpirun}"
        );
        match launched {
            // Under mpirun without MPI, every rank would train alone on all the data.
            Some(l) => out.push(Check::warning(
                SECTION,
                "mpi",
                format!("{found}; yet launched by mpirun as {l}"),
                format!("every rank of this job runs alone: {HOW_TO_BUILD}"),
            )),
            None => out.push(Check::note(SECTION, "mpi", found, format!("for multi-process training, {HOW_TO_BUILD}"))),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::doctor::check::Verdict;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn without_the_feature_a_note_says_how_to_get_it() {
        let f = MpiFacts::from_parts(false, None, Some("/usr/bin/mpirun".into()), env(&[]));
        let c = checks(&f);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].verdict, Verdict::Note);
        assert!(c[0].found.contains("not built in") && c[0].found.contains("mpirun at /usr/bin/mpirun"), "{c:?}");
        assert!(c[0].fix.as_ref().unwrap().contains("--features mpi"), "{c:?}");
        // Under mpirun, a build without MPI is a problem, not a remark.
        let f = MpiFacts::from_parts(
            false,
            None,
            None,
            env(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")]),
        );
        let c = checks(&f);
        assert_eq!(c[0].verdict, Verdict::Warning);
        assert!(c[0].found.contains("rank 1 of 2 (from OMPI_COMM_WORLD_RANK)"), "{c:?}");
    }

    #[test]
    fn with_the_feature_the_library_mpirun_and_rank_are_reported() {
        let lib = Some("Open MPI v4.1.4, package: Debian OpenMPI".to_string());
        let f = MpiFacts::from_parts(true, lib.clone(), Some("/usr/bin/mpirun".into()), env(&[]));
        let c = checks(&f);
        assert_eq!((c.len(), c[0].verdict), (1, Verdict::Ok), "{c:?}");
        assert!(c[0].found.contains("Open MPI v4.1.4"), "{c:?}");
        // No mpirun: a warning with the package.
        let c = checks(&MpiFacts::from_parts(true, lib.clone(), None, env(&[])));
        assert_eq!(c[0].verdict, Verdict::Warning);
        assert!(c[0].fix.as_ref().unwrap().contains("openmpi-bin"));
        // MPICH's launcher variables; a garbled rank is not a rank.
        let f = MpiFacts::from_parts(true, lib.clone(), None, env(&[("PMI_RANK", "3"), ("PMI_SIZE", "4")]));
        assert_eq!((f.rank, f.world, f.rank_from), (Some(3), Some(4), Some("PMI_RANK")));
        assert_eq!(checks(&f)[1].found, "launched by mpirun: rank 3 of 4 (from PMI_RANK)");
        let f = MpiFacts::from_parts(true, lib, None, env(&[("OMPI_COMM_WORLD_RANK", "x")]));
        assert_eq!((f.rank, f.world), (None, None));
    }

    #[test]
    fn mpirun_is_found_only_as_an_executable_file() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("mpirun");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        let path = std::env::join_paths([Path::new("/nonexistent"), dir.path()]).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(find_on_path("mpirun", Some(&path)), None, "not executable yet");
            std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        assert_eq!(find_on_path("mpirun", Some(&path)), Some(tool));
        assert_eq!(find_on_path("mpirun", None), None);
    }
}
