//! `--capacity` and `--min-capacity` in every trace command: out-of-memory, verdicts, impossible requests.
use crate::common::{
    args, gpumem, gpumem_ok, jsonl_trace, one_line_error, scratch, write_file, FIXTURES,
};
use std::process::Command;

#[test]
fn capacity_limit_reports_ooms_and_min_capacity_is_between_floor_and_peak() {
    let (out, _) = gpumem_ok(&args(
        "replay traces/mixed_sizes.pickle.gz -a tlsf --capacity 3GiB --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["allocators"][0]["oom_count"].as_u64().unwrap() > 0);
    assert!(v["allocators"][0]["peak_reserved_bytes"].as_u64().unwrap() <= 3 << 30);

    let (out, _) = gpumem_ok(&args(
        "replay traces/mixed_sizes.pickle.gz -a paged --min-capacity --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = &v["allocators"][0];
    let min = a["min_capacity_bytes"].as_u64().unwrap();
    assert!(min >= v["trace"]["peak_requested_bytes"].as_u64().unwrap());
    assert!(min <= a["peak_reserved_bytes"].as_u64().unwrap() + (2 << 20));
    assert!(a["min_capacity_all_larger_bytes"].as_u64().unwrap() >= min);
    assert_eq!(a["min_capacity"][0]["found"]["exact"], true);
}

/// Issue 10: five 30 GiB blocks live with `--capacity 155GiB`: buddy (power-of-two blocks)
/// cannot complete, the others can; the command keeps their results, gives buddy's real
/// reason, and succeeds.
#[test]
fn min_capacity_keeps_other_results_and_names_the_real_reason() {
    let g = 1u64 << 30;
    let lines: Vec<String> = (1..=5)
        .map(|i| format!(r#"{{"action":"alloc","addr":{i},"size":{}}}"#, 30 * g))
        .collect();
    let path = jsonl_trace("5x30", &lines);
    let p = path.to_str().unwrap();
    let search = [
        "replay",
        p,
        "-a",
        "buddy,tlsf",
        "--capacity",
        "155GiB",
        "--min-capacity",
    ];
    let (out, _) = gpumem_ok(&[&search[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let buddy = &v["allocators"][0];
    let reason = buddy["min_capacity"][0]["never_completes"]["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("{buddy}"));
    assert!(reason.contains("rounding"), "{reason}");
    assert!(!reason.contains("single request"), "{reason}");
    assert_eq!(v["allocators"][1]["min_capacity_bytes"], 150 * g);
    let (out, _) = gpumem_ok(&search);
    assert!(out.contains("does not complete even with"), "{out}");
    // Nothing completes at all: a failure, with every reason printed.
    let (ok, out, err) = gpumem(&[
        "replay",
        p,
        "-a",
        "buddy",
        "--capacity",
        "155GiB",
        "--min-capacity",
    ]);
    assert!(!ok && err.contains("no allocator completes"), "{err}");
    assert!(out.contains("rounding"), "{out}");
    let _ = std::fs::remove_file(path);
}

/// Issue 10: alignments of 4 MiB and 2^40 and a size of 2^64 − 1 stopped every allocator
/// with "event 1"; now they count as failed allocations and the replay goes on.
#[test]
fn impossible_requests_do_not_abort_the_replay() {
    let lines: Vec<String> = vec![
        r#"{"action":"alloc","addr":1,"size":1000}"#.into(),
        format!(
            r#"{{"action":"alloc","addr":2,"size":1000,"align":{}}}"#,
            4u64 << 20
        ),
        format!(
            r#"{{"action":"alloc","addr":3,"size":1000,"align":{}}}"#,
            1u64 << 40
        ),
        format!(r#"{{"action":"alloc","addr":4,"size":{}}}"#, u64::MAX),
        r#"{"action":"free","addr":2}"#.into(),
        r#"{"action":"free","addr":1}"#.into(),
    ];
    let path = jsonl_trace("align", &lines);
    let (out, _) = gpumem_ok(&["replay", path.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for a in v["allocators"].as_array().unwrap() {
        let failed = a["oom_count"].as_u64().unwrap() + a["refused_count"].as_u64().unwrap();
        assert!((1..=3).contains(&failed), "{a}");
        assert!(a["reserved_over_requested"].as_f64().unwrap() >= 1.0, "{a}");
    }
    let (out, _) = gpumem_ok(&["replay", path.to_str().unwrap(), "-a", "buddy"]);
    assert!(out.contains("refused event index 1"), "{out}");
    let _ = std::fs::remove_file(path);
}

/// Issue 10's capacity edges.
#[test]
fn capacity_edges_warn_or_refuse_clearly() {
    // res/req stays a ratio of what was served, the first OOM is named, the row is marked.
    let (out, _) = gpumem_ok(&args(
        "replay traces/mixed_sizes.pickle.gz -a tlsf --capacity 3GiB --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = &v["allocators"][0];
    assert!(a["reserved_over_requested"].as_f64().unwrap() >= 1.0, "{a}");
    assert!(a["first_oom_event"].as_u64().is_some(), "{a}");
    assert!(v["semantics"].as_str().unwrap().contains("would raise"));
    let (ok, out, _) = gpumem(&args(
        "replay traces/mixed_sizes.pickle.gz -a tlsf --capacity 3GiB",
    ));
    assert!(
        ok && out.contains('†') && out.contains("first OOM"),
        "{out}"
    );
    // A bare number is bytes: warned, not silently failed.
    let (ok, _, err) = gpumem(&args(
        "replay traces/mixed_sizes.pickle.gz -a tlsf --capacity 1B",
    ));
    assert!(
        ok && err.contains("smaller than the trace's largest request"),
        "{err}"
    );
    assert!(err.contains("without a unit is bytes"), "{err}");
    let (ok, _, err) = gpumem(&args(
        "replay traces/mixed_sizes.pickle.gz --capacity 18446744073709551615",
    ));
    assert!(
        !ok && err.contains("address space") && !err.contains("internal"),
        "{err}"
    );
    let (ok, _, err) = gpumem(&args(
        "replay traces/mixed_sizes.pickle.gz -a tlsf --segment-size 1B",
    ));
    assert!(ok && err.contains("rounded up"), "{err}");
    let (out, _) = gpumem_ok(&args(
        "replay traces/mixed_sizes.pickle.gz -a all,tlsf --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["allocators"].as_array().unwrap().len(),
        6,
        "tlsf runs once"
    );
}

#[test]
fn multi_device_min_capacity_is_per_device() {
    let mib = 1u64 << 20;
    let lines = vec![
        format!(
            r#"{{"action":"alloc","addr":1,"size":{},"device":0}}"#,
            300 * mib
        ),
        format!(
            r#"{{"action":"alloc","addr":1,"size":{},"device":1}}"#,
            64 * mib
        ),
    ];
    let path = jsonl_trace("2dev-min", &lines);
    let (out, _) = gpumem_ok(&[
        "replay",
        path.to_str().unwrap(),
        "-a",
        "tlsf",
        "--min-capacity",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mc = v["allocators"][0]["min_capacity"].as_array().unwrap();
    assert_eq!(mc.len(), 2);
    assert_eq!(mc[0]["device"], 0);
    assert_eq!(mc[0]["found"]["smallest_bytes"], 300 * mib);
    assert_eq!(mc[1]["found"]["smallest_bytes"], 64 * mib);
    // No summed figure that no single device needs.
    assert!(v["allocators"][0]["min_capacity_bytes"].is_null());
    let _ = std::fs::remove_file(path);
}

/// Issue 9 item 2: a recorded OOM gets a verdict per allocator, above the table and in --json.
#[test]
fn recorded_oom_gets_a_verdict_per_allocator() {
    let f = format!("{FIXTURES}/recorded_oom.pickle");
    let (out, _) = gpumem_ok(&["replay", &f, "-a", "torch,paged", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ooms = v["recorded_ooms"].as_array().unwrap();
    assert_eq!(ooms.len(), 1);
    let o = &ooms[0];
    let mib = 1u64 << 20;
    // 50 segments of 20 MiB were reserved; the driver had 32 MiB free; 64 MiB were asked.
    assert_eq!(o["reserved_bytes"], 1000 * mib);
    assert_eq!(o["device_free_bytes"], 32 * mib);
    assert_eq!(o["capacity_bytes"], 1032 * mib);
    assert_eq!(o["request_bytes"], 64 * mib);
    let by = |n: &str| {
        o["allocators"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == n)
            .unwrap()
            .clone()
    };
    // PyTorch's caching allocator needs a new 64 MiB segment: 32 MiB short, as recorded.
    let torch = by("torch");
    assert_eq!(torch["fits"], false);
    let short = -torch["margin_bytes"].as_i64().unwrap();
    assert!((short - 32 * mib as i64).abs() <= 2 * mib as i64, "{short}");
    // Pages: the run's peak (800 MiB) fits in 1032 MiB.
    let paged = by("paged");
    assert_eq!(paged["fits"], true);
    let spare = paged["margin_bytes"].as_i64().unwrap();
    assert!(
        spare > 100 * mib as i64 && spare <= 232 * mib as i64,
        "{spare}"
    );
    let (out, _) = gpumem_ok(&["replay", &f, "-a", "torch,paged"]);
    let first = out.lines().next().unwrap();
    assert!(
        first.starts_with("recorded OOM at event 200 (device 0)"),
        "{out}"
    );
    assert!(
        out.contains("torch: fails, ") && out.contains("short (as recorded)"),
        "{out}"
    );
    assert!(
        out.contains("paged: fits, ") && out.contains("to spare"),
        "{out}"
    );
    // No OOM recorded: an empty list.
    let (_, out, _) = gpumem(&args("replay traces/mixed_sizes.pickle.gz -a tlsf --json"));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["recorded_ooms"], serde_json::json!([]));
}

/// A recorded OOM in a trace without segment events: what PyTorch had reserved is unknown,
/// so no allocator is judged against a usable capacity of `device_free` alone (it was
/// "0 B reserved" and every allocator "failed"); each one's need is given instead.
#[test]
fn a_recorded_oom_without_segment_events_is_not_judged_against_zero_reserved() {
    let m = 1u64 << 20;
    let mut lines: Vec<String> = (1..=10)
        .map(|i| format!(r#"{{"action":"alloc","addr":{i},"size":{}}}"#, 100 * m))
        .collect();
    lines.push(format!(
        r#"{{"action":"oom","size":{},"device_free":{}}}"#,
        300 * m,
        32 * m
    ));
    let path = jsonl_trace("oom-no-segments", &lines);
    let (out, _) = gpumem_ok(&["replay", path.to_str().unwrap(), "-a", "tlsf,paged"]);
    assert!(
        out.contains("? (no segment events in the trace) reserved"),
        "{out}"
    );
    assert!(out.contains("tlsf: needs"), "{out}");
    assert!(!out.contains("short"), "{out}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn an_impossible_request_is_dropped_counted_and_said_by_every_command() {
    let dir = scratch("overflow");
    let t = dir.join("t.jsonl");
    write_file(
        &t,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":18446744073709551615}\n\
         {\"action\":\"alloc\",\"addr\":2,\"size\":1000}\n\
         {\"action\":\"free\",\"addr\":2}\n",
    );
    let tp = t.to_str().unwrap();
    let (out, _) = gpumem_ok(&["replay", tp, "-a", "torch"]);
    assert!(out.contains("torch refused event index 0"), "{out}");
    // The trace's line says its largest request leaves the impossible one out (it said
    // "largest request 1000 B" of a trace that asked for 16 EiB).
    assert!(
        out.contains("largest request 1000 B (not counting 1 request too large for any allocator)"),
        "{out}"
    );

    let (out, err) = gpumem_ok(&["map", tp, "-a", "torch"]);
    assert!(out.starts_with("torch after event"), "{out}");
    assert!(
        err.contains("note: torch refused 1 allocation as impossible and dropped it with its free (first: event index 0:"),
        "{err}"
    );
    let html = dir.join("r.html");
    let (_, err) = gpumem_ok(&[
        "report",
        tp,
        "-a",
        "torch,tlsf",
        "-o",
        html.to_str().unwrap(),
    ]);
    assert!(
        err.contains("note: tlsf refused 1 allocation as impossible"),
        "{err}"
    );
    assert!(std::fs::read_to_string(&html).unwrap().contains("<html"));

    let (out, _) = gpumem_ok(&["tune", tp]);
    assert!(
        out.contains("†: 1 allocation refused as impossible and dropped with its free (native, first: event index 0:"),
        "{out}"
    );
    let (out, _) = gpumem_ok(&["tune", tp, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rows"][0]["refused_count"], 1, "{out}");
    assert_eq!(v["plugin_rows"][0]["refused_count"], 1, "{out}");
    // The smallest device still exists: the impossible request fails on every one.
    assert_eq!(v["rows"][0]["min_capacity_bytes"], 2 << 20, "{out}");
    let (out, _) = gpumem_ok(&["replay", tp, "-a", "torch", "--min-capacity", "--json"]);
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
    write_file(
        &seg,
        "{\"action\":\"segment_alloc\",\"addr\":1,\"size\":100}\n",
    );
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

/// `replay --capacity 17TiB` is refused (the simulated device's address space), but `tune`,
/// `report` and `map` took it: at 16000TiB `report` said "3324 allocations failed (out of
/// memory on a device of 15.62 PiB)" for paged, and `tune` that every gpumem setting "has an
/// OOM at 15.62 PiB". The four commands now refuse it alike, before reading the trace.
#[test]
fn every_command_refuses_a_capacity_past_the_simulated_address_space() {
    let dir = scratch("capacity");
    let page = dir.join("r.html");
    let t = "traces/mixed_sizes.pickle.gz";
    let mut said = Vec::new();
    for args in [
        vec!["replay", t],
        vec!["tune", t],
        vec!["report", t, "-o", page.to_str().unwrap()],
        vec!["map", t],
    ] {
        let mut args = args;
        args.extend(["--capacity", "17TiB"]);
        let (ok, out, err) = gpumem(&args);
        assert!(!ok, "{args:?}: {out}");
        one_line_error(&err);
        assert!(
            err.starts_with("error: --capacity 17.00 TiB: above 16.00 TiB"),
            "{args:?}: {err}"
        );
        said.push(err);
    }
    assert!(!page.exists());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(said.windows(2).all(|w| w[0] == w[1]), "{said:?}");
    // 16 TiB itself is taken.
    gpumem_ok(&args(
        "map traces/mixed_sizes.pickle.gz --capacity 16TiB --width 40 --lines 2",
    ));
}
