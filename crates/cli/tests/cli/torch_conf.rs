//! The torch emulation and its settings: `--torch-conf`, `--lazy-conf`, segments made before recording, private pools.
use crate::common::{args, gpumem, gpumem_ok, one_line_error, scratch};

#[test]
fn torch_conf_and_the_emulation_self_check() {
    // The trace's own (native) setting on the recorded addresses: the self-check passes.
    let (out, _) = gpumem_ok(&args("replay traces/mixed_sizes.pickle.gz -a torch --json"));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["allocators"][0];
    assert_eq!(t["torch_conf"], "native");
    assert_eq!(t["emulation_check"]["result"], "matches");
    assert_eq!(t["emulation_check"]["calls"], 59);
    // PyTorch's figure beside the trace: 6,738,149,376 bytes (native).
    assert_eq!(t["peak_reserved_bytes"], 6_738_149_376u64);
    let (out, err) = gpumem_ok(&["replay", "traces/mixed_sizes.pickle.gz", "-a", "torch"]);
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
    let (out, _) = gpumem_ok(&args(
        "replay traces/mixed_sizes.pickle.gz -a torch --torch-conf expandable_segments:True --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["allocators"][0];
    assert_eq!(t["torch_conf"], "expandable_segments:True");
    assert!(t.get("emulation_check").is_none());
    assert_eq!(t["peak_reserved_bytes"], 5_429_526_528u64);
    // garbage_collection_threshold under --capacity (the memory limit): the run completes
    // at 6 GiB, so the smallest capacity found is at most that.
    let (out, _) = gpumem_ok(&args("replay traces/mixed_sizes.pickle.gz -a torch --torch-conf garbage_collection_threshold:0.6 --capacity 6GiB --min-capacity --json"));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["allocators"][0];
    assert_eq!(t["oom_count"], 0);
    let floor = v["trace"]["peak_requested_bytes"].as_u64().unwrap();
    let min = t["min_capacity_bytes"].as_u64().unwrap();
    assert!(min >= floor && min <= 6 << 30, "{min}");
    // A bad setting names the key.
    let (ok, _, err) = gpumem(&args(
        "replay traces/mixed_sizes.pickle.gz --torch-conf max_split_size:128",
    ));
    assert!(!ok);
    assert!(
        err.contains("--torch-conf") && err.contains("max_split_size"),
        "{err}"
    );
}

#[test]
fn lazy_conf_notes_page_keys_that_segments_ignore() {
    let run = |conf: &str| {
        let (out, err) = gpumem_ok(&[
            "replay",
            "traces/resnet_train.pickle.gz",
            "-a",
            "paged-lazy",
            "--lazy-conf",
            conf,
            "--json",
        ]);
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

/// A trace recorded in a warm process: the CLI says which segments the emulation starts
/// from, and its figures are PyTorch's own (traces/warm_process/seg_train.stats.json).
#[test]
fn warm_process_trace_starts_from_its_segments() {
    let (out, _) = gpumem_ok(&args(
        "replay traces/warm_process/seg_train.pickle.gz -a torch,tlsf --json --no-plan",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let torch = &v["allocators"][0];
    assert_eq!(torch["name"], "torch");
    assert_eq!(torch["emulation_check"]["result"], "matches", "{out}");
    assert_eq!(torch["peak_reserved_bytes"], 5_630_853_120u64);
    assert_eq!(torch["peak_allocated_bytes"], 5_097_814_528u64);
    let (_, err) = gpumem_ok(&args(
        "replay traces/warm_process/seg_train.pickle.gz -a torch --no-plan",
    ));
    assert!(
        err.contains("2 segments made before recording started (no event of the trace made them); the torch emulation starts from them"),
        "{err}"
    );
    // Without torch in the list the line is not printed.
    let (_, err) = gpumem_ok(&args(
        "replay traces/warm_process/seg_train.pickle.gz -a tlsf --no-plan",
    ));
    assert!(!err.contains("segments made before"), "{err}");
}

/// A snapshot with CUDA-graph private pools: the torch emulation says it does not model them.
#[test]
fn private_pools_are_named_as_not_modelled() {
    let (_, err) = gpumem_ok(&args(
        "replay traces/limits/graph_infer.pickle.gz -a torch --no-plan",
    ));
    assert!(
        err.contains("3 segments of the snapshot belong to CUDA-graph private pools"),
        "{err}"
    );
    let (_, err) = gpumem_ok(&args(
        "replay traces/limits/graph_infer.pickle.gz -a tlsf --no-plan",
    ));
    assert!(!err.contains("private pools"), "{err}");
}

/// `--torch-conf native` (the name `tune` prints for PyTorch's defaults) is taken, and the
/// line about segments made before recording says which ones the emulation can take in under
/// the setting given (seg_train's cudaMalloc segments under expandable_segments:True were said
/// to be taken in, "as PyTorch did").
#[test]
fn the_setting_given_decides_which_earlier_segments_are_taken_in() {
    let seg = "traces/warm_process/seg_train.pickle.gz";
    let (_, err) = gpumem_ok(&args("replay traces/warm_process/seg_train.pickle.gz -a torch --no-plan --torch-conf expandable_segments:True"));
    assert!(!err.contains("the torch emulation starts from"), "{err}");
    assert!(
        err.contains("2 cudaMalloc segments made before recording started are not of the kind expandable_segments:True makes"),
        "{err}"
    );
    let (_, err) = gpumem_ok(&["replay", seg, "-a", "torch", "--no-plan"]);
    assert!(
        err.contains("2 segments made before recording started (no event of the trace made them); the torch emulation starts from them"),
        "{err}"
    );
    let (_, err) = gpumem_ok(&args("replay traces/warm_process/gan_train_expandable.pickle.gz -a torch --no-plan --torch-conf native"));
    assert!(
        err.contains("PYTORCH_CUDA_ALLOC_CONF native (from --torch-conf)"),
        "{err}"
    );
    assert!(
        err.contains("1 expandable segment made before recording started is not of the kind"),
        "{err}"
    );
}

/// `replay --json`: where the torch emulation parts from the recorded cudaMalloc calls, the
/// call it made has the shape of the recorded one (it was serde's array for a tuple,
/// `["alloc",0,39845888]`, beside the object `{"kind":"alloc","addr":...,"bytes":...}`).
#[test]
fn the_emulated_call_of_a_divergence_is_an_object_like_the_recorded_one() {
    let (out, _) = gpumem_ok(&args(
        "replay traces/limits/graph_infer.pickle.gz -a torch --no-plan --json",
    ));
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

/// `report` and `map` take `--lazy-conf` as `replay` does (they could not show the settings
/// `tune` recommends), and the page names the settings each configurable allocator ran with.
#[test]
fn report_and_map_take_lazy_conf() {
    let t = "traces/mixed_sizes.pickle.gz";
    let map = |conf: &[&str]| {
        let mut args = args("map traces/mixed_sizes.pickle.gz -a paged-lazy --width 60 --lines 3");
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
    gpumem_ok(&[
        "report",
        t,
        "-a",
        "torch,paged-lazy",
        "--lazy-conf",
        "grow_ahead=0.0156",
        "-o",
        page.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("paged-lazy: <code>placement=segments,grow_ahead=0.0156</code> (PyTorch's expandable segments"),
        "settings row missing"
    );
    assert!(html.contains("torch: <code>PYTORCH_CUDA_ALLOC_CONF native</code>"));
    // The items that take effect, sizes in binary units (it listed every key, in bytes).
    gpumem_ok(&[
        "report",
        t,
        "-a",
        "paged-lazy",
        "--lazy-conf",
        "placement=pages,max_handle=64MiB",
        "-o",
        page.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("paged-lazy: <code>placement=pages,headroom=0,max_handle=64MiB,map_ahead=1GiB</code> (gpumem's page placement"),
        "settings row missing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tune` can export `GPUMEM_CONF=strategy=paged` (the least memory within 2 × native's
/// driver time on a short trace), and `report --help` offers `--lazy-conf` for what `tune`
/// recommends as `GPUMEM_CONF`; `--lazy-conf strategy=paged` said only "unknown key". It now
/// names the flag that replays that setting, for replay, report and map alike.
#[test]
fn lazy_conf_strategy_names_the_allocator_flag() {
    for cmd in ["replay", "report", "map"] {
        let mut args = vec![
            cmd,
            "traces/multigpu/two_devices.jsonl",
            "--lazy-conf",
            "strategy=paged",
        ];
        if cmd == "report" {
            args.extend(["-o", "-"]);
        }
        let (ok, out, err) = gpumem(&args);
        assert!(!ok, "{cmd}: {out}");
        one_line_error(&err);
        assert!(err.contains("unknown key `strategy`"), "{cmd}: {err}");
        assert!(
            err.contains("(GPUMEM_CONF=strategy=paged: --allocator paged)"),
            "{cmd}: {err}"
        );
    }
    // Another unknown key gets no such hint.
    let (ok, _, err) = gpumem(&args(
        "replay traces/multigpu/two_devices.jsonl --lazy-conf colour=red",
    ));
    assert!(!ok);
    assert!(!err.contains("--allocator"), "{err}");
}
