//! `gpumem replay`: a trace through allocators on the simulated (or a real) device.
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use gpumem::core::config::AllocatorConfig;
use gpumem::core::registry;
use gpumem::core::sim::{SimDevice, DEFAULT_CAPACITY};
use gpumem::core::{Allocator, Device, DriverCall};
use gpumem::plot::{Chart, Series, PALETTE};
use gpumem::replay::{self, ReplayConfig, ReplayReport, TraceSummary};
use gpumem::trace::{self, ReadConfig};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use crate::units::{human_bytes, parse_size};

/// Arguments of `gpumem replay`.
#[derive(Args)]
pub struct ReplayArgs {
    /// The trace: a PyTorch memory snapshot (.pickle or .pickle.gz), an RMM log CSV, or
    /// gpumem JSON lines (detected from the content).
    pub trace: PathBuf,
    /// Allocators to compare: a comma-separated list of buddy, tlsf, best-fit, torch, paged,
    /// or `all`.
    #[arg(long, short, default_value = "all")]
    pub allocator: String,
    /// Device capacity (e.g. 80GiB, 141GB; K/M/G/T alone are binary like KiB/MiB/GiB/TiB,
    /// KB/MB/GB/TB decimal); allocations that still do not fit after the pool released its
    /// cache count as OOMs and are dropped (with their frees).
    #[arg(long, value_parser = parse_size)]
    pub capacity: Option<u64>,
    /// Also bisect, per allocator, the smallest capacity that completes the trace with no OOM.
    #[arg(long)]
    pub min_capacity: bool,
    /// Segment size for the buddy, tlsf and best-fit pools (each segment is one cuMemAlloc,
    /// sub-allocated by the strategy, like a pre-allocated pool).
    #[arg(long, value_parser = parse_size, default_value = "256MiB")]
    pub segment_size: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Draw requested / allocated / reserved memory over the trace, per allocator, as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<PathBuf>,
    /// Skip and count malformed events instead of stopping at the first.
    #[arg(long)]
    pub lenient: bool,
    /// Where to allocate: `sim` (simulated H200, default), `cuda`, `cuda:N`, or `all` (the
    /// trace's device N on cuda:N, each on its own pool).
    #[arg(long, default_value = "sim")]
    pub device: String,
    /// Fill every block with a pattern at allocation and verify it at free (real devices).
    #[arg(long)]
    pub canary: bool,
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
    preexisting_blocks: u64,
    skipped_events: u64,
    devices: Vec<u32>,
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
    oom_count: u64,
    driver_calls: serde_json::Map<String, serde_json::Value>,
    driver_calls_total: u64,
    modelled_driver_seconds: f64,
    events_per_second: f64,
    canary_errors: u64,
    /// Peak physical bytes the device itself counted (segments and handles it handed out).
    device_peak_used_bytes: u64,
    /// Real devices: peak of cuMemGetInfo's used memory above its value at the start.
    #[serde(skip_serializing_if = "Option::is_none")]
    driver_peak_delta_bytes: Option<u64>,
    /// Real devices: the same replay's peak reserved on the simulated device.
    #[serde(skip_serializing_if = "Option::is_none")]
    simulated_peak_reserved_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    per_device: Vec<serde_json::Value>,
}

/// PyTorch's own `memory_stats()` for the traced run, when a `<name>-<conf>.stats.json` lies
/// beside the trace (as in `traces/`).
#[derive(Serialize)]
struct Recorded {
    conf: String,
    reserved_bytes_peak: u64,
    reserved_over_requested: f64,
}

fn recorded_figures(trace: &std::path::Path, peak_requested: u64) -> Vec<Recorded> {
    let Some(name) = trace.file_name().and_then(|f| f.to_str()) else {
        return Vec::new();
    };
    let stem = name.split('.').next().unwrap_or(name);
    let dir = trace.parent().unwrap_or(std::path::Path::new("."));
    let mut out = Vec::new();
    for conf in ["native", "expandable_segments_True"] {
        let p = dir.join(format!("{stem}-{conf}.stats.json"));
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        if let Some(r) = v
            .get("reserved_bytes.all.peak")
            .and_then(serde_json::Value::as_u64)
        {
            out.push(Recorded {
                conf: conf.replace("_True", "").to_string(),
                reserved_bytes_peak: r,
                reserved_over_requested: if peak_requested == 0 {
                    0.0
                } else {
                    r as f64 / peak_requested as f64
                },
            });
        }
    }
    out
}

#[derive(Serialize)]
struct JsonOut {
    trace: JsonTrace,
    /// PyTorch's recorded figures for the same run (empty when none lie beside the trace).
    pytorch_recorded: Vec<Recorded>,
    device: String,
    capacity_bytes: u64,
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
        Target::Cuda(n) => crate::cmd_cuda::open_replay_device(*n, capacity),
        Target::AllCuda => crate::cmd_cuda::open_replay_device(trace_device as usize, capacity)
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

pub fn run(a: ReplayArgs) -> Result<()> {
    let target = parse_device(&a.device)?;
    if a.min_capacity && !matches!(target, Target::Sim) {
        bail!("--min-capacity runs many replays and is only offered on the simulated device");
    }
    if a.capacity == Some(0) {
        bail!("--capacity 0: expected a device capacity above zero (e.g. 80GiB)");
    }
    if a.segment_size == 0 {
        bail!("--segment-size 0: expected a segment size above zero (e.g. 256MiB)");
    }
    if let Some(path) = &a.timeline {
        // Fail before a long replay, not after it.
        std::fs::write(path, "")
            .with_context(|| format!("--timeline: cannot write {}", path.display()))?;
    }
    let names = registry::parse_list(&a.allocator)?;
    if a.canary && matches!(target, Target::Sim) {
        bail!("--canary needs a device with memory contents: use --device cuda (the simulated device keeps none)");
    }
    let read_started = Instant::now();
    let trace = trace::read_path(&a.trace, ReadConfig { lenient: a.lenient })?;
    let read_seconds = read_started.elapsed().as_secs_f64();
    let devices = replay::devices(&trace);
    let has_blocks = trace
        .events
        .iter()
        .any(|e| matches!(e.action, trace::Action::Alloc | trace::Action::Free));
    if !has_blocks {
        return crate::cmd_analyze::print_state(&a.trace, &trace, a.json);
    }
    let capacity = a.capacity.unwrap_or(DEFAULT_CAPACITY);
    let config = AllocatorConfig {
        segment_bytes: a.segment_size,
        ..AllocatorConfig::default()
    };
    let summaries: Vec<(u32, TraceSummary)> = devices
        .iter()
        .map(|&d| (d, replay::summarize(&trace, d)))
        .collect();
    let total_events: u64 = summaries.iter().map(|(_, s)| s.events).sum();
    let show_progress = !a.json && std::io::stderr().is_terminal();
    if !a.json {
        eprintln!(
            "read {} ({:?}, {} events, {:.2} s){}",
            a.trace.display(),
            trace.format.unwrap_or(trace::Format::JsonLines),
            trace.events.len(),
            read_seconds,
            if trace.skipped_count > 0 {
                format!(", {} bad events skipped", trace.skipped_count)
            } else {
                String::new()
            }
        );
        for s in trace.skipped.iter().take(5) {
            eprintln!("  skipped: {s}");
        }
        if !trace.preexisting.is_empty() {
            let n = trace.preexisting.len();
            eprintln!(
                "  {n} block{} already live when recording started (declared, freed without an alloc, or listed in the snapshot's segments); replayed as live from the start",
                if n == 1 { " was" } else { "s were" }
            );
        }
    }

    let mut out = Vec::new();
    let mut reports: Vec<(String, Vec<ReplayReport>)> = Vec::new();
    for name in &names {
        let pb = progress_bar(total_events, show_progress);
        pb.set_message(name.to_string());
        let started = Instant::now();
        let mut per_dev = Vec::new();
        let mut done_before = 0u64;
        for &(d, ref s) in &summaries {
            let mut alloc = registry::build(name, &config)?;
            let mut dev = open_device(&target, capacity, d)?;
            let opts = ReplayConfig {
                device: d,
                timeline_points: if a.timeline.is_some() { 2000 } else { 0 },
                canary: a.canary,
                ..ReplayConfig::default()
            };
            let mut cb = |n: u64| {
                if show_progress && started.elapsed() > Duration::from_secs(1) && pb.is_hidden() {
                    pb.set_draw_target(ProgressDrawTarget::stderr());
                }
                pb.set_position(done_before + n);
            };
            let r = replay::replay(&trace, alloc.as_mut(), dev.as_mut(), &opts, &mut cb)
                .with_context(|| {
                    format!("replaying {} with {name} on device {d}", a.trace.display())
                })?;
            done_before += s.events;
            per_dev.push(r);
        }
        pb.finish_and_clear();
        let min_cap = if a.min_capacity {
            let mut total = 0u64;
            for (i, &(d, _)) in summaries.iter().enumerate() {
                // The bound must complete: a run cut short by a small --capacity gives none.
                let upper = if per_dev[i].oom_count == 0 {
                    per_dev[i]
                        .peak_reserved_bytes
                        .max(1)
                        .saturating_mul(2)
                        .max(1 << 30)
                } else {
                    DEFAULT_CAPACITY.max(capacity)
                };
                let cfg = config;
                let n = *name;
                let mut make = || -> Box<dyn Allocator> {
                    registry::build(n, &cfg).expect("allocator names were validated")
                };
                let mut make_dev = |c: u64| -> Box<dyn Device> { Box::new(SimDevice::new(c)) };
                let opts = ReplayConfig {
                    device: d,
                    ..ReplayConfig::default()
                };
                match replay::min_capacity(&trace, &mut make, &mut make_dev, upper, 2 << 20, &opts)?
                {
                    Some(c) => total += c,
                    None => bail!(
                        "{name}: the trace does not complete even with {}: a single request is larger than that",
                        human_bytes(upper)
                    ),
                }
            }
            Some(total)
        } else {
            None
        };
        let mut ja = json_allocator(name, &per_dev, &summaries, min_cap);
        if !matches!(target, Target::Sim) {
            let mut total = 0u64;
            for &(d, _) in &summaries {
                let mut alloc = registry::build(name, &config)?;
                let mut sim = SimDevice::new(capacity);
                let opts = ReplayConfig {
                    device: d,
                    ..ReplayConfig::default()
                };
                total += replay::replay(&trace, alloc.as_mut(), &mut sim, &opts, &mut |_| {})?
                    .peak_reserved_bytes;
            }
            ja.simulated_peak_reserved_bytes = Some(total);
        }
        out.push(ja);
        reports.push((name.to_string(), per_dev));
    }

    let peak_requested: u64 = summaries.iter().map(|(_, s)| s.peak_requested_bytes).sum();
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
            preexisting_blocks: trace.preexisting.len() as u64,
            skipped_events: trace.skipped_count,
            devices: devices.clone(),
        },
        pytorch_recorded: recorded_figures(&a.trace, peak_requested),
        device: a.device.clone(),
        capacity_bytes: capacity,
        allocators: out,
    };
    if let Some(path) = &a.timeline {
        let svg = timeline_chart(&a.trace, &reports).to_svg();
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
        if !a.json {
            eprintln!("timeline written to {}", path.display());
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print_table(&json, capacity);
    }
    Ok(())
}

fn json_allocator(
    name: &str,
    per_dev: &[ReplayReport],
    summaries: &[(u32, TraceSummary)],
    min_cap: Option<u64>,
) -> JsonAllocator {
    let sum = |f: &dyn Fn(&ReplayReport) -> u64| per_dev.iter().map(f).sum::<u64>();
    let peak_requested: u64 = summaries.iter().map(|(_, s)| s.peak_requested_bytes).sum();
    let peak_reserved = sum(&|r| r.peak_reserved_bytes);
    let mut calls = serde_json::Map::new();
    for c in DriverCall::ALL {
        let n: u64 = per_dev.iter().map(|r| r.driver_calls.get(c)).sum();
        calls.insert(c.short_name().to_string(), n.into());
    }
    let secs: f64 = per_dev.iter().map(|r| r.seconds).sum();
    let events: u64 = summaries.iter().map(|(_, s)| s.events).sum();
    JsonAllocator {
        name: name.to_string(),
        peak_reserved_bytes: peak_reserved,
        peak_allocated_bytes: sum(&|r| r.peak_allocated_bytes),
        reserved_over_requested: if peak_requested == 0 {
            0.0
        } else {
            peak_reserved as f64 / peak_requested as f64
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
        oom_count: sum(&|r| r.oom_count),
        driver_calls_total: sum(&|r| r.driver_calls.total()),
        driver_calls: calls,
        modelled_driver_seconds: per_dev.iter().map(|r| r.modelled_driver_seconds).sum(),
        events_per_second: if secs > 0.0 {
            events as f64 / secs
        } else {
            0.0
        },
        canary_errors: sum(&|r| r.canary_errors),
        device_peak_used_bytes: sum(&|r| r.device_peak_used_bytes),
        driver_peak_delta_bytes: per_dev
            .iter()
            .map(|r| r.driver_peak_delta_bytes)
            .sum::<Option<u64>>(),
        simulated_peak_reserved_bytes: None,
        min_capacity_bytes: min_cap,
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
                    })
                })
                .collect()
        } else {
            Vec::new()
        },
    }
}

fn print_table(j: &JsonOut, capacity: u64) {
    let t = &j.trace;
    println!(
        "trace {}: {} events ({} allocs, {} frees), peak requested {}, largest request {}",
        t.path,
        t.events,
        t.alloc_events,
        t.free_events,
        human_bytes(t.peak_requested_bytes),
        human_bytes(t.largest_request_bytes)
    );
    println!(
        "device {} with capacity {}{}",
        j.device,
        human_bytes(capacity),
        if t.devices.len() > 1 {
            format!(
                ", {} devices in the trace (figures summed)",
                t.devices.len()
            )
        } else {
            String::new()
        }
    );
    println!();
    let has_min = j.allocators.iter().any(|a| a.min_capacity_bytes.is_some());
    let has_canary = j.device != "sim";
    print!(
        "{:<9} {:>12} {:>12} {:>9} {:>9} {:>9} {:>5} {:>12} {:>11} {:>11}",
        "allocator",
        "peak reserv.",
        "peak alloc.",
        "res/req",
        "ext.frag",
        "frag@pk",
        "OOMs",
        "driver calls",
        "driver time",
        "events/s"
    );
    if has_min {
        print!(" {:>12}", "min capacity");
    }
    if has_canary {
        print!(" {:>7}", "canary");
    }
    println!();
    for a in &j.allocators {
        print!(
            "{:<9} {:>12} {:>12} {:>9.3} {:>9.3} {:>9.3} {:>5} {:>12} {:>11} {:>11}",
            a.name,
            human_bytes(a.peak_reserved_bytes),
            human_bytes(a.peak_allocated_bytes),
            a.reserved_over_requested,
            a.peak_external_fragmentation,
            a.external_fragmentation_at_peak,
            a.oom_count,
            a.driver_calls_total,
            human_secs(a.modelled_driver_seconds),
            human_rate(a.events_per_second)
        );
        if let Some(m) = a.min_capacity_bytes {
            print!(" {:>12}", human_bytes(m));
        } else if has_min {
            print!(" {:>12}", "-");
        }
        if has_canary {
            print!(
                " {:>7}",
                if a.canary_errors == 0 {
                    "ok".to_string()
                } else {
                    format!("{} BAD", a.canary_errors)
                }
            );
        }
        println!();
    }
    if j.allocators
        .iter()
        .any(|a| a.simulated_peak_reserved_bytes.is_some())
    {
        println!();
        println!(
            "{:<9} {:>16} {:>16} {:>16} {:>10}",
            "allocator", "pool reserved", "cuMemGetInfo Δ", "simulated", "real/sim"
        );
        for a in &j.allocators {
            let sim = a.simulated_peak_reserved_bytes.unwrap_or(0);
            println!(
                "{:<9} {:>16} {:>16} {:>16} {:>10.4}",
                a.name,
                human_bytes(a.peak_reserved_bytes),
                a.driver_peak_delta_bytes
                    .map(human_bytes)
                    .unwrap_or_else(|| "-".into()),
                human_bytes(sim),
                if sim == 0 {
                    0.0
                } else {
                    a.driver_peak_delta_bytes.unwrap_or(a.peak_reserved_bytes) as f64 / sim as f64
                }
            );
        }
    }
    if !j.pytorch_recorded.is_empty() {
        let parts: Vec<String> = j
            .pytorch_recorded
            .iter()
            .map(|r| {
                format!(
                    "{} {} ({:.3})",
                    r.conf,
                    human_bytes(r.reserved_bytes_peak),
                    r.reserved_over_requested
                )
            })
            .collect();
        println!(
            "PyTorch's own peak reserved for this run (memory_stats beside the trace): {}",
            parts.join(", ")
        );
    }
    let ooms: u64 = j.allocators.iter().map(|a| a.oom_count).sum();
    if ooms > 0 {
        println!();
        println!(
            "OOMs: allocations that did not fit in {} were dropped with their frees, so those rows served less than the trace requested (res/req can fall below 1).",
            human_bytes(capacity)
        );
    }
    println!();
    println!("res/req: peak reserved / peak requested (1.000 = no memory lost to rounding or fragmentation).");
    println!("ext.frag: highest external fragmentation 1 - largest free block / free bytes; frag@pk: the same at peak reserved.");
    println!("driver time: modelled from H200 call costs on the simulated device, measured on a real one.");
}

fn human_secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

fn human_rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.1} M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1} k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

fn timeline_chart(path: &std::path::Path, reports: &[(String, Vec<ReplayReport>)]) -> Chart {
    let gib = (1u64 << 30) as f64;
    let mut panels = Vec::new();
    for (name, per_dev) in reports {
        // Timelines of several devices are summed point by point.
        let n = per_dev.iter().map(|r| r.timeline.len()).min().unwrap_or(0);
        let mut req = Vec::with_capacity(n);
        let mut all = Vec::with_capacity(n);
        let mut res = Vec::with_capacity(n);
        for i in 0..n {
            let ev = per_dev[0].timeline[i].event as f64;
            let s = |f: &dyn Fn(&replay::Sample) -> u64| {
                per_dev.iter().map(|r| f(&r.timeline[i])).sum::<u64>() as f64 / gib
            };
            req.push((ev, s(&|x| x.requested_bytes)));
            all.push((ev, s(&|x| x.allocated_bytes)));
            res.push((ev, s(&|x| x.reserved_bytes)));
        }
        let peak_res: u64 = per_dev.iter().map(|r| r.peak_reserved_bytes).sum();
        panels.push((
            format!("{name}: peak reserved {}", human_bytes(peak_res)),
            "GiB".to_string(),
            vec![
                Series {
                    label: "reserved".into(),
                    color: PALETTE[3].into(),
                    dashed: false,
                    points: res,
                },
                Series {
                    label: "allocated".into(),
                    color: PALETTE[0].into(),
                    dashed: false,
                    points: all,
                },
                Series {
                    label: "requested".into(),
                    color: PALETTE[2].into(),
                    dashed: true,
                    points: req,
                },
            ],
        ));
    }
    Chart {
        title: format!(
            "gpumem replay {}",
            path.file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        ),
        x_label: "event".into(),
        log_x: false,
        panels,
    }
}
