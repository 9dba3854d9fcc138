//! Runs python/test_gpumem_torch.py (the Python module's argument checks, and its calls into
//! the library on the simulated device) with the `libgpumem_torch.so` cargo built for this
//! test. Without python3 it says so and passes: the Rust ABI tests still ran.
use std::path::PathBuf;
use std::process::Command;

#[test]
fn python_module_tests_pass() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    // target/<profile>/deps/python-HASH -> target/<profile>/libgpumem_torch.so
    let exe = std::env::current_exe().unwrap();
    let lib = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|p| p.join("libgpumem_torch.so"))
        .unwrap();
    assert!(
        lib.is_file(),
        "cargo builds the cdylib with the tests: {lib:?}"
    );
    let out = match Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "python", "-v"])
        .current_dir(&repo)
        .env("GPUMEM_TORCH_LIB", &lib)
        .env_remove("GPUMEM_CONF")
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("python3 not found ({e}): the Python module's tests are skipped");
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(out.status.success(), "python tests failed:\n{text}");
    assert!(text.contains("Ran "), "{text}");
    assert!(
        !text.contains("libgpumem_torch.so not built"),
        "the library test ran: {text}"
    );
}
