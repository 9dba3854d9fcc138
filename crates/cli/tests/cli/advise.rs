//! `gpumem advise`: its units, directions and tables.
use crate::common::{gpumem, gpumem_ok, one_line_error, scratch, write_file};
use std::process::Command;

#[test]
fn advise_models_a_one_byte_copy_no_faster_than_the_smallest_measured() {
    // An empty cache directory: the built-in H200 table, whatever this machine cached.
    let run = |size: &str| -> f64 {
        let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(["advise", "--size", size, "--json"])
            .env("XDG_CACHE_HOME", "/nonexistent/gpumem-test-cache")
            .output()
            .expect("run gpumem");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        pageable_s(&String::from_utf8_lossy(&out.stdout))
    };
    fn pageable_s(out: &str) -> f64 {
        let j: serde_json::Value = serde_json::from_str(out).expect("json");
        j["options"]
            .as_array()
            .and_then(|o| o.iter().find(|k| k["kind"] == "pageable"))
            .and_then(|k| k["transfer_s"].as_f64())
            .expect("pageable option")
    }
    let one = run("1B");
    let page = run("4KiB");
    assert!(one > 1e-6, "1 B modelled at {one} s");
    assert!(one <= page, "{one} > {page}");
}

/// `advise` speaks in the units its table uses: the pinned-cap note in bytes units (it said
/// "1099511627776 B is more than the pinned cap of 12638255104 B") and the recommendation's
/// time in the unit that keeps it readable (it said "32055.733 ms", "0.054 ms").
#[test]
fn advise_speaks_in_human_units() {
    let (out, _) = gpumem_ok(&["advise", "--size", "1TiB", "--cap", "1GiB"]);
    assert!(
        out.contains("1.00 TiB is more than the pinned cap of 1.00 GiB"),
        "{out}"
    );
    let rec = out
        .lines()
        .find(|l| l.starts_with("recommended: "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(rec.contains(" s per transfer"), "{rec}");
    let (out, _) = gpumem_ok(&["advise", "--size", "1MiB"]);
    let rec = out
        .lines()
        .find(|l| l.starts_with("recommended: "))
        .unwrap();
    assert!(!rec.contains(" 0.0"), "{rec}");
    assert!(rec.contains(" µs per transfer"), "{rec}");
}

/// `advise` refuses a rate or horizon that is no number of the kind asked for (it printed
/// "NaN/s", "-3/s", "over NaN s" and "inf %" and advised on them) and a direction it does
/// not advise on (`both` dropped the pageable row; `d2h,h2d` silently took the first).
#[test]
fn advise_refuses_nonsense_rates_and_directions() {
    for (flag, value, says) in [
        (
            "--per-second",
            "nan",
            "expected transfers per second, a number ≥ 0",
        ),
        (
            "--per-second",
            "inf",
            "expected transfers per second, a number ≥ 0",
        ),
        (
            "--per-second",
            "-3",
            "expected transfers per second, a number ≥ 0",
        ),
        (
            "--horizon",
            "nan",
            "expected the seconds the pattern runs, a number above 0",
        ),
        (
            "--horizon",
            "-1",
            "expected the seconds the pattern runs, a number above 0",
        ),
        (
            "--horizon",
            "0",
            "expected the seconds the pattern runs, a number above 0",
        ),
        ("--direction", "both", "expected one direction, h2d or d2h"),
        (
            "--direction",
            "d2h,h2d",
            "expected one direction, h2d or d2h",
        ),
    ] {
        let (ok, out, err) = gpumem(&["advise", "--size", "64MiB", flag, value]);
        assert!(!ok, "{flag} {value}: {out}");
        assert!(
            err.contains(flag) && err.contains(says),
            "{flag} {value}: {err}"
        );
    }
    // A one-off is said so, not "0/s".
    let (out, _) = gpumem_ok(&["advise", "--size", "64MiB", "--direction", "d2h"]);
    assert!(
        out.starts_with("d2h 64.00 MiB per transfer, a one-off, over 60 s;"),
        "{out}"
    );
}

/// `advise --table` with a file that is not a transfer table says what it expected and where
/// `bench transfer` caches one (it said only "missing field `source`").
#[test]
fn advise_table_of_the_wrong_kind_says_what_it_expected() {
    let dir = scratch("advise-table");
    let bad = dir.join("bad.json");
    write_file(&bad, "{\"a\": 1}");
    let (ok, _, err) = gpumem(&["advise", "--table", bad.to_str().unwrap(), "--size", "1GiB"]);
    assert!(!ok);
    one_line_error(&err);
    assert!(err.contains(bad.to_str().unwrap()), "{err}");
    assert!(
        err.contains("expected a table as `gpumem bench transfer` caches it for advise"),
        "{err}"
    );
    assert!(err.contains("gpumem/transfer.json"), "{err}");
    // A folder or a missing file: the flag is named too (it said only "reading DIR: Is a
    // directory").
    for p in [dir.clone(), dir.join("missing.json")] {
        let (ok, _, err) = gpumem(&["advise", "--table", p.to_str().unwrap(), "--size", "1GiB"]);
        assert!(!ok);
        one_line_error(&err);
        assert!(
            err.contains(&format!("--table {}: reading it", p.display())),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An unsustainable rate keeps `advise`'s table in its columns (busy % printed 121394184.6)
/// and the recommendation says how many transfers a second can be sustained.
#[test]
fn advise_at_an_impossible_rate_keeps_its_columns() {
    let (out, _) = gpumem_ok(&["advise", "--size", "64MiB", "--per-second", "1e9"]);
    let lines: Vec<&str> = out.lines().collect();
    let head = lines.iter().position(|l| l.starts_with("kind ")).unwrap();
    let note_at = lines[head].find("  note").unwrap();
    for row in &lines[head + 1..head + 6] {
        // Every row's note starts where the header's does.
        assert_eq!(&row[note_at..note_at + 2], "  ", "{row}");
        assert_ne!(&row[note_at + 2..note_at + 3], " ", "{row}");
        assert!(row[..note_at].trim_end().ends_with("e8"), "{row}");
    }
    let rec = lines
        .iter()
        .find(|l| l.starts_with("recommended:"))
        .unwrap();
    // pinned, 1.216 ms per transfer: 822 a second.
    assert!(
        rec.contains("that is 1.2e8 % of each second: the pattern cannot be sustained (at most 822 transfers a second)"),
        "{rec}"
    );
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
    let (out, _) = gpumem_ok(&["advise", "--size", "64MiB", "--direction", "d2h"]);
    assert!(out.starts_with("d2h 64.00 MiB per transfer"), "{out}");
}
