//! `gpumem map`'s text for a small trace, compared with golden files
//! (`GPUMEM_UPDATE_GOLDEN=1 cargo test -p gpumem --test trace map_golden::` rewrites them).
use gpumem::report::{self, ReportConfig};
use gpumem::trace::{read_bytes, ReadConfig};

/// A small trace of seven blocks (the CLI's `map` tests replay it too).
const TRACE: &str = include_str!("../fixtures/map_small.jsonl");

fn check(allocator: &str, event: Option<u64>, golden: &str) {
    let t = read_bytes("small.jsonl", TRACE.as_bytes(), ReadConfig::default()).unwrap();
    let cfg = ReportConfig {
        allocators: vec![allocator.parse().unwrap()],
        allocator_config: gpumem::core::AllocatorConfig {
            segment_bytes: 32 << 20,
            ..Default::default()
        },
        ..ReportConfig::default()
    };
    let r = report::build(&t, "small.jsonl", &cfg, &mut |_| {}).unwrap();
    let text = r.map(0, event).unwrap().render_text(64, 12, false);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(golden);
    if std::env::var_os("GPUMEM_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (set GPUMEM_UPDATE_GOLDEN=1 to write it)",
            path.display()
        )
    });
    assert_eq!(
        text,
        want,
        "{allocator}: the map differs from {}",
        path.display()
    );
}

#[test]
fn torch_at_its_peak() {
    check("torch", None, "map_torch_peak.txt");
}

#[test]
fn torch_at_the_end() {
    check("torch", Some(10), "map_torch_end.txt");
}

#[test]
fn paged_at_its_peak() {
    check("paged", None, "map_paged_peak.txt");
}

#[test]
fn best_fit_after_event_7() {
    check("best-fit", Some(7), "map_best_fit_7.txt");
}
