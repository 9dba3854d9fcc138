//! Smoke test of `gpumem report` in a real browser: headless Chromium loads the page of
//! `traces/gpt2_train.pickle.gz` (and of a run where no allocation is served, and of a trace
//! of two events) with `#selftest`, which rebuilds every allocator's memory map at its peak
//! and compares it with gpumem's, moves the slider, checks the charts' axes, and writes PASS
//! or FAIL (with any console error) into the page; `--dump-dom` prints the page after its
//! scripts ran.
//!
//! Needs Debian's `chromium` (`.ci/run` installs it). Without it the test is skipped, unless
//! `CI` is set, where it fails.
use crate::common::write_file;
use std::path::{Path, PathBuf};
use std::process::Command;

fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {name}"))
            .output()
        {
            let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && !p.is_empty() {
                return Some(PathBuf::from(p));
            }
        }
    }
    None
}

/// Writes the report of `trace` (relative to the repository root, or absolute) with `args`, loads it in
/// headless Chromium with `#selftest` and asserts PASS and no console error; `name` names
/// its temporary folder.
fn self_test_in_chromium(name: &str, trace: &str, args: &[&str]) {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium is not installed (.ci/run installs it with apt-get)"
        );
        eprintln!("skipped: chromium is not installed");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let trace = root.join(trace);
    // One folder per test: they run in parallel.
    let dir = std::env::temp_dir().join(format!(
        "gpumem-report-chromium-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let html = dir.join("report.html");
    let st = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .arg("report")
        .arg(&trace)
        .args(args)
        .arg("-o")
        .arg(&html)
        .status()
        .unwrap();
    assert!(st.success(), "gpumem report failed");
    let url = format!("file://{}#selftest", html.display());
    let out = Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--disable-extensions",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=20000",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    let start = dom
        .find("<pre id=\"selftest-result\">")
        .unwrap_or_else(|| panic!("no self-test result in the page; chromium said:\n{log}"));
    let result = &dom[start..dom[start..].find("</pre>").map_or(dom.len(), |e| start + e)];
    assert!(
        result.contains(">PASS"),
        "the page's self-test failed:\n{result}"
    );
    // Console messages that Chromium logs itself (errors the page could not catch).
    let console_errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") && (l.contains("Uncaught") || l.contains("Error")))
        .collect();
    assert!(
        console_errors.is_empty(),
        "console errors: {console_errors:#?}"
    );
}

#[test]
fn the_report_of_gpt2_loads_in_chromium_without_errors() {
    self_test_in_chromium("gpt2", "traces/gpt2_train.pickle.gz", &[]);
}

/// A run where every allocation fails (1 MiB of device): every series is flat at 0, and the
/// page must still draw its axes on sensible ranges (the fragmentation axis went to 10000 %).
#[test]
fn the_report_of_a_run_with_no_allocation_served_passes_its_self_test() {
    self_test_in_chromium(
        "no-allocation-served",
        "traces/mixed_sizes.pickle.gz",
        &["--capacity", "1MiB"],
    );
}

/// A trace of two events: the event axes tick at whole events (they showed 0.2, 0.4, ...),
/// and the driver-call legend says 0 for an allocator that made no call (it was blank).
#[test]
fn the_report_of_a_two_event_trace_passes_its_self_test() {
    let dir = std::env::temp_dir().join(format!(
        "gpumem-report-chromium-tiny-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("two_events.jsonl");
    write_file(
        &trace,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":0}\n{\"action\":\"free\",\"addr\":1}\n",
    );
    self_test_in_chromium("two-events", trace.to_str().unwrap(), &[]);
    let _ = std::fs::remove_dir_all(&dir);
}
