//! Integration tests of the trace readers against the shipped traces and generated fixtures
//! (tests/fixtures/make_fixtures.py makes the fixtures and, with python's own pickle module,
//! the expected counts in tests/fixtures/expected.json).
use gpumem::trace::analysis::analyze;
use gpumem::trace::jsonl::write_jsonl;
use gpumem::trace::{read_bytes, read_path, Action, Format, ReadConfig, Trace, TraceError};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../traces")
        .join(format!("{name}.pickle.gz"))
}

fn expected() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The pickle inside a gzip file's bytes.
fn gunzip(gz: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut v = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut v)
        .unwrap();
    v
}

fn strict() -> ReadConfig {
    ReadConfig::default()
}

fn lenient() -> ReadConfig {
    ReadConfig {
        lenient: true,
        ..ReadConfig::default()
    }
}

/// Compares a trace with python's counts.
fn check_counts(name: &str, t: &Trace, want: &serde_json::Value) {
    let n = |k: &str| want[k].as_u64().unwrap() as usize;
    assert_eq!(t.count(Action::Alloc), n("alloc"), "{name}: alloc");
    assert_eq!(t.count(Action::Free), n("free"), "{name}: free_completed");
    assert_eq!(t.count(Action::SegmentAlloc), n("segment_alloc"), "{name}");
    assert_eq!(t.count(Action::SegmentFree), n("segment_free"), "{name}");
    assert_eq!(t.count(Action::Oom), n("oom"), "{name}");
    assert_eq!(t.count(Action::Snapshot), n("snapshot"), "{name}");
    let freed = t
        .preexisting
        .iter()
        .filter(|b| b.freed_at_event.is_some())
        .count();
    let live = t.preexisting.len() - freed;
    assert_eq!(freed, n("preexisting_freed"), "{name}: pre-existing, freed");
    assert_eq!(
        live,
        n("preexisting_live"),
        "{name}: pre-existing, live all along"
    );
    assert_eq!(t.segments.len(), n("segments"), "{name}: segments");
    assert_eq!(t.skipped_count, 0, "{name}: {:?}", t.skipped);
}

#[test]
fn shipped_traces_match_python_counts() {
    let exp = expected();
    let all = exp["shipped"].as_object().unwrap();
    assert_eq!(all.len(), 5, "expected.json lists the five shipped traces");
    for (name, want) in all {
        let t = read_path(&shipped(name), strict()).unwrap();
        assert_eq!(t.format, Some(Format::TorchSnapshot));
        check_counts(name, &t, want);
        // Every free of a pre-existing block points at a free event of that address.
        for b in &t.preexisting {
            if let Some(i) = b.freed_at_event {
                let e = t.events[i as usize];
                assert_eq!((e.action, e.addr), (Action::Free, b.addr), "{name}");
            }
            assert!(
                b.size_bytes > 0,
                "{name}: pre-existing block without a size"
            );
        }
        let timed = t.events.iter().filter(|e| e.time_us.is_some()).count();
        if name.contains("no_timestamps") {
            assert_eq!(timed, 0, "{name}");
        } else {
            assert_eq!(timed, t.events.len(), "{name}");
        }
    }
}

#[test]
fn shipped_state_analysis_agrees_with_segments() {
    let t = read_path(&shipped("external/finetune_no_timestamps"), strict()).unwrap();
    let a = analyze(&t.segments);
    let reserved: u64 = t.segments.iter().map(|s| s.total_size_bytes).sum();
    let recorded_alloc: u64 = t.segments.iter().map(|s| s.allocated_size_bytes).sum();
    assert_eq!(a.totals.reserved_bytes, reserved);
    // PyTorch's allocated_size is the sum of its active blocks.
    assert_eq!(a.totals.allocated_bytes, recorded_alloc);
    assert_eq!(
        a.totals.allocated_bytes + a.totals.free_bytes,
        a.totals.reserved_bytes
    );
    assert!(a.totals.inactive_split_blocks > 0);
}

#[test]
fn every_protocol_reads_the_same() {
    let exp = expected();
    let reference = read_path(&fixture("snapshot_p5.pickle"), strict()).unwrap();
    check_counts("snapshot_p5", &reference, &exp["snapshot"]);
    for f in [
        "snapshot_p0.pickle",
        "snapshot_p1.pickle",
        "snapshot_p2.pickle",
        "snapshot_p3.pickle",
        "snapshot_p4.pickle",
        "snapshot_p4.pickle.gz",
    ] {
        let t = read_path(&fixture(f), strict()).unwrap();
        assert_eq!(t.events, reference.events, "{f}");
        assert_eq!(t.preexisting, reference.preexisting, "{f}");
        assert_eq!(t.segments, reference.segments, "{f}");
    }
}

#[test]
fn snapshot_fixture_values() {
    let t = read_path(&fixture("snapshot_p4.pickle"), strict()).unwrap();
    let base = 0x7f00_0000_0000u64;
    // Two devices, all timed: interleaved by time_us.
    let times: Vec<i64> = t.events.iter().map(|e| e.time_us.unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert_eq!(times.len(), 10);
    let big = t.events.iter().find(|e| e.size_bytes == 1 << 40).unwrap();
    assert_eq!((big.addr, big.stream, big.device), (base + 512, 7, 0));
    let d1: Vec<_> = t.events.iter().filter(|e| e.device == 1).collect();
    assert_eq!(d1.len(), 2);
    assert_eq!((d1[0].action, d1[1].action), (Action::Alloc, Action::Free));
    let oom = t.events.iter().find(|e| e.action == Action::Oom).unwrap();
    assert_eq!(oom.size_bytes, 1 << 41);
    // Pre-existing: one freed at t=105 (event 4 after interleaving), one live in the segments.
    let freed = t
        .preexisting
        .iter()
        .find(|b| b.freed_at_event.is_some())
        .unwrap();
    assert_eq!((freed.addr, freed.size_bytes), (base + 4096, 1024));
    assert_eq!(freed.freed_at_event, Some(4));
    assert_eq!(t.events[4].time_us, Some(105));
    let live = t
        .preexisting
        .iter()
        .find(|b| b.freed_at_event.is_none())
        .unwrap();
    assert_eq!((live.addr, live.size_bytes), (base + 8192, 1000));
    let s = &t.segments[0];
    assert_eq!(
        (s.address, s.total_size_bytes, s.allocated_size_bytes),
        (base + 8192, 2 << 20, 1024)
    );
    assert_eq!(s.segment_type, "small");
    assert_eq!(s.blocks.len(), 2);
    assert_eq!(s.blocks[1].address, base + 9216);
    assert_eq!(s.blocks[1].state, "inactive");
}

#[test]
fn segments_only_snapshot_has_state_but_no_events() {
    let t = read_path(&fixture("segments_only.pickle"), strict()).unwrap();
    assert!(t.events.is_empty());
    assert!(t.preexisting.is_empty());
    let a = analyze(&t.segments);
    assert_eq!(a.totals.segments, 1);
    assert_eq!(a.totals.allocated_bytes, 1024);
    assert_eq!(a.totals.free_bytes, (2 << 20) - 1024);
    assert_eq!(a.totals.inactive_split_blocks, 1);
}

#[test]
fn hostile_pickles_are_refused() {
    for (f, opcode) in [
        ("hostile_reduce.pickle", "STACK_GLOBAL at byte offset 64"),
        ("hostile_class.pickle", "GLOBAL at byte offset"),
    ] {
        match read_path(&fixture(f), strict()) {
            Err(TraceError::Refused { message, .. }) => {
                assert!(message.contains(opcode), "{f}: {message}")
            }
            other => panic!("{f}: {other:?}"),
        }
        // Lenient does not change that.
        assert!(matches!(
            read_path(&fixture(f), lenient()),
            Err(TraceError::Refused { .. })
        ));
    }
}

#[test]
fn non_traces_are_named() {
    for (f, what) in [
        ("lfs_pointer.pickle.gz", "Git LFS pointer"),
        ("html_page.pickle.gz", "HTML"),
        ("empty.pickle", "empty"),
    ] {
        match read_path(&fixture(f), strict()) {
            Err(e @ TraceError::NotATrace { .. }) => {
                assert!(e.to_string().contains(what), "{f}: {e}");
                assert!(e.to_string().contains(f), "{f}: names the file: {e}");
            }
            other => panic!("{f}: {other:?}"),
        }
    }
    let stats =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces/mixed_sizes-native.stats.json");
    assert!(matches!(
        read_path(&stats, strict()),
        Err(TraceError::NotATrace { .. })
    ));
    assert!(matches!(
        read_path(&fixture("no_such_file"), strict()),
        Err(TraceError::Io { .. })
    ));
}

#[test]
fn malformed_entries_name_the_event_and_lenient_skips_them() {
    for (f, says) in [
        (
            "bad_type.pickle",
            "'size' is string \"64\", expected a non-negative integer",
        ),
        ("negative_size.pickle", "'size' is integer -64"),
        ("duplicate_alloc.pickle", "already live"),
        ("unknown_action.pickle", "unknown action string \"realloc\""),
    ] {
        match read_path(&fixture(f), strict()) {
            Err(TraceError::Malformed { index, message, .. }) => {
                assert_eq!(index, 1, "{f}");
                assert!(
                    message.starts_with("event 1 (device 0 trace entry 1)"),
                    "{f}: {message}"
                );
                assert!(message.contains(says), "{f}: {message}");
            }
            other => panic!("{f}: {other:?}"),
        }
        let t = read_path(&fixture(f), lenient()).unwrap();
        assert_eq!(t.skipped_count, 1, "{f}");
        assert_eq!(t.skipped.len(), 1, "{f}");
        assert_eq!(
            t.events.iter().map(|e| e.action).collect::<Vec<_>>(),
            [Action::Alloc, Action::Free],
            "{f}"
        );
    }
}

#[test]
fn rmm_and_jsonl_samples() {
    let t = read_path(&fixture("sample_rmm.csv"), strict()).unwrap();
    assert_eq!(t.format, Some(Format::RmmCsv));
    let acts: Vec<Action> = t.events.iter().map(|e| e.action).collect();
    assert_eq!(
        acts,
        [
            Action::Alloc,
            Action::Alloc,
            Action::Oom,
            Action::Free,
            Action::Free
        ]
    );
    assert_eq!(t.events[1].stream, 0x5e1a40);
    assert_eq!(t.events[2].size_bytes, 85_899_345_920);

    let j = read_path(&fixture("sample.jsonl"), strict()).unwrap();
    assert_eq!(j.format, Some(Format::JsonLines));
    assert_eq!(j.events.len(), 4);
    assert_eq!(j.events[1].align, Some(4096));
    assert_eq!(j.events[1].device, 1);
    assert_eq!(
        j.events[2].size_bytes, 1_048_576,
        "free gets its block's size"
    );
    assert_eq!(j.preexisting.len(), 1);
    assert_eq!(j.preexisting[0].freed_at_event, Some(3));
}

fn round_trip(t: &Trace) -> Trace {
    let mut out = Vec::new();
    write_jsonl(t, &mut out).unwrap();
    read_bytes("round-trip.jsonl", &out, strict()).unwrap()
}

/// An out-of-memory of 0 bytes (a snapshot can record one) keeps its size when written:
/// the writer left `size` out of every zero-sized event, and the reader needs it on `oom`.
#[test]
fn a_zero_byte_oom_round_trips() {
    let t = read_bytes(
        "oom0.jsonl",
        b"{\"action\":\"alloc\",\"addr\":1,\"size\":512}\n{\"action\":\"oom\",\"addr\":0,\"size\":0}\n",
        strict(),
    )
    .unwrap();
    assert_eq!(t.events[1].action, Action::Oom);
    let back = round_trip(&t);
    assert_eq!(back.events, t.events);
}

#[test]
fn jsonl_round_trip() {
    for name in [
        "mixed_sizes",
        "external/finetune_no_timestamps",
        "external/inference_with_empty_cache",
    ] {
        let t = read_path(&shipped(name), strict()).unwrap();
        let back = round_trip(&t);
        assert_eq!(back.format, Some(Format::JsonLines));
        assert_eq!(back.events, t.events, "{name}");
        assert_eq!(back.preexisting, t.preexisting, "{name}");
    }
    for f in ["snapshot_p4.pickle", "sample_rmm.csv", "sample.jsonl"] {
        let t = read_path(&fixture(f), strict()).unwrap();
        let back = round_trip(&t);
        assert_eq!(back.events, t.events, "{f}");
        assert_eq!(back.preexisting, t.preexisting, "{f}");
    }
}

/// The error of a reader on a cut file: it must be an error, never a panic or a trace.
fn assert_cut_fails(name: &str, bytes: &[u8], cut: usize) {
    match read_bytes(name, &bytes[..cut], strict()) {
        Err(TraceError::Malformed { message, .. }) => {
            assert!(!message.is_empty());
        }
        Err(TraceError::NotATrace { what, .. }) => {
            assert!(cut <= 2, "cut {cut}: {what}");
        }
        other => panic!("cut at {cut} of {}: {other:?}", bytes.len()),
    }
}

#[test]
fn truncated_pickles_give_clear_errors() {
    let p = std::fs::read(fixture("snapshot_p4.pickle")).unwrap();
    for cut in 0..p.len() {
        assert_cut_fails("snapshot_p4.pickle", &p, cut);
    }
    let p0 = std::fs::read(fixture("snapshot_p0.pickle")).unwrap();
    for cut in 1..p0.len() - 1 {
        // A text-protocol pickle cut short no longer ends in STOP: not detected as a pickle,
        // or detected and truncated; either way an error.
        assert!(read_bytes("p0", &p0[..cut], strict()).is_err(), "cut {cut}");
    }
    let gz = std::fs::read(shipped("mixed_sizes")).unwrap();
    let raw = gunzip(&gz);
    for k in 1..200 {
        let cut = raw.len() * k / 200;
        match read_bytes("mixed_sizes", &raw[..cut], strict()) {
            Err(TraceError::Malformed { message, .. }) => {
                assert!(message.contains("truncated at byte offset"), "{message}")
            }
            other => panic!("cut {cut}: {other:?}"),
        }
    }
    for k in 1..50 {
        let cut = gz.len() * k / 50;
        match read_bytes("mixed_sizes.pickle.gz", &gz[..cut], strict()) {
            Err(TraceError::Malformed { message, .. }) => {
                assert!(message.contains("gzip"), "{message}")
            }
            other => panic!("gz cut {cut}: {other:?}"),
        }
    }
}

#[test]
fn truncated_text_traces_never_panic() {
    for f in ["sample_rmm.csv", "sample.jsonl"] {
        let b = std::fs::read(fixture(f)).unwrap();
        for cut in 0..b.len() {
            if let Err(TraceError::Malformed { message, .. }) = read_bytes(f, &b[..cut], strict()) {
                assert!(message.starts_with("line "), "{f} cut {cut}: {message}");
            }
        }
    }
}

/// Whatever a reader accepted can be analysed, summarised and converted.
fn exercise(t: &Trace) {
    let _ = analyze(&t.segments).to_string();
    let _ = t.summary();
    // (An empty trace writes an empty file, which the readers name as not a trace.)
    if !t.events.is_empty() || !t.preexisting.is_empty() {
        let back = round_trip(t);
        assert_eq!(back.events, t.events);
        assert_eq!(back.preexisting, t.preexisting);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(
        prefix in prop::sample::select(vec![
            &b""[..], &b"\x80\x04"[..], &b"\x80\x02}("[..], &b"("[..], &b"{"[..],
            &b"Thread,Time,Action,Pointer,Size,Stream\n"[..], &b"\x1f\x8b"[..],
        ]),
        body in prop::collection::vec(any::<u8>(), 0..400),
        lenient in any::<bool>(),
    ) {
        let mut bytes = prefix.to_vec();
        bytes.extend_from_slice(&body);
        if let Ok(t) = read_bytes("random", &bytes, ReadConfig { lenient, ..ReadConfig::default() }) {
            exercise(&t);
        }
    }

    #[test]
    fn mutated_snapshots_never_panic(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        lenient in any::<bool>(),
    ) {
        let mut p = std::fs::read(fixture("snapshot_p4.pickle")).unwrap();
        for (i, b) in flips {
            let at = i.index(p.len());
            p[at] = b;
        }
        if let Ok(t) = read_bytes("mutated", &p, ReadConfig { lenient, ..ReadConfig::default() }) {
            exercise(&t);
        }
    }
}

/// Runs a python3 script of tests/fixtures; panics with a clear message when python3 is missing.
fn python(args: &[&str]) -> String {
    let out = std::process::Command::new("python3")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "this test needs python3 on the PATH (it checks gpumem against Python's own \
                 pickle module): running python3 failed: {e}"
            )
        });
    assert!(
        out.status.success(),
        "python3 {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Python pickles random snapshot-shaped objects that share objects the way real snapshots do
/// (and more) with protocols 2 to 5; gpumem must read exactly what Python reads, stacks
/// included (issue 9, item 1).
#[test]
fn reads_what_python_reads_with_random_sharing() {
    let dir = std::env::temp_dir().join(format!("gpumem-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = fixture("snapshot_diff.py");
    let cases: usize = python(&[script.to_str().unwrap(), dir.to_str().unwrap(), "24"])
        .trim()
        .parse()
        .unwrap();
    assert_eq!(cases, 24);
    let with_frames = ReadConfig {
        keep_frames: true,
        ..ReadConfig::default()
    };
    let mut events_seen = 0usize;
    for c in 0..cases {
        let text = std::fs::read_to_string(dir.join(format!("case_{c}.json"))).unwrap();
        let want: serde_json::Value = serde_json::from_str(&text).unwrap();
        let want_events = want["events"].as_array().unwrap();
        for proto in 2..=5 {
            let name = format!("case_{c}_p{proto}.pickle");
            let t = read_path(&dir.join(&name), with_frames).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(t.events.len(), want_events.len(), "{name}: event count");
            assert_eq!(
                t.event_stacks.len(),
                t.events.len(),
                "{name}: one stack per event"
            );
            let stack = |id| -> Vec<serde_json::Value> {
                t.stacks
                    .frames(id)
                    .map(|f| serde_json::json!([f.filename, f.line, f.name]))
                    .collect()
            };
            for (i, (e, w)) in t.events.iter().zip(want_events).enumerate() {
                let at = format!("{name} event {i}");
                assert_eq!(
                    gpumem::trace::jsonl::action_name(e.action),
                    w["action"],
                    "{at}"
                );
                assert_eq!(e.addr, w["addr"].as_u64().unwrap(), "{at}: addr");
                assert_eq!(e.size_bytes, w["size"].as_u64().unwrap(), "{at}: size");
                assert_eq!(e.stream, w["stream"].as_u64().unwrap(), "{at}: stream");
                assert_eq!(e.time_us, w["time_us"].as_i64(), "{at}: time_us");
                assert_eq!(u64::from(e.device), w["device"].as_u64().unwrap(), "{at}");
                let frames = stack(t.stack_of(i).unwrap());
                assert_eq!(
                    serde_json::Value::Array(frames),
                    w["frames"],
                    "{at}: frames"
                );
            }
            let ooms: Vec<serde_json::Value> = t
                .ooms
                .iter()
                .map(|o| serde_json::json!([o.event, o.device_free_bytes]))
                .collect();
            assert_eq!(serde_json::Value::Array(ooms), want["ooms"], "{name}: ooms");
            let segments: Vec<serde_json::Value> = t
                .segments
                .iter()
                .map(|s| {
                    let blocks: Vec<_> = s.blocks.iter().map(|b| stack(b.stack)).collect();
                    serde_json::json!([s.address, s.total_size_bytes, blocks])
                })
                .collect();
            assert_eq!(
                serde_json::Value::Array(segments),
                want["segments"],
                "{name}: segments"
            );
            let settings = t.allocator_settings.as_ref().unwrap();
            assert_eq!(settings.alloc_conf, want["alloc_conf"], "{name}");
            assert_eq!(settings.max_split_size_bytes, None, "{name}");
            // Without keep_frames: the same events, no stacks.
            let plain = read_path(&dir.join(&name), strict()).unwrap();
            assert_eq!(plain.events, t.events, "{name}");
            assert!(plain.event_stacks.is_empty() && plain.stacks.is_empty());
            events_seen += t.events.len();
        }
    }
    assert!(
        events_seen > 10_000,
        "the cases are too small: {events_seen}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 9 item 1, the small input: a stack that repeats a frame dict (recursion) and a
/// free_requested / free_completed pair sharing one `frames` list, over 1000 entries.
#[test]
fn shared_frames_snapshot_reads_with_its_stacks() {
    let f = fixture("shared_frames.pickle.gz");
    let t = read_path(&f, strict()).unwrap();
    assert_eq!(t.count(Action::Alloc), 1000);
    assert_eq!(t.count(Action::Free), 1000);
    let with = ReadConfig {
        keep_frames: true,
        ..ReadConfig::default()
    };
    let t = read_path(&f, with).unwrap();
    assert_eq!(t.events.len(), 2000);
    // Every alloc's stack has 7 frames, the last two repeating the first two (recursion).
    let s = t.stack_of(0).unwrap();
    let frames: Vec<String> = t.stacks.frames(s).map(|f| f.to_string()).collect();
    assert_eq!(frames.len(), 7);
    assert_eq!(frames[5..], frames[..2]);
    assert!(frames[0].starts_with("/m/f") && frames[0].contains(".py:"));
    // The free (free_completed) keeps the stack of the list it shared with free_requested.
    let free = t.stack_of(1).unwrap();
    assert_eq!(t.events[1].action, Action::Free);
    assert_eq!(t.stacks.frames(free).count(), 3);
    // 50 distinct frames at most, each file and function name stored once.
    assert!(t.stacks.frame_table.len() <= 50);
    assert!(t.stacks.strings.len() <= 100);
}

/// Issue 9 item 4: under --lenient a truncated snapshot (raw or gzip'd) gives the events read
/// before the cut and says so; strict reading still refuses it.
#[test]
fn lenient_salvages_truncated_snapshots() {
    let gz = std::fs::read(fixture("shared_frames.pickle.gz")).unwrap();
    let raw = gunzip(&gz);
    let whole = read_bytes("whole", &raw, strict()).unwrap();
    let mut last = 0;
    for k in 1..10 {
        let cut = raw.len() * k / 10;
        assert!(read_bytes("cut", &raw[..cut], strict()).is_err());
        let t = read_bytes("cut", &raw[..cut], lenient()).unwrap();
        let note = t.truncated.as_deref().unwrap();
        assert!(
            note.contains(&format!("cut at byte offset {cut}")),
            "{note}"
        );
        assert!(
            note.contains(&format!("kept the {} events", t.events.len())),
            "{note}"
        );
        // What was kept is the start of the whole trace, and more is kept from a later cut.
        assert_eq!(t.events[..], whole.events[..t.events.len()], "cut {cut}");
        assert!(t.events.len() >= last, "cut {cut}");
        // Roughly the share of the file before the cut (within one 1000-entry batch).
        let share = whole.events.len() * k / 10;
        assert!(
            t.events.len() + 700 >= share,
            "cut {cut}: {}",
            t.events.len()
        );
        last = t.events.len();
    }
    // A gzip file cut in the middle: the inflated part is salvaged too.
    let cut = gz.len() / 2;
    assert!(read_bytes("cut.gz", &gz[..cut], strict()).is_err());
    let t = read_bytes("cut.gz", &gz[..cut], lenient()).unwrap();
    let note = t.truncated.as_deref().unwrap();
    assert!(note.starts_with("gzip data truncated"), "{note}");
    assert!(t.events.len() > 500, "{}", t.events.len());
}

/// The number in "after N complete trace entries" of a strict read's error.
fn entries_before(message: &str) -> u64 {
    let at = message
        .find(" complete trace entr")
        .unwrap_or_else(|| panic!("no count in: {message}"));
    let digits = message[..at]
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap();
    digits.parse().unwrap()
}

/// New-user trial: a truncated pickle's error counts the trace entries read whole before the
/// cut exactly (not in the pickler's batches of 1,000), and a gunzipped pickle's byte offset
/// says it counts decompressed bytes.
#[test]
fn truncation_errors_count_the_entries_read_exactly() {
    // Every cut of a small snapshot: the count rises one entry at a time, from 0 to all of
    // them (python's count) just before the final STOP.
    let p = std::fs::read(fixture("snapshot_p4.pickle")).unwrap();
    let all = expected()["snapshot"]["entries"].as_u64().unwrap();
    let mut last = 0;
    for cut in 2..p.len() {
        let message = match read_bytes("p4", &p[..cut], strict()) {
            Err(TraceError::Malformed { message, .. }) => message,
            other => panic!("cut {cut}: {other:?}"),
        };
        let n = entries_before(&message);
        assert!(n == last || n == last + 1, "cut {cut}: {last} then {n}");
        last = n;
    }
    assert_eq!(last, all);
    // The shipped trace cut at 50,000 bytes, inside the pickler's first batch of 1,000 entries:
    // the entries before the cut are counted (an earlier reader said 0), at least as many as
    // the events a lenient read keeps from them (free_requested entries are not events).
    let gz = std::fs::read(shipped("mixed_sizes")).unwrap();
    let raw = gunzip(&gz);
    let message = read_bytes("mixed_sizes.pickle", &raw[..50_000], strict())
        .unwrap_err()
        .to_string();
    let n = entries_before(&message);
    let kept = read_bytes("mixed_sizes.pickle", &raw[..50_000], lenient())
        .unwrap()
        .events
        .len() as u64;
    assert!(
        kept > 0 && n >= kept && n < 1000,
        "{n} entries, {kept} kept: {message}"
    );
    assert!(
        message.contains("truncated at byte offset 50000 of 50000 ("),
        "{message}"
    );
    // The same cut pickle gzip'd: the offset is into the decompressed pickle, and says so.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &raw[..50_000]).unwrap();
    let cut_gz = enc.finish().unwrap();
    let message = read_bytes("cut.pickle.gz", &cut_gz, strict())
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("truncated at byte offset 50000 of 50000 of the decompressed pickle"),
        "{message}"
    );
    assert_eq!(entries_before(&message), n, "{message}");
}

/// New-user trial: a strict read of a truncated pickle, plain or gzip'd, suggests `--lenient`
/// with what it would keep, exactly when that is something; a lenient read never suggests
/// itself, and a file cut before anything could be kept gets no suggestion.
#[test]
fn the_lenient_hint_appears_exactly_when_it_helps() {
    let gz = std::fs::read(shipped("mixed_sizes")).unwrap();
    let raw = gunzip(&gz);
    let hint = "a lenient read (--lenient) keeps the";
    // A plain pickle cut after some entries: the hint, with the count a lenient read keeps.
    let cut = &raw[..50_000];
    let kept = read_bytes("cut.pickle", cut, lenient())
        .unwrap()
        .events
        .len();
    let e = read_bytes("cut.pickle", cut, strict())
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with(&format!("{hint} {kept} events read before the cut")),
        "{e}"
    );
    // A gzip file cut in the middle: the same, counted on what it inflated to.
    let cut_gz = &gz[..gz.len() / 2];
    let t = read_bytes("cut.pickle.gz", cut_gz, lenient()).unwrap();
    let e = read_bytes("cut.pickle.gz", cut_gz, strict())
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with(&format!(
            "{hint} {} events inflated before it",
            t.events.len()
        )),
        "{e}"
    );
    // Read leniently, the note says where the file was cut, and suggests nothing.
    let note = t.truncated.unwrap();
    assert!(note.starts_with("gzip data truncated"), "{note}");
    assert!(!note.contains("lenient"), "{note}");
    // Cut before a single entry (a plain pickle), or before any inflated byte (gzip): a
    // lenient read keeps nothing, and neither read suggests it.
    let e = read_bytes("c300.pickle", &raw[..300], strict())
        .unwrap_err()
        .to_string();
    assert!(e.contains("after 0 complete trace entries"), "{e}");
    assert!(!e.contains("lenient"), "{e}");
    for options in [strict(), lenient()] {
        let e = read_bytes("tiny.pickle.gz", &gz[..30], options)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gzip data truncated"), "{e}");
        assert!(!e.contains("lenient"), "{e}");
    }
    // A corrupt pickle (an unknown opcode), which a lenient read does not salvage either.
    let mut bad = raw[..50_000].to_vec();
    bad.push(0xff);
    bad.extend_from_slice(&raw[50_000..]);
    let e = read_bytes("bad.pickle", &bad, strict())
        .unwrap_err()
        .to_string();
    assert!(e.contains("corrupt pickle at byte offset 50000"), "{e}");
    assert!(!e.contains("lenient"), "{e}");
}

/// New-user trial: a JSON-lines line that is valid JSON but not an object says so, naming what
/// it found (serde's "invalid type: integer `1`, expected a string" named no object at all).
#[test]
fn a_jsonl_line_that_is_not_an_object_says_what_it_is() {
    let good = "{\"action\":\"alloc\",\"addr\":1,\"size\":512}\n";
    for (line, found) in [
        ("[1,2]", "an array"),
        ("42", "a number"),
        ("-1.5", "a number"),
        ("\"alloc\"", "a string"),
        ("null", "null"),
        ("true", "a boolean"),
    ] {
        let text = format!("{good}{line}\n");
        let e = read_bytes("t.jsonl", text.as_bytes(), strict())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "t.jsonl: line 2: expected a JSON object such as {{\"action\":\"alloc\",...}}, \
                 found {found}"
            )
        );
        // Lenient: skipped with the same reason.
        let t = read_bytes("t.jsonl", text.as_bytes(), lenient()).unwrap();
        assert_eq!(t.events.len(), 1);
        assert!(
            t.skipped[0].ends_with(&format!("found {found}")),
            "{:?}",
            t.skipped
        );
    }
    // An object with a wrong value still names its key.
    let e = read_bytes("t.jsonl", b"{\"action\":[1,2]}\n", strict())
        .unwrap_err()
        .to_string();
    assert!(e.contains("key \"action\""), "{e}");
}

/// New-user trial: messages write an address the way the file wrote it, so that it can be
/// found there: JSON lines in decimal with the hex in brackets, RMM logs as their `Pointer`
/// column has it (hex, or decimal with the hex), PyTorch snapshots in hex.
#[test]
fn messages_write_addresses_as_the_file_wrote_them() {
    let e = read_bytes("t.jsonl", b"{\"action\":\"free\",\"addr\":991}\n", strict())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "t.jsonl: line 1: free of address 991 (0x3df) (device 0) that is not live (never allocated)"
    );
    let e = read_bytes(
        "t.jsonl",
        b"{\"action\":\"alloc\",\"addr\":991,\"size\":8}\n{\"action\":\"alloc\",\"addr\":991,\"size\":8}\n",
        strict(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(
            "line 2: alloc of 8 bytes at address 991 (0x3df) (device 0), which is already live"
        ),
        "{e}"
    );
    let head = "Thread,Time,Action,Pointer,Size,Stream\n";
    for (pointer, shown) in [("0x3df", "0x3df"), ("991", "991 (0x3df)")] {
        let log = format!("{head}1,10:00:00.5,free,{pointer},256,0x0\n");
        let e = read_bytes("rmm.csv", log.as_bytes(), strict())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "line 2: free of address {shown} (device 0) that is not live"
            )),
            "{e}"
        );
    }
    // A snapshot: hex (duplicate_alloc.pickle allocates address 4096 twice).
    let e = read_path(&fixture("duplicate_alloc.pickle"), strict())
        .unwrap_err()
        .to_string();
    assert!(e.contains("at address 0x1000 (device 0)"), "{e}");
}

/// New-user trial: a tar archive (`.tar`, or `.tgz` once gunzipped) is named as one, with what
/// to do, instead of "binary data that is neither gzip nor a pickle".
#[test]
fn a_tar_archive_is_named_as_one() {
    // A ustar header for `trace.pickle` (what `tar -cf` writes), then the file's first block.
    let mut tar = vec![0u8; 1024];
    tar[..12].copy_from_slice(b"trace.pickle");
    tar[100..108].copy_from_slice(b"0000644\0");
    tar[124..136].copy_from_slice(b"00000001000\0");
    tar[257..263].copy_from_slice(b"ustar\0");
    tar[263..265].copy_from_slice(b"00");
    tar[512..515].copy_from_slice(b"\x80\x04\x95");
    let e = read_bytes("traces.tar", &tar, strict()).unwrap_err();
    assert!(matches!(e, TraceError::NotATrace { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "traces.tar: not an allocation trace: a tar archive: extract the trace first (tar -xf FILE)"
    );
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &tar).unwrap();
    let tgz = enc.finish().unwrap();
    let e = read_bytes("traces.tgz", &tgz, strict())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "traces.tgz: not an allocation trace: after gunzip, a tar archive: extract the trace \
         first (tar -xf FILE)"
    );
}

/// The gzip bytes of `text[..cut]` as a stream that a reader finds cut there: the deflate
/// data is sync-flushed after `cut` bytes and the rest (and the trailer) never written.
fn gzip_cut_at(text: &[u8], cut: usize) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&text[..cut]).unwrap();
    gz.flush().unwrap();
    gz.get_ref().clone()
}

/// A gzip'd line format cut inside a line: the part of the line is the cut's, said once in
/// the truncation note, not again as a bad event ("line N: not valid JSON: EOF while
/// parsing"), and for CSV not read as an event whose number was cut short.
#[test]
fn a_line_cut_by_the_gzip_damage_is_noted_once() {
    let text = std::fs::read(fixture("sample.jsonl")).unwrap();
    // Inside line 4 (`{"action":"free","addr":1}`).
    let cut = text
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'\n')
        .nth(2)
        .unwrap()
        .0
        + 10;
    let t = read_bytes("cut.jsonl.gz", &gzip_cut_at(&text, cut), lenient()).unwrap();
    assert_eq!(t.events.len(), 2);
    assert_eq!(t.preexisting.len(), 1);
    assert_eq!(
        (t.skipped_count, t.skipped.len()),
        (0, 0),
        "{:?}",
        t.skipped
    );
    let note = t.truncated.unwrap();
    assert!(
        note.starts_with("gzip data truncated or corrupt after "),
        "{note}"
    );
    assert!(
        note.ends_with("; kept the 2 events inflated before it (line 4, cut short, left out)"),
        "{note}"
    );
    // A strict read still stops at the damage and offers what a lenient one keeps.
    let e = read_bytes("cut.jsonl.gz", &gzip_cut_at(&text, cut), strict())
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("a lenient read (--lenient) keeps the 2 events inflated before it"),
        "{e}"
    );
    // Cut just after a line break: nothing was cut short, and the note says nothing of it.
    let t = read_bytes("cut.jsonl.gz", &gzip_cut_at(&text, cut - 9), lenient()).unwrap();
    assert_eq!((t.events.len(), t.skipped_count), (2, 0));
    assert!(t
        .truncated
        .unwrap()
        .ends_with("kept the 2 events inflated before it"));

    // An RMM log cut inside the size of line 3 (`...,256,0x5e1a40`): not a 25-byte block.
    let csv = std::fs::read(fixture("sample_rmm.csv")).unwrap();
    let line3 = String::from_utf8_lossy(&csv)
        .lines()
        .take(2)
        .map(|l| l.len() + 1)
        .sum::<usize>();
    let cut = line3 + "140245,09:12:33.000200,allocate,0x7f5a2c100000,25".len();
    let t = read_bytes("cut.csv.gz", &gzip_cut_at(&csv, cut), lenient()).unwrap();
    assert_eq!(t.format, Some(Format::RmmCsv));
    assert_eq!(t.events.len(), 1);
    assert_eq!(t.events[0].size_bytes, 1_048_576);
    assert_eq!(t.skipped_count, 0);
    assert!(t
        .truncated
        .unwrap()
        .ends_with("kept the 1 event inflated before it (line 3, cut short, left out)"));
}
