//! `gpumem tune`: the ranking, the export line, its JSON, devices and threads.
use crate::common::{args, gpumem, gpumem_ok, one_line_error, scratch, write_file};

fn cap_of(row: &serde_json::Value) -> u64 {
    row["min_capacity_bytes"].as_u64().unwrap()
}

#[test]
fn tune_ranks_settings_and_prints_the_export_line() {
    let (out, _) = gpumem_ok(&["tune", "traces/mixed_sizes.pickle.gz", "--json"]);
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
    let (rout, _) = gpumem_ok(&args(
        "replay traces/mixed_sizes.pickle.gz -a paged-lazy,paged --json --no-plan",
    ));
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
    let (out, _) = gpumem_ok(&["tune", "traces/mixed_sizes.pickle.gz", "--capacity", "6GiB"]);
    assert!(out.contains("garbage_collection_threshold:0.6"), "{out}");
    assert!(out.contains("export PYTORCH_CUDA_ALLOC_CONF="), "{out}");
    assert!(out.contains("gpumem plug-in, GPUMEM_CONF"), "{out}");
    assert!(out.contains("strategy=paged"), "{out}");
}

/// `tune --capacity 24GiB` on gpt2_train: native's replay fails at 24 GiB, and so do those of
/// every gpumem setting but `strategy=paged`. A failed run's driver time is no reference and
/// not comparable: the rows that fail show `OOM` in the driver-time column (they showed
/// `0.94 × nat.`, ÷ native's failed run), `strategy=paged` its time in ms, and the reason
/// says native's OOM leaves no bound (it said "every gpumem setting within 2 × native's
/// driver time has an OOM", judging them by those failed runs).
#[test]
fn tune_says_why_no_gpumem_setting_is_picked() {
    let (out, _) = gpumem_ok(&["tune", "traces/gpt2_train.pickle.gz", "--capacity", "24GiB"]);
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
    let (out, _) = gpumem_ok(&["tune", "traces/multigpu/two_devices.jsonl"]);
    let header = out.lines().next().unwrap();
    assert!(
        header.contains("device 0 of 2 (devices 0, 1; --trace-device N tunes another)"),
        "{header}"
    );
    let (out, _) = gpumem_ok(&args(
        "tune traces/multigpu/two_devices.jsonl --trace-device 1 --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["device"], 1);
    assert_eq!(v["trace_devices"], serde_json::json!([0, 1]));
}

/// The README: a zero peak requested shows as `-` in every table, `tune`'s included.
#[test]
fn tune_shows_a_dash_where_nothing_was_requested() {
    let (out, _) = gpumem_ok(&["tune", "traces/mixed_sizes.pickle.gz", "--capacity", "1MiB"]);
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
    let (out, _) = gpumem_ok(&args(
        "tune traces/mixed_sizes.pickle.gz --capacity 1MiB --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rows"][0]["reserved_over_requested"].as_f64(), Some(0.0));
}

/// `tune --threads N` reports the threads it ran, at most one per setting (it said "on 1000
/// threads" for 21 replays).
#[test]
fn tune_reports_the_threads_it_ran() {
    let (out, _) = gpumem_ok(&args(
        "tune crates/gpumem/tests/fixtures/sample.jsonl --threads 1000 --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let settings = v["rows"].as_array().unwrap().len() + v["plugin_rows"].as_array().unwrap().len();
    assert_eq!(v["threads"].as_u64(), Some(settings as u64), "{out}");
    let (_, err) = gpumem_ok(&args(
        "tune crates/gpumem/tests/fixtures/sample.jsonl --threads 1000",
    ));
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.ends_with(&format!("on {settings} threads"))
            && last.contains(" GPUMEM_CONF settings in "),
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
    let (out, _) = gpumem_ok(&["tune", t, "--capacity", "2GiB"]);
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
    let (out, _) = gpumem_ok(&["tune", "traces/validation/resnet_infer.pickle.gz"]);
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

/// `tune --json` has the settings its table exports (it had the rows only: a script had to
/// redo the ranking's OOM rule and the plug-in's 2 × native driver-time rule); null where the
/// table exports none, "" for PyTorch's defaults and the plug-in's.
#[test]
fn tune_json_has_what_the_table_exports() {
    let (out, _) = gpumem_ok(&["tune", "traces/gpt2_train.pickle.gz", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["recommended_pytorch_cuda_alloc_conf"],
        "expandable_segments:True"
    );
    assert_eq!(v["recommended_gpumem_conf"], "placement=pages");
    let (table, _) = gpumem_ok(&["tune", "traces/gpt2_train.pickle.gz"]);
    assert!(table.contains("\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"));
    assert!(table.contains("\nexport GPUMEM_CONF=placement=pages\n"));
    let (out, _) = gpumem_ok(&args(
        "tune traces/warm_process/seg_train.pickle.gz --capacity 2GiB --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["recommended_pytorch_cuda_alloc_conf"].is_null(), "{out}");
    assert!(v["recommended_gpumem_conf"].is_null(), "{out}");
}

/// `tune` on a trace whose requests are all of 0 bytes: native makes no driver time, and a
/// setting that makes none either is within 2 × of it (it said that none was, as the ratio
/// 0 ÷ 0 is undefined), so the plug-in's defaults are recommended.
#[test]
fn tune_recommends_a_setting_when_native_makes_no_driver_time() {
    let dir = scratch("tune-zero");
    let trace = dir.join("zero.jsonl");
    write_file(
        &trace,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":0}\n{\"action\":\"free\",\"addr\":1}\n",
    );
    let (out, _) = gpumem_ok(&["tune", trace.to_str().unwrap()]);
    assert!(
        out.contains(
            "unset GPUMEM_CONF  # the plug-in's defaults (paged-lazy)\n  needs 2.00 MiB: the least memory of gpumem's settings within 2 × native's driver time"
        ),
        "{out}"
    );
    assert!(!out.contains("none of gpumem's settings"), "{out}");
}
