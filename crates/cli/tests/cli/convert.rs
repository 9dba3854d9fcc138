//! `gpumem convert`: to JSON lines and back, standard input, what JSON lines do not keep.
use crate::common::{
    assert_no_temporary_files, gpumem, gpumem_ok, gpumem_stdin, repo, scratch, write_file, FIXTURES,
};

#[test]
fn convert_to_jsonl_and_replay_gives_the_same_figures() {
    let out = std::env::temp_dir().join(format!("gpumem-convert-{}.jsonl", std::process::id()));
    gpumem_ok(&[
        "convert",
        "traces/mixed_sizes.pickle.gz",
        "-o",
        out.to_str().unwrap(),
    ]);
    let figures = |path: &str| {
        let (o, _) = gpumem_ok(&["replay", path, "-a", "torch,tlsf", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&o).unwrap();
        (
            v["trace"]["peak_requested_bytes"].clone(),
            v["allocators"][0]["peak_reserved_bytes"].clone(),
            v["allocators"][1]["peak_reserved_bytes"].clone(),
        )
    };
    assert_eq!(
        figures("traces/mixed_sizes.pickle.gz"),
        figures(out.to_str().unwrap())
    );
    let _ = std::fs::remove_file(out);
}

/// Issue 9 items 6, 7 and 9: standard input, converting onto the input, segments-only
/// snapshots.
#[test]
fn convert_reads_stdin_refuses_its_input_and_keeps_segments() {
    let snap = std::fs::read(repo().join(FIXTURES).join("snapshot_p4.pickle.gz")).unwrap();
    let (ok, from_stdin, err) = gpumem_stdin(&["convert", "-"], &snap);
    assert!(ok, "{err}");
    let (from_file, _) = gpumem_ok(&["convert", &format!("{FIXTURES}/snapshot_p4.pickle.gz")]);
    assert_eq!(from_stdin, from_file);
    let (ok, out, err) = gpumem_stdin(&["replay", "-", "-a", "torch", "--json"], &snap);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trace"]["alloc_events"], 3);
    // Random bytes on standard input are refused on their first bytes.
    let noise: Vec<u8> = (0..4_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let (ok, _, err) = gpumem_stdin(&["replay", "-"], &noise);
    assert!(!ok && err.contains("binary data"), "{err}");

    let dir = std::env::temp_dir().join(format!("gpumem-cli-convert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let own = dir.join("t.jsonl");
    write_file(&own, &from_file);
    let spelled = format!("{}/./t.jsonl", dir.display());
    let (ok, _, err) = gpumem(&["convert", own.to_str().unwrap(), "-o", &spelled]);
    assert!(!ok && err.contains("that is the input file"), "{err}");
    assert_eq!(std::fs::read_to_string(&own).unwrap(), from_file);
    let out = dir.join("out.jsonl");
    gpumem_ok(&[
        "convert",
        own.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), from_file);
    assert_no_temporary_files(&dir);

    // Segments only: the allocated blocks become preexisting lines, and the file replays.
    let seg = dir.join("segments.jsonl");
    let (_, err) = gpumem_ok(&[
        "convert",
        &format!("{FIXTURES}/segments_only.pickle"),
        "-o",
        seg.to_str().unwrap(),
    ]);
    assert!(err.contains("written as preexisting"), "{err}");
    let text = std::fs::read_to_string(&seg).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("\"action\":\"preexisting\"") && text.contains("\"size\":1000"));
    let (out, _) = gpumem_ok(&["replay", seg.to_str().unwrap(), "-a", "torch", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trace"]["peak_requested_bytes"], 1000);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `convert` says what JSON lines cannot keep and a replay of the snapshot uses: its
/// allocator setting and the segments made before recording began (a converted
/// warm-process trace replayed silently under native, or without those segments).
#[test]
fn convert_says_what_json_lines_do_not_keep() {
    let dir = scratch("convert-lost");
    let out = dir.join("x.jsonl");
    let out = out.to_str().unwrap();
    let (_, err) = gpumem_ok(&[
        "convert",
        "traces/warm_process/gpt2_preloaded_expandable.pickle.gz",
        "-o",
        out,
    ]);
    assert!(
        err.contains("--torch-conf 'expandable_segments:True'"),
        "{err}"
    );
    let (_, err) = gpumem_ok(&[
        "convert",
        "traces/warm_process/seg_train.pickle.gz",
        "-o",
        out,
    ]);
    assert!(
        err.contains("do not keep the 2 segments made before recording began"),
        "{err}"
    );
    assert!(!err.contains("allocator setting"), "{err}");
    // Nothing lost, nothing said.
    let (_, err) = gpumem_ok(&["convert", "traces/mixed_sizes.pickle.gz", "-o", out]);
    assert!(!err.contains("note:"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
