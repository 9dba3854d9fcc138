//! What the twelfth fresh-user pass of the `gpumem` binary found: each test runs the binary
//! as a user would and checks the exit status, the message and what was left on disk.
mod common;

use common::{gpumem, gpumem_in, one_line_error, repo, scratch};
use std::path::Path;

/// The names in `dir`, hidden ones included.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `-o new/` (a folder's name that does not exist) and `convert -o ''` replayed the whole
/// trace, then failed with "writing new/: failed to persist temporary file: Not a directory"
/// and left a hidden `.gpumem-XXXXXX` file in the working folder. They are refused before
/// any work, naming the flag, and nothing is left behind.
#[test]
fn an_output_named_like_a_folder_is_refused_and_leaves_nothing() {
    let dir = scratch("folder-name");
    let trace = repo().join("traces/multigpu/two_devices.jsonl");
    let trace = trace.to_str().unwrap();
    for (args, flag) in [
        (vec!["convert", trace, "-o", "new/"], "-o new/"),
        (vec!["convert", trace, "-o", ""], "-o ''"),
        (vec!["report", trace, "-a", "tlsf", "-o", "new/"], "-o new/"),
        (
            vec!["replay", trace, "-a", "tlsf", "--timeline", "new.svg/"],
            "--timeline new.svg/",
        ),
        (vec!["convert", trace, "-o", "new/.."], "-o new/.."),
    ] {
        let (ok, _, err) = gpumem_in(&dir, &args);
        assert!(!ok, "{args:?}");
        let last = err.trim_end().lines().last().unwrap_or_default();
        assert!(
            last.starts_with(&format!("error: {flag}: ")),
            "{args:?}: {err}"
        );
        assert!(last.contains("expected a file name"), "{args:?}: {err}");
        assert!(!err.contains("persist"), "{args:?}: {err}");
        if args[0] != "replay" {
            one_line_error(&err);
        }
        assert_eq!(entries(&dir), Vec::<String>::new(), "{args:?}");
    }
    // A name in a folder that exists is written as before.
    let (ok, _, err) = gpumem_in(&dir, &["convert", trace, "-o", "ok.jsonl"]);
    assert!(ok, "{err}");
    assert_eq!(entries(&dir), ["ok.jsonl"]);
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
    let (ok, _, err) = gpumem(&[
        "replay",
        "traces/multigpu/two_devices.jsonl",
        "--lazy-conf",
        "colour=red",
    ]);
    assert!(!ok);
    assert!(!err.contains("--allocator"), "{err}");
}

/// `bench transfer --host-only --kinds pinned` (or `--directions d2h`) measured the staging
/// ring's fill and drain as always and printed them, not a word about pinned memory: the
/// flags are refused with `--host-only`, as `--plot` and `--overlap` are.
#[test]
fn host_only_refuses_kinds_and_directions() {
    for extra in [["--kinds", "pinned"], ["--directions", "d2h"]] {
        let mut args = vec![
            "bench",
            "transfer",
            "--host-only",
            "--sizes",
            "4KiB",
            "--no-cache",
        ];
        args.extend_from_slice(&extra);
        let (ok, out, err) = gpumem(&args);
        assert!(!ok, "{extra:?}: {out}");
        assert!(
            err.contains(extra[0]) && err.contains("--host-only"),
            "{extra:?}: {err}"
        );
    }
    let (ok, out, _) = gpumem(&["bench", "transfer", "--help"]);
    assert!(ok);
    assert!(out.contains("at the largest of --sizes"), "{out}");
}

/// The README's table of the JSON lines format lists every action the reader accepts;
/// `free_requested`, which `convert` writes for a block freed on one stream and still in use
/// on another, was missing.
#[test]
fn the_readme_lists_every_json_lines_action() {
    let dir = scratch("actions");
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"action\":\"nonsense\",\"addr\":1}\n").unwrap();
    let (ok, _, err) = gpumem(&["replay", bad.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok);
    let listed = err
        .split("expected ")
        .nth(1)
        .unwrap_or_else(|| panic!("{err}"))
        .trim_end()
        .replace(" or ", ", ");
    let actions: Vec<&str> = listed.split(", ").collect();
    assert!(actions.len() >= 10, "{actions:?}");
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let row = readme
        .lines()
        .find(|l| l.starts_with("| `action` |"))
        .expect("the README's JSON lines table has an `action` row");
    for a in actions {
        assert!(row.contains(&format!("`{a}`")), "{a} is not in: {row}");
    }
    // The convert that writes it.
    let (ok, out, err) = gpumem(&["convert", "traces/settings/stream_prefetch.pickle.gz"]);
    assert!(ok, "{err}");
    assert!(out.contains("\"action\":\"free_requested\""));
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
    let (ok, out, err) = gpumem(&["map", segments, "-a", "recorded", "--width", "40"]);
    assert!(ok, "{err}");
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

/// The README's examples that show a command and what it printed (a block whose first line
/// is `$ gpumem ...` or `$ cargo run --release -- ...`), run again: every line shown is
/// printed, but for what depends on the machine (events/s, the seconds a read took). The
/// recorded-OOM verdicts had drifted (`torch: fails, 32.87 MiB short` where the replay, which
/// sizes devices to 2 MiB, prints 32.00 MiB). `tune`'s example is left out: its grid of
/// replays is slow in a debug build.
#[test]
fn readme_examples_print_what_the_readme_shows() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(l) = lines.next() {
        if l.starts_with("```") {
            let block: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            if block.first().is_some_and(|f| f.starts_with("$ ")) {
                blocks.push(block);
            }
        }
    }
    let mut checked = Vec::new();
    for block in blocks {
        let command = block[0]
            .trim_start_matches("$ ")
            .trim_start_matches("cargo run --release -- ")
            .trim_start_matches("gpumem ");
        if command.starts_with("tune ") {
            continue;
        }
        let args: Vec<&str> = command.split_whitespace().collect();
        let (ok, out, err) = gpumem(&args);
        assert!(ok, "{command}: {err}");
        let printed: Vec<&str> = out.lines().chain(err.lines()).collect();
        // Tables with an events/s column: all but its figure and unit must match.
        let rate = block.iter().any(|l| l.trim_end().ends_with("events/s"));
        for want in &block[1..] {
            if want.starts_with("read ") {
                continue; // the seconds the read took
            }
            let words: Vec<&str> = want.split_whitespace().collect();
            let found = printed.iter().any(|got| {
                if got.trim_end() == want.trim_end() {
                    return true;
                }
                let have: Vec<&str> = got.split_whitespace().collect();
                rate && words.len() > 2
                    && have.len() == words.len()
                    && have[..words.len() - 2] == words[..words.len() - 2]
            });
            assert!(
                found,
                "`{command}`: the README shows\n{want}\nbut it printed\n{out}{err}"
            );
        }
        checked.push(command.to_string());
    }
    assert_eq!(checked.len(), 3, "{checked:?}");
}

/// `advise --size -1` and `bench pinned/transfer --sizes -1` said "expected a size ≥ 0",
/// and a 0 was then refused too ("a transfer of 0 B needs no memory", "give sizes > 0"):
/// a negative size is now said to need `> 0`, as `--capacity -5` says it.
#[test]
fn a_negative_size_where_zero_is_refused_asks_for_more_than_zero() {
    for args in [
        &["advise", "--size", "-1"][..],
        &["bench", "pinned", "--sizes", "-1", "--no-cache"][..],
        &[
            "bench",
            "transfer",
            "--host-only",
            "--sizes",
            "-1",
            "--no-cache",
        ][..],
    ] {
        let (ok, out, err) = gpumem(args);
        assert!(!ok, "{args:?}: {out}");
        assert!(err.contains("`-1`: expected a size > 0"), "{args:?}: {err}");
        assert!(!err.contains("≥ 0"), "{args:?}: {err}");
    }
    // Where 0 is a size that works (a capacity cap of no pinned memory), ≥ 0 stays.
    let (ok, _, err) = gpumem(&["advise", "--size", "1MiB", "--cap", "-1"]);
    assert!(!ok);
    assert!(err.contains("expected a size ≥ 0"), "{err}");
}

/// A shipped snapshot padded with zeros (as a copy in whole blocks leaves it; `gzip -d`
/// reads it without a word) was refused: "gzip data truncated or corrupt after 734355
/// inflated bytes: invalid gzip header". It replays as the file itself does; a snapshot
/// with other bytes after its gzip data is refused saying that all of it was inflated.
#[test]
fn a_gzip_snapshot_padded_with_zeros_replays() {
    let dir = scratch("padded");
    let gz = std::fs::read(repo().join("traces/mixed_sizes.pickle.gz")).unwrap();
    let padded = dir.join("padded.pickle.gz");
    let mut bytes = gz.clone();
    bytes.extend(std::iter::repeat_n(0u8, 4096 - gz.len() % 4096));
    std::fs::write(&padded, &bytes).unwrap();
    let trailing = dir.join("trailing.pickle.gz");
    let mut bytes = gz;
    bytes.extend(b"garbage\n");
    std::fs::write(&trailing, &bytes).unwrap();
    let json = |args: &[&str]| -> serde_json::Value {
        let (ok, out, err) = gpumem(args);
        assert!(ok, "{args:?}: {err}");
        serde_json::from_str(&out).unwrap()
    };
    let figures = |v: &serde_json::Value| {
        (
            v["trace"]["events"].clone(),
            v["allocators"][0]["peak_reserved_bytes"].clone(),
        )
    };
    let want = json(&[
        "replay",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "torch",
        "--json",
        "--no-plan",
    ]);
    let got = json(&[
        "replay",
        padded.to_str().unwrap(),
        "-a",
        "torch",
        "--json",
        "--no-plan",
    ]);
    assert_eq!(figures(&got), figures(&want));
    let (ok, _, err) = gpumem(&["replay", trailing.to_str().unwrap(), "-a", "torch"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok);
    one_line_error(&err);
    assert!(
        err.contains("the gzip data ends after 734355 inflated bytes, then data that is not gzip follows (first bytes 67 61 72 62 61 67 65 0a;"),
        "{err}"
    );
    assert!(
        err.contains("a lenient read (--lenient) keeps the 6707 events"),
        "{err}"
    );
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
    let (ok, _, err) = gpumem(&[
        "map",
        t,
        "--capacity",
        "16TiB",
        "--width",
        "40",
        "--lines",
        "2",
    ]);
    assert!(ok, "{err}");
}

/// A JSON lines or RMM error about an earlier event named it by its 0-based event index
/// beside the current line's 1-based number: "line 2: alloc ... already live (allocated with
/// 5 bytes at event 0, not freed since)". The earlier event is named by its line too.
#[test]
fn an_error_about_an_earlier_line_names_that_line() {
    let dir = scratch("earlier-line");
    let cases = [
        (
            "dup.jsonl",
            "{\"action\":\"alloc\",\"addr\":1,\"size\":5}\n\n{\"action\":\"alloc\",\"addr\":1,\"size\":5}\n",
            "line 3: alloc of 5 bytes at address 1 (0x1) (device 0), which is already live (allocated with 5 bytes on line 1, not freed since)",
        ),
        (
            "double.jsonl",
            "{\"action\":\"alloc\",\"addr\":1,\"size\":5}\n{\"action\":\"free\",\"addr\":1}\n{\"action\":\"free\",\"addr\":1}\n",
            "line 3: free of address 1 (0x1) (device 0) that is not live: freed on line 2 and not allocated since (a double free)",
        ),
        (
            "double.csv",
            "Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.000,allocate,0x10,16,0x0\n1,10:00:00.001,free,0x10,16,0x0\n1,10:00:00.002,free,0x10,16,0x0\n",
            "line 4: free of address 0x10 (device 0) that is not live: freed on line 3 and not allocated since (a double free)",
        ),
    ];
    for (name, text, said) in cases {
        let f = dir.join(name);
        std::fs::write(&f, text).unwrap();
        let (ok, _, err) = gpumem(&["replay", f.to_str().unwrap(), "-a", "torch"]);
        assert!(!ok, "{name}");
        one_line_error(&err);
        assert!(err.trim_end().ends_with(said), "{name}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `report --lenient` of a cut snapshot, or of JSON lines with bad lines, wrote a page that
/// looked like that of a whole trace: the cut and the skipped lines went to stderr only, and
/// the page is what gets shared. The page's summary now says them, as `replay` does.
#[test]
fn a_lenient_report_says_on_the_page_what_was_left_out() {
    let dir = scratch("lenient-page");
    let gz = std::fs::read(repo().join("traces/mixed_sizes.pickle.gz")).unwrap();
    let cut = dir.join("cut.pickle.gz");
    std::fs::write(&cut, &gz[..20000]).unwrap();
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":100}\n{\"action\":\"alloc\"\n{\"action\":\"free\",\"addr\":1}\n",
    )
    .unwrap();
    let page = dir.join("r.html");
    let run = |trace: &Path| {
        let (ok, _, err) = gpumem(&[
            "report",
            trace.to_str().unwrap(),
            "--lenient",
            "-a",
            "torch",
            "-o",
            page.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
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
