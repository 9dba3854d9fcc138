//! Where the commands write: `-o` and `--timeline` files left alone on failure, links, FIFOs, closed or full standard output.
use crate::common::{
    assert_no_temporary_files, copy_trace, entries, gpumem, gpumem_in, gpumem_ok, one_line_error,
    repo, scratch, write_file,
};
use std::process::Command;

/// A reader that closes the pipe (`gpumem replay T | head -1`) ends gpumem quietly with exit
/// status 0, not with a "failed printing to stdout" panic.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    for args in [
        &["replay", "traces/mixed_sizes.pickle.gz", "-a", "tlsf"][..],
        &["tune", "traces/mixed_sizes.pickle.gz"][..],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(args)
            .current_dir(repo())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Close the reading end before gpumem prints anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn report_refuses_to_write_onto_its_input() {
    let dir = scratch("report-self");
    let t = copy_trace(&dir, "traces/mixed_sizes.pickle.gz");
    let before = std::fs::read(&t).unwrap();
    let spelled = format!("{}/./mixed_sizes.pickle.gz", dir.display());
    let (ok, _, err) = gpumem(&["report", t.to_str().unwrap(), "-o", &spelled]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("-o ") && err.contains("that is the input file"),
        "{err}"
    );
    one_line_error(&err);
    // A hard link is the same file under another name.
    let link = dir.join("link.pickle.gz");
    std::fs::hard_link(&t, &link).unwrap();
    let (ok, _, err) = gpumem(&["report", t.to_str().unwrap(), "-o", link.to_str().unwrap()]);
    assert!(!ok && err.contains("that is the input file"), "{err}");
    assert_eq!(std::fs::read(&t).unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn timeline_never_touches_its_file_before_the_end() {
    let dir = scratch("timeline");
    let t = copy_trace(&dir, "traces/mixed_sizes.pickle.gz");
    let before = std::fs::read(&t).unwrap();
    let svg = dir.join("x.svg");
    write_file(&svg, "<svg>old</svg>");
    let old = || std::fs::read_to_string(&svg).unwrap();
    let tp = t.to_str().unwrap();
    let sp = svg.to_str().unwrap();

    // The trace itself as the output: refused, the trace unchanged.
    let (ok, _, err) = gpumem(&["replay", tp, "--timeline", tp, "-a", "torch"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("--timeline") && err.contains("input file"),
        "{err}"
    );
    assert_eq!(std::fs::read(&t).unwrap(), before);
    let renamed = dir.join("same.svg");
    std::fs::hard_link(&t, &renamed).unwrap();
    let (ok, _, err) = gpumem(&["replay", tp, "--timeline", renamed.to_str().unwrap()]);
    assert!(!ok && err.contains("input file"), "{err}");
    assert_eq!(std::fs::read(&t).unwrap(), before);

    // A missing trace, a malformed one, a bad option: the old picture stays.
    let missing = dir.join("missing.pickle.gz");
    let (ok, _, err) = gpumem(&["replay", missing.to_str().unwrap(), "--timeline", sp]);
    assert!(!ok, "{err}");
    assert_eq!(old(), "<svg>old</svg>");
    let bad = dir.join("bad.jsonl");
    write_file(&bad, "{\"action\":\"alloc\"\n");
    let (ok, _, err) = gpumem(&["replay", bad.to_str().unwrap(), "--timeline", sp]);
    assert!(!ok, "{err}");
    assert_eq!(old(), "<svg>old</svg>");
    let (ok, _, err) = gpumem(&[
        "replay",
        tp,
        "-a",
        "paged-lazy",
        "--lazy-conf",
        "grow_ahead=5",
        "--timeline",
        sp,
    ]);
    assert!(!ok && err.contains("--lazy-conf"), "{err}");
    assert_eq!(old(), "<svg>old</svg>");

    // A good run replaces it, and leaves no temporary file behind.
    gpumem_ok(&["replay", tp, "-a", "torch", "--timeline", sp]);
    assert!(old().starts_with("<svg") && old().contains("torch: peak reserved"));
    assert_no_temporary_files(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn report_and_convert_leave_an_old_output_alone_on_failure() {
    let dir = scratch("outputs");
    let out = dir.join("old.html");
    write_file(&out, "old");
    let missing = dir.join("missing.jsonl");
    for cmd in ["report", "convert"] {
        let (ok, _, err) = gpumem(&[cmd, missing.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert!(!ok, "{cmd}: {err}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "old", "{cmd}");
    }
    // An output in a folder that does not exist is refused before the trace is read.
    let nowhere = dir.join("no/such/folder/r.html");
    let (ok, _, err) = gpumem(&[
        "report",
        "traces/mixed_sizes.pickle.gz",
        "-o",
        nowhere.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("does not exist"), "{err}");
    one_line_error(&err);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An output that is a symbolic link, or a FIFO (as `/dev/stdout` or `/dev/null` are not
/// regular files either), was replaced by a regular file: the temporary file was renamed over
/// the link or the FIFO itself (`report -o /dev/full` replaced the device). The link now stays
/// and its file gets the output; a FIFO is written in place.
#[cfg(target_os = "linux")]
#[test]
fn outputs_write_through_links_and_into_fifos() {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let dir = scratch("special-outputs");
    let trace = dir.join("tiny.jsonl");
    // As convert writes it (a free with its size), so that the output is the input.
    let lines =
        "{\"action\":\"alloc\",\"addr\":1,\"size\":512}\n{\"action\":\"free\",\"addr\":1,\"size\":512}\n";
    write_file(&trace, lines);
    let trace = trace.to_str().unwrap();
    // A link to a file.
    let real = dir.join("real.jsonl");
    write_file(&real, "old\n");
    let link = dir.join("link.jsonl");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    gpumem_ok(&["convert", trace, "-o", link.to_str().unwrap()]);
    assert!(link.is_symlink(), "the link was replaced by a file");
    assert_eq!(std::fs::read_to_string(&real).unwrap(), lines);
    // A FIFO, opened for reading first (without waiting for a writer) so that the command's
    // open for writing does not block; the output fits in the pipe's buffer.
    let fifo = dir.join("pipe");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    const O_NONBLOCK: i32 = 0o4000;
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    gpumem_ok(&["convert", trace, "-o", fifo.to_str().unwrap()]);
    let is_fifo = std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo();
    let mut got = String::new();
    let _ = reader.read_to_string(&mut got);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(is_fifo, "the FIFO was replaced by a file");
    assert_eq!(got, lines);
}

/// Standard output that cannot be written (`> /dev/full`: no space left) made `println!`
/// panic with a backtrace; it is now one line of error and exit status 1.
#[cfg(target_os = "linux")]
#[test]
fn a_full_standard_output_is_an_error_not_a_panic() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full");
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args([
            "replay",
            "traces/mixed_sizes.pickle.gz",
            "-a",
            "tlsf",
            "--json",
        ])
        .current_dir(repo())
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    one_line_error(&err);
    assert!(
        err.contains("error: writing to standard output: No space left on device"),
        "{err}"
    );
}

/// An output under a file (`-o notes.txt/r.html`) said "the folder notes.txt does not exist",
/// which it does, as a file; it now says so.
#[test]
fn an_output_under_a_file_names_the_file() {
    let dir = scratch("under-a-file");
    let file = dir.join("notes.txt");
    write_file(&file, "x");
    let out = file.join("r.html");
    let (ok, _, err) = gpumem(&[
        "report",
        "traces/mixed_sizes.pickle.gz",
        "-a",
        "tlsf",
        "-o",
        out.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok);
    one_line_error(&err);
    assert!(
        err.contains(&format!("{} is a file, not a folder", file.display())),
        "{err}"
    );
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
