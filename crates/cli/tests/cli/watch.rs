//! `gpumem watch`: samples, pool-stats files, without a driver.
use crate::common::{gpumem, gpumem_ok, one_line_error, scratch, write_file};
use std::process::Command;

/// `watch` without the NVIDIA driver: one clear line, not the loader's wording.
#[test]
fn watch_without_a_driver_says_so_in_one_line() {
    let (ok, out, err) = gpumem(&["watch", "--once"]);
    if ok {
        return; // a machine with the driver
    }
    assert!(out.is_empty(), "{out}");
    one_line_error(&err);
    if err.contains("no NVIDIA driver") {
        assert_eq!(
            err.trim_end(),
            "error: no NVIDIA driver (libnvidia-ml.so.1, NVML) found: there is no GPU to watch"
        );
    }
    assert!(!err.contains("libloading"), "{err}");
}

#[test]
fn watch_once_samples_or_says_why_not() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["watch", "--once", "--json"])
        .output()
        .unwrap();
    if out.status.success() {
        // A machine with the NVIDIA driver: one sample with at least one device.
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let devs = v["devices"].as_array().unwrap();
        assert!(!devs.is_empty());
        assert!(devs[0]["total_bytes"].as_u64().unwrap() > 0);
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("NVML") || err.contains("no GPU"), "{err}");
        assert!(out.stdout.is_empty());
    }
}

/// `watch --once --pool-stats DIR` stopped at the missing NVIDIA driver, though the pools'
/// files need no driver to be read. Without NVML it now says so once and shows the pools
/// (text and JSON, `nvml_error` saying why `devices` is empty); a skipped file is named with
/// where its JSON broke; a folder that is missing or a file is refused naming the flag; and
/// with no driver and no pool there is nothing to watch, said in one line.
#[test]
fn watch_shows_the_pools_without_a_driver() {
    let dir = scratch("watch-pools");
    let d = dir.to_str().unwrap();
    write_file(
        dir.join("1234.json"),
        r#"{"device":0,"strategy":"paged","reserved_bytes.all.current":4194304,"reserved_bytes.all.peak":8388608,"allocated_bytes.all.current":1024,"allocated_bytes.all.peak":2048}"#,
    );
    write_file(dir.join("junk.json"), "{\"device\": 0,\n oops");
    let (out, err) = gpumem_ok(&["watch", "--once", "--pool-stats", d]);
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
    let (out, _) = gpumem_ok(&["watch", "--once", "--json", "--pool-stats", d]);
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
