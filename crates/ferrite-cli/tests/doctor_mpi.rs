//! `ferrite doctor`'s MPI line tells the truth about the binary under test, in both build
//! flavours: CI builds the workspace with `--features ferrite-cli/mpi` and without, and this test
//! compares the report with `cfg!(feature = "mpi")` of this test crate (the same features as the
//! binary). With the feature: the library's own description and `mpirun`'s path, and under
//! `mpirun -np 2` each rank's rank and world size. Without it: a note (not "ok") saying how to get
//! it. `--json` carries the same facts as fields.

mod common;

use std::process::Command;

/// The variables a launcher sets, removed so the test runner's own environment cannot leak in.
const LAUNCHER_VARS: &[&str] = &["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK"];

fn doctor(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrite"));
    c.arg("doctor").args(args);
    for k in LAUNCHER_VARS {
        c.env_remove(k);
    }
    c.envs(env.iter().copied());
    let o = c.output().expect("ferrite runs");
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(o.status.success(), "{out}{err}");
    (out, err)
}

/// `mpirun` on PATH, found the way a shell finds it.
fn mpirun_on_path() -> Option<String> {
    let o = Command::new("sh").args(["-c", "command -v mpirun"]).output().ok()?;
    let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
    (o.status.success() && !p.is_empty()).then_some(p)
}

fn mpi_line(text: &str) -> &str {
    text.lines()
        .find(|l| l.split_whitespace().nth(1) == Some("mpi"))
        .unwrap_or_else(|| panic!("no mpi line in\n{text}"))
}

#[test]
fn the_mpi_line_matches_this_build() {
    let (text, _) = doctor(&[], &[]);
    let line = mpi_line(&text);
    let (json, _) = doctor(&["--json"], &[]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let mpi = &v["mpi"];
    assert_eq!(mpi["compiled"], cfg!(feature = "mpi"), "{json}");
    let features: Vec<&str> = v["ferrite"]["features"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
    assert_eq!(features.contains(&"mpi"), cfg!(feature = "mpi"), "{features:?}");
    // mpirun: the same answer as the shell's.
    match mpirun_on_path() {
        Some(p) => {
            assert_eq!(mpi["mpirun"], p.as_str(), "{json}");
            assert!(line.contains(&format!("mpirun at {p}")), "{line}");
        }
        None => {
            assert!(mpi["mpirun"].is_null(), "{json}");
            assert!(line.contains("no mpirun on PATH"), "{line}");
        }
    }
    assert!(mpi.get("rank").is_none() && mpi.get("world").is_none(), "not launched by mpirun: {json}");
    if cfg!(feature = "mpi") {
        // The library as it describes itself (Open MPI: "Open MPI v4.1.4, package: ...").
        let library = mpi["library"].as_str().unwrap_or_else(|| panic!("no library in {json}"));
        assert!(library.contains("MPI"), "{library}");
        assert!(line.contains("built in") && line.contains(library), "{line}");
        let expected = if mpirun_on_path().is_some() { "  ok " } else { "  warning " };
        assert!(line.starts_with(expected), "{line}");
        assert!(!line.contains("not built in"), "{line}");
    } else {
        assert!(mpi["library"].is_null(), "{json}");
        assert!(line.starts_with("  note ") && line.contains("not built in"), "{line}");
        let fix = text.lines().skip_while(|l| *l != line).nth(1).unwrap_or("");
        assert!(
            fix.contains("fix: ")
                && fix.contains("--features mpi")
                && fix.contains("libopenmpi-dev openmpi-bin libclang-dev"),
            "{fix}"
        );
        let check = v["checks"].as_array().unwrap().iter().find(|c| c["name"] == "mpi").unwrap();
        assert_eq!(check["verdict"], "note", "{json}");
    }
    // The summary counts notes.
    assert_eq!(
        v["summary"]["note"].as_u64(),
        Some(v["checks"].as_array().unwrap().iter().filter(|c| c["verdict"] == "note").count() as u64)
    );
}

/// The launcher's variables are read, not MPI initialized: a rank given by Open MPI's variables
/// is reported; in a build without MPI that is a warning (each rank would train alone).
#[test]
fn the_rank_a_launcher_gives_is_reported() {
    let env = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")];
    let (json, _) = doctor(&["--json"], &env);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!((v["mpi"]["rank"].as_u64(), v["mpi"]["world"].as_u64()), (Some(1), Some(2)), "{json}");
    let (text, _) = doctor(&[], &env);
    let line = mpi_line(&text);
    if cfg!(feature = "mpi") {
        assert!(text.contains("launched by mpirun: rank 1 of 2 (from OMPI_COMM_WORLD_RANK)"), "{text}");
    } else {
        assert!(line.starts_with("  warning ") && line.contains("rank 1 of 2"), "{line}");
    }
}

/// Under a real `mpirun -np 2` (mpi builds with Open MPI installed), each rank reports its rank.
#[test]
fn under_mpirun_each_rank_reports_itself() {
    if !cfg!(feature = "mpi") {
        eprintln!("SKIPPED under_mpirun_each_rank_reports_itself: built without the `mpi` feature");
        return;
    }
    if !common::require_or_skip("mpirun", "openmpi-bin libopenmpi-dev") {
        return;
    }
    let o = ferrite_test_support::mpirun_command()
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2", env!("CARGO_BIN_EXE_ferrite"), "doctor"])
        .output()
        .expect("mpirun starts");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    for rank in 0..2 {
        let wanted = format!("launched by mpirun: rank {rank} of 2 (from OMPI_COMM_WORLD_RANK)");
        assert!(out.contains(&wanted), "no `{wanted}` in\n{out}");
    }
}
