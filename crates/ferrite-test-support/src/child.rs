//! Running one test of the current test executable again, alone, in a child process with extra
//! environment — for behaviour fixed when a process starts (the emulated CUDA device, rayon's
//! thread count) that a test cannot change inside its own process.

/// Runs the test `name` of this test executable alone (`--exact`, one thread, output shown) in a
/// child process with `env` added, and returns the child's standard output. The calling test
/// fails when the child cannot start or fails, with both of the child's outputs in the message.
pub fn run_in_child(name: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test executable's path: {e}"));
    let out = std::process::Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("could not start {name} in a child process: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} in a child process with {env:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
