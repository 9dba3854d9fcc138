//! Replays a trace through one allocator while recording what the memory map needs: every
//! segment and virtual-address range the device handed out (from a [`RecordingDevice`] around
//! the simulated device), every mapping of physical pages, and where each block was placed,
//! each stamped with the event during which it happened; plus the per-event figures
//! (requested, allocated, reserved, external fragmentation, driver calls), folded into columns.
//!
//! The replay semantics are those of [`crate::replay::replay`]: pre-existing blocks first, an
//! allocation refused with out-of-memory is dropped together with its later free.
use gpumem_core::strategy::Strategy;
use gpumem_core::{AllocError, Allocator, Device, DeviceError, PhysHandle};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

use super::downsample::Columns;
use crate::trace::{Action, Trace};

/// "Never": the event index of a release that did not happen during the trace.
pub const NEVER: u64 = u64::MAX;

/// What a row of the memory map is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionKind {
    /// A segment from cuMemAlloc (sub-allocated by the pool).
    Segment,
    /// A virtual-address range from cuMemAddressReserve (pages mapped on demand).
    VaRange,
}

/// A segment or a reserved virtual range, with the events it lived through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Segment or VA range.
    pub kind: RegionKind,
    /// First address.
    pub base: u64,
    /// Length in bytes.
    pub bytes: u64,
    /// Event during which the device handed it out.
    pub created: u64,
    /// Event during which it went back ([`NEVER`] if it did not).
    pub released: u64,
}

/// Physical memory mapped into a VA range (cuMemMap of one handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// First virtual address.
    pub va: u64,
    /// Length in bytes.
    pub bytes: u64,
    /// Event during which it was mapped.
    pub mapped: u64,
    /// Event during which it was unmapped ([`NEVER`] if it was not).
    pub unmapped: u64,
}

/// A block of the trace: when it lived and what it asked for (the same for every allocator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceBlock {
    /// Address the trace gave it.
    pub trace_addr: u64,
    /// Bytes requested.
    pub requested_bytes: u64,
    /// Event that allocated it (0 for a block live before recording started).
    pub alloc_event: u64,
    /// Event that freed it ([`NEVER`] if the trace does not free it).
    pub free_event: u64,
    /// Event whose free of it waited for other streams before `free_event` completed it
    /// ([`crate::trace::Action::FreeRequested`]; [`NEVER`] when it did not wait).
    pub free_requested_event: u64,
    /// Index into the report's stack table, when the trace recorded one.
    pub stack: Option<u32>,
    /// Stream it was allocated on.
    pub stream: u64,
    /// Alignment asked for, in bytes ([`gpumem_core::DEFAULT_ALIGN`] when the trace gave none).
    pub align: u64,
}

/// Where one allocator placed a [`TraceBlock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Address the allocator gave.
    pub addr: u64,
    /// Bytes it set aside.
    pub allocated_bytes: u64,
}

/// Everything recorded for one allocator over one trace.
#[derive(Debug, Clone)]
pub struct AllocatorRun {
    /// Allocator name.
    pub name: String,
    /// The strategy the allocator was built as ([`Strategy::of`]).
    pub strategy: Option<Strategy>,
    /// Segments and VA ranges in the order the device handed them out.
    pub regions: Vec<Region>,
    /// Mappings in the order they were made.
    pub mappings: Vec<Mapping>,
    /// One entry per [`TraceBlock`] (same index); `None` where the allocation ran out of memory.
    pub placements: Vec<Option<Placement>>,
    /// Per-event figures folded into columns.
    pub columns: Columns,
    /// Event after which reserved bytes were highest (first such event).
    pub peak_reserved_event: u64,
    /// Allocations refused with out-of-memory.
    pub oom_count: u64,
    /// Allocations refused as impossible (a size that overflows with its padding, an
    /// alignment the allocator does not support), dropped with their frees as
    /// [`crate::replay::replay`] drops them.
    pub refused_count: u64,
}

/// A [`Device`] adaptor that forwards every call and records, stamped with
/// [`RecordingDevice::event`], the segments, VA ranges and mappings that succeeded.
pub struct RecordingDevice<D: Device> {
    inner: D,
    /// The event being replayed (stamped on everything recorded).
    pub event: u64,
    regions: Vec<Region>,
    open_regions: FxHashMap<u64, usize>,
    mappings: Vec<Mapping>,
    open_mappings: BTreeMap<u64, usize>,
}

impl<D: Device> RecordingDevice<D> {
    /// Wraps `inner`; nothing recorded yet, event 0.
    pub fn new(inner: D) -> Self {
        RecordingDevice {
            inner,
            event: 0,
            regions: Vec::new(),
            open_regions: FxHashMap::default(),
            mappings: Vec::new(),
            open_mappings: BTreeMap::new(),
        }
    }

    /// The regions and mappings recorded so far.
    pub fn into_log(self) -> (Vec<Region>, Vec<Mapping>) {
        (self.regions, self.mappings)
    }

    fn open(&mut self, kind: RegionKind, base: u64, bytes: u64) {
        self.open_regions.insert(base, self.regions.len());
        self.regions.push(Region {
            kind,
            base,
            bytes,
            created: self.event,
            released: NEVER,
        });
    }

    fn close(&mut self, base: u64) {
        if let Some(i) = self.open_regions.remove(&base) {
            self.regions[i].released = self.event;
        }
    }
}

// Every other Device method (capacities, counters, creates, releases, set-access, the canary's
// fill and check) goes to the wrapped device as is; a recording is transparent.
gpumem_core::forward_device! {
    impl<D: Device> Device for RecordingDevice<D> => inner {
        fn alloc_segment(&mut self, bytes: u64) -> Result<u64, DeviceError> {
            let base = self.inner.alloc_segment(bytes)?;
            self.open(RegionKind::Segment, base, bytes);
            Ok(base)
        }
        fn free_segment(&mut self, addr: u64) -> Result<(), DeviceError> {
            self.inner.free_segment(addr)?;
            self.close(addr);
            Ok(())
        }
        fn reserve_va(&mut self, bytes: u64) -> Result<u64, DeviceError> {
            let va = self.inner.reserve_va(bytes)?;
            self.open(RegionKind::VaRange, va, bytes);
            Ok(va)
        }
        fn free_va(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            self.inner.free_va(va, bytes)?;
            self.close(va);
            Ok(())
        }
        fn map(&mut self, va: u64, bytes: u64, handle: PhysHandle) -> Result<(), DeviceError> {
            self.inner.map(va, bytes, handle)?;
            self.open_mappings.insert(va, self.mappings.len());
            self.mappings.push(Mapping {
                va,
                bytes,
                mapped: self.event,
                unmapped: NEVER,
            });
            Ok(())
        }
        fn unmap(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            self.inner.unmap(va, bytes)?;
            let end = va.saturating_add(bytes);
            let gone: Vec<u64> = self.open_mappings.range(va..end).map(|(&k, _)| k).collect();
            for k in gone {
                if let Some(i) = self.open_mappings.remove(&k) {
                    self.mappings[i].unmapped = self.event;
                }
            }
            Ok(())
        }
    }
}

/// The blocks of `trace` on `device` in allocation order (pre-existing ones first), with the
/// events that allocate and free them; `stacks[i]` is the stack id of event `i` of the trace
/// (all devices), when known.
pub fn trace_blocks(trace: &Trace, device: u32, stacks: &[Option<u32>]) -> Vec<TraceBlock> {
    let mut out = Vec::new();
    let mut live: FxHashMap<u64, usize> = FxHashMap::default();
    for p in trace.preexisting.iter().filter(|p| p.device == device) {
        live.insert(p.addr, out.len());
        out.push(TraceBlock {
            trace_addr: p.addr,
            requested_bytes: p.size_bytes,
            alloc_event: 0,
            free_event: NEVER,
            free_requested_event: NEVER,
            stack: None,
            stream: 0,
            align: gpumem_core::DEFAULT_ALIGN,
        });
    }
    let mut index = 0u64;
    for (i, e) in trace.events.iter().enumerate() {
        if e.device != device {
            continue;
        }
        match e.action {
            Action::Alloc => {
                if let Some(old) = live.insert(e.addr, out.len()) {
                    out[old].free_event = index;
                }
                out.push(TraceBlock {
                    trace_addr: e.addr,
                    requested_bytes: e.size_bytes,
                    alloc_event: index,
                    free_event: NEVER,
                    free_requested_event: NEVER,
                    stack: stacks.get(i).copied().flatten(),
                    stream: e.stream,
                    align: e.align.unwrap_or(gpumem_core::DEFAULT_ALIGN),
                });
            }
            Action::Free => {
                if let Some(b) = live.remove(&e.addr) {
                    out[b].free_event = index;
                }
            }
            Action::FreeRequested => {
                if let Some(&b) = live.get(&e.addr) {
                    out[b].free_requested_event = index;
                }
            }
            _ => {}
        }
        index += 1;
    }
    out
}

/// What a recording starts from and when it empties the cache, as
/// [`crate::replay::replay`] does, so that the map and the timelines show the allocator the
/// comparison table measured.
#[derive(Debug, Clone, Default)]
pub struct RecordSetup {
    /// Segments the recorded run held before its trace began
    /// ([`crate::replay::preexisting_segments`]): offered to the allocator
    /// ([`Allocator::adopt_segment`]) before the first event, with the pre-existing blocks in
    /// them; the blocks of a segment it does not adopt are allocated as usual.
    pub preexisting_segments: Vec<crate::replay::PreexistingSegment>,
    /// Events (the trace's events on the device, counted from 0, ascending) before which the
    /// allocator empties its cache: where the recorded run released its cache
    /// ([`crate::replay::cache_releases`]); empty for an allocator that does not honour them
    /// (only the `torch` emulation does).
    pub empty_cache_at: Vec<u64>,
}

/// Replays the blocks `blocks` (from [`trace_blocks`], `events` events in all) through
/// `alloc` on `dev`, starting from and emptying the cache as `setup` says, recording a
/// [`AllocatorRun`] with `columns` figure columns.
///
/// # Errors
/// An [`AllocError`] other than out-of-memory or a refused impossible request (a bug or a
/// device failure), with the event.
pub fn record<D: Device>(
    blocks: &[TraceBlock],
    events: u64,
    alloc: &mut dyn Allocator,
    dev: D,
    columns: usize,
    setup: &RecordSetup,
) -> Result<AllocatorRun, (u64, AllocError)> {
    let mut dev = RecordingDevice::new(dev);
    let mut placements: Vec<Option<Placement>> = vec![None; blocks.len()];
    // The pre-existing blocks come first in `blocks`, each at event 0.
    let mut first_at: FxHashMap<u64, usize> = FxHashMap::default();
    for (i, b) in blocks
        .iter()
        .enumerate()
        .take_while(|(_, b)| b.alloc_event == 0)
    {
        first_at.entry(b.trace_addr).or_insert(i);
    }
    let mut adopted = vec![false; blocks.len()];
    let segments = &setup.preexisting_segments;
    let taken = crate::replay::adopt_preexisting(alloc, &mut dev, segments).map_err(|e| (0, e))?;
    for (k, taken) in taken {
        for (addr, b) in segments[k].block_addrs.iter().zip(&taken) {
            if let Some(&i) = first_at.get(addr) {
                placements[i] = Some(Placement {
                    addr: b.addr,
                    allocated_bytes: b.allocated_bytes,
                });
                adopted[i] = true;
            }
        }
    }
    let mut empty_cache_at = setup.empty_cache_at.iter().copied().peekable();
    let mut cols = Columns::new(events, columns);
    // Frees in event order: (event, block index).
    let mut frees: Vec<(u64, usize)> = blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.free_event != NEVER)
        .map(|(i, b)| (b.free_event, i))
        .collect();
    frees.sort_unstable();
    let mut next_free = 0usize;
    // Frees that waited for other streams, in event order: only statistics change there
    // ([`Allocator::free_requested`]), as in the replay.
    let mut requests: Vec<(u64, usize)> = blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.free_requested_event != NEVER)
        .map(|(i, b)| (b.free_requested_event, i))
        .collect();
    requests.sort_unstable();
    let mut next_request = 0usize;
    let mut next_alloc = 0usize;
    let calls0 = dev.counters().total();
    let mut oom_count = 0u64;
    let mut refused_count = 0u64;
    let mut peak_reserved = 0u64;
    let mut peak_reserved_event = 0u64;
    // At event 0 the allocations come first: they include the pre-existing blocks, which
    // event 0 may free. At a later event the frees come first: an event is either one free or
    // one allocation, and a lenient read's duplicate allocation frees the old block first.
    for ev in 0..events.max(1) {
        dev.event = ev;
        if empty_cache_at.next_if_eq(&ev).is_some() {
            alloc.empty_cache(&mut dev).map_err(|e| (ev, e))?;
        }
        for step in if ev == 0 { [1, 0] } else { [0, 1] } {
            if step == 0 {
                while next_request < requests.len() && requests[next_request].0 == ev {
                    let b = requests[next_request].1;
                    next_request += 1;
                    if let Some(p) = placements[b] {
                        alloc
                            .free_requested(&mut dev, p.addr)
                            .map_err(|e| (ev, e))?;
                    }
                }
                while next_free < frees.len() && frees[next_free].0 == ev {
                    let b = frees[next_free].1;
                    next_free += 1;
                    if let Some(p) = placements[b] {
                        alloc.deallocate(&mut dev, p.addr).map_err(|e| (ev, e))?;
                    }
                }
                continue;
            }
            while next_alloc < blocks.len() && blocks[next_alloc].alloc_event == ev {
                let b = &blocks[next_alloc];
                if adopted[next_alloc] {
                    next_alloc += 1;
                    continue;
                }
                match alloc.allocate(&mut dev, b.requested_bytes, b.align, b.stream) {
                    Ok(block) => {
                        placements[next_alloc] = Some(Placement {
                            addr: block.addr,
                            allocated_bytes: block.allocated_bytes,
                        })
                    }
                    Err(e) if e.is_oom() => oom_count += 1,
                    Err(AllocError::InvalidAlignment { .. } | AllocError::Overflow { .. }) => {
                        refused_count += 1
                    }
                    Err(e) => return Err((ev, e)),
                }
                next_alloc += 1;
            }
        }
        let s = alloc.stats();
        if s.reserved_bytes.current > peak_reserved {
            peak_reserved = s.reserved_bytes.current;
            peak_reserved_event = ev;
        }
        cols.push(
            ev,
            [
                s.requested_bytes.current as f64,
                s.allocated_bytes.current as f64,
                s.reserved_bytes.current as f64,
                s.external_fragmentation(),
            ],
            dev.counters().total().saturating_sub(calls0) as f64,
        );
    }
    alloc.validate().map_err(|e| (events, e))?;
    let (regions, mappings) = dev.into_log();
    let mappings = coalesce(mappings);
    Ok(AllocatorRun {
        name: alloc.name().to_string(),
        strategy: Strategy::of(&*alloc),
        regions,
        mappings,
        placements,
        columns: cols,
        peak_reserved_event,
        oom_count,
        refused_count,
    })
}

/// Merges mappings that touch and were mapped and unmapped during the same events (a
/// page-mapped pool maps each page of a block with its own handle): the map cannot tell them
/// apart, and a million-event trace would otherwise carry millions of them. Returns them
/// ordered by (mapping event, address).
pub fn coalesce(mut m: Vec<Mapping>) -> Vec<Mapping> {
    m.sort_unstable_by_key(|x| (x.mapped, x.unmapped, x.va));
    let mut out: Vec<Mapping> = Vec::with_capacity(m.len());
    for x in m {
        match out.last_mut() {
            Some(l)
                if l.mapped == x.mapped && l.unmapped == x.unmapped && l.va + l.bytes == x.va =>
            {
                l.bytes += x.bytes
            }
            _ => out.push(x),
        }
    }
    out.sort_unstable_by_key(|x| (x.mapped, x.va));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A free that waits for another stream leaves the torch emulation's allocated bytes at
    /// its request in the recording too, so the report's timeline peaks where PyTorch's
    /// `allocated_bytes` did (traces/settings/stream_prefetch: 1,904,400,384 B).
    #[test]
    fn waiting_frees_leave_allocated_bytes_at_their_request() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../traces/settings/stream_prefetch.pickle.gz");
        let trace = crate::trace::read_path(&path, Default::default()).expect("reads");
        let blocks = trace_blocks(&trace, 0, &[]);
        assert_eq!(
            blocks
                .iter()
                .filter(|b| b.free_requested_event != NEVER)
                .count(),
            40
        );
        let events = trace.events.len() as u64;
        let mut torch = gpumem_core::torch::TorchCachingPool::new(&Default::default());
        let run = record(
            &blocks,
            events,
            &mut torch,
            gpumem_core::sim::SimDevice::default(),
            events as usize,
            &RecordSetup::default(),
        )
        .expect("records");
        let peak = run.columns.max[1].iter().fold(0.0f64, |a, &b| a.max(b));
        assert_eq!(peak as u64, 1_904_400_384);
    }

    fn m(va: u64, bytes: u64, mapped: u64, unmapped: u64) -> Mapping {
        Mapping {
            va,
            bytes,
            mapped,
            unmapped,
        }
    }

    #[test]
    fn coalesce_merges_only_touching_mappings_of_the_same_events() {
        let got = coalesce(vec![
            m(4, 2, 1, 9),
            m(0, 2, 1, 9),
            m(2, 2, 1, 9),
            m(6, 2, 1, 8),  // unmapped at another event
            m(10, 2, 1, 9), // not touching
            m(8, 2, 2, 9),  // mapped at another event
        ]);
        assert_eq!(
            got,
            vec![m(0, 6, 1, 9), m(6, 2, 1, 8), m(10, 2, 1, 9), m(8, 2, 2, 9)]
        );
    }

    /// A simulated device that keeps a canary's pattern calls, as the CUDA device serves them.
    struct Canary {
        inner: gpumem_core::sim::SimDevice,
        filled: Vec<(u64, u64, u32)>,
    }

    gpumem_core::forward_device! {
        impl Device for Canary => inner {
            fn fill_pattern(&mut self, addr: u64, bytes: u64, pattern: u32) -> Result<(), DeviceError> {
                self.filled.push((addr, bytes, pattern));
                Ok(())
            }
            fn check_pattern(&mut self, addr: u64, bytes: u64, pattern: u32) -> Result<bool, DeviceError> {
                Ok(self.filled.contains(&(addr, bytes, pattern)))
            }
        }
    }

    #[test]
    fn recording_forwards_the_calls_it_does_not_record() {
        let inner = Canary {
            inner: gpumem_core::sim::SimDevice::new(1 << 30),
            filled: Vec::new(),
        };
        let mut d = RecordingDevice::new(inner);
        d.event = 3;
        let base = d.alloc_segment(4 << 20).unwrap();
        d.fill_pattern(base, 4 << 20, 0xA5A5_A5A5).unwrap();
        assert!(d.check_pattern(base, 4 << 20, 0xA5A5_A5A5).unwrap());
        assert!(!d.check_pattern(base, 4 << 20, 0x5A5A_5A5A).unwrap());
        assert_eq!(d.used_bytes(), 4 << 20);
        assert_eq!(d.counters().total(), 1);
        d.event = 5;
        d.free_segment(base).unwrap();
        let (regions, mappings) = d.into_log();
        assert_eq!(regions.len(), 1);
        assert_eq!((regions[0].base, regions[0].bytes), (base, 4 << 20));
        assert_eq!((regions[0].created, regions[0].released), (3, 5));
        assert!(mappings.is_empty());
    }
}
