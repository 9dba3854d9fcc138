//! `gpumem report`: the HTML page, its torch figures, what a snapshot with nothing to show says.
use crate::common::{copy_trace, gpumem, gpumem_ok, one_line_error, repo, scratch, write_file};
use std::path::Path;
use std::process::Command;

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
    let (out, _) = gpumem_ok(&["replay", t, "-a", "torch", "--torch-conf", conf, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let peak = v["allocators"][0]["peak_reserved_bytes"].as_u64().unwrap();
    let native = gpumem(&["replay", t, "-a", "torch", "--json"]);
    let vn: serde_json::Value = serde_json::from_str(&native.1).unwrap();
    let native_peak = vn["allocators"][0]["peak_reserved_bytes"].as_u64().unwrap();
    assert_ne!(native_peak, peak);
    gpumem_ok(&["report", t, "-o", h, "-a", "torch", "--torch-conf", conf]);
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

/// `report -o x.svg` writes the HTML page under that name, as asked, and says it is HTML (the
/// file opened as a broken picture, without a word).
#[test]
fn a_report_named_like_a_picture_is_said_to_be_html() {
    let dir = scratch("report-ext");
    let t = "traces/mixed_sizes.pickle.gz";
    for (name, warned) in [("r.svg", true), ("r.HTML", false), ("r.html", false)] {
        let out = dir.join(name);
        let (_, err) = gpumem_ok(&["report", t, "-a", "tlsf", "-o", out.to_str().unwrap()]);
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

/// A snapshot dumped without `_record_memory_history` (the commonest first try) and one of
/// segments alone: `replay`, `tune` and `convert` say what the snapshot holds and how to
/// record one, but `report` and `map` said "the trace has no allocation on device 0: nothing
/// to show", and `map --allocator recorded`, made for a snapshot's own segments, failed the
/// same way on the snapshot of segments alone. They now say what the others say, and the
/// recorded map of the segments is drawn.
#[test]
fn report_and_map_say_why_a_snapshot_has_nothing_to_show() {
    let none = "crates/gpumem/tests/fixtures/no_recording.pickle";
    let segments = "crates/gpumem/tests/fixtures/segments_only.pickle";
    let dir = scratch("nothing-to-show");
    let page = dir.join("r.html");
    for (trace, expected) in [
        (none, "_record_memory_history"),
        (
            segments,
            "segments but no trace entries (`gpumem replay` shows the state of its segments); `gpumem map --allocator recorded` draws them",
        ),
    ] {
        for args in [
            vec!["report", trace, "-o", page.to_str().unwrap()],
            vec!["map", trace],
        ] {
            let (ok, out, err) = gpumem(&args);
            assert!(!ok, "{args:?}: {out}");
            one_line_error(&err);
            assert!(err.contains(": nothing to show: "), "{args:?}: {err}");
            assert!(err.contains(expected), "{args:?}: {err}");
            assert!(!err.contains("no allocation on device"), "{args:?}: {err}");
        }
    }
    assert!(!page.exists());
    let _ = std::fs::remove_dir_all(&dir);
    // The recorded map of the segments alone, as `replay` counts them.
    let (out, _) = gpumem_ok(&["map", segments, "-a", "recorded", "--width", "40"]);
    let (ok, state, err2) = gpumem(&["replay", segments]);
    assert!(ok, "{err2}");
    let n = state
        .split("state of the ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap_or_else(|| panic!("{state}"));
    let head = out.lines().next().unwrap_or_default();
    assert!(
        head.starts_with("pytorch (recorded) at dump time: ")
            && head.contains(&format!(": {n} segment")),
        "{head}\n{state}"
    );
    let (ok, _, err) = gpumem(&["map", segments, "-a", "recorded", "--trace-device", "3"]);
    assert!(!ok);
    one_line_error(&err);
    assert!(
        err.contains("--trace-device 3: the snapshot recorded no segment on device 3"),
        "{err}"
    );
}

/// `report --lenient` of a cut snapshot, or of JSON lines with bad lines, wrote a page that
/// looked like that of a whole trace: the cut and the skipped lines went to stderr only, and
/// the page is what gets shared. The page's summary now says them, as `replay` does.
#[test]
fn a_lenient_report_says_on_the_page_what_was_left_out() {
    let dir = scratch("lenient-page");
    let gz = std::fs::read(repo().join("traces/mixed_sizes.pickle.gz")).unwrap();
    let cut = dir.join("cut.pickle.gz");
    write_file(&cut, &gz[..20000]);
    let bad = dir.join("bad.jsonl");
    write_file(&bad,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":100}\n{\"action\":\"alloc\"\n{\"action\":\"free\",\"addr\":1}\n");
    let page = dir.join("r.html");
    let run = |trace: &Path| {
        gpumem_ok(&[
            "report",
            trace.to_str().unwrap(),
            "--lenient",
            "-a",
            "torch",
            "-o",
            page.to_str().unwrap(),
        ]);
        std::fs::read_to_string(&page).unwrap()
    };
    let html = run(&cut);
    assert!(html.contains("<dt>read (--lenient)</dt><dd id=\"read-notes\">truncated: gzip data truncated or corrupt after "), "no cut on the page");
    let html = run(&bad);
    assert!(
        html.contains("<dd id=\"read-notes\">skipped: line 2: not valid JSON"),
        "no skipped line on the page"
    );
    // A trace read whole has no such row.
    let html = run(&repo().join("traces/multigpu/two_devices.jsonl"));
    assert!(!html.contains("<dd id=\"read-notes\">"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The report's comparison row of the torch emulation holds `replay --json`'s figures (the page
/// says it does): the report replayed the emulation on a plain simulated device, where
/// `replay` follows the recorded run's segment addresses, so where PyTorch broke a tie
/// between equal free blocks by address the two disagreed (lstm_lm-split_gc: 5.98 GiB
/// reserved on the page, 6.13 GiB, PyTorch's own figure, in `replay`; gpt2_train: the
/// inactive split and the allocated peak).
#[test]
fn the_report_shows_the_torch_figures_of_replay() {
    let dir = scratch("report-torch");
    for trace in [
        "traces/settings/lstm_lm-split_gc.pickle.gz",
        "traces/gpt2_train.pickle.gz",
    ] {
        let path = repo().join(trace);
        let path = path.to_str().unwrap();
        let (out, _) = gpumem_ok(&["replay", path, "-a", "torch", "--json", "--no-plan"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let a = &v["allocators"][0];
        let html = dir.join("r.html");
        gpumem_ok(&["report", path, "-a", "torch", "-o", html.to_str().unwrap()]);
        let page = std::fs::read_to_string(&html).unwrap();
        let row = page
            .lines()
            .find(|l| l.starts_with("<tr data-allocator=\"torch\">"))
            .unwrap_or_else(|| panic!("{trace}: no torch row"));
        // The byte cells in order: peak reserved, peak allocated, inactive split.
        let bytes: Vec<u64> = row
            .split("data-bytes=\"")
            .skip(1)
            .map(|s| s[..s.find('"').unwrap()].parse().unwrap())
            .collect();
        let want: Vec<u64> = [
            "peak_reserved_bytes",
            "peak_allocated_bytes",
            "inactive_split_bytes_peak",
        ]
        .iter()
        .map(|k| a[*k].as_u64().unwrap())
        .collect();
        assert_eq!(bytes, want, "{trace}: {row}");
        if trace.contains("split_gc") {
            // PyTorch's own peak, from the stats file beside the trace.
            assert_eq!(want[0], 6_582_960_128, "{trace}");
            assert!(
                page.contains(
                    "memory_stats() of the traced run, under its own PYTORCH_CUDA_ALLOC_CONF"
                ),
                "{trace}"
            );
        }
    }
}
