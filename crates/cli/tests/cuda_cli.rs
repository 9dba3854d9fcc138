//! The CUDA commands without a driver (forced with GPUMEM_NO_CUDA, so this holds on any
//! machine): a clear error and exit status 1, never a panic; the simulated device still works.
use std::process::Command;

fn gpumem(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(args)
        .env("GPUMEM_NO_CUDA", "1")
        .output()
        .expect("run gpumem");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cuda_commands_fail_cleanly_without_a_driver() {
    for args in [
        &["info"][..],
        &["info", "--device", "cuda:1", "--json"],
        &["inspect"],
        &["vmm"],
        &["bench", "alloc", "--device", "all"],
    ] {
        let (code, _out, err) = gpumem(args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: no NVIDIA driver (libcuda.so.1) found"),
            "{args:?}: {err}"
        );
        assert!(
            err.trim_end()
                .ends_with("use the simulated device: --device sim"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn simulated_device_commands_run() {
    let (code, out, err) = gpumem(&["vmm", "--device", "sim", "--pages", "4"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("reserved-unmapped") && out.contains("mapped"),
        "{out}"
    );
    let (code, out, err) = gpumem(&["info", "--device", "sim", "--json"]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(j["simulated"]["granularity_bytes"], 2 << 20);
    let (code, out, err) = gpumem(&[
        "bench",
        "alloc",
        "--device",
        "sim",
        "--strategies",
        "tlsf",
        "--sizes",
        "4KiB",
        "--threads",
        "1,2",
        "--time-ms",
        "5",
        "--mixed",
        "false",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).expect("json");
    let rows = j[0]["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    assert!(rows
        .iter()
        .all(|r| r["backend"] == "tlsf" && r["median_ns"].as_f64().unwrap_or(0.0) > 0.0));
}
