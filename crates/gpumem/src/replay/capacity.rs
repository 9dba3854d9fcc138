//! The smallest simulated device that runs a trace, per allocator ([`min_capacity`]).
use gpumem_core::sim::SimDevice;
use gpumem_core::strategy::Strategy;
use gpumem_core::Allocator;
use serde::Serialize;

use super::{replay_prepared, ReplayConfig, ReplayError, TorchInputs, TraceSummary};
use crate::trace::{Action, Trace};

/// The smallest simulated devices that run a trace, for one allocator.
///
/// A caching allocator is not monotone in the capacity: a smaller device can force it to
/// release its cache at the right moment and complete where a larger one fails (PyTorch's
/// allocator behaves the same way). Two figures answer the two questions a user has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MinCapacity {
    /// The smallest capacity, in bytes (a multiple of the resolution), with which the trace
    /// completes without a failed allocation.
    pub smallest_bytes: u64,
    /// The smallest capacity, in bytes, from which every larger capacity up to the upper
    /// bound completes too (equal to `smallest_bytes` when the allocator behaved
    /// monotonically on this trace).
    pub all_larger_bytes: u64,
    /// Replays run to find them.
    pub replays: u64,
    /// Whether every capacity between the floor and the upper bound was covered (the figures
    /// are exact to the resolution); `false` when the replay budget ran out and the rest was
    /// bisected, which assumes monotonicity there.
    pub exact: bool,
}

/// Why a trace does not complete even with the upper bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Incomplete {
    /// The capacity tried, in bytes.
    pub upper_bytes: u64,
    /// Allocations that ran out of memory at that capacity (the search stops a replay at
    /// the first).
    pub failed_count: u64,
    /// Index of the first allocation that ran out of memory.
    pub first_failed_event: Option<u64>,
    /// The reason in words: a single request larger than the device, more live bytes than
    /// the device, or rounding and fragmentation on top of the live bytes.
    pub reason: String,
}

/// Result of [`min_capacity`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MinCapacityOutcome {
    /// The trace completes at the upper bound; the smallest capacities found.
    Found(MinCapacity),
    /// It does not, and why.
    NeverCompletes(Incomplete),
}

/// How to search: bounds, resolution, budget.
#[derive(Debug, Clone, Copy)]
pub struct MinCapacityConfig {
    /// Largest capacity tried, in bytes; it must complete for a result.
    pub upper_bytes: u64,
    /// Resolution in bytes (capacities tried are its multiples). The device granularity
    /// (2 MiB) makes the figures exact to the byte: every device request is a multiple of it.
    pub resolution_bytes: u64,
    /// Most replays for the exact scan before the rest is bisected.
    pub max_replays: u64,
}

impl Default for MinCapacityConfig {
    fn default() -> Self {
        MinCapacityConfig {
            upper_bytes: gpumem_core::sim::DEFAULT_CAPACITY,
            resolution_bytes: gpumem_core::sim::DEFAULT_GRANULARITY,
            max_replays: 256,
        }
    }
}

/// One replay at `capacity`: whether it completes, and the smallest capacity above it that
/// can behave differently (every capacity in between gets the same answers from the device,
/// so the same replay).
struct Probe {
    /// No out-of-memory (a refused request, an impossible size or alignment, fails at every
    /// capacity and is dropped, as in any replay).
    completes: bool,
    /// Peak requested bytes of the blocks served.
    peak_requested: u64,
    failed_count: u64,
    first_failed_event: Option<u64>,
    /// Bytes of the request that first ran out of memory.
    first_failed_request: Option<u64>,
    next_different: u64,
}

/// What every replay of one search shares: the trace, its summary and the emulation's inputs
/// (found at the first replay through the `torch` emulation, if any).
struct Search<'a> {
    trace: &'a Trace,
    summary: &'a TraceSummary,
    torch: std::cell::OnceCell<TorchInputs>,
}

fn probe(
    search: &Search,
    make: &dyn Fn() -> Box<dyn Allocator>,
    make_dev: &dyn Fn(u64) -> SimDevice,
    capacity: u64,
    opts: &ReplayConfig,
    request_steps: &[u64],
) -> Result<Probe, ReplayError> {
    let mut a = make();
    let mut d = make_dev(capacity);
    let torch = Strategy::of(a.as_ref())
        .is_some_and(TorchInputs::wanted_by)
        .then(|| {
            search
                .torch
                .get_or_init(|| TorchInputs::of(search.trace, opts.device))
        });
    let r = replay_prepared(
        search.trace,
        search.summary,
        torch,
        a.as_mut(),
        &mut d,
        opts,
        &mut |_| {},
    )?;
    let completes = r.oom_count == 0;
    // Requests the device granted fit in any larger capacity; those it refused are refused
    // by any capacity below the smallest refused demand. An allocator may also refuse a
    // request larger than the whole device without asking it: the next request size above
    // the capacity is a boundary too.
    let mut next = d.smallest_refused_demand_bytes().unwrap_or(u64::MAX);
    if !completes {
        let i = request_steps.partition_point(|&s| s <= capacity);
        if let Some(&s) = request_steps.get(i) {
            next = next.min(s);
        }
    }
    Ok(Probe {
        completes,
        peak_requested: r.peak_requested_bytes,
        failed_count: r.oom_count,
        first_failed_event: r.first_oom_event,
        first_failed_request: r.first_oom_request_bytes,
        next_different: next,
    })
}

fn round_up(v: u64, step: u64) -> u64 {
    v.div_ceil(step).saturating_mul(step)
}

/// Finds the smallest device capacities with which `trace` completes through the allocators
/// `make` builds, on simulated devices `make_dev` builds (one per replay), between the
/// trace's peak requested bytes and `cfg.upper_bytes`.
///
/// Requests every capacity refuses (a size that overflows, an alignment no device offers) are
/// dropped with their frees, as in any replay: they do not stop a trace from completing.
///
/// Method: a scan upward from the floor that skips, after each replay, every capacity that
/// would get the same answers from the device (those below the smallest refused demand), so
/// it visits each distinct behaviour once; replays that fail stop at the first failure.
/// When `cfg.max_replays` runs out, the rest is bisected (and `exact` is false).
///
/// # Errors
/// A [`ReplayError`] from one of the replays.
pub fn min_capacity(
    trace: &Trace,
    summary: &TraceSummary,
    make: &dyn Fn() -> Box<dyn Allocator>,
    make_dev: &dyn Fn(u64) -> SimDevice,
    cfg: &MinCapacityConfig,
    opts: &ReplayConfig,
) -> Result<MinCapacityOutcome, ReplayError> {
    let step = cfg.resolution_bytes.max(1);
    let opts = ReplayConfig {
        timeline_points: 0,
        canary: false,
        sample_fragmentation: false,
        stop_at_first_failure: true,
        ..*opts
    };
    // Request sizes rounded to the resolution, ascending: boundaries where an allocator
    // that checks a request against the capacity itself changes its answer.
    let mut request_steps: Vec<u64> = trace
        .events
        .iter()
        .filter(|e| e.device == opts.device && e.action == Action::Alloc)
        .map(|e| round_up(e.size_bytes.max(1), step))
        .collect();
    request_steps.sort_unstable();
    request_steps.dedup();
    let upper = round_up(cfg.upper_bytes.max(1), step);
    let search = Search {
        trace,
        summary,
        torch: std::cell::OnceCell::new(),
    };
    let mut replays = 1u64;
    let top = probe(&search, make, make_dev, upper, &opts, &request_steps)?;
    if !top.completes {
        let reason = if let Some(req) = top.first_failed_request.filter(|&r| r > upper) {
            format!("a single request of {req} B is larger than the device")
        } else if summary.peak_requested_bytes > upper {
            format!(
                "the trace holds {} B live at its peak, more than the device",
                summary.peak_requested_bytes
            )
        } else {
            format!(
                "the live bytes ({} B at the peak) fit, but not with the allocator's rounding and fragmentation",
                summary.peak_requested_bytes
            )
        };
        return Ok(MinCapacityOutcome::NeverCompletes(Incomplete {
            upper_bytes: upper,
            failed_count: top.failed_count,
            first_failed_event: top.first_failed_event,
            reason,
        }));
    }
    // Exact scan from the floor (no capacity below the peak requested bytes can complete;
    // those of the blocks served at the upper bound, without the refused ones).
    let floor = top.peak_requested.min(summary.peak_requested_bytes);
    let mut c = round_up(floor.max(1), step).min(upper);
    let mut smallest: Option<u64> = None;
    let mut last_failing: Option<u64> = None;
    while c < upper && replays < cfg.max_replays {
        let p = probe(&search, make, make_dev, c, &opts, &request_steps)?;
        replays += 1;
        let next = round_up(p.next_different, step).max(c + step).min(upper);
        if p.completes {
            smallest.get_or_insert(c);
        } else {
            last_failing = Some(next - step);
        }
        c = next;
    }
    let exact = c >= upper;
    if !exact {
        // Out of budget at `c`: bisect the rest, assuming monotonicity above `c`.
        let mut lo = c.saturating_sub(step); // treated as failing
        let mut hi = upper; // completes
        let mut saw_failure = false;
        while hi - lo > step {
            let mid = round_up(lo + (hi - lo) / 2, step);
            if mid >= hi {
                break;
            }
            let p = probe(&search, make, make_dev, mid, &opts, &request_steps)?;
            replays += 1;
            if p.completes {
                hi = mid;
            } else {
                lo = mid;
                saw_failure = true;
            }
        }
        if smallest.is_none() {
            smallest = Some(hi);
        }
        if saw_failure {
            last_failing = Some(last_failing.map_or(lo, |f| f.max(lo)));
        }
    }
    let smallest_bytes = smallest.unwrap_or(upper);
    let all_larger_bytes = match last_failing {
        Some(f) if f >= smallest_bytes => f + step,
        _ => smallest_bytes,
    };
    Ok(MinCapacityOutcome::Found(MinCapacity {
        smallest_bytes,
        all_larger_bytes,
        replays,
        exact,
    }))
}
