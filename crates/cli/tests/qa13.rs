//! What the thirteenth fresh-user pass of the `gpumem` binary found: each test runs the binary
//! as a user would and checks the exit status, the message and the figures.
mod common;

use common::{gpumem, one_line_error, scratch};

/// `watch --once --pool-stats DIR` stopped at the missing NVIDIA driver, though the pools'
/// files need no driver to be read. Without NVML it now says so once and shows the pools
/// (text and JSON, `nvml_error` saying why `devices` is empty); a skipped file is named with
/// where its JSON broke; a folder that is missing or a file is refused naming the flag; and
/// with no driver and no pool there is nothing to watch, said in one line.
#[test]
fn watch_shows_the_pools_without_a_driver() {
    let dir = scratch("watch-pools");
    let d = dir.to_str().unwrap();
    std::fs::write(
        dir.join("1234.json"),
        r#"{"device":0,"strategy":"paged","reserved_bytes.all.current":4194304,"reserved_bytes.all.peak":8388608,"allocated_bytes.all.current":1024,"allocated_bytes.all.peak":2048}"#,
    )
    .unwrap();
    std::fs::write(dir.join("junk.json"), "{\"device\": 0,\n oops").unwrap();
    let (ok, out, err) = gpumem(&["watch", "--once", "--pool-stats", d]);
    assert!(ok, "{err}");
    let pool_line = "gpumem pool 1234 (device 0, paged): reserved 4.00 MiB (peak 8.00 MiB), allocated 1.00 KiB (peak 2.00 KiB)";
    assert!(out.lines().any(|l| l == pool_line), "{out}");
    let junk = dir.join("junk.json");
    assert!(
        err.contains(&format!(
            "note: {}: not JSON (line 2, column 2), skipped",
            junk.display()
        )),
        "{err}"
    );
    let no_driver = err.contains("no NVIDIA driver");
    if no_driver {
        assert!(
            err.contains(&format!(
                "note: no NVIDIA driver (libnvidia-ml.so.1, NVML) found: no GPU figures, only the gpumem pools of {d}\n"
            )),
            "{err}"
        );
        assert_eq!(out.lines().count(), 1, "{out}");
    }
    let (ok, out, err) = gpumem(&["watch", "--once", "--json", "--pool-stats", d]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let pools = v["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 1, "{out}");
    assert_eq!(pools[0]["reserved_bytes"], 4_194_304);
    assert_eq!(pools[0]["allocated_peak_bytes"], 2048);
    if no_driver {
        assert_eq!(v["devices"].as_array().unwrap().len(), 0);
        assert_eq!(
            v["nvml_error"],
            "no NVIDIA driver (libnvidia-ml.so.1, NVML) found"
        );
    } else {
        assert!(v["nvml_error"].is_null(), "{out}");
    }

    // A folder that is not there, or a file.
    let missing = dir.join("missing");
    let (ok, out, err) = gpumem(&["watch", "--once", "--pool-stats", missing.to_str().unwrap()]);
    assert!(!ok && out.is_empty(), "{out}");
    one_line_error(&err);
    assert!(
        err.starts_with(&format!(
            "error: --pool-stats {}: No such file",
            missing.display()
        )),
        "{err}"
    );
    let (ok, _, err) = gpumem(&["watch", "--once", "--pool-stats", junk.to_str().unwrap()]);
    assert!(!ok);
    one_line_error(&err);
    assert!(
        err.contains("a file; expected the folder of gpumem pool statistics"),
        "{err}"
    );

    // No driver and no pool: nothing to watch, in one line.
    std::fs::remove_file(dir.join("1234.json")).unwrap();
    std::fs::remove_file(&junk).unwrap();
    let (ok, out, err) = gpumem(&["watch", "--once", "--pool-stats", d]);
    if no_driver {
        assert!(!ok && out.is_empty(), "{out}");
        one_line_error(&err);
        assert_eq!(
            err.trim_end(),
            format!("error: no NVIDIA driver (libnvidia-ml.so.1, NVML) found, and {d} holds no gpumem pool statistics (*.json, as the PyTorch plug-in's gpumem_stats_json writes them): nothing to watch")
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The live view (no `--once`) without a driver and with an empty pool-stats folder, from
/// `--pool-stats` or `$GPUMEM_STATS_DIR`: it took the terminal and showed an empty screen until
/// `q` (without a terminal it said "the live view needs a terminal"), where `--once` says there
/// is nothing to watch. It now stops alike: the same one-line error, the same failing status.
#[test]
fn the_live_watch_stops_where_once_does() {
    let dir = scratch("watch-live-empty");
    let d = dir.to_str().unwrap();
    let run = |args: &[&str], var: Option<&str>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_gpumem"));
        c.args(args).env_remove("GPUMEM_STATS_DIR");
        if let Some(v) = var {
            c.env("GPUMEM_STATS_DIR", v);
        }
        let out = c.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let once = run(&["watch", "--once", "--pool-stats", d], None);
    if !once.2.contains("no NVIDIA driver") {
        // A machine with a driver has something to watch.
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let expected = format!("error: no NVIDIA driver (libnvidia-ml.so.1, NVML) found, and {d} holds no gpumem pool statistics (*.json, as the PyTorch plug-in's gpumem_stats_json writes them): nothing to watch");
    assert_eq!(once.2.trim_end(), expected);
    assert!(!once.0 && once.1.is_empty());
    for (args, var) in [
        (vec!["watch", "--pool-stats", d], None),
        (vec!["watch"], Some(d)),
        (vec!["watch", "--interval", "100ms"], Some(d)),
    ] {
        let (ok, out, err) = run(&args, var);
        assert!(!ok && out.is_empty(), "{args:?}: {out}");
        one_line_error(&err);
        assert_eq!(err.trim_end(), expected, "{args:?}");
    }
    // In a terminal (util-linux `script` gives it one, where it is installed): it stops, where
    // it ran until killed.
    let script = std::process::Command::new("script")
        .args(["-qec"])
        .arg(format!(
            "{} watch --pool-stats {d}",
            env!("CARGO_BIN_EXE_gpumem")
        ))
        .arg("/dev/null")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    if let Ok(mut child) = script {
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if started.elapsed() > std::time::Duration::from_secs(20) {
                child.kill().unwrap();
                child.wait().unwrap();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let out = child.wait_with_output().unwrap();
        let shown = String::from_utf8_lossy(&out.stdout);
        let status = status.expect("the live view in a terminal did not stop in 20 s");
        assert!(!status.success(), "{shown}");
        assert!(shown.contains("nothing to watch"), "{shown}");
        // The terminal was never taken (no alternate screen).
        assert!(!shown.contains("\x1b[?1049h"), "{shown}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A negative number given to a flag that counts or numbers something was taken for an
/// unknown flag: "unexpected argument '-1' found; tip: to pass '-1' as a value, use '-- -1'",
/// advice that does not work. Each now says what it expected; `--repeats 0` said "0 is not in
/// 1..18446744073709551615".
#[test]
fn negative_counts_say_what_was_expected() {
    let t = "traces/mixed_sizes.pickle.gz";
    for (args, flag, what) in [
        (
            &["map", t, "--event", "-1"][..],
            "--event <EVENT>",
            "an event index, counted from 0 (a whole number)",
        ),
        (
            &["map", t, "--width", "-3"],
            "--width <WIDTH>",
            "at least 8 cells a line (a whole number)",
        ),
        (
            &["map", t, "--lines", "-1"],
            "--lines <LINES>",
            "at least one line (a whole number)",
        ),
        (
            &["map", t, "--trace-device", "-1"],
            "--trace-device <TRACE_DEVICE>",
            "a device ordinal (a whole number)",
        ),
        (
            &["tune", t, "--threads", "-1"],
            "--threads <THREADS>",
            "a thread count, 0 for every core (a whole number)",
        ),
        (
            &["tune", t, "--trace-device", "-1"],
            "--trace-device <TRACE_DEVICE>",
            "a device ordinal (a whole number)",
        ),
        (
            &["vmm", "--device", "sim", "--pages", "-1"],
            "--pages <PAGES>",
            "a page count (a whole number)",
        ),
        (
            &["bench", "alloc", "--device", "sim", "--max-pairs", "-5"],
            "--max-pairs <MAX_PAIRS>",
            "the most pairs a thread (a whole number ≥ 1)",
        ),
        (
            &["bench", "transfer", "--host-only", "--repeats", "0"],
            "--repeats <REPEATS>",
            "a repeat count (a whole number ≥ 1)",
        ),
        (
            &["bench", "pinned", "--repeats", "-2"],
            "--repeats <REPEATS>",
            "a repeat count (a whole number ≥ 1)",
        ),
        (
            &["bench", "transfer", "--host-only", "--stage-buffers", "-1"],
            "--stage-buffers <STAGE_BUFFERS>",
            "a buffer count (a whole number)",
        ),
    ] {
        let (ok, out, err) = gpumem(args);
        assert!(!ok && out.is_empty(), "{args:?}: {out}");
        let value = args[args.len() - 1];
        let want =
            format!("error: invalid value '{value}' for '{flag}': `{value}`: expected {what}");
        assert_eq!(err.lines().next(), Some(want.as_str()), "{args:?}");
        assert!(!err.contains("tip:") && !err.contains("panicked"), "{err}");
    }
}

/// `$GPUMEM_STATS_DIR` set but empty made clap say "a value is required for '--pool-stats'"
/// to a user who gave no --pool-stats: it now counts as unset. A folder it names that is not
/// there is refused naming the variable, not the flag.
#[test]
fn an_empty_stats_dir_variable_counts_as_unset() {
    let run = |value: &str, args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(args)
            .env("GPUMEM_STATS_DIR", value)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok_unset, err_unset) = {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(["watch", "--once"])
            .env_remove("GPUMEM_STATS_DIR")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = run("", &["watch", "--once"]);
    assert_eq!((ok, err.as_str()), (ok_unset, err_unset.as_str()));
    assert!(!err.contains("a value is required"), "{err}");
    let dir = scratch("stats-var");
    let missing = dir.join("missing");
    let (ok, err) = run(missing.to_str().unwrap(), &["watch", "--once"]);
    assert!(!ok);
    one_line_error(&err);
    assert!(
        err.starts_with(&format!(
            "error: GPUMEM_STATS_DIR={}: No such file",
            missing.display()
        )),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `advise --direction x` said "expected h2d, d2h or both", and `both` is then refused.
#[test]
fn advise_direction_offers_only_what_it_takes() {
    let (ok, _, err) = gpumem(&["advise", "--size", "64MiB", "--direction", "x"]);
    assert!(!ok);
    assert_eq!(
        err.lines().next(),
        Some("error: invalid value 'x' for '--direction <DIRECTION>': `x`: expected one direction, h2d or d2h")
    );
    let (ok, _, err) = gpumem(&["advise", "--size", "64MiB", "--direction", "both"]);
    assert!(!ok);
    assert!(err.contains("`both`: expected one direction, h2d or d2h (both at once is measured by `gpumem bench transfer --directions both`, not advised on)"), "{err}");
    let (ok, out, err) = gpumem(&["advise", "--size", "64MiB", "--direction", "d2h"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("d2h 64.00 MiB per transfer"), "{out}");
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
        let path = common::repo().join(trace);
        let path = path.to_str().unwrap();
        let (ok, out, err) = gpumem(&["replay", path, "-a", "torch", "--json", "--no-plan"]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let a = &v["allocators"][0];
        let html = dir.join("r.html");
        let (ok, _, err) = gpumem(&["report", path, "-a", "torch", "-o", html.to_str().unwrap()]);
        assert!(ok, "{err}");
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

/// `tune` on a trace whose requests are all of 0 bytes: native makes no driver time, and a
/// setting that makes none either is within 2 × of it (it said that none was, as the ratio
/// 0 ÷ 0 is undefined), so the plug-in's defaults are recommended.
#[test]
fn tune_recommends_a_setting_when_native_makes_no_driver_time() {
    let dir = scratch("tune-zero");
    let trace = dir.join("zero.jsonl");
    std::fs::write(
        &trace,
        "{\"action\":\"alloc\",\"addr\":1,\"size\":0}\n{\"action\":\"free\",\"addr\":1}\n",
    )
    .unwrap();
    let (ok, out, err) = gpumem(&["tune", trace.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "unset GPUMEM_CONF  # the plug-in's defaults (paged-lazy)\n  needs 2.00 MiB: the least memory of gpumem's settings within 2 × native's driver time"
        ),
        "{out}"
    );
    assert!(!out.contains("none of gpumem's settings"), "{out}");
}
