//! `gpumem map` and `gpumem watch` as a user runs them.
mod common;

use common::gpumem;
use std::path::Path;
use std::process::Command;

const TRACE: &str = r#"{"action":"alloc","addr":1,"size":8388608}
{"action":"alloc","addr":2,"size":600}
{"action":"alloc","addr":3,"size":3000000}
{"action":"alloc","addr":4,"size":3000000}
{"action":"alloc","addr":5,"size":70000}
{"action":"free","addr":3}
{"action":"alloc","addr":6,"size":25165824}
{"action":"free","addr":2}
{"action":"alloc","addr":7,"size":1000}
{"action":"free","addr":6}
{"action":"free","addr":4}
"#;

#[test]
fn map_prints_the_golden_map_in_a_pipe() {
    let dir = std::env::temp_dir().join(format!("gpumem-map-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("small.jsonl");
    std::fs::write(&trace, TRACE).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args([
            "map",
            "--allocator",
            "torch",
            "--width",
            "64",
            "--lines",
            "12",
        ])
        .args(["--segment-size", "32MiB"])
        .arg(&trace)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let golden =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpumem/tests/golden/map_torch_peak.txt");
    // The library's map at the peak, with the CLI's word that the default event is the peak
    // of reserved bytes (as the report's map says).
    let want = std::fs::read_to_string(golden).unwrap().replacen(
        "after event 6:",
        "after event 6 (peak reserved):",
        1,
    );
    let got = String::from_utf8(out.stdout).unwrap();
    assert!(!got.contains('\x1b'), "colour codes in a pipe");
    assert_eq!(got, want);
}

#[test]
fn map_refuses_an_event_past_the_end() {
    let dir = std::env::temp_dir().join(format!("gpumem-map-cli-end-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("small.jsonl");
    std::fs::write(&trace, TRACE).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["map", "--event", "11"])
        .arg(&trace)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("event 11 is past the end of the trace (11 events)"),
        "{err}"
    );
}

#[test]
fn watch_once_samples_or_says_why_not() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["watch", "--once", "--json"])
        .output()
        .unwrap();
    if out.status.success() {
        // A machine with the NVIDIA driver: one sample with at least one device.
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let devs = v["devices"].as_array().unwrap();
        assert!(!devs.is_empty());
        assert!(devs[0]["total_bytes"].as_u64().unwrap() > 0);
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("NVML") || err.contains("no GPU"), "{err}");
        assert!(out.stdout.is_empty());
    }
}

/// `map` takes one allocator, or `recorded` (the snapshot's segments at dump time, which has
/// no other event to show).
#[test]
fn map_names_what_it_takes() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(args)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let t = "traces/mixed_sizes.pickle.gz";
    for bad in ["foo", "all", "tlsf,paged"] {
        let (ok, err) = run(&["map", t, "--allocator", bad]);
        assert!(!ok);
        assert!(
            err.contains("expected one allocator") && err.contains("`recorded`"),
            "{err}"
        );
    }
    let (ok, err) = run(&["map", t, "--allocator", "recorded", "--event", "5"]);
    assert!(!ok);
    assert!(err.contains("dump time"), "{err}");
}

/// Under a `--capacity` too small for the trace, allocations fail and are dropped with their
/// frees: the map then shows less live memory (here none), and says why on stderr, with the
/// count and the first failed event (it said nothing).
#[test]
fn map_says_how_many_allocations_ran_out_of_memory() {
    let dir = std::env::temp_dir().join(format!("gpumem-map-cli-oom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("small.jsonl");
    std::fs::write(&trace, TRACE).unwrap();
    let run = |capacity: &str| {
        Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(["map", "--allocator", "torch", "--capacity", capacity])
            .arg(&trace)
            .output()
            .unwrap()
    };
    // 1 MiB: not even the 2 MiB segment of the small pool fits; all 7 allocations fail.
    let small = run("1MiB");
    let roomy = run("1GiB");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(small.status.success());
    let out = String::from_utf8_lossy(&small.stdout);
    assert!(out.contains("0 B live in 0 blocks"), "{out}");
    let err = String::from_utf8_lossy(&small.stderr);
    assert!(
        err.contains("note: torch: 7 allocations failed (out of memory on a device of 1.00 MiB; the first at event 0) and were dropped with their frees"),
        "{err}"
    );
    assert!(roomy.status.success());
    let err = String::from_utf8_lossy(&roomy.stderr);
    assert!(!err.contains("out of memory"), "{err}");
}

/// `map --allocator recorded` shows the snapshot's own segments: replay settings given with it
/// change nothing, and the map says so instead of ignoring them in silence.
#[test]
fn map_of_the_recorded_segments_names_the_flags_it_ignores() {
    let t = "traces/mixed_sizes.pickle.gz";
    let (ok, plain, err) = gpumem(&["map", t, "-a", "recorded", "--width", "60"]);
    assert!(ok && !err.contains("warning"), "{err}");
    let (ok, out, err) = gpumem(&[
        "map",
        t,
        "-a",
        "recorded",
        "--width",
        "60",
        "--capacity",
        "1MiB",
        "--lazy-conf",
        "grow_ahead=0.01",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: --capacity, --lazy-conf have no effect with --allocator recorded"),
        "{err}"
    );
    // Nothing about the capacity's failures or paged-lazy: the map is the same.
    assert!(
        !err.contains("out of memory") && !err.contains("configures paged-lazy"),
        "{err}"
    );
    assert_eq!(out, plain);
}
