use super::*;
use crate::trace::{read_bytes, ReadConfig};

/// A small trace: two 3 MiB blocks, one freed, then a 1 KiB block.
pub(crate) const SMALL: &str = r#"{"action":"alloc","addr":1,"size":3145728}
{"action":"alloc","addr":2,"size":3145728}
{"action":"free","addr":1}
{"action":"alloc","addr":3,"size":1024}
{"action":"free","addr":2}
{"action":"free","addr":3}
"#;

fn small_report(allocators: &[&str]) -> Report {
    let t = read_bytes("small.jsonl", SMALL.as_bytes(), ReadConfig::default()).unwrap();
    let cfg = ReportConfig {
        allocators: allocators.iter().map(|s| s.parse().unwrap()).collect(),
        ..ReportConfig::default()
    };
    build(&t, "small.jsonl", &cfg, &mut |_| {}).unwrap()
}

#[test]
fn blocks_and_peaks() {
    let r = small_report(&["torch"]);
    assert_eq!(r.blocks.len(), 3);
    assert_eq!(r.blocks[0].alloc_event, 0);
    assert_eq!(r.blocks[0].free_event, 2);
    assert_eq!(r.blocks[2].free_event, 5);
    assert_eq!(r.peak_requested_event, 1);
    assert_eq!(r.live_at(1), vec![0, 1]);
    assert_eq!(r.live_at(3), vec![1, 2]);
    let sites = r.sites_at_peak();
    assert_eq!(sites.len(), 1);
    assert_eq!(sites[0].blocks, 2);
    assert_eq!(sites[0].requested_bytes, 6 << 20);
}

#[test]
fn torch_map_follows_the_events() {
    let r = small_report(&["torch"]);
    let run = &r.runs[0];
    // A 3 MiB request takes a 20 MiB segment; the second is served from its remainder
    // (PyTorch splits large blocks), so one segment.
    let m1 = MemoryMap::at(run, &r.blocks, 1);
    assert_eq!(m1.rows.len(), 1);
    assert_eq!(m1.rows[0].bytes, 20 << 20);
    let t = m1.totals();
    assert_eq!(t[map::SpanState::Live as usize], 6 << 20);
    assert_eq!(t[map::SpanState::SplitRemainder as usize], 14 << 20);
    assert_eq!(m1.live_blocks(), 2);
    // The 1 KiB block took a 2 MiB segment of the small pool; after every free both
    // segments stay cached, whole.
    let end = MemoryMap::at(run, &r.blocks, 5);
    assert_eq!(end.rows.len(), 2);
    let t = end.totals();
    assert_eq!(t[map::SpanState::FreeCached as usize], 22 << 20);
    assert_eq!(end.live_blocks(), 0);
    // Every row's spans tile it.
    for m in [&m1, &end] {
        for row in &m.rows {
            let mut at = 0;
            for s in &row.spans {
                assert_eq!(s.offset, at);
                at += s.bytes;
            }
            assert_eq!(at, row.shown_bytes);
        }
    }
}

#[test]
fn paged_map_shows_mapped_and_unmapped_pages() {
    let r = small_report(&["paged"]);
    let run = &r.runs[0];
    assert!(run
        .regions
        .iter()
        .all(|x| x.kind == record::RegionKind::VaRange));
    let m = MemoryMap::at(run, &r.blocks, 1);
    let t = m.totals();
    assert_eq!(t[map::SpanState::Live as usize], 6 << 20);
    // 6 MiB on 2 MiB pages: three pages mapped, all under live blocks.
    assert_eq!(t[map::SpanState::IdleMapped as usize], 0);
    assert!(m.rows.iter().all(|row| row.shown_bytes <= row.bytes));
}

#[test]
fn columns_hold_the_replay_figures() {
    let r = small_report(&["best-fit"]);
    let run = &r.runs[0];
    let c = &run.columns;
    assert_eq!(c.len(), 6);
    assert_eq!(
        c.max[0],
        vec![
            3.0 * 1048576.0,
            6.0 * 1048576.0,
            3.0 * 1048576.0,
            3145728.0 + 1024.0,
            1024.0,
            0.0
        ]
    );
    assert_eq!(c.max[2][0], (256u64 << 20) as f64);
    assert_eq!(r.replays[0].peak_reserved_bytes, 256 << 20);
    assert_eq!(run.oom_count, 0);
}

#[test]
fn event_out_of_range_is_an_error() {
    let r = small_report(&["tlsf"]);
    assert!(matches!(
        r.map(0, Some(6)),
        Err(ReportError::EventOutOfRange {
            event: 6,
            events: 6
        })
    ));
    assert!(r.map(0, Some(5)).is_ok());
}

#[test]
fn a_block_live_before_recording_and_freed_by_event_0_is_placed_then_freed() {
    let mut t = crate::trace::Trace::default();
    t.preexisting.push(crate::trace::PreexistingBlock {
        addr: 9,
        size_bytes: 4 << 20,
        device: 0,
        freed_at_event: Some(0),
    });
    t.events = vec![
        crate::trace::Event::free(9, 4 << 20),
        crate::trace::Event::alloc(1, 1024),
    ];
    let cfg = ReportConfig {
        allocators: vec![Strategy::Tlsf],
        ..ReportConfig::default()
    };
    let r = build(&t, "x", &cfg, &mut |_| {}).unwrap();
    assert_eq!(r.blocks[0].free_event, 0);
    assert!(r.runs[0].placements[0].is_some());
    // After event 0 the pre-existing block is gone; after event 1 only the new one is live.
    assert_eq!(r.map(0, Some(0)).unwrap().live_blocks(), 0);
    let m = r.map(0, Some(1)).unwrap();
    assert_eq!(m.live_blocks(), 1);
    assert_eq!(m.totals()[0], 1024);
}

/// A stack recorded with C++ frames (`stacks="all"`) starts with the allocator's own native
/// frames; the site is the user's Python frame below them (it was `??:0
/// torch::unwind::unwind()` for every block, so one "site" held everything).
#[test]
fn the_site_of_a_stack_with_native_frames_is_the_users_python_frame() {
    let frames = [
        "??:0 torch::unwind::unwind()",
        "memory_snapshot.cpp:0 torch::cuda::(anonymous namespace)::gather_with_cpp()",
        ":0 c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)",
        "python_variable_methods.cpp:0 torch::autograd::THPVariable_to(_object*, _object*, _object*)",
        "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py:1370 convert",
        "??:0 _PyEval_EvalFrameDefault",
        "/work/scripts/record-traces.py:272 gan_train",
        "/work/scripts/record-traces.py:328 main",
    ];
    assert_eq!(
        site_frame(&frames),
        Some("/work/scripts/record-traces.py:272 gan_train")
    );
    // Python frames only: as before.
    assert_eq!(
        site_frame(&["torch/nn/functional.py:2380 linear", "model.py:40 forward"]),
        Some("model.py:40 forward")
    );
    // No user frame: the innermost Python frame, else the innermost.
    assert_eq!(
        site_frame(&[
            "??:0 torch::unwind::unwind()",
            "torch/nn/functional.py:2380 linear"
        ]),
        Some("torch/nn/functional.py:2380 linear")
    );
    assert_eq!(
        site_frame(&["??:0 torch::unwind::unwind()", "??:0 _start"]),
        Some("??:0 torch::unwind::unwind()")
    );
}

/// The comparison table of page `html`, parsed: the header's texts, then each row's cells as
/// (text, `data-bytes`).
#[allow(clippy::type_complexity)]
fn comparison_cells(html: &str) -> (Vec<String>, Vec<Vec<(String, Option<String>)>>) {
    let doc = scraper::Html::parse_document(html);
    let sel = |s: &str| scraper::Selector::parse(s).unwrap();
    let head = doc
        .select(&sel("#comparison thead th"))
        .map(|th| th.text().collect())
        .collect();
    let rows = doc
        .select(&sel("#comparison tbody tr"))
        .map(|tr| {
            tr.select(&sel("td"))
                .map(|td| {
                    let bytes = td.value().attr("data-bytes").map(str::to_string);
                    (td.text().collect(), bytes)
                })
                .collect()
        })
        .collect();
    (head, rows)
}

/// The page's comparison has `replay`'s inactive-split and retries columns, and a refused
/// column when an allocation was refused as impossible (it had none of the three).
#[test]
fn comparison_has_inactive_split_retries_and_refused() {
    let r = small_report(&["torch", "tlsf"]);
    let (head, rows) = comparison_cells(&html::render(&r));
    let col = |name: &str| head.iter().position(|h| h == name).unwrap();
    let (split, retries) = (col("inactive split (peak)"), col("retries"));
    assert!(!head.iter().any(|h| h == "refused"), "{head:?}");
    assert_eq!(rows.len(), 2);
    for (row, x) in rows.iter().zip(&r.replays) {
        assert_eq!(row.len(), head.len(), "{row:?}");
        let bytes = x.peak_inactive_split_bytes.to_string();
        assert_eq!(row[split].1.as_deref(), Some(bytes.as_str()), "{}", x.name);
        assert_eq!(row[retries].0, "0");
    }
    // torch: the 3 MiB blocks split one 20 MiB segment; with the first freed and the 1 KiB
    // block in a 2 MiB segment of the small pool, 3 MiB + the 14 MiB remainder + 2 MiB - 1 KiB
    // are free inside segments that hold live blocks.
    assert_eq!(r.replays[0].peak_inactive_split_bytes, (19 << 20) - 1024);

    let t = read_bytes(
        "refused.jsonl",
        b"{\"action\":\"alloc\",\"addr\":1,\"size\":18446744073709551615}\n\
          {\"action\":\"alloc\",\"addr\":2,\"size\":1000}\n\
          {\"action\":\"free\",\"addr\":2}\n",
        ReadConfig::default(),
    )
    .unwrap();
    let cfg = ReportConfig {
        allocators: vec![Strategy::Tlsf],
        ..ReportConfig::default()
    };
    let r = build(&t, "refused.jsonl", &cfg, &mut |_| {}).unwrap();
    let (head, rows) = comparison_cells(&html::render(&r));
    let refused = head.iter().position(|h| h == "refused").unwrap();
    assert_eq!(rows[0].len(), head.len());
    assert_eq!(rows[0][refused].0, "1");
}

/// The torch emulation's device that hands out the recorded addresses is built once per report
/// (it was built twice: for the recording and for the comparison replay), and both replays
/// start from it untouched: the comparison row holds `replay`'s figures on that device and the
/// timeline's peak reserved is the same.
#[test]
fn the_recording_device_is_built_once() {
    use crate::torch_replay::{replay_torch, RECORDING_DEVICES_BUILT};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../traces/settings/lstm_lm-split_gc.pickle.gz");
    let trace = crate::trace::read_path(&path, Default::default()).expect("reads");
    let s = trace
        .allocator_settings
        .as_ref()
        .expect("recorded settings");
    let conf = s.torch_config().unwrap();
    let cfg = ReportConfig {
        allocators: vec![Strategy::Torch, Strategy::Tlsf],
        allocator_config: AllocatorConfig {
            torch: conf,
            ..AllocatorConfig::default()
        },
        follow_recorded: true,
        ..ReportConfig::default()
    };
    RECORDING_DEVICES_BUILT.with(|n| n.set(0));
    let report = build(&trace, "lstm_lm-split_gc", &cfg, &mut |_| {}).unwrap();
    assert_eq!(RECORDING_DEVICES_BUILT.with(|n| n.get()), 1);
    let opts = ReplayConfig {
        device: report.device,
        ..ReplayConfig::default()
    };
    let alone = replay_torch(&trace, &conf, cfg.capacity_bytes, true, &opts, &mut |_| {}).unwrap();
    let torch = &report.replays[0];
    // PyTorch's own peak reserved on this trace, which the recorded addresses reproduce.
    assert_eq!(alone.report.peak_reserved_bytes, 6_582_960_128);
    assert_eq!(torch.peak_reserved_bytes, alone.report.peak_reserved_bytes);
    assert_eq!(
        torch.peak_allocated_bytes,
        alone.report.peak_allocated_bytes
    );
    assert_eq!(
        torch.peak_inactive_split_bytes,
        alone.report.peak_inactive_split_bytes
    );
    // The timeline's reserved series (index 2) peaks there too.
    let timeline_peak = report.runs[0].columns.max[2]
        .iter()
        .fold(0.0f64, |a, &b| a.max(b));
    assert_eq!(timeline_peak as u64, alone.report.peak_reserved_bytes);
}
