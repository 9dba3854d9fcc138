//! What the end-to-end tests of the `gpumem` binary share: running it, the repository's
//! traces, scratch folders and the checks many commands make.
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

pub fn jsonl_trace(tag: &str, lines: &[String]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("gpumem-{tag}-{}.jsonl", std::process::id()));
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// Runs gpumem with `input` on its standard input.
pub fn gpumem_stdin(args: &[&str], input: &[u8]) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(args)
        .current_dir(repo())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || {
        // The reader may stop early (a refused input): a broken pipe is fine.
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub const FIXTURES: &str = "crates/gpumem/tests/fixtures";

pub fn gpumem_no_cuda(args: &[&str]) -> (i32, String, String) {
    gpumem_env(args, true)
}

/// Runs the CLI with the driver forced off (`no_cuda`) or left to the machine.
pub fn gpumem_env(args: &[&str], no_cuda: bool) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpumem"));
    cmd.args(args);
    if no_cuda {
        cmd.env("GPUMEM_NO_CUDA", "1");
    } else {
        cmd.env_remove("GPUMEM_NO_CUDA");
    }
    let out = cmd.output().expect("run gpumem");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A copy of a trace of the repository in `dir`.
pub fn copy_trace(dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(Path::new(name).file_name().unwrap());
    std::fs::copy(repo().join(name), &to).unwrap();
    to
}

/// The names in `dir`, hidden ones included.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs `gpumem ARGS` from the repository root and asserts that it succeeded (the message is
/// its stderr): its stdout and stderr.
pub fn gpumem_ok(args: &[&str]) -> (String, String) {
    let (ok, out, err) = gpumem(args);
    assert!(ok, "{err}");
    (out, err)
}

/// Writes `contents` to `path`, which the test owns.
pub fn write_file(path: impl AsRef<Path>, contents: impl AsRef<[u8]>) {
    std::fs::write(path, contents).unwrap();
}

/// The words of a command line, for `gpumem(&args("replay TRACE -a torch"))`.
pub fn args(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Asserts that `dir` holds no temporary file of gpumem's (`.gpumem-*`, what an output is
/// written to before it is renamed).
pub fn assert_no_temporary_files(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".gpumem-"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}
