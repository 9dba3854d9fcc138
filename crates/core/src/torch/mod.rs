//! An emulation of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`,
//! `DeviceCachingAllocator`, PyTorch 2.11), under any `PYTORCH_CUDA_ALLOC_CONF`
//! ([`TorchConfig`]); without CUDA-graph private pools and without `record_stream` events
//! (every free completes at once, as `free_block` does when `stream_uses` is empty).
//!
//! The policy, function by function (the rooms of this module in brackets):
//! - `round_size` ([`sizes`]): a request is rounded up to a multiple of [`MIN_BLOCK_BYTES`]
//!   (512 B), at least 512 B; with `roundup_power2_divisions`, to the next division of its
//!   power-of-two interval.
//! - `get_pool`: rounded sizes up to [`SMALL_SIZE_BYTES`] (1 MiB) use the small pool, larger
//!   ones the large pool ([`PoolKind::for_size`]).
//! - `get_allocation_size`: a new segment (cudaMalloc) is [`SMALL_BUFFER_BYTES`] (2 MiB) for
//!   the small pool, [`LARGE_BUFFER_BYTES`] (20 MiB) for sizes below
//!   [`MIN_LARGE_ALLOC_BYTES`] (10 MiB), else the size rounded up to [`ROUND_LARGE_BYTES`]
//!   (2 MiB) ([`allocation_size`]).
//! - `get_free_block` (`blocks.rs`): free blocks are kept per pool in a set ordered by
//!   `(stream, size, address)`; the first block at or after `(stream, size, 0)` on the same
//!   stream is taken (best fit, lowest address among equals). With `max_split_size_mb`, a
//!   request below it never takes an oversize block (≥ `max_split_size`), and a request above
//!   it takes one only if it is less than `max_non_split_rounding_mb` (20 MiB) larger.
//! - `should_split`: a small-pool block is split when at least 512 B would remain, a
//!   large-pool block when more than 1 MiB would remain and the request is below
//!   `max_split_size`; with expandable segments every block splits when 512 B remain. The
//!   user's block takes the front, the remainder goes back to the pool.
//! - `free_block` / `try_merge_blocks`: a freed block merges with its free neighbours in the
//!   same segment (previous first, then next).
//! - `malloc`: free block, else (with a memory limit and `garbage_collection_threshold`)
//!   `garbage_collect_cached_blocks`, then `alloc_block` (cudaMalloc of the allocation size,
//!   refused without a call past the memory limit), else `release_available_cached_blocks`
//!   (oversize blocks only) and a retry, else `release_cached_blocks` (cudaFree of every
//!   whole free segment, large pool first; expandable segments unmap their free pages) and
//!   one retry counted in `num_alloc_retries`, else out-of-memory (`num_ooms`) (`release.rs`).
//!   Other driver errors end the call at once, as `C10_CUDA_CHECK` does.
//! - Expandable segments (`expandable_segments:True`, `expandable.rs`): one virtual range per
//!   stream and pool, 1⅛ × the device capacity, mapped in pages of 2 MiB (small pool) or
//!   20 MiB (large pool) at the lowest address that fits; pages are unmapped only by
//!   `release_cached_blocks` (`empty_cache` or an OOM).
//! - A request of 0 bytes gets a null block (address 0) without reserving anything or calling
//!   the device, as `NativeCachingAllocator::allocate` does.
//! - `emptyCache` is [`Allocator::empty_cache`].
//! - Not PyTorch, for replays: [`Allocator::adopt_segment`] takes in a cudaMalloc segment made
//!   before the emulation existed (a snapshot's segments that no event of its trace made)
//!   with its live blocks at their offsets and every other byte free, so that a replay starts
//!   from the state the recorded run was in (`gpumem::replay::preexisting_segments`).
//!
//! Statistics follow `torch.cuda.memory_stats()`: `allocated` counts block sizes,
//! `requested` the sizes users asked for, `reserved` segment sizes and mapped pages;
//! [`TorchStats`] adds `active`, `inactive_split`, the oversize counters and the device call
//! counters (for expandable segments, `num_device_alloc`/`num_device_free` count map and
//! unmap steps, as PyTorch does).
//!
//! Alignment: PyTorch's blocks are 512-byte aligned (segments from cudaMalloc are, and every
//! block size is a multiple of 512), so any power-of-two alignment up to 512 costs nothing
//! and follows PyTorch exactly. A larger power of two, up to the device granularity, is
//! honoured by asking for `align − 512` more bytes and handing out the first aligned address
//! inside the block (PyTorch has no such option; the block's `requested` stays the user's
//! size).
use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{AllocatorConfig, TorchConfig};
use crate::device::DeviceError;
use crate::{
    AllocError, Allocator, Block as UserBlock, Counter, Device, ForeignSegment, Stats, StatsTracker,
};

mod blocks;
mod expandable;
mod live;
mod release;
pub mod sizes;
#[cfg(test)]
mod tests;
mod validate;

use blocks::{Block, FreeSet, Slab, UnmappedSet, NIL};
pub use expandable::SMALL_GROW_AHEAD_BYTES;
use expandable::{ExpandableSegment, RangeToFree, Unreleased};
pub use sizes::{
    allocation_size, round_size, round_size_with, roundup_power2_next_division, should_split,
    should_split_with, PoolKind, LARGE_BUFFER_BYTES, MIN_BLOCK_BYTES, MIN_LARGE_ALLOC_BYTES,
    ROUND_LARGE_BYTES, SMALL_BUFFER_BYTES, SMALL_SIZE_BYTES,
};

/// The figures of `torch.cuda.memory_stats()` that [`Stats`] does not carry ("all" pools).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TorchStats {
    /// Blocks allocated or waiting for stream events (`active`). Without `record_stream`
    /// this equals the live allocations.
    pub active: Counter,
    /// Bytes of active blocks (`active_bytes`).
    pub active_bytes: Counter,
    /// Free blocks that are part of a split cudaMalloc segment, so cannot be cudaFree'd
    /// (`inactive_split`; expandable segments are left out, as in PyTorch).
    pub inactive_split: Counter,
    /// Bytes of those blocks (`inactive_split_bytes`).
    pub inactive_split_bytes: Counter,
    /// Allocated blocks of at least `max_split_size` (`oversize_allocations`).
    pub oversize_allocations: Counter,
    /// cudaMalloc segments of at least `max_split_size` (`oversize_segments`).
    pub oversize_segments: Counter,
    /// Successful cudaMalloc calls and expandable-segment map steps (`num_device_alloc`).
    pub num_device_alloc: u64,
    /// Successful cudaFree calls and expandable-segment unmap steps (`num_device_free`).
    pub num_device_free: u64,
    /// Retries of cudaMalloc after releasing the cache (`num_alloc_retries`).
    pub num_alloc_retries: u64,
    /// Allocations that ended in out-of-memory (`num_ooms`).
    pub num_ooms: u64,
}

/// A cudaMalloc segment (expandable segments are kept in [`ExpandableSegment`]).
#[derive(Debug, Clone, Copy)]
struct SegmentRec {
    bytes: u64,
    pool: PoolKind,
    stream: u64,
}

/// The PyTorch caching allocator emulation (see the module documentation).
///
/// ```
/// use gpumem_core::sim::SimDevice;
/// use gpumem_core::torch::TorchCachingPool;
/// use gpumem_core::Allocator;
///
/// let mut dev = SimDevice::default();
/// let mut torch = TorchCachingPool::new(&Default::default());
/// // 5 MiB is a "large" request between 1 and 10 MiB: PyTorch cudaMallocs 20 MiB.
/// let a = torch.allocate(&mut dev, 5 << 20, 512, 0)?;
/// assert_eq!(torch.stats().reserved_bytes.current, 20 << 20);
/// // The 15 MiB remainder serves the next request without another cudaMalloc.
/// let b = torch.allocate(&mut dev, 3 << 20, 512, 0)?;
/// assert_eq!(b.addr, a.addr + (5 << 20));
/// assert_eq!(torch.torch_stats().num_device_alloc, 1);
/// torch.deallocate(&mut dev, a.addr)?;
/// torch.deallocate(&mut dev, b.addr)?;
/// // Both blocks merged back into one free segment, which empty_cache gives back.
/// assert_eq!(torch.empty_cache(&mut dev)?, 20 << 20);
/// torch.validate()?;
/// # Ok::<(), gpumem_core::AllocError>(())
/// ```
#[derive(Debug, Default)]
pub struct TorchCachingPool {
    conf: TorchConfig,
    /// Every block, allocated, free or unmapped.
    slab: Slab,
    /// Free (mapped) blocks per pool (small, large).
    free: [FreeSet; 2],
    /// Unmapped ranges of expandable segments per pool.
    unmapped: [UnmappedSet; 2],
    /// cudaMalloc segments by base address.
    segments: BTreeMap<u64, SegmentRec>,
    /// Expandable segments by index (`None` once released).
    expandable: Vec<Option<ExpandableSegment>>,
    /// Physical handles of expandable segments whose cuMemRelease failed: unmapped, they
    /// hold their memory (counted as reserved) until the next release of the cache. Empty
    /// unless a driver call failed.
    unreleased: Vec<Unreleased>,
    /// Expandable segments with nothing mapped whose range a failed driver call kept from
    /// being given back (cuMemAddressFree) at a release of the cache: the next release gives
    /// it back. Empty unless a driver call failed.
    ranges_to_free: Vec<RangeToFree>,
    /// User address → slab index of its block (they differ only for alignments above 512).
    live: live::LiveMap,
    /// Null blocks (0-byte requests) handed out and not yet freed.
    null_blocks: u64,
    /// Slab indices of allocated blocks whose free was requested but waits for other streams
    /// ([`Allocator::free_requested`]): out of `allocated_bytes` already.
    free_pending: rustc_hash::FxHashSet<u32>,
    /// Bytes of all free mapped blocks.
    free_bytes: u64,
    /// Bytes taken from the device (`total_allocated_memory`).
    total_allocated: u64,
    /// `get_free_blocks_call_count` per pool (counted only while the garbage collector can run).
    get_free_calls: [u64; 2],
    tracker: StatsTracker,
    torch: TorchStats,
    /// Expandable segments map one physical handle per growth, not one per page: the
    /// `paged-lazy` strategy ([`TorchCachingPool::paged_lazy`]).
    coarse_handles: bool,
    /// With coarse handles: each growth of an expandable segment maps this share, in basis
    /// points (1/10,000), of the bytes already taken from the device beyond what the request
    /// needs ([`LazyConfig::grow_ahead_bp`](crate::config::LazyConfig::grow_ahead_bp)).
    grow_ahead_bp: u32,
}

/// What `alloc_block` came back with: a block, or `cudaErrorMemoryAllocation`.
type Found = Option<u32>;

/// A rounded request, as PyTorch's `AllocParams` carries it: the pool and stream it is for,
/// its `rounded` bytes and the `alloc_size` of a new segment for it.
#[derive(Debug, Clone, Copy)]
struct AllocParams {
    pool: PoolKind,
    stream: u64,
    rounded: u64,
    alloc_size: u64,
}

impl TorchCachingPool {
    /// A new, empty allocator under the settings of
    /// [`AllocatorConfig::torch`](crate::config::AllocatorConfig::torch) (native by default);
    /// no other field applies: PyTorch's sizes are fixed.
    pub fn new(config: &AllocatorConfig) -> Self {
        TorchCachingPool::with_conf(config.torch)
    }

    /// A new, empty allocator under `conf` (a parsed `PYTORCH_CUDA_ALLOC_CONF`).
    pub fn with_conf(conf: TorchConfig) -> Self {
        TorchCachingPool {
            conf,
            ..TorchCachingPool::default()
        }
    }

    /// The `paged-lazy` strategy's default placement
    /// ([`LazyPlacement::Segments`](crate::config::LazyPlacement::Segments)): PyTorch's
    /// expandable segments (`expandable_segments:True`, every other setting PyTorch's
    /// default; `config.torch` does not apply) with *coarse handles*: a growth of the segment
    /// creates, maps and opens one physical handle for all its pages (one cuMemCreate, one
    /// cuMemMap, one cuMemSetAccess) where PyTorch creates and maps one handle per 20 MiB
    /// page. Placement, splitting and the figures are PyTorch's; what differs is the
    /// driver calls, and that releasing the cache (`empty_cache`, an OOM) unmaps only the
    /// handles that lie whole inside free blocks (a handle cannot be unmapped in part). As
    /// the device fills, growths are cut into smaller handles (at most 1/8 of the memory a
    /// growth leaves free), so that an OOM can give back most of what PyTorch's pages give
    /// back, and the smallest device a run fits in stays close to `expandable_segments:True`'s
    /// while the calls on a device with room stay the same (BENCHMARKS.md, "Allocators on
    /// traces", **Smallest device**). Reports itself as `paged-lazy`.
    ///
    /// One more difference: a growth of the small pool's segment maps as many bytes as it
    /// holds beyond the pages the request needs, at most [`SMALL_GROW_AHEAD_BYTES`] (4 MiB,
    /// two pages), where PyTorch grows it one 2 MiB page at a time (three calls each, all
    /// through a run whose small blocks creep up).
    ///
    /// Its peak, steady-state driver calls and driver time on every shipped trace, against
    /// PyTorch's native allocator: BENCHMARKS.md, "Allocators on traces" and "Open targets: the
    /// default placement's peak and calls".
    ///
    /// Of `config`, only [`LazyConfig::grow_ahead_bp`](crate::config::LazyConfig::grow_ahead_bp)
    /// applies (0 by default: a growth maps what the request needs, as PyTorch does). It is
    /// this placement's trade: a growth that maps more than the request leaves the rest free
    /// at the end of the segment for the next requests, so a run whose peak creeps up step
    /// after step makes fewer growths (three calls each) and holds up to that share more at
    /// its peak: the default 0 holds the least memory, a small share such as 0.0156 (156 bp)
    /// removes most steady-state growths for a slightly higher peak (BENCHMARKS.md, "Open
    /// targets: the default placement's peak and calls").
    pub fn paged_lazy(config: &AllocatorConfig) -> Self {
        TorchCachingPool {
            conf: TorchConfig {
                expandable_segments: true,
                ..TorchConfig::default()
            },
            coarse_handles: true,
            grow_ahead_bp: config.lazy.grow_ahead_bp,
            ..TorchCachingPool::default()
        }
    }

    /// The settings emulated.
    pub fn conf(&self) -> &TorchConfig {
        &self.conf
    }

    /// The `torch.cuda.memory_stats()` figures beyond [`Stats`].
    pub fn torch_stats(&self) -> TorchStats {
        self.torch
    }

    /// Live segments as `(base address, bytes, pool)`, in address order: cudaMalloc segments,
    /// and each mapped run of pages of an expandable segment (as PyTorch's snapshot lists
    /// them).
    pub fn segments(&self) -> Vec<(u64, u64, PoolKind)> {
        let mut out: Vec<(u64, u64, PoolKind)> = self
            .segments
            .iter()
            .map(|(&a, s)| (a, s.bytes, s.pool))
            .collect();
        for es in self.expandable.iter().flatten() {
            for (start, bytes) in es.mapped_runs() {
                out.push((start, bytes, es.pool));
            }
        }
        out.sort_unstable_by_key(|s| s.0);
        out
    }

    /// The memory limit on `dev` (`allowed_memory_maximum`), if any.
    fn allowed(&self, dev: &dyn Device) -> Option<u64> {
        self.conf.allowed_bytes(dev.capacity_bytes())
    }

    /// Whether the garbage collector and its age counting are on.
    fn gc_active(&self, dev: &dyn Device) -> bool {
        self.conf.garbage_collection_threshold > 0.0 && self.allowed(dev).is_some()
    }

    /// `insert_into_blocks`: puts the free mapped block `i` into its pool's set.
    #[inline]
    fn insert_free(&mut self, i: u32) {
        let b = self.slab.get_mut(i);
        let p = b.pool.index();
        b.gc_base = self.get_free_calls[p];
        let (stream, size, addr) = (b.stream, b.size, b.addr);
        self.free[p].insert(stream, size, addr, i);
        self.free_bytes += size;
    }

    /// Takes the free mapped block `i` out of its pool's set.
    #[inline]
    fn remove_free(&mut self, i: u32) {
        let b = *self.slab.get(i);
        if self.free[b.pool.index()].remove(b.stream, b.size, b.addr) {
            self.free_bytes -= b.size;
        }
    }

    /// `get_free_block`: the best-fitting free block on `stream` that the `max_split_size`
    /// rules allow, taken out of the pool.
    fn get_free_block(&mut self, gc: bool, pool: PoolKind, stream: u64, rounded: u64) -> Found {
        let p = pool.index();
        if gc {
            self.get_free_calls[p] += 1;
        }
        // The search walks on from where it found a block (`pos`), never searching again.
        let (_, mut idx, mut pos) = self.free[p].lower_bound_pos(stream, rounded)?;
        if self.slab.get(idx).is_expandable() {
            if self.conf.expandable_segments {
                // Best fit counts the unmapped space after a block as part of it, so a block
                // that could grow is chosen only when no fixed block fits as well. (A block
                // with no unmapped range after it is never passed over: every block after
                // it in the set is at least as large. Checked first, it saves a step.)
                while self.grows(idx) {
                    let Some((_, nidx, npos)) = self.free[p].next_pos(stream, pos) else {
                        break;
                    };
                    if !self.slab.get(idx).is_expandable()
                        || self.expandable_size(nidx) >= self.expandable_size(idx)
                    {
                        break;
                    }
                    (idx, pos) = (nidx, npos);
                }
            } else {
                // Expandable segments were turned off: only fixed blocks serve.
                loop {
                    (_, idx, pos) = self.free[p].next_pos(stream, pos)?;
                    if !self.slab.get(idx).is_expandable() {
                        break;
                    }
                }
            }
        }
        let size = self.slab.get(idx).size;
        let max_split = self.conf.max_split_size_bytes;
        if rounded < max_split && size >= max_split {
            return None;
        }
        if rounded >= max_split
            && size >= rounded.saturating_add(self.conf.max_non_split_rounding_bytes)
        {
            return None;
        }
        // Take the block out where the search found it.
        if self.free[p]
            .remove_at(stream, pos)
            .is_some_and(|(_, i)| i == idx)
        {
            self.free_bytes -= size;
            return Some(idx);
        }
        None
    }

    /// Whether an unmapped range follows block `i` (its `expandable_size` exceeds its size).
    #[inline]
    fn grows(&self, i: u32) -> bool {
        let next = self.slab.get(i).next;
        next != NIL && !self.slab.get(next).mapped
    }

    /// A block's size plus the unmapped range right after it (`expandable_size`).
    fn expandable_size(&self, i: u32) -> u64 {
        let b = self.slab.get(i);
        let grow = if b.next != NIL && !self.slab.get(b.next).mapped {
            self.slab.get(b.next).size
        } else {
            0
        };
        b.size + grow
    }

    /// `alloc_block`: a new segment (cudaMalloc of `alloc_size`), or room mapped in an
    /// expandable segment for `rounded` bytes. `Ok(None)` when the device (or the memory
    /// limit) refuses for lack of memory. The block is not in any free set.
    fn alloc_block(
        &mut self,
        dev: &mut dyn Device,
        params: AllocParams,
        is_retry: bool,
    ) -> Result<Found, DeviceError> {
        let AllocParams {
            pool,
            stream,
            rounded,
            alloc_size,
        } = params;
        if is_retry {
            self.torch.num_alloc_retries += 1;
            self.tracker.stats.alloc_retries += 1;
        }
        // The limit refuses without a call. (Under `limit_to_capacity` alone the limit is the
        // device's capacity, which refuses the same cudaMalloc itself: the device then sees
        // the demand it refused, which the smallest-capacity search reads.)
        let limit = TorchConfig {
            limit_to_capacity: false,
            ..self.conf
        }
        .allowed_bytes(dev.capacity_bytes());
        if let Some(allowed) = limit {
            if self.total_allocated.saturating_add(alloc_size) > allowed {
                return Ok(None);
            }
        }
        if self.conf.expandable_segments {
            return self.try_allocate_expandable_block(dev, stream, pool, rounded);
        }
        let addr = match dev.alloc_segment(alloc_size) {
            Ok(a) => a,
            Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if addr == 0 || !addr.is_multiple_of(MIN_BLOCK_BYTES) {
            // Every PyTorch block address is a non-null multiple of 512; a device that breaks
            // this cannot be emulated. Give the segment back and refuse.
            let _ = dev.free_segment(addr);
            return Err(DeviceError::Invalid {
                call: "cuMemAlloc",
                detail: format!("segment {addr:#x} is null or not {MIN_BLOCK_BYTES}-byte aligned"),
            });
        }
        self.segments.insert(
            addr,
            SegmentRec {
                bytes: alloc_size,
                pool,
                stream,
            },
        );
        let i = self.slab.insert(Block {
            addr,
            size: alloc_size,
            requested: 0,
            stream,
            gc_base: 0,
            prev: NIL,
            next: NIL,
            segment: NIL,
            pool,
            allocated: false,
            mapped: true,
        });
        self.total_allocated += alloc_size;
        self.tracker.on_reserve(alloc_size);
        if alloc_size >= self.conf.max_split_size_bytes {
            self.torch.oversize_segments.add(1);
        }
        self.torch.num_device_alloc += 1;
        Ok(Some(i))
    }

    /// `alloc_found_block`: hands out the (already removed from its set) block `i` for a
    /// rounded request, splitting off the remainder when `split`. Returns the block's bytes.
    fn alloc_found_block(&mut self, i: u32, rounded: u64, requested: u64, split: bool) -> u64 {
        let b = *self.slab.get(i);
        let already_split = b.is_split();
        let plain = !b.is_expandable();
        let mut size = b.size;
        if split {
            let rest = self.split_at(i, b.addr + rounded);
            let r = self.slab.get_mut(rest);
            r.requested = 0;
            r.allocated = false;
            r.mapped = true;
            size = rounded;
            self.insert_free(rest);
            if plain {
                if already_split {
                    // An already split free block shrinks by `rounded` bytes.
                    self.torch.inactive_split_bytes.sub(rounded);
                } else {
                    self.torch.inactive_split_bytes.add(b.size - rounded);
                    self.torch.inactive_split.add(1);
                }
            }
        } else if already_split && plain {
            self.torch.inactive_split_bytes.sub(b.size);
            self.torch.inactive_split.sub(1);
        }
        self.mark_allocated(i, requested, size);
        size
    }

    /// Marks block `i` of `size` bytes allocated for `requested` bytes and counts it as
    /// PyTorch does (active, active bytes, oversize).
    fn mark_allocated(&mut self, i: u32, requested: u64, size: u64) {
        let bm = self.slab.get_mut(i);
        bm.allocated = true;
        bm.requested = requested;
        self.tracker.on_alloc(requested, size);
        self.torch.active.add(1);
        self.torch.active_bytes.add(size);
        if size >= self.conf.max_split_size_bytes {
            self.torch.oversize_allocations.add(1);
        }
    }

    /// Splits block `i` at address `at` (inside it): the part from `at` on becomes a new
    /// block right after `i`, with `i`'s other fields; returns its index. Neither part enters
    /// or leaves a set.
    fn split_at(&mut self, i: u32, at: u64) -> u32 {
        let b = *self.slab.get(i);
        let rest = self.slab.insert(Block {
            addr: at,
            size: b.addr + b.size - at,
            prev: i,
            ..b
        });
        if b.next != NIL {
            self.slab.get_mut(b.next).prev = rest;
        }
        let bm = self.slab.get_mut(i);
        bm.next = rest;
        bm.size = at - b.addr;
        rest
    }

    /// The live blocks of a foreign segment as `(offset, bytes, requested)`, checked: in
    /// address order, not overlapping, 512-byte aligned, holding their request, of this
    /// pool's sizes, and each inside the segment (`inside(offset, end)`). `None` for a layout
    /// PyTorch cannot have made.
    fn foreign_blocks(
        &self,
        seg: &ForeignSegment,
        inside: impl Fn(u64, u64) -> bool,
    ) -> Option<Vec<(u64, u64, u64)>> {
        let mut out = Vec::with_capacity(seg.blocks.len());
        let mut at = 0u64;
        for b in &seg.blocks {
            let bytes = match b.allocated_bytes {
                Some(a) => a,
                None => round_size_with(b.requested_bytes.max(1), &self.conf)?,
            };
            let end = b.offset.checked_add(bytes)?;
            let ok = b.offset >= at
                && inside(b.offset, end)
                && b.offset.is_multiple_of(MIN_BLOCK_BYTES)
                && bytes > 0
                && bytes.is_multiple_of(MIN_BLOCK_BYTES)
                && bytes >= b.requested_bytes
                && (!seg.small_pool || bytes <= SMALL_SIZE_BYTES);
            if !ok {
                return None;
            }
            out.push((b.offset, bytes, b.requested_bytes));
            at = end;
        }
        Some(out)
    }

    /// Hands out the adopted live `blocks` (`(offset from base, bytes, requested)`, checked by
    /// [`TorchCachingPool::foreign_blocks`]) at their addresses, each cut out of the free
    /// mapped block of the segment starting at block `first` that holds it; the parts left
    /// over stay free.
    fn carve_adopted(
        &mut self,
        first: u32,
        base: u64,
        blocks: &[(u64, u64, u64)],
    ) -> Result<Vec<UserBlock>, AllocError> {
        let mut out = Vec::with_capacity(blocks.len());
        let mut cur = first;
        for &(off, bytes, requested) in blocks {
            let want = base + off;
            while cur != NIL {
                let c = self.slab.get(cur);
                if c.addr <= want && want < c.addr + c.size {
                    break;
                }
                cur = c.next;
            }
            let holds = cur != NIL && {
                let f = self.slab.get(cur);
                f.mapped && !f.allocated && want + bytes <= f.addr + f.size
            };
            if !holds {
                return Err(AllocError::Internal(format!(
                    "adopting a segment: no free mapped block holds {want:#x}+{bytes}"
                )));
            }
            self.remove_free(cur);
            let mut live = cur;
            if want > self.slab.get(cur).addr {
                live = self.split_at(cur, want);
                self.insert_free(cur);
            }
            if self.slab.get(live).size > bytes {
                let rest = self.split_at(live, want + bytes);
                self.insert_free(rest);
            }
            self.mark_allocated(live, requested, bytes);
            self.live.insert(want, live);
            out.push(UserBlock {
                addr: want,
                requested_bytes: requested,
                allocated_bytes: bytes,
            });
            cur = self.slab.get(live).next;
        }
        Ok(out)
    }

    /// `try_merge_blocks`: merges the free or unmapped neighbour `src` into `dst` when both
    /// are free with the same mapping; returns the bytes taken in (0 if none). `dst` must be
    /// out of every set; `src` leaves its set.
    fn try_merge(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let s = *self.slab.get(src);
        let d = *self.slab.get(dst);
        if s.allocated || s.mapped != d.mapped {
            return 0;
        }
        if s.mapped {
            self.remove_free(src);
        } else {
            self.unmapped[s.pool.index()].remove(&(s.stream, s.addr));
        }
        if d.prev == src {
            let dm = self.slab.get_mut(dst);
            dm.addr = s.addr;
            dm.prev = s.prev;
            if s.prev != NIL {
                self.slab.get_mut(s.prev).next = dst;
            }
        } else {
            self.slab.get_mut(dst).next = s.next;
            if s.next != NIL {
                self.slab.get_mut(s.next).prev = dst;
            }
        }
        self.slab.get_mut(dst).size += s.size;
        self.slab.remove(src);
        s.size
    }

    /// `free_block`: marks the block free, merges it with free neighbours (previous, then
    /// next) and puts the result into its pool.
    fn free_block(&mut self, i: u32) {
        let b = *self.slab.get(i);
        let original = b.size;
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        {
            let bm = self.slab.get_mut(i);
            bm.allocated = false;
            bm.requested = 0;
        }
        for cand in [b.prev, b.next] {
            let subsumed = self.try_merge(i, cand);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.insert_free(i);
        let after = *self.slab.get(i);
        if after.is_split() {
            net_blocks += 1;
            net_bytes += after.size as i64;
        }
        if !after.is_expandable() {
            apply_net(&mut self.torch.inactive_split, net_blocks);
            apply_net(&mut self.torch.inactive_split_bytes, net_bytes);
        }
        if self.free_pending.remove(&i) {
            // `allocated_bytes`, the allocation count and the oversize count went at the
            // request (PyTorch's `free()`); the rest goes now (its `free_block`).
            self.tracker.stats.requested_bytes.sub(b.requested);
            self.tracker.stats.free_calls += 1;
        } else {
            self.tracker.on_free(b.requested, original);
            if original >= self.conf.max_split_size_bytes {
                self.torch.oversize_allocations.sub(1);
            }
        }
        self.torch.active.sub(1);
        self.torch.active_bytes.sub(original);
    }

    fn oom(&self, requested_bytes: u64) -> AllocError {
        AllocError::OutOfMemory {
            requested_bytes,
            free_bytes: self.free_bytes,
            largest_free_bytes: self.largest_free(),
        }
    }

    fn largest_free(&self) -> u64 {
        self.free[0].largest().max(self.free[1].largest())
    }

    /// `malloc` once the request is rounded: a cached block, else a new one through the
    /// release-and-retry ladder. `Ok(None)` is out-of-memory.
    fn find_or_alloc(
        &mut self,
        dev: &mut dyn Device,
        params: AllocParams,
    ) -> Result<Found, AllocError> {
        let AllocParams {
            pool,
            stream,
            rounded,
            ..
        } = params;
        let gc = self.gc_active(dev);
        if let Some(i) = self.get_free_block(gc, pool, stream, rounded) {
            return Ok(Some(i));
        }
        if self.coarse_handles && rounded > dev.capacity_bytes() {
            // `paged-lazy` refuses a block larger than the whole device without a call: it
            // cannot be mapped, and trying makes a handle per page until the device is full,
            // then releases them all, twice (28,638 calls for one 8 EiB request). The
            // emulation of PyTorch (`torch`) makes the calls PyTorch makes.
            return Ok(None);
        }
        if gc {
            self.garbage_collect_cached_blocks(dev)?;
        }
        if let Some(i) = self.alloc_block(dev, params, false)? {
            return Ok(Some(i));
        }
        if self.release_available_cached_blocks(dev, pool, stream, rounded)? {
            if let Some(i) = self.alloc_block(dev, params, false)? {
                return Ok(Some(i));
            }
        }
        self.release_cached_blocks(dev)?;
        Ok(self.alloc_block(dev, params, true)?)
    }
}

/// Adds a signed change to a counter (PyTorch's `increase_stat` / `decrease_stat`).
fn apply_net(c: &mut Counter, delta: i64) {
    if delta > 0 {
        c.add(delta.unsigned_abs());
    } else if delta < 0 {
        c.sub(delta.unsigned_abs());
    }
}

impl Allocator for TorchCachingPool {
    fn name(&self) -> &'static str {
        if self.coarse_handles {
            "paged-lazy"
        } else {
            "torch"
        }
    }

    /// PyTorch's `DeviceCachingAllocator::malloc` (see the module documentation).
    ///
    /// `size_bytes == 0` returns a null block (address 0, nothing reserved, no device call),
    /// as PyTorch does. When the device runs out of memory, the released cache stays
    /// released even if the retry fails, as in PyTorch.
    fn allocate(
        &mut self,
        dev: &mut dyn Device,
        size_bytes: u64,
        align: u64,
        stream: u64,
    ) -> Result<UserBlock, AllocError> {
        let max_align = dev.granularity_bytes().max(MIN_BLOCK_BYTES);
        if !crate::align::is_pow2(align) || align > max_align {
            return Err(AllocError::InvalidAlignment {
                align,
                max: max_align,
            });
        }
        if size_bytes == 0 {
            self.null_blocks += 1;
            return Ok(UserBlock {
                addr: 0,
                requested_bytes: 0,
                allocated_bytes: 0,
            });
        }
        let overflow = AllocError::Overflow { size_bytes, align };
        let padded = if align > MIN_BLOCK_BYTES {
            // At least one byte must follow the aligned address inside the block.
            size_bytes
                .checked_add(align - MIN_BLOCK_BYTES)
                .ok_or(overflow.clone())?
        } else {
            size_bytes
        };
        let rounded = round_size_with(padded, &self.conf).ok_or(overflow.clone())?;
        let pool = PoolKind::for_size(rounded);
        let alloc_size = allocation_size(rounded).ok_or(overflow)?;
        let params = AllocParams {
            pool,
            stream,
            rounded,
            alloc_size,
        };
        let Some(i) = self.find_or_alloc(dev, params)? else {
            self.torch.num_ooms += 1;
            return Err(self.oom(size_bytes));
        };
        let b = *self.slab.get(i);
        let split = should_split_with(b.pool, b.size, rounded, &self.conf);
        let allocated_bytes = self.alloc_found_block(i, rounded, size_bytes, split);
        let user_addr = if align > MIN_BLOCK_BYTES {
            crate::align::align_up(b.addr, align)
                .ok_or_else(|| AllocError::Internal(format!("aligning {:#x} overflows", b.addr)))?
        } else {
            b.addr
        };
        self.live.insert(user_addr, i);
        Ok(UserBlock {
            addr: user_addr,
            requested_bytes: size_bytes,
            allocated_bytes,
        })
    }

    /// PyTorch's `free` → `free_block` (no stream uses, so the free completes at once). The
    /// null block (address 0) is accepted while one is outstanding.
    fn deallocate(&mut self, dev: &mut dyn Device, addr: u64) -> Result<(), AllocError> {
        let _ = dev;
        let Some(i) = self.live.remove(addr) else {
            if addr == 0 && self.null_blocks > 0 {
                self.null_blocks -= 1;
                return Ok(());
            }
            return Err(AllocError::UnknownBlock { addr });
        };
        if !self.slab.get(i).allocated {
            self.live.insert(addr, i);
            return Err(AllocError::Internal(format!(
                "live address {addr:#x} maps to a block that is not allocated"
            )));
        }
        self.free_block(i);
        Ok(())
    }

    /// PyTorch's `free()` for a block with stream uses: `allocated_bytes`, the allocation
    /// count and `oversize_allocations` drop now; the block stays out of the pool (and in
    /// `requested_bytes`, `active`) until [`Allocator::deallocate`] completes the free. A
    /// second request for the same block changes nothing.
    fn free_requested(&mut self, dev: &mut dyn Device, addr: u64) -> Result<(), AllocError> {
        let _ = dev;
        let Some(i) = self.live.get(addr) else {
            if addr == 0 && self.null_blocks > 0 {
                return Ok(());
            }
            return Err(AllocError::UnknownBlock { addr });
        };
        let b = *self.slab.get(i);
        if b.allocated && self.free_pending.insert(i) {
            self.tracker.stats.allocated_bytes.sub(b.size);
            self.tracker.stats.allocation_count.sub(1);
            if b.size >= self.conf.max_split_size_bytes {
                self.torch.oversize_allocations.sub(1);
            }
        }
        Ok(())
    }

    /// `emptyCache` → `release_cached_blocks`: cudaFree of every segment that is wholly free,
    /// and the free pages of expandable segments unmapped. Returns the bytes given back.
    fn empty_cache(&mut self, dev: &mut dyn Device) -> Result<u64, AllocError> {
        self.release_cached_blocks(dev)
    }

    fn stats(&self) -> Stats {
        let mut s = self.tracker.stats;
        s.free_bytes = self.free_bytes;
        s.largest_free_bytes = self.largest_free();
        s.inactive_split_bytes = self.torch.inactive_split_bytes;
        s
    }

    fn reserved_bytes(&self) -> crate::Counter {
        self.tracker.stats.reserved_bytes
    }

    fn validate(&self) -> Result<(), AllocError> {
        validate::validate(self)
    }

    /// Adopts a segment of a recorded run (see [`Allocator::adopt_segment`]): a cudaMalloc
    /// segment when the emulation runs without expandable segments, an expandable one (its
    /// mapped pages, [`ForeignSegment::mapped`]) under `expandable_segments`. Free stretches
    /// become free blocks of its pool (merged, as PyTorch keeps them), its live blocks
    /// allocated blocks. Nothing is adopted (`Ok(None)`) for `paged-lazy`, for a segment of
    /// the other kind, for an expandable segment when one of its pool exists already, or for
    /// a layout PyTorch cannot have made: a size or offset not a multiple of 512 bytes
    /// (mapped runs: of the page), blocks out of order, overlapping or outside the segment
    /// (or its mapped runs), a block smaller than its request, a small-pool block above 1 MiB.
    fn adopt_segment(
        &mut self,
        dev: &mut dyn Device,
        seg: &ForeignSegment,
    ) -> Result<Option<Vec<UserBlock>>, AllocError> {
        if self.coarse_handles {
            return Ok(None);
        }
        match (&seg.mapped, self.conf.expandable_segments) {
            (Some(runs), true) => return self.adopt_expandable(dev, seg, runs),
            (None, false) => {}
            _ => return Ok(None),
        }
        let pool = if seg.small_pool {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        if seg.bytes == 0 || !seg.bytes.is_multiple_of(MIN_BLOCK_BYTES) {
            return Ok(None);
        }
        let Some(live) = self.foreign_blocks(seg, |_, end| end <= seg.bytes) else {
            return Ok(None);
        };
        let params = AllocParams {
            pool,
            stream: seg.stream,
            rounded: seg.bytes,
            alloc_size: seg.bytes,
        };
        let Some(first) = self.alloc_block(dev, params, false)? else {
            return Err(self.oom(seg.bytes));
        };
        self.insert_free(first);
        let base = self.slab.get(first).addr;
        let out = self.carve_adopted(first, base, &live)?;
        // The free parts of a segment that holds other blocks are `inactive_split`.
        let mut i = first;
        if self.slab.get(i).next != NIL {
            while i != NIL {
                let b = *self.slab.get(i);
                if !b.allocated {
                    self.torch.inactive_split.add(1);
                    self.torch.inactive_split_bytes.add(b.size);
                }
                i = b.next;
            }
        }
        Ok(Some(out))
    }
}
