//! `gpumem report`: one self-contained HTML page (see `gpumem::report`).
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use gpumem::core::sim::DEFAULT_CAPACITY;
use gpumem::core::strategy::Strategy;
use gpumem::report::{self, ReportConfig};
use gpumem::session::{self, ReplaySettings};
use gpumem::trace::{self, ReadConfig};

use crate::units::human_bytes;

/// Arguments of `gpumem report`.
#[derive(Args)]
pub struct ReportArgs {
    /// The trace: a PyTorch memory snapshot, an RMM log CSV or gpumem JSON lines (`-`:
    /// standard input).
    pub trace: PathBuf,
    /// Where to write the page (`-` for standard output).
    #[arg(long, short, default_value = "report.html")]
    pub output: PathBuf,
    /// Allocators to compare: a comma-separated list of buddy, tlsf, best-fit, torch, paged,
    /// paged-lazy, or `all`.
    #[arg(long, short, default_value = "all")]
    pub allocator: String,
    #[command(flatten)]
    pub replay: ReplayOptions,
}

/// How `report` and `map` read and replay the trace.
#[derive(Args, Clone)]
pub struct ReplayOptions {
    #[command(flatten)]
    pub input: crate::trace_args::TraceArgs,
    /// Segment size for the buddy, tlsf and best-fit pools.
    // A negative-looking size reaches parse_size, which says why it is refused.
    #[arg(long, value_parser = crate::units::parse_positive_size, allow_hyphen_values = true, default_value = "256MiB")]
    pub segment_size: u64,
    /// Device ordinal of the trace to show (default: the first with events).
    #[arg(long, allow_hyphen_values = true,
          value_parser = |s: &str| crate::units::whole_number::<u32>(s, 0, "a device ordinal"))]
    pub trace_device: Option<u32>,
    /// PYTORCH_CUDA_ALLOC_CONF for the `torch` emulation (e.g.
    /// `expandable_segments:True,max_split_size_mb:128`, or `native` for PyTorch's defaults);
    /// default: the trace's own allocator_settings when the snapshot has them, else native.
    #[arg(long)]
    pub torch_conf: Option<String>,
    /// `paged-lazy`'s settings, as `replay --lazy-conf` reads them (e.g. `grow_ahead=0.0156`,
    /// `placement=pages,headroom=0.02`; what `gpumem tune` recommends as GPUMEM_CONF).
    #[arg(long, value_name = "CONF")]
    pub lazy_conf: Option<String>,
}

impl ReplayOptions {
    /// The replay settings these flags give.
    pub fn settings(&self) -> ReplaySettings {
        ReplaySettings {
            capacity: self.input.capacity,
            segment_bytes: self.segment_size,
            torch_conf: self.torch_conf.clone(),
            lazy_conf: self.lazy_conf.clone(),
        }
    }
}

/// Reads a trace and builds the report both `report` and `map` use; `what` opens the context
/// of a failure (`building the report of`, `building the map of`).
///
/// # Errors
/// A bad option, a trace that does not read, one with no allocation to show (said as
/// `replay` and `tune` say it, with `map --allocator recorded` for a snapshot of segments
/// alone), or a replay that fails.
pub fn build(
    path: &std::path::Path,
    allocators: &str,
    o: &ReplayOptions,
    keep_frames: bool,
    quiet: bool,
    what: &str,
) -> Result<report::Report> {
    let names = check_options(allocators, o)?;
    let trace = read(path, o, keep_frames, quiet)?;
    if let Some(why) = nothing_to_show(&trace) {
        bail!("{}: nothing to show: {why}", trace::source_name(path));
    }
    build_read(&trace, path, &names, o, quiet, what)
}

/// Whether `trace` has no allocation to replay, and why (as `replay` and `tune` say it); a
/// snapshot of segments alone is drawn by `map --allocator recorded`.
pub fn nothing_to_show(trace: &trace::Trace) -> Option<String> {
    let any = trace
        .events
        .iter()
        .any(|e| matches!(e.action, trace::Action::Alloc | trace::Action::Free));
    if any || !trace.preexisting.is_empty() {
        return None;
    }
    let why = session::why_no_allocation(trace);
    Some(if trace.skipped_count == 0 && !trace.segments.is_empty() {
        format!("{why}; `gpumem map --allocator recorded` draws them")
    } else {
        why
    })
}

/// The options checked before a long read: the allocators named, and `--lazy-conf` parses.
///
/// # Errors
/// A zero capacity or segment size, an unknown allocator, a `--lazy-conf` that does not parse.
pub fn check_options(allocators: &str, o: &ReplayOptions) -> Result<Vec<Strategy>> {
    let settings = o.settings();
    session::check_capacity(settings.capacity)?;
    session::check_segment_size(settings.segment_bytes)?;
    let names = Strategy::parse_list(allocators)?;
    // Before a long read: a --lazy-conf that does not parse fails at once.
    if let Some(text) = &settings.lazy_conf {
        session::lazy_conf(text)?;
    }
    // Said even by the quiet `map`, as `replay` says it.
    if let Some(w) = session::segment_size_warning(
        &names,
        settings.segment_bytes,
        Some(settings.capacity.unwrap_or(DEFAULT_CAPACITY)),
    ) {
        eprintln!("warning: {w}");
    }
    Ok(names)
}

/// Reads the trace (`read ...` unless `quiet`) and says what `--lenient` skipped or salvaged.
///
/// # Errors
/// The trace does not read.
pub fn read(
    path: &std::path::Path,
    o: &ReplayOptions,
    keep_frames: bool,
    quiet: bool,
) -> Result<trace::Trace> {
    let started = Instant::now();
    let trace = trace::read_path(
        path,
        ReadConfig {
            lenient: o.input.lenient,
            keep_frames,
        },
    )?;
    if !quiet {
        eprintln!(
            "read {} ({}, {:.2} s)",
            gpumem::trace::source_name(path),
            crate::units::counted(trace.events.len() as u64, "event"),
            started.elapsed().as_secs_f64()
        );
    }
    // What --lenient skipped or salvaged is said even by the quiet `map`.
    crate::output::print_read_notes(&trace);
    Ok(trace)
}

/// [`build`] of a trace [`read`] and options checked ([`check_options`]).
///
/// # Errors
/// As [`build`], but for reading.
pub fn build_read(
    trace: &trace::Trace,
    path: &std::path::Path,
    names: &[Strategy],
    o: &ReplayOptions,
    quiet: bool,
    what: &str,
) -> Result<report::Report> {
    let settings = o.settings();
    if o.trace_device.is_some() {
        session::pick_device(trace, "--trace-device", o.trace_device)?;
    }
    let setup = settings.setup(trace)?;
    if !quiet && names.contains(&Strategy::Torch) {
        eprintln!(
            "torch emulation: PYTORCH_CUDA_ALLOC_CONF {} ({})",
            setup.config.torch, setup.conf_source
        );
    }
    if let Some(text) = &o.lazy_conf {
        for w in settings.lazy_warnings(&setup, names) {
            eprintln!("warning: {w}");
        }
        if !quiet && names.contains(&Strategy::PagedLazy) {
            eprintln!("paged-lazy: --lazy-conf {text}");
        }
    }
    let cfg = ReportConfig {
        allocators: names.to_vec(),
        capacity_bytes: setup.capacity_bytes,
        allocator_config: setup.config,
        device: o.trace_device,
        follow_recorded: setup.follow_recorded,
        ..ReportConfig::default()
    };
    let started = Instant::now();
    let mut r = report::build(
        trace,
        &gpumem::trace::source_name(path),
        &cfg,
        &mut |name| {
            if !quiet {
                eprintln!("  replaying with {name}");
            }
        },
    )
    .with_context(|| format!("{what} {}", gpumem::trace::source_name(path)))?;
    // Impossible requests are dropped with their frees, as `replay` drops them: say so.
    for rep in &r.replays {
        if rep.refused_count > 0 {
            eprintln!(
                "note: {} refused {} as impossible and dropped {} with {} free{}",
                rep.name,
                crate::units::counted(rep.refused_count, "allocation"),
                if rep.refused_count == 1 { "it" } else { "them" },
                if rep.refused_count == 1 {
                    "its"
                } else {
                    "their"
                },
                rep.first_refusal
                    .as_deref()
                    .map(|f| format!(" (first: {f})"))
                    .unwrap_or_default()
            );
        }
    }
    // Allocations that ran out of memory are dropped with their frees too: without a word the
    // map of such a run shows less (or nothing) live, with no sign of why.
    for rep in &r.replays {
        if rep.oom_count > 0 {
            eprintln!(
                "note: {}: {} failed (out of memory on a device of {}{}) and {} dropped with {} free{}, as replay drops them",
                rep.name,
                crate::units::counted(rep.oom_count, "allocation"),
                human_bytes(cfg.capacity_bytes),
                rep.first_oom_event
                    .map(|e| format!("; the first at event {e}"))
                    .unwrap_or_default(),
                if rep.oom_count == 1 { "was" } else { "were" },
                if rep.oom_count == 1 { "its" } else { "their" },
                if rep.oom_count == 1 { "" } else { "s" },
            );
        }
    }
    // A trace of several GPUs shows one: say which, and that event indices are its own.
    let devices = session::alloc_devices(trace);
    if devices.len() > 1 {
        eprintln!(
            "note: device {} of {} ({}; --trace-device N shows another): event indices count its events only",
            r.device,
            devices.len(),
            session::device_list(&devices)
        );
    }
    let (recorded, warnings) = report::recorded_figures_checked(path);
    for w in warnings {
        eprintln!("warning: {w}");
    }
    r.recorded = recorded;
    if !quiet {
        eprintln!(
            "replayed {} allocator{} in {:.2} s",
            r.runs.len(),
            if r.runs.len() == 1 { "" } else { "s" },
            started.elapsed().as_secs_f64()
        );
    }
    Ok(r)
}

pub fn run(a: ReportArgs) -> Result<()> {
    let quiet = !std::io::stderr().is_terminal() && std::env::var_os("GPUMEM_VERBOSE").is_none();
    // `-o -`: standard output, as `convert -o -` (not a file named `-`).
    let to_stdout = a.output.as_os_str() == "-";
    if !to_stdout {
        crate::output::check("-o", &a.output, &[&a.trace])?;
        // The page is HTML whatever the name says: a `.svg` or `.png` would open as nothing.
        let ext = a
            .output
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        if ext.is_some_and(|e| !matches!(e.as_str(), "html" | "htm")) {
            eprintln!(
                "warning: -o {}: the report is an HTML page, written under that name as asked; name it .html to open it in a browser (`replay --timeline` draws an SVG)",
                a.output.display()
            );
        }
    }
    let r = build(
        &a.trace,
        &a.allocator,
        &a.replay,
        true,
        quiet,
        "building the report of",
    )?;
    let html = report::html::render(&r);
    if to_stdout {
        use std::io::Write;
        std::io::stdout()
            .lock()
            .write_all(html.as_bytes())
            .context("writing the page to standard output")?;
    } else {
        crate::output::write_text(&a.output, &html)?;
    }
    eprintln!(
        "wrote {} ({}): {}, {} allocator{}",
        if to_stdout {
            "the page to standard output".to_string()
        } else {
            a.output.display().to_string()
        },
        human_bytes(html.len() as u64),
        crate::units::counted(r.events(), "event"),
        r.runs.len(),
        if r.runs.len() == 1 { "" } else { "s" }
    );
    Ok(())
}
