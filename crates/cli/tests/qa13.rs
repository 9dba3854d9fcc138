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
