//! Figures of a trace alone, before any allocator: [`summarize`], [`devices`].
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;

use crate::trace::{Action, Trace};

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
