//! `gpumem replay`: a trace through allocators on the simulated (or a real) device.
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use gpumem::core::config::{AllocatorConfig, LazyPlacement};
use gpumem::core::registry;
use gpumem::core::sim::{RecordedCheck, SimDevice, DEFAULT_CAPACITY, DEFAULT_GRANULARITY};
use gpumem::core::{Allocator, Device, DriverCall};
use gpumem::recorded_oom::{self, OomVerdict};
use gpumem::replay::{
    self, MinCapacityConfig, MinCapacityOutcome, ReplayConfig, ReplayReport, TraceSummary,
};
use gpumem::trace::{self, ReadConfig};
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
    /// Device capacity (e.g. 80GiB, 141GB; K/M/G/T alone are binary like KiB/MiB/GiB/TiB,
    /// KB/MB/GB/TB decimal, a bare number is bytes; default: the H200's 139.8 GiB as
    /// cuMemGetInfo reports it); allocations that still do not fit after the pool released
    /// its cache count as OOMs and are dropped (with their frees), and the replay goes on.
    // A negative-looking size reaches parse_size, which says why it is refused.
    #[arg(long, value_parser = crate::units::parse_positive_size, allow_hyphen_values = true)]
    pub capacity: Option<u64>,
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
    /// Skip and count malformed events instead of stopping at the first; salvage a truncated
    /// snapshot (the events read before the cut are kept).
    #[arg(long)]
    pub lenient: bool,
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

/// Parses `--lazy-conf` onto the defaults. `tune` can export `GPUMEM_CONF=strategy=paged`,
/// which is not a `paged-lazy` setting: the error then names the flag that replays it.
///
/// # Errors
/// The first bad item, as [`gpumem::lazy_conf::parse`] words it, after `--lazy-conf: `.
pub fn lazy_conf(text: &str) -> Result<gpumem::core::config::LazyConfig> {
    gpumem::lazy_conf::parse(text).map_err(|e| {
        let hint = match &e {
            gpumem::conf_items::ItemError::UnknownKey { key, .. } if key == "strategy" => {
                let value = gpumem::conf_items::items(text, &gpumem::lazy_conf::KEYS)
                    .filter_map(Result::ok)
                    .find(|(k, _)| *k == "strategy")
                    .map_or("", |(_, v)| v);
                format!(
                    "; `strategy` is GPUMEM_CONF's choice of allocator, which is --allocator here (GPUMEM_CONF=strategy={value}: --allocator {value}); --lazy-conf holds paged-lazy's own settings"
                )
            }
            _ => String::new(),
        };
        anyhow::anyhow!("--lazy-conf: {e}{hint}")
    })
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
    planned_layout: Vec<JsonPlanned>,
    /// Why no layout was planned, when none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    planned_layout_skipped: Option<String>,
}

/// One device's planned layout ([`gpumem::plan::planned_layout`]).
#[derive(Serialize)]
struct JsonPlanned {
    device: u32,
    blocks: u64,
    /// Highest sum of live blocks' sizes rounded to 512 B.
    peak_live_bytes: u64,
    /// The layout's extent: the memory it needs.
    layout_bytes: u64,
    /// `layout_bytes` ÷ the device's peak requested bytes (as res/req).
    over_requested: f64,
    /// Which order of placement gave it: `size` (largest first) or `lifetime`.
    order: gpumem::plan::PlanOrder,
}

/// `trace.planned_layout_skipped` under `--no-plan`.
const NO_PLAN: &str = "not asked for: --no-plan";

/// The planned layout of every device of the trace, or why it was skipped.
fn planned_layouts(
    trace: &trace::Trace,
    summaries: &[(u32, TraceSummary)],
) -> (Vec<JsonPlanned>, Option<String>) {
    let mut out = Vec::new();
    for &(device, ref s) in summaries {
        match gpumem::plan::planned_layout(trace, device) {
            Ok(p) => out.push(JsonPlanned {
                device,
                blocks: p.blocks,
                peak_live_bytes: p.peak_live_bytes,
                layout_bytes: p.layout_bytes,
                over_requested: if s.peak_requested_bytes == 0 {
                    0.0
                } else {
                    p.layout_bytes as f64 / s.peak_requested_bytes as f64
                },
                order: p.order,
            }),
            Err(e) => return (Vec::new(), Some(format!("device {device}: {e}"))),
        }
    }
    (out, None)
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

#[derive(Clone, Serialize)]
struct DeviceMinCapacity {
    device: u32,
    #[serde(flatten)]
    outcome: MinCapacityOutcome,
}

/// PyTorch's own `memory_stats()` for the traced run, when a `<name>-<conf>.stats.json` lies
/// beside the trace (as in `traces/`).
#[derive(Serialize)]
struct Recorded {
    conf: String,
    reserved_bytes_peak: u64,
    reserved_over_requested: f64,
}

/// PyTorch's own figures beside the trace (`<stem>-<conf>.stats.json`, `<stem>.stats.json`, read by
/// [`gpumem::report::recorded_figures`]), with their ratio to the trace's peak requested.
fn recorded_figures(trace: &std::path::Path, peak_requested: u64) -> Vec<Recorded> {
    gpumem::report::recorded_figures(trace)
        .into_iter()
        .map(|r| Recorded {
            conf: r.conf,
            reserved_bytes_peak: r.reserved_peak_bytes,
            reserved_over_requested: if peak_requested == 0 {
                0.0
            } else {
                r.reserved_peak_bytes as f64 / peak_requested as f64
            },
        })
        .collect()
}

#[derive(Serialize)]
struct JsonOut {
    trace: JsonTrace,
    /// How to read the figures: what failed allocations do, how events/s is measured.
    semantics: &'static str,
    /// PyTorch's recorded figures for the same run (empty when none lie beside the trace).
    pytorch_recorded: Vec<Recorded>,
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

/// The largest `--capacity` accepted: the simulated device has 64 TiB of address space, and
/// pools reserve address space of a few times the capacity in it.
const MAX_CAPACITY: u64 = 16 << 40;

/// Refuses a `--capacity` of 0 or above [`MAX_CAPACITY`] (one check for `replay`, `tune`,
/// `report` and `map`: above it every pool runs out of the simulated address space, and each
/// allocation would be an OOM).
///
/// # Errors
/// One line naming the flag, the capacity and the bound.
pub fn check_capacity(capacity: Option<u64>) -> Result<()> {
    match capacity {
        Some(0) => bail!("--capacity 0: expected a device capacity above zero (e.g. 80GiB)"),
        Some(c) if c > MAX_CAPACITY => bail!(
            "--capacity {}: above {} (the simulated device has 64 TiB of address space, and pools reserve several times their capacity in it; no GPU has more than a few hundred GiB)",
            human_bytes(c),
            human_bytes(MAX_CAPACITY)
        ),
        _ => Ok(()),
    }
}

/// Checks the flags that need no trace; returns warnings to print.
fn check_args(a: &ReplayArgs, target: &Target) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    if a.min_capacity && !matches!(target, Target::Sim) {
        bail!("--min-capacity runs many replays and is only offered on the simulated device");
    }
    check_capacity(a.capacity)?;
    if a.segment_size == 0 {
        bail!("--segment-size 0: expected a segment size above zero (e.g. 256MiB)");
    }
    if !a.segment_size.is_multiple_of(DEFAULT_GRANULARITY) {
        warnings.push(format!(
            "--segment-size {}: segments are rounded up to a multiple of the device granularity ({}), so {} is used",
            human_bytes(a.segment_size),
            human_bytes(DEFAULT_GRANULARITY),
            human_bytes(a.segment_size.div_ceil(DEFAULT_GRANULARITY) * DEFAULT_GRANULARITY)
        ));
    }
    if a.canary && matches!(target, Target::Sim) {
        bail!("--canary needs a device with memory contents: use --device cuda (the simulated device keeps none)");
    }
    Ok(warnings)
}

/// Warnings that need the trace: a capacity that cannot hold the trace's requests.
fn capacity_warnings(capacity: Option<u64>, summaries: &[(u32, TraceSummary)]) -> Vec<String> {
    let Some(c) = capacity else {
        return Vec::new();
    };
    let largest = summaries
        .iter()
        .map(|(_, s)| s.largest_request_bytes)
        .max()
        .unwrap_or(0);
    let peak = summaries
        .iter()
        .map(|(_, s)| s.peak_requested_bytes)
        .max()
        .unwrap_or(0);
    let unit_hint = if c < 1 << 20 {
        " (a number without a unit is bytes: write 24GiB for 24 GiB)"
    } else {
        ""
    };
    if c < largest {
        vec![format!(
            "--capacity {} is smaller than the trace's largest request ({}): those allocations cannot succeed{unit_hint}",
            human_bytes(c),
            human_bytes(largest)
        )]
    } else if c < peak {
        vec![format!(
            "--capacity {} is below the trace's peak requested bytes ({}): allocations will fail{unit_hint}",
            human_bytes(c),
            human_bytes(peak)
        )]
    } else {
        Vec::new()
    }
}

/// Everything one allocator's replays produced.
struct AllocatorRun {
    name: &'static str,
    per_dev: Vec<ReplayReport>,
    min_capacity: Vec<DeviceMinCapacity>,
    simulated_peak_reserved_bytes: Option<u64>,
    /// `torch` on recorded addresses: the self-check per device.
    checks: Vec<RecordedCheck>,
}

/// What every allocator's replays share.
struct Shared<'a> {
    trace: &'a trace::Trace,
    trace_path: &'a std::path::Path,
    summaries: &'a [(u32, TraceSummary)],
    target: &'a Target,
    capacity: u64,
    config: AllocatorConfig,
    timeline: bool,
    canary: bool,
    min_capacity: bool,
    /// The torch emulation runs the recorded run's setting on an unlimited simulated device:
    /// it gets the recorded segment addresses and checks itself against them.
    follow_recorded: bool,
}

/// Replays the trace through one allocator on every device of the trace, then (when asked)
/// searches its smallest capacities. `progress` receives event counts as they are done.
fn run_allocator(
    sh: &Shared<'_>,
    name: &'static str,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<AllocatorRun> {
    let mut per_dev = Vec::new();
    let mut checks = Vec::new();
    for &(d, ref s) in sh.summaries {
        let mut alloc = registry::build(name, &sh.config)?;
        let mut recording = (name == "torch"
            && sh.follow_recorded
            && matches!(sh.target, Target::Sim))
        .then(|| {
            gpumem::torch_replay::recording_device(sh.trace, d, &sh.config.torch, sh.capacity)
        });
        let mut opened = match recording {
            Some(_) => None,
            None => Some(open_device(sh.target, sh.capacity, d)?),
        };
        let dev: &mut dyn Device = match (recording.as_mut(), opened.as_mut()) {
            (Some(r), _) => r,
            (None, Some(o)) => o.as_mut(),
            (None, None) => bail!("no device opened"),
        };
        let opts = ReplayConfig {
            device: d,
            timeline_points: if sh.timeline { 2000 } else { 0 },
            canary: sh.canary,
            ..ReplayConfig::default()
        };
        let mut done = 0u64;
        let mut cb = |n: u64| {
            progress(n.saturating_sub(done));
            done = n;
        };
        let r = replay::replay_summarized(sh.trace, s, alloc.as_mut(), dev, &opts, &mut cb)
            .with_context(|| {
                format!(
                    "replaying {} with {name} on device {d}",
                    trace::source_name(sh.trace_path)
                )
            })?;
        checks.extend(recording.as_ref().and_then(SimDevice::recorded_check));
        per_dev.push(r);
    }
    let mut min_capacity = Vec::new();
    if sh.min_capacity {
        for (i, &(d, ref s)) in sh.summaries.iter().enumerate() {
            // The upper bound must complete: twice what an unconstrained run reserved, or the
            // default device when the run under --capacity failed.
            let upper = if per_dev[i].failed_count() == 0 {
                per_dev[i]
                    .peak_reserved_bytes
                    .max(1)
                    .saturating_mul(2)
                    .max(1 << 30)
            } else {
                DEFAULT_CAPACITY.max(sh.capacity)
            };
            let cfg = sh.config;
            let make = || -> Box<dyn Allocator> {
                // The name was built once above, so it builds again.
                registry::build(name, &cfg).expect("allocator names were validated")
            };
            let make_dev = |c: u64| SimDevice::new(c);
            let opts = ReplayConfig {
                device: d,
                ..ReplayConfig::default()
            };
            let search = MinCapacityConfig {
                upper_bytes: upper,
                resolution_bytes: DEFAULT_GRANULARITY,
                ..MinCapacityConfig::default()
            };
            let outcome = replay::min_capacity(sh.trace, s, &make, &make_dev, &search, &opts)
                .with_context(|| format!("smallest capacity of {name} on device {d}"))?;
            min_capacity.push(DeviceMinCapacity { device: d, outcome });
        }
    }
    let simulated_peak_reserved_bytes = if matches!(sh.target, Target::Sim) {
        None
    } else {
        let mut total = 0u64;
        for &(d, ref s) in sh.summaries {
            let mut alloc = registry::build(name, &sh.config)?;
            let mut sim = SimDevice::new(sh.capacity);
            let opts = ReplayConfig {
                device: d,
                ..ReplayConfig::default()
            };
            total += replay::replay_summarized(
                sh.trace,
                s,
                alloc.as_mut(),
                &mut sim,
                &opts,
                &mut |_| {},
            )?
            .peak_reserved_bytes;
        }
        Some(total)
    };
    Ok(AllocatorRun {
        name,
        per_dev,
        min_capacity,
        simulated_peak_reserved_bytes,
        checks,
    })
}

/// Warnings for a `--lazy-conf` that parsed (`lazy`) but has keys with no effect under its
/// placement, or whose allocator is not among `names`. Shared by `replay`, `report` and `map`.
pub fn lazy_conf_warnings(
    text: &str,
    lazy: &gpumem::core::config::LazyConfig,
    names: &[&str],
) -> Vec<String> {
    let mut warnings = Vec::new();
    // The keys given, split as lazy_conf read them (it accepted every item).
    let keys: Vec<&str> = gpumem::conf_items::items(text, &gpumem::lazy_conf::KEYS)
        .filter_map(Result::ok)
        .map(|(k, _)| k)
        .collect();
    if lazy.placement == LazyPlacement::Pages && keys.contains(&"grow_ahead") {
        warnings.push(
            "--lazy-conf: grow_ahead tunes placement=segments (the default) only; with placement=pages it has no effect (map_ahead is its counterpart there)".to_string(),
        );
    }
    if lazy.placement == LazyPlacement::Segments {
        let ignored: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| matches!(*k, "headroom" | "max_handle" | "map_ahead"))
            .collect();
        if !ignored.is_empty() {
            warnings.push(format!(
                "--lazy-conf: {} tune{} placement=pages only; with placement=segments (the default) {} no effect",
                ignored.join(", "),
                if ignored.len() == 1 { "s" } else { "" },
                if ignored.len() == 1 { "it has" } else { "they have" },
            ));
        }
    }
    if !names.contains(&"paged-lazy") {
        warnings.push(
            "--lazy-conf configures paged-lazy only, which is not among the allocators replayed (add -a paged-lazy)".into(),
        );
    }
    warnings
}

/// The warning for segments of `segment_size` larger than the device of `device_bytes`
/// (when known) when `names` holds a segmented pool (buddy, tlsf, best-fit): each growth of
/// such a pool is refused, its cache emptied and the request retried alone. Shared by
/// `replay`, `report` and `map`.
pub fn segment_size_warning(
    names: &[&str],
    segment_size: u64,
    device_bytes: Option<u64>,
) -> Option<String> {
    let cap = device_bytes.filter(|&c| segment_size > c)?;
    let segmented: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| matches!(*n, "buddy" | "tlsf" | "best-fit"))
        .collect();
    if segmented.is_empty() {
        return None;
    }
    let one = segmented.len() == 1;
    Some(format!(
        "segments of {} (--segment-size) are larger than the device ({}): {} {} for one, {} refused, {} cache and {} with the request alone at every growth (counted under retries and driver time)",
        human_bytes(segment_size),
        human_bytes(cap),
        segmented.join(", "),
        if one { "asks" } else { "ask" },
        if one { "is" } else { "are" },
        if one { "empties its" } else { "empty their" },
        if one { "retries" } else { "retry" },
    ))
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
    let names = registry::parse_list(&a.allocator)?;
    // A segment larger than the (simulated) device is refused every time the pools grow.
    let device_bytes = a
        .capacity
        .or(matches!(target, Target::Sim).then_some(DEFAULT_CAPACITY));
    warnings.extend(segment_size_warning(&names, a.segment_size, device_bytes));
    let read_started = Instant::now();
    if matches!(target, Target::Cuda(_) | Target::AllCuda) {
        // Before reading a trace that may take a while: a missing driver is known at once.
        gpumem::cuda::init()?;
    }
    let trace = trace::read_path(
        &a.trace,
        ReadConfig {
            lenient: a.lenient,
            ..ReadConfig::default()
        },
    )?;
    let read_seconds = read_started.elapsed().as_secs_f64();
    let devices = replay::devices(&trace);
    let has_blocks = trace
        .events
        .iter()
        .any(|e| matches!(e.action, trace::Action::Alloc | trace::Action::Free));
    if !has_blocks && trace.preexisting.is_empty() {
        return crate::cmd_analyze::print_state(&a.trace, &trace, a.json);
    }
    let capacity = a.capacity.unwrap_or(DEFAULT_CAPACITY);
    let (torch_conf, conf_source) = crate::cmd_tune::torch_conf(a.torch_conf.as_deref(), &trace)?;
    let mut config = crate::cmd_tune::allocator_config(a.segment_size, a.capacity, torch_conf);
    if let Some(text) = &a.lazy_conf {
        config.lazy = lazy_conf(text)?;
    }
    // Computed once: every replay and every capacity probe reuses them.
    let summaries: Vec<(u32, TraceSummary)> = devices
        .iter()
        .map(|&d| (d, replay::summarize(&trace, d)))
        .collect();
    warnings.extend(capacity_warnings(a.capacity, &summaries));
    // A `NAME-CONF.stats.json` beside the trace that cannot be used is said, not skipped.
    warnings.extend(gpumem::report::recorded_figures_checked(&a.trace).1);
    if let Some(text) = &a.lazy_conf {
        warnings.extend(lazy_conf_warnings(text, &config.lazy, &names));
    }
    if a.torch_conf.is_some() && !names.contains(&"torch") {
        warnings.push(
            "--torch-conf configures the torch emulation only, which is not among the allocators replayed (add -a torch)".into(),
        );
    }
    if names.contains(&"torch")
        && torch_conf.garbage_collection_threshold > 0.0
        && a.capacity.is_none()
        && torch_conf.allowed_memory_bytes.is_none()
        && torch_conf.per_process_memory_fraction >= 1.0
    {
        warnings.push(
            "garbage_collection_threshold acts only under a memory limit (PyTorch: set_per_process_memory_fraction, or per_process_memory_fraction in the setting): without one or --capacity the collector never runs and the figures are native's".into(),
        );
    }
    let total_events: u64 = summaries.iter().map(|(_, s)| s.events).sum();
    let show_progress = !a.json && std::io::stderr().is_terminal();
    if !a.json {
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
        print_read_notes(&trace);
        if names.contains(&"torch") {
            eprintln!("torch emulation: PYTORCH_CUDA_ALLOC_CONF {torch_conf} ({conf_source})");
        }
        if names.contains(&"paged-lazy") {
            let l = config.lazy;
            let source = if a.lazy_conf.as_deref().is_some_and(|t| !t.trim().is_empty()) {
                "--lazy-conf"
            } else {
                "defaults"
            };
            let (items, what) = gpumem::lazy_conf::describe(&l);
            eprintln!("paged-lazy: {items} ({what}) ({source})");
        }
    }
    // What the table says under its "read" line; `--json` has them as `trace.notes`.
    let mut notes: Vec<String> = Vec::new();
    if !trace.preexisting.is_empty() {
        let n = trace.preexisting.len();
        notes.push(format!(
            "{n} block{} already live when recording started (declared, freed without an alloc, or listed in the snapshot's segments); replayed as live from the start",
            if n == 1 { " was" } else { "s were" }
        ));
    }
    let private = trace.segments.iter().filter(|s| s.private_pool).count();
    if private > 0 && names.contains(&"torch") {
        notes.push(format!(
            "{} of the snapshot {} to CUDA-graph private pools (torch.cuda.graph, torch.compile mode=\"reduce-overhead\"), which the torch emulation does not model: its figures may differ from PyTorch's where graphs allocate (the self-check says where)",
            crate::units::counted(private as u64, "segment"),
            if private == 1 { "belongs" } else { "belong" },
        ));
    }
    // The emulation takes in the segments of the kind its setting makes (cudaMalloc
    // segments, or expandable ones under expandable_segments); the others' blocks are
    // allocated as usual.
    let (mut segs, mut other) = (0usize, 0usize);
    for &(d, _) in &summaries {
        for s in gpumem::replay::preexisting_segments(&trace, d) {
            if s.segment.mapped.is_some() == config.torch.expandable_segments {
                segs += 1;
            } else {
                other += 1;
            }
        }
    }
    if segs > 0 && names.contains(&"torch") {
        notes.push(format!(
            "{} made before recording started (no event of the trace made {}); the torch emulation starts from {}, as PyTorch did",
            crate::units::counted(segs as u64, "segment"),
            if segs == 1 { "it" } else { "them" },
            if segs == 1 { "it" } else { "them" },
        ));
    }
    if other > 0 && names.contains(&"torch") {
        notes.push(format!(
            "{} made before recording started {} not of the kind {} makes: the torch emulation allocates {} blocks as usual",
            crate::units::counted(other as u64, if config.torch.expandable_segments { "cudaMalloc segment" } else { "expandable segment" }),
            if other == 1 { "is" } else { "are" },
            if config.torch.expandable_segments { "expandable_segments:True" } else { "this setting" },
            if other == 1 { "its" } else { "their" },
        ));
    }

    if !a.json {
        for n in &notes {
            eprintln!("  {n}");
        }
    }
    for w in &warnings {
        eprintln!("warning: {w}");
    }

    let shared = Shared {
        trace: &trace,
        trace_path: &a.trace,
        summaries: &summaries,
        target: &target,
        capacity,
        config,
        timeline: a.timeline.is_some(),
        canary: a.canary,
        min_capacity: a.min_capacity,
        follow_recorded: crate::cmd_tune::follows_recorded(conf_source, a.capacity),
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
    // On the simulated device the allocators replay side by side, one thread each (the
    // capacity probes of one allocator run in order in its thread). On a real GPU they run
    // one after the other: concurrent pools would share the driver and cuMemGetInfo.
    // The planned layout is worked out beside the replays, in a thread of its own (none
    // with --no-plan).
    let (runs, (planned_layout, planned_layout_skipped)) = std::thread::scope(|outer| {
        let planner = (!a.no_plan).then(|| outer.spawn(|| planned_layouts(&trace, &summaries)));
        let runs: Vec<Result<AllocatorRun>> = if matches!(target, Target::Sim) && names.len() > 1 {
            std::thread::scope(|sc| {
                let handles: Vec<_> = names
                    .iter()
                    .map(|&n| {
                        let (sh, pr) = (&shared, &progress);
                        sc.spawn(move || {
                            warm_thread_heap();
                            run_allocator(sh, n, pr)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("a replay thread panicked")))
                    })
                    .collect()
            })
        } else {
            names
                .iter()
                .map(|&n| run_allocator(&shared, n, &progress))
                .collect()
        };
        let planned = match planner {
            Some(p) => p
                .join()
                .unwrap_or_else(|_| (Vec::new(), Some("the planner panicked".into()))),
            None => (Vec::new(), Some(NO_PLAN.into())),
        };
        (runs, planned)
    });
    pb.finish_and_clear();
    let runs: Vec<AllocatorRun> = runs.into_iter().collect::<Result<_>>()?;

    let mut out = Vec::new();
    for r in &runs {
        let mut ja = json_allocator(r.name, &r.per_dev, &summaries);
        if r.name == "torch" {
            ja.torch_conf = Some(config.torch.to_string());
            ja.emulation_check = combined_check(&r.checks);
        }
        if r.name == "paged-lazy" {
            ja.lazy_conf = Some(gpumem::lazy_conf::text(&config.lazy));
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
    let min_caps: Vec<(&'static str, &[DeviceMinCapacity])> = runs
        .iter()
        .map(|r| (r.name, r.min_capacity.as_slice()))
        .collect();

    let peak_requested: u64 = summaries.iter().map(|(_, s)| s.peak_requested_bytes).sum();
    let duration_us = summaries.iter().filter_map(|(_, s)| s.duration_us).max();
    let json = JsonOut {
        trace: JsonTrace {
            path: a.trace.display().to_string(),
            format: trace.format,
            events: total_events,
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
        pytorch_recorded: recorded_figures(&a.trace, peak_requested),
        device: a.device.clone(),
        capacity_bytes: capacity,
        recorded_ooms: oom_verdicts(&trace, &names, config)?,
        allocators: out,
    };
    if let Some(path) = &a.timeline {
        let cap = a.capacity.map(|c| c as f64);
        let svg = timeline_chart(&a.trace, &trace, &devices, &runs, cap).to_svg();
        crate::output::write_text(path, &svg)?;
        if !a.json {
            eprintln!("timeline written to {}", path.display());
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print_oom_verdicts(&json);
        print_table(&json, capacity, a.capacity.is_some());
        for al in &json.allocators {
            if let Some(c) = &al.emulation_check {
                println!("{} emulation {c}", al.name);
            }
        }
        if a.min_capacity {
            print_min_capacity(&min_caps);
        }
        print_notes(&json, capacity);
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

/// Touches 512 KiB of the calling thread's heap and frees it again, before a replay thread
/// starts its clock. Each thread gets a malloc arena of its own (glibc), fresh, whose pages
/// the replay's maps and vectors would otherwise first-touch inside the timed loop: 30–100
/// minor faults of ≈ 1.8 µs each on the CPU machine, 15–30 % of a short trace's replay time,
/// which a replay on the main thread (whose heap reading the trace warmed) does not pay.
/// Blocks of 8 KiB stay below the size malloc serves from mmap, so they go back to the
/// arena for the replay to reuse. No figure depends on it, only `events_per_second`.
fn warm_thread_heap() {
    let blocks: Vec<Vec<u8>> = (0..64).map(|_| vec![0xA5u8; 8 << 10]).collect();
    std::hint::black_box(&blocks);
}

/// What failed allocations do, and how speeds are measured (printed under the table and kept
/// in `--json`).
const SEMANTICS: &str = "A failed allocation (out of memory after the pool released its cache and retried, or a request the allocator refuses as impossible) is dropped with its later free and the replay goes on; PyTorch would raise OutOfMemoryError and stop there. Requested bytes count served blocks only. events/s = events replayed / CPU seconds of the replaying thread.";
/// Prints to standard error what the reader noticed: a salvaged truncation, skipped events
/// (the first five, then how many more) and warnings.
pub fn print_read_notes(trace: &trace::Trace) {
    for n in trace.lenient_notes() {
        eprintln!("  {n}");
    }
    for w in &trace.warnings {
        eprintln!("  warning: {w}");
    }
}

fn json_allocator(
    name: &str,
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
        name: name.to_string(),
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

/// Verdicts on the trace's recorded OOMs, on the simulated device (see `recorded_oom`).
fn oom_verdicts(
    trace: &trace::Trace,
    names: &[&str],
    config: AllocatorConfig,
) -> Result<Vec<OomVerdict>> {
    if trace.count(trace::Action::Oom) == 0 {
        return Ok(Vec::new());
    }
    let make = |n: &str| -> Box<dyn Allocator> {
        registry::build(n, &config).expect("allocator names were validated")
    };
    let make_dev = |c: u64| SimDevice::new(c);
    Ok(recorded_oom::verdicts(trace, names, &make, &make_dev)?)
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
