//! Which `PYTORCH_CUDA_ALLOC_CONF` should a run use? Replays a trace through the PyTorch
//! caching-allocator emulation under a grid of settings, in parallel, and ranks them by the
//! smallest device that runs the trace without an out-of-memory error.
//!
//! The grid: native; `expandable_segments:True`; `max_split_size_mb` ∈ {64, 128, 256, 512,
//! 1024}; `roundup_power2_divisions` ∈ {1, 2, 4, 8, 16}; with a capacity,
//! `garbage_collection_threshold` ∈ {0.6, 0.8}; and combinations that users try together
//! (expandable segments with rounding, `max_split_size_mb` with rounding or garbage
//! collection). Each setting is replayed once at the given capacity (or the default
//! simulated device) and bisected for its smallest capacity; settings run on every core,
//! one setting per thread at a time.
//!
//! Beside them, gpumem's own settings for the PyTorch plug-in ([`PLUGIN_SETTINGS`], the
//! `GPUMEM_CONF` values), replayed the same way, with their driver calls in the second half of
//! the trace and their modelled driver time: the trade between memory and driver calls that
//! `paged-lazy`'s settings make (the least memory, `strategy=paged`, costs a driver call on
//! almost every allocation).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use gpumem_core::config::{AllocatorConfig, TorchConfig};
use gpumem_core::sim::{SimDevice, DEFAULT_CAPACITY};
use gpumem_core::strategy::Strategy;
use gpumem_core::Allocator;
use serde::Serialize;

use crate::replay::{
    self, MinCapacity, MinCapacityConfig, MinCapacityOutcome, ReplayConfig, ReplayError,
    ReplayReport,
};
use crate::torch_replay;
use crate::trace::Trace;

/// Resolution of the smallest capacity, in bytes (the 2 MiB of a page).
pub const RESOLUTION_BYTES: u64 = 2 << 20;
/// Replays per setting that scan for its exact smallest capacity before the rest is bisected.
pub const MAX_REPLAYS: u64 = 24;

/// The settings tried: see the module documentation. With `with_gc`, the garbage-collection
/// thresholds too (they act only under a memory limit).
pub fn grid(with_gc: bool) -> Vec<TorchConfig> {
    let mut s: Vec<String> = vec![String::new(), "expandable_segments:True".into()];
    for mb in [64, 128, 256, 512, 1024] {
        s.push(format!("max_split_size_mb:{mb}"));
    }
    for d in [1, 2, 4, 8, 16] {
        s.push(format!("roundup_power2_divisions:{d}"));
    }
    for d in [2, 4, 8] {
        s.push(format!(
            "expandable_segments:True,roundup_power2_divisions:{d}"
        ));
    }
    for mb in [128, 512] {
        s.push(format!("max_split_size_mb:{mb},roundup_power2_divisions:4"));
    }
    if with_gc {
        for g in ["0.6", "0.8"] {
            s.push(format!("garbage_collection_threshold:{g}"));
            s.push(format!(
                "garbage_collection_threshold:{g},max_split_size_mb:512"
            ));
        }
    }
    s.iter()
        .filter_map(|c| TorchConfig::parse(c).ok())
        .collect()
}

/// One setting's figures.
#[derive(Debug, Clone, Serialize)]
pub struct TuneRow {
    /// The setting (`native` for the defaults).
    pub setting: String,
    /// The `PYTORCH_CUDA_ALLOC_CONF` value (empty for native).
    pub conf: String,
    /// Whether this is the trace's own setting.
    pub is_trace_setting: bool,
    /// The replay's figures.
    #[serde(flatten)]
    pub figures: Figures,
}

/// The figures of one setting's replay and capacity search, shared by [`TuneRow`] and
/// [`PluginRow`] (their fields in `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// Predicted peak reserved bytes (at the capacity given, else on the default device).
    pub peak_reserved_bytes: u64,
    /// `peak_reserved_bytes` ÷ the trace's peak requested bytes.
    pub reserved_over_requested: f64,
    /// Smallest device capacity from which every larger one runs the trace without an OOM,
    /// to [`RESOLUTION_BYTES`] (the figure to size a GPU or a memory limit by); `None` if
    /// even the default device does not.
    pub min_capacity_bytes: Option<u64>,
    /// Smallest device capacity that runs the trace without an OOM. Below
    /// `min_capacity_bytes` when the setting is not monotone in the capacity (a smaller
    /// device forced the cache to be released at the right moment): some capacities between
    /// the two fail.
    pub smallest_completing_bytes: Option<u64>,
    /// Allocations that failed at the capacity given (0 without one).
    pub oom_count: u64,
    /// Allocations refused as impossible (a size that overflows with its padding, an
    /// alignment the allocator does not support) and dropped with their frees, as
    /// [`replay::replay`] does ([`ReplayReport::refused_count`]).
    pub refused_count: u64,
    /// The first refusal (`event index N: ...`), when there was one.
    pub first_refusal: Option<String>,
    /// Driver calls of the replay (cudaMalloc/cudaFree, or the VMM calls of expandable
    /// segments and gpumem's strategies). Where `oom_count` > 0, those of a failed run (its
    /// failed allocations and their frees dropped): not comparable with a completing run's.
    pub driver_calls_total: u64,
    /// Modelled H200 seconds of those calls (a failed run's where `oom_count` > 0).
    pub modelled_driver_seconds: f64,
}

impl Figures {
    /// The figures of replay `rep` and of the capacity search's result `min`.
    fn new(rep: &ReplayReport, min: Option<&MinCapacity>) -> Self {
        Figures {
            peak_reserved_bytes: rep.peak_reserved_bytes,
            reserved_over_requested: rep.reserved_over_requested,
            min_capacity_bytes: min.map(|m| m.all_larger_bytes),
            smallest_completing_bytes: min.map(|m| m.smallest_bytes),
            oom_count: rep.oom_count,
            refused_count: rep.refused_count,
            first_refusal: rep.first_refusal.clone(),
            driver_calls_total: rep.driver_calls.total(),
            modelled_driver_seconds: rep.modelled_driver_seconds,
        }
    }

    /// `(smallest, every larger)` completing capacities where they differ: the setting is not
    /// monotone in the capacity.
    pub fn not_monotone(&self) -> Option<(u64, u64)> {
        match (self.smallest_completing_bytes, self.min_capacity_bytes) {
            (Some(s), Some(b)) if s < b => Some((s, b)),
            _ => None,
        }
    }
}

/// The upper bound of a setting's capacity search after replay `rep` at `capacity_bytes`:
/// the run on an unlimited device (no capacity given, no OOM) bounds it by its peak.
fn search_upper(capacity_bytes: Option<u64>, rep: &ReplayReport) -> u64 {
    if capacity_bytes.is_none() && rep.oom_count == 0 {
        rep.peak_reserved_bytes.max(RESOLUTION_BYTES)
    } else {
        DEFAULT_CAPACITY
    }
}

/// Sorts `rows` best first, as [`TuneReport::rows`] documents: fewest OOMs at the capacity
/// given, then smallest capacity, then lowest peak reserved, then, among those with no OOM,
/// fewest driver calls. A replay with an OOM dropped allocations and their frees: its driver
/// calls are a failed run's and rank nothing (the sort is stable: such rows keep their order).
pub fn rank(rows: &mut [TuneRow]) {
    rows.sort_by(|a, b| {
        let (a, b) = (&a.figures, &b.figures);
        (
            a.oom_count,
            a.min_capacity_bytes.unwrap_or(u64::MAX),
            a.peak_reserved_bytes,
        )
            .cmp(&(
                b.oom_count,
                b.min_capacity_bytes.unwrap_or(u64::MAX),
                b.peak_reserved_bytes,
            ))
            .then(if a.oom_count == 0 {
                a.driver_calls_total.cmp(&b.driver_calls_total)
            } else {
                std::cmp::Ordering::Equal
            })
    });
}

/// gpumem's settings that [`tune`] replays beside PyTorch's, as `GPUMEM_CONF` values: the
/// plug-in's default (`paged-lazy`, PyTorch's expandable-segments placement with one handle per
/// growth), `grow_ahead=0.0156` (fewer driver calls for a slightly higher peak),
/// `placement=pages` (gpumem's page placement) and `strategy=paged` (pages unmapped as soon as
/// no block touches them: the least memory, a driver call on almost every allocation).
pub const PLUGIN_SETTINGS: [&str; 4] =
    ["", "grow_ahead=0.0156", "placement=pages", "strategy=paged"];

/// One of gpumem's settings ([`PLUGIN_SETTINGS`]) replayed on the trace, as `gpumem replay
/// --allocator paged-lazy --lazy-conf …` (or `--allocator paged`) replays it.
#[derive(Debug, Clone, Serialize)]
pub struct PluginRow {
    /// The `GPUMEM_CONF` value (empty for the plug-in's defaults).
    pub gpumem_conf: String,
    /// The strategy: `paged-lazy` or `paged`.
    pub strategy: Strategy,
    /// The replay's figures.
    #[serde(flatten)]
    pub figures: Figures,
    /// Driver calls in the second half of the trace's events (the steady state).
    pub steady_state_driver_calls: u64,
}

/// The ranked result.
#[derive(Debug, Clone, Serialize)]
pub struct TuneReport {
    /// The trace's own setting (`native` when the trace records none).
    pub trace_setting: String,
    /// Highest sum of live requested bytes in the trace.
    pub peak_requested_bytes: u64,
    /// The capacity given, if any.
    pub capacity_bytes: Option<u64>,
    /// Every setting, best first: fewest OOMs at the capacity given, then smallest capacity,
    /// then lowest peak reserved, then, among those with no OOM, fewest driver calls.
    pub rows: Vec<TuneRow>,
    /// Smallest capacity for gpumem's own `paged` allocator (the `strategy=paged` row of
    /// `plugin_rows`).
    pub paged_min_capacity_bytes: Option<u64>,
    /// gpumem's settings for the PyTorch plug-in, in the order of [`PLUGIN_SETTINGS`].
    pub plugin_rows: Vec<PluginRow>,
    /// Wall-clock seconds the whole tuning took.
    pub seconds: f64,
    /// Threads used (at most one per setting replayed).
    pub threads: usize,
}

impl TuneReport {
    /// The best setting.
    pub fn best(&self) -> Option<&TuneRow> {
        self.rows.first()
    }

    /// The trace's own setting's row.
    pub fn trace_row(&self) -> Option<&TuneRow> {
        self.rows.iter().find(|r| r.is_trace_setting)
    }
}

/// What one job of [`tune`] gives.
enum Out {
    Torch(TuneRow),
    Plugin(PluginRow),
}

/// The allocator of `GPUMEM_CONF` value `conf` (one of [`PLUGIN_SETTINGS`]): its strategy
/// and a maker.
fn plugin_allocator(conf: &str) -> (Strategy, impl Fn() -> Box<dyn Allocator>) {
    let strategy = if conf == "strategy=paged" {
        Strategy::Paged
    } else {
        Strategy::PagedLazy
    };
    let mut config = AllocatorConfig::default();
    if strategy == Strategy::PagedLazy {
        // The settings are constants that `lazy_conf::parse` accepts (a test says so).
        config.lazy = crate::lazy_conf::parse(conf).unwrap_or_default();
    }
    (strategy, move || strategy.build(&config))
}

/// Replays `trace` under gpumem's setting `conf` at `capacity_bytes` (else the default
/// device), then bisects its smallest capacity.
fn plugin_row(
    trace: &Trace,
    summary: &replay::TraceSummary,
    conf: &str,
    capacity_bytes: Option<u64>,
    opts: &ReplayConfig,
) -> Result<PluginRow, ReplayError> {
    let (strategy, make) = plugin_allocator(conf);
    let mut alloc = make();
    let mut dev = SimDevice::new(capacity_bytes.unwrap_or(DEFAULT_CAPACITY));
    let rep =
        replay::replay_summarized(trace, summary, alloc.as_mut(), &mut dev, opts, &mut |_| {})?;
    let search = MinCapacityConfig {
        upper_bytes: search_upper(capacity_bytes, &rep),
        max_replays: MAX_REPLAYS,
        ..MinCapacityConfig::default()
    };
    let outcome = replay::min_capacity(trace, summary, &make, &SimDevice::new, &search, opts)?;
    let min = match &outcome {
        MinCapacityOutcome::Found(m) => Some(m),
        MinCapacityOutcome::NeverCompletes(_) => None,
    };
    Ok(PluginRow {
        gpumem_conf: conf.to_string(),
        strategy,
        figures: Figures::new(&rep, min),
        steady_state_driver_calls: rep.steady_state_driver_calls,
    })
}

/// A unit of work for [`parallel`].
type Job<'a, T> = Box<dyn FnOnce() -> T + Send + 'a>;

/// Runs `jobs` closures on `threads` threads, results in job order; `done(0, n)` before the
/// first of the n jobs starts, and `done(k, n)` after the k-th finished.
fn parallel<T: Send>(
    threads: usize,
    jobs: Vec<Job<'_, T>>,
    done: &(dyn Fn(usize, usize) + Sync),
) -> Vec<T> {
    let n = jobs.len();
    let queue: Mutex<Vec<Option<Job<'_, T>>>> = Mutex::new(jobs.into_iter().map(Some).collect());
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    done(0, n);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, n.max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let job = queue.lock().ok().and_then(|mut q| q[i].take());
                if let Some(job) = job {
                    let r = job();
                    if let Ok(mut out) = results.lock() {
                        out[i] = Some(r);
                    }
                    done(finished.fetch_add(1, Ordering::Relaxed) + 1, n);
                }
            });
        }
    });
    results
        .into_inner()
        .map(|v| v.into_iter().flatten().collect())
        .unwrap_or_default()
}

/// Tunes `trace` (events of `device`): the grid plus `trace_conf` (the trace's own setting,
/// native when `None`), at `capacity_bytes` if given, on `threads` threads (0 = every core).
///
/// # Errors
/// A [`ReplayError`] from one of the replays (an emulation bug).
pub fn tune(
    trace: &Trace,
    trace_conf: Option<TorchConfig>,
    capacity_bytes: Option<u64>,
    device: u32,
    threads: usize,
) -> Result<TuneReport, ReplayError> {
    tune_with_progress(
        trace,
        trace_conf,
        capacity_bytes,
        device,
        threads,
        &|_, _| {},
    )
}

/// [`tune`], calling `done(0, n)` before its n settings are replayed and `done(k, n)` each
/// time the k-th is finished (from the thread that replayed it), for a progress bar.
///
/// # Errors
/// A [`ReplayError`] from one of the replays (an emulation bug).
pub fn tune_with_progress(
    trace: &Trace,
    trace_conf: Option<TorchConfig>,
    capacity_bytes: Option<u64>,
    device: u32,
    threads: usize,
    done: &(dyn Fn(usize, usize) + Sync),
) -> Result<TuneReport, ReplayError> {
    let started = Instant::now();
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    let own = trace_conf.unwrap_or_default();
    let mut confs = grid(capacity_bytes.is_some());
    if !confs.contains(&own) {
        confs.push(own);
    }
    let summary = &replay::summarize(trace, device);
    let opts = ReplayConfig {
        device,
        ..ReplayConfig::default()
    };
    let capacity = capacity_bytes.unwrap_or(DEFAULT_CAPACITY);
    let mut jobs: Vec<Job<'_, Result<Out, ReplayError>>> = Vec::new();
    for conf in confs {
        let opts = &opts;
        jobs.push(Box::new(move || {
            let run_conf = TorchConfig {
                // The memory limit makes the collector act (it changes nothing else but
                // expandable segments' accounting, so it is set only where it matters).
                limit_to_capacity: capacity_bytes.is_some()
                    && conf.garbage_collection_threshold > 0.0,
                ..conf
            };
            let follow = conf == own && capacity_bytes.is_none();
            let r =
                torch_replay::replay_torch(trace, &run_conf, capacity, follow, opts, &mut |_| {})?;
            let upper = search_upper(capacity_bytes, &r.report);
            let min_cap =
                torch_replay::min_capacity(trace, summary, &conf, upper, MAX_REPLAYS, opts)?;
            Ok(Out::Torch(TuneRow {
                setting: conf.to_string(),
                conf: conf.to_conf_string(),
                is_trace_setting: conf == own,
                figures: Figures::new(&r.report, min_cap.as_ref()),
            }))
        }));
    }
    // gpumem's own settings for the plug-in.
    for conf in PLUGIN_SETTINGS {
        let opts = &opts;
        jobs.push(Box::new(move || {
            plugin_row(trace, summary, conf, capacity_bytes, opts).map(Out::Plugin)
        }));
    }
    let mut rows: Vec<TuneRow> = Vec::new();
    let mut plugin_rows: Vec<PluginRow> = Vec::new();
    // No more threads than jobs run (and are reported).
    let threads = threads.clamp(1, jobs.len().max(1));
    for r in parallel(threads, jobs, done) {
        match r? {
            Out::Torch(row) => rows.push(row),
            Out::Plugin(row) => plugin_rows.push(row),
        }
    }
    let paged = plugin_rows
        .iter()
        .find(|r| r.strategy == Strategy::Paged)
        .and_then(|r| r.figures.min_capacity_bytes);
    rank(&mut rows);
    Ok(TuneReport {
        trace_setting: own.to_string(),
        peak_requested_bytes: summary.peak_requested_bytes,
        capacity_bytes,
        rows,
        paged_min_capacity_bytes: paged,
        plugin_rows,
        seconds: started.elapsed().as_secs_f64(),
        threads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_plugin_setting_is_a_valid_gpumem_conf() {
        for conf in PLUGIN_SETTINGS {
            let (strategy, _) = plugin_allocator(conf);
            if conf == "strategy=paged" {
                assert_eq!(strategy, Strategy::Paged);
            } else {
                assert_eq!(strategy, Strategy::PagedLazy);
                // plugin_allocator falls back to the defaults on a bad value: none is.
                assert!(crate::lazy_conf::parse(conf).is_ok(), "{conf}");
            }
        }
        let grow = crate::lazy_conf::parse(PLUGIN_SETTINGS[1]).unwrap();
        assert_eq!(grow.grow_ahead_bp, 156);
        let pages = crate::lazy_conf::parse(PLUGIN_SETTINGS[2]).unwrap();
        assert_eq!(pages.placement, gpumem_core::config::LazyPlacement::Pages);
    }

    #[test]
    fn failed_replays_are_not_ranked_by_their_driver_calls() {
        let row = |setting: &str, oom_count: u64, calls: u64| TuneRow {
            setting: setting.into(),
            conf: setting.into(),
            is_trace_setting: false,
            figures: Figures {
                peak_reserved_bytes: 8 << 30,
                reserved_over_requested: 1.0,
                min_capacity_bytes: Some(9 << 30),
                smallest_completing_bytes: Some(9 << 30),
                oom_count,
                refused_count: 0,
                first_refusal: None,
                driver_calls_total: calls,
                modelled_driver_seconds: calls as f64 * 1e-3,
            },
        };
        let mut rows = vec![
            row("fail-many", 1, 900),
            row("fail-few", 1, 10),
            row("run-many", 0, 500),
            row("run-few", 0, 50),
        ];
        rank(&mut rows);
        let order: Vec<&str> = rows.iter().map(|r| r.setting.as_str()).collect();
        // The completing rows by their calls; the failed ones in their grid order.
        assert_eq!(order, ["run-few", "run-many", "fail-many", "fail-few"]);
    }

    #[test]
    fn progress_counts_every_setting_once() {
        use crate::trace::{Action, Event};
        let mut trace = Trace::default();
        trace.events.push(Event::new(Action::Alloc, 1, 3 << 20));
        trace.events.push(Event::new(Action::Free, 1, 0));
        let seen = Mutex::new(Vec::new());
        let r = tune_with_progress(&trace, None, None, 0, 2, &|k, n| {
            seen.lock().unwrap().push((k, n));
        })
        .unwrap();
        let n = r.rows.len() + r.plugin_rows.len();
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        assert_eq!(seen, (0..=n).map(|k| (k, n)).collect::<Vec<_>>());
    }
}
