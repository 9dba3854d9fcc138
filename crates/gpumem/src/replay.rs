//! Replays a [`Trace`] through an [`Allocator`] on a [`Device`] and measures what it would
//! reserve, how fragmented it gets and how many driver calls it makes.
//!
//! Semantics:
//! - blocks live before recording started ([`Trace::preexisting`]) are allocated first;
//! - `Alloc` asks the allocator for `size_bytes` with the event's alignment (or
//!   [`ReplayConfig::default_align`]); `Free` returns the block;
//! - an allocation that fails is counted and dropped together with its later free, and the
//!   replay goes on (PyTorch would raise `OutOfMemoryError` and stop there): out-of-memory
//!   after the allocator released its cache and retried, as every allocator must
//!   ([`ReplayReport::oom_count`], a request of 2^63 bytes is one), or a request the
//!   allocator refuses as impossible, an alignment it does not support or a size that
//!   overflows with its padding ([`ReplayReport::refused_count`]); the report keeps the
//!   index of the first of each;
//! - only events of [`ReplayConfig::device`] are replayed (one pool per device); event
//!   indices count that device's events from 0;
//! - for the `torch` emulation, a run of recorded `segment_free` / `segment_unmap` events that
//!   left no wholly free segment behind is a `torch.cuda.empty_cache()` (or an OOM's cache
//!   release) of the recorded run: the emulation empties its cache there too
//!   ([`cache_releases`]). A run that left some is the allocator's own (its garbage collector,
//!   or oversize blocks freed under a memory limit), which the emulation does by itself. Other
//!   allocators are left alone: `empty_cache()` does not reach a plug-in allocator.
//!
//! Figures: `requested` bytes are those of the blocks actually served, so
//! [`ReplayReport::reserved_over_requested`] is at least 1 even when allocations failed (and 0,
//! no ratio, when no byte was served);
//! events/s is events ÷ CPU seconds of the replaying thread (so replays run side by side on a
//! busy machine measure the same), [`ReplayReport::seconds`] the wall time.
use std::time::Instant;

use gpumem_core::addr_table::AddrTable;
use gpumem_core::{
    AllocError, Allocator, Device, DeviceError, DriverCounters, ForeignBlock, ForeignSegment, Stats,
};
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;

use crate::measure::thread_cpu_seconds;
use crate::trace::{Action, Trace};

mod capacity;
pub use capacity::{min_capacity, Incomplete, MinCapacity, MinCapacityConfig, MinCapacityOutcome};

/// How to replay.
#[derive(Debug, Clone, Copy)]
pub struct ReplayConfig {
    /// Device ordinal whose events are replayed.
    pub device: u32,
    /// Alignment used when an event carries none, in bytes.
    pub default_align: u64,
    /// Timeline buckets to keep (0 = none): each holds the lowest and highest figures over
    /// its events, so no peak falls between two samples.
    pub timeline_points: u64,
    /// Fill every block with a pattern at allocation and check it at free (needs a device
    /// with memory contents; overlapping blocks show as canary errors).
    pub canary: bool,
    /// Sample fragmentation figures (about 1000 times per replay) and take the external
    /// fragmentation at the event that sets the reserved peak; off for capacity probes.
    pub sample_fragmentation: bool,
    /// Stop at the first out-of-memory (capacity probes only need to know whether the trace
    /// completes; a refused request, an impossible size or alignment, fails at every capacity
    /// and does not stop the replay).
    pub stop_at_first_failure: bool,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            device: 0,
            default_align: gpumem_core::DEFAULT_ALIGN,
            timeline_points: 0,
            canary: false,
            sample_fragmentation: true,
            stop_at_first_failure: false,
        }
    }
}

/// The lowest and highest value of a figure over a stretch of events, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MinMax {
    /// Lowest value.
    pub min: u64,
    /// Highest value.
    pub max: u64,
}

impl MinMax {
    fn new(v: u64) -> Self {
        MinMax { min: v, max: v }
    }
    fn add(&mut self, v: u64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
}

/// One bucket of the timeline: figures over events `first_event..=event` (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// Index of the first event of the bucket.
    pub first_event: u64,
    /// Index of the last event of the bucket.
    pub event: u64,
    /// Requested bytes of live blocks.
    pub requested_bytes: MinMax,
    /// Allocated bytes of live blocks.
    pub allocated_bytes: MinMax,
    /// Reserved bytes held from the device.
    pub reserved_bytes: MinMax,
}

/// What one replay measured.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// Allocator name.
    pub name: String,
    /// Highest reserved bytes (taken from the device) during the replay.
    pub peak_reserved_bytes: u64,
    /// Highest allocated bytes (live blocks after rounding).
    pub peak_allocated_bytes: u64,
    /// Highest requested bytes of the blocks that were actually served.
    pub peak_requested_bytes: u64,
    /// `peak_reserved_bytes / peak_requested_bytes` (1.0 is perfect; at least 1 since both
    /// count only served blocks), or 0 when `peak_requested_bytes` is 0 (zero-byte requests
    /// only, or none served): no ratio. Equals peak reserved ÷ the trace's peak requested
    /// when every allocation was served.
    pub reserved_over_requested: f64,
    /// Highest external fragmentation `1 − largest_free / free` over the samples (about 1000
    /// per replay) and the moment of peak reserved ([`Self::external_fragmentation_at_peak`]).
    pub peak_external_fragmentation: f64,
    /// External fragmentation right after the event during which reserved bytes reached their
    /// final peak (exact: the reserved peak is read after every allocation, the only events
    /// that take memory; 0 without [`ReplayConfig::sample_fragmentation`]).
    pub external_fragmentation_at_peak: f64,
    /// Internal fragmentation `(allocated − requested) / allocated` at peak allocated.
    pub internal_fragmentation_at_peak: f64,
    /// Highest free bytes inside segments or pages that also hold live blocks (PyTorch's
    /// `inactive_split_bytes` peak): exact where the allocator tracks it (torch), else the
    /// highest of the fragmentation samples.
    pub peak_inactive_split_bytes: u64,
    /// Times the pool released its cache and retried after the device refused memory
    /// (PyTorch's `num_alloc_retries`).
    pub alloc_retries: u64,
    /// Allocations that failed with out-of-memory and were dropped.
    pub oom_count: u64,
    /// Index of the first event whose allocation failed with out-of-memory.
    pub first_oom_event: Option<u64>,
    /// Bytes requested by the first allocation that failed with out-of-memory.
    pub first_oom_request_bytes: Option<u64>,
    /// Allocations the allocator refused as impossible (alignment it does not support, size
    /// that overflows) and that were dropped.
    pub refused_count: u64,
    /// The first refusal: event index and the allocator's reason.
    pub first_refusal: Option<String>,
    /// Indices of failed allocations (the first 10 000), for timeline marks.
    #[serde(skip)]
    pub failed_events: Vec<u64>,
    /// Driver calls by kind.
    pub driver_calls: DriverCounters,
    /// Seconds the driver calls took (modelled on the simulated device, measured on CUDA).
    pub modelled_driver_seconds: f64,
    /// Driver calls made while the second half of the events was replayed (the steady state
    /// of a training loop: a caching allocator makes almost none there).
    pub steady_state_driver_calls: u64,
    /// `modelled_driver_seconds` ÷ the trace's own duration (first to last `time_us` of the
    /// replayed device's events), when the trace has timestamps.
    pub driver_share_of_trace: Option<f64>,
    /// Highest physical bytes the device reported in use (the device's own view).
    pub device_peak_used_bytes: u64,
    /// Peak of the driver's own figure of memory in use (cuMemGetInfo total − free) above
    /// what was in use when the replay started, in bytes: the real footprint, including
    /// the driver's rounding. Sampled whenever the device's usage reaches a new high.
    /// `None` on the simulated device.
    pub driver_peak_delta_bytes: Option<u64>,
    /// Events replayed per CPU second of the replaying thread (allocator + bookkeeping).
    pub events_per_second: f64,
    /// Events replayed (fewer than the trace's when stopped at the first failure).
    pub events_replayed: u64,
    /// Wall time of the replay, in seconds.
    pub seconds: f64,
    /// CPU time of the replaying thread, in seconds.
    pub cpu_seconds: f64,
    /// Blocks whose canary pattern was damaged (canary replays only).
    pub canary_errors: u64,
    /// Final statistics of the pool.
    pub final_stats: Stats,
    /// Timeline buckets (when asked for).
    #[serde(skip)]
    pub timeline: Vec<Sample>,
}

impl ReplayReport {
    /// Allocations that failed, whatever the reason.
    pub fn failed_count(&self) -> u64 {
        self.oom_count + self.refused_count
    }
}

/// A replay that could not go on.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The allocator failed for a reason other than out-of-memory or an impossible request
    /// (a device error, or a bug).
    #[error("event index {event}: {allocator}: {source}")]
    Allocator {
        /// Index of the event.
        event: u64,
        /// Allocator name.
        allocator: String,
        /// The error.
        #[source]
        source: AllocError,
    },
    /// The allocator's invariant checker failed after an event.
    #[error("event index {event}: {allocator}: validation failed: {source}")]
    Invalid {
        /// Index of the event.
        event: u64,
        /// Allocator name.
        allocator: String,
        /// The error.
        #[source]
        source: AllocError,
    },
    /// The canary check itself failed (device error).
    #[error("event index {event}: canary: {source}")]
    Canary {
        /// Index of the event.
        event: u64,
        /// The error.
        #[source]
        source: DeviceError,
    },
}

/// Figures of the trace itself, independent of any allocator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TraceSummary {
    /// Events of the replayed device (all kinds).
    pub events: u64,
    /// Alloc events.
    pub allocs: u64,
    /// Free events.
    pub frees: u64,
    /// Highest sum of requested bytes of live blocks (the floor for any allocator);
    /// saturates at `u64::MAX`.
    pub peak_requested_bytes: u64,
    /// Largest single request, in bytes.
    pub largest_request_bytes: u64,
    /// Blocks live before recording started.
    pub preexisting_blocks: u64,
    /// Frees of blocks that were never allocated and are not pre-existing (lenient reads).
    pub unmatched_frees: u64,
    /// Requests too large to round up to 512 bytes: every allocator refuses them, and they
    /// are left out of the peak and the largest request (as their frees are).
    pub impossible_requests: u64,
    /// Microseconds from the first to the last event with a `time_us`, when the trace has
    /// timestamps.
    pub duration_us: Option<u64>,
}

/// Summarises the events of `device` in `trace`.
pub fn summarize(trace: &Trace, device: u32) -> TraceSummary {
    let mut s = TraceSummary::default();
    let mut live: FxHashMap<u64, u64> = FxHashMap::default();
    // Sizes near 2^64 come from hostile or broken files: saturate rather than wrap.
    let mut cur: u64 = 0;
    for p in trace.preexisting.iter().filter(|p| p.device == device) {
        live.insert(p.addr, p.size_bytes);
        cur = cur.saturating_add(p.size_bytes);
        s.preexisting_blocks += 1;
    }
    s.peak_requested_bytes = cur;
    let mut impossible: FxHashSet<u64> = FxHashSet::default();
    let mut times: Option<(i64, i64)> = None;
    for e in trace.events.iter().filter(|e| e.device == device) {
        s.events += 1;
        if let Some(t) = e.time_us {
            times = Some(times.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
        }
        match e.action {
            Action::Alloc => {
                s.allocs += 1;
                if let Some(old) = live.remove(&e.addr) {
                    cur = cur.saturating_sub(old);
                }
                if crate::plan::planned_bytes(e.size_bytes).is_none() {
                    s.impossible_requests += 1;
                    impossible.insert(e.addr);
                    continue;
                }
                impossible.remove(&e.addr);
                s.largest_request_bytes = s.largest_request_bytes.max(e.size_bytes);
                live.insert(e.addr, e.size_bytes);
                cur = cur.saturating_add(e.size_bytes);
                s.peak_requested_bytes = s.peak_requested_bytes.max(cur);
            }
            Action::Free => {
                s.frees += 1;
                match live.remove(&e.addr) {
                    Some(sz) => cur = cur.saturating_sub(sz),
                    None if impossible.remove(&e.addr) => {}
                    None => s.unmatched_frees += 1,
                }
            }
            _ => {}
        }
    }
    s.duration_us = times.map(|(a, b)| b.abs_diff(a));
    s
}

/// Devices that have events or pre-existing blocks in `trace`, ascending.
pub fn devices(trace: &Trace) -> Vec<u32> {
    let mut d: Vec<u32> = trace
        .events
        .iter()
        .map(|e| e.device)
        .chain(trace.preexisting.iter().map(|p| p.device))
        .collect();
    d.sort_unstable();
    d.dedup();
    if d.is_empty() {
        d.push(0);
    }
    d
}

fn canary_pattern(trace_addr: u64) -> u32 {
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

/// The expandable segments (`expandable_segments:True`) `trace` shows had pages mapped on
/// `device` when it began, one per stream and pool, without their blocks (see
/// [`preexisting_segments`]). A page was mapped then if the trace's first `segment_map` /
/// `segment_unmap` of it is an unmap, or, when no event touches it, if the snapshot's dump
/// shows it mapped. Events are matched to the stream and pool whose dumped pages lie
/// nearest. Offsets count from the lowest page the trace or the dump shows of the segment:
/// PyTorch maps the lowest free place first, so no page below it served the run. In a
/// truncated snapshot ([`Trace::truncated`]) the dump is the state after the cut: a page no
/// map or unmap event read touches counts as mapped then only where a block event read lies
/// in it.
/// Most pages one segment or one map event may list (2^22 pages: 80 TiB of 20 MiB pages,
/// more than any device), so that a broken file cannot make the listing endless.
const MAX_PAGES_LISTED: u64 = 1 << 22;

fn preexisting_expandable(trace: &Trace, device: u32) -> Vec<PreexistingSegment> {
    use std::collections::BTreeMap;
    // For a truncated trace: the addresses of the block events read.
    let mut touched: Vec<u64> = Vec::new();
    if trace.truncated.is_some() {
        touched = trace
            .events
            .iter()
            .filter(|e| e.device == device && matches!(e.action, Action::Alloc | Action::Free))
            .map(|e| e.addr)
            .collect();
        touched.sort_unstable();
    }
    let used = |page_at: u64, page: u64| {
        let from = touched.partition_point(|&a| a < page_at);
        touched
            .get(from)
            .is_some_and(|&a| a < page_at.saturating_add(page))
    };
    // (stream, small pool) -> (page bytes, dumped mapped pages)
    let mut groups: BTreeMap<(u64, bool), (u64, Vec<u64>)> = BTreeMap::new();
    for s in trace
        .segments
        .iter()
        .filter(|s| s.device == device && s.is_expandable && !s.private_pool)
    {
        let small = s.segment_type == "small";
        let page = if small {
            gpumem_core::torch::SMALL_BUFFER_BYTES
        } else {
            gpumem_core::torch::LARGE_BUFFER_BYTES
        };
        let g = groups
            .entry((s.stream, small))
            .or_insert((page, Vec::new()));
        // (A segment larger than any device would be a broken file: its pages are not listed.)
        if s.total_size_bytes / page <= MAX_PAGES_LISTED {
            g.1.extend(
                (0..s.total_size_bytes.div_ceil(page)).map(|n| s.address.saturating_add(n * page)),
            );
        }
    }
    if groups.is_empty() {
        return Vec::new();
    }
    for g in groups.values_mut() {
        g.1.sort_unstable();
        g.1.dedup();
    }
    let spans: Vec<((u64, bool), u64, u64)> = groups
        .iter()
        .filter_map(|(&k, (page, pages))| Some((k, *pages.first()?, pages.last()? + page)))
        .collect();
    // First map (false) or unmap (true) event of each page, per group.
    let mut first: BTreeMap<(u64, bool), BTreeMap<u64, bool>> = BTreeMap::new();
    for e in trace.events.iter().filter(|e| e.device == device) {
        let unmap = match e.action {
            Action::SegmentMap => false,
            Action::SegmentUnmap => true,
            _ => continue,
        };
        let Some(&(k, _, _)) = spans.iter().min_by_key(|(_, lo, hi)| {
            if e.addr < *lo {
                lo - e.addr
            } else {
                e.addr.saturating_sub(*hi)
            }
        }) else {
            continue;
        };
        // Pages lie on the segment's own grid (20 MiB is not a power of two): the residue of
        // its dumped pages.
        let (page, ref dumped) = groups[&k];
        let grid = dumped.first().map_or(0, |d| d % page);
        let f = first.entry(k).or_default();
        let into_page = (i128::from(e.addr) - i128::from(grid)).rem_euclid(i128::from(page)) as u64;
        let start = e.addr.saturating_sub(into_page);
        let end = e.addr.saturating_add(e.size_bytes);
        if (end - start) / page > MAX_PAGES_LISTED {
            continue;
        }
        let mut a = start;
        while a < end {
            f.entry(a).or_insert(unmap);
            a = match a.checked_add(page) {
                Some(next) => next,
                None => break,
            };
        }
    }
    let mut out = Vec::new();
    for (&(stream, small), (page, dumped)) in &groups {
        let f = first.get(&(stream, small));
        let mut pages: Vec<u64> = dumped.clone();
        pages.extend(f.into_iter().flat_map(|m| m.keys().copied()));
        pages.sort_unstable();
        pages.dedup();
        let Some(&base) = pages.first() else {
            continue;
        };
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &p in &pages {
            let mapped_then = match f.and_then(|m| m.get(&p)) {
                Some(&unmap) => unmap,
                None => {
                    dumped.binary_search(&p).is_ok()
                        && (trace.truncated.is_none() || used(p, *page))
                }
            };
            if !mapped_then {
                continue;
            }
            let off = p - base;
            match runs.last_mut() {
                Some(r) if r.0 + r.1 == off => r.1 += page,
                _ => runs.push((off, *page)),
            }
        }
        let Some(&(o, n)) = runs.last() else {
            continue;
        };
        out.push(PreexistingSegment {
            address: base,
            segment: ForeignSegment {
                bytes: o + n,
                small_pool: small,
                stream,
                blocks: Vec::new(),
                mapped: Some(runs),
            },
            block_addrs: Vec::new(),
        });
    }
    out
}

/// The event indices of `device` (counted as [`replay`] counts them, from 0) where a run of
/// recorded `segment_free` / `segment_unmap` events starts that released the recorded run's
/// cache: `torch.cuda.empty_cache()`, or the release before an out-of-memory retry. Both
/// free every wholly free cudaMalloc segment, so a run of `segment_free` events after which
/// one is left (by the trace's own addresses: a segment with no live block in it) was not
/// one: PyTorch's garbage collector (`garbage_collection_threshold`) or its release of
/// oversize blocks (`max_split_size_mb` under a memory limit) freed some segments only, inside
/// an allocation the replay makes too. Runs with `segment_unmap` (expandable segments) count
/// as releases of the cache.
pub fn cache_releases(trace: &Trace, device: u32) -> FxHashSet<u64> {
    let events: Vec<&crate::trace::Event> =
        trace.events.iter().filter(|e| e.device == device).collect();
    let mut out = FxHashSet::default();
    if !events.iter().any(|e| e.action == Action::SegmentFree) {
        // Only unmap runs (or none): every run is a release, as before.
        let mut in_run = false;
        for (i, e) in events.iter().enumerate() {
            let release = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
            if release && !in_run {
                out.insert(i as u64);
            }
            in_run = release;
        }
        return out;
    }
    let mut live: std::collections::BTreeMap<u64, u64> = trace
        .preexisting
        .iter()
        .filter(|p| p.device == device)
        .map(|p| (p.addr, p.size_bytes))
        .collect();
    let mut segments: std::collections::BTreeMap<u64, u64> = preexisting_segments(trace, device)
        .into_iter()
        .filter(|s| s.segment.mapped.is_none())
        .map(|s| (s.address, s.segment.bytes))
        .collect();
    let mut i = 0usize;
    while i < events.len() {
        let e = events[i];
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, e.size_bytes);
            }
            Action::Free => {
                live.remove(&e.addr);
            }
            Action::SegmentAlloc => {
                segments.insert(e.addr, e.size_bytes);
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                let start = i;
                let mut unmaps = false;
                let mut freed = FxHashSet::default();
                while i < events.len()
                    && matches!(events[i].action, Action::SegmentFree | Action::SegmentUnmap)
                {
                    unmaps |= events[i].action == Action::SegmentUnmap;
                    if events[i].action == Action::SegmentFree {
                        freed.insert(events[i].addr);
                    }
                    i += 1;
                }
                let wholly_free_left = segments.iter().any(|(&a, &b)| {
                    !freed.contains(&a) && live.range(a..a.saturating_add(b)).next().is_none()
                });
                if unmaps || !wholly_free_left {
                    out.insert(start as u64);
                }
                for a in &freed {
                    segments.remove(a);
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Offers `segments` (from [`preexisting_segments`]) to `alloc` in order
/// ([`Allocator::adopt_segment`]). Returns each segment taken in, as its index in `segments`
/// with its blocks (in the order of its `block_addrs`). A segment not taken in, or refused
/// for lack of memory, is left out: its blocks are to be allocated as usual.
///
/// # Errors
/// Another error of `adopt_segment` (a device error); the segments taken in before it stay.
pub fn adopt_preexisting(
    alloc: &mut dyn Allocator,
    dev: &mut dyn Device,
    segments: &[PreexistingSegment],
) -> Result<Vec<(usize, Vec<gpumem_core::Block>)>, AllocError> {
    let mut out = Vec::new();
    for (k, f) in segments.iter().enumerate() {
        match alloc.adopt_segment(dev, &f.segment) {
            Ok(Some(blocks)) => out.push((k, blocks)),
            Ok(None) => {}
            Err(e) if e.is_oom() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// A cudaMalloc segment the recorded run held when its trace began (see
/// [`preexisting_segments`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreexistingSegment {
    /// Its address in the recorded run.
    pub address: u64,
    /// The segment and the blocks live in it when the trace began.
    pub segment: ForeignSegment,
    /// The recorded addresses of those blocks ([`Trace::preexisting`]), in the order of
    /// `segment.blocks`.
    pub block_addrs: Vec<u64>,
}

/// The segments `trace` shows existed on `device` before its first event, in address order.
/// cudaMalloc segments: those the snapshot lists at its dump that no `segment_alloc` or
/// `segment_free` event touches, and those whose first segment event is a `segment_free`
/// (size and stream from that event; a 2 MiB one is taken for a small-pool segment, as only
/// PyTorch's small pool makes segments of that size). Expandable segments: one per stream and
/// pool with the pages mapped when the trace began ([`ForeignSegment::mapped`]; see
/// `preexisting_expandable`). Each carries the pre-existing blocks ([`Trace::preexisting`])
/// that lie inside it (inside its mapped pages); every other byte was free.
/// A replay through the `torch` emulation starts from them
/// ([`Allocator::adopt_segment`]), as the recorded run did; empty for traces that record no
/// segments (JSON lines, RMM logs). In a truncated snapshot salvaged by a lenient read
/// ([`Trace::truncated`]) the segments are the state at the dump, after the cut: one the dump
/// lists is taken only where a block event read lies inside it, outside every segment the
/// events read made or freed (so it existed before the first event).
pub fn preexisting_segments(trace: &Trace, device: u32) -> Vec<PreexistingSegment> {
    let events = || trace.events.iter().filter(|e| e.device == device);
    // For a truncated trace: the addresses of block events read, and the ranges of the
    // segments the events read made or freed.
    let (mut touched, mut made) = (Vec::new(), Vec::new());
    if trace.truncated.is_some() {
        for e in events() {
            match e.action {
                Action::Alloc | Action::Free => touched.push(e.addr),
                Action::SegmentAlloc | Action::SegmentFree => {
                    made.push((e.addr, e.addr.saturating_add(e.size_bytes)))
                }
                _ => {}
            }
        }
        touched.sort_unstable();
    }
    let existed_before = |address: u64, bytes: u64| {
        let end = address.saturating_add(bytes);
        let from = touched.partition_point(|&a| a < address);
        touched[from..]
            .iter()
            .take_while(|&&a| a < end)
            .any(|&a| !made.iter().any(|&(lo, hi)| lo <= a && a < hi))
    };
    // The first segment event at each address: (is a free, bytes, stream).
    let mut first: FxHashMap<u64, (bool, u64, u64)> = FxHashMap::default();
    for e in events() {
        let free = match e.action {
            Action::SegmentAlloc => false,
            Action::SegmentFree => true,
            _ => continue,
        };
        first
            .entry(e.addr)
            .or_insert((free, e.size_bytes, e.stream));
    }
    // Allocated bytes of the blocks the dump shows live.
    let mut dumped: FxHashMap<u64, u64> = FxHashMap::default();
    let mut out: Vec<PreexistingSegment> = Vec::new();
    let mut add = |address: u64, bytes: u64, small_pool: bool, stream: u64| {
        out.push(PreexistingSegment {
            address,
            segment: ForeignSegment {
                bytes,
                small_pool,
                stream,
                blocks: Vec::new(),
                mapped: None,
            },
            block_addrs: Vec::new(),
        });
    };
    for s in trace.segments.iter().filter(|s| s.device == device) {
        for b in s.blocks.iter().filter(|b| b.state.starts_with("active")) {
            dumped.insert(b.address, b.size_bytes);
        }
        // (A CUDA graph's private pool is not modelled: its segments are not adopted.)
        if !s.is_expandable
            && !s.private_pool
            && !first.contains_key(&s.address)
            && s.total_size_bytes > 0
            && (trace.truncated.is_none() || existed_before(s.address, s.total_size_bytes))
        {
            add(
                s.address,
                s.total_size_bytes,
                s.segment_type == "small",
                s.stream,
            );
        }
    }
    for (&address, &(free, bytes, stream)) in &first {
        if free && bytes > 0 {
            add(
                address,
                bytes,
                bytes == gpumem_core::torch::SMALL_BUFFER_BYTES,
                stream,
            );
        }
    }
    out.extend(preexisting_expandable(trace, device));
    if out.is_empty() {
        return out;
    }
    out.sort_unstable_by_key(|s| s.address);
    let mut blocks: Vec<(u64, u64)> = trace
        .preexisting
        .iter()
        .filter(|p| p.device == device)
        .map(|p| (p.addr, p.size_bytes))
        .collect();
    blocks.sort_unstable();
    for seg in &mut out {
        let end = seg.address.saturating_add(seg.segment.bytes);
        let from = blocks.partition_point(|b| b.0 < seg.address);
        for &(addr, requested) in blocks[from..].iter().take_while(|b| b.0 < end) {
            if let Some(runs) = &seg.segment.mapped {
                // Of an expandable segment, only blocks inside its mapped runs.
                let off = addr - seg.address;
                if !runs.iter().any(|&(o, n)| o <= off && off < o + n) {
                    continue;
                }
            }
            seg.segment.blocks.push(ForeignBlock {
                offset: addr - seg.address,
                requested_bytes: requested,
                allocated_bytes: dumped.get(&addr).copied(),
            });
            seg.block_addrs.push(addr);
        }
    }
    out
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

/// What a replay through the `torch` emulation reads from a trace beyond its summary: the
/// segments the recorded run already held ([`preexisting_segments`]) and the events where it
/// released its cache ([`cache_releases`]). Each is a scan of the events; a caller that
/// replays one trace through the emulation many times (a capacity search, `tune`) finds them
/// once ([`TorchInputs::of`]) and passes them to [`replay_prepared`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TorchInputs {
    /// The segments held before the first event, in address order.
    pub segments: Vec<PreexistingSegment>,
    /// Indices (among the device's events) where a release of the cache begins.
    pub releases: FxHashSet<u64>,
}

impl TorchInputs {
    /// Whether a replay through the allocator named `name` reads them: only the `torch`
    /// emulation keeps PyTorch's segments and honours the recorded `empty_cache()` calls.
    pub fn wanted_by(name: &str) -> bool {
        name == "torch"
    }

    /// Both, for the events of `device` in `trace`.
    pub fn of(trace: &Trace, device: u32) -> TorchInputs {
        TorchInputs {
            segments: preexisting_segments(trace, device),
            releases: cache_releases(trace, device),
        }
    }
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

/// [`replay_summarized`] with the emulation's inputs found beforehand: `torch` must be
/// [`TorchInputs::of`] the same trace and `opts.device`. It is read only when `alloc` is the
/// `torch` emulation; `None` finds them here when it is.
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
    let mut report = ReplayReport {
        name: name.clone(),
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
    };
    // What only the torch emulation uses, found before the clock starts (unless the caller
    // did): the segments the recorded run already held, and where it emptied its cache.
    let found;
    let (foreign, releases): (&[PreexistingSegment], Option<&FxHashSet<u64>>) =
        match (TorchInputs::wanted_by(&name), torch) {
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

    // The segments the recorded run already held, for an allocator that keeps PyTorch's
    // (the `torch` emulation); the blocks live in them are taken in with them.
    // Those not taken in have their blocks allocated below like any other.
    let mut adopted: FxHashSet<u64> = FxHashSet::default();
    let taken = adopt_preexisting(alloc, dev, foreign).map_err(allocator_error(0, &name))?;
    for (k, blocks) in taken {
        for (&trace_addr, b) in foreign[k].block_addrs.iter().zip(&blocks) {
            if opts.canary && b.requested_bytes >= 4 {
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
        .filter(|p| p.device == opts.device && !adopted.contains(&p.addr))
    {
        st.alloc(
            alloc,
            dev,
            &mut report,
            0,
            p.addr,
            p.size_bytes,
            opts.default_align,
            0,
        )?;
    }

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
                report.peak_external_fragmentation = report
                    .peak_external_fragmentation
                    .max(s.external_fragmentation());
                report.peak_inactive_split_bytes = report
                    .peak_inactive_split_bytes
                    .max(s.inactive_split_bytes.peak);
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
    if opts.sample_fragmentation {
        report.peak_external_fragmentation = report
            .peak_external_fragmentation
            .max(s.external_fragmentation());
        report.peak_inactive_split_bytes = report
            .peak_inactive_split_bytes
            .max(s.inactive_split_bytes.peak);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Event, PreexistingBlock};

    /// A broken snapshot (an expandable segment or a map step of 2^64 bytes, addresses below
    /// the page grid) neither hangs nor overflows the listing of pre-existing pages.
    #[test]
    fn preexisting_pages_of_a_broken_snapshot_are_bounded() {
        use crate::trace::SnapshotSegment;
        let seg = |address, total_size_bytes| SnapshotSegment {
            device: 0,
            address,
            total_size_bytes,
            allocated_size_bytes: 0,
            stream: 0,
            segment_type: "large".into(),
            is_expandable: true,
            private_pool: false,
            blocks: Vec::new(),
        };
        const MIB: u64 = 1 << 20;
        let t = Trace {
            segments: vec![seg(u64::MAX - MIB, u64::MAX), seg(30 * MIB, 40 * MIB)],
            events: vec![
                Event::new(Action::SegmentMap, 5, u64::MAX),
                Event::new(Action::SegmentMap, u64::MAX - 3, 1 << 30),
                Event::new(Action::SegmentUnmap, 30 * MIB, 20 * MIB),
            ],
            ..Trace::default()
        };
        let segs = preexisting_segments(&t, 0);
        // Only the sane segment's pages: its first page was unmapped during the trace (so
        // mapped before it), its second has no event and was mapped at the dump.
        assert_eq!(segs.len(), 1, "{segs:?}");
        assert_eq!(segs[0].segment.mapped, Some(vec![(0, 40 * MIB)]));
    }

    /// A run of `segment_free` events is the recorded run's `empty_cache()` only when it left
    /// no wholly free segment: the garbage collector frees some old segments and keeps others.
    #[test]
    fn cache_releases_tell_empty_cache_from_the_collector() {
        const MIB: u64 = 1 << 20;
        let (a, b) = (0x1000_0000u64, 0x2000_0000u64);
        let events = vec![
            Event::new(Action::SegmentAlloc, a, 20 * MIB),
            Event::new(Action::Alloc, a, MIB),
            Event::new(Action::SegmentAlloc, b, 20 * MIB),
            Event::new(Action::Alloc, b, MIB),
            Event::new(Action::Free, a, MIB),
            Event::new(Action::Free, b, MIB),
            // 6: the collector frees `a` only; `b` stays cached and wholly free.
            Event::new(Action::SegmentFree, a, 20 * MIB),
            Event::new(Action::SegmentAlloc, a, 40 * MIB),
            Event::new(Action::Alloc, a, 30 * MIB),
            // 9: empty_cache(): `b` goes; `a` holds a live block.
            Event::new(Action::SegmentFree, b, 20 * MIB),
            Event::new(Action::Free, a, 30 * MIB),
            // 11, 12: empty_cache() again, one run of one event.
            Event::new(Action::SegmentFree, a, 40 * MIB),
        ];
        let t = Trace {
            events,
            ..Trace::default()
        };
        let mut got: Vec<u64> = cache_releases(&t, 0).into_iter().collect();
        got.sort_unstable();
        assert_eq!(got, vec![9, 11]);
        // Unmap runs (expandable segments) are releases as before.
        let t = Trace {
            events: vec![
                Event::new(Action::SegmentMap, a, 20 * MIB),
                Event::new(Action::SegmentUnmap, a, 20 * MIB),
            ],
            ..Trace::default()
        };
        assert_eq!(
            cache_releases(&t, 0).into_iter().collect::<Vec<_>>(),
            vec![1]
        );
    }

    #[test]
    fn summary_counts_peak_and_preexisting() {
        let mut t = Trace::default();
        t.preexisting.push(PreexistingBlock {
            addr: 99,
            size_bytes: 10,
            device: 0,
            freed_at_event: Some(4),
        });
        t.events = vec![
            Event::alloc(1, 100),
            Event::alloc(2, 50),
            Event::free(1, 0),
            Event::new(Action::SegmentAlloc, 7, 1 << 21),
            Event::free(99, 10),
            Event::alloc(3, 20),
            Event::free(12345, 0),
        ];
        let s = summarize(&t, 0);
        assert_eq!(s.events, 7);
        assert_eq!(s.allocs, 3);
        assert_eq!(s.frees, 3);
        assert_eq!(s.peak_requested_bytes, 160);
        assert_eq!(s.preexisting_blocks, 1);
        assert_eq!(s.unmatched_frees, 1);
        assert_eq!(s.largest_request_bytes, 100);
        assert_eq!(s.duration_us, None);
        assert_eq!(devices(&t), vec![0]);
    }

    #[test]
    fn summary_saturates_on_sizes_near_2_64() {
        let mut t = Trace {
            events: vec![
                Event::alloc(1, 1000),
                Event::alloc(2, u64::MAX - 511),
                Event::free(2, 0),
                // Too large to round to 512 bytes: every allocator refuses it, so it counts
                // as impossible, not in the peak (nor does its free count as unmatched).
                Event::alloc(3, u64::MAX),
                Event::free(3, 0),
            ],
            ..Trace::default()
        };
        t.events[0].time_us = Some(-5);
        t.events[2].time_us = Some(1_000_000);
        let s = summarize(&t, 0);
        assert_eq!(s.peak_requested_bytes, u64::MAX);
        assert_eq!(s.largest_request_bytes, u64::MAX - 511);
        assert_eq!(s.impossible_requests, 1);
        assert_eq!(s.unmatched_frees, 0);
        assert_eq!(s.duration_us, Some(1_000_005));
    }

    #[test]
    fn canary_patterns_differ_between_neighbours() {
        assert_ne!(canary_pattern(0x1000), canary_pattern(0x1200));
        assert_ne!(canary_pattern(0), 0);
    }

    /// frag@pk is the external fragmentation right after the event during which reserved
    /// bytes reached their final peak, not at the next sample (every 16 events on a short
    /// trace). Under the torch emulation: six 3 MiB blocks in one 20 MiB segment, three of them
    /// freed (holes of 3 MiB, 2 MiB left at the end), then a 25 MiB block takes a second
    /// segment (the peak: 46 MiB), so 11 MiB are free with 3 MiB the largest run: 1 − 3/11.
    /// The two neighbours freed next merge the holes, and the 3 MiB blocks allocated and freed
    /// after that reserve nothing more: the sample after event 16 saw 1 − 15/17.
    #[test]
    fn fragmentation_at_peak_is_taken_at_the_peak_event() {
        use gpumem_core::config::AllocatorConfig;
        use gpumem_core::registry;
        use gpumem_core::sim::SimDevice;
        const MIB: u64 = 1 << 20;
        let mut trace = Trace::default();
        for a in 1..=6 {
            trace.events.push(Event::new(Action::Alloc, a, 3 * MIB));
        }
        for a in [1, 3, 5] {
            trace.events.push(Event::new(Action::Free, a, 0));
        }
        trace.events.push(Event::new(Action::Alloc, 100, 25 * MIB));
        for a in [2, 4] {
            trace.events.push(Event::new(Action::Free, a, 0));
        }
        for a in 200..215 {
            trace.events.push(Event::new(Action::Alloc, a, 3 * MIB));
            trace.events.push(Event::new(Action::Free, a, 0));
        }
        let run = |trace: &Trace, name: &str| {
            let mut alloc = registry::build(name, &AllocatorConfig::default()).unwrap();
            let mut dev = SimDevice::new(gpumem_core::sim::DEFAULT_CAPACITY);
            replay(
                trace,
                alloc.as_mut(),
                &mut dev,
                &ReplayConfig::default(),
                &mut |_| {},
            )
            .unwrap()
        };
        let torch = run(&trace, "torch");
        assert_eq!(torch.peak_reserved_bytes, 46 * MIB);
        assert_eq!(torch.external_fragmentation_at_peak, 1.0 - 3.0 / 11.0);
        // Every strategy: the figure is the one after the first event whose prefix of the
        // trace reaches the whole trace's reserved peak.
        for name in ["buddy", "tlsf", "best-fit", "torch", "paged", "paged-lazy"] {
            let whole = run(&trace, name);
            let at_peak = (1..=trace.events.len())
                .map(|n| Trace {
                    events: trace.events[..n].to_vec(),
                    ..Trace::default()
                })
                .map(|prefix| run(&prefix, name))
                .find(|r| r.peak_reserved_bytes == whole.peak_reserved_bytes)
                .unwrap();
            assert_eq!(
                whole.external_fragmentation_at_peak,
                at_peak.final_stats.external_fragmentation(),
                "{name}"
            );
            // The highest seen is at least the figure at the peak.
            assert!(
                whole.peak_external_fragmentation >= whole.external_fragmentation_at_peak,
                "{name}"
            );
        }
    }
}
