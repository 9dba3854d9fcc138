//! `gpumem tune`: which PYTORCH_CUDA_ALLOC_CONF runs a trace in the least memory.
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use gpumem::session;
use gpumem::tune::{self, TuneReport};

use gpumem::units::bytes as human_bytes;

/// Arguments of `gpumem tune`.
#[derive(Args)]
pub struct TuneArgs {
    /// The trace: a PyTorch memory snapshot (.pickle or .pickle.gz), an RMM log CSV, or
    /// gpumem JSON lines; `-` reads standard input.
    pub trace: PathBuf,
    #[command(flatten)]
    pub input: crate::trace_args::TraceArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Device ordinal of the trace to tune (default: the first with allocations).
    #[arg(long, allow_hyphen_values = true,
          value_parser = |s: &str| crate::units::whole_number::<u32>(s, 0, "a device ordinal"))]
    pub trace_device: Option<u32>,
    /// Refused: the trace's device is --trace-device, as in `report` and `map` (`--device`
    /// is where `replay` allocates).
    #[arg(long, hide = true, allow_hyphen_values = true)]
    pub device: Option<String>,
    /// Threads (0 = every core).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true,
          value_parser = |s: &str| crate::units::whole_number::<usize>(s, 0, "a thread count, 0 for every core"))]
    pub threads: usize,
}

pub fn run(a: TuneArgs) -> Result<()> {
    if let Some(d) = &a.device {
        anyhow::bail!(
            "--device {d}: tune names the trace's device with --trace-device {d}, as report and map do (--device is where replay allocates: sim or cuda)"
        );
    }
    session::check_capacity(a.input.capacity)?;
    let trace = a.input.read(&a.trace)?;
    crate::output::print_read_notes(&trace);
    let devices = session::alloc_devices(&trace);
    if devices.is_empty() {
        anyhow::bail!(
            "{}: nothing to tune: {}",
            gpumem::trace::source_name(&a.trace),
            session::why_no_allocation(&trace)
        );
    }
    let device = session::pick_device(&trace, "--trace-device", a.trace_device)?;
    let own = session::recorded_conf(&trace)?;
    // Each setting is a replay and a capacity search: seconds to minutes on a long trace.
    let bar = crate::progress::bar(0);
    let report =
        tune::tune_with_progress(&trace, own, a.input.capacity, device, a.threads, &|k, n| {
            if k == 0 {
                bar.set_length(n as u64);
                bar.set_message("settings replayed");
            }
            bar.set_position(k as u64);
        })
        .with_context(|| format!("tuning {}", gpumem::trace::source_name(&a.trace)))?;
    bar.finish_and_clear();
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("device".into(), device.into());
            o.insert("trace_devices".into(), devices.clone().into());
            o.insert("skipped_events".into(), trace.skipped_count.into());
            // The settings the table's `export` lines give (null where it exports none).
            o.insert(
                "recommended_pytorch_cuda_alloc_conf".into(),
                torch_pick(&report).map(|row| row.conf.clone()).into(),
            );
            o.insert(
                "recommended_gpumem_conf".into(),
                plugin_pick(&report)
                    .map(|(_, row)| row.gpumem_conf.clone())
                    .into(),
            );
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_report(&a, &report, own.is_some(), device, &devices);
    }
    Ok(())
}

fn print_report(a: &TuneArgs, r: &TuneReport, recorded: bool, device: u32, devices: &[u32]) {
    let which = if devices.len() > 1 {
        format!(
            ", device {device} of {} ({}; --trace-device N tunes another)",
            devices.len(),
            session::device_list(devices)
        )
    } else {
        String::new()
    };
    println!(
        "trace {}{which}: peak requested {}; its own setting: {}{}",
        gpumem::trace::source_name(&a.trace),
        human_bytes(r.peak_requested_bytes),
        r.trace_setting,
        if recorded {
            ""
        } else {
            " (the trace records no allocator_settings)"
        }
    );
    if let Some(c) = r.capacity_bytes {
        println!(
            "capacity {} (the garbage_collection_threshold settings take it as their memory limit, as set_per_process_memory_fraction sets it)",
            human_bytes(c)
        );
    }
    println!();
    let w = r
        .rows
        .iter()
        .map(|row| row.setting.len())
        .max()
        .unwrap_or(7)
        .max(7);
    // res/req and calls as wide as their widest cell in either table (a ratio of 2097152.000
    // on a trace of 1-byte requests, millions of driver calls).
    let cells: Vec<[String; 5]> = r
        .rows
        .iter()
        .map(|row| &row.figures)
        .chain(r.plugin_rows.iter().map(|row| &row.figures))
        .map(|f| figure_cells(f, r.capacity_bytes))
        .collect();
    let widest = |i: usize, least: usize| {
        cells
            .iter()
            .map(|c| c[i].chars().count())
            .max()
            .unwrap_or(0)
            .max(least)
    };
    let (rw, cw) = (widest(1, 8), widest(4, 7));
    println!(
        "{:<w$} {:>13} {:>rw$} {:>13} {:>5} {:>cw$}",
        "setting", "peak reserv.", "res/req", "min capacity", "OOMs", "calls",
    );
    for row in &r.rows {
        let [peak, ratio, cap, ooms, calls] = figure_cells(&row.figures, r.capacity_bytes);
        println!(
            "{:<w$} {peak:>13} {ratio:>rw$} {cap:>13} {ooms:>5} {calls:>cw$}{}",
            row.setting,
            if row.is_trace_setting {
                "  (the trace's own)"
            } else {
                ""
            },
        );
    }
    println!();
    println!(
        "peak reserv.: predicted peak reserved{}; res/req: ÷ peak requested; min capacity: smallest device from which every larger one runs the trace with no OOM (to 2 MiB); calls: driver calls.",
        if r.capacity_bytes.is_some() {
            " at the capacity given"
        } else {
            ""
        }
    );
    let figures = r.rows.iter().map(|row| (row.setting.clone(), &row.figures));
    print_footnotes(figures);
    if let (Some(best), Some(own)) = (r.best(), r.trace_row()) {
        let saving = |best: &tune::TuneRow| match (
            best.figures.min_capacity_bytes,
            own.figures.min_capacity_bytes,
        ) {
            (Some(b), Some(o)) if o > b => format!(
                "{} less than the trace's own setting ({}) needs",
                human_bytes(o - b),
                own.setting
            ),
            _ => format!("no less than the trace's own setting ({})", own.setting),
        };
        // The rows are ranked by OOMs first: when the first has one, every setting fails at
        // the capacity given, and a run under any of them would stop at its first OOM.
        if torch_pick(r).is_none() {
            let cap = human_bytes(
                r.capacity_bytes
                    .unwrap_or(gpumem::core::sim::DEFAULT_CAPACITY),
            );
            let least = r
                .rows
                .iter()
                .filter_map(|row| row.figures.min_capacity_bytes.map(|b| (b, row)))
                .min_by_key(|(b, _)| *b);
            match least {
                Some((b, row)) => println!(
                    "every setting has an OOM at {cap} (PyTorch stops at the first); the least demanding, {}, needs {}: {} (a larger --capacity, or none, to compare them)",
                    row.setting,
                    human_bytes(b),
                    saving(row)
                ),
                None => println!("every setting has an OOM at {cap} (PyTorch stops at the first)"),
            }
            print_plugin_rows(r, (rw, cw));
            eprint_timing(r);
            return;
        }
        let saving = saving(best);
        if best.conf.is_empty() {
            println!("unset PYTORCH_CUDA_ALLOC_CONF  # native: PyTorch's defaults");
        } else {
            println!("export PYTORCH_CUDA_ALLOC_CONF={}", shell_value(&best.conf));
        }
        println!(
            "  needs {}: {saving}",
            best.figures
                .min_capacity_bytes
                .map(human_bytes)
                .unwrap_or_else(|| "-".into())
        );
    }
    print_plugin_rows(r, (rw, cw));
    eprint_timing(r);
}

/// The last line, on standard error: how many settings, in how long, on how many threads.
fn eprint_timing(r: &TuneReport) {
    eprintln!(
        "{} PYTORCH_CUDA_ALLOC_CONF and {} GPUMEM_CONF settings in {:.1} s on {} thread{}",
        r.rows.len(),
        r.plugin_rows.len(),
        r.seconds,
        r.threads,
        if r.threads == 1 { "" } else { "s" }
    );
}

/// The cells both tables print for a setting's figures: peak reserved, res/req (`-` when no
/// byte was requested, `†` when allocations failed), min capacity (`*` when not monotone), OOMs (`-` without a capacity
/// given) and driver calls.
fn figure_cells(f: &tune::Figures, capacity: Option<u64>) -> [String; 5] {
    [
        human_bytes(f.peak_reserved_bytes),
        format!(
            "{}{}",
            // No byte requested (every allocation failed, or only zero-byte ones): no ratio,
            // shown `-` as `replay` shows it (`--json` keeps 0).
            if f.reserved_over_requested > 0.0 && f.reserved_over_requested.is_finite() {
                format!("{:.3}", f.reserved_over_requested)
            } else {
                "-".to_string()
            },
            if f.oom_count > 0 || f.refused_count > 0 {
                "†"
            } else {
                ""
            }
        ),
        f.min_capacity_bytes
            .map(|b| {
                let star = if f.not_monotone().is_some() { "*" } else { "" };
                format!("{}{star}", human_bytes(b))
            })
            .unwrap_or_else(|| "-".into()),
        if capacity.is_some() {
            f.oom_count.to_string()
        } else {
            "-".into()
        },
        f.driver_calls_total.to_string(),
    ]
}

/// The `†` and `*` footnotes of the marks [`figure_cells`] made for `rows` (setting, figures).
fn print_footnotes<'a>(rows: impl Iterator<Item = (String, &'a tune::Figures)> + Clone) {
    if rows.clone().any(|(_, f)| f.oom_count > 0) {
        println!("†: some allocations failed at the capacity given and were dropped; res/req is then ÷ the peak of the requests served, and calls are the failed run's.");
    } else if let Some((setting, f)) = rows.clone().find(|(_, f)| f.refused_count > 0) {
        // Impossible requests are dropped with their frees, as `gpumem replay` drops them.
        println!(
            "†: {} refused as impossible and dropped with {} free{} ({setting}{}); res/req is then ÷ the peak of the requests served.",
            crate::units::counted(f.refused_count, "allocation"),
            if f.refused_count == 1 { "its" } else { "their" },
            if f.refused_count == 1 { "" } else { "s" },
            f.first_refusal
                .as_deref()
                .map(|x| format!(", first: {x}"))
                .unwrap_or_default()
        );
    }
    for (setting, f) in rows {
        if let Some((s, b)) = f.not_monotone() {
            let (s, b) = distinct_bytes(s, b);
            println!(
                "*: {setting} also completes at {s}, but not at every capacity between that and {b} (a smaller device makes the cache release at other moments)"
            );
        }
    }
}

/// `a` and `b` as bytes with a unit, told apart: in whole MiB where the table's three digits
/// would print them alike (3386900480 and 3382706176 are both `3.15 GiB`; the capacities
/// the search finds are whole MiB), else in bytes.
fn distinct_bytes(a: u64, b: u64) -> (String, String) {
    let (ha, hb) = (human_bytes(a), human_bytes(b));
    if ha != hb || a == b {
        return (ha, hb);
    }
    const MIB: u64 = 1 << 20;
    if a.is_multiple_of(MIB) && b.is_multiple_of(MIB) {
        (format!("{} MiB", a / MIB), format!("{} MiB", b / MIB))
    } else {
        (format!("{a} B"), format!("{b} B"))
    }
}

/// gpumem's settings for the plug-in: a table, then the one that needs the least memory
/// within 2 × native's modelled driver time (the bound on driver time).
/// `(rw, cw)`: the widths of the res/req and calls columns, shared with the first table.
///
/// A replay with an OOM at the capacity given dropped allocations and their frees: its driver
/// time is a failed run's, not comparable with a completing one's. Such a row's driver time
/// shows `OOM`, and when native's replay fails, the others' are in milliseconds, not ÷ native's.
fn print_plugin_rows(r: &TuneReport, (rw, cw): (usize, usize)) {
    if r.plugin_rows.is_empty() {
        return;
    }
    let label = |row: &tune::PluginRow| {
        if row.gpumem_conf.is_empty() {
            "(defaults: paged-lazy)".to_string()
        } else {
            row.gpumem_conf.clone()
        }
    };
    let w = r
        .plugin_rows
        .iter()
        .map(|row| label(row).len())
        .max()
        .unwrap_or(0)
        .max("gpumem plug-in, GPUMEM_CONF".len());
    println!();
    println!(
        "{:<w$} {:>13} {:>rw$} {:>13} {:>5} {:>cw$} {:>8} {:>13}",
        "gpumem plug-in, GPUMEM_CONF",
        "peak reserv.",
        "res/req",
        "min capacity",
        "OOMs",
        "calls",
        "2nd half",
        "driver time",
    );
    for row in &r.plugin_rows {
        let [peak, res_req, cap, ooms, calls] = figure_cells(&row.figures, r.capacity_bytes);
        println!(
            "{:<w$} {peak:>13} {res_req:>rw$} {cap:>13} {ooms:>5} {calls:>cw$} {:>8} {:>13}",
            label(row),
            row.steady_state_driver_calls,
            driver_time_cell(r, row),
        );
    }
    println!("{}", plugin_legend(r));
    print_footnotes(r.plugin_rows.iter().map(|row| (label(row), &row.figures)));
    match plugin_pick(r) {
        Some((b, row)) => {
            if row.gpumem_conf.is_empty() {
                println!("unset GPUMEM_CONF  # the plug-in's defaults (paged-lazy)");
            } else {
                println!("export GPUMEM_CONF={}", row.gpumem_conf);
            }
            println!(
                "  needs {}: the least memory of gpumem's settings within 2 × native's driver time",
                human_bytes(b)
            );
        }
        None => println!("{}", no_pick_reason(r, &label)),
    }
}

/// The capacity the replays ran at, as the table prints it (the default device's without
/// `--capacity`).
fn capacity_text(r: &TuneReport) -> String {
    human_bytes(
        r.capacity_bytes
            .unwrap_or(gpumem::core::sim::DEFAULT_CAPACITY),
    )
}

/// The native setting's row (PyTorch's defaults; the grid always has one).
fn native_row(r: &TuneReport) -> Option<&tune::TuneRow> {
    r.rows.iter().find(|row| row.conf.is_empty())
}

/// Native's modelled driver seconds, where they are a reference: its replay ran without an
/// OOM at the capacity given (a failed run's time compares with nothing).
fn native_seconds(r: &TuneReport) -> Option<f64> {
    native_row(r)
        .filter(|n| n.figures.oom_count == 0)
        .map(|n| n.figures.modelled_driver_seconds)
}

/// The driver-time cell of `row`: `OOM` where its replay failed at the capacity given, else
/// its modelled driver time ÷ native's (in milliseconds where native's is 0 or failed).
fn driver_time_cell(r: &TuneReport, row: &tune::PluginRow) -> String {
    if row.figures.oom_count > 0 {
        return "OOM".to_string();
    }
    match native_seconds(r).filter(|&n| n > 0.0) {
        Some(n) => format!("{:.2} × nat.", row.figures.modelled_driver_seconds / n),
        None => format!("{:.1} ms", row.figures.modelled_driver_seconds * 1e3),
    }
}

/// The legend under gpumem's table: what `2nd half` and `driver time` are, and why a time is
/// missing or not ÷ native's when a replay failed at the capacity given.
fn plugin_legend(r: &TuneReport) -> String {
    let cap = capacity_text(r);
    let time = if native_row(r).is_some_and(|n| n.figures.oom_count > 0) {
        format!("modelled H200 driver milliseconds (native has an OOM at {cap}: a failed run's time is no reference to divide by)")
    } else {
        "modelled H200 driver seconds ÷ the native setting's".to_string()
    };
    let mut s = format!(
        "2nd half: driver calls in the second half of the events (the steady state); driver time: {time}."
    );
    if r.plugin_rows.iter().any(|row| row.figures.oom_count > 0) {
        s.push_str(&format!(
            " OOM: the replay failed at {cap}; a failed run's time is not comparable."
        ));
    }
    s
}

/// Whether `row` runs at the capacity given within 2 × native's modelled driver time (the bound on
/// driver time). Both replays must complete there: a failed run's time compares with nothing.
/// A trace on which native makes no driver time (nothing but 0-byte requests) keeps only the
/// settings that make none either; without a native row, or when native's replay fails, none.
fn within_twice_native(r: &TuneReport, row: &tune::PluginRow) -> bool {
    row.figures.oom_count == 0
        && native_seconds(r).is_some_and(|n| row.figures.modelled_driver_seconds <= 2.0 * n)
}

/// The gpumem setting `tune` recommends, with its minimum capacity: the one that needs the
/// least memory among those with no OOM within 2 × native's modelled driver time.
fn plugin_pick(r: &TuneReport) -> Option<(u64, &tune::PluginRow)> {
    r.plugin_rows
        .iter()
        .filter(|row| within_twice_native(r, row))
        .filter_map(|row| row.figures.min_capacity_bytes.map(|b| (b, row)))
        .min_by_key(|(b, _)| *b)
}

/// The `PYTORCH_CUDA_ALLOC_CONF` setting `tune` exports: the first of the ranking, unless it
/// has an OOM (then every setting has one).
fn torch_pick(r: &TuneReport) -> Option<&tune::TuneRow> {
    r.best().filter(|best| best.figures.oom_count == 0)
}

/// Why no gpumem setting is recommended: each has an OOM at the capacity given, or native's
/// has (no reference time), or none of those that run stays within 2 × native's driver time.
fn no_pick_reason(r: &TuneReport, label: &dyn Fn(&tune::PluginRow) -> String) -> String {
    let cap = capacity_text(r);
    let runs: Vec<String> = r
        .plugin_rows
        .iter()
        .filter(|row| row.figures.oom_count == 0)
        .map(label)
        .collect();
    if runs.is_empty() {
        let least = r
            .plugin_rows
            .iter()
            .filter_map(|row| row.figures.min_capacity_bytes.map(|b| (b, row)))
            .min_by_key(|(b, _)| *b);
        return match least {
            Some((b, row)) => format!(
                "every gpumem setting has an OOM at {cap}; the least demanding, {}, needs {} (a larger --capacity, or none, to compare them)",
                label(row),
                human_bytes(b)
            ),
            None => format!("every gpumem setting has an OOM at {cap}"),
        };
    }
    match native_row(r) {
        None => return "no native row to bound gpumem's settings' driver time by".to_string(),
        Some(n) if n.figures.oom_count > 0 => {
            return format!(
                "native has an OOM at {cap}, so it has no driver time there to bound gpumem's settings by: none is recommended, though {} run{} at {cap} (a larger --capacity, or none, to compare them)",
                runs.join(", "),
                if runs.len() == 1 { "s" } else { "" }
            );
        }
        Some(_) => {}
    }
    if !r.plugin_rows.iter().any(|row| within_twice_native(r, row)) {
        return if runs.len() == r.plugin_rows.len() {
            "none of gpumem's settings stays within 2 × native's driver time on this trace"
                .to_string()
        } else {
            format!("none of gpumem's settings that run at {cap} stays within 2 × native's driver time; the others have an OOM there")
        };
    }
    "no gpumem setting within 2 × native's driver time has a minimum capacity on this trace"
        .to_string()
}

/// The value as it can be pasted after `export NAME=` (empty for native).
fn shell_value(conf: &str) -> String {
    if conf.contains(['[', ']', '>', ' ']) {
        format!("'{conf}'")
    } else {
        conf.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn figures(oom_count: u64, seconds: f64, min_capacity_bytes: u64) -> tune::Figures {
        tune::Figures {
            peak_reserved_bytes: 8 * GIB,
            reserved_over_requested: 1.0,
            min_capacity_bytes: Some(min_capacity_bytes),
            smallest_completing_bytes: Some(min_capacity_bytes),
            oom_count,
            refused_count: 0,
            first_refusal: None,
            driver_calls_total: 100,
            modelled_driver_seconds: seconds,
        }
    }

    /// A report at 8 GiB: native's replay with `native_ooms` OOMs and 1 s of driver time;
    /// gpumem's settings `(conf, OOMs, seconds, min capacity)`.
    fn report(native_ooms: u64, plugins: &[(&str, u64, f64, u64)]) -> TuneReport {
        TuneReport {
            trace_setting: "native".into(),
            peak_requested_bytes: 7 * GIB,
            capacity_bytes: Some(8 * GIB),
            rows: vec![tune::TuneRow {
                setting: "native".into(),
                conf: String::new(),
                is_trace_setting: true,
                figures: figures(native_ooms, 1.0, 9 * GIB),
            }],
            paged_min_capacity_bytes: None,
            plugin_rows: plugins
                .iter()
                .map(|&(conf, ooms, seconds, min)| tune::PluginRow {
                    gpumem_conf: conf.into(),
                    strategy: gpumem::core::strategy::Strategy::PagedLazy,
                    figures: figures(ooms, seconds, min),
                    steady_state_driver_calls: 0,
                })
                .collect(),
            seconds: 0.0,
            threads: 1,
        }
    }

    fn label(row: &tune::PluginRow) -> String {
        row.gpumem_conf.clone()
    }

    /// Native fails at the capacity: its time bounds nothing, so the setting that runs there
    /// (1.5 × a failed run's time) is not recommended and its time is shown in ms; the one
    /// that fails shows `OOM`, not `0.10 × nat.`.
    #[test]
    fn a_failed_native_run_bounds_no_driver_time() {
        let r = report(1, &[("ok", 0, 1.5, 10 * GIB), ("fails", 1, 0.1, 5 * GIB)]);
        assert!(plugin_pick(&r).is_none());
        assert_eq!(driver_time_cell(&r, &r.plugin_rows[0]), "1500.0 ms");
        assert_eq!(driver_time_cell(&r, &r.plugin_rows[1]), "OOM");
        assert_eq!(
            no_pick_reason(&r, &label),
            "native has an OOM at 8.00 GiB, so it has no driver time there to bound gpumem's settings by: none is recommended, though ok runs at 8.00 GiB (a larger --capacity, or none, to compare them)"
        );
        assert_eq!(
            plugin_legend(&r),
            "2nd half: driver calls in the second half of the events (the steady state); driver time: modelled H200 driver milliseconds (native has an OOM at 8.00 GiB: a failed run's time is no reference to divide by). OOM: the replay failed at 8.00 GiB; a failed run's time is not comparable."
        );
    }

    /// Native runs; the setting that fails is not "within 2 × native's driver time" by its
    /// failed run's 0.1 s, and the one that runs takes 3 × native's: none is recommended, and
    /// the reason says so (it said every setting within 2 × native's had an OOM).
    #[test]
    fn a_failed_plugin_run_is_not_within_twice_native() {
        let r = report(0, &[("slow", 0, 3.0, 10 * GIB), ("fails", 1, 0.1, 5 * GIB)]);
        assert!(!within_twice_native(&r, &r.plugin_rows[1]));
        assert!(plugin_pick(&r).is_none());
        assert_eq!(driver_time_cell(&r, &r.plugin_rows[0]), "3.00 × nat.");
        assert_eq!(driver_time_cell(&r, &r.plugin_rows[1]), "OOM");
        assert_eq!(
            no_pick_reason(&r, &label),
            "none of gpumem's settings that run at 8.00 GiB stays within 2 × native's driver time; the others have an OOM there"
        );
        // A completing setting within the bound is picked over a smaller one that fails.
        let r = report(0, &[("ok", 0, 1.9, 10 * GIB), ("fails", 1, 0.1, 5 * GIB)]);
        let (b, row) = plugin_pick(&r).unwrap();
        assert_eq!((b, row.gpumem_conf.as_str()), (10 * GIB, "ok"));
        assert_eq!(
            plugin_legend(&r),
            "2nd half: driver calls in the second half of the events (the steady state); driver time: modelled H200 driver seconds ÷ the native setting's. OOM: the replay failed at 8.00 GiB; a failed run's time is not comparable."
        );
    }

    /// Every gpumem setting fails: the least demanding is named.
    #[test]
    fn every_plugin_run_failing_names_the_least_demanding() {
        let r = report(1, &[("a", 2, 1.0, 10 * GIB), ("b", 1, 0.1, 9 * GIB)]);
        assert_eq!(
            no_pick_reason(&r, &label),
            "every gpumem setting has an OOM at 8.00 GiB; the least demanding, b, needs 9.00 GiB (a larger --capacity, or none, to compare them)"
        );
    }
}
