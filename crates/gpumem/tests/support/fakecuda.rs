//! The one harness of the fake-driver tests (tests/cuda and tests/pinned): builds the fake
//! driver (tests/support/libcuda.c) with the C compiler (`$CC` or `cc`) and runs one test
//! again in a child process with `LD_LIBRARY_PATH` pointing at it, since the driver library
//! is loaded once per process. The same re-run serves tests that need another environment
//! (e.g. `GPUMEM_NO_CUDA`).
#![allow(dead_code)]
use std::ffi::OsString;
use std::process::Command;

#[path = "build_fake.rs"]
mod build_fake;

const CHILD: &str = "GPUMEM_TEST_CHILD";

/// Whether this process is the child of [`run_in_child`].
pub fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// The name libtest knows a test by: `module_path` without the crate, then `::name`.
pub fn test_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, rest)) => format!("{rest}::{name}"),
        None => name.to_string(),
    }
}

/// Runs test `name` (a full libtest name, see [`test_name`]) again in a child process with
/// `env` set (and `remove` unset); fails unless the child passed exactly that test and printed
/// no "FAKE:" line (a broken driver rule). Returns the child's output.
pub fn run_in_child(name: &str, env: &[(&str, OsString)], remove: &[&str]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        name,
        "--nocapture",
        "--test-threads=1",
        "--include-ignored",
    ])
    .env(CHILD, "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    for k in remove {
        cmd.env_remove(k);
    }
    let run = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child ran nothing:\n{text}");
    assert!(
        !text.contains("FAKE:"),
        "the fake driver saw an illegal call:\n{text}"
    );
    text
}

/// Runs `child` against the fake driver: in the parent, builds it and re-runs test `name`
/// (as [`test_name`] gives it) in a child process; in the child, calls `child`. Skipped with
/// a message where there is no C compiler.
pub fn against_fake_driver(name: &str, child: impl FnOnce()) {
    against_fake_driver_with(name, &[], child);
}

/// As [`against_fake_driver`], with `env` set in the child too (e.g. `FAKE_CUDA_DEVICES`).
pub fn against_fake_driver_with(name: &str, env: &[(&str, OsString)], child: impl FnOnce()) {
    if in_child() {
        return child();
    }
    let tag = name.replace("::", "-");
    let Some(dir) = build_fake::build_fake_libcuda("gpumem-fakecuda", &tag) else {
        return;
    };
    let mut all = vec![("LD_LIBRARY_PATH", dir.clone().into_os_string())];
    all.extend(env.iter().cloned());
    run_in_child(name, &all, &["GPUMEM_NO_CUDA"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the fake still holds: 0 host allocations, 1 device allocations, 2 events, 3 streams.
pub fn live(what: i32) -> i64 {
    // SAFETY: the fake library is loaded (the driver was initialised) and exports
    // `long fake_cuda_live(int)`.
    unsafe {
        let lib = libc::dlopen(c"libcuda.so".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        assert!(!lib.is_null(), "the fake libcuda.so is not loaded");
        let f = libc::dlsym(lib, c"fake_cuda_live".as_ptr());
        assert!(!f.is_null(), "libcuda.so is not the fake");
        let f: extern "C" fn(i32) -> i64 = std::mem::transmute(f);
        f(what)
    }
}
