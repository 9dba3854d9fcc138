//! The replay loop: [`replay`], [`replay_summarized`] and [`replay_prepared`].
use std::time::Instant;

use gpumem_core::addr_table::AddrTable;
use gpumem_core::strategy::Strategy;
use gpumem_core::{AllocError, Allocator, Device, DriverCounters, Stats};
use rustc_hash::FxHashSet;

use super::{
    adopt_preexisting, summarize, MinMax, PreexistingSegment, ReplayConfig, ReplayError,
    ReplayReport, Sample, TorchInputs, TraceSummary,
};
use crate::measure::thread_cpu_seconds;
use crate::trace::{Action, Trace};

pub(super) fn canary_pattern(trace_addr: u64) -> u32 {
    // A pattern that differs between neighbouring blocks (splitmix-style mix).
    let mut z = trace_addr.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32 | 1
}

/// The [`ReplayError::Allocator`] of the allocator `name` at event `event`, for `map_err`.
fn allocator_error(event: u64, name: &str) -> impl FnOnce(AllocError) -> ReplayError + '_ {
    move |source| ReplayError::Allocator {
        event,
        allocator: name.to_string(),
        source,
    }
}

/// Failed-allocation indices kept for the timeline's marks.
const FAILED_EVENTS_KEPT: usize = 10_000;

#[derive(Debug, Clone, Copy, Default)]
struct Live {
    addr: u64,
    bytes: u64,
}

struct State<'a> {
    /// Trace address → the block serving it (an insert and a removal every allocate/free
    /// pair: a table without tombstones, see [`AddrTable`]).
    live: AddrTable<Live>,
    opts: &'a ReplayConfig,
    name: String,
}

impl State<'_> {
    /// Allocates; returns whether the allocation was served. Inlined in the replay loop
    /// (one call an allocation fewer, its eight arguments passed in registers); a failed
    /// allocation is handled out of line ([`State::failed`]).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn alloc(
        &mut self,
        alloc: &mut dyn Allocator,
        dev: &mut dyn Device,
        report: &mut ReplayReport,
        index: u64,
        trace_addr: u64,
        size: u64,
        align: u64,
        stream: u64,
    ) -> Result<bool, ReplayError> {
        match alloc.allocate(dev, size, align, stream) {
            Ok(b) => {
                if self.opts.canary && size >= 4 {
                    dev.fill_pattern(b.addr, size & !3, canary_pattern(trace_addr))
                        .map_err(|source| ReplayError::Canary {
                            event: index,
                            source,
                        })?;
                }
                self.live.insert(
                    trace_addr,
                    Live {
                        addr: b.addr,
                        bytes: size,
                    },
                );
                Ok(true)
            }
            Err(e) => self.failed(report, e, index, size),
        }
    }

    /// [`State::alloc`] when the allocation failed: an out-of-memory or a refused request
    /// is counted (`Ok(false)`), any other error ends the replay.
    #[cold]
    #[inline(never)]
    fn failed(
        &self,
        report: &mut ReplayReport,
        e: AllocError,
        index: u64,
        size: u64,
    ) -> Result<bool, ReplayError> {
        match e {
            e if e.is_oom() => {
                report.oom_count += 1;
                report.first_oom_event.get_or_insert(index);
                report.first_oom_request_bytes.get_or_insert(size);
                if report.failed_events.len() < FAILED_EVENTS_KEPT {
                    report.failed_events.push(index);
                }
                Ok(false)
            }
            e @ (AllocError::InvalidAlignment { .. } | AllocError::Overflow { .. }) => {
                report.refused_count += 1;
                report
                    .first_refusal
                    .get_or_insert_with(|| format!("event index {index}: {e}"));
                if report.failed_events.len() < FAILED_EVENTS_KEPT {
                    report.failed_events.push(index);
                }
                Ok(false)
            }
            source => Err(ReplayError::Allocator {
                event: index,
                allocator: self.name.clone(),
                source,
            }),
        }
    }
}

/// Replays `trace` through `alloc` on `dev`.
///
/// `progress` is called now and then with the number of events done so far.
///
/// # Errors
/// [`ReplayError`] when the allocator fails for a reason other than out-of-memory or an
/// impossible request (a bug, or a device error), or a canary check cannot run.
pub fn replay(
    trace: &Trace,
    alloc: &mut dyn Allocator,
    dev: &mut dyn Device,
    opts: &ReplayConfig,
    progress: &mut dyn FnMut(u64),
) -> Result<ReplayReport, ReplayError> {
    let summary = summarize(trace, opts.device);
    replay_summarized(trace, &summary, alloc, dev, opts, progress)
}

/// [`replay`] with the trace's summary for `opts.device` computed beforehand (by
/// [`summarize`]), for callers that replay the same trace many times.
///
/// # Errors
/// As [`replay`].
pub fn replay_summarized(
    trace: &Trace,
    summary: &TraceSummary,
    alloc: &mut dyn Allocator,
    dev: &mut dyn Device,
    opts: &ReplayConfig,
    progress: &mut dyn FnMut(u64),
) -> Result<ReplayReport, ReplayError> {
    replay_prepared(trace, summary, None, alloc, dev, opts, progress)
}

/// Where `alloc`'s reserved peak has risen above `seen` (read in O(1)): records it, and the
/// external fragmentation now as `frag@pk` ([`ReplayReport::external_fragmentation_at_peak`]),
/// which also counts towards the highest seen. The full statistics are taken only then.
#[inline(always)]
fn note_reserved_peak(alloc: &dyn Allocator, seen: &mut u64, report: &mut ReplayReport) {
    let peak = alloc.reserved_bytes().peak;
    if peak > *seen {
        *seen = peak;
        let f = alloc.stats().external_fragmentation();
        report.external_fragmentation_at_peak = f;
        report.peak_external_fragmentation = report.peak_external_fragmentation.max(f);
    }
}

/// The report before the first event: every figure 0 or empty.
fn empty_report(name: String) -> ReplayReport {
    ReplayReport {
        name,
        peak_reserved_bytes: 0,
        peak_allocated_bytes: 0,
        peak_requested_bytes: 0,
        reserved_over_requested: 0.0,
        peak_external_fragmentation: 0.0,
        external_fragmentation_at_peak: 0.0,
        internal_fragmentation_at_peak: 0.0,
        peak_inactive_split_bytes: 0,
        alloc_retries: 0,
        oom_count: 0,
        first_oom_event: None,
        first_oom_request_bytes: None,
        refused_count: 0,
        first_refusal: None,
        failed_events: Vec::new(),
        driver_calls: DriverCounters::default(),
        modelled_driver_seconds: 0.0,
        steady_state_driver_calls: 0,
        driver_share_of_trace: None,
        device_peak_used_bytes: 0,
        driver_peak_delta_bytes: None,
        events_per_second: 0.0,
        events_replayed: 0,
        seconds: 0.0,
        cpu_seconds: 0.0,
        canary_errors: 0,
        final_stats: Stats::default(),
        timeline: Vec::new(),
    }
}

/// Starts the replay from what the recorded run held before its trace: the segments in
/// `foreign` that `alloc` takes in (the `torch` emulation), with their blocks, then every
/// other block live before recording, allocated like any other.
fn take_in_preexisting(
    st: &mut State<'_>,
    alloc: &mut dyn Allocator,
    dev: &mut dyn Device,
    report: &mut ReplayReport,
    trace: &Trace,
    foreign: &[PreexistingSegment],
) -> Result<(), ReplayError> {
    // The segments the recorded run already held, for an allocator that keeps PyTorch's
    // (the `torch` emulation); the blocks live in them are taken in with them.
    // Those not taken in have their blocks allocated below like any other.
    let mut adopted: FxHashSet<u64> = FxHashSet::default();
    let taken = adopt_preexisting(alloc, dev, foreign).map_err(allocator_error(0, &st.name))?;
    for (k, blocks) in taken {
        for (&trace_addr, b) in foreign[k].block_addrs.iter().zip(&blocks) {
            if st.opts.canary && b.requested_bytes >= 4 {
                dev.fill_pattern(b.addr, b.requested_bytes & !3, canary_pattern(trace_addr))
                    .map_err(|source| ReplayError::Canary { event: 0, source })?;
            }
            st.live.insert(
                trace_addr,
                Live {
                    addr: b.addr,
                    bytes: b.requested_bytes,
                },
            );
            adopted.insert(trace_addr);
        }
    }
    for p in trace
        .preexisting
        .iter()
        .filter(|p| p.device == st.opts.device && !adopted.contains(&p.addr))
    {
        st.alloc(
            alloc,
            dev,
            report,
            0,
            p.addr,
            p.size_bytes,
            st.opts.default_align,
            0,
        )?;
    }
    Ok(())
}

/// The peaks and fragmentation read from the allocator's statistics `s` after the last
/// event (`sample_fragmentation`: also the highest external fragmentation and inactive split).
fn record_peaks(report: &mut ReplayReport, s: &Stats, sample_fragmentation: bool) {
    report.peak_reserved_bytes = s.reserved_bytes.peak;
    report.peak_allocated_bytes = s.allocated_bytes.peak;
    report.peak_requested_bytes = s.requested_bytes.peak;
    report.reserved_over_requested = if s.requested_bytes.peak == 0 {
        0.0
    } else {
        s.reserved_bytes.peak as f64 / s.requested_bytes.peak as f64
    };
    report.internal_fragmentation_at_peak = if s.allocated_bytes.peak == 0 {
        0.0
    } else {
        // Requested at the allocated peak is not tracked separately; use the peaks' ratio.
        s.allocated_bytes
            .peak
            .saturating_sub(s.requested_bytes.peak) as f64
            / s.allocated_bytes.peak as f64
    };
    if sample_fragmentation {
        record_fragmentation(report, s);
    }
}

/// Raises the report's highest external fragmentation and inactive split bytes to those of
/// the allocator's statistics `s`.
fn record_fragmentation(report: &mut ReplayReport, s: &Stats) {
    report.peak_external_fragmentation = report
        .peak_external_fragmentation
        .max(s.external_fragmentation());
    report.peak_inactive_split_bytes = report
        .peak_inactive_split_bytes
        .max(s.inactive_split_bytes.peak);
}

/// [`replay_summarized`] with the emulation's inputs found beforehand: `torch` must be
/// [`TorchInputs::of`] the same trace and `opts.device`. It is read only when `alloc` is the
/// `torch` emulation; `None` finds them here when it is.
///
/// It is long on purpose: the event loop is the replay's hot path, kept in one function so
/// that its per-event state (the live table, the counters, the reserved-peak and sampling
/// countdowns) stays in locals across the match on the event's action. What runs once
/// before and after it is in `empty_report`, `take_in_preexisting` and `record_peaks`.
///
/// # Errors
/// As [`replay`].
pub fn replay_prepared(
    trace: &Trace,
    summary: &TraceSummary,
    torch: Option<&TorchInputs>,
    alloc: &mut dyn Allocator,
    dev: &mut dyn Device,
    opts: &ReplayConfig,
    progress: &mut dyn FnMut(u64),
) -> Result<ReplayReport, ReplayError> {
    let name = alloc.name().to_string();
    let total = summary.events.max(1);
    let frag_every = if opts.sample_fragmentation {
        (total / 1000).max(16)
    } else {
        u64::MAX
    };
    let timeline_every = total
        .checked_div(opts.timeline_points)
        .map_or(u64::MAX, |v| v.max(1));
    let want_timeline = opts.timeline_points > 0;
    let mut frag_left = frag_every;
    let mut st = State {
        live: AddrTable::default(),
        opts,
        name: name.clone(),
    };
    let mut report = empty_report(name.clone());
    // What only the torch emulation uses, found before the clock starts (unless the caller
    // did): the segments the recorded run already held, and where it emptied its cache.
    let found;
    let (foreign, releases): (&[PreexistingSegment], Option<&FxHashSet<u64>>) = match (
        Strategy::of(&*alloc).is_some_and(TorchInputs::wanted_by),
        torch,
    ) {
        (false, _) => (&[], None),
        (true, Some(t)) => (&t.segments, Some(&t.releases)),
        (true, None) => {
            found = TorchInputs::of(trace, opts.device);
            (&found.segments, Some(&found.releases))
        }
    };
    let releases = releases.filter(|r| !r.is_empty());
    let calls_before = dev.counters();
    let driver_baseline = dev.driver_used_bytes();
    let mut driver_peak = driver_baseline;
    let mut used_high = dev.used_bytes();
    let started = Instant::now();
    let cpu_started = thread_cpu_seconds();

    take_in_preexisting(&mut st, alloc, dev, &mut report, trace, foreign)?;

    let mut index: u64 = 0;
    // The reserved peak so far; what the pre-existing blocks took counts as the state before
    // the first event.
    let mut peak_reserved_seen = 0u64;
    if opts.sample_fragmentation {
        note_reserved_peak(alloc, &mut peak_reserved_seen, &mut report);
    }
    let mut bucket: Option<Sample> = None;
    let half = summary.events / 2;
    let mut calls_at_half = (half == 0).then(|| dev.counters().total());
    for e in trace.events.iter().filter(|e| e.device == opts.device) {
        if releases.is_some_and(|r| r.contains(&index)) {
            alloc
                .empty_cache(dev)
                .map_err(allocator_error(index, &name))?;
        }
        match e.action {
            Action::Alloc => {
                // A duplicate live address can only come from a lenient read: free the old one.
                if let Some(old) = st.live.remove(&e.addr) {
                    alloc
                        .deallocate(dev, old.addr)
                        .map_err(allocator_error(index, &name))?;
                }
                let align = e.align.unwrap_or(opts.default_align);
                let served = st.alloc(
                    alloc,
                    dev,
                    &mut report,
                    index,
                    e.addr,
                    e.size_bytes,
                    align,
                    e.stream,
                )?;
                // Only an allocation takes memory from the device: the reserved peak after
                // each (O(1)), the full statistics only where it rose, so that frag@pk is the
                // external fragmentation right after the event that set the final peak.
                if opts.sample_fragmentation {
                    note_reserved_peak(alloc, &mut peak_reserved_seen, &mut report);
                }
                // Stop at an out-of-memory (the first, or the replay would have stopped), not
                // at a refused request.
                if !served && opts.stop_at_first_failure && report.oom_count > 0 {
                    index += 1;
                    break;
                }
            }
            Action::Free => {
                if let Some(l) = st.live.remove(&e.addr) {
                    if opts.canary && l.bytes >= 4 {
                        let ok = dev
                            .check_pattern(l.addr, l.bytes & !3, canary_pattern(e.addr))
                            .map_err(|source| ReplayError::Canary {
                                event: index,
                                source,
                            })?;
                        if !ok {
                            report.canary_errors += 1;
                        }
                    }
                    alloc
                        .deallocate(dev, l.addr)
                        .map_err(allocator_error(index, &name))?;
                }
                // A free of a block dropped by a failed allocation (or of an unknown address
                // in a lenient read) has nothing to return.
            }
            Action::FreeRequested => {
                // The block waits for other streams before the `Free` returns it: only the
                // statistics change (the torch emulation's `allocated_bytes`).
                if let Some(l) = st.live.get(&e.addr) {
                    alloc
                        .free_requested(dev, l.addr)
                        .map_err(allocator_error(index, &name))?;
                }
            }
            _ => {}
        }
        if want_timeline {
            // Every event, so that no peak falls between two samples.
            let s = alloc.stats();
            let (rq, al, rs) = (
                s.requested_bytes.current,
                s.allocated_bytes.current,
                s.reserved_bytes.current,
            );
            let b = bucket.get_or_insert(Sample {
                first_event: index,
                event: index,
                requested_bytes: MinMax::new(rq),
                allocated_bytes: MinMax::new(al),
                reserved_bytes: MinMax::new(rs),
            });
            b.event = index;
            b.requested_bytes.add(rq);
            b.allocated_bytes.add(al);
            b.reserved_bytes.add(rs);
        }
        index += 1;
        if index == half {
            calls_at_half = Some(dev.counters().total());
        }
        if driver_baseline.is_some() && dev.used_bytes() > used_high {
            used_high = dev.used_bytes();
            if let (Some(now), Some(peak)) = (dev.driver_used_bytes(), driver_peak.as_mut()) {
                *peak = (*peak).max(now);
            }
        }
        if want_timeline && index.is_multiple_of(timeline_every) {
            report.timeline.extend(bucket.take());
        }
        // `index` is a multiple of `frag_every`, counted down rather than divided (a 64-bit
        // division per event is a fair share of a fast allocator's time).
        frag_left -= 1;
        let sample_frag = frag_left == 0;
        if sample_frag {
            frag_left = frag_every;
        }
        if sample_frag || index.is_multiple_of(4096) {
            let s = alloc.stats();
            if sample_frag {
                record_fragmentation(&mut report, &s);
            }
            if index.is_multiple_of(4096) {
                progress(index);
            }
        }
    }
    report.timeline.extend(bucket.take());
    progress(index);
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = match (cpu_started, thread_cpu_seconds()) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => seconds,
    };
    let s = alloc.stats();
    let after = dev.counters();
    let calls = after.since(&calls_before);
    record_peaks(&mut report, &s, opts.sample_fragmentation);
    report.alloc_retries = s.alloc_retries;
    report.driver_calls = calls;
    report.modelled_driver_seconds = calls.seconds;
    report.steady_state_driver_calls = after
        .total()
        .saturating_sub(calls_at_half.unwrap_or(after.total()));
    report.driver_share_of_trace = summary
        .duration_us
        .filter(|&d| d > 0)
        .map(|d| calls.seconds / (d as f64 * 1e-6));
    report.device_peak_used_bytes = report.peak_reserved_bytes.max(dev.used_bytes());
    report.driver_peak_delta_bytes = driver_baseline
        .zip(driver_peak)
        .map(|(b, p)| p.saturating_sub(b));
    report.seconds = seconds;
    report.cpu_seconds = cpu_seconds;
    report.events_replayed = index;
    report.events_per_second = if cpu_seconds > 0.0 {
        index as f64 / cpu_seconds
    } else {
        0.0
    };
    report.final_stats = s;
    alloc.validate().map_err(|source| ReplayError::Invalid {
        event: index,
        allocator: name.clone(),
        source,
    })?;
    Ok(report)
}
