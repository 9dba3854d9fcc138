//! What a fresh user's QA pass of the `gpumem` binary found: each test runs the binary and
//! checks the exit status and the message.
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gpumem(args: &[&str]) -> (bool, String, String) {
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

/// A fresh folder of this test's own.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumem-fresh-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A copy of a trace of the repository in `dir`.
fn copy_trace(dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(Path::new(name).file_name().unwrap());
    std::fs::copy(repo().join(name), &to).unwrap();
    to
}

/// One line, no panic, no backtrace.
fn one_line_error(err: &str) {
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn report_refuses_to_write_onto_its_input() {
    let dir = scratch("report-self");
    let t = copy_trace(&dir, "traces/mixed_sizes.pickle.gz");
    let before = std::fs::read(&t).unwrap();
    let spelled = format!("{}/./mixed_sizes.pickle.gz", dir.display());
    let (ok, _, err) = gpumem(&["report", t.to_str().unwrap(), "-o", &spelled]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("-o ") && err.contains("that is the input file"),
        "{err}"
    );
    one_line_error(&err);
    // A hard link is the same file under another name.
    let link = dir.join("link.pickle.gz");
    std::fs::hard_link(&t, &link).unwrap();
    let (ok, _, err) = gpumem(&["report", t.to_str().unwrap(), "-o", link.to_str().unwrap()]);
    assert!(!ok && err.contains("that is the input file"), "{err}");
    assert_eq!(std::fs::read(&t).unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}
