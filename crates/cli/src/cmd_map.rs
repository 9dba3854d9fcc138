//! `gpumem map`: the memory map of one allocator at one event, as text.
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

/// Arguments of `gpumem map`.
#[derive(Args)]
pub struct MapArgs {
    /// The trace: a PyTorch memory snapshot, an RMM log CSV or gpumem JSON lines (`-`:
    /// standard input).
    pub trace: PathBuf,
    /// The event after which to show the map (0-based; default: the allocator's peak of
    /// reserved bytes).
    #[arg(long, conflicts_with = "peak", allow_hyphen_values = true,
          value_parser = |s: &str| crate::units::whole_number::<u64>(s, 0, "an event index, counted from 0"))]
    pub event: Option<u64>,
    /// Show the map at the allocator's peak of reserved bytes (the default).
    #[arg(long)]
    pub peak: bool,
    /// The allocator (buddy, tlsf, best-fit, torch, paged, paged-lazy), or `recorded` for the segments
    /// a PyTorch snapshot recorded at dump time.
    #[arg(long, short, default_value = "torch")]
    pub allocator: String,
    #[command(flatten)]
    pub replay: crate::cmd_report::ReplayOptions,
    /// Cells per line (default: the terminal's width, or 100 when not a terminal).
    #[arg(long, allow_hyphen_values = true,
          value_parser = |s: &str| crate::units::whole_number::<usize>(s, 0, "at least 8 cells a line"))]
    pub width: Option<usize>,
    /// Lines of the map, at most (the cell size grows until the map fits).
    #[arg(long, default_value_t = 40, allow_hyphen_values = true,
          value_parser = |s: &str| crate::units::whole_number::<usize>(s, 0, "at least one line"))]
    pub lines: usize,
}

/// The narrowest map drawn, in cells.
const MIN_WIDTH: usize = 8;

fn terminal_width() -> Option<usize> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    // A pseudo-terminal without a size reports 0 columns.
    ratatui::crossterm::terminal::size()
        .ok()
        .map(|(w, _)| w as usize)
        .filter(|&w| w >= 20)
}

pub fn run(a: MapArgs) -> Result<()> {
    if a.lines == 0 {
        bail!("--lines 0: expected at least one line");
    }
    if let Some(w) = a.width.filter(|&w| w < MIN_WIDTH) {
        bail!("--width {w}: expected at least {MIN_WIDTH} cells a line");
    }
    let recorded = a.allocator == "recorded";
    let one =
        |name: &str| gpumem::core::strategy::Strategy::parse_list(name).is_ok_and(|l| l.len() == 1);
    if !recorded && (a.allocator.contains(',') || a.allocator == "all" || !one(&a.allocator)) {
        bail!(
            "--allocator {}: expected one allocator (buddy, tlsf, best-fit, torch, paged, paged-lazy) or `recorded`",
            a.allocator
        );
    }
    if recorded && a.event.is_some() {
        bail!("--event with --allocator recorded: the recorded segments are the state at dump time only; drop --event, or pick an allocator to see the map at that event");
    }
    // The recorded segments are the snapshot's: no replay setting changes them. Say which
    // flags were given for nothing, and replay (for the trace's figures) with the defaults.
    let mut replay = a.replay.clone();
    if recorded {
        let o = &a.replay;
        let ignored: Vec<&str> = [
            (o.input.capacity.is_some(), "--capacity"),
            (
                o.segment_size != gpumem::core::config::AllocatorConfig::default().segment_bytes,
                "--segment-size",
            ),
            (o.torch_conf.is_some(), "--torch-conf"),
            (o.lazy_conf.is_some(), "--lazy-conf"),
        ]
        .into_iter()
        .filter_map(|(given, flag)| given.then_some(flag))
        .collect();
        if !ignored.is_empty() {
            eprintln!(
                "warning: {} {} no effect with --allocator recorded (the segments the snapshot recorded at dump time)",
                ignored.join(", "),
                if ignored.len() == 1 { "has" } else { "have" }
            );
        }
        replay = crate::cmd_report::ReplayOptions {
            input: crate::trace_args::TraceArgs {
                capacity: None,
                ..replay.input
            },
            segment_size: gpumem::core::config::AllocatorConfig::default().segment_bytes,
            torch_conf: None,
            lazy_conf: None,
            ..replay
        };
    }
    let names =
        crate::cmd_report::check_options(if recorded { "torch" } else { &a.allocator }, &replay)?;
    let trace = crate::cmd_report::read(&a.trace, &replay, false, true)?;
    let nothing = crate::cmd_report::nothing_to_show(&trace);
    let map = if recorded && nothing.is_some() && !trace.segments.is_empty() {
        // A snapshot of segments alone: nothing to replay, and the segments to draw.
        snapshot_only_map(&trace, replay.trace_device)?
    } else {
        if let Some(why) = nothing {
            bail!(
                "{}: nothing to show: {why}",
                gpumem::trace::source_name(&a.trace)
            );
        }
        let r = crate::cmd_report::build_read(
            &trace,
            &a.trace,
            &names,
            &replay,
            true,
            "building the map of",
        )?;
        if r.runs.len() != 1 {
            bail!(
                "--allocator {}: expected one allocator (buddy, tlsf, best-fit, torch, paged, paged-lazy or recorded)",
                a.allocator
            );
        }
        if recorded {
            match &r.snapshot_map {
                Some(m) => m.clone(),
                None => bail!(
                    "{}: the trace recorded no segments (only PyTorch snapshots do)",
                    gpumem::trace::source_name(&a.trace)
                ),
            }
        } else {
            r.map(0, a.event)?
        }
    };
    let width = a
        .width
        .or_else(terminal_width)
        .unwrap_or(100)
        .max(MIN_WIDTH);
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let cell = map.cell_bytes(width, a.lines);
    let lines = map.cells(cell).len().div_ceil(width);
    if lines > a.lines {
        // Each region takes a cell and a gap at least: more regions than the lines hold.
        eprintln!(
            "note: --lines {}: the map's {} regions need at least {lines} lines of {width} cells (one cell and a gap each); showing {lines} (a larger --width needs fewer)",
            a.lines,
            map.rows.len()
        );
    }
    let mut text = map.render_text(width, a.lines, color);
    if !recorded && a.event.is_none() {
        // As the report's map says: the event is the allocator's peak of reserved bytes.
        let at = format!("after event {}:", map.event);
        text = text.replacen(
            &at,
            &format!("after event {} (peak reserved):", map.event),
            1,
        );
    }
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// The map of the segments a snapshot without trace entries recorded, on `device` (default:
/// the lowest with a segment).
///
/// # Errors
/// No segment on the device asked for.
fn snapshot_only_map(
    trace: &gpumem::trace::Trace,
    device: Option<u32>,
) -> Result<gpumem::report::map::MemoryMap> {
    let mut devices: Vec<u32> = trace.segments.iter().map(|s| s.device).collect();
    devices.sort_unstable();
    devices.dedup();
    let d = device.unwrap_or(devices[0]);
    if !devices.contains(&d) {
        bail!(
            "--trace-device {d}: the snapshot recorded no segment on device {d} (it has {})",
            gpumem::session::device_list(&devices)
        );
    }
    if devices.len() > 1 {
        eprintln!(
            "note: device {d} of {} ({}; --trace-device N shows another)",
            devices.len(),
            gpumem::session::device_list(&devices)
        );
    }
    Ok(gpumem::report::map::MemoryMap::from_snapshot(
        &trace.segments,
        d,
    ))
}
