//! What a fresh user's QA pass of the `gpumem` binary found: each test runs the binary and
//! checks the exit status and the message.
mod common;

use common::{gpumem, repo};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh folder of this test's own.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumem-fresh-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A copy of a trace of the repository in `dir`.
fn copy_trace(dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(Path::new(name).file_name().unwrap());
    std::fs::copy(repo().join(name), &to).unwrap();
    to
}

/// One line, no panic, no backtrace.
fn one_line_error(err: &str) {
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn report_refuses_to_write_onto_its_input() {
    let dir = scratch("report-self");
    let t = copy_trace(&dir, "traces/mixed_sizes.pickle.gz");
    let before = std::fs::read(&t).unwrap();
    let spelled = format!("{}/./mixed_sizes.pickle.gz", dir.display());
    let (ok, _, err) = gpumem(&["report", t.to_str().unwrap(), "-o", &spelled]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("-o ") && err.contains("that is the input file"),
        "{err}"
    );
    one_line_error(&err);
    // A hard link is the same file under another name.
    let link = dir.join("link.pickle.gz");
    std::fs::hard_link(&t, &link).unwrap();
    let (ok, _, err) = gpumem(&["report", t.to_str().unwrap(), "-o", link.to_str().unwrap()]);
    assert!(!ok && err.contains("that is the input file"), "{err}");
    assert_eq!(std::fs::read(&t).unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn timeline_never_touches_its_file_before_the_end() {
    let dir = scratch("timeline");
    let t = copy_trace(&dir, "traces/mixed_sizes.pickle.gz");
    let before = std::fs::read(&t).unwrap();
    let svg = dir.join("x.svg");
    std::fs::write(&svg, "<svg>old</svg>").unwrap();
    let old = || std::fs::read_to_string(&svg).unwrap();
    let tp = t.to_str().unwrap();
    let sp = svg.to_str().unwrap();

    // The trace itself as the output: refused, the trace unchanged.
    let (ok, _, err) = gpumem(&["replay", tp, "--timeline", tp, "-a", "torch"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("--timeline") && err.contains("input file"),
        "{err}"
    );
    assert_eq!(std::fs::read(&t).unwrap(), before);
    let renamed = dir.join("same.svg");
    std::fs::hard_link(&t, &renamed).unwrap();
    let (ok, _, err) = gpumem(&["replay", tp, "--timeline", renamed.to_str().unwrap()]);
    assert!(!ok && err.contains("input file"), "{err}");
    assert_eq!(std::fs::read(&t).unwrap(), before);

    // A missing trace, a malformed one, a bad option: the old picture stays.
    let missing = dir.join("missing.pickle.gz");
    let (ok, _, err) = gpumem(&["replay", missing.to_str().unwrap(), "--timeline", sp]);
    assert!(!ok, "{err}");
    assert_eq!(old(), "<svg>old</svg>");
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"action\":\"alloc\"\n").unwrap();
    let (ok, _, err) = gpumem(&["replay", bad.to_str().unwrap(), "--timeline", sp]);
    assert!(!ok, "{err}");
    assert_eq!(old(), "<svg>old</svg>");
    let (ok, _, err) = gpumem(&[
        "replay",
        tp,
        "-a",
        "paged-lazy",
        "--lazy-conf",
        "grow_ahead=5",
        "--timeline",
        sp,
    ]);
    assert!(!ok && err.contains("--lazy-conf"), "{err}");
    assert_eq!(old(), "<svg>old</svg>");

    // A good run replaces it, and leaves no temporary file behind.
    let (ok, _, err) = gpumem(&["replay", tp, "-a", "torch", "--timeline", sp]);
    assert!(ok, "{err}");
    assert!(old().starts_with("<svg") && old().contains("torch: peak reserved"));
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".gpumem-"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn report_and_convert_leave_an_old_output_alone_on_failure() {
    let dir = scratch("outputs");
    let out = dir.join("old.html");
    std::fs::write(&out, "old").unwrap();
    let missing = dir.join("missing.jsonl");
    for cmd in ["report", "convert"] {
        let (ok, _, err) = gpumem(&[cmd, missing.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert!(!ok, "{cmd}: {err}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "old", "{cmd}");
    }
    // An output in a folder that does not exist is refused before the trace is read.
    let nowhere = dir.join("no/such/folder/r.html");
    let (ok, _, err) = gpumem(&[
        "report",
        "traces/mixed_sizes.pickle.gz",
        "-o",
        nowhere.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("does not exist"), "{err}");
    one_line_error(&err);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tune_says_why_no_gpumem_setting_is_picked() {
    // The default row stays near native's driver time, but every fast setting has an OOM at
    // 24 GiB: that, not the time bound, is the reason.
    let (ok, out, err) = gpumem(&["tune", "traces/gpt2_train.pickle.gz", "--capacity", "24GiB"]);
    assert!(ok, "{err}");
    assert!(
        !out.contains("none of gpumem's settings stays within 2 × native's driver time"),
        "{out}"
    );
    let line = out
        .lines()
        .find(|l| {
            l.starts_with(
                "every gpumem setting within 2 × native's driver time has an OOM at 24.00 GiB",
            )
        })
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("needs "), "{line}");
}

#[test]
fn tune_names_the_device_and_refuses_one_without_allocations() {
    let (ok, out, err) = gpumem(&["tune", "traces/mixed_sizes.pickle.gz", "--device", "3"]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("--device 3: the trace has no allocation on device 3 (it has device 0)"),
        "{err}"
    );
    one_line_error(&err);
    let (ok, _, err) = gpumem(&[
        "report",
        "traces/mixed_sizes.pickle.gz",
        "--trace-device",
        "5",
        "-o",
        std::env::temp_dir()
            .join("gpumem-fresh-never.html")
            .to_str()
            .unwrap(),
    ]);
    assert!(
        !ok && err.contains("no allocation on device 5 (it has device 0)"),
        "{err}"
    );

    // Several devices: the header says which one is tuned and how to pick another.
    let (ok, out, err) = gpumem(&["tune", "traces/multigpu/two_devices.jsonl"]);
    assert!(ok, "{err}");
    let header = out.lines().next().unwrap();
    assert!(
        header.contains("device 0 of 2 (devices 0, 1; --device N tunes another)"),
        "{header}"
    );
    let (ok, out, err) = gpumem(&[
        "tune",
        "traces/multigpu/two_devices.jsonl",
        "--device",
        "1",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["device"], 1);
    assert_eq!(v["trace_devices"], serde_json::json!([0, 1]));
}

#[test]
fn a_misspelt_required_key_gets_its_hint() {
    let dir = scratch("typo");
    let t = dir.join("t.jsonl");
    std::fs::write(&t, "{\"action\":\"alloc\",\"addr\":1,\"sise\":100}\n").unwrap();
    let (ok, _, err) = gpumem(&["replay", t.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("line 1: \"alloc\" needs \"size\" (bytes); unknown key \"sise\": did you mean \"size\"?"),
        "{err}"
    );
    one_line_error(&err);
    std::fs::remove_dir_all(&dir).unwrap();
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

    let (ok, _, err) = gpumem(&["bench", "pinned", "--device", "sim"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("expected a CUDA device ordinal (0, 1, ...) or cuda:N")
            && !err.contains("invalid digit"),
        "{err}"
    );
}

/// The lines of the map itself: between the header and the `one cell = ` legend.
fn map_lines(out: &str) -> Vec<&str> {
    out.lines()
        .skip(1)
        .take_while(|l| !l.starts_with("one cell = "))
        .collect()
}

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
    let (ok, out, err) = gpumem(&["map", t, "--width", "100", "--lines", "3"]);
    assert!(ok, "{err}");
    let lines = map_lines(&out);
    assert!(!lines.is_empty() && lines.len() <= 3, "{out}");
    assert!(lines.iter().all(|l| l.chars().count() <= 100), "{out}");
    assert!(!err.contains("note: --lines"), "{err}");
    // Too many segments for 2 lines of 8: the map says so, and the lines it shows are the
    // fewest possible (each segment one cell), not cells of 1024 TiB.
    let (ok, out, err) = gpumem(&["map", t, "--width", "8", "--lines", "2"]);
    assert!(ok, "{err}");
    let lines = map_lines(&out);
    let note = err
        .lines()
        .find(|l| l.starts_with("note: --lines 2: the map's "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        note.contains(&format!("need at least {} lines of 8 cells", lines.len())),
        "{note}\n{out}"
    );
    let segments: usize = out.split(' ').nth(4).unwrap().parse().unwrap();
    assert_eq!(lines.len(), (2 * segments - 1).div_ceil(8), "{out}");
    assert!(!out.contains("TiB"), "{out}");
}

#[test]
fn an_impossible_request_is_dropped_counted_and_said_by_every_command() {
    let dir = scratch("overflow");
    let t = dir.join("t.jsonl");
    std::fs::write(
        &t,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":18446744073709551615}\n\
         {\"action\":\"alloc\",\"addr\":2,\"size\":1000}\n\
         {\"action\":\"free\",\"addr\":2}\n",
    )
    .unwrap();
    let tp = t.to_str().unwrap();
    let (ok, out, err) = gpumem(&["replay", tp, "-a", "torch"]);
    assert!(ok, "{err}");
    assert!(out.contains("torch refused event index 0"), "{out}");

    let (ok, out, err) = gpumem(&["map", tp, "-a", "torch"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("torch after event"), "{out}");
    assert!(
        err.contains("note: torch refused 1 allocation as impossible and dropped it with its free (first: event index 0:"),
        "{err}"
    );
    let html = dir.join("r.html");
    let (ok, _, err) = gpumem(&[
        "report",
        tp,
        "-a",
        "torch,tlsf",
        "-o",
        html.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("note: tlsf refused 1 allocation as impossible"),
        "{err}"
    );
    assert!(std::fs::read_to_string(&html).unwrap().contains("<html"));

    let (ok, out, err) = gpumem(&["tune", tp]);
    assert!(ok, "{err}");
    assert!(
        out.contains("†: 1 allocation refused as impossible and dropped with its free (native, first: event index 0:"),
        "{out}"
    );
    let (ok, out, err) = gpumem(&["tune", tp, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rows"][0]["refused_count"], 1, "{out}");
    assert_eq!(v["plugin_rows"][0]["refused_count"], 1, "{out}");
    // The smallest device still exists: the impossible request fails on every one.
    assert_eq!(v["rows"][0]["min_capacity_bytes"], 2 << 20, "{out}");
    let (ok, out, err) = gpumem(&["replay", tp, "-a", "torch", "--min-capacity", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["allocators"][0]["min_capacity"][0]["found"]["smallest_bytes"],
        2 << 20,
        "{out}"
    );
    // Left out of the trace's own figures too (and of the planned layout).
    assert_eq!(v["trace"]["peak_requested_bytes"], 1000, "{out}");
    assert_eq!(
        v["trace"]["planned_layout"][0]["peak_live_bytes"], 1024,
        "{out}"
    );

    // `map` names itself, not the report, when it fails.
    let seg = dir.join("segments.jsonl");
    std::fs::write(
        &seg,
        "{\"action\":\"segment_alloc\",\"addr\":1,\"size\":100}\n",
    )
    .unwrap();
    let (ok, _, err) = gpumem(&["map", seg.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(err.starts_with("error: building the map of "), "{err}");
    assert!(!err.contains("report"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn small_things_of_the_qa_pass() {
    let t = "traces/mixed_sizes.pickle.gz";
    // Every unit parse_size takes is in the list the error gives.
    let (ok, _, err) = gpumem(&["replay", t, "--capacity", "12XB"]);
    assert!(!ok);
    assert!(
        err.contains("unknown unit `xb` (expected B, K or KiB, M or MiB, G or GiB, T or TiB, KB, MB, GB or TB)"),
        "{err}"
    );
    // A capacity must be above zero: a negative one is told so, not "≥ 0".
    for c in ["-1GiB", "-1"] {
        let (ok, _, err) = gpumem(&["tune", t, "--capacity", c]);
        assert!(!ok && err.contains("expected a size > 0"), "{err}");
        assert!(!err.contains("≥ 0"), "{err}");
    }
    let (ok, _, err) = gpumem(&["replay", t, "--capacity", "0"]);
    assert!(!ok && err.contains("above zero"), "{err}");
    // `info` works without a driver: the help does not say it needs one.
    let (ok, out, _) = gpumem(&["--help"]);
    assert!(ok);
    let info = out
        .lines()
        .find(|l| l.trim_start().starts_with("info "))
        .unwrap();
    assert!(!info.contains("needs a CUDA driver"), "{info}");
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["info"])
        .env("GPUMEM_NO_CUDA", "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    // A snapshot that recorded nothing: explained, and not a success.
    let (ok, _, err) = gpumem(&["replay", "crates/gpumem/tests/fixtures/no_recording.pickle"]);
    assert!(!ok);
    assert!(err.contains("_record_memory_history"), "{err}");
    one_line_error(&err);
    // --timeline draws SVG: another extension is refused before any work.
    let dir = scratch("png");
    let png = dir.join("x.png");
    let (ok, _, err) = gpumem(&["replay", t, "--timeline", png.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("drawn as SVG, not .png"), "{err}");
    one_line_error(&err);
    assert!(!png.exists());
    let (ok, _, err) = gpumem(&["bench", "transfer", "--plot", png.to_str().unwrap()]);
    assert!(
        !ok && err.contains("--plot") && err.contains("not .png"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The README: a zero peak requested shows as `-` in every table, `tune`'s included.
#[test]
fn tune_shows_a_dash_where_nothing_was_requested() {
    let (ok, out, err) = gpumem(&["tune", "traces/mixed_sizes.pickle.gz", "--capacity", "1MiB"]);
    assert!(ok, "{err}");
    assert!(!out.contains("0.000"), "{out}");
    let native = out
        .lines()
        .find(|l| l.starts_with("native "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(native.contains(" -† "), "{native}");
    let plugin = out
        .lines()
        .find(|l| l.starts_with("(defaults: paged-lazy)"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(plugin.contains(" -† "), "{plugin}");
    // --json keeps a number.
    let (ok, out, err) = gpumem(&[
        "tune",
        "traces/mixed_sizes.pickle.gz",
        "--capacity",
        "1MiB",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rows"][0]["reserved_over_requested"].as_f64(), Some(0.0));
}
