//! `gpumem report`'s page for a small trace: it parses, holds the expected figures, and
//! references no external resource.
use gpumem::core::sim::SimDevice;
use gpumem::core::strategy::Strategy;
use gpumem::replay::{self, ReplayConfig};
use gpumem::report::{self, ReportConfig};
use gpumem::trace::{read_bytes, ReadConfig, Trace};
use scraper::{Html, Selector};

/// Three layers of a small training step: weights stay, activations come and go.
const TRACE: &str = r#"{"action":"alloc","addr":1,"size":8388608}
{"action":"alloc","addr":2,"size":8388608}
{"action":"alloc","addr":3,"size":3000000}
{"action":"alloc","addr":4,"size":3000000}
{"action":"alloc","addr":5,"size":700}
{"action":"free","addr":3}
{"action":"alloc","addr":6,"size":12582912}
{"action":"free","addr":4}
{"action":"free","addr":5}
{"action":"alloc","addr":7,"size":1000}
{"action":"free","addr":6}
{"action":"free","addr":7}
"#;

fn trace() -> Trace {
    read_bytes("small.jsonl", TRACE.as_bytes(), ReadConfig::default()).unwrap()
}

fn page() -> (report::Report, String) {
    let t = trace();
    let r = report::build(&t, "small.jsonl", &ReportConfig::default(), &mut |_| {}).unwrap();
    let html = report::html::render(&r);
    (r, html)
}

fn sel(s: &str) -> Selector {
    Selector::parse(s).unwrap()
}

/// The text of the `n`th element of `doc` that `css` selects.
fn text_of(doc: &Html, css: &str, n: usize) -> String {
    doc.select(&sel(css)).nth(n).unwrap().text().collect()
}

#[test]
fn the_page_parses_and_holds_the_replay_figures() {
    let (r, html) = page();
    let doc = Html::parse_document(&html);
    assert!(doc.errors.is_empty(), "HTML parse errors: {:?}", doc.errors);
    // One row per allocator, with the peak reserved bytes an independent replay measures.
    let rows: Vec<_> = doc.select(&sel("#comparison tbody tr")).collect();
    assert_eq!(rows.len(), Strategy::ALL.len());
    let t = trace();
    for (row, strategy) in rows.iter().zip(Strategy::ALL) {
        assert_eq!(row.value().attr("data-allocator"), Some(strategy.name()));
        let mut a = strategy.build(&Default::default());
        let mut dev = SimDevice::default();
        let want = replay::replay(
            &t,
            a.as_mut(),
            &mut dev,
            &ReplayConfig::default(),
            &mut |_| {},
        )
        .unwrap();
        let cell = row.select(&sel("td[data-bytes]")).next().unwrap();
        assert_eq!(
            cell.value().attr("data-bytes").unwrap(),
            want.peak_reserved_bytes.to_string(),
            "{strategy}"
        );
        // OOMs: after int. frag., inactive split and retries.
        let oom: String = row.select(&sel("td")).nth(9).unwrap().text().collect();
        assert_eq!(oom, "0");
    }
    // Peak requested: 8 + 8 + 3 + 12 MiB-ish after event 6 (blocks 1, 2, 4, 5, 6 live).
    let peak = 2 * 8388608 + 3000000 + 700 + 12582912u64;
    let dd = doc.select(&sel("#peak-requested")).next().unwrap();
    assert_eq!(
        dd.value().attr("data-bytes"),
        Some(peak.to_string().as_str())
    );
    assert_eq!(r.peak_requested_event, 6);
    let text = text_of(&doc, "#peak-section", 0);
    assert!(text.contains("5 live blocks"), "{text}");
    // Largest live block at the peak first.
    let first = text_of(&doc, "#largest tbody tr td", 0);
    assert_eq!(first, "12.00 MiB");
    // The data the script reads is JSON with the right shape.
    let data = text_of(&doc, "#gpumem-data", 0);
    let v: serde_json::Value = serde_json::from_str(&data).unwrap();
    assert_eq!(v["events"], 12);
    assert_eq!(
        v["allocators"].as_array().unwrap().len(),
        Strategy::ALL.len()
    );
    assert_eq!(v["peak_requested_event"], 6);
    assert!(!v["packed"].as_str().unwrap().is_empty());
    // The licence of the vendored chart library travels with it.
    assert!(html.contains("Leon Sorokin"));
}

/// The comparison table writes its figures as `replay`'s table does: the driver time with a
/// unit that keeps its digits (`1.487 ms`, not `0.001 s`), and `-` for the ratio of a run
/// that served no byte (every allocation out of memory under a tiny capacity), not `0.000`.
#[test]
fn the_comparison_table_writes_driver_time_and_ratio_as_replay_does() {
    let t = trace();
    let cell = |capacity_bytes: u64, column: usize| -> Vec<String> {
        let cfg = ReportConfig {
            allocators: vec![Strategy::Torch, Strategy::Paged],
            capacity_bytes,
            ..ReportConfig::default()
        };
        let r = report::build(&t, "small.jsonl", &cfg, &mut |_| {}).unwrap();
        let doc = Html::parse_document(&report::html::render(&r));
        doc.select(&sel("#comparison tbody tr[data-allocator]"))
            .map(|row| row.select(&sel("td")).nth(column).unwrap().text().collect())
            .collect()
    };
    // Driver time: the last column, as gpumem::units::duration writes the replay's seconds.
    let r = report::build(
        &t,
        "small.jsonl",
        &ReportConfig {
            allocators: vec![Strategy::Torch, Strategy::Paged],
            ..ReportConfig::default()
        },
        &mut |_| {},
    )
    .unwrap();
    let want: Vec<String> = r
        .replays
        .iter()
        .map(|x| gpumem::units::duration(x.modelled_driver_seconds))
        .collect();
    assert!(
        want.iter()
            .all(|w| w.ends_with(" µs") || w.ends_with(" ms")),
        "{want:?}"
    );
    assert_eq!(cell(gpumem::core::sim::DEFAULT_CAPACITY, 12), want);
    // 1 KiB of device: nothing is served, so there is no ratio (replay prints `-`).
    assert_eq!(cell(1024, 2), vec!["-", "-"]);
    assert_eq!(cell(1024, 9), vec!["7", "7"], "every allocation is an OOM");
}

#[test]
fn the_page_references_nothing_outside_itself() {
    let (_, html) = page();
    let doc = Html::parse_document(&html);
    for el in doc.select(&sel("*")) {
        for (k, v) in el.value().attrs() {
            let v = v.trim().to_ascii_lowercase();
            assert!(
                !(matches!(k, "src" | "href" | "srcset" | "poster" | "data" | "action")),
                "<{} {k}=\"{v}\"> loads something",
                el.value().name()
            );
            assert!(!v.contains("://"), "<{} {k}=\"{v}\">", el.value().name());
        }
    }
    assert_eq!(
        doc.select(&sel("link, iframe, img, object, embed")).count(),
        0
    );
    let lower = html.to_ascii_lowercase();
    for needle in [
        "@import",
        "url(http",
        "url(//",
        "fetch(",
        "xmlhttprequest",
        "<link",
        "src=\"http",
        "src=\"//",
    ] {
        assert!(!lower.contains(needle), "the page contains {needle}");
    }
    // The only URL in the page is the chart library's banner comment.
    let urls: Vec<_> = lower.match_indices("https://").collect();
    assert_eq!(urls.len(), 1);
    assert!(lower.contains("/*! https://github.com/leeoniya/uplot"));
}

#[test]
fn stacks_of_a_snapshot_with_frames_show_where_the_memory_comes_from() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/report_frames.pickle.gz");
    let cfg = ReadConfig {
        keep_frames: true,
        ..ReadConfig::default()
    };
    let t = gpumem::trace::read_path(&path, cfg).unwrap();
    let r = report::build(&t, "report_frames", &ReportConfig::default(), &mut |_| {}).unwrap();
    // At the peak: two 24 MiB weights, three 6 MiB activations, two 3 MiB gradients.
    let sites = r.sites_at_peak();
    let got: Vec<(&str, u64, u64)> = sites
        .iter()
        .map(|s| (s.site.as_str(), s.blocks, s.requested_bytes >> 20))
        .collect();
    assert_eq!(
        got,
        vec![
            ("model.py:12 __init__", 2, 48),
            // The innermost frame in user code, not torch/nn/functional.py.
            ("model.py:40 forward", 3, 18),
            ("train.py:55 step", 2, 6),
        ]
    );
    let html = report::html::render(&r);
    let doc = Html::parse_document(&html);
    let first_site = text_of(&doc, "#sites tbody tr td", 0);
    assert_eq!(first_site, "model.py:12 __init__");
    let stack = text_of(&doc, "#largest td.stack", 2);
    // Frames one per line (`<br>`), innermost first.
    assert_eq!(
        stack,
        "torch/nn/functional.py:2380 linearmodel.py:40 forwardtrain.py:51 step"
    );
    let data = text_of(&doc, "#gpumem-data", 0);
    let v: serde_json::Value = serde_json::from_str(&data).unwrap();
    assert_eq!(v["stacks"]["stacks"].as_array().unwrap().len(), 3);
}

/// The page of a trace of several devices shows one, and said only its ordinal ("device 0"):
/// the note that the figures are that device's alone went to stderr, not onto the page that
/// is passed around. The summary now names the others and how to show them.
#[test]
fn a_page_of_several_devices_names_them() {
    let device_of = |html: &str| -> String {
        let doc = Html::parse_document(html);
        let dts: Vec<_> = doc.select(&sel("dl.summary dt")).collect();
        let dds: Vec<_> = doc.select(&sel("dl.summary dd")).collect();
        let i = dts
            .iter()
            .position(|dt| dt.text().collect::<String>() == "device")
            .unwrap();
        dds[i].text().collect()
    };
    let (_, html) = page();
    assert_eq!(device_of(&html), "0");
    let two = format!(
        "{TRACE}{}",
        TRACE.replace("\"addr\":", "\"device\":2,\"addr\":")
    );
    let t = read_bytes("two.jsonl", two.as_bytes(), ReadConfig::default()).unwrap();
    let cfg = ReportConfig {
        device: Some(2),
        ..ReportConfig::default()
    };
    let r = report::build(&t, "two.jsonl", &cfg, &mut |_| {}).unwrap();
    assert_eq!(r.summary.allocs, 7);
    assert_eq!(
        device_of(&report::html::render(&r)),
        "2 of 2 (0, 2; --trace-device N shows another)"
    );
}
