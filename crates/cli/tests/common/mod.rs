//! What the end-to-end tests of the `gpumem` binary share (`mod common;` in each test file
//! that runs it with the repository as its working folder). Not every file uses every helper.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (the shipped traces are under it).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `gpumem ARGS` from the repository root: whether it succeeded, its stdout and stderr.
pub fn gpumem(args: &[&str]) -> (bool, String, String) {
    gpumem_in(&repo(), args)
}

/// Runs `gpumem ARGS` with `dir` as its working folder: success, stdout, stderr.
pub fn gpumem_in(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fresh, empty folder of the calling test's own (`tag`, and the test binary's process id).
pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumem-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An error of one line, with no panic and no backtrace.
pub fn one_line_error(err: &str) {
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
