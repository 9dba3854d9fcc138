//! Builds the fake driver (libcuda.c beside this file) with the C compiler (`$CC` or `cc`):
//! shared by the fake-driver tests of gpumem (fakecuda.rs) and of the `gpumem` binary.
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the fake libcuda.so into a fresh folder `{prefix}-{pid}-{tag}` of the temporary
/// directory and returns the folder; `None`, said on stderr, without a C compiler.
///
/// # Panics
/// If the folder cannot be made or the compiler fails.
pub fn build_fake_libcuda(prefix: &str, tag: &str) -> Option<PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler `{cc}` to build the fake libcuda.so");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Both crates sit in crates/: the source is found the same way from either.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpumem/tests/support/libcuda.c");
    let out = Command::new(&cc)
        .args(["-O1", "-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so"))
        .arg(&src)
        .arg("-lpthread")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(dir)
}
