//! `gpumem bench alloc`, `bench pinned` and `bench transfer` on the simulated device or host only.
use crate::common::{args, gpumem, gpumem_no_cuda, gpumem_ok, one_line_error, scratch};
use std::process::Command;

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
fn benchmark_edges_are_refused_clearly() {
    // --time-ms 0 printed `NaN ns` and exited 0; --threads 0 silently ran 1.
    for args in [
        &["bench", "alloc", "--device", "sim", "--time-ms", "0"][..],
        &["bench", "alloc", "--device", "sim", "--threads", "0"],
        &["bench", "transfer", "--host-only", "--stage-threads", "0"],
        // advise --size 0 modelled a copy of nothing.
        &["advise", "--size", "0"],
    ] {
        let (code, _, err) = gpumem_no_cuda(args);
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
        let (code, _, err) = gpumem_no_cuda(&refs);
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
fn bench_pinned_gives_advice_that_works() {
    // Without a driver (forced), the mlock fallback is measured: no advice to use a flag that
    // this command refuses.
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args([
            "bench",
            "pinned",
            "--sizes",
            "1MiB",
            "--repeats",
            "1",
            "--no-cache",
        ])
        .env("GPUMEM_NO_CUDA", "1")
        .output()
        .unwrap();
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{err}");
    assert!(err.contains("measuring the mlock fallback"), "{err}");
    assert!(
        !err.contains("--device sim") && !stdout.contains("--device sim"),
        "{err}{stdout}"
    );
    // One repeat is one (it said "medians of 1 repeats").
    assert!(
        stdout.contains("; medians of 1 repeat (pool_warm"),
        "{stdout}"
    );

    let (ok, _, err) = gpumem(&["bench", "pinned", "--device", "sim"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("expected a CUDA device ordinal (0, 1, ...) or cuda:N")
            && !err.contains("invalid digit"),
        "{err}"
    );
}

/// `bench alloc` shows pairs/s with a decimal prefix as `replay` shows events/s (it printed
/// 30891552), and its title has one pair of brackets.
#[test]
fn bench_alloc_rates_read_like_the_replay() {
    let (out, _) = gpumem_ok(&args("bench alloc --device sim --strategies tlsf --sizes 4KiB --threads 1 --time-ms 5 --mixed false"));
    let title = out.lines().next().unwrap();
    assert!(!title.contains(") ("), "{title}");
    let row = out
        .lines()
        .find(|l| l.starts_with("tlsf "))
        .unwrap_or_else(|| panic!("{out}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    // tlsf 4 KiB 1 <median> ns <p99> ns <rate> <prefix> - -
    let prefix = cells[cells.len() - 3];
    assert!(matches!(prefix, "M" | "k"), "{row}");
    assert!(cells[cells.len() - 4].contains('.'), "{row}");
}

/// The staging ring's settings are checked like the others: a zero chunk or buffer count is
/// refused naming the flag (it printed the library's `StagingConfig { chunk_bytes: 0, .. }`).
#[test]
fn staging_ring_settings_are_refused_by_flag() {
    for (flag, says) in [
        ("--stage-chunk", "a staging chunk holds at least 1 B"),
        (
            "--stage-buffers",
            "the staging ring needs at least 1 buffer",
        ),
    ] {
        let (ok, _, err) = gpumem(&["bench", "transfer", "--host-only", flag, "0"]);
        assert!(!ok);
        assert!(err.contains(flag) && err.contains(says), "{err}");
        assert!(!err.contains("StagingConfig"), "{err}");
    }
}

/// `bench transfer --host-only` names the copy as `--stage-copy` spells it (`nt`, `libc`); it
/// printed the Rust name `NonTemporal`.
#[test]
fn host_only_staging_names_the_copy_as_its_flag() {
    for (flag, shown) in [("nt", "copy nt:"), ("libc", "copy libc:")] {
        let (out, _) = gpumem_ok(&[
            "bench",
            "transfer",
            "--host-only",
            "--sizes",
            "1MiB",
            "--stage-copy",
            flag,
        ]);
        assert!(out.contains(shown), "{out}");
        assert!(
            !out.contains("NonTemporal") && !out.contains("Libc"),
            "{out}"
        );
    }
}

/// `bench alloc` measured nothing without a word (`--max-pairs 0`: rows of `-`, success), or
/// said only "no measurement succeeded" (`--sizes '' --mixed false`), or spent minutes
/// starting threads (`--threads 100000`): each is refused before anything runs.
#[test]
fn bench_alloc_refuses_settings_that_measure_nothing() {
    let base = ["bench", "alloc", "--device", "sim", "--time-ms", "1"];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        gpumem(&args)
    };
    let (ok, _, err) = run(&["--max-pairs", "0"]);
    assert!(!ok);
    assert!(err.contains("--max-pairs"), "{err}");
    let (ok, out, err) = run(&["--sizes", "", "--mixed", "false"]);
    assert!(!ok);
    assert!(out.is_empty(), "{out}");
    one_line_error(&err);
    assert!(err.contains("nothing to measure"), "{err}");
    let (ok, _, err) = run(&["--threads", "1,100000"]);
    assert!(!ok);
    assert!(err.contains("`100000`: at most 1024 threads"), "{err}");
    // The smallest run that measures: one size, one thread, one strategy.
    let (ok, out, err) = run(&args(
        "--sizes 1MiB --mixed false --threads 1 --strategies tlsf --max-pairs 1 --json",
    ));
    assert!(ok, "{err}");
    // One object per device measured.
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["rows"].as_array().unwrap().len(), 1, "{out}");
}

/// `bench pinned --repeats 0` measured once and printed "medians of 0 repeats"; `bench
/// transfer --host-only` took `--plot` and `--overlap` and did neither (no SVG written, no
/// word). Both are refused by name.
#[test]
fn bench_pinned_and_transfer_refuse_what_they_would_not_do() {
    let (ok, out, err) = gpumem(&args("bench pinned --repeats 0 --sizes 4KiB --no-cache"));
    assert!(!ok, "{out}");
    assert!(err.contains("--repeats"), "{err}");
    let (ok, out, err) = gpumem(&args(
        "bench transfer --host-only --repeats 0 --sizes 4KiB --no-cache",
    ));
    assert!(!ok, "{out}");
    assert!(err.contains("--repeats"), "{err}");
    let dir = scratch("host-only-plot");
    let svg = dir.join("bw.svg");
    for extra in [&["--plot", svg.to_str().unwrap()][..], &["--overlap"][..]] {
        let mut args = args("bench transfer --host-only --sizes 4KiB --no-cache");
        args.extend_from_slice(extra);
        let (ok, out, err) = gpumem(&args);
        assert!(!ok, "{extra:?}: {out}");
        assert!(
            err.contains(extra[0]) && err.contains("--host-only"),
            "{err}"
        );
    }
    assert!(!svg.exists());
    let _ = std::fs::remove_dir_all(&dir);
    // Each alone still runs.
    gpumem_ok(&args(
        "bench pinned --repeats 1 --sizes 4KiB --no-cache --json",
    ));
    gpumem_ok(&args("bench transfer --host-only --sizes 4KiB --no-cache"));
}

/// `bench transfer --host-only --stage-threads 100000` printed "threads 100000" for a ring
/// that started one thread per CPU; it prints the threads it measured with.
#[test]
fn host_only_staging_says_the_threads_it_measured_with() {
    let (out, _) = gpumem_ok(&args(
        "bench transfer --host-only --stage-threads 100000 --sizes 4KiB --no-cache --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    assert_eq!(
        v["staging_sweep"][0]["config"]["threads"].as_u64(),
        Some(cpus),
        "{out}"
    );
}

/// `bench transfer --host-only --kinds pinned` (or `--directions d2h`) measured the staging
/// ring's fill and drain as always and printed them, not a word about pinned memory: the
/// flags are refused with `--host-only`, as `--plot` and `--overlap` are.
#[test]
fn host_only_refuses_kinds_and_directions() {
    for extra in [["--kinds", "pinned"], ["--directions", "d2h"]] {
        let mut args = args("bench transfer --host-only --sizes 4KiB --no-cache");
        args.extend_from_slice(&extra);
        let (ok, out, err) = gpumem(&args);
        assert!(!ok, "{extra:?}: {out}");
        assert!(
            err.contains(extra[0]) && err.contains("--host-only"),
            "{extra:?}: {err}"
        );
    }
    let (ok, out, _) = gpumem(&["bench", "transfer", "--help"]);
    assert!(ok);
    assert!(out.contains("at the largest of --sizes"), "{out}");
}
