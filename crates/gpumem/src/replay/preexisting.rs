//! What the recorded run held before its trace began, and where it emptied its cache: the
//! segments and blocks a replay starts from ([`preexisting_segments`],
//! [`adopt_preexisting`]) and the recorded `empty_cache()` calls ([`cache_releases`]),
//! gathered for the `torch` emulation in [`TorchInputs`].
use gpumem_core::strategy::Strategy;
use gpumem_core::{AllocError, Allocator, Device, ForeignBlock, ForeignSegment};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::trace::{Action, Trace};

/// Most pages one segment or one map event may list (2^22 pages: 80 TiB of 20 MiB pages,
/// more than any device), so that a broken file cannot make the listing endless.
const MAX_PAGES_LISTED: u64 = 1 << 22;

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

/// The event indices of `device` (counted as [`replay`](super::replay) counts them, from 0) where a run of
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

/// What a replay through the `torch` emulation reads from a trace beyond its summary: the
/// segments the recorded run already held ([`preexisting_segments`]) and the events where it
/// released its cache ([`cache_releases`]). Each is a scan of the events; a caller that
/// replays one trace through the emulation many times (a capacity search, `tune`) finds them
/// once ([`TorchInputs::of`]) and passes them to [`replay_prepared`](super::replay_prepared).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TorchInputs {
    /// The segments held before the first event, in address order.
    pub segments: Vec<PreexistingSegment>,
    /// Indices (among the device's events) where a release of the cache begins.
    pub releases: FxHashSet<u64>,
}

impl TorchInputs {
    /// Whether a replay through `strategy` reads them: only the `torch` emulation keeps
    /// PyTorch's segments and honours the recorded `empty_cache()` calls.
    pub fn wanted_by(strategy: Strategy) -> bool {
        strategy == Strategy::Torch
    }

    /// Both, for the events of `device` in `trace`.
    pub fn of(trace: &Trace, device: u32) -> TorchInputs {
        TorchInputs {
            segments: preexisting_segments(trace, device),
            releases: cache_releases(trace, device),
        }
    }
}
