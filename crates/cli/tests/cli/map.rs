//! `gpumem map`: the memory map at an event, its size options and the flags it takes.
use crate::common::{args, gpumem, gpumem_ok, one_line_error, repo, scratch, write_file};
use std::path::Path;
use std::process::Command;

/// The lines of the map itself: between the header and the `one cell = ` legend.
fn map_lines(out: &str) -> Vec<&str> {
    out.lines()
        .skip(1)
        .take_while(|l| !l.starts_with("one cell = "))
        .collect()
}

/// The number of segments in the first line of `gpumem map` ("torch after event 5: 17
/// segments, ...").
fn map_segments(out: &str) -> usize {
    let head = out.lines().next().unwrap_or_default();
    let before = head
        .split(" segment")
        .next()
        .unwrap_or_else(|| panic!("{out}"));
    before
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{head}"))
}

/// A small trace of seven blocks (shared with the map golden test of crate gpumem).
const TRACE: &str = include_str!("../../../gpumem/tests/fixtures/map_small.jsonl");

#[test]
fn map_honours_its_size_options_or_says_why_not() {
    let t = "traces/mixed_sizes.pickle.gz";
    for w in ["0", "5"] {
        let (ok, _, err) = gpumem(&["map", t, "--width", w]);
        assert!(!ok, "--width {w}: {err}");
        assert!(
            err.contains(&format!("--width {w}: expected at least 8 cells a line")),
            "{err}"
        );
        one_line_error(&err);
    }
    // Room enough: at most --lines lines of --width cells.
    let (out, err) = gpumem_ok(&["map", t, "--width", "100", "--lines", "3"]);
    let lines = map_lines(&out);
    assert!(!lines.is_empty() && lines.len() <= 3, "{out}");
    assert!(lines.iter().all(|l| l.chars().count() <= 100), "{out}");
    assert!(!err.contains("note: --lines"), "{err}");
    // Too many segments for 2 lines of 8: the map says so, and the lines it shows are the
    // fewest possible (each segment one cell), not cells of 1024 TiB.
    let (out, err) = gpumem_ok(&["map", t, "--width", "8", "--lines", "2"]);
    let lines = map_lines(&out);
    let note = err
        .lines()
        .find(|l| l.starts_with("note: --lines 2: the map's "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        note.contains(&format!("need at least {} lines of 8 cells", lines.len())),
        "{note}\n{out}"
    );
    let segments = map_segments(&out);
    assert_eq!(lines.len(), (2 * segments - 1).div_ceil(8), "{out}");
    assert!(!out.contains("TiB"), "{out}");
}

/// `map` and the report's maps replay the torch emulation as `replay` does: from the segments
/// a warm process held before recording began, and emptying the cache where the trace
/// recorded `empty_cache()`. At the last event the emulation then holds the segments the
/// snapshot's dump shows (it matches the recorded cudaMalloc calls on both traces).
#[test]
fn map_starts_from_the_recorded_state_and_empties_the_cache_as_replay_does() {
    for t in [
        "traces/warm_process/seg_train.pickle.gz",
        "traces/validation/resnet_infer.pickle.gz",
    ] {
        let (out, _) = gpumem_ok(&["replay", t, "-a", "torch", "--no-plan", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let last = v["trace"]["events"].as_u64().unwrap() - 1;
        let (recorded, _) = gpumem_ok(&["map", t, "-a", "recorded"]);
        let (emulated, _) = gpumem_ok(&["map", t, "-a", "torch", "--event", &last.to_string()]);
        assert_eq!(
            map_segments(&emulated),
            map_segments(&recorded),
            "{t}:\n{emulated}\n{recorded}"
        );
    }
}

/// `map` and `report` of a trace of several GPUs say which device they show and that its
/// event indices are its own (`map` said "torch after event 60" of a 5002-event trace, with
/// no word of the other device).
#[test]
fn map_and_report_say_which_device_of_several() {
    let t = "traces/multigpu/two_devices.jsonl";
    let note = "note: device 1 of 2 (devices 0, 1; --trace-device N shows another): event indices count its events only";
    let (ok, _, err) = gpumem(&["map", t, "--trace-device", "1", "--width", "40"]);
    assert!(ok && err.contains(note), "{err}");
    let (ok, _, err) = gpumem(&["map", t, "--width", "40"]);
    assert!(
        ok && err.contains("note: device 0 of 2 (devices 0, 1;"),
        "{err}"
    );
    let dir = scratch("two-devices");
    let html = dir.join("r.html");
    let (ok, _, err) = gpumem(&[
        "report",
        t,
        "--trace-device",
        "1",
        "-a",
        "torch",
        "-o",
        html.to_str().unwrap(),
    ]);
    assert!(ok && err.contains(note), "{err}");
    // One device: no note.
    let (ok, _, err) = gpumem(&["map", "traces/mixed_sizes.pickle.gz", "--width", "40"]);
    assert!(ok && !err.contains("note: device"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `map`'s first line says when its event is the allocator's peak of reserved bytes (the
/// default, or `--peak`), as the report's map does, and not for an `--event` asked for.
#[test]
fn map_says_its_default_event_is_the_peak() {
    let t = repo().join("traces/mixed_sizes.pickle.gz");
    let t = t.to_str().unwrap();
    for extra in [&[][..], &["--peak"][..]] {
        let mut args = vec!["map", t];
        args.extend_from_slice(extra);
        let (ok, out, err) = gpumem(&args);
        assert!(ok, "{err}");
        let head = out.lines().next().unwrap();
        assert!(head.starts_with("torch after event "), "{head}");
        assert!(head.contains(" (peak reserved): "), "{head}");
    }
    let (out, _) = gpumem_ok(&["map", t, "--event", "100"]);
    assert!(
        out.starts_with("torch after event 100: "),
        "{}",
        out.lines().next().unwrap_or_default()
    );
}

#[test]
fn map_prints_the_golden_map_in_a_pipe() {
    let dir = std::env::temp_dir().join(format!("gpumem-map-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("small.jsonl");
    write_file(&trace, TRACE);
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
    write_file(&trace, TRACE);
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
    write_file(&trace, TRACE);
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
    let (out, err) = gpumem_ok(&args("map traces/mixed_sizes.pickle.gz -a recorded --width 60 --capacity 1MiB --lazy-conf grow_ahead=0.01"));
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
