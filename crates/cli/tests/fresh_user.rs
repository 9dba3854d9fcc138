//! What a fresh user's QA pass of the `gpumem` binary found: each test runs the binary and
//! checks the exit status and the message.
mod common;

use common::{gpumem, one_line_error, repo, scratch};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A copy of a trace of the repository in `dir`.
fn copy_trace(dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(Path::new(name).file_name().unwrap());
    std::fs::copy(repo().join(name), &to).unwrap();
    to
}

/// The line of `gpumem CMD --help` that describes `flag` (empty when there is none).
fn help_line(cmd: &str, flag: &str) -> String {
    let (ok, out, err) = gpumem(&[cmd, "--help"]);
    assert!(ok, "{err}");
    out.lines()
        .find(|l| l.trim_start().starts_with(flag))
        .unwrap_or_default()
        .to_string()
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

/// `tune --capacity 24GiB` on gpt2_train: native's replay fails at 24 GiB, and so do those of
/// every gpumem setting but `strategy=paged`. A failed run's driver time is no reference and
/// not comparable: the rows that fail show `OOM` in the driver-time column (they showed
/// `0.94 × nat.`, ÷ native's failed run), `strategy=paged` its time in ms, and the reason
/// says native's OOM leaves no bound (it said "every gpumem setting within 2 × native's
/// driver time has an OOM", judging them by those failed runs).
#[test]
fn tune_says_why_no_gpumem_setting_is_picked() {
    let (ok, out, err) = gpumem(&["tune", "traces/gpt2_train.pickle.gz", "--capacity", "24GiB"]);
    assert!(ok, "{err}");
    assert!(
        !out.contains("within 2 × native's driver time has an OOM"),
        "{out}"
    );
    assert!(!out.contains("× nat."), "{out}");
    assert!(!out.contains("export GPUMEM_CONF"), "{out}");
    for setting in [
        "(defaults: paged-lazy)",
        "grow_ahead=0.0156",
        "placement=pages",
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(setting))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(line.ends_with(" OOM"), "{line}");
    }
    let paged = out
        .lines()
        .find(|l| l.starts_with("strategy=paged "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(paged.ends_with(" ms"), "{paged}");
    assert!(
        out.contains("\nnative has an OOM at 24.00 GiB, so it has no driver time there to bound gpumem's settings by: none is recommended, though strategy=paged runs at 24.00 GiB (a larger --capacity, or none, to compare them)\n"),
        "{out}"
    );
}

#[test]
fn tune_names_the_device_and_refuses_one_without_allocations() {
    let (ok, out, err) = gpumem(&[
        "tune",
        "traces/mixed_sizes.pickle.gz",
        "--trace-device",
        "3",
    ]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("--trace-device 3: the trace has no allocation on device 3 (it has device 0)"),
        "{err}"
    );
    one_line_error(&err);
    // `--device` is replay's backend: tune refuses it and names the flag it means.
    let (ok, _, err) = gpumem(&["tune", "traces/mixed_sizes.pickle.gz", "--device", "0"]);
    assert!(
        !ok && err.contains("--device 0: tune names the trace's device with --trace-device 0"),
        "{err}"
    );
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
        header.contains("device 0 of 2 (devices 0, 1; --trace-device N tunes another)"),
        "{header}"
    );
    let (ok, out, err) = gpumem(&[
        "tune",
        "traces/multigpu/two_devices.jsonl",
        "--trace-device",
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
    let segments = map_segments(&out);
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
    // The trace's line says its largest request leaves the impossible one out (it said
    // "largest request 1000 B" of a trace that asked for 16 EiB).
    assert!(
        out.contains("largest request 1000 B (not counting 1 request too large for any allocator)"),
        "{out}"
    );

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
    // Left out of the trace's own figures too (and of the planned layout), and counted.
    assert_eq!(v["trace"]["peak_requested_bytes"], 1000, "{out}");
    assert_eq!(v["trace"]["impossible_requests"], 1, "{out}");
    assert_eq!(
        v["trace"]["planned_layout"][0]["peak_live_bytes"], 1024,
        "{out}"
    );

    // `map` does not name the report when it fails (a trace with nothing to show is said as
    // `replay` says it).
    let seg = dir.join("segments.jsonl");
    std::fs::write(
        &seg,
        "{\"action\":\"segment_alloc\",\"addr\":1,\"size\":100}\n",
    )
    .unwrap();
    let (ok, _, err) = gpumem(&["map", seg.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("segments.jsonl: nothing to show: the file is a valid trace but holds no alloc/free events"),
        "{err}"
    );
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
        let (ok, out, err) = gpumem(&["replay", t, "-a", "torch", "--no-plan", "--json"]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let last = v["trace"]["events"].as_u64().unwrap() - 1;
        let (ok, recorded, err) = gpumem(&["map", t, "-a", "recorded"]);
        assert!(ok, "{err}");
        let (ok, emulated, err) = gpumem(&["map", t, "-a", "torch", "--event", &last.to_string()]);
        assert!(ok, "{err}");
        assert_eq!(
            map_segments(&emulated),
            map_segments(&recorded),
            "{t}:\n{emulated}\n{recorded}"
        );
    }
}

/// A truncated warm-process snapshot salvaged with --lenient: the dump's segments and live
/// blocks describe the run after the cut, so they are not all taken for what existed before
/// recording began.
#[test]
fn a_salvaged_snapshot_does_not_take_the_state_after_the_cut_for_its_start() {
    let dir = scratch("cut-warm");
    let whole = std::fs::read(repo().join("traces/warm_process/seg_train.pickle.gz")).unwrap();
    let cut = dir.join("seg_train_cut.pickle.gz");
    std::fs::write(&cut, &whole[..whole.len() * 6 / 10]).unwrap();
    let (ok, _, err) = gpumem(&[
        "replay",
        cut.to_str().unwrap(),
        "--lenient",
        "-a",
        "torch",
        "--no-plan",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("  truncated: "), "{err}");
    assert!(
        err.contains("not taken for the state before recording began"),
        "{err}"
    );
    // The whole trace starts from 2 segments; only those the events read show are taken.
    let segments = err
        .lines()
        .find(|l| l.contains("made before recording started"))
        .unwrap_or_else(|| panic!("{err}"));
    let n: usize = segments.split_whitespace().next().unwrap().parse().unwrap();
    assert!((1..=2).contains(&n), "{segments}");
    assert!(
        !err.contains("already live when recording started"),
        "{err}"
    );
    // A snapshot cut before its allocator_settings (written after the trace) replays native:
    // said so, with the way out.
    let whole =
        std::fs::read(repo().join("traces/warm_process/gan_train_expandable.pickle.gz")).unwrap();
    let cut = dir.join("gan_cut.pickle.gz");
    std::fs::write(&cut, &whole[..whole.len() * 6 / 10]).unwrap();
    let (ok, _, err) = gpumem(&[
        "replay",
        cut.to_str().unwrap(),
        "--lenient",
        "-a",
        "torch",
        "--no-plan",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains(
            "native (native: the snapshot is cut before its allocator_settings; give --torch-conf"
        ),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// --lenient "skips and counts" in every command that reads a trace, and a file whose every
/// event was skipped is told so (not that nothing was recorded); `tune` refuses a trace
/// without allocations instead of ranking settings by zeros.
#[test]
fn lenient_commands_say_what_they_skipped() {
    let dir = scratch("lenient");
    let dup = dir.join("dup.jsonl");
    std::fs::write(
        &dup,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":4096}\n{\"action\":\"free\",\"addr\":1}\n{\"action\":\"free\",\"addr\":1}\n",
    )
    .unwrap();
    let dup = dup.to_str().unwrap();
    let html = dir.join("r.html");
    for args in [
        vec!["tune", dup, "--lenient"],
        vec!["map", dup, "--lenient"],
        vec!["report", dup, "--lenient", "-o", html.to_str().unwrap()],
    ] {
        let (ok, _, err) = gpumem(&args);
        assert!(ok, "{args:?}: {err}");
        assert!(
            err.contains("  skipped: line 3: free of address 1"),
            "{args:?}: {err}"
        );
    }
    let (ok, out, err) = gpumem(&["tune", dup, "--lenient", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["skipped_events"], 1);
    // `replay --json` prints no read notes: the reasons are in the JSON (it had the count
    // only, and said nowhere why).
    let (ok, out, err) = gpumem(&["replay", dup, "--lenient", "--json", "-a", "torch"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trace"]["skipped_events"], 1);
    let why = v["trace"]["skipped"][0].as_str().unwrap_or_default();
    assert!(why.starts_with("line 3: free of address 1"), "{out}");

    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"action\":\"alloc\",\"addr\":1,\"size\":-10}\n").unwrap();
    let bad = bad.to_str().unwrap();
    for cmd in ["replay", "tune", "convert"] {
        let (ok, out, err) = gpumem(&[cmd, bad, "--lenient"]);
        assert!(!ok, "{cmd}: {out}");
        assert!(err.contains("  skipped: line 1: "), "{cmd}: {err}");
        assert!(
            err.contains("no alloc/free event is left after --lenient skipped 1 malformed event"),
            "{cmd}: {err}"
        );
        assert!(!err.contains("holds no alloc/free events"), "{cmd}: {err}");
    }
    // A snapshot that recorded nothing, and one of segments only: nothing to tune.
    let (ok, out, err) = gpumem(&["tune", "crates/gpumem/tests/fixtures/no_recording.pickle"]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("nothing to tune") && err.contains("_record_memory_history"),
        "{err}"
    );
    one_line_error(&err);
    let (ok, out, err) = gpumem(&["tune", "crates/gpumem/tests/fixtures/segments_only.pickle"]);
    assert!(!ok, "{out}");
    assert!(err.contains("segments but no trace entries"), "{err}");
    // Counted nouns in the state analysis.
    let (ok, out, err) = gpumem(&[
        "replay",
        "crates/gpumem/tests/fixtures/segments_only.pickle",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("state of the 1 segment the snapshot"), "{out}");
    assert!(out.contains(", 1 inactive split block holding"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `inspect`'s table keeps its columns under `paged-lazy` (one letter wider than the column
/// was) and ends no line with spaces; its offsets are in binary units as the sizes beside
/// them (they were raw bytes, `300152782848`), exact in --json.
#[test]
fn inspect_keeps_its_columns() {
    let (ok, out, err) = gpumem(&["inspect", "--device", "sim"]);
    assert!(ok, "{err}");
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
    let (ok, json, err) = gpumem(&["inspect", "--device", "sim", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let exact: Vec<u64> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pool"]["block_offset"].as_u64().unwrap())
        .collect();
    assert_eq!(exact[..6], [0, 65536, 4194304, 67108864, 0, 256]);
}

/// `watch` without the NVIDIA driver: one clear line, not the loader's wording.
#[test]
fn watch_without_a_driver_says_so_in_one_line() {
    let (ok, out, err) = gpumem(&["watch", "--once"]);
    if ok {
        return; // a machine with the driver
    }
    assert!(out.is_empty(), "{out}");
    one_line_error(&err);
    if err.contains("no NVIDIA driver") {
        assert_eq!(
            err.trim_end(),
            "error: no NVIDIA driver (libnvidia-ml.so.1, NVML) found: there is no GPU to watch"
        );
    }
    assert!(!err.contains("libloading"), "{err}");
}

/// Errors say what the line wrote: an integer beyond 64 bits is not called "floating point",
/// and an RMM row with a field missing is not csv's "CSV error: record 1 (line: 2, ...)".
#[test]
fn errors_name_what_the_line_wrote() {
    let dir = scratch("what-the-line-wrote");
    let big = dir.join("big.jsonl");
    std::fs::write(
        &big,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":18446744073709551616}\n",
    )
    .unwrap();
    let (ok, _, err) = gpumem(&["replay", big.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("line 1: invalid value: integer 18446744073709551616 does not fit in 64 bits, expected a whole number ≥ 0 (column 54, key \"size\")"),
        "{err}"
    );
    one_line_error(&err);
    // A device ordinal beyond 32 bits is a whole number ≥ 0: the error says the range.
    let dev = dir.join("dev.jsonl");
    std::fs::write(
        &dev,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":1,\"device\":4294967296}\n",
    )
    .unwrap();
    let (ok, _, err) = gpumem(&["replay", dev.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("integer `4294967296`, expected a whole number from 0 to 4294967295"),
        "{err}"
    );
    // An oom line without the request it failed on was judged as a 0-byte request.
    let oom = dir.join("oom.jsonl");
    std::fs::write(
        &oom,
        "{\"action\":\"oom\"}\n{\"action\":\"alloc\",\"addr\":1,\"size\":10}\n",
    )
    .unwrap();
    let (ok, out, err) = gpumem(&["replay", oom.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("oom.jsonl: line 1: \"oom\" needs \"size\""),
        "{err}"
    );
    // The same in a snapshot (PyTorch writes the size of every oom entry).
    let poom = dir.join("oom.pickle");
    std::fs::write(
        &poom,
        b"\x80\x02}(X\x08\x00\x00\x00segments]X\r\x00\x00\x00device_traces]](}(X\x06\x00\x00\x00actionq\x00X\x03\x00\x00\x00oomX\x06\x00\x00\x00streamq\x01K\x00u}(h\x00X\x05\x00\x00\x00allocX\x04\x00\x00\x00addrK\x01X\x04\x00\x00\x00sizeK\nh\x01K\x00ueau.",
    )
    .unwrap();
    let (ok, out, err) = gpumem(&["replay", poom.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("oom.pickle: event 0 (device 0 trace entry 0): no 'size'"),
        "{err}"
    );
    let csv = dir.join("short.csv");
    std::fs::write(
        &csv,
        "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x100,256\n",
    )
    .unwrap();
    let (ok, _, err) = gpumem(&["replay", csv.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.trim_end()
            .ends_with("short.csv: line 2: CSV: 5 fields, expected 6 as in the header"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `convert` says what JSON lines cannot keep and a replay of the snapshot uses: its
/// allocator setting and the segments made before recording began (a converted
/// warm-process trace replayed silently under native, or without those segments).
#[test]
fn convert_says_what_json_lines_do_not_keep() {
    let dir = scratch("convert-lost");
    let out = dir.join("x.jsonl");
    let out = out.to_str().unwrap();
    let (ok, _, err) = gpumem(&[
        "convert",
        "traces/warm_process/gpt2_preloaded_expandable.pickle.gz",
        "-o",
        out,
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("--torch-conf 'expandable_segments:True'"),
        "{err}"
    );
    let (ok, _, err) = gpumem(&[
        "convert",
        "traces/warm_process/seg_train.pickle.gz",
        "-o",
        out,
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("do not keep the 2 segments made before recording began"),
        "{err}"
    );
    assert!(!err.contains("allocator setting"), "{err}");
    // Nothing lost, nothing said.
    let (ok, _, err) = gpumem(&["convert", "traces/mixed_sizes.pickle.gz", "-o", out]);
    assert!(ok, "{err}");
    assert!(!err.contains("note:"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `report -o -` writes the page to standard output, as `convert -o -` writes its lines (it
/// wrote a file named `-`).
#[test]
fn report_to_standard_output() {
    let dir = scratch("report-stdout");
    let t = copy_trace(&dir, "crates/gpumem/tests/fixtures/sample.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["report", t.to_str().unwrap(), "-o", "-", "-a", "torch"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        page.trim_start()
            .to_ascii_lowercase()
            .starts_with("<!doctype html"),
        "{}",
        &page[..page.len().min(200)]
    );
    assert!(page.trim_end().ends_with("</html>"));
    assert!(err.contains("wrote the page to standard output"), "{err}");
    assert!(!dir.join("-").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Tables keep their columns for any figure: `tune`'s res/req of a trace of 1-byte requests
/// (2097152.000) pushed its row out of line; `--min-capacity` ended rows with spaces.
#[test]
fn tables_keep_their_columns_for_any_figure() {
    let dir = scratch("tables");
    let t = dir.join("one.jsonl");
    std::fs::write(&t, "{\"action\":\"alloc\",\"addr\":1,\"size\":1}\n").unwrap();
    let t = t.to_str().unwrap();
    let (ok, out, err) = gpumem(&["tune", t]);
    assert!(ok, "{err}");
    for header in ["setting ", "gpumem plug-in, GPUMEM_CONF "] {
        let lines: Vec<&str> = out.lines().collect();
        let at = lines.iter().position(|l| l.starts_with(header)).unwrap();
        let end = lines[at].find("res/req").unwrap() + "res/req".len();
        let row = lines[at + 1];
        assert!(
            row[..end].ends_with(|c: char| c.is_ascii_digit()) && row.as_bytes()[end] == b' ',
            "{}\n{row}",
            lines[at]
        );
    }
    let (ok, out, err) = gpumem(&["replay", t, "--min-capacity", "--no-plan"]);
    assert!(ok, "{err}");
    assert!(out.lines().all(|l| l.trim_end() == l), "{out:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A folder given as the trace: said so, with what was expected (it was the OS's "Is a
/// directory (os error 21)").
#[test]
fn a_folder_is_not_a_trace() {
    for cmd in ["replay", "tune", "report", "map", "convert"] {
        let (ok, _, err) = gpumem(&[cmd, "traces/warm_process"]);
        assert!(!ok, "{cmd}");
        assert!(
            err.contains(
                "traces/warm_process: not an allocation trace: a folder; expected a trace file"
            ),
            "{cmd}: {err}"
        );
        one_line_error(&err);
    }
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

/// `tune --threads N` reports the threads it ran, at most one per setting (it said "on 1000
/// threads" for 21 replays).
#[test]
fn tune_reports_the_threads_it_ran() {
    let (ok, out, err) = gpumem(&[
        "tune",
        "crates/gpumem/tests/fixtures/sample.jsonl",
        "--threads",
        "1000",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let settings = v["rows"].as_array().unwrap().len() + v["plugin_rows"].as_array().unwrap().len();
    assert_eq!(v["threads"].as_u64(), Some(settings as u64), "{out}");
    let (ok, _, err) = gpumem(&[
        "tune",
        "crates/gpumem/tests/fixtures/sample.jsonl",
        "--threads",
        "1000",
    ]);
    assert!(ok, "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.ends_with(&format!("on {settings} threads"))
            && last.contains(" GPUMEM_CONF settings in "),
        "{err}"
    );
}

/// A `NAME-CONF.stats.json` beside the trace that cannot be used is warned about, naming the
/// file and what was expected (it was skipped without a word, and PyTorch's figures were
/// just missing).
#[test]
fn a_broken_stats_file_beside_the_trace_is_warned_about() {
    let dir = scratch("stats");
    let t = copy_trace(&dir, "crates/gpumem/tests/fixtures/sample.jsonl");
    std::fs::write(
        dir.join("sample-native.stats.json"),
        "{\"reserved_bytes.all.peak\": 1.5e9",
    )
    .unwrap();
    std::fs::write(
        dir.join("sample-expandable_segments_True.stats.json"),
        "{\"reserved\": 5}",
    )
    .unwrap();
    let (ok, _, err) = gpumem(&["replay", t.to_str().unwrap(), "-a", "torch", "--no-plan"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("sample-native.stats.json: not JSON (")
            && err.contains("expected torch.cuda.memory_stats() as a JSON object"),
        "{err}"
    );
    assert!(
        err.contains("sample-expandable_segments_True.stats.json: no whole number under \"reserved_bytes.all.peak\""),
        "{err}"
    );
    let html = dir.join("r.html");
    let (ok, _, err) = gpumem(&[
        "report",
        t.to_str().unwrap(),
        "-a",
        "torch",
        "-o",
        html.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("sample-native.stats.json: not JSON ("),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A gzip file whose checksum is wrong but whose data is whole: the lenient read keeps every
/// event and the note ends in a sentence ("kept the N events inflated before" stopped there).
#[test]
fn a_bad_gzip_checksum_note_is_a_whole_sentence() {
    let dir = scratch("crc");
    let mut gz = std::fs::read(repo().join("traces/mixed_sizes.pickle.gz")).unwrap();
    let n = gz.len();
    gz[n - 6] ^= 0xff; // inside the CRC-32 of the trailer
    let t = dir.join("crc.pickle.gz");
    std::fs::write(&t, &gz).unwrap();
    let (ok, _, err) = gpumem(&["replay", t.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("does not have a matching checksum"), "{err}");
    let (ok, out, err) = gpumem(&[
        "replay",
        t.to_str().unwrap(),
        "-a",
        "torch",
        "--lenient",
        "--json",
        "--no-plan",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let events = v["trace"]["events"].as_u64().unwrap();
    let note = v["trace"]["truncated"]
        .as_str()
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        note.ends_with(&format!("kept the {events} events inflated before it")),
        "{note}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `inspect` when no strategy can allocate: each error once, no empty table, "1 error" (the
/// pool's out-of-memory cause was printed three times behind "torch: torch:"), and a size
/// larger than the device says so (only the pool's "0 B free" was given).
#[test]
fn inspect_errors_say_each_cause_once() {
    let (ok, out, err) = gpumem(&[
        "inspect",
        "--device",
        "sim",
        "--sizes",
        "1TiB",
        "--strategies",
        "torch",
    ]);
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

/// `bench alloc` shows pairs/s with a decimal prefix as `replay` shows events/s (it printed
/// 30891552), and its title has one pair of brackets.
#[test]
fn bench_alloc_rates_read_like_the_replay() {
    let (ok, out, err) = gpumem(&[
        "bench",
        "alloc",
        "--device",
        "sim",
        "--strategies",
        "tlsf",
        "--sizes",
        "4KiB",
        "--threads",
        "1",
        "--time-ms",
        "5",
        "--mixed",
        "false",
    ]);
    assert!(ok, "{err}");
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

/// `advise` speaks in the units its table uses: the pinned-cap note in bytes units (it said
/// "1099511627776 B is more than the pinned cap of 12638255104 B") and the recommendation's
/// time in the unit that keeps it readable (it said "32055.733 ms", "0.054 ms").
#[test]
fn advise_speaks_in_human_units() {
    let (ok, out, err) = gpumem(&["advise", "--size", "1TiB", "--cap", "1GiB"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("1.00 TiB is more than the pinned cap of 1.00 GiB"),
        "{out}"
    );
    let rec = out
        .lines()
        .find(|l| l.starts_with("recommended: "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(rec.contains(" s per transfer"), "{rec}");
    let (ok, out, err) = gpumem(&["advise", "--size", "1MiB"]);
    assert!(ok, "{err}");
    let rec = out
        .lines()
        .find(|l| l.starts_with("recommended: "))
        .unwrap();
    assert!(!rec.contains(" 0.0"), "{rec}");
    assert!(rec.contains(" µs per transfer"), "{rec}");
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

/// Every command that reads a trace takes `-` for standard input, and its help says so.
#[test]
fn every_trace_command_reads_standard_input_and_says_so() {
    use std::io::Write;
    let sample = std::fs::read(repo().join("crates/gpumem/tests/fixtures/sample.jsonl")).unwrap();
    for cmd in ["replay", "tune", "report", "map", "convert"] {
        let (ok, out, _) = gpumem(&[cmd, "--help"]);
        assert!(ok);
        let arg = out
            .split("Arguments:")
            .nth(1)
            .and_then(|a| a.split("Options:").next())
            .unwrap_or_default();
        assert!(arg.contains("standard input"), "{cmd}: {arg}");
        let mut args = vec![cmd, "-"];
        if cmd == "report" {
            args.extend(["-o", "-", "-a", "torch"]);
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(&args)
            .current_dir(repo())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&sample).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stdout.is_empty(), "{cmd}");
    }
}

/// `--torch-conf native` (the name `tune` prints for PyTorch's defaults) is taken, and the
/// line about segments made before recording says which ones the emulation can take in under
/// the setting given (seg_train's cudaMalloc segments under expandable_segments:True were said
/// to be taken in, "as PyTorch did").
#[test]
fn the_setting_given_decides_which_earlier_segments_are_taken_in() {
    let seg = "traces/warm_process/seg_train.pickle.gz";
    let (ok, _, err) = gpumem(&[
        "replay",
        seg,
        "-a",
        "torch",
        "--no-plan",
        "--torch-conf",
        "expandable_segments:True",
    ]);
    assert!(ok, "{err}");
    assert!(!err.contains("the torch emulation starts from"), "{err}");
    assert!(
        err.contains("2 cudaMalloc segments made before recording started are not of the kind expandable_segments:True makes"),
        "{err}"
    );
    let (ok, _, err) = gpumem(&["replay", seg, "-a", "torch", "--no-plan"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("2 segments made before recording started (no event of the trace made them); the torch emulation starts from them"),
        "{err}"
    );
    let gan = "traces/warm_process/gan_train_expandable.pickle.gz";
    let (ok, _, err) = gpumem(&[
        "replay",
        gan,
        "-a",
        "torch",
        "--no-plan",
        "--torch-conf",
        "native",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("PYTORCH_CUDA_ALLOC_CONF native (from --torch-conf)"),
        "{err}"
    );
    assert!(
        err.contains("1 expandable segment made before recording started is not of the kind"),
        "{err}"
    );
}

/// `tune --capacity` where every setting has an OOM: no `export` of the one with the fewest
/// OOMs (a run stops at its first), but the least demanding setting and what it needs (it
/// said "export PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6, needs 5.09 GiB: no
/// less than the trace's own setting", with expandable_segments:True needing 4.77 GiB).
#[test]
fn tune_exports_no_setting_that_fails_at_the_capacity_given() {
    let t = "traces/warm_process/seg_train.pickle.gz";
    let (ok, out, err) = gpumem(&["tune", t, "--capacity", "2GiB"]);
    assert!(ok, "{err}");
    assert!(!out.contains("export PYTORCH_CUDA_ALLOC_CONF"), "{out}");
    assert!(
        out.contains("every setting has an OOM at 2.00 GiB (PyTorch stops at the first); the least demanding, expandable_segments:True, needs 4.77 GiB: 292.0 MiB less than the trace's own setting (native) needs"),
        "{out}"
    );
    // The gpumem table still follows.
    assert!(out.contains("gpumem plug-in, GPUMEM_CONF"), "{out}");
}

/// `tune`'s `*` footnote tells its two capacities apart where three digits do not (it said
/// "also completes at 3.15 GiB, but not at every capacity between that and 3.15 GiB").
#[test]
fn tune_footnote_capacities_differ() {
    let (ok, out, err) = gpumem(&["tune", "traces/validation/resnet_infer.pickle.gz"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("*: expandable_segments:True also completes at 3226 MiB, but not at every capacity between that and 3230 MiB"),
        "{out}"
    );
    for line in out.lines().filter(|l| l.starts_with("*: ")) {
        let at = line.split(" also completes at ").nth(1).unwrap();
        let (small, rest) = at
            .split_once(", but not at every capacity between that and ")
            .unwrap();
        let large = rest.split(" (").next().unwrap();
        assert_ne!(small, large, "{line}");
    }
}

/// `advise` refuses a rate or horizon that is no number of the kind asked for (it printed
/// "NaN/s", "-3/s", "over NaN s" and "inf %" and advised on them) and a direction it does
/// not advise on (`both` dropped the pageable row; `d2h,h2d` silently took the first).
#[test]
fn advise_refuses_nonsense_rates_and_directions() {
    for (flag, value, says) in [
        (
            "--per-second",
            "nan",
            "expected transfers per second, a number ≥ 0",
        ),
        (
            "--per-second",
            "inf",
            "expected transfers per second, a number ≥ 0",
        ),
        (
            "--per-second",
            "-3",
            "expected transfers per second, a number ≥ 0",
        ),
        (
            "--horizon",
            "nan",
            "expected the seconds the pattern runs, a number above 0",
        ),
        (
            "--horizon",
            "-1",
            "expected the seconds the pattern runs, a number above 0",
        ),
        (
            "--horizon",
            "0",
            "expected the seconds the pattern runs, a number above 0",
        ),
        ("--direction", "both", "expected one direction, h2d or d2h"),
        (
            "--direction",
            "d2h,h2d",
            "expected one direction, h2d or d2h",
        ),
    ] {
        let (ok, out, err) = gpumem(&["advise", "--size", "64MiB", flag, value]);
        assert!(!ok, "{flag} {value}: {out}");
        assert!(
            err.contains(flag) && err.contains(says),
            "{flag} {value}: {err}"
        );
    }
    // A one-off is said so, not "0/s".
    let (ok, out, err) = gpumem(&["advise", "--size", "64MiB", "--direction", "d2h"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("d2h 64.00 MiB per transfer, a one-off, over 60 s;"),
        "{out}"
    );
}

/// `replay --json`: where the torch emulation parts from the recorded cudaMalloc calls, the
/// call it made has the shape of the recorded one (it was serde's array for a tuple,
/// `["alloc",0,39845888]`, beside the object `{"kind":"alloc","addr":...,"bytes":...}`).
#[test]
fn the_emulated_call_of_a_divergence_is_an_object_like_the_recorded_one() {
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/limits/graph_infer.pickle.gz",
        "-a",
        "torch",
        "--no-plan",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let check = &v["allocators"][0]["emulation_check"];
    assert_eq!(check["result"], "diverges", "{check}");
    assert_eq!(check["event"], 641, "{check}");
    assert_eq!(check["recorded"]["kind"], "alloc", "{check}");
    assert_eq!(check["recorded"]["bytes"], 2097152, "{check}");
    assert_eq!(
        check["emulated"],
        serde_json::json!({"kind": "alloc", "addr": 0, "bytes": 39845888}),
        "{check}"
    );
}

/// The `NAME.stats.json` beside the traces of `traces/validation/` (and warm_process,
/// settings, limits) is PyTorch's figure for the traced run: `replay` shows it as it shows
/// `NAME-native.stats.json` (it was never read, and 20 of the shipped traces had no PyTorch
/// figure under their table).
#[test]
fn the_traced_runs_own_stats_are_shown() {
    let t = "traces/validation/bert_finetune.pickle.gz";
    let (ok, out, err) = gpumem(&["replay", t, "-a", "torch", "--no-plan"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("PyTorch's own peak reserved for this run (memory_stats beside the trace): traced run 4.05 GiB (1.090)"),
        "{out}"
    );
    let (ok, out, err) = gpumem(&["replay", t, "-a", "torch", "--no-plan", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rec = &v["pytorch_recorded"];
    assert_eq!(rec.as_array().map(Vec::len), Some(1), "{rec}");
    assert_eq!(rec[0]["conf"], "traced run", "{rec}");
    // traces/validation/bert_finetune.stats.json's reserved_bytes.all.peak, which the
    // emulation matches.
    assert_eq!(rec[0]["reserved_bytes_peak"], 4347396096u64, "{rec}");
    assert_eq!(v["allocators"][0]["peak_reserved_bytes"], 4347396096u64);
}

/// `replay --json` carries the notes the table prints under its `read` line (they were
/// printed without --json only, so a script never learnt that the torch figures of a
/// snapshot with CUDA-graph pools may differ, or that the emulation started from earlier
/// segments).
#[test]
fn replay_json_has_the_read_notes() {
    let notes = |t: &str| {
        let (ok, out, err) = gpumem(&["replay", t, "-a", "torch", "--no-plan", "--json"]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["trace"]["notes"].clone()
    };
    let n = notes("traces/limits/graph_infer.pickle.gz");
    assert_eq!(n.as_array().map(Vec::len), Some(1), "{n}");
    assert!(
        n[0].as_str()
            .unwrap()
            .starts_with("3 segments of the snapshot belong to CUDA-graph private pools"),
        "{n}"
    );
    let n = notes("traces/external/finetune_no_timestamps.pickle.gz");
    assert_eq!(
        n,
        serde_json::json!([
            "622 blocks were already live when recording started (declared, freed without an alloc, or listed in the snapshot's segments); replayed as live from the start",
            "63 segments made before recording started (no event of the trace made them); the torch emulation starts from them, as PyTorch did"
        ])
    );
    // A trace with nothing to note has no key.
    assert!(notes("traces/mixed_sizes.pickle.gz").is_null());
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

/// The error of a truncated snapshot sends the user to `--lenient`; every command's help says
/// that `--lenient` salvages one (only `convert`'s did).
#[test]
fn every_lenient_help_says_it_salvages_a_truncated_snapshot() {
    for cmd in ["replay", "tune", "report", "map", "convert"] {
        let line = help_line(cmd, "--lenient");
        assert!(
            line.contains("salvage a truncated snapshot"),
            "{cmd}: {line}"
        );
    }
}

/// A segment larger than the device (`--segment-size 1TiB` for 1GiB) is warned about: the
/// segmented pools were refused at every growth, and the table showed 35 retries and a
/// driver time of 9016 % of the trace without a word why.
#[test]
fn a_segment_larger_than_the_device_is_warned_about() {
    let t = "traces/mixed_sizes.pickle.gz";
    let (ok, _, err) = gpumem(&[
        "replay",
        t,
        "--segment-size",
        "1TiB",
        "-a",
        "buddy,tlsf,torch",
        "--no-plan",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: segments of 1.00 TiB (--segment-size) are larger than the device (139.8 GiB): buddy, tlsf ask for one, are refused"),
        "{err}"
    );
    // Not for allocators that size their own segments.
    let (ok, _, err) = gpumem(&[
        "replay",
        t,
        "--segment-size",
        "1TiB",
        "-a",
        "torch",
        "--no-plan",
    ]);
    assert!(ok && !err.contains("--segment-size"), "{err}");
    let (ok, _, err) = gpumem(&["replay", t, "-a", "tlsf", "--no-plan"]);
    assert!(ok && !err.contains("warning"), "{err}");
    // `report` and `map` replay the same way and say the same.
    let dir = scratch("segwarn");
    let page = dir.join("r.html");
    for cmd in [
        vec!["report", "-o", page.to_str().unwrap()],
        vec!["map", "--width", "60"],
    ] {
        let mut args = cmd.clone();
        args.extend([t, "--segment-size", "1TiB", "-a", "best-fit"]);
        let (ok, _, err) = gpumem(&args);
        let cmd = cmd[0];
        assert!(ok, "{cmd}: {err}");
        assert!(
            err.contains("warning: segments of 1.00 TiB (--segment-size) are larger than the device (139.8 GiB): best-fit asks for one, is refused"),
            "{cmd}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `report --help` and `map --help` say which capacity they simulate without `--capacity`,
/// as `replay --help` does (they gave none).
#[test]
fn report_and_map_help_give_the_default_capacity() {
    for cmd in ["report", "map"] {
        let line = help_line(cmd, "--capacity");
        assert!(
            line.contains("default: the H200's 139.8 GiB"),
            "{cmd}: {line}"
        );
    }
}

/// `tune --json` has the settings its table exports (it had the rows only: a script had to
/// redo the ranking's OOM rule and the plug-in's 2 × native driver-time rule); null where the
/// table exports none, "" for PyTorch's defaults and the plug-in's.
#[test]
fn tune_json_has_what_the_table_exports() {
    let (ok, out, err) = gpumem(&["tune", "traces/gpt2_train.pickle.gz", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["recommended_pytorch_cuda_alloc_conf"],
        "expandable_segments:True"
    );
    assert_eq!(v["recommended_gpumem_conf"], "placement=pages");
    let (ok, table, err) = gpumem(&["tune", "traces/gpt2_train.pickle.gz"]);
    assert!(ok, "{err}");
    assert!(table.contains("\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"));
    assert!(table.contains("\nexport GPUMEM_CONF=placement=pages\n"));
    let (ok, out, err) = gpumem(&[
        "tune",
        "traces/warm_process/seg_train.pickle.gz",
        "--capacity",
        "2GiB",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["recommended_pytorch_cuda_alloc_conf"].is_null(), "{out}");
    assert!(v["recommended_gpumem_conf"].is_null(), "{out}");
}

/// `bench transfer --host-only` names the copy as `--stage-copy` spells it (`nt`, `libc`); it
/// printed the Rust name `NonTemporal`.
#[test]
fn host_only_staging_names_the_copy_as_its_flag() {
    for (flag, shown) in [("nt", "copy nt:"), ("libc", "copy libc:")] {
        let (ok, out, err) = gpumem(&[
            "bench",
            "transfer",
            "--host-only",
            "--sizes",
            "1MiB",
            "--stage-copy",
            flag,
        ]);
        assert!(ok, "{err}");
        assert!(out.contains(shown), "{out}");
        assert!(
            !out.contains("NonTemporal") && !out.contains("Libc"),
            "{out}"
        );
    }
}

/// `vmm`'s demonstration arena says when it rounded `--reserve` up to whole pages or
/// considered fewer pages than `--pages` asked (both were silent), in the table and in --json.
#[test]
fn vmm_says_what_it_rounded_and_capped() {
    let (ok, out, err) = gpumem(&["vmm", "--device", "sim", "--pages", "20", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["notes"],
        serde_json::json!([
            "--pages 20: considered 16, the pages the reserve holds (--reserve 40 MiB would hold 20)"
        ])
    );
    let (ok, out, err) = gpumem(&["vmm", "--device", "sim", "--reserve", "1KiB"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("note: --reserve 1 KiB: reserved 2 MiB (whole pages of 2 MiB)"),
        "{out}"
    );
    // The reserve given was 0 (2 MiB, one page): the note read "--reserve 16 MiB holds 8",
    // as if the user had given 16 MiB.
    let (ok, out, err) = gpumem(&["vmm", "--device", "sim", "--reserve", "0"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("note: --pages 8: considered 1, the pages the reserve holds (--reserve 16 MiB would hold 8)"),
        "{out}"
    );
    let (ok, out, _) = gpumem(&["vmm", "--device", "sim"]);
    assert!(ok && !out.contains("note:"), "{out}");
}

/// `advise --table` with a file that is not a transfer table says what it expected and where
/// `bench transfer` caches one (it said only "missing field `source`").
#[test]
fn advise_table_of_the_wrong_kind_says_what_it_expected() {
    let dir = scratch("advise-table");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"a\": 1}").unwrap();
    let (ok, _, err) = gpumem(&["advise", "--table", bad.to_str().unwrap(), "--size", "1GiB"]);
    assert!(!ok);
    one_line_error(&err);
    assert!(err.contains(bad.to_str().unwrap()), "{err}");
    assert!(
        err.contains("expected a table as `gpumem bench transfer` caches it for advise"),
        "{err}"
    );
    assert!(err.contains("gpumem/transfer.json"), "{err}");
    // A folder or a missing file: the flag is named too (it said only "reading DIR: Is a
    // directory").
    for p in [dir.clone(), dir.join("missing.json")] {
        let (ok, _, err) = gpumem(&["advise", "--table", p.to_str().unwrap(), "--size", "1GiB"]);
        assert!(!ok);
        one_line_error(&err);
        assert!(
            err.contains(&format!("--table {}: reading it", p.display())),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An empty trace says it is empty without calling standard input a file; a file is named.
#[test]
fn an_empty_trace_is_said_empty_whatever_it_came_from() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["replay", "-"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    one_line_error(&err);
    assert_eq!(
        err.trim_end(),
        "error: standard input: not an allocation trace: it is empty (0 bytes)"
    );
    let dir = scratch("empty-trace");
    let f = dir.join("empty.json");
    std::fs::write(&f, "").unwrap();
    let (ok, _, err) = gpumem(&["replay", f.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("empty.json") && err.contains("it is empty (0 bytes)"),
        "{err}"
    );
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
    let (ok, out, err) = gpumem(&["map", t, "--event", "100"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("torch after event 100: "),
        "{}",
        out.lines().next().unwrap_or_default()
    );
}

/// A `--reserve` that rounds up past 2^64 bytes is refused by name (it wrapped to 0 and the
/// device said "0 is not a non-zero multiple of the granularity").
#[test]
fn vmm_refuses_a_reserve_that_rounds_past_2_64() {
    let (ok, _, err) = gpumem(&[
        "vmm",
        "--device",
        "sim",
        "--reserve",
        "18446744073709551615",
    ]);
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
    let (ok, out, err) = gpumem(&["inspect", "--device", "sim", "--sizes", "64KiB", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(!v["rows"].as_array().unwrap().is_empty(), "{out}");
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
    let (ok, out, err) = run(&[
        "--sizes",
        "1MiB",
        "--mixed",
        "false",
        "--threads",
        "1",
        "--strategies",
        "tlsf",
        "--max-pairs",
        "1",
        "--json",
    ]);
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
    let (ok, out, err) = gpumem(&[
        "bench",
        "pinned",
        "--repeats",
        "0",
        "--sizes",
        "4KiB",
        "--no-cache",
    ]);
    assert!(!ok, "{out}");
    assert!(err.contains("--repeats"), "{err}");
    let (ok, out, err) = gpumem(&[
        "bench",
        "transfer",
        "--host-only",
        "--repeats",
        "0",
        "--sizes",
        "4KiB",
        "--no-cache",
    ]);
    assert!(!ok, "{out}");
    assert!(err.contains("--repeats"), "{err}");
    let dir = scratch("host-only-plot");
    let svg = dir.join("bw.svg");
    for extra in [&["--plot", svg.to_str().unwrap()][..], &["--overlap"][..]] {
        let mut args = vec![
            "bench",
            "transfer",
            "--host-only",
            "--sizes",
            "4KiB",
            "--no-cache",
        ];
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
    let (ok, _, err) = gpumem(&[
        "bench",
        "pinned",
        "--repeats",
        "1",
        "--sizes",
        "4KiB",
        "--no-cache",
        "--json",
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = gpumem(&[
        "bench",
        "transfer",
        "--host-only",
        "--sizes",
        "4KiB",
        "--no-cache",
    ]);
    assert!(ok, "{err}");
}

/// An output that is a symbolic link, or a FIFO (as `/dev/stdout` or `/dev/null` are not
/// regular files either), was replaced by a regular file: the temporary file was renamed over
/// the link or the FIFO itself (`report -o /dev/full` replaced the device). The link now stays
/// and its file gets the output; a FIFO is written in place.
#[cfg(target_os = "linux")]
#[test]
fn outputs_write_through_links_and_into_fifos() {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let dir = scratch("special-outputs");
    let trace = dir.join("tiny.jsonl");
    // As convert writes it (a free with its size), so that the output is the input.
    let lines =
        "{\"action\":\"alloc\",\"addr\":1,\"size\":512}\n{\"action\":\"free\",\"addr\":1,\"size\":512}\n";
    std::fs::write(&trace, lines).unwrap();
    let trace = trace.to_str().unwrap();
    // A link to a file.
    let real = dir.join("real.jsonl");
    std::fs::write(&real, "old\n").unwrap();
    let link = dir.join("link.jsonl");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let (ok, _, err) = gpumem(&["convert", trace, "-o", link.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(link.is_symlink(), "the link was replaced by a file");
    assert_eq!(std::fs::read_to_string(&real).unwrap(), lines);
    // A FIFO, opened for reading first (without waiting for a writer) so that the command's
    // open for writing does not block; the output fits in the pipe's buffer.
    let fifo = dir.join("pipe");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    const O_NONBLOCK: i32 = 0o4000;
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let (ok, _, err) = gpumem(&["convert", trace, "-o", fifo.to_str().unwrap()]);
    assert!(ok, "{err}");
    let is_fifo = std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo();
    let mut got = String::new();
    let _ = reader.read_to_string(&mut got);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(is_fifo, "the FIFO was replaced by a file");
    assert_eq!(got, lines);
}

/// Standard output that cannot be written (`> /dev/full`: no space left) made `println!`
/// panic with a backtrace; it is now one line of error and exit status 1.
#[cfg(target_os = "linux")]
#[test]
fn a_full_standard_output_is_an_error_not_a_panic() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full");
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args([
            "replay",
            "traces/mixed_sizes.pickle.gz",
            "-a",
            "tlsf",
            "--json",
        ])
        .current_dir(repo())
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    one_line_error(&err);
    assert!(
        err.contains("error: writing to standard output: No space left on device"),
        "{err}"
    );
}

/// An output under a file (`-o notes.txt/r.html`) said "the folder notes.txt does not exist",
/// which it does, as a file; it now says so.
#[test]
fn an_output_under_a_file_names_the_file() {
    let dir = scratch("under-a-file");
    let file = dir.join("notes.txt");
    std::fs::write(&file, "x").unwrap();
    let out = file.join("r.html");
    let (ok, _, err) = gpumem(&[
        "report",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "tlsf",
        "-o",
        out.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok);
    one_line_error(&err);
    assert!(
        err.contains(&format!("{} is a file, not a folder", file.display())),
        "{err}"
    );
}

/// `bench transfer --host-only --stage-threads 100000` printed "threads 100000" for a ring
/// that started one thread per CPU; it prints the threads it measured with.
#[test]
fn host_only_staging_says_the_threads_it_measured_with() {
    let (ok, out, err) = gpumem(&[
        "bench",
        "transfer",
        "--host-only",
        "--stage-threads",
        "100000",
        "--sizes",
        "4KiB",
        "--no-cache",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    assert_eq!(
        v["staging_sweep"][0]["config"]["threads"].as_u64(),
        Some(cpus),
        "{out}"
    );
}

/// `report` and `map` take `--lazy-conf` as `replay` does (they could not show the settings
/// `tune` recommends), and the page names the settings each configurable allocator ran with.
#[test]
fn report_and_map_take_lazy_conf() {
    let t = "traces/mixed_sizes.pickle.gz";
    let map = |conf: &[&str]| {
        let mut args = vec![
            "map",
            t,
            "-a",
            "paged-lazy",
            "--width",
            "60",
            "--lines",
            "3",
        ];
        args.extend(conf);
        let (ok, out, err) = gpumem(&args);
        assert!(ok, "{err}");
        out.lines().next().unwrap_or_default().to_string()
    };
    // The page placement keeps one address range; the default placement two segments' worth.
    assert!(map(&[]).contains("2 VA ranges"), "{}", map(&[]));
    let pages = map(&["--lazy-conf", "placement=pages"]);
    assert!(pages.contains("1 VA range;"), "{pages}");
    // A bad setting fails before the trace is read, with replay's words.
    let (ok, _, err) = gpumem(&["map", t, "--lazy-conf", "bogus=1"]);
    assert!(
        !ok && err.contains("--lazy-conf: unknown key `bogus`"),
        "{err}"
    );
    // Not for an allocator shown: said, as replay says it.
    let (ok, _, err) = gpumem(&["map", t, "-a", "torch", "--lazy-conf", "grow_ahead=0.01"]);
    assert!(
        ok && err.contains("--lazy-conf configures paged-lazy only"),
        "{err}"
    );
    let dir = scratch("lazyconf");
    let page = dir.join("r.html");
    let (ok, _, err) = gpumem(&[
        "report",
        t,
        "-a",
        "torch,paged-lazy",
        "--lazy-conf",
        "grow_ahead=0.0156",
        "-o",
        page.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("paged-lazy: <code>placement=segments,grow_ahead=0.0156</code> (PyTorch's expandable segments"),
        "settings row missing"
    );
    assert!(html.contains("torch: <code>PYTORCH_CUDA_ALLOC_CONF native</code>"));
    // The items that take effect, sizes in binary units (it listed every key, in bytes).
    let (ok, _, err) = gpumem(&[
        "report",
        t,
        "-a",
        "paged-lazy",
        "--lazy-conf",
        "placement=pages,max_handle=64MiB",
        "-o",
        page.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("paged-lazy: <code>placement=pages,headroom=0,max_handle=64MiB,map_ahead=1GiB</code> (gpumem's page placement"),
        "settings row missing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `report -o x.svg` writes the HTML page under that name, as asked, and says it is HTML (the
/// file opened as a broken picture, without a word).
#[test]
fn a_report_named_like_a_picture_is_said_to_be_html() {
    let dir = scratch("report-ext");
    let t = "traces/mixed_sizes.pickle.gz";
    for (name, warned) in [("r.svg", true), ("r.HTML", false), ("r.html", false)] {
        let out = dir.join(name);
        let (ok, _, err) = gpumem(&["report", t, "-a", "tlsf", "-o", out.to_str().unwrap()]);
        assert!(ok, "{err}");
        assert_eq!(
            err.contains("the report is an HTML page"),
            warned,
            "{name}: {err}"
        );
        let page = std::fs::read_to_string(&out).unwrap();
        assert!(page.starts_with("<!DOCTYPE html>") || page.starts_with("<!doctype html>"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An unsustainable rate keeps `advise`'s table in its columns (busy % printed 121394184.6)
/// and the recommendation says how many transfers a second can be sustained.
#[test]
fn advise_at_an_impossible_rate_keeps_its_columns() {
    let (ok, out, err) = gpumem(&["advise", "--size", "64MiB", "--per-second", "1e9"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let head = lines.iter().position(|l| l.starts_with("kind ")).unwrap();
    let note_at = lines[head].find("  note").unwrap();
    for row in &lines[head + 1..head + 6] {
        // Every row's note starts where the header's does.
        assert_eq!(&row[note_at..note_at + 2], "  ", "{row}");
        assert_ne!(&row[note_at + 2..note_at + 3], " ", "{row}");
        assert!(row[..note_at].trim_end().ends_with("e8"), "{row}");
    }
    let rec = lines
        .iter()
        .find(|l| l.starts_with("recommended:"))
        .unwrap();
    // pinned, 1.216 ms per transfer: 822 a second.
    assert!(
        rec.contains("that is 1.2e8 % of each second: the pattern cannot be sustained (at most 822 transfers a second)"),
        "{rec}"
    );
}
