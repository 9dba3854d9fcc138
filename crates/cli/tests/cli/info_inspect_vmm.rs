//! `gpumem info`, `inspect` and `vmm`, and the CUDA commands without a driver (forced with
//! GPUMEM_NO_CUDA, so this holds on any machine): a clear error, never a panic.
use crate::common::{args, gpumem, gpumem_env, gpumem_no_cuda, gpumem_ok, one_line_error, repo};
use std::process::Command;

/// The same, without forcing the driver off (to see what was searched where there is none).
fn gpumem_plain(args: &[&str]) -> (i32, String, String) {
    gpumem_env(args, false)
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
        let (code, _out, err) = gpumem_no_cuda(args);
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
    let (code, out, err) = gpumem_no_cuda(&["vmm", "--device", "sim", "--pages", "4"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("reserved-unmapped") && out.contains("mapped"),
        "{out}"
    );
    let (code, out, err) = gpumem_no_cuda(&["info", "--device", "sim", "--json"]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(j["simulated"]["granularity_bytes"], 2 << 20);
    // No release threshold is null, not u64::MAX (16 EiB to a script).
    assert!(
        j["pool_defaults"]["release_threshold_bytes"].is_null(),
        "{out}"
    );
    assert_eq!(j["pool_defaults"]["reserve_bytes"], 256 << 20);
    let (code, out, err) = gpumem_no_cuda(&args("bench alloc --device sim --strategies tlsf --sizes 4KiB --threads 1,2 --time-ms 5 --mixed false --json"));
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

#[test]
fn no_driver_names_libcuda_and_lists_the_search_only_with_v() {
    let (code, _, err) = gpumem_no_cuda(&["inspect"]);
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
    let (code, out, err) = gpumem_no_cuda(&["info"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("simulated device"), "{out}");
    assert!(
        err.contains("no NVIDIA driver") && err.contains("showing the simulated device"),
        "{err}"
    );
    // Asking for a CUDA device by name still fails clearly.
    let (code, _, err) = gpumem_no_cuda(&["info", "--device", "cuda"]);
    assert_eq!(code, 1, "{err}");
}

/// `inspect`'s table keeps its columns under `paged-lazy` (one letter wider than the column
/// was) and ends no line with spaces; its offsets are in binary units as the sizes beside
/// them (they were raw bytes, `300152782848`), exact in --json.
#[test]
fn inspect_keeps_its_columns() {
    let (out, _) = gpumem_ok(&["inspect", "--device", "sim"]);
    let lines: Vec<&str> = out.lines().filter(|l| l.contains(" | ")).collect();
    assert!(lines.iter().any(|l| l.starts_with("paged-lazy ")), "{out}");
    let bars = |l: &str| -> Vec<usize> { l.match_indices(" | ").map(|(i, _)| i).collect() };
    for l in &lines {
        assert_eq!(bars(l), bars(lines[0]), "{out}");
        assert_eq!(l.trim_end(), *l, "{out}");
    }
    // The offset column: every offset ends where its header does, with a unit.
    let end = lines[0].find("offset").unwrap() + "offset".len();
    let offsets: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l[..end].rsplit("  ").next().unwrap().trim())
        .collect();
    for (l, o) in lines[1..].iter().zip(&offsets) {
        assert!(
            o.ends_with(" B") || o.ends_with("iB"),
            "{o:?} in\n{l}\n{}",
            lines[0]
        );
    }
    // buddy: 256 B at 0, 64 KiB at 64 KiB, 3 MiB at 4 MiB, 64 MiB at 64 MiB; tlsf's second
    // block after the first's 256 B.
    assert_eq!(
        offsets[..5],
        ["0 B", "64 KiB", "4 MiB", "64 MiB", "0 B"],
        "{out}"
    );
    assert_eq!(offsets[5], "256 B", "{out}");
    let (json, _) = gpumem_ok(&["inspect", "--device", "sim", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let exact: Vec<u64> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pool"]["block_offset"].as_u64().unwrap())
        .collect();
    assert_eq!(exact[..6], [0, 65536, 4194304, 67108864, 0, 256]);
}

/// Every GPU command without a driver: a clear error, no panic, a non-zero exit, and advice
/// that works: where it says `--device sim`, the command takes `--device sim` (`bench
/// transfer` said so and then refused `sim` as a device).
#[test]
fn gpu_commands_without_a_driver_give_advice_that_works() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(args)
            .env("GPUMEM_NO_CUDA", "1")
            .current_dir(repo())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let t = "traces/mixed_sizes.pickle.gz";
    for args in [
        &["info", "--device", "cuda"][..],
        &["inspect"],
        &["vmm"],
        &["bench", "alloc"],
        &["bench", "transfer"],
        &["bench", "transfer", "--device", "all"],
        &["replay", t, "--device", "cuda"],
        &["replay", t, "--device", "all", "--json"],
    ] {
        let (code, out, err) = run(args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            err.starts_with("error: no NVIDIA driver"),
            "{args:?}: {err}"
        );
        if err.contains("--device sim") {
            // The advice, taken: the command's --device takes `sim` (its help says so).
            let mut help: Vec<&str> = args
                .iter()
                .copied()
                .take_while(|a| !a.starts_with('-') && !a.contains('/'))
                .collect();
            help.push("--help");
            let (_, out, _) = run(&help);
            let device = out
                .lines()
                .find(|l| l.trim_start().starts_with("--device"))
                .unwrap_or_else(|| panic!("{help:?}: {out}"));
            assert!(device.contains("sim"), "{args:?}: {err}\n{device}");
        }
    }
    let (_, _, err) = run(&["bench", "transfer"]);
    assert!(err.contains("--host-only"), "{err}");
    one_line_error(&err);
}

/// `inspect` when no strategy can allocate: each error once, no empty table, "1 error" (the
/// pool's out-of-memory cause was printed three times behind "torch: torch:"), and a size
/// larger than the device says so (only the pool's "0 B free" was given).
#[test]
fn inspect_errors_say_each_cause_once() {
    let (ok, out, err) = gpumem(&args(
        "inspect --device sim --sizes 1TiB --strategies torch",
    ));
    assert!(!ok);
    assert!(out.is_empty(), "{out}");
    let first = err.lines().next().unwrap();
    assert!(
        first.starts_with(
            "error: torch: allocating 1 TiB (more than the device's 139.8 GiB): out of memory"
        ),
        "{err}"
    );
    assert!(!first.contains("torch: torch"), "{first}");
    assert_eq!(first.matches("0 B free in total").count(), 1, "{first}");
    assert!(
        err.trim_end()
            .ends_with("no strategy could allocate (1 error)"),
        "{err}"
    );
}

/// `vmm`'s demonstration arena says when it rounded `--reserve` up to whole pages or
/// considered fewer pages than `--pages` asked (both were silent), in the table and in --json.
#[test]
fn vmm_says_what_it_rounded_and_capped() {
    let (out, _) = gpumem_ok(&["vmm", "--device", "sim", "--pages", "20", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["notes"],
        serde_json::json!([
            "--pages 20: considered 16, the pages the reserve holds (--reserve 40 MiB would hold 20)"
        ])
    );
    let (out, _) = gpumem_ok(&["vmm", "--device", "sim", "--reserve", "1KiB"]);
    assert!(
        out.contains("note: --reserve 1 KiB: reserved 2 MiB (whole pages of 2 MiB)"),
        "{out}"
    );
    // The reserve given was 0 (2 MiB, one page): the note read "--reserve 16 MiB holds 8",
    // as if the user had given 16 MiB.
    let (out, _) = gpumem_ok(&["vmm", "--device", "sim", "--reserve", "0"]);
    assert!(
        out.contains("note: --pages 8: considered 1, the pages the reserve holds (--reserve 16 MiB would hold 8)"),
        "{out}"
    );
    let (ok, out, _) = gpumem(&["vmm", "--device", "sim"]);
    assert!(ok && !out.contains("note:"), "{out}");
}

/// A `--reserve` that rounds up past 2^64 bytes is refused by name (it wrapped to 0 and the
/// device said "0 is not a non-zero multiple of the granularity").
#[test]
fn vmm_refuses_a_reserve_that_rounds_past_2_64() {
    let (ok, _, err) = gpumem(&args("vmm --device sim --reserve 18446744073709551615"));
    assert!(!ok);
    one_line_error(&err);
    assert!(
        err.contains(
            "18446744073709551615 B rounded up to whole pages of 2097152 B is more than 2^64 bytes"
        ),
        "{err}"
    );
}

/// `inspect --sizes ''` (or `,`) allocated nothing and printed nothing, with success; it is
/// refused, naming what was expected.
#[test]
fn inspect_refuses_an_empty_size_list() {
    for sizes in ["", ","] {
        let (ok, out, err) = gpumem(&["inspect", "--device", "sim", "--sizes", sizes]);
        assert!(!ok, "{out}");
        assert!(err.contains("expected at least one size"), "{err}");
    }
    let (out, _) = gpumem_ok(&["inspect", "--device", "sim", "--sizes", "64KiB", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(!v["rows"].as_array().unwrap().is_empty(), "{out}");
}
