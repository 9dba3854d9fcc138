//! A trace through several strategies: one [`StrategyRun`] each, the planned layout beside
//! them, PyTorch's recorded figures and the recorded OOMs' verdicts.
use gpumem_core::config::AllocatorConfig;
use gpumem_core::sim::{RecordedCheck, SimDevice, DEFAULT_CAPACITY, DEFAULT_GRANULARITY};
use gpumem_core::strategy::Strategy;
use gpumem_core::{Allocator, Device};
use serde::Serialize;

use super::SessionError;
use crate::recorded_oom::OomVerdict;
use crate::replay::{
    self, MinCapacityConfig, MinCapacityOutcome, ReplayConfig, ReplayReport, TraceSummary,
};
use crate::trace::{Action, Trace};

/// What every strategy's replays of one trace share.
#[derive(Debug, Clone, Copy)]
pub struct CompareSettings<'a> {
    /// The trace.
    pub trace: &'a Trace,
    /// Its name in messages (`trace::source_name`).
    pub trace_name: &'a str,
    /// Each device of the trace replayed, with its summary.
    pub summaries: &'a [(u32, TraceSummary)],
    /// Whether the replays run on the simulated device (else on the devices `open` gives).
    pub simulated: bool,
    /// The device capacity, in bytes.
    pub capacity_bytes: u64,
    /// The allocators' settings.
    pub config: AllocatorConfig,
    /// Sample a timeline of each replay.
    pub timeline: bool,
    /// Fill and check every block (real devices).
    pub canary: bool,
    /// Search each strategy's smallest capacities.
    pub min_capacity: bool,
    /// The torch emulation runs the recorded run's setting on an unlimited simulated device:
    /// it gets the recorded segment addresses and checks itself against them.
    pub follow_recorded: bool,
}

/// One device's smallest capacities.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceMinCapacity {
    /// The trace's device ordinal.
    pub device: u32,
    /// The search's outcome.
    #[serde(flatten)]
    pub outcome: MinCapacityOutcome,
}

/// Everything one strategy's replays produced.
#[derive(Debug, Clone)]
pub struct StrategyRun {
    /// The strategy.
    pub strategy: Strategy,
    /// One report per device of the trace, in the order of the summaries.
    pub per_dev: Vec<ReplayReport>,
    /// Per device, the smallest capacities (when asked).
    pub min_capacity: Vec<DeviceMinCapacity>,
    /// Real devices: the same replays' peak reserved bytes on the simulated device.
    pub simulated_peak_reserved_bytes: Option<u64>,
    /// `torch` on recorded addresses: the self-check per device.
    pub checks: Vec<RecordedCheck>,
}

/// Replays the trace through `strategy` on every device of the trace, then (when asked)
/// searches its smallest capacities. `open(device)` opens the real device that replays the
/// trace's `device` (not called on the simulated device); `progress` receives event counts
/// as they are done.
///
/// # Errors
/// What `open` returns, and a [`SessionError`] naming the replay that failed.
pub fn run_strategy<E: From<SessionError>>(
    s: &CompareSettings<'_>,
    strategy: Strategy,
    open: &(dyn Fn(u32) -> Result<Box<dyn Device>, E> + Sync),
    progress: &(dyn Fn(u64) + Sync),
) -> Result<StrategyRun, E> {
    let mut per_dev = Vec::new();
    let mut checks = Vec::new();
    for &(d, ref summary) in s.summaries {
        let mut alloc = strategy.build(&s.config);
        let mut recording =
            (strategy == Strategy::Torch && s.follow_recorded && s.simulated).then(|| {
                crate::torch_replay::recording_device(s.trace, d, &s.config.torch, s.capacity_bytes)
            });
        let mut opened: Option<Box<dyn Device>> = None;
        let dev: &mut dyn Device = match recording.as_mut() {
            Some(r) => r,
            None => opened
                .insert(if s.simulated {
                    Box::new(SimDevice::new(s.capacity_bytes))
                } else {
                    open(d)?
                })
                .as_mut(),
        };
        let opts = ReplayConfig {
            device: d,
            timeline_points: if s.timeline { 2000 } else { 0 },
            canary: s.canary,
            ..ReplayConfig::default()
        };
        let mut done = 0u64;
        let mut cb = |n: u64| {
            progress(n.saturating_sub(done));
            done = n;
        };
        let r = replay::replay_summarized(s.trace, summary, alloc.as_mut(), dev, &opts, &mut cb)
            .map_err(|source| SessionError::ReplayOf {
                trace: s.trace_name.to_string(),
                strategy,
                device: d,
                source,
            })?;
        checks.extend(recording.as_ref().and_then(SimDevice::recorded_check));
        per_dev.push(r);
    }
    let min_capacity = if s.min_capacity {
        min_capacities(s, strategy, &per_dev)?
    } else {
        Vec::new()
    };
    let simulated_peak_reserved_bytes = if s.simulated {
        None
    } else {
        let mut total = 0u64;
        for &(d, ref summary) in s.summaries {
            let mut alloc = strategy.build(&s.config);
            let mut sim = SimDevice::new(s.capacity_bytes);
            let opts = ReplayConfig {
                device: d,
                ..ReplayConfig::default()
            };
            total += replay::replay_summarized(
                s.trace,
                summary,
                alloc.as_mut(),
                &mut sim,
                &opts,
                &mut |_| {},
            )
            .map_err(SessionError::Replay)?
            .peak_reserved_bytes;
        }
        Some(total)
    };
    Ok(StrategyRun {
        strategy,
        per_dev,
        min_capacity,
        simulated_peak_reserved_bytes,
        checks,
    })
}

/// The smallest capacities of `strategy` on each device, after the replays `per_dev`.
fn min_capacities(
    s: &CompareSettings<'_>,
    strategy: Strategy,
    per_dev: &[ReplayReport],
) -> Result<Vec<DeviceMinCapacity>, SessionError> {
    let mut out = Vec::new();
    for (i, &(d, ref summary)) in s.summaries.iter().enumerate() {
        // The upper bound must complete: twice what an unconstrained run reserved, or the
        // default device when the run under the capacity given failed.
        let upper = if per_dev[i].failed_count() == 0 {
            per_dev[i]
                .peak_reserved_bytes
                .max(1)
                .saturating_mul(2)
                .max(1 << 30)
        } else {
            DEFAULT_CAPACITY.max(s.capacity_bytes)
        };
        let cfg = s.config;
        let make = || -> Box<dyn Allocator> { strategy.build(&cfg) };
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
        let outcome = replay::min_capacity(s.trace, summary, &make, &make_dev, &search, &opts)
            .map_err(|source| SessionError::MinCapacityOf {
                strategy,
                device: d,
                source,
            })?;
        out.push(DeviceMinCapacity { device: d, outcome });
    }
    Ok(out)
}

/// What [`compare`] gives.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// One run per strategy, in the order asked.
    pub runs: Vec<StrategyRun>,
    /// Per device, the planned layout (empty when skipped).
    pub planned: Vec<PlannedLayout>,
    /// Why no layout was planned, when none was.
    pub planned_skipped: Option<String>,
}

/// [`run_strategy`] for each of `strategies`, in their order, with the planned layout of
/// every device worked out beside them in a thread of its own (unless `plan` is false: then
/// the layouts are empty and the reason is [`NO_PLAN`]).
///
/// On the simulated device the strategies replay side by side, one thread each (the
/// capacity probes of one strategy run in order in its thread). On a real GPU they run one
/// after the other: concurrent pools would share the driver and cuMemGetInfo.
///
/// # Errors
/// The first strategy's error in `strategies`' order, or [`SessionError::Panicked`].
pub fn compare<E: From<SessionError> + Send>(
    s: &CompareSettings<'_>,
    strategies: &[Strategy],
    open: &(dyn Fn(u32) -> Result<Box<dyn Device>, E> + Sync),
    progress: &(dyn Fn(u64) + Sync),
    plan: bool,
) -> Result<Comparison, E> {
    let (runs, planned) = std::thread::scope(|outer| {
        let planner = plan.then(|| outer.spawn(|| planned_layouts(s.trace, s.summaries)));
        let runs: Vec<Result<StrategyRun, E>> = if s.simulated && strategies.len() > 1 {
            std::thread::scope(|sc| {
                let handles: Vec<_> = strategies
                    .iter()
                    .map(|&strategy| {
                        sc.spawn(move || {
                            warm_thread_heap();
                            run_strategy(s, strategy, open, progress)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(SessionError::Panicked.into()))
                    })
                    .collect()
            })
        } else {
            strategies
                .iter()
                .map(|&strategy| run_strategy(s, strategy, open, progress))
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
    let (planned, planned_skipped) = planned;
    Ok(Comparison {
        runs: runs.into_iter().collect::<Result<_, E>>()?,
        planned,
        planned_skipped,
    })
}

/// Touches 512 KiB of the calling thread's heap and frees it again, before a replay thread
/// starts its clock. Each thread gets a malloc arena of its own (glibc), fresh, whose pages
/// the replay's maps and vectors would otherwise first-touch inside the timed loop, which a
/// replay on the main thread (whose heap reading the trace warmed) does not pay. Blocks of
/// 8 KiB stay below the size malloc serves from mmap, so they go back to the arena for the
/// replay to reuse. No figure depends on it, only `events_per_second`.
fn warm_thread_heap() {
    let blocks: Vec<Vec<u8>> = (0..64).map(|_| vec![0xA5u8; 8 << 10]).collect();
    std::hint::black_box(&blocks);
}

/// Why no layout was planned under `--no-plan`.
pub const NO_PLAN: &str = "not asked for: --no-plan";

/// One device's planned layout ([`crate::plan::planned_layout`]).
#[derive(Debug, Clone, Serialize)]
pub struct PlannedLayout {
    /// The trace's device ordinal.
    pub device: u32,
    /// Blocks placed.
    pub blocks: u64,
    /// Highest sum of live blocks' sizes rounded to 512 B.
    pub peak_live_bytes: u64,
    /// The layout's extent: the memory it needs.
    pub layout_bytes: u64,
    /// `layout_bytes` ÷ the device's peak requested bytes (as res/req).
    pub over_requested: f64,
    /// Which order of placement gave it: `size` (largest first) or `lifetime`.
    pub order: crate::plan::PlanOrder,
}

/// The planned layout of every device of the trace, or why it was skipped.
pub fn planned_layouts(
    trace: &Trace,
    summaries: &[(u32, TraceSummary)],
) -> (Vec<PlannedLayout>, Option<String>) {
    let mut out = Vec::new();
    for &(device, ref s) in summaries {
        match crate::plan::planned_layout(trace, device) {
            Ok(p) => out.push(PlannedLayout {
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

/// PyTorch's own peak reserved for the traced run, with its ratio to the trace's peak
/// requested.
#[derive(Debug, Clone, Serialize)]
pub struct RecordedRatio {
    /// The setting PyTorch ran under ([`crate::report::RecordedFigures::conf`]).
    pub conf: String,
    /// `reserved_bytes.all.peak`.
    pub reserved_bytes_peak: u64,
    /// `reserved_bytes_peak` ÷ `peak_requested` (0 when nothing was requested).
    pub reserved_over_requested: f64,
}

/// PyTorch's figures beside the trace ([`crate::report::recorded_figures`]), with their
/// ratio to the trace's `peak_requested` bytes.
pub fn recorded_figures(trace: &std::path::Path, peak_requested: u64) -> Vec<RecordedRatio> {
    crate::report::recorded_figures(trace)
        .into_iter()
        .map(|r| RecordedRatio {
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

/// Verdicts on the trace's recorded OOMs for `strategies`, on the simulated device (see
/// [`crate::recorded_oom`]); none for a trace without one.
///
/// # Errors
/// A [`SessionError::Replay`] from one of the replays.
pub fn oom_verdicts(
    trace: &Trace,
    strategies: &[Strategy],
    config: AllocatorConfig,
) -> Result<Vec<OomVerdict>, SessionError> {
    if trace.count(Action::Oom) == 0 {
        return Ok(Vec::new());
    }
    let make = |s: Strategy| -> Box<dyn Allocator> { s.build(&config) };
    let make_dev = |c: u64| SimDevice::new(c);
    Ok(crate::recorded_oom::verdicts(
        trace, strategies, &make, &make_dev,
    )?)
}
