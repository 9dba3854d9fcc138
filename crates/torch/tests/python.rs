//! Runs python/test_gpumem_torch.py (the Python module's argument checks, and its calls into
//! the library on the simulated device) with the `libgpumem_torch.so` cargo built for this
//! test. Without python3 it says so and passes: the Rust ABI tests still ran.
use std::path::PathBuf;
use std::process::Command;

#[test]
fn python_module_tests_pass() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    // The test runs as target/<profile>/deps/python-HASH. `cargo test` leaves the cdylib it
    // builds beside it in deps/; `cargo build` also copies it to target/<profile>/.
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    let candidates = [
        deps.join("libgpumem_torch.so"),
        deps.parent().unwrap().join("libgpumem_torch.so"),
    ];
    let lib = candidates
        .iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("cargo builds the cdylib with the tests: none of {candidates:?}"))
        .clone();
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
