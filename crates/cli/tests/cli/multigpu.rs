//! `--device all` end to end against the fake driver (crates/gpumem/tests/support/libcuda.c)
//! with one and two devices: `replay` puts the trace's device N on cuda:N with canaries,
//! `bench transfer` measures each device and the pair. Skipped with a message where there is
//! no C compiler.
use crate::common::{args, repo};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the fake libcuda.so into a fresh folder; `None` without a C compiler.
fn fake_driver(tag: &str) -> Option<PathBuf> {
    crate::build_fake::build_fake_libcuda("gpumem-cli-fake", tag)
}

fn gpumem_on(fake: &Path, devices: u32, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(args)
        .current_dir(repo())
        .env("LD_LIBRARY_PATH", fake)
        .env("FAKE_CUDA_DEVICES", devices.to_string())
        .env_remove("GPUMEM_NO_CUDA")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !err.contains("FAKE:"),
        "the fake driver saw an illegal call:\n{err}"
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        err,
    )
}

#[test]
fn replay_device_all_puts_each_trace_device_on_its_gpu() {
    let Some(fake) = fake_driver("replay") else {
        return;
    };
    let (ok, out, err) = gpumem_on(
        &fake,
        2,
        &args("replay traces/multigpu/two_devices.jsonl --device all --canary -a best-fit --json"),
    );
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trace"]["devices"], serde_json::json!([0, 1]));
    let a = &v["allocators"][0];
    assert_eq!(a["canary_errors"], 0, "{a}");
    assert_eq!(a["per_device"].as_array().unwrap().len(), 2, "{a}");
    // With one GPU, the trace's device 1 has no GPU to go to: a clear error, not cuda:0.
    let (ok, _, err) = gpumem_on(
        &fake,
        1,
        &args("replay traces/multigpu/two_devices.jsonl --device all --canary -a best-fit"),
    );
    assert!(!ok);
    assert!(
        err.contains("device 1 on cuda:1") && err.contains("no CUDA device 1"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(fake);
}

#[test]
fn bench_transfer_device_all_measures_each_gpu_and_the_pair() {
    let Some(fake) = fake_driver("bench") else {
        return;
    };
    let args = [
        "bench",
        "transfer",
        "--device",
        "all",
        "--sizes",
        "64KiB,1MiB",
        "--kinds",
        "pinned,pageable",
        "--directions",
        "h2d,both",
        "--repeats",
        "1",
        "--no-cache",
        "--json",
    ];
    let (ok, out, err) = gpumem_on(&fake, 2, &args);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d["ordinal"], i);
        // 2 kinds × 2 directions × 2 sizes.
        assert_eq!(d["results"].as_array().unwrap().len(), 8, "{d}");
    }
    let peer = v["peer"].as_array().unwrap();
    assert_eq!(peer.len(), 1);
    assert_eq!(peer[0]["devices"], serde_json::json!([0, 1]));
    // Baseline + pool × 3 methods, 3 directions, 2 sizes.
    assert_eq!(peer[0]["rows"].as_array().unwrap().len(), 24);
    let checks = peer[0]["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 12);
    assert!(checks.iter().all(|c| c["check"]["mismatched_bytes"] == 0
        && c["check"]["damaged_guard_bytes"] == 0
        && c["check"]["damaged_source_bytes"] == 0));
    assert!(v["peer_note"].is_null());

    let (ok, out, err) = gpumem_on(&fake, 1, &args);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["devices"].as_array().unwrap().len(), 1);
    assert_eq!(v["peer"], serde_json::json!([]));
    assert_eq!(v["peer_note"], "skipped: 1 device");
    let (ok, _, err) = gpumem_on(&fake, 1, &["bench", "transfer", "--device", "gpu1"]);
    assert!(
        !ok && err.contains("expected a device ordinal (0), cuda:N or all"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(fake);
}
