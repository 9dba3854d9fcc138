//! End-to-end tests of the `gpumem` binary on the simulated device.
mod common;

use common::{gpumem, repo};
use std::path::PathBuf;
use std::process::Command;

#[test]
fn replay_json_has_the_documented_fields_for_every_allocator() {
    let (ok, out, err) = gpumem(&["replay", "traces/mixed_sizes.pickle.gz", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    // Python: sum of alloc + free_completed events, and the peak of live requested bytes.
    assert_eq!(v["trace"]["alloc_events"], 3324);
    assert_eq!(v["trace"]["free_events"], 3324);
    assert_eq!(v["trace"]["peak_requested_bytes"], 3_930_870_227u64);
    let allocs = v["allocators"].as_array().unwrap();
    let names: Vec<&str> = allocs.iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["buddy", "tlsf", "best-fit", "torch", "paged", "paged-lazy"]
    );
    for a in allocs {
        for key in [
            "peak_reserved_bytes",
            "peak_allocated_bytes",
            "reserved_over_requested",
            "peak_external_fragmentation",
            "oom_count",
            "driver_calls",
            "modelled_driver_seconds",
            "events_per_second",
        ] {
            assert!(!a[key].is_null(), "{} lacks {key}", a["name"]);
        }
        let ratio = a["reserved_over_requested"].as_f64().unwrap();
        assert!(ratio >= 1.0, "{}: {ratio}", a["name"]);
        assert_eq!(a["oom_count"], 0);
    }
    // PyTorch's own figure for this trace: reserved_bytes.all.peak = 6738149376.
    let torch = allocs.iter().find(|a| a["name"] == "torch").unwrap();
    let r = torch["peak_reserved_bytes"].as_f64().unwrap();
    assert!(
        (r / 6_738_149_376.0 - 1.0).abs() <= 0.01,
        "torch emulation {r}"
    );
}

#[test]
fn capacity_limit_reports_ooms_and_min_capacity_is_between_floor_and_peak() {
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "tlsf",
        "--capacity",
        "3GiB",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["allocators"][0]["oom_count"].as_u64().unwrap() > 0);
    assert!(v["allocators"][0]["peak_reserved_bytes"].as_u64().unwrap() <= 3 << 30);

    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "paged",
        "--min-capacity",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = &v["allocators"][0];
    let min = a["min_capacity_bytes"].as_u64().unwrap();
    assert!(min >= v["trace"]["peak_requested_bytes"].as_u64().unwrap());
    assert!(min <= a["peak_reserved_bytes"].as_u64().unwrap() + (2 << 20));
    assert!(a["min_capacity_all_larger_bytes"].as_u64().unwrap() >= min);
    assert_eq!(a["min_capacity"][0]["found"]["exact"], true);
}

#[test]
fn table_and_timeline() {
    let svg = std::env::temp_dir().join(format!("gpumem-timeline-{}.svg", std::process::id()));
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "torch,paged",
        "--timeline",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("peak requested 3.66 GiB"), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("torch")) && out.lines().any(|l| l.starts_with("paged")),
        "{out}"
    );
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(
        s.starts_with("<svg")
            && s.contains("torch: peak reserved")
            && s.contains("paged: peak reserved")
    );
    // The simulated H200 has what cuMemGetInfo reports on the real one.
    assert!(out.contains("capacity 139.8 GiB"), "{out}");
    // Under --capacity: the capacity as a line, failed allocations as marks.
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "torch,paged",
        "--capacity",
        "3GiB",
        "--timeline",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(
        s.contains("capacity") && s.contains("failed allocations (black ticks"),
        "{s}"
    );
    assert!(s.contains(r##"stroke="#000""##));
    let _ = std::fs::remove_file(svg);
}

/// A trace of two devices, one after the other: each device's lines sit on the trace's
/// event axis (device 1 in the second half), not on its own replay's event count.
#[test]
fn timeline_of_two_devices_uses_the_trace_event_axis() {
    let mut lines = Vec::new();
    for device in 0..2 {
        let addrs = (1..=100u64).map(|i| i << 21);
        lines.extend(addrs.clone().map(|addr| {
            format!(r#"{{"action":"alloc","addr":{addr},"size":1048576,"device":{device}}}"#)
        }));
        lines.extend(
            addrs.map(|addr| format!(r#"{{"action":"free","addr":{addr},"device":{device}}}"#)),
        );
    }
    let trace = jsonl_trace("timeline2", &lines);
    let svg = trace.with_extension("svg");
    let (ok, _, err) = gpumem(&[
        "replay",
        trace.to_str().unwrap(),
        "-a",
        "tlsf",
        "--no-plan",
        "--timeline",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.contains("reserved, device 0") && s.contains("requested, device 1"));
    assert!(s.contains("event (of the whole trace)"));
    // The series' paths in order: reserved and requested of device 0, then of device 1.
    // Their first x in pixels: the plot runs from x = 90 (event 0) to 760 (event 399).
    let first_x: Vec<f64> = s
        .split(r#"<path d="M"#)
        .skip(1)
        .map(|p| p.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(first_x.len(), 4, "{s}");
    assert!(first_x[..2].iter().all(|&x| x < 100.0), "{first_x:?}");
    // Device 1's first event is the trace's 200th: half way.
    assert!(
        first_x[2..].iter().all(|&x| (420.0..440.0).contains(&x)),
        "{first_x:?}"
    );
    let _ = std::fs::remove_file(trace);
    let _ = std::fs::remove_file(svg);
}

#[test]
fn driver_time_is_shown_as_a_share_of_the_trace() {
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "paged",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let d = v["trace"]["duration_seconds"].as_f64().unwrap();
    assert!(d > 0.0);
    let a = &v["allocators"][0];
    let share = a["driver_share_of_trace"].as_f64().unwrap();
    let secs = a["modelled_driver_seconds"].as_f64().unwrap();
    assert!(
        (share - secs / d).abs() < 1e-9 * share.max(1.0),
        "{share} vs {secs} / {d}"
    );
    // Seconds per call kind add up to the total.
    let by: f64 = a["driver_seconds"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap())
        .sum();
    assert!((by - secs).abs() < 1e-9, "{by} vs {secs}");
    // The external trace without timestamps has no share.
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/external/finetune_no_timestamps.pickle.gz",
        "-a",
        "paged",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["allocators"][0]["driver_share_of_trace"].is_null());
}

#[test]
fn bad_inputs_get_clear_errors() {
    let (ok, _, err) = gpumem(&["replay", "no/such/file.pickle"]);
    assert!(!ok && err.contains("no/such/file.pickle"), "{err}");
    let (ok, _, err) = gpumem(&["replay", "traces/mixed_sizes.pickle.gz", "-a", "firstfit"]);
    assert!(!ok && err.contains("unknown allocator `firstfit`"), "{err}");
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "--capacity",
        "12XB",
    ]);
    assert!(!ok && err.contains("unknown unit"), "{err}");
    let (ok, _, err) = gpumem(&[
        "replay",
        "crates/gpumem/tests/fixtures/lfs_pointer.pickle.gz",
    ]);
    assert!(!ok && err.contains("LFS"), "{err}");
    let (ok, _, err) = gpumem(&[
        "replay",
        "crates/gpumem/tests/fixtures/hostile_reduce.pickle",
    ]);
    assert!(!ok && err.contains("refused"), "{err}");
    let (ok, _, err) = gpumem(&["replay", "traces/mixed_sizes.pickle.gz", "--device", "tpu"]);
    assert!(
        !ok && err.contains("expected sim, cuda, cuda:N or all"),
        "{err}"
    );
}

#[test]
fn snapshot_without_trace_gets_a_state_analysis() {
    let (ok, out, err) = gpumem(&[
        "replay",
        "crates/gpumem/tests/fixtures/segments_only.pickle",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["state"]["totals"];
    assert!(t["segments"].as_u64().unwrap() > 0);
    assert!(t["reserved_bytes"].as_u64().unwrap() >= t["allocated_bytes"].as_u64().unwrap());
}

#[test]
fn external_snapshot_with_blocks_from_before_recording() {
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/external/finetune_no_timestamps.pickle.gz",
        "-a",
        "torch",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["trace"]["preexisting_blocks"].as_u64().unwrap() > 0);
    assert_eq!(v["allocators"][0]["oom_count"], 0);
}

#[test]
fn convert_to_jsonl_and_replay_gives_the_same_figures() {
    let out = std::env::temp_dir().join(format!("gpumem-convert-{}.jsonl", std::process::id()));
    let (ok, _, err) = gpumem(&[
        "convert",
        "traces/mixed_sizes.pickle.gz",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let figures = |path: &str| {
        let (ok, o, err) = gpumem(&["replay", path, "-a", "torch,tlsf", "--json"]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&o).unwrap();
        (
            v["trace"]["peak_requested_bytes"].clone(),
            v["allocators"][0]["peak_reserved_bytes"].clone(),
            v["allocators"][1]["peak_reserved_bytes"].clone(),
        )
    };
    assert_eq!(
        figures("traces/mixed_sizes.pickle.gz"),
        figures(out.to_str().unwrap())
    );
    let _ = std::fs::remove_file(out);
}

#[test]
fn several_devices_get_one_pool_each_and_summed_figures() {
    let path = std::env::temp_dir().join(format!("gpumem-2dev-{}.jsonl", std::process::id()));
    // Device 0 peaks at 300 MiB live, device 1 at 64 MiB; the same addresses on both devices
    // are different blocks.
    let mib = 1u64 << 20;
    let lines = [
        format!(
            r#"{{"action":"alloc","addr":1,"size":{},"device":0}}"#,
            100 * mib
        ),
        format!(
            r#"{{"action":"alloc","addr":1,"size":{},"device":1}}"#,
            64 * mib
        ),
        format!(
            r#"{{"action":"alloc","addr":2,"size":{},"device":0}}"#,
            200 * mib
        ),
        r#"{"action":"free","addr":1,"device":0}"#.to_string(),
        r#"{"action":"free","addr":1,"device":1}"#.to_string(),
        r#"{"action":"free","addr":2,"device":0}"#.to_string(),
    ];
    std::fs::write(&path, lines.join("\n")).unwrap();
    let (ok, out, err) = gpumem(&[
        "replay",
        path.to_str().unwrap(),
        "-a",
        "paged,torch",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trace"]["devices"], serde_json::json!([0, 1]));
    assert_eq!(v["trace"]["peak_requested_bytes"], 364 * mib);
    for a in v["allocators"].as_array().unwrap() {
        let per = a["per_device"].as_array().unwrap();
        assert_eq!(per.len(), 2, "{a}");
        assert_eq!(per[0]["peak_requested_bytes"], 300 * mib);
        assert_eq!(per[1]["peak_requested_bytes"], 64 * mib);
        let sum: u64 = per
            .iter()
            .map(|d| d["peak_reserved_bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(a["peak_reserved_bytes"].as_u64().unwrap(), sum);
    }
    let _ = std::fs::remove_file(path);
}

fn jsonl_trace(tag: &str, lines: &[String]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("gpumem-{tag}-{}.jsonl", std::process::id()));
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
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
    let (ok, out, err) = gpumem(&[
        "replay",
        p,
        "-a",
        "buddy,tlsf",
        "--capacity",
        "155GiB",
        "--min-capacity",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let buddy = &v["allocators"][0];
    let reason = buddy["min_capacity"][0]["never_completes"]["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("{buddy}"));
    assert!(reason.contains("rounding"), "{reason}");
    assert!(!reason.contains("single request"), "{reason}");
    assert_eq!(v["allocators"][1]["min_capacity_bytes"], 150 * g);
    let (ok, out, err) = gpumem(&[
        "replay",
        p,
        "-a",
        "buddy,tlsf",
        "--capacity",
        "155GiB",
        "--min-capacity",
    ]);
    assert!(ok, "{err}");
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
    let (ok, out, err) = gpumem(&["replay", path.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for a in v["allocators"].as_array().unwrap() {
        let failed = a["oom_count"].as_u64().unwrap() + a["refused_count"].as_u64().unwrap();
        assert!((1..=3).contains(&failed), "{a}");
        assert!(a["reserved_over_requested"].as_f64().unwrap() >= 1.0, "{a}");
    }
    let (ok, out, err) = gpumem(&["replay", path.to_str().unwrap(), "-a", "buddy"]);
    assert!(ok, "{err}");
    assert!(out.contains("refused event index 1"), "{out}");
    let _ = std::fs::remove_file(path);
}

/// Issue 10's capacity edges.
#[test]
fn capacity_edges_warn_or_refuse_clearly() {
    // res/req stays a ratio of what was served, the first OOM is named, the row is marked.
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "tlsf",
        "--capacity",
        "3GiB",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = &v["allocators"][0];
    assert!(a["reserved_over_requested"].as_f64().unwrap() >= 1.0, "{a}");
    assert!(a["first_oom_event"].as_u64().is_some(), "{a}");
    assert!(v["semantics"].as_str().unwrap().contains("would raise"));
    let (ok, out, _) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "tlsf",
        "--capacity",
        "3GiB",
    ]);
    assert!(
        ok && out.contains('†') && out.contains("first OOM"),
        "{out}"
    );
    // A bare number is bytes: warned, not silently failed.
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "tlsf",
        "--capacity",
        "1B",
    ]);
    assert!(
        ok && err.contains("smaller than the trace's largest request"),
        "{err}"
    );
    assert!(err.contains("without a unit is bytes"), "{err}");
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "--capacity",
        "18446744073709551615",
    ]);
    assert!(
        !ok && err.contains("address space") && !err.contains("internal"),
        "{err}"
    );
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "tlsf",
        "--segment-size",
        "1B",
    ]);
    assert!(ok && err.contains("rounded up"), "{err}");
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "all,tlsf",
        "--json",
    ]);
    assert!(ok, "{err}");
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
    let (ok, out, err) = gpumem(&[
        "replay",
        path.to_str().unwrap(),
        "-a",
        "tlsf",
        "--min-capacity",
        "--json",
    ]);
    assert!(ok, "{err}");
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

/// Runs gpumem with `input` on its standard input.
fn gpumem_stdin(args: &[&str], input: &[u8]) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(args)
        .current_dir(repo())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || {
        // The reader may stop early (a refused input): a broken pipe is fine.
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const FIXTURES: &str = "crates/gpumem/tests/fixtures";

/// Issue 9 item 2: a recorded OOM gets a verdict per allocator, above the table and in --json.
#[test]
fn recorded_oom_gets_a_verdict_per_allocator() {
    let f = format!("{FIXTURES}/recorded_oom.pickle");
    let (ok, out, err) = gpumem(&["replay", &f, "-a", "torch,paged", "--json"]);
    assert!(ok, "{err}");
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
    let (ok, out, err) = gpumem(&["replay", &f, "-a", "torch,paged"]);
    assert!(ok, "{err}");
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
    let (_, out, _) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "tlsf",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["recorded_ooms"], serde_json::json!([]));
}

/// Issue 9 item 3: a snapshot with nothing in it is explained (and, since the QA pass, exits
/// non-zero).
#[test]
fn empty_snapshot_says_how_to_record() {
    let f = format!("{FIXTURES}/no_recording.pickle");
    // Explained, on one line, and an error: there is nothing to replay.
    let (ok, out, err) = gpumem(&["replay", &f]);
    assert!(!ok, "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("_record_memory_history(max_entries="), "{err}");
    assert!(err.contains("_dump_snapshot"), "{err}");
    let (ok, out, err) = gpumem(&["replay", &f, "--json"]);
    assert!(!ok && err.contains("nothing to replay"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["recording"], "empty");
    assert!(v["explanation"]
        .as_str()
        .unwrap()
        .contains("before the model is loaded"));
}

/// Issue 9 items 4 and 8: what a lenient read skipped (first five, "and N more"), a salvaged
/// truncation, and warnings about key typos.
#[test]
fn lenient_reads_say_what_they_skipped_and_salvaged() {
    let dir = std::env::temp_dir().join(format!("gpumem-cli-lenient-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut lines = String::from("{\"action\":\"alloc\",\"addr\":1,\"size\":64,\"strem\":3}\n");
    for i in 0..8 {
        lines.push_str(&format!("{{\"action\":\"free\",\"addr\":{}}}\n", 100 + i));
    }
    let f = dir.join("bad.jsonl");
    std::fs::write(&f, lines).unwrap();
    let (ok, _, err) = gpumem(&["replay", f.to_str().unwrap(), "--lenient", "-a", "tlsf"]);
    assert!(ok, "{err}");
    assert_eq!(err.matches("  skipped: line").count(), 5, "{err}");
    assert!(err.contains("... and 3 more skipped"), "{err}");
    assert!(
        err.contains("line 1: unknown key \"strem\" ignored; did you mean \"stream\"?"),
        "{err}"
    );
    let snap = std::fs::read(repo().join(FIXTURES).join("recorded_oom.pickle")).unwrap();
    let cut = dir.join("cut.pickle");
    std::fs::write(&cut, &snap[..snap.len() / 2]).unwrap();
    let (ok, _, err) = gpumem(&["replay", cut.to_str().unwrap(), "-a", "tlsf"]);
    assert!(!ok && err.contains("truncated"), "{err}");
    let (ok, _, err) = gpumem(&["replay", cut.to_str().unwrap(), "--lenient", "-a", "tlsf"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("truncated: the file is cut at byte offset") && err.contains("kept the "),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 9 items 6, 7 and 9: standard input, converting onto the input, segments-only
/// snapshots.
#[test]
fn convert_reads_stdin_refuses_its_input_and_keeps_segments() {
    let snap = std::fs::read(repo().join(FIXTURES).join("snapshot_p4.pickle.gz")).unwrap();
    let (ok, from_stdin, err) = gpumem_stdin(&["convert", "-"], &snap);
    assert!(ok, "{err}");
    let (ok, from_file, err) = gpumem(&["convert", &format!("{FIXTURES}/snapshot_p4.pickle.gz")]);
    assert!(ok, "{err}");
    assert_eq!(from_stdin, from_file);
    let (ok, out, err) = gpumem_stdin(&["replay", "-", "-a", "torch", "--json"], &snap);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trace"]["alloc_events"], 3);
    // Random bytes on standard input are refused on their first bytes.
    let noise: Vec<u8> = (0..4_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let (ok, _, err) = gpumem_stdin(&["replay", "-"], &noise);
    assert!(!ok && err.contains("binary data"), "{err}");

    let dir = std::env::temp_dir().join(format!("gpumem-cli-convert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let own = dir.join("t.jsonl");
    std::fs::write(&own, &from_file).unwrap();
    let spelled = format!("{}/./t.jsonl", dir.display());
    let (ok, _, err) = gpumem(&["convert", own.to_str().unwrap(), "-o", &spelled]);
    assert!(!ok && err.contains("that is the input file"), "{err}");
    assert_eq!(std::fs::read_to_string(&own).unwrap(), from_file);
    let out = dir.join("out.jsonl");
    let (ok, _, err) = gpumem(&[
        "convert",
        own.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), from_file);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".gpumem-"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");

    // Segments only: the allocated blocks become preexisting lines, and the file replays.
    let seg = dir.join("segments.jsonl");
    let (ok, _, err) = gpumem(&[
        "convert",
        &format!("{FIXTURES}/segments_only.pickle"),
        "-o",
        seg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("written as preexisting"), "{err}");
    let text = std::fs::read_to_string(&seg).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("\"action\":\"preexisting\"") && text.contains("\"size\":1000"));
    let (ok, out, err) = gpumem(&["replay", seg.to_str().unwrap(), "-a", "torch", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trace"]["peak_requested_bytes"], 1000);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn torch_conf_and_the_emulation_self_check() {
    // The trace's own (native) setting on the recorded addresses: the self-check passes.
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "torch",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["allocators"][0];
    assert_eq!(t["torch_conf"], "native");
    assert_eq!(t["emulation_check"]["result"], "matches");
    assert_eq!(t["emulation_check"]["calls"], 59);
    // PyTorch's figure beside the trace: 6,738,149,376 bytes (native).
    assert_eq!(t["peak_reserved_bytes"], 6_738_149_376u64);
    let (ok, out, err) = gpumem(&["replay", "traces/mixed_sizes.pickle.gz", "-a", "torch"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("torch emulation matches the recorded cudaMalloc sequence (59 calls)"),
        "{out}"
    );
    assert!(
        err.contains("PYTORCH_CUDA_ALLOC_CONF native (the trace's own allocator_settings)"),
        "{err}"
    );
    // Another setting: no self-check (the sequence differs by design), PyTorch's figure for
    // expandable segments: 5,429,526,528 bytes.
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "torch",
        "--torch-conf",
        "expandable_segments:True",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["allocators"][0];
    assert_eq!(t["torch_conf"], "expandable_segments:True");
    assert!(t.get("emulation_check").is_none());
    assert_eq!(t["peak_reserved_bytes"], 5_429_526_528u64);
    // garbage_collection_threshold under --capacity (the memory limit): the run completes
    // at 6 GiB, so the smallest capacity found is at most that.
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "torch",
        "--torch-conf",
        "garbage_collection_threshold:0.6",
        "--capacity",
        "6GiB",
        "--min-capacity",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["allocators"][0];
    assert_eq!(t["oom_count"], 0);
    let floor = v["trace"]["peak_requested_bytes"].as_u64().unwrap();
    let min = t["min_capacity_bytes"].as_u64().unwrap();
    assert!(min >= floor && min <= 6 << 30, "{min}");
    // A bad setting names the key.
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "--torch-conf",
        "max_split_size:128",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--torch-conf") && err.contains("max_split_size"),
        "{err}"
    );
}

fn cap_of(row: &serde_json::Value) -> u64 {
    row["min_capacity_bytes"].as_u64().unwrap()
}

#[test]
fn tune_ranks_settings_and_prints_the_export_line() {
    let (ok, out, err) = gpumem(&["tune", "traces/mixed_sizes.pickle.gz", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert!(rows.len() >= 17, "{}", rows.len());
    let cap = |r: &serde_json::Value| r["min_capacity_bytes"].as_u64().unwrap();
    for w in rows.windows(2) {
        assert!(cap(&w[0]) <= cap(&w[1]), "ranked by smallest capacity");
    }
    let native = rows.iter().find(|r| r["setting"] == "native").unwrap();
    assert_eq!(native["is_trace_setting"], true);
    assert_eq!(native["peak_reserved_bytes"], 6_738_149_376u64);
    let floor = v["peak_requested_bytes"].as_u64().unwrap();
    assert!(cap(&rows[0]) >= floor && cap(&rows[0]) <= cap(native));
    assert!(v["paged_min_capacity_bytes"].as_u64().unwrap() >= floor);
    // gpumem's settings for the plug-in, replayed as `replay` replays them.
    let plugin = v["plugin_rows"].as_array().unwrap();
    let confs: Vec<&str> = plugin
        .iter()
        .map(|r| r["gpumem_conf"].as_str().unwrap())
        .collect();
    assert_eq!(
        confs,
        ["", "grow_ahead=0.0156", "placement=pages", "strategy=paged"]
    );
    let paged = &plugin[3];
    assert_eq!(paged["strategy"], "paged");
    assert_eq!(paged["min_capacity_bytes"], v["paged_min_capacity_bytes"]);
    let (ok, rout, err) = gpumem(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "paged-lazy,paged",
        "--json",
        "--no-plan",
    ]);
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(&rout).unwrap();
    for (row, a) in [
        (&plugin[0], &r["allocators"][0]),
        (paged, &r["allocators"][1]),
    ] {
        for key in [
            "peak_reserved_bytes",
            "steady_state_driver_calls",
            "modelled_driver_seconds",
        ] {
            assert_eq!(row[key], a[key], "{key} of {}", row["gpumem_conf"]);
        }
        assert_eq!(row["driver_calls_total"], a["driver_calls_total"]);
        // A key both commands print means one thing: the same JSON type in both (tune's
        // `driver_calls` was the total, replay's the calls by kind).
        for (key, value) in row.as_object().unwrap() {
            if let Some(theirs) = a.get(key).filter(|t| !t.is_null() && !value.is_null()) {
                assert_eq!(
                    std::mem::discriminant(value),
                    std::mem::discriminant(theirs),
                    "{key}: tune {value}, replay {theirs}"
                );
            }
        }
        assert!(row.get("driver_calls").is_none(), "{row}");
    }
    // The least memory of them is paged's, and each needs at least the peak requested.
    for row in plugin {
        let cap = row["min_capacity_bytes"].as_u64().unwrap();
        assert!(cap >= floor && cap >= cap_of(paged), "{row}");
    }
    let (ok, out, err) = gpumem(&["tune", "traces/mixed_sizes.pickle.gz", "--capacity", "6GiB"]);
    assert!(ok, "{err}");
    assert!(out.contains("garbage_collection_threshold:0.6"), "{out}");
    assert!(out.contains("export PYTORCH_CUDA_ALLOC_CONF="), "{out}");
    assert!(out.contains("gpumem plug-in, GPUMEM_CONF"), "{out}");
    assert!(out.contains("strategy=paged"), "{out}");
}

/// Issue 14: `report --torch-conf` configures the torch emulation as `replay --torch-conf`
/// does: under expandable_segments the page shows the same peak reserved as the replay's JSON,
/// and an unknown key is refused by name.
#[test]
fn report_takes_the_torch_conf_of_replay() {
    // A copy of the trace without PyTorch's *.stats.json beside it, so that the page holds no
    // recorded expandable_segments peak: that figure can only come from the emulation. (The
    // native peak is in the page anyway: the snapshot's own segments add up to it.)
    let dir = std::env::temp_dir().join(format!("gpumem-report-conf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("mixed.pickle.gz");
    std::fs::copy(repo().join("traces/mixed_sizes.pickle.gz"), &trace).unwrap();
    let t = trace.to_str().unwrap();
    let html = dir.join("report.html");
    let h = html.to_str().unwrap();
    let conf = "expandable_segments:True";
    let (ok, out, err) = gpumem(&["replay", t, "-a", "torch", "--torch-conf", conf, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let peak = v["allocators"][0]["peak_reserved_bytes"].as_u64().unwrap();
    let native = gpumem(&["replay", t, "-a", "torch", "--json"]);
    let vn: serde_json::Value = serde_json::from_str(&native.1).unwrap();
    let native_peak = vn["allocators"][0]["peak_reserved_bytes"].as_u64().unwrap();
    assert_ne!(native_peak, peak);
    let (ok, _, err) = gpumem(&["report", t, "-o", h, "-a", "torch", "--torch-conf", conf]);
    assert!(ok, "{err}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains(&peak.to_string()),
        "peak {peak} not in the page"
    );
    let (ok, _, err) = gpumem(&["report", t, "-o", h, "--torch-conf", "bogus:1"]);
    assert!(!ok);
    assert!(err.contains("bogus"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A reader that closes the pipe (`gpumem replay T | head -1`) ends gpumem quietly with exit
/// status 0, not with a "failed printing to stdout" panic.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    for args in [
        &["replay", "traces/mixed_sizes.pickle.gz", "-a", "tlsf"][..],
        &["tune", "traces/mixed_sizes.pickle.gz"][..],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(args)
            .current_dir(repo())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Close the reading end before gpumem prints anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
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
    let (ok, out, err) = gpumem(&["replay", path.to_str().unwrap(), "-a", "tlsf,paged"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("? (no segment events in the trace) reserved"),
        "{out}"
    );
    assert!(out.contains("tlsf: needs"), "{out}");
    assert!(!out.contains("short"), "{out}");
    let _ = std::fs::remove_file(path);
}

/// Flags that would change nothing say so: `--torch-conf` without the torch emulation, and a
/// garbage-collection threshold without a memory limit.
#[test]
fn flags_that_change_nothing_are_warned_about() {
    let t = "traces/mixed_sizes.pickle.gz";
    let (ok, _, err) = gpumem(&[
        "replay",
        t,
        "-a",
        "tlsf",
        "--torch-conf",
        "expandable_segments:True",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("--torch-conf configures the torch emulation only"),
        "{err}"
    );
    let (ok, _, err) = gpumem(&[
        "replay",
        t,
        "-a",
        "torch",
        "--torch-conf",
        "garbage_collection_threshold:0.8",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("acts only under a memory limit"), "{err}");
    let (ok, _, err) = gpumem(&[
        "replay",
        t,
        "-a",
        "torch",
        "--torch-conf",
        "garbage_collection_threshold:0.8",
        "--capacity",
        "8GiB",
    ]);
    assert!(ok, "{err}");
    assert!(!err.contains("acts only under a memory limit"), "{err}");
    // A fraction in the setting itself is a memory limit too (a trace recorded with it).
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/settings/seg_train-gc.pickle.gz",
        "-a",
        "torch",
        "--no-plan",
    ]);
    assert!(ok, "{err}");
    assert!(!err.contains("acts only under a memory limit"), "{err}");
}

#[test]
fn lazy_conf_notes_page_keys_that_segments_ignore() {
    let run = |conf: &str| {
        let (ok, out, err) = gpumem(&[
            "replay",
            "traces/resnet_train.pickle.gz",
            "-a",
            "paged-lazy",
            "--lazy-conf",
            conf,
            "--json",
        ]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        (v["allocators"][0].clone(), err)
    };
    let (plain, plain_err) = run("");
    let (headroom, headroom_err) = run("headroom=0.02,map_ahead=0");
    let (_, pages_err) = run("placement=pages,headroom=0.02");
    let (_, grow_pages_err) = run("placement=pages,grow_ahead=0.01");
    assert!(
        grow_pages_err.contains("grow_ahead tunes placement=segments"),
        "{grow_pages_err}"
    );
    assert!(!pages_err.contains("grow_ahead"), "{pages_err}");
    assert!(!plain_err.contains("placement=pages only"), "{plain_err}");
    assert!(!pages_err.contains("placement=pages only"), "{pages_err}");
    let note: Vec<&str> = headroom_err
        .lines()
        .filter(|l| l.contains("placement=pages only"))
        .collect();
    assert_eq!(note.len(), 1, "{headroom_err}");
    assert!(note[0].contains("headroom, map_ahead"), "{}", note[0]);
    assert!(note[0].contains("no effect"), "{}", note[0]);
    // And indeed no effect: the same peak and driver calls as the defaults.
    assert_eq!(
        plain["peak_reserved_bytes"],
        headroom["peak_reserved_bytes"]
    );
    assert_eq!(plain["driver_calls_total"], headroom["driver_calls_total"]);
}

#[test]
fn lazy_conf_sets_the_paged_lazy_trade_and_names_bad_items() {
    let replay = |conf: &str| {
        gpumem(&[
            "replay",
            "traces/mixed_sizes.pickle.gz",
            "-a",
            "paged-lazy",
            "--lazy-conf",
            conf,
            "--json",
        ])
    };
    let run = |conf: &str| {
        let (ok, out, err) = replay(conf);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["allocators"][0].clone()
    };
    let default = run("");
    let pages = run("placement=pages");
    let small = run("placement=pages,max_handle=2MiB,map_ahead=0");
    assert_eq!(
        default["lazy_conf"],
        "placement=segments,headroom=0,max_handle=1073741824,map_ahead=1073741824,grow_ahead=0"
    );
    assert_eq!(
        small["lazy_conf"],
        "placement=pages,headroom=0,max_handle=2097152,map_ahead=0,grow_ahead=0"
    );
    // The two placements are different allocators: not the same peak and calls.
    assert_ne!(
        (
            &default["peak_reserved_bytes"],
            &default["driver_calls_total"]
        ),
        (&pages["peak_reserved_bytes"], &pages["driver_calls_total"])
    );
    // One handle per page: more calls than the default's handles of up to 1 GiB.
    assert!(
        small["driver_calls_total"].as_u64() > pages["driver_calls_total"].as_u64(),
        "{small} vs {pages}"
    );
    // Growing ahead by 10 % of the bytes held: fewer growths (calls) for a higher peak.
    let grow = run("grow_ahead=0.1");
    assert_eq!(
        grow["lazy_conf"],
        "placement=segments,headroom=0,max_handle=1073741824,map_ahead=1073741824,grow_ahead=0.1"
    );
    assert!(
        grow["driver_calls_total"].as_u64() < default["driver_calls_total"].as_u64(),
        "{grow} vs {default}"
    );
    assert!(
        grow["peak_reserved_bytes"].as_u64() > default["peak_reserved_bytes"].as_u64(),
        "{grow} vs {default}"
    );
    for (bad, words) in [
        ("headroom=2%", ["`2%`", "`headroom`"]),
        (
            "colour=red",
            [
                "`colour`",
                "placement, headroom, max_handle, map_ahead or grow_ahead",
            ],
        ),
        ("max_handle=0", ["max_handle", "above 0"]),
        ("placement=torch", ["`placement`", "segments or pages"]),
        ("grow_ahead=2", ["`grow_ahead`", "from 0 to 1"]),
    ] {
        let (ok, _, err) = replay(bad);
        assert!(!ok, "{bad} accepted");
        for w in words {
            assert!(err.contains(w), "{bad}: {err}");
        }
    }
}

#[test]
fn replay_reports_the_planned_layout_of_the_trace() {
    // a [0, 2) and b [1, 4) of 1 KiB, c [3, 4) of 2 KiB. Online, c cannot use a's 1 KiB
    // hole; with the whole trace known, c goes first at 0, a shares its addresses (they are
    // never live together) and b sits above: 3 KiB, the peak of live bytes (b + c).
    let path = std::env::temp_dir().join(format!("gpumem-plan-{}.jsonl", std::process::id()));
    std::fs::write(
        &path,
        [
            r#"{"action":"alloc","addr":1,"size":1000}"#,
            r#"{"action":"alloc","addr":2,"size":1000}"#,
            r#"{"action":"free","addr":1}"#,
            r#"{"action":"alloc","addr":3,"size":2000}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let (ok, out, err) = gpumem(&["replay", p, "-a", "tlsf", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let plan = &v["trace"]["planned_layout"][0];
    assert_eq!(plan["device"], 0);
    assert_eq!(plan["blocks"], 3);
    assert_eq!(plan["peak_live_bytes"], 3072);
    assert_eq!(plan["layout_bytes"], 3072);
    assert!((plan["over_requested"].as_f64().unwrap() - 3072.0 / 3000.0).abs() < 1e-9);
    let (ok, out, err) = gpumem(&["replay", p, "-a", "tlsf"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("planned layout (the whole trace known in advance, no block ever moved): 3.00 KiB (1.024)"),
        "{out}"
    );
    // --no-plan: no layout, the JSON and the table say it was skipped and why, and the
    // allocators' figures are those of the run with the plan.
    let (ok, with_plan, err) = gpumem(&["replay", p, "-a", "tlsf", "--json"]);
    assert!(ok, "{err}");
    let (ok, out, err) = gpumem(&["replay", p, "-a", "tlsf", "--json", "--no-plan"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trace"]["planned_layout"], serde_json::json!([]));
    assert_eq!(
        v["trace"]["planned_layout_skipped"],
        "not asked for: --no-plan"
    );
    let w: serde_json::Value = serde_json::from_str(&with_plan).unwrap();
    assert!(
        w["trace"].get("planned_layout_skipped").is_none(),
        "{with_plan}"
    );
    for key in [
        "peak_reserved_bytes",
        "reserved_over_requested",
        "driver_calls",
        "steady_state_driver_calls",
        "modelled_driver_seconds",
    ] {
        assert_eq!(v["allocators"][0][key], w["allocators"][0][key], "{key}");
    }
    let (ok, out, err) = gpumem(&["replay", p, "-a", "tlsf", "--no-plan"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("planned layout: skipped (not asked for: --no-plan)"),
        "{out}"
    );
    assert!(!out.contains("3.00 KiB (1.024)"), "{out}");
    std::fs::remove_file(&path).ok();
}

/// The res/req cell of each allocator's row of a replay table (cells are right-aligned under
/// their header).
fn res_req_cells(table: &str) -> Vec<(String, String)> {
    let mut lines = table.lines().skip_while(|l| !l.starts_with("allocator"));
    let header: Vec<char> = lines.next().unwrap().chars().collect();
    let h: String = header.iter().collect();
    let end = h[..h.find("res/req").unwrap()].chars().count() + "res/req".len();
    lines
        // The rows end at a blank line or the lines printed under them.
        .take_while(|l| {
            !l.trim().is_empty() && !l.starts_with("planned layout") && !l.starts_with("PyTorch")
        })
        .map(|l| {
            let row: Vec<char> = l.chars().collect();
            let upto: String = row[..end.min(row.len())].iter().collect();
            let name = upto.split_whitespace().next().unwrap().to_string();
            (name, upto.split_whitespace().last().unwrap().to_string())
        })
        .collect()
}

/// New-user trial: with no byte requested (zero-byte requests only, or a capacity under which
/// every allocation fails) there is no res/req: the table shows `-` (marked † where
/// allocations failed), `--json` keeps 0; with bytes served the ratio is at least 1.
#[test]
fn res_req_is_a_dash_when_nothing_was_requested() {
    let path = jsonl_trace(
        "zero-size",
        &[
            r#"{"action":"alloc","addr":1,"size":0}"#.to_string(),
            r#"{"action":"alloc","addr":2,"size":0}"#.to_string(),
            r#"{"action":"free","addr":1}"#.to_string(),
        ],
    );
    let p = path.to_str().unwrap();
    let (ok, out, err) = gpumem(&["replay", p]);
    assert!(ok, "{err}");
    let cells = res_req_cells(&out);
    assert_eq!(cells.len(), 6, "{out}");
    for (name, cell) in &cells {
        assert_eq!(cell, "-", "{name}: {out}");
    }
    assert!(out.contains("no block ever moved): 1.00 KiB (-)"), "{out}");
    let (ok, out, err) = gpumem(&["replay", p, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for a in v["allocators"].as_array().unwrap() {
        assert_eq!(a["peak_requested_served_bytes"], 0, "{a}");
        assert_eq!(a["reserved_over_requested"].as_f64(), Some(0.0), "{a}");
    }
    let _ = std::fs::remove_file(&path);
    // Every allocation fails: `-†`, not 0.000†.
    let trace = "traces/mixed_sizes.pickle.gz";
    let (ok, out, err) = gpumem(&["replay", trace, "-a", "torch,paged", "--capacity", "5"]);
    assert!(ok, "{err}");
    let cells = res_req_cells(&out);
    assert_eq!(cells.len(), 2, "{out}");
    for (name, cell) in &cells {
        assert_eq!(cell, "-†", "{name}: {out}");
    }
    // Some served: a ratio of at least 1, marked.
    let (ok, out, err) = gpumem(&["replay", trace, "-a", "torch", "--capacity", "3GiB"]);
    assert!(ok, "{err}");
    let (_, cell) = &res_req_cells(&out)[0];
    let r: f64 = cell.trim_end_matches('†').parse().unwrap();
    assert!(r >= 1.0 && cell.ends_with('†'), "{cell}: {out}");
}

/// New-user trial: counts of one are singular ("1 event (1 alloc, 0 frees)").
#[test]
fn counts_of_one_are_singular() {
    let path = jsonl_trace(
        "one-event",
        &[r#"{"action":"alloc","addr":1,"size":4096}"#.to_string()],
    );
    let p = path.to_str().unwrap();
    let (ok, out, err) = gpumem(&["replay", p, "-a", "tlsf"]);
    assert!(ok, "{err}");
    assert!(out.contains(": 1 event (1 alloc, 0 frees), peak"), "{out}");
    assert!(err.contains("(JsonLines, 1 event, "), "{err}");
    let jsonl = std::env::temp_dir().join(format!("gpumem-one-out-{}.jsonl", std::process::id()));
    let (ok, _, err) = gpumem(&["convert", p, "-o", jsonl.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        err.contains("wrote 1 event and 0 pre-existing blocks to"),
        "{err}"
    );
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&jsonl);
}

/// New-user trial: standard input has one name, `standard input`, on success as in errors.
#[test]
fn standard_input_has_one_name() {
    let good =
        b"{\"action\":\"alloc\",\"addr\":1,\"size\":4096}\n{\"action\":\"free\",\"addr\":1}\n";
    let (ok, out, err) = gpumem_stdin(&["replay", "-", "-a", "tlsf"], good);
    assert!(ok, "{err}");
    assert!(
        err.starts_with("read standard input (JsonLines, 2 events"),
        "{err}"
    );
    assert!(out.starts_with("trace standard input: 2 events"), "{out}");
    let (ok, _, err) = gpumem_stdin(&["replay", "-"], b"{\"action\":\"free\",\"addr\":1}\n");
    assert!(!ok);
    assert!(
        err.contains("standard input: line 1: free of address 1 (0x1)"),
        "{err}"
    );
    assert!(!err.contains(" -:") && !err.contains("read -"), "{err}");
}

/// New-user trial: a negative size reaches the size parser, which says what it expected
/// (clap called `-1` an unexpected argument).
#[test]
fn a_negative_size_is_refused_as_one() {
    let trace = "traces/mixed_sizes.pickle.gz";
    for args in [
        &["replay", trace, "--capacity", "-1"][..],
        &["replay", trace, "--capacity", "-1GiB"],
        &["replay", trace, "--segment-size", "-5"],
        &["tune", trace, "--capacity", "-1"],
        &["report", trace, "--capacity", "-1"],
    ] {
        let (ok, _, err) = gpumem(args);
        assert!(!ok, "{args:?}");
        // These sizes must be above zero (a 0 is refused too).
        assert!(
            err.contains("`: expected a size > 0, such as 8GiB"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
    }
    // A flag where a size was expected is named as the value it is.
    let (ok, _, err) = gpumem(&["replay", trace, "--capacity", "--json"]);
    assert!(!ok);
    assert!(
        err.contains("invalid value '--json' for '--capacity <CAPACITY>'"),
        "{err}"
    );
}

/// A trace recorded in a warm process: the CLI says which segments the emulation starts
/// from, and its figures are PyTorch's own (traces/warm_process/seg_train.stats.json).
#[test]
fn warm_process_trace_starts_from_its_segments() {
    let (ok, out, err) = gpumem(&[
        "replay",
        "traces/warm_process/seg_train.pickle.gz",
        "-a",
        "torch,tlsf",
        "--json",
        "--no-plan",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let torch = &v["allocators"][0];
    assert_eq!(torch["name"], "torch");
    assert_eq!(torch["emulation_check"]["result"], "matches", "{out}");
    assert_eq!(torch["peak_reserved_bytes"], 5_630_853_120u64);
    assert_eq!(torch["peak_allocated_bytes"], 5_097_814_528u64);
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/warm_process/seg_train.pickle.gz",
        "-a",
        "torch",
        "--no-plan",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("2 segments made before recording started (no event of the trace made them); the torch emulation starts from them"),
        "{err}"
    );
    // Without torch in the list the line is not printed.
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/warm_process/seg_train.pickle.gz",
        "-a",
        "tlsf",
        "--no-plan",
    ]);
    assert!(ok, "{err}");
    assert!(!err.contains("segments made before"), "{err}");
}

/// A snapshot with CUDA-graph private pools: the torch emulation says it does not model them.
#[test]
fn private_pools_are_named_as_not_modelled() {
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/limits/graph_infer.pickle.gz",
        "-a",
        "torch",
        "--no-plan",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("3 segments of the snapshot belong to CUDA-graph private pools"),
        "{err}"
    );
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/limits/graph_infer.pickle.gz",
        "-a",
        "tlsf",
        "--no-plan",
    ]);
    assert!(ok, "{err}");
    assert!(!err.contains("private pools"), "{err}");
}
