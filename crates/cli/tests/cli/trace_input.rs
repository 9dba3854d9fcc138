//! Reading a trace in every trace command: bad input, errors naming the line, lenient reads, standard input, gzip.
use crate::common::{
    args, copy_trace, gpumem, gpumem_ok, gpumem_stdin, one_line_error, repo, scratch, write_file,
    FIXTURES,
};
use std::process::Command;

#[test]
fn bad_inputs_get_clear_errors() {
    let (ok, _, err) = gpumem(&["replay", "no/such/file.pickle"]);
    assert!(!ok && err.contains("no/such/file.pickle"), "{err}");
    let (ok, _, err) = gpumem(&["replay", "traces/mixed_sizes.pickle.gz", "-a", "firstfit"]);
    assert!(!ok && err.contains("unknown allocator `firstfit`"), "{err}");
    let (ok, _, err) = gpumem(&args("replay traces/mixed_sizes.pickle.gz --capacity 12XB"));
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
    let (out, _) = gpumem_ok(&args(
        "replay crates/gpumem/tests/fixtures/segments_only.pickle --json",
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["state"]["totals"];
    assert!(t["segments"].as_u64().unwrap() > 0);
    assert!(t["reserved_bytes"].as_u64().unwrap() >= t["allocated_bytes"].as_u64().unwrap());
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
    write_file(&f, lines);
    let (_, err) = gpumem_ok(&["replay", f.to_str().unwrap(), "--lenient", "-a", "tlsf"]);
    assert_eq!(err.matches("  skipped: line").count(), 5, "{err}");
    assert!(err.contains("... and 3 more skipped"), "{err}");
    assert!(
        err.contains("line 1: unknown key \"strem\" ignored; did you mean \"stream\"?"),
        "{err}"
    );
    let snap = std::fs::read(repo().join(FIXTURES).join("recorded_oom.pickle")).unwrap();
    let cut = dir.join("cut.pickle");
    write_file(&cut, &snap[..snap.len() / 2]);
    let (ok, _, err) = gpumem(&["replay", cut.to_str().unwrap(), "-a", "tlsf"]);
    assert!(!ok && err.contains("truncated"), "{err}");
    let (_, err) = gpumem_ok(&["replay", cut.to_str().unwrap(), "--lenient", "-a", "tlsf"]);
    assert!(
        err.contains("truncated: the file is cut at byte offset") && err.contains("kept the "),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
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

#[test]
fn a_misspelt_required_key_gets_its_hint() {
    let dir = scratch("typo");
    let t = dir.join("t.jsonl");
    write_file(&t, "{\"action\":\"alloc\",\"addr\":1,\"sise\":100}\n");
    let (ok, _, err) = gpumem(&["replay", t.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("line 1: \"alloc\" needs \"size\" (bytes); unknown key \"sise\": did you mean \"size\"?"),
        "{err}"
    );
    one_line_error(&err);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A truncated warm-process snapshot salvaged with --lenient: the dump's segments and live
/// blocks describe the run after the cut, so they are not all taken for what existed before
/// recording began.
#[test]
fn a_salvaged_snapshot_does_not_take_the_state_after_the_cut_for_its_start() {
    let dir = scratch("cut-warm");
    // The first 60 % of a shipped trace, replayed with --lenient: stderr.
    let salvage = |trace: &str, cut: &str| {
        let whole = std::fs::read(repo().join(trace)).unwrap();
        let cut = dir.join(cut);
        write_file(&cut, &whole[..whole.len() * 6 / 10]);
        let args = [
            "replay",
            cut.to_str().unwrap(),
            "--lenient",
            "-a",
            "torch",
            "--no-plan",
        ];
        gpumem_ok(&args).1
    };
    let err = salvage(
        "traces/warm_process/seg_train.pickle.gz",
        "seg_train_cut.pickle.gz",
    );
    assert!(err.contains("  truncated: "), "{err}");
    assert!(
        err.contains("not taken for the state before recording began"),
        "{err}"
    );
    // The whole trace starts from 2 segments; only those the events read show are taken.
    let segments = err
        .lines()
        .find(|l| l.contains("made before recording started"))
        .unwrap_or_else(|| panic!("{err}"));
    let n: usize = segments.split_whitespace().next().unwrap().parse().unwrap();
    assert!((1..=2).contains(&n), "{segments}");
    assert!(
        !err.contains("already live when recording started"),
        "{err}"
    );
    // A snapshot cut before its allocator_settings (written after the trace) replays native:
    // said so, with the way out.
    let err = salvage(
        "traces/warm_process/gan_train_expandable.pickle.gz",
        "gan_cut.pickle.gz",
    );
    assert!(
        err.contains(
            "native (native: the snapshot is cut before its allocator_settings; give --torch-conf"
        ),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// --lenient "skips and counts" in every command that reads a trace, and a file whose every
/// event was skipped is told so (not that nothing was recorded); `tune` refuses a trace
/// without allocations instead of ranking settings by zeros.
#[test]
fn lenient_commands_say_what_they_skipped() {
    let dir = scratch("lenient");
    let dup = dir.join("dup.jsonl");
    write_file(&dup,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":4096}\n{\"action\":\"free\",\"addr\":1}\n{\"action\":\"free\",\"addr\":1}\n");
    let dup = dup.to_str().unwrap();
    let html = dir.join("r.html");
    for args in [
        vec!["tune", dup, "--lenient"],
        vec!["map", dup, "--lenient"],
        vec!["report", dup, "--lenient", "-o", html.to_str().unwrap()],
    ] {
        let (ok, _, err) = gpumem(&args);
        assert!(ok, "{args:?}: {err}");
        assert!(
            err.contains("  skipped: line 3: free of address 1"),
            "{args:?}: {err}"
        );
    }
    let (out, _) = gpumem_ok(&["tune", dup, "--lenient", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["skipped_events"], 1);
    // `replay --json` prints no read notes: the reasons are in the JSON (it had the count
    // only, and said nowhere why).
    let (out, _) = gpumem_ok(&["replay", dup, "--lenient", "--json", "-a", "torch"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trace"]["skipped_events"], 1);
    let why = v["trace"]["skipped"][0].as_str().unwrap_or_default();
    assert!(why.starts_with("line 3: free of address 1"), "{out}");

    let bad = dir.join("bad.jsonl");
    write_file(&bad, "{\"action\":\"alloc\",\"addr\":1,\"size\":-10}\n");
    let bad = bad.to_str().unwrap();
    for cmd in ["replay", "tune", "convert"] {
        let (ok, out, err) = gpumem(&[cmd, bad, "--lenient"]);
        assert!(!ok, "{cmd}: {out}");
        assert!(err.contains("  skipped: line 1: "), "{cmd}: {err}");
        assert!(
            err.contains("no alloc/free event is left after --lenient skipped 1 malformed event"),
            "{cmd}: {err}"
        );
        assert!(!err.contains("holds no alloc/free events"), "{cmd}: {err}");
    }
    // A snapshot that recorded nothing, and one of segments only: nothing to tune.
    let (ok, out, err) = gpumem(&["tune", "crates/gpumem/tests/fixtures/no_recording.pickle"]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("nothing to tune") && err.contains("_record_memory_history"),
        "{err}"
    );
    one_line_error(&err);
    let (ok, out, err) = gpumem(&["tune", "crates/gpumem/tests/fixtures/segments_only.pickle"]);
    assert!(!ok, "{out}");
    assert!(err.contains("segments but no trace entries"), "{err}");
    // Counted nouns in the state analysis.
    let (out, _) = gpumem_ok(&[
        "replay",
        "crates/gpumem/tests/fixtures/segments_only.pickle",
    ]);
    assert!(out.contains("state of the 1 segment the snapshot"), "{out}");
    assert!(out.contains(", 1 inactive split block holding"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Errors say what the line wrote: an integer beyond 64 bits is not called "floating point",
/// and an RMM row with a field missing is not csv's "CSV error: record 1 (line: 2, ...)".
#[test]
fn errors_name_what_the_line_wrote() {
    let dir = scratch("what-the-line-wrote");
    let big = dir.join("big.jsonl");
    write_file(
        &big,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":18446744073709551616}\n",
    );
    let (ok, _, err) = gpumem(&["replay", big.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("line 1: invalid value: integer 18446744073709551616 does not fit in 64 bits, expected a whole number ≥ 0 (column 54, key \"size\")"),
        "{err}"
    );
    one_line_error(&err);
    // A device ordinal beyond 32 bits is a whole number ≥ 0: the error says the range.
    let dev = dir.join("dev.jsonl");
    write_file(
        &dev,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":1,\"device\":4294967296}\n",
    );
    let (ok, _, err) = gpumem(&["replay", dev.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("integer `4294967296`, expected a whole number from 0 to 4294967295"),
        "{err}"
    );
    // An oom line without the request it failed on was judged as a 0-byte request.
    let oom = dir.join("oom.jsonl");
    write_file(
        &oom,
        "{\"action\":\"oom\"}\n{\"action\":\"alloc\",\"addr\":1,\"size\":10}\n",
    );
    let (ok, out, err) = gpumem(&["replay", oom.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("oom.jsonl: line 1: \"oom\" needs \"size\""),
        "{err}"
    );
    // The same in a snapshot (PyTorch writes the size of every oom entry).
    let poom = dir.join("oom.pickle");
    write_file(&poom,
        b"\x80\x02}(X\x08\x00\x00\x00segments]X\r\x00\x00\x00device_traces]](}(X\x06\x00\x00\x00actionq\x00X\x03\x00\x00\x00oomX\x06\x00\x00\x00streamq\x01K\x00u}(h\x00X\x05\x00\x00\x00allocX\x04\x00\x00\x00addrK\x01X\x04\x00\x00\x00sizeK\nh\x01K\x00ueau.");
    let (ok, out, err) = gpumem(&["replay", poom.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("oom.pickle: event 0 (device 0 trace entry 0): no 'size'"),
        "{err}"
    );
    let csv = dir.join("short.csv");
    write_file(
        &csv,
        "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x100,256\n",
    );
    let (ok, _, err) = gpumem(&["replay", csv.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.trim_end()
            .ends_with("short.csv: line 2: CSV: 5 fields, expected 6 as in the header"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A folder given as the trace: said so, with what was expected (it was the OS's "Is a
/// directory (os error 21)").
#[test]
fn a_folder_is_not_a_trace() {
    for cmd in ["replay", "tune", "report", "map", "convert"] {
        let (ok, _, err) = gpumem(&[cmd, "traces/warm_process"]);
        assert!(!ok, "{cmd}");
        assert!(
            err.contains(
                "traces/warm_process: not an allocation trace: a folder; expected a trace file"
            ),
            "{cmd}: {err}"
        );
        one_line_error(&err);
    }
}

/// A `NAME-CONF.stats.json` beside the trace that cannot be used is warned about, naming the
/// file and what was expected (it was skipped without a word, and PyTorch's figures were
/// just missing).
#[test]
fn a_broken_stats_file_beside_the_trace_is_warned_about() {
    let dir = scratch("stats");
    let t = copy_trace(&dir, "crates/gpumem/tests/fixtures/sample.jsonl");
    write_file(
        dir.join("sample-native.stats.json"),
        "{\"reserved_bytes.all.peak\": 1.5e9",
    );
    write_file(
        dir.join("sample-expandable_segments_True.stats.json"),
        "{\"reserved\": 5}",
    );
    let (_, err) = gpumem_ok(&["replay", t.to_str().unwrap(), "-a", "torch", "--no-plan"]);
    assert!(
        err.contains("sample-native.stats.json: not JSON (")
            && err.contains("expected torch.cuda.memory_stats() as a JSON object"),
        "{err}"
    );
    assert!(
        err.contains("sample-expandable_segments_True.stats.json: no whole number under \"reserved_bytes.all.peak\""),
        "{err}"
    );
    let html = dir.join("r.html");
    let (_, err) = gpumem_ok(&[
        "report",
        t.to_str().unwrap(),
        "-a",
        "torch",
        "-o",
        html.to_str().unwrap(),
    ]);
    assert!(
        err.contains("sample-native.stats.json: not JSON ("),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A gzip file whose checksum is wrong but whose data is whole: the lenient read keeps every
/// event and the note ends in a sentence ("kept the N events inflated before" stopped there).
#[test]
fn a_bad_gzip_checksum_note_is_a_whole_sentence() {
    let dir = scratch("crc");
    let mut gz = std::fs::read(repo().join("traces/mixed_sizes.pickle.gz")).unwrap();
    let n = gz.len();
    gz[n - 6] ^= 0xff; // inside the CRC-32 of the trailer
    let t = dir.join("crc.pickle.gz");
    write_file(&t, &gz);
    let (ok, _, err) = gpumem(&["replay", t.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("does not have a matching checksum"), "{err}");
    let (out, _) = gpumem_ok(&[
        "replay",
        t.to_str().unwrap(),
        "-a",
        "torch",
        "--lenient",
        "--json",
        "--no-plan",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let events = v["trace"]["events"].as_u64().unwrap();
    let note = v["trace"]["truncated"]
        .as_str()
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        note.ends_with(&format!("kept the {events} events inflated before it")),
        "{note}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every command that reads a trace takes `-` for standard input, and its help says so.
#[test]
fn every_trace_command_reads_standard_input_and_says_so() {
    let sample = std::fs::read(repo().join("crates/gpumem/tests/fixtures/sample.jsonl")).unwrap();
    for cmd in ["replay", "tune", "report", "map", "convert"] {
        let (ok, out, _) = gpumem(&[cmd, "--help"]);
        assert!(ok);
        let arg = out
            .split("Arguments:")
            .nth(1)
            .and_then(|a| a.split("Options:").next())
            .unwrap_or_default();
        assert!(arg.contains("standard input"), "{cmd}: {arg}");
        let mut args = vec![cmd, "-"];
        if cmd == "report" {
            args.extend(["-o", "-", "-a", "torch"]);
        }
        let (ok, out, err) = gpumem_stdin(&args, &sample);
        assert!(ok, "{cmd}: {err}");
        assert!(!out.is_empty(), "{cmd}");
    }
}

/// An empty trace says it is empty without calling standard input a file; a file is named.
#[test]
fn an_empty_trace_is_said_empty_whatever_it_came_from() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["replay", "-"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    one_line_error(&err);
    assert_eq!(
        err.trim_end(),
        "error: standard input: not an allocation trace: it is empty (0 bytes)"
    );
    let dir = scratch("empty-trace");
    let f = dir.join("empty.json");
    write_file(&f, "");
    let (ok, _, err) = gpumem(&["replay", f.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("empty.json") && err.contains("it is empty (0 bytes)"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
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
    write_file(&padded, &bytes);
    let trailing = dir.join("trailing.pickle.gz");
    let mut bytes = gz;
    bytes.extend(b"garbage\n");
    write_file(&trailing, &bytes);
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
    let want = json(&args(
        "replay traces/mixed_sizes.pickle.gz -a torch --json --no-plan",
    ));
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
        write_file(&f, text);
        let (ok, _, err) = gpumem(&["replay", f.to_str().unwrap(), "-a", "torch"]);
        assert!(!ok, "{name}");
        one_line_error(&err);
        assert!(err.trim_end().ends_with(said), "{name}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
