//! `gpumem replay`: a trace through allocators on the simulated (or a real) device.
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use gpumem::core::config::AllocatorConfig;
use gpumem::core::sim::{RecordedCheck, SimDevice, DEFAULT_CAPACITY};
use gpumem::core::strategy::Strategy;
use gpumem::core::{Device, DriverCall};
use gpumem::recorded_oom::OomVerdict;
use gpumem::replay::{self, MinCapacityOutcome, ReplayReport, TraceSummary};
use gpumem::session::{
    self, CompareSettings, Comparison, DeviceMinCapacity, PlannedLayout, RecordedRatio,
    ReplaySettings, StrategyRun, TraceSetup,
};
use gpumem::trace;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use crate::units::{counted, human_bytes};

mod table;
mod timeline;
use table::{print_min_capacity, print_notes, print_table};
use timeline::timeline_chart;

/// Arguments of `gpumem replay`.
#[derive(Args)]
pub struct ReplayArgs {
    /// The trace: a PyTorch memory snapshot (.pickle or .pickle.gz), an RMM log CSV, or
    /// gpumem JSON lines (detected from the content); `-` reads standard input.
    pub trace: PathBuf,
    /// Allocators to compare: a comma-separated list of buddy, tlsf, best-fit, torch, paged,
    /// paged-lazy, or `all`.
    #[arg(long, short, default_value = "all")]
    pub allocator: String,
    #[command(flatten)]
    pub input: crate::trace_args::TraceArgs,
    /// Also find, per allocator, the smallest simulated capacity that completes the trace
    /// with no failed allocation, and the smallest from which every larger one does.
    #[arg(long)]
    pub min_capacity: bool,
    /// Segment size for the buddy, tlsf and best-fit pools (each segment is one cuMemAlloc,
    /// sub-allocated by the strategy, like a pre-allocated pool).
    // A negative-looking size reaches parse_size, which says why it is refused.
    #[arg(long, value_parser = crate::units::parse_positive_size, allow_hyphen_values = true, default_value = "256MiB")]
    pub segment_size: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Draw requested / allocated / reserved memory over the trace, per allocator, as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<PathBuf>,
    /// Where to allocate: `sim` (simulated H200, default), `cuda`, `cuda:N`, or `all` (the
    /// trace's device N on cuda:N, each on its own pool).
    #[arg(long, default_value = "sim")]
    pub device: String,
    /// Fill every block with a pattern at allocation and verify it at free (real devices).
    #[arg(long)]
    pub canary: bool,
    /// The PYTORCH_CUDA_ALLOC_CONF the `torch` emulation follows (PyTorch's syntax, e.g.
    /// `expandable_segments:True,max_split_size_mb:128`, or `native` for PyTorch's defaults);
    /// default: the trace's own `allocator_settings`, else native. With --capacity, the
    /// capacity is also the memory limit (as `torch.cuda.set_per_process_memory_fraction`
    /// sets it).
    #[arg(long, value_name = "CONF")]
    pub torch_conf: Option<String>,
    /// The settings of the `paged-lazy` strategy, as `key=value` pairs separated by commas
    /// (the plug-in's `GPUMEM_CONF` keys): `placement` (`segments`: PyTorch's expandable
    /// segments with one physical handle per growth, the default; `pages`: gpumem's page
    /// placement). For `segments`: `grow_ahead` (fraction of the bytes held that each growth
    /// maps beyond the request, 0 to 1 in steps of 0.0001: fewer driver calls for a higher
    /// peak; 0). For `pages`: `headroom` (fraction of the peak of allocated bytes it may hold
    /// above that peak before it moves idle pages instead of creating them, 0 to 10 in steps
    /// of 0.0001; 0), `max_handle` (largest physical handle, rounded down to whole pages;
    /// 1GiB), `map_ahead` (bytes mapped ahead of a block below the headroom; 1GiB). A key
    /// given twice is refused. E.g. `grow_ahead=0.0156`, `placement=pages,headroom=0.02`.
    #[arg(long, value_name = "CONF")]
    pub lazy_conf: Option<String>,
    /// Skip the planned layout (the whole trace known in advance), otherwise worked out in a
    /// thread beside the replays: the table and `--json` (`planned_layout_skipped`) say it
    /// was skipped. For scripts that read only the allocators' figures.
    #[arg(long)]
    pub no_plan: bool,
}

#[derive(Serialize)]
struct JsonTrace {
    path: String,
    format: Option<trace::Format>,
    events: u64,
    alloc_events: u64,
    free_events: u64,
    peak_requested_bytes: u64,
    largest_request_bytes: u64,
    /// Requests too large to round up to 512 B (near 2^64): every allocator refuses them, and
    /// they are left out of `peak_requested_bytes` and `largest_request_bytes`.
    impossible_requests: u64,
    preexisting_blocks: u64,
    skipped_events: u64,
    /// Why each skipped event was skipped (--lenient; the first
    /// [`gpumem::trace::SKIPPED_KEPT`]), as the table's `skipped:` lines say.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    skipped: Vec<String>,
    /// What the table prints under its `read` line: blocks and segments made before
    /// recording began, CUDA-graph private pools the torch emulation does not model.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
    devices: Vec<u32>,
    /// First to last `time_us` of the trace, in seconds, when it has timestamps.
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_seconds: Option<f64>,
    /// Where a truncated file was cut and what was kept (--lenient).
    #[serde(skip_serializing_if = "Option::is_none")]
    truncated: Option<String>,
    /// What the reader warned about (key typos, ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    /// Per device, the planned layout ([`gpumem::plan`]): the memory a placement that knows
    /// the whole trace and never moves a block needs.
    planned_layout: Vec<PlannedLayout>,
    /// Why no layout was planned, when none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    planned_layout_skipped: Option<String>,
}

#[derive(Serialize)]
struct JsonAllocator {
    name: String,
    peak_reserved_bytes: u64,
    peak_allocated_bytes: u64,
    reserved_over_requested: f64,
    peak_external_fragmentation: f64,
    external_fragmentation_at_peak: f64,
    internal_fragmentation_at_peak: f64,
    /// Peak free bytes inside segments/pages that hold live blocks (PyTorch's name).
    inactive_split_bytes_peak: u64,
    /// Cache releases and retries after the device refused memory (PyTorch's name).
    num_alloc_retries: u64,
    /// cuMemAlloc + cuMemCreate calls (PyTorch's `num_device_alloc`).
    num_device_alloc: u64,
    /// cuMemFree + cuMemRelease calls (PyTorch's `num_device_free`).
    num_device_free: u64,
    oom_count: u64,
    /// Index of the first event whose allocation failed with out-of-memory (per device).
    #[serde(skip_serializing_if = "Option::is_none")]
    first_oom_event: Option<u64>,
    /// Allocations refused as impossible (unsupported alignment, size overflow).
    refused_count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_refusal: Option<String>,
    /// Peak requested bytes of the blocks served (the trace's when nothing failed).
    peak_requested_served_bytes: u64,
    driver_calls: serde_json::Map<String, serde_json::Value>,
    /// Seconds per call kind (modelled, or measured on a real device).
    driver_seconds: serde_json::Map<String, serde_json::Value>,
    driver_calls_total: u64,
    modelled_driver_seconds: f64,
    /// Driver calls made during the second half of the events (the steady state).
    steady_state_driver_calls: u64,
    /// Driver seconds ÷ the trace's own duration, when it has timestamps.
    #[serde(skip_serializing_if = "Option::is_none")]
    driver_share_of_trace: Option<f64>,
    /// Events ÷ CPU seconds of the replaying thread.
    events_per_second: f64,
    canary_errors: u64,
    /// Peak physical bytes the device itself counted (segments and handles it handed out).
    device_peak_used_bytes: u64,
    /// `torch`: the PYTORCH_CUDA_ALLOC_CONF emulated (`native` for the defaults).
    #[serde(skip_serializing_if = "Option::is_none")]
    torch_conf: Option<String>,
    /// `paged-lazy`: its settings (`placement=…,headroom=…,max_handle=…,map_ahead=…,grow_ahead=…`,
    /// sizes in bytes; `headroom`, `max_handle` and `map_ahead` act with `placement=pages`
    /// only, `grow_ahead` with `placement=segments` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    lazy_conf: Option<String>,
    /// `torch` on the simulated device with the recorded run's setting: its cudaMalloc /
    /// cudaFree sequence against the trace's `segment_alloc` / `segment_free` events.
    #[serde(skip_serializing_if = "Option::is_none")]
    emulation_check: Option<RecordedCheck>,
    /// Real devices: peak of cuMemGetInfo's used memory above its value at the start.
    #[serde(skip_serializing_if = "Option::is_none")]
    driver_peak_delta_bytes: Option<u64>,
    /// Real devices: the same replay's peak reserved on the simulated device.
    #[serde(skip_serializing_if = "Option::is_none")]
    simulated_peak_reserved_bytes: Option<u64>,
    /// Smallest capacity that completes (single-device traces; per device below).
    #[serde(skip_serializing_if = "Option::is_none")]
    min_capacity_bytes: Option<u64>,
    /// Smallest capacity from which every larger one completes (single-device traces).
    #[serde(skip_serializing_if = "Option::is_none")]
    min_capacity_all_larger_bytes: Option<u64>,
    /// Per device: the search's outcome.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    min_capacity: Vec<DeviceMinCapacity>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    per_device: Vec<serde_json::Value>,
}

#[derive(Serialize)]
struct JsonOut {
    trace: JsonTrace,
    /// How to read the figures: what failed allocations do, how events/s is measured.
    semantics: &'static str,
    /// PyTorch's recorded figures for the same run (empty when none lie beside the trace).
    pytorch_recorded: Vec<RecordedRatio>,
    device: String,
    capacity_bytes: u64,
    /// The snapshot's recorded OOMs and whether each allocator would have avoided them.
    recorded_ooms: Vec<OomVerdict>,
    allocators: Vec<JsonAllocator>,
}

enum Target {
    Sim,
    Cuda(usize),
    /// Every device of the trace on the CUDA device of the same ordinal.
    AllCuda,
}

fn parse_device(s: &str) -> Result<Target> {
    match s {
        "sim" => Ok(Target::Sim),
        "cuda" => Ok(Target::Cuda(0)),
        "all" => Ok(Target::AllCuda),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Ok(Target::Cuda(n)),
            _ => bail!("--device {other}: expected sim, cuda, cuda:N or all"),
        },
    }
}

/// The device that replays the trace's device `trace_device`.
fn open_device(target: &Target, capacity: u64, trace_device: u32) -> Result<Box<dyn Device>> {
    match target {
        Target::Sim => Ok(Box::new(SimDevice::new(capacity))),
        Target::Cuda(n) => Ok(Box::new(gpumem::cuda::open_capped(*n, capacity)?)),
        Target::AllCuda => gpumem::cuda::open_capped(trace_device as usize, capacity)
            .map(|d| Box::new(d) as Box<dyn Device>)
            .with_context(|| {
                format!(
                    "--device all replays the trace's device {trace_device} on cuda:{trace_device}"
                )
            }),
    }
}

fn progress_bar(total: u64, enabled: bool) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    if enabled {
        if let Ok(style) = ProgressStyle::with_template(
            "{msg:>10} [{bar:40}] {pos}/{len} events ({per_sec}, eta {eta})",
        ) {
            pb.set_style(style.progress_chars("=> "));
        }
    }
    pb
}

/// Checks the flags that need no trace; returns warnings to print.
fn check_args(a: &ReplayArgs, target: &Target) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    if a.min_capacity && !matches!(target, Target::Sim) {
        bail!("--min-capacity runs many replays and is only offered on the simulated device");
    }
    session::check_capacity(a.input.capacity)?;
    session::check_segment_size(a.segment_size)?;
    warnings.extend(session::segment_granularity_warning(a.segment_size));
    if a.canary && matches!(target, Target::Sim) {
        bail!("--canary needs a device with memory contents: use --device cuda (the simulated device keeps none)");
    }
    Ok(warnings)
}

pub fn run(a: ReplayArgs) -> Result<()> {
    let target = parse_device(&a.device)?;
    let mut warnings = check_args(&a, &target)?;
    if let Some(path) = &a.timeline {
        // Fail before a long replay, not after it, and without touching the file: it is
        // written last, through a temporary file.
        crate::output::check("--timeline", path, &[&a.trace])?;
        crate::output::check_svg("--timeline", path)?;
    }
    let names = Strategy::parse_list(&a.allocator)?;
    // A segment larger than the (simulated) device is refused every time the pools grow.
    let device_bytes = a
        .input
        .capacity
        .or(matches!(target, Target::Sim).then_some(DEFAULT_CAPACITY));
    warnings.extend(session::segment_size_warning(
        &names,
        a.segment_size,
        device_bytes,
    ));
    let read_started = Instant::now();
    if matches!(target, Target::Cuda(_) | Target::AllCuda) {
        // Before reading a trace that may take a while: a missing driver is known at once.
        gpumem::cuda::init()?;
    }
    let trace = a.input.read(&a.trace)?;
    let read_seconds = read_started.elapsed().as_secs_f64();
    let devices = replay::devices(&trace);
    let has_blocks = trace
        .events
        .iter()
        .any(|e| matches!(e.action, trace::Action::Alloc | trace::Action::Free));
    if !has_blocks && trace.preexisting.is_empty() {
        return crate::cmd_analyze::print_state(&a.trace, &trace, a.json);
    }
    let settings = ReplaySettings {
        capacity: a.input.capacity,
        segment_bytes: a.segment_size,
        torch_conf: a.torch_conf.clone(),
        lazy_conf: a.lazy_conf.clone(),
    };
    let setup = settings.setup(&trace)?;
    let (capacity, config) = (setup.capacity_bytes, setup.config);
    // Computed once: every replay and every capacity probe reuses them.
    let summaries: Vec<(u32, TraceSummary)> = devices
        .iter()
        .map(|&d| (d, replay::summarize(&trace, d)))
        .collect();
    warnings.extend(session::capacity_warnings(a.input.capacity, &summaries));
    // A `NAME-CONF.stats.json` beside the trace that cannot be used is said, not skipped.
    warnings.extend(gpumem::report::recorded_figures_checked(&a.trace).1);
    warnings.extend(settings.lazy_warnings(&setup, &names));
    warnings.extend(session::torch_conf_warnings(
        a.torch_conf.is_some(),
        &config.torch,
        a.input.capacity,
        &names,
    ));
    if !a.json {
        print_header(&a, &trace, read_seconds, &names, &setup);
    }
    // What the table says under its "read" line; `--json` has them as `trace.notes`.
    let notes = session::read_notes(&trace, &summaries, &names, &config.torch);
    if !a.json {
        for n in &notes {
            eprintln!("  {n}");
        }
    }
    for w in &warnings {
        eprintln!("warning: {w}");
    }

    let Comparison {
        runs,
        planned: planned_layout,
        planned_skipped: planned_layout_skipped,
    } = replay_all(&a, &target, &trace, &summaries, &names, &setup)?;

    let out = json_allocators(&runs, &summaries, &config);
    let min_caps: Vec<(&'static str, &[DeviceMinCapacity])> = runs
        .iter()
        .map(|r| (r.strategy.name(), r.min_capacity.as_slice()))
        .collect();

    let peak_requested: u64 = summaries.iter().map(|(_, s)| s.peak_requested_bytes).sum();
    let duration_us = summaries.iter().filter_map(|(_, s)| s.duration_us).max();
    let json = JsonOut {
        trace: JsonTrace {
            path: a.trace.display().to_string(),
            format: trace.format,
            events: summaries.iter().map(|(_, s)| s.events).sum(),
            alloc_events: summaries.iter().map(|(_, s)| s.allocs).sum(),
            free_events: summaries.iter().map(|(_, s)| s.frees).sum(),
            peak_requested_bytes: peak_requested,
            largest_request_bytes: summaries
                .iter()
                .map(|(_, s)| s.largest_request_bytes)
                .max()
                .unwrap_or(0),
            impossible_requests: summaries.iter().map(|(_, s)| s.impossible_requests).sum(),
            preexisting_blocks: trace.preexisting.len() as u64,
            skipped_events: trace.skipped_count,
            skipped: trace.skipped.clone(),
            notes,
            devices: devices.clone(),
            duration_seconds: duration_us.map(|d| d as f64 * 1e-6),
            truncated: trace.truncated.clone(),
            warnings: trace.warnings.clone(),
            planned_layout,
            planned_layout_skipped,
        },
        semantics: SEMANTICS,
        pytorch_recorded: session::recorded_figures(&a.trace, peak_requested),
        device: a.device.clone(),
        capacity_bytes: capacity,
        recorded_ooms: session::oom_verdicts(&trace, &names, config)?,
        allocators: out,
    };
    if let Some(path) = &a.timeline {
        let cap = a.input.capacity.map(|c| c as f64);
        let svg = timeline_chart(&a.trace, &trace, &devices, &runs, cap).to_svg();
        crate::output::write_text(path, &svg)?;
        if !a.json {
            eprintln!("timeline written to {}", path.display());
        }
    }
    print_results(&a, &json, &min_caps, capacity)
}

/// The lines on standard error before the replays: what was read, what the reader
/// noticed, and the settings of the configurable strategies replayed.
fn print_header(
    a: &ReplayArgs,
    trace: &trace::Trace,
    read_seconds: f64,
    names: &[Strategy],
    setup: &TraceSetup,
) {
    eprintln!(
        "read {} ({:?}, {}, {:.2} s){}",
        trace::source_name(&a.trace),
        trace.format.unwrap_or(trace::Format::JsonLines),
        counted(trace.events.len() as u64, "event"),
        read_seconds,
        if trace.skipped_count > 0 {
            format!(
                ", {} bad event{} skipped",
                trace.skipped_count,
                if trace.skipped_count == 1 { "" } else { "s" }
            )
        } else {
            String::new()
        }
    );
    crate::output::print_read_notes(trace);
    if names.contains(&Strategy::Torch) {
        eprintln!(
            "torch emulation: PYTORCH_CUDA_ALLOC_CONF {} ({})",
            setup.config.torch, setup.conf_source
        );
    }
    if names.contains(&Strategy::PagedLazy) {
        let l = setup.config.lazy;
        let source = if a.lazy_conf.as_deref().is_some_and(|t| !t.trim().is_empty()) {
            "--lazy-conf"
        } else {
            "defaults"
        };
        let (items, what) = gpumem::lazy_conf::describe(&l);
        eprintln!("paged-lazy: {items} ({what}) ({source})");
    }
}

/// Replays the trace through every strategy asked for ([`session::compare`]), with a
/// progress bar on a terminal; returns the runs and the planned layout.
fn replay_all(
    a: &ReplayArgs,
    target: &Target,
    trace: &trace::Trace,
    summaries: &[(u32, TraceSummary)],
    names: &[Strategy],
    setup: &TraceSetup,
) -> Result<Comparison> {
    let total_events: u64 = summaries.iter().map(|(_, s)| s.events).sum();
    let show_progress = !a.json && std::io::stderr().is_terminal();
    let compare = CompareSettings {
        trace,
        trace_name: &trace::source_name(&a.trace),
        summaries,
        simulated: matches!(target, Target::Sim),
        capacity_bytes: setup.capacity_bytes,
        config: setup.config,
        timeline: a.timeline.is_some(),
        canary: a.canary,
        min_capacity: a.min_capacity,
        follow_recorded: setup.follow_recorded,
    };
    let pb = progress_bar(total_events * names.len() as u64, show_progress);
    pb.set_message(if names.len() == 1 {
        names[0].to_string()
    } else {
        format!("{} allocators", names.len())
    });
    let started = Instant::now();
    let progress = |n: u64| {
        if show_progress && started.elapsed() > Duration::from_secs(1) && pb.is_hidden() {
            pb.set_draw_target(ProgressDrawTarget::stderr());
        }
        pb.inc(n);
    };
    let open = |d: u32| open_device(target, setup.capacity_bytes, d);
    let compared = session::compare(&compare, names, &open, &progress, !a.no_plan);
    pb.finish_and_clear();
    compared
}

/// The `allocators` of `--json`: each run's figures, with its settings where it has some.
fn json_allocators(
    runs: &[StrategyRun],
    summaries: &[(u32, TraceSummary)],
    config: &AllocatorConfig,
) -> Vec<JsonAllocator> {
    let mut out = Vec::new();
    for r in runs {
        let mut ja = json_allocator(r.strategy, &r.per_dev, summaries);
        match r.strategy {
            Strategy::Torch => {
                ja.torch_conf = Some(config.torch.to_string());
                ja.emulation_check = combined_check(&r.checks);
            }
            Strategy::PagedLazy => ja.lazy_conf = Some(gpumem::lazy_conf::text(&config.lazy)),
            Strategy::Buddy | Strategy::Tlsf | Strategy::BestFit | Strategy::Paged => {}
        }
        ja.simulated_peak_reserved_bytes = r.simulated_peak_reserved_bytes;
        ja.min_capacity = r.min_capacity.clone();
        if let [only] = r.min_capacity.as_slice() {
            if let MinCapacityOutcome::Found(m) = &only.outcome {
                ja.min_capacity_bytes = Some(m.smallest_bytes);
                ja.min_capacity_all_larger_bytes = Some(m.all_larger_bytes);
            }
        }
        out.push(ja);
    }
    out
}

/// Prints the results (the JSON, or the table and what goes with it) and fails when
/// `--min-capacity` found no capacity for any strategy.
fn print_results(
    a: &ReplayArgs,
    json: &JsonOut,
    min_caps: &[(&'static str, &[DeviceMinCapacity])],
    capacity: u64,
) -> Result<()> {
    if a.json {
        println!("{}", serde_json::to_string_pretty(json)?);
    } else {
        print_oom_verdicts(json);
        print_table(json, capacity, a.input.capacity.is_some());
        for al in &json.allocators {
            if let Some(c) = &al.emulation_check {
                println!("{} emulation {c}", al.name);
            }
        }
        if a.min_capacity {
            print_min_capacity(min_caps);
        }
        print_notes(json, capacity);
    }
    // A search that found nothing for any allocator is a failure; one that found something
    // for some allocators reports the others' reasons above and succeeds.
    if a.min_capacity {
        let any_found = min_caps.iter().any(|(_, mc)| {
            mc.iter()
                .all(|m| matches!(m.outcome, MinCapacityOutcome::Found(_)))
        });
        if !any_found {
            bail!("no allocator completes the trace on any capacity tried (reasons above)");
        }
    }
    Ok(())
}

/// One self-check for several devices: the first divergence, else the calls of all together.
fn combined_check(checks: &[RecordedCheck]) -> Option<RecordedCheck> {
    if checks.is_empty() {
        return None;
    }
    let mut calls = 0u64;
    for c in checks {
        match c {
            RecordedCheck::Diverges { .. } => return Some(*c),
            RecordedCheck::Matches { calls: n } => calls += n,
        }
    }
    Some(RecordedCheck::Matches { calls })
}

/// What failed allocations do, and how speeds are measured (printed under the table and kept
/// in `--json`).
const SEMANTICS: &str = "A failed allocation (out of memory after the pool released its cache and retried, or a request the allocator refuses as impossible) is dropped with its later free and the replay goes on; PyTorch would raise OutOfMemoryError and stop there. Requested bytes count served blocks only. events/s = events replayed / CPU seconds of the replaying thread.";
fn json_allocator(
    strategy: Strategy,
    per_dev: &[ReplayReport],
    summaries: &[(u32, TraceSummary)],
) -> JsonAllocator {
    let sum = |f: &dyn Fn(&ReplayReport) -> u64| per_dev.iter().map(f).sum::<u64>();
    let peak_reserved = sum(&|r| r.peak_reserved_bytes);
    let peak_served = sum(&|r| r.peak_requested_bytes);
    let mut calls = serde_json::Map::new();
    let mut secs_by = serde_json::Map::new();
    for c in DriverCall::ALL {
        let n: u64 = per_dev.iter().map(|r| r.driver_calls.get(c)).sum();
        calls.insert(c.short_name().to_string(), n.into());
        let s: f64 = per_dev.iter().map(|r| r.driver_calls.seconds_of(c)).sum();
        secs_by.insert(c.short_name().to_string(), s.into());
    }
    let calls_of = |k: &[DriverCall]| -> u64 {
        per_dev
            .iter()
            .map(|r| k.iter().map(|&c| r.driver_calls.get(c)).sum::<u64>())
            .sum()
    };
    let cpu: f64 = per_dev.iter().map(|r| r.cpu_seconds).sum();
    let events: u64 = per_dev.iter().map(|r| r.events_replayed).sum();
    let modelled: f64 = per_dev.iter().map(|r| r.modelled_driver_seconds).sum();
    let duration_us = summaries.iter().filter_map(|(_, s)| s.duration_us).max();
    JsonAllocator {
        name: strategy.to_string(),
        peak_reserved_bytes: peak_reserved,
        peak_allocated_bytes: sum(&|r| r.peak_allocated_bytes),
        reserved_over_requested: if peak_served == 0 {
            0.0
        } else {
            peak_reserved as f64 / peak_served as f64
        },
        peak_external_fragmentation: per_dev
            .iter()
            .map(|r| r.peak_external_fragmentation)
            .fold(0.0, f64::max),
        external_fragmentation_at_peak: per_dev
            .iter()
            .map(|r| r.external_fragmentation_at_peak)
            .fold(0.0, f64::max),
        internal_fragmentation_at_peak: per_dev
            .iter()
            .map(|r| r.internal_fragmentation_at_peak)
            .fold(0.0, f64::max),
        inactive_split_bytes_peak: sum(&|r| r.peak_inactive_split_bytes),
        num_alloc_retries: sum(&|r| r.alloc_retries),
        num_device_alloc: calls_of(&[DriverCall::Alloc, DriverCall::Create]),
        num_device_free: calls_of(&[DriverCall::Free, DriverCall::Release]),
        oom_count: sum(&|r| r.oom_count),
        first_oom_event: per_dev.iter().filter_map(|r| r.first_oom_event).min(),
        refused_count: sum(&|r| r.refused_count),
        first_refusal: per_dev.iter().find_map(|r| r.first_refusal.clone()),
        peak_requested_served_bytes: peak_served,
        driver_calls_total: sum(&|r| r.driver_calls.total()),
        driver_calls: calls,
        driver_seconds: secs_by,
        modelled_driver_seconds: modelled,
        steady_state_driver_calls: sum(&|r| r.steady_state_driver_calls),
        driver_share_of_trace: duration_us
            .filter(|&d| d > 0)
            .map(|d| modelled / (d as f64 * 1e-6)),
        events_per_second: if cpu > 0.0 { events as f64 / cpu } else { 0.0 },
        canary_errors: sum(&|r| r.canary_errors),
        device_peak_used_bytes: sum(&|r| r.device_peak_used_bytes),
        torch_conf: None,
        lazy_conf: None,
        emulation_check: None,
        driver_peak_delta_bytes: per_dev
            .iter()
            .map(|r| r.driver_peak_delta_bytes)
            .sum::<Option<u64>>(),
        simulated_peak_reserved_bytes: None,
        min_capacity_bytes: None,
        min_capacity_all_larger_bytes: None,
        min_capacity: Vec::new(),
        per_device: if per_dev.len() > 1 {
            per_dev
                .iter()
                .zip(summaries)
                .map(|(r, (d, s))| {
                    serde_json::json!({
                        "device": d,
                        "peak_requested_bytes": s.peak_requested_bytes,
                        "peak_reserved_bytes": r.peak_reserved_bytes,
                        "peak_allocated_bytes": r.peak_allocated_bytes,
                        "reserved_over_requested": r.reserved_over_requested,
                        "oom_count": r.oom_count,
                        "first_oom_event": r.first_oom_event,
                        "refused_count": r.refused_count,
                    })
                })
                .collect()
        } else {
            Vec::new()
        },
    }
}

fn print_oom_verdicts(j: &JsonOut) {
    for v in &j.recorded_ooms {
        println!(
            "recorded OOM at event {} (device {}): {} requested, {} reserved + {} free on the device = {} usable",
            v.event,
            v.device,
            human_bytes(v.request_bytes),
            v.reserved_bytes
                .map_or("? (no segment events in the trace)".into(), human_bytes),
            v.device_free_bytes.map_or("?".into(), human_bytes),
            v.capacity_bytes.map_or("?".into(), human_bytes),
        );
        for line in v.lines(&human_bytes) {
            println!("  {line}");
        }
    }
    if !j.recorded_ooms.is_empty() {
        println!();
    }
}
