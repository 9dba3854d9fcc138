//! What the end-to-end tests of the `gpumem` binary share (`mod common;` in each test file
//! that runs it with the repository as its working folder).
use std::path::PathBuf;
use std::process::Command;

/// The repository root (the shipped traces are under it).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `gpumem ARGS` from the repository root: whether it succeeded, its stdout and stderr.
pub fn gpumem(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
