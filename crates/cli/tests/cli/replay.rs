//! `gpumem replay`: the table and its JSON, timelines, devices, warnings about flags.
use crate::common::{args, gpumem, gpumem_no_cuda, gpumem_ok, jsonl_trace, scratch, write_file};

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

#[test]
fn replay_json_has_the_documented_fields_for_every_allocator() {
    let (out, _) = gpumem_ok(&["replay", "traces/mixed_sizes.pickle.gz", "--json"]);
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
fn table_and_timeline() {
    let svg = std::env::temp_dir().join(format!("gpumem-timeline-{}.svg", std::process::id()));
    let (out, _) = gpumem_ok(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "torch,paged",
        "--timeline",
        svg.to_str().unwrap(),
    ]);
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
    gpumem_ok(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "torch,paged",
        "--capacity",
        "3GiB",
        "--timeline",
        svg.to_str().unwrap(),
    ]);
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
    gpumem_ok(&[
        "replay",
        trace.to_str().unwrap(),
        "-a",
        "tlsf",
        "--no-plan",
        "--timeline",
        svg.to_str().unwrap(),
    ]);
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
    let (out, _) = gpumem_ok(&args("replay traces/mixed_sizes.pickle.gz -a paged --json"));
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
    let (out, _) = gpumem_ok(&args(
        "replay traces/external/finetune_no_timestamps.pickle.gz -a paged --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["allocators"][0]["driver_share_of_trace"].is_null());
}

#[test]
fn external_snapshot_with_blocks_from_before_recording() {
    let (out, _) = gpumem_ok(&args(
        "replay traces/external/finetune_no_timestamps.pickle.gz -a torch --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["trace"]["preexisting_blocks"].as_u64().unwrap() > 0);
    assert_eq!(v["allocators"][0]["oom_count"], 0);
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
    write_file(&path, lines.join("\n"));
    let (out, _) = gpumem_ok(&[
        "replay",
        path.to_str().unwrap(),
        "-a",
        "paged,torch",
        "--json",
    ]);
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

/// Flags that would change nothing say so: `--torch-conf` without the torch emulation, and a
/// garbage-collection threshold without a memory limit.
#[test]
fn flags_that_change_nothing_are_warned_about() {
    let (_, err) = gpumem_ok(&args(
        "replay traces/mixed_sizes.pickle.gz -a tlsf --torch-conf expandable_segments:True",
    ));
    assert!(
        err.contains("--torch-conf configures the torch emulation only"),
        "{err}"
    );
    let (_, err) = gpumem_ok(&args("replay traces/mixed_sizes.pickle.gz -a torch --torch-conf garbage_collection_threshold:0.8"));
    assert!(err.contains("acts only under a memory limit"), "{err}");
    let (_, err) = gpumem_ok(&args("replay traces/mixed_sizes.pickle.gz -a torch --torch-conf garbage_collection_threshold:0.8 --capacity 8GiB"));
    assert!(!err.contains("acts only under a memory limit"), "{err}");
    // A fraction in the setting itself is a memory limit too (a trace recorded with it).
    let (_, err) = gpumem_ok(&args(
        "replay traces/settings/seg_train-gc.pickle.gz -a torch --no-plan",
    ));
    assert!(!err.contains("acts only under a memory limit"), "{err}");
}

#[test]
fn replay_reports_the_planned_layout_of_the_trace() {
    // a [0, 2) and b [1, 4) of 1 KiB, c [3, 4) of 2 KiB. Online, c cannot use a's 1 KiB
    // hole; with the whole trace known, c goes first at 0, a shares its addresses (they are
    // never live together) and b sits above: 3 KiB, the peak of live bytes (b + c).
    let path = std::env::temp_dir().join(format!("gpumem-plan-{}.jsonl", std::process::id()));
    write_file(
        &path,
        [
            r#"{"action":"alloc","addr":1,"size":1000}"#,
            r#"{"action":"alloc","addr":2,"size":1000}"#,
            r#"{"action":"free","addr":1}"#,
            r#"{"action":"alloc","addr":3,"size":2000}"#,
        ]
        .join("\n"),
    );
    let p = path.to_str().unwrap();
    let (out, _) = gpumem_ok(&["replay", p, "-a", "tlsf", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let plan = &v["trace"]["planned_layout"][0];
    assert_eq!(plan["device"], 0);
    assert_eq!(plan["blocks"], 3);
    assert_eq!(plan["peak_live_bytes"], 3072);
    assert_eq!(plan["layout_bytes"], 3072);
    assert!((plan["over_requested"].as_f64().unwrap() - 3072.0 / 3000.0).abs() < 1e-9);
    let (out, _) = gpumem_ok(&["replay", p, "-a", "tlsf"]);
    assert!(
        out.contains("planned layout (the whole trace known in advance, no block ever moved): 3.00 KiB (1.024)"),
        "{out}"
    );
    // --no-plan: no layout, the JSON and the table say it was skipped and why, and the
    // allocators' figures are those of the run with the plan.
    let (with_plan, _) = gpumem_ok(&["replay", p, "-a", "tlsf", "--json"]);
    let (out, _) = gpumem_ok(&["replay", p, "-a", "tlsf", "--json", "--no-plan"]);
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
    let (out, _) = gpumem_ok(&["replay", p, "-a", "tlsf", "--no-plan"]);
    assert!(
        out.contains("planned layout: skipped (not asked for: --no-plan)"),
        "{out}"
    );
    assert!(!out.contains("3.00 KiB (1.024)"), "{out}");
    std::fs::remove_file(&path).ok();
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
    let (out, _) = gpumem_ok(&["replay", p]);
    let cells = res_req_cells(&out);
    assert_eq!(cells.len(), 6, "{out}");
    for (name, cell) in &cells {
        assert_eq!(cell, "-", "{name}: {out}");
    }
    assert!(out.contains("no block ever moved): 1.00 KiB (-)"), "{out}");
    let (out, _) = gpumem_ok(&["replay", p, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for a in v["allocators"].as_array().unwrap() {
        assert_eq!(a["peak_requested_served_bytes"], 0, "{a}");
        assert_eq!(a["reserved_over_requested"].as_f64(), Some(0.0), "{a}");
    }
    let _ = std::fs::remove_file(&path);
    // Every allocation fails: `-†`, not 0.000†.
    let trace = "traces/mixed_sizes.pickle.gz";
    let (out, _) = gpumem_ok(&["replay", trace, "-a", "torch,paged", "--capacity", "5"]);
    let cells = res_req_cells(&out);
    assert_eq!(cells.len(), 2, "{out}");
    for (name, cell) in &cells {
        assert_eq!(cell, "-†", "{name}: {out}");
    }
    // Some served: a ratio of at least 1, marked.
    let (out, _) = gpumem_ok(&["replay", trace, "-a", "torch", "--capacity", "3GiB"]);
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
    let (out, err) = gpumem_ok(&["replay", p, "-a", "tlsf"]);
    assert!(out.contains(": 1 event (1 alloc, 0 frees), peak"), "{out}");
    assert!(err.contains("(JsonLines, 1 event, "), "{err}");
    let jsonl = std::env::temp_dir().join(format!("gpumem-one-out-{}.jsonl", std::process::id()));
    let (_, err) = gpumem_ok(&["convert", p, "-o", jsonl.to_str().unwrap()]);
    assert!(
        err.contains("wrote 1 event and 0 pre-existing blocks to"),
        "{err}"
    );
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&jsonl);
}

#[test]
fn replay_on_cuda_checks_the_driver_before_reading_the_trace() {
    let (code, _, err) =
        gpumem_no_cuda(&["replay", "/nonexistent/trace.jsonl", "--device", "cuda"]);
    assert_eq!(code, 1);
    assert!(err.starts_with("error: no NVIDIA driver"), "{err}");
}

/// Tables keep their columns for any figure: `tune`'s res/req of a trace of 1-byte requests
/// (2097152.000) pushed its row out of line; `--min-capacity` ended rows with spaces.
#[test]
fn tables_keep_their_columns_for_any_figure() {
    let dir = scratch("tables");
    let t = dir.join("one.jsonl");
    write_file(&t, "{\"action\":\"alloc\",\"addr\":1,\"size\":1}\n");
    let t = t.to_str().unwrap();
    let (out, _) = gpumem_ok(&["tune", t]);
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
    let (out, _) = gpumem_ok(&["replay", t, "--min-capacity", "--no-plan"]);
    assert!(out.lines().all(|l| l.trim_end() == l), "{out:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The `NAME.stats.json` beside the traces of `traces/validation/` (and warm_process,
/// settings, limits) is PyTorch's figure for the traced run: `replay` shows it as it shows
/// `NAME-native.stats.json` (it was never read, and 20 of the shipped traces had no PyTorch
/// figure under their table).
#[test]
fn the_traced_runs_own_stats_are_shown() {
    let t = "traces/validation/bert_finetune.pickle.gz";
    let (out, _) = gpumem_ok(&["replay", t, "-a", "torch", "--no-plan"]);
    assert!(
        out.contains("PyTorch's own peak reserved for this run (memory_stats beside the trace): traced run 4.05 GiB (1.090)"),
        "{out}"
    );
    let (out, _) = gpumem_ok(&["replay", t, "-a", "torch", "--no-plan", "--json"]);
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
        let (out, _) = gpumem_ok(&["replay", t, "-a", "torch", "--no-plan", "--json"]);
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

/// A segment larger than the device (`--segment-size 1TiB` for 1GiB) is warned about: the
/// segmented pools were refused at every growth, and the table showed 35 retries and a
/// driver time of 9016 % of the trace without a word why.
#[test]
fn a_segment_larger_than_the_device_is_warned_about() {
    let t = "traces/mixed_sizes.pickle.gz";
    let (_, err) = gpumem_ok(&args(
        "replay traces/mixed_sizes.pickle.gz --segment-size 1TiB -a buddy,tlsf,torch --no-plan",
    ));
    assert!(
        err.contains("warning: segments of 1.00 TiB (--segment-size) are larger than the device (139.8 GiB): buddy, tlsf ask for one, are refused"),
        "{err}"
    );
    // Not for allocators that size their own segments.
    let (ok, _, err) = gpumem(&args(
        "replay traces/mixed_sizes.pickle.gz --segment-size 1TiB -a torch --no-plan",
    ));
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
