//! The CUDA commands without a driver (forced with GPUMEM_NO_CUDA, so this holds on any
//! machine): a clear error and exit status 1, never a panic; the simulated device still works.
use std::process::Command;

fn gpumem(args: &[&str]) -> (i32, String, String) {
    run(args, true)
}

/// Runs the CLI with the driver forced off (`no_cuda`) or left to the machine.
fn run(args: &[&str], no_cuda: bool) -> (i32, String, String) {
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

#[test]
fn cuda_commands_fail_cleanly_without_a_driver() {
    for args in [
        &["info", "--device", "all"][..],
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
    // No release threshold is null, not u64::MAX (16 EiB to a script).
    assert!(
        j["pool_defaults"]["release_threshold_bytes"].is_null(),
        "{out}"
    );
    assert_eq!(j["pool_defaults"]["reserve_bytes"], 256 << 20);
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
    // It says what it measures there (33-38 ns for every strategy said nothing by itself).
    assert!(
        err.contains("CPU cost") && err.contains("not driver time"),
        "{err}"
    );
    let j: serde_json::Value = serde_json::from_str(&out).expect("json");
    let rows = j[0]["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    assert!(rows
        .iter()
        .all(|r| r["backend"] == "tlsf" && r["median_ns"].as_f64().unwrap_or(0.0) > 0.0));
}

/// The same, without forcing the driver off (to see what was searched where there is none).
fn gpumem_plain(args: &[&str]) -> (i32, String, String) {
    run(args, false)
}

/// MemAvailable in bytes (0 if unknown), to keep the "too large" inputs too large.
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

#[test]
fn no_driver_names_libcuda_and_lists_the_search_only_with_v() {
    let (code, _, err) = gpumem(&["inspect"]);
    assert_eq!(code, 1);
    assert!(!err.contains("nvcuda"), "{err}");
    assert!(!err.contains("searched for the driver"), "{err}");
    // Without GPUMEM_NO_CUDA, on a machine without a driver, -v lists the names tried.
    let (code, _, err) = gpumem_plain(&["inspect", "-v"]);
    if code == 1 && err.contains("no NVIDIA driver") {
        assert!(
            err.contains("searched for the driver:") && err.contains("libcuda.so"),
            "{err}"
        );
        let (_, _, quiet) = gpumem_plain(&["inspect"]);
        assert!(!quiet.contains("libcuda.so,"), "{quiet}");
        assert!(quiet.contains("-v lists"), "{quiet}");
    }
}

#[test]
fn info_without_a_driver_shows_the_simulated_device_and_says_so() {
    let (code, out, err) = gpumem(&["info"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("simulated device"), "{out}");
    assert!(
        err.contains("no NVIDIA driver") && err.contains("showing the simulated device"),
        "{err}"
    );
    // Asking for a CUDA device by name still fails clearly.
    let (code, _, err) = gpumem(&["info", "--device", "cuda"]);
    assert_eq!(code, 1, "{err}");
}

#[test]
fn replay_on_cuda_checks_the_driver_before_reading_the_trace() {
    let (code, _, err) = gpumem(&["replay", "/nonexistent/trace.jsonl", "--device", "cuda"]);
    assert_eq!(code, 1);
    assert!(err.starts_with("error: no NVIDIA driver"), "{err}");
}

#[test]
fn benchmark_edges_are_refused_clearly() {
    // --time-ms 0 printed `NaN ns` and exited 0; --threads 0 silently ran 1.
    for args in [
        &["bench", "alloc", "--device", "sim", "--time-ms", "0"][..],
        &["bench", "alloc", "--device", "sim", "--threads", "0"],
        &["bench", "transfer", "--host-only", "--stage-threads", "0"],
        // advise --size 0 modelled a copy of nothing.
        &["advise", "--size", "0"],
    ] {
        let (code, _, err) = gpumem(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // bench pinned --no-cuda --sizes 100GiB aborted (rc 134) and bench transfer --host-only
    // --sizes 64GiB died (rc 141): both are refused with the figures.
    let avail = mem_available();
    for (args, size) in [
        (
            &["bench", "pinned", "--no-cuda", "--sizes"][..],
            100u64 << 30,
        ),
        (&["bench", "transfer", "--host-only", "--sizes"], 64 << 30),
    ] {
        if avail == 0 || avail >= 2 * size {
            continue; // a machine that could run it
        }
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.push(format!("{}GiB", size >> 30));
        let refs: Vec<&str> = v.iter().map(String::as_str).collect();
        let (code, _, err) = gpumem(&refs);
        assert_eq!(code, 1, "{refs:?}: {err}");
        assert!(
            err.contains("of host memory, but only") && err.contains("choose smaller sizes"),
            "{refs:?}: {err}"
        );
        // Human units on both sides (it said `needs 1099511627776 B`).
        assert!(
            err.contains(" GiB of host memory, but only ") && err.contains(" GiB are available"),
            "{refs:?}: {err}"
        );
    }
}

#[test]
fn advise_models_a_one_byte_copy_no_faster_than_the_smallest_measured() {
    // An empty cache directory: the built-in H200 table, whatever this machine cached.
    let run = |size: &str| -> f64 {
        let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(["advise", "--size", size, "--json"])
            .env("XDG_CACHE_HOME", "/nonexistent/gpumem-test-cache")
            .output()
            .expect("run gpumem");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        pageable_s(&String::from_utf8_lossy(&out.stdout))
    };
    fn pageable_s(out: &str) -> f64 {
        let j: serde_json::Value = serde_json::from_str(out).expect("json");
        j["options"]
            .as_array()
            .and_then(|o| o.iter().find(|k| k["kind"] == "pageable"))
            .and_then(|k| k["transfer_s"].as_f64())
            .expect("pageable option")
    }
    let one = run("1B");
    let page = run("4KiB");
    assert!(one > 1e-6, "1 B modelled at {one} s");
    assert!(one <= page, "{one} > {page}");
}
