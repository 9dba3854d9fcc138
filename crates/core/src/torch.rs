//! An emulation of PyTorch's native CUDA caching allocator
//! (`c10/cuda/CUDACachingAllocator.cpp`, `DeviceCachingAllocator`, PyTorch 2.11) with its
//! default settings: no `max_split_size`, no `roundup_power2_divisions`, no expandable
//! segments, no garbage collection, no CUDA-graph private pools, no `record_stream`
//! events (every free completes at once, as `free_block` does when `stream_uses` is empty).
//!
//! The policy, function by function:
//! - `round_size`: a request is rounded up to a multiple of [`MIN_BLOCK_BYTES`] (512 B),
//!   and to at least 512 B ([`round_size`]).
//! - `get_pool`: rounded sizes up to [`SMALL_SIZE_BYTES`] (1 MiB) use the small pool,
//!   larger ones the large pool ([`PoolKind::for_size`]).
//! - `get_allocation_size`: a new segment (cudaMalloc) is [`SMALL_BUFFER_BYTES`] (2 MiB) for
//!   the small pool, [`LARGE_BUFFER_BYTES`] (20 MiB) for sizes below
//!   [`MIN_LARGE_ALLOC_BYTES`] (10 MiB), else the size rounded up to [`ROUND_LARGE_BYTES`]
//!   (2 MiB) ([`allocation_size`]).
//! - `get_free_block`: free blocks are kept per pool in a set ordered by
//!   `(stream, size, address)`; the first block at or after `(stream, size, 0)` on the same
//!   stream is taken (best fit, lowest address among equals).
//! - `should_split`: a small-pool block is split when at least 512 B would remain, a
//!   large-pool block when more than 1 MiB would remain ([`should_split`]). The user's block
//!   takes the front, the remainder goes back to the pool.
//! - `free_block` / `try_merge_blocks`: a freed block merges with its free neighbours in the
//!   same segment (previous first, then next).
//! - `malloc`: free block, else `alloc_block` (cudaMalloc of the allocation size), else (on
//!   `cudaErrorMemoryAllocation` only) `release_cached_blocks` (cudaFree of every free
//!   block that is a whole segment, large pool first) and one retry counted in
//!   `num_alloc_retries`, else out-of-memory (`num_ooms`). Other driver errors end the call
//!   at once, as `C10_CUDA_CHECK` does.
//! - `emptyCache` is [`Allocator::empty_cache`].
//!
//! Statistics follow `torch.cuda.memory_stats()`: `allocated` counts block sizes,
//! `requested` the sizes users asked for, `reserved` segment sizes; [`TorchStats`] adds
//! `active`, `inactive_split`, and the device call counters.
//!
//! Alignment: PyTorch's blocks are 512-byte aligned (segments from cudaMalloc are, and every
//! block size is a multiple of 512), so any power-of-two alignment up to 512 costs nothing
//! and follows PyTorch exactly. A larger power of two, up to the device granularity, is
//! honoured by asking for `align − 512` more bytes and handing out the first aligned address
//! inside the block (PyTorch has no such option; the block's `requested` stays the user's
//! size).
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::config::AllocatorConfig;
use crate::device::DeviceError;
use crate::{AllocError, Allocator, Block, Counter, Device, Stats, StatsTracker};

/// Every block size is a multiple of this, in bytes (`kMinBlockSize`).
pub const MIN_BLOCK_BYTES: u64 = 512;
/// Largest rounded request served by the small pool, in bytes (`kSmallSize`, 1 MiB).
pub const SMALL_SIZE_BYTES: u64 = 1 << 20;
/// Size of a small-pool segment, in bytes (`kSmallBuffer`, 2 MiB).
pub const SMALL_BUFFER_BYTES: u64 = 2 << 20;
/// Size of the segment made for a request between 1 and 10 MiB, in bytes
/// (`kLargeBuffer`, 20 MiB).
pub const LARGE_BUFFER_BYTES: u64 = 20 << 20;
/// Requests from this size on get a segment of their own size, in bytes
/// (`kMinLargeAlloc`, 10 MiB).
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 << 20;
/// Larger segments are rounded up to a multiple of this, in bytes (`kRoundLarge`, 2 MiB).
pub const ROUND_LARGE_BYTES: u64 = 2 << 20;

/// PyTorch's `round_size` with default settings: `size_bytes` rounded up to a multiple of
/// [`MIN_BLOCK_BYTES`], at least [`MIN_BLOCK_BYTES`]; `None` on overflow.
pub fn round_size(size_bytes: u64) -> Option<u64> {
    if size_bytes < MIN_BLOCK_BYTES {
        Some(MIN_BLOCK_BYTES)
    } else {
        crate::align::align_up(size_bytes, MIN_BLOCK_BYTES)
    }
}

/// PyTorch's `get_allocation_size`: bytes of the segment cudaMalloc'd for a rounded request
/// of `rounded_bytes` when no cached block fits; `None` on overflow.
pub fn allocation_size(rounded_bytes: u64) -> Option<u64> {
    if rounded_bytes <= SMALL_SIZE_BYTES {
        Some(SMALL_BUFFER_BYTES)
    } else if rounded_bytes < MIN_LARGE_ALLOC_BYTES {
        Some(LARGE_BUFFER_BYTES)
    } else {
        crate::align::align_up(rounded_bytes, ROUND_LARGE_BYTES)
    }
}

/// Which of PyTorch's two block pools a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Blocks of segments made for requests up to 1 MiB (`small_blocks`).
    Small,
    /// Everything else (`large_blocks`).
    Large,
}

impl PoolKind {
    /// PyTorch's `get_pool`: the pool serving a rounded request of `rounded_bytes`.
    pub fn for_size(rounded_bytes: u64) -> PoolKind {
        if rounded_bytes <= SMALL_SIZE_BYTES {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }
}

/// PyTorch's `should_split` (no `max_split_size`): whether a free block of `block_bytes`
/// chosen for a rounded request of `rounded_bytes` in `pool` is split. Small pool: when at
/// least [`MIN_BLOCK_BYTES`] remain; large pool: when more than [`SMALL_SIZE_BYTES`] remain.
pub fn should_split(pool: PoolKind, block_bytes: u64, rounded_bytes: u64) -> bool {
    let remaining = block_bytes.saturating_sub(rounded_bytes);
    match pool {
        PoolKind::Small => remaining >= MIN_BLOCK_BYTES,
        PoolKind::Large => remaining > SMALL_SIZE_BYTES,
    }
}

/// The figures of `torch.cuda.memory_stats()` that [`Stats`] does not carry ("all" pools).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TorchStats {
    /// Blocks allocated or waiting for stream events (`active`). Without `record_stream`
    /// this equals the live allocations.
    pub active: Counter,
    /// Bytes of active blocks (`active_bytes`).
    pub active_bytes: Counter,
    /// Free blocks that are part of a split segment, so cannot be cudaFree'd
    /// (`inactive_split`).
    pub inactive_split: Counter,
    /// Bytes of those blocks (`inactive_split_bytes`).
    pub inactive_split_bytes: Counter,
    /// Successful cudaMalloc calls (`num_device_alloc`).
    pub num_device_alloc: u64,
    /// Successful cudaFree calls (`num_device_free`).
    pub num_device_free: u64,
    /// Retries of cudaMalloc after releasing the cache (`num_alloc_retries`).
    pub num_alloc_retries: u64,
    /// Allocations that ended in out-of-memory (`num_ooms`).
    pub num_ooms: u64,
}

/// One block: a range of a segment, allocated or free.
#[derive(Debug, Clone, Copy)]
struct BlockRec {
    /// Bytes of the block (a multiple of 512).
    size: u64,
    /// Bytes the user asked for (0 while free).
    requested: u64,
    stream: u64,
    pool: PoolKind,
    /// Address of the previous block of the same segment.
    prev: Option<u64>,
    /// Address of the next block of the same segment.
    next: Option<u64>,
    allocated: bool,
}

impl BlockRec {
    fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

/// One segment from cudaMalloc.
#[derive(Debug, Clone, Copy)]
struct SegmentRec {
    bytes: u64,
    pool: PoolKind,
    stream: u64,
}

/// Key of a free block in a pool: PyTorch's `BlockComparatorSize` order.
type FreeKey = (u64, u64, u64); // (stream, size, addr)

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
    /// Every block, allocated or free, by its address.
    blocks: HashMap<u64, BlockRec>,
    /// Every segment by its base address.
    segments: BTreeMap<u64, SegmentRec>,
    /// Free blocks of the small pool, ordered by (stream, size, address).
    small_free: BTreeSet<FreeKey>,
    /// Free blocks of the large pool, ordered by (stream, size, address).
    large_free: BTreeSet<FreeKey>,
    /// Multiset of free block sizes (size → count), for `largest_free_bytes`.
    free_sizes: BTreeMap<u64, u64>,
    /// Bytes of all free blocks.
    free_bytes: u64,
    /// User address → block address (they differ only for alignments above 512).
    live: HashMap<u64, u64>,
    tracker: StatsTracker,
    torch: TorchStats,
}

impl TorchCachingPool {
    /// A new, empty allocator. No [`AllocatorConfig`](crate::config::AllocatorConfig) field applies: PyTorch's sizes are fixed.
    pub fn new(config: &AllocatorConfig) -> Self {
        let _ = config;
        TorchCachingPool::default()
    }

    /// The `torch.cuda.memory_stats()` figures beyond [`Stats`].
    pub fn torch_stats(&self) -> TorchStats {
        self.torch
    }

    /// Live segments as `(base address, bytes, pool)`, in address order.
    pub fn segments(&self) -> Vec<(u64, u64, PoolKind)> {
        self.segments
            .iter()
            .map(|(&a, s)| (a, s.bytes, s.pool))
            .collect()
    }

    fn free_set(&mut self, pool: PoolKind) -> &mut BTreeSet<FreeKey> {
        match pool {
            PoolKind::Small => &mut self.small_free,
            PoolKind::Large => &mut self.large_free,
        }
    }

    fn free_set_ref(&self, pool: PoolKind) -> &BTreeSet<FreeKey> {
        match pool {
            PoolKind::Small => &self.small_free,
            PoolKind::Large => &self.large_free,
        }
    }

    /// Puts the free block at `addr` into its pool's set and the size multiset.
    fn insert_free(&mut self, addr: u64, b: &BlockRec) {
        self.free_set(b.pool).insert((b.stream, b.size, addr));
        *self.free_sizes.entry(b.size).or_insert(0) += 1;
        self.free_bytes += b.size;
    }

    /// Takes the free block at `addr` out of its pool's set and the size multiset.
    fn remove_free(&mut self, addr: u64, b: &BlockRec) {
        self.free_set(b.pool).remove(&(b.stream, b.size, addr));
        if let Some(n) = self.free_sizes.get_mut(&b.size) {
            *n -= 1;
            if *n == 0 {
                self.free_sizes.remove(&b.size);
            }
        }
        self.free_bytes -= b.size;
    }

    /// `get_free_block`: the best-fitting free block on `stream`, taken out of the pool.
    fn take_free_block(&mut self, pool: PoolKind, stream: u64, rounded: u64) -> Option<u64> {
        let key = self
            .free_set_ref(pool)
            .range((stream, rounded, 0)..)
            .next()
            .copied()
            .filter(|k| k.0 == stream)?;
        let addr = key.2;
        let b = *self.blocks.get(&addr)?;
        self.remove_free(addr, &b);
        Some(addr)
    }

    /// `alloc_block`: one cudaMalloc of `bytes`; the new segment is one unsplit block that
    /// is not in any free set yet (PyTorch hands it straight to `alloc_found_block`).
    fn alloc_segment(
        &mut self,
        dev: &mut dyn Device,
        bytes: u64,
        pool: PoolKind,
        stream: u64,
    ) -> Result<u64, DeviceError> {
        let addr = dev.alloc_segment(bytes)?;
        if addr % MIN_BLOCK_BYTES != 0 {
            // Every PyTorch block address is a multiple of 512; a device that breaks this
            // cannot be emulated. Give the segment back and refuse.
            let _ = dev.free_segment(addr);
            return Err(DeviceError::Invalid {
                call: "cuMemAlloc",
                detail: format!("segment {addr:#x} is not {MIN_BLOCK_BYTES}-byte aligned"),
            });
        }
        self.segments.insert(
            addr,
            SegmentRec {
                bytes,
                pool,
                stream,
            },
        );
        self.blocks.insert(
            addr,
            BlockRec {
                size: bytes,
                requested: 0,
                stream,
                pool,
                prev: None,
                next: None,
                allocated: false,
            },
        );
        self.tracker.on_reserve(bytes);
        self.torch.num_device_alloc += 1;
        Ok(addr)
    }

    /// `release_cached_blocks`: cudaFree of every free block that is a whole segment, large
    /// pool first, each in `(stream, size, address)` order. Returns the bytes released.
    fn release_cached_blocks(&mut self, dev: &mut dyn Device) -> Result<u64, AllocError> {
        let mut released = 0u64;
        for pool in [PoolKind::Large, PoolKind::Small] {
            let whole: Vec<FreeKey> = self
                .free_set_ref(pool)
                .iter()
                .copied()
                .filter(|k| {
                    self.blocks
                        .get(&k.2)
                        .is_some_and(|b| b.prev.is_none() && b.next.is_none())
                })
                .collect();
            for (_, size, addr) in whole {
                dev.free_segment(addr)?;
                let Some(b) = self.blocks.remove(&addr) else {
                    return Err(AllocError::Internal(format!(
                        "free block {addr:#x} vanished during release"
                    )));
                };
                self.remove_free(addr, &b);
                self.segments.remove(&addr);
                self.tracker.on_release(size);
                self.torch.num_device_free += 1;
                released += size;
            }
        }
        Ok(released)
    }

    /// `alloc_found_block`: hands out the (already removed from its set) block at `addr`
    /// for a rounded request, splitting off the remainder when `should_split` says so.
    fn alloc_found_block(
        &mut self,
        addr: u64,
        rounded: u64,
        requested: u64,
    ) -> Result<u64, AllocError> {
        let Some(mut b) = self.blocks.get(&addr).copied() else {
            return Err(AllocError::Internal(format!("block {addr:#x} not found")));
        };
        let already_split = b.is_split();
        if should_split(b.pool, b.size, rounded) {
            let rest_addr = addr + rounded;
            let rest = BlockRec {
                size: b.size - rounded,
                requested: 0,
                stream: b.stream,
                pool: b.pool,
                prev: Some(addr),
                next: b.next,
                allocated: false,
            };
            if let Some(n) = b.next {
                match self.blocks.get_mut(&n) {
                    Some(nb) => nb.prev = Some(rest_addr),
                    None => {
                        return Err(AllocError::Internal(format!(
                            "next block {n:#x} of {addr:#x} not found"
                        )))
                    }
                }
            }
            self.blocks.insert(rest_addr, rest);
            self.insert_free(rest_addr, &rest);
            b.size = rounded;
            b.next = Some(rest_addr);
            if already_split {
                // An already split free block shrinks by `rounded` bytes.
                self.torch.inactive_split_bytes.sub(rounded);
            } else {
                self.torch.inactive_split_bytes.add(rest.size);
                self.torch.inactive_split.add(1);
            }
        } else if already_split {
            self.torch.inactive_split_bytes.sub(b.size);
            self.torch.inactive_split.sub(1);
        }
        b.allocated = true;
        b.requested = requested;
        self.blocks.insert(addr, b);
        self.tracker.on_alloc(requested, b.size);
        self.torch.active.add(1);
        self.torch.active_bytes.add(b.size);
        Ok(b.size)
    }

    /// `free_block`: marks the block free, merges it with free neighbours (previous, then
    /// next) and puts the result into its pool.
    fn free_block(&mut self, addr: u64) -> Result<(), AllocError> {
        let Some(mut b) = self.blocks.get(&addr).copied() else {
            return Err(AllocError::UnknownBlock { addr });
        };
        let original_size = b.size;
        let requested = b.requested;
        let mut start = addr;
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        if let Some(p) = b.prev {
            if let Some(pb) = self.blocks.get(&p).copied().filter(|pb| !pb.allocated) {
                self.remove_free(p, &pb);
                self.blocks.remove(&p);
                start = p;
                b.size += pb.size;
                b.prev = pb.prev;
                net_blocks -= 1;
                net_bytes -= pb.size as i64;
            }
        }
        if let Some(n) = b.next {
            if let Some(nb) = self.blocks.get(&n).copied().filter(|nb| !nb.allocated) {
                self.remove_free(n, &nb);
                self.blocks.remove(&n);
                b.size += nb.size;
                b.next = nb.next;
                net_blocks -= 1;
                net_bytes -= nb.size as i64;
            }
        }
        if start != addr {
            self.blocks.remove(&addr);
        }
        if let Some(p) = b.prev {
            if let Some(pb) = self.blocks.get_mut(&p) {
                pb.next = Some(start);
            }
        }
        if let Some(n) = b.next {
            if let Some(nb) = self.blocks.get_mut(&n) {
                nb.prev = Some(start);
            }
        }
        b.allocated = false;
        b.requested = 0;
        self.blocks.insert(start, b);
        self.insert_free(start, &b);
        if b.is_split() {
            net_blocks += 1;
            net_bytes += b.size as i64;
        }
        apply_net(&mut self.torch.inactive_split, net_blocks);
        apply_net(&mut self.torch.inactive_split_bytes, net_bytes);
        self.tracker.on_free(requested, original_size);
        self.torch.active.sub(1);
        self.torch.active_bytes.sub(original_size);
        Ok(())
    }

    fn oom(&self, requested_bytes: u64) -> AllocError {
        AllocError::OutOfMemory {
            requested_bytes,
            free_bytes: self.free_bytes,
            largest_free_bytes: self.largest_free(),
        }
    }

    fn largest_free(&self) -> u64 {
        self.free_sizes.keys().next_back().copied().unwrap_or(0)
    }

    fn internal(msg: String) -> AllocError {
        AllocError::Internal(msg)
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
        "torch"
    }

    /// PyTorch's `DeviceCachingAllocator::malloc` (see the module documentation).
    ///
    /// `size_bytes == 0` takes a 512-byte block (PyTorch itself returns a null pointer
    /// without calling `malloc`). When cudaMalloc runs out of memory, the cached whole
    /// segments are released and stay released even if the retry fails, as in PyTorch.
    fn allocate(
        &mut self,
        dev: &mut dyn Device,
        size_bytes: u64,
        align: u64,
        stream: u64,
    ) -> Result<Block, AllocError> {
        let max_align = dev.granularity_bytes().max(MIN_BLOCK_BYTES);
        if !crate::align::is_pow2(align) || align > max_align {
            return Err(AllocError::InvalidAlignment {
                align,
                max: max_align,
            });
        }
        let overflow = AllocError::Overflow { size_bytes, align };
        let padded = if align > MIN_BLOCK_BYTES {
            // At least one byte must follow the aligned address inside the block, or an
            // empty request would get an address just past its block (its neighbour's).
            size_bytes
                .max(1)
                .checked_add(align - MIN_BLOCK_BYTES)
                .ok_or(overflow.clone())?
        } else {
            size_bytes
        };
        let rounded = round_size(padded).ok_or(overflow.clone())?;
        let pool = PoolKind::for_size(rounded);
        let seg_bytes = allocation_size(rounded).ok_or(overflow)?;

        let addr = match self.take_free_block(pool, stream, rounded) {
            Some(a) => a,
            None => match self.alloc_segment(dev, seg_bytes, pool, stream) {
                Ok(a) => a,
                Err(DeviceError::OutOfMemory { .. }) => {
                    // release_available_cached_blocks does nothing without max_split_size;
                    // release_cached_blocks, then one retry.
                    self.release_cached_blocks(dev)?;
                    self.torch.num_alloc_retries += 1;
                    self.tracker.stats.alloc_retries += 1;
                    match self.alloc_segment(dev, seg_bytes, pool, stream) {
                        Ok(a) => a,
                        Err(DeviceError::OutOfMemory { .. }) => {
                            self.torch.num_ooms += 1;
                            return Err(self.oom(size_bytes));
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            },
        };
        let allocated_bytes = self.alloc_found_block(addr, rounded, size_bytes)?;
        let user_addr = if align > MIN_BLOCK_BYTES {
            crate::align::align_up(addr, align)
                .ok_or_else(|| Self::internal(format!("aligning {addr:#x} overflows")))?
        } else {
            addr
        };
        self.live.insert(user_addr, addr);
        Ok(Block {
            addr: user_addr,
            requested_bytes: size_bytes,
            allocated_bytes,
        })
    }

    /// PyTorch's `free` → `free_block` (no stream uses, so the free completes at once).
    fn deallocate(&mut self, dev: &mut dyn Device, addr: u64) -> Result<(), AllocError> {
        let _ = dev;
        let Some(&block_addr) = self.live.get(&addr) else {
            return Err(AllocError::UnknownBlock { addr });
        };
        if !self.blocks.get(&block_addr).is_some_and(|b| b.allocated) {
            return Err(Self::internal(format!(
                "live address {addr:#x} maps to {block_addr:#x}, which is not an allocated block"
            )));
        }
        self.free_block(block_addr)?;
        self.live.remove(&addr);
        Ok(())
    }

    /// `emptyCache` → `release_cached_blocks`: cudaFree of every segment that is wholly free.
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

    fn validate(&self) -> Result<(), AllocError> {
        let bad = |m: String| Err(AllocError::Internal(m));
        let mut seen_blocks = 0usize;
        let mut free_blocks = 0usize;
        let (mut allocated, mut requested, mut reserved, mut free) = (0u64, 0u64, 0u64, 0u64);
        let (mut live_blocks, mut split_free, mut split_free_bytes) = (0u64, 0u64, 0u64);
        for (&base, seg) in &self.segments {
            reserved += seg.bytes;
            let mut at = base;
            let mut prev: Option<u64> = None;
            let mut prev_free = false;
            let end = base + seg.bytes;
            loop {
                let Some(b) = self.blocks.get(&at) else {
                    return bad(format!("segment {base:#x}: no block at {at:#x}"));
                };
                seen_blocks += 1;
                if b.prev != prev {
                    return bad(format!("block {at:#x}: prev link {:?} ≠ {prev:?}", b.prev));
                }
                if b.size == 0 || b.size % MIN_BLOCK_BYTES != 0 || at % MIN_BLOCK_BYTES != 0 {
                    return bad(format!(
                        "block {at:#x}: size {} or address unaligned",
                        b.size
                    ));
                }
                if b.pool != seg.pool || b.stream != seg.stream {
                    return bad(format!(
                        "block {at:#x}: pool/stream differ from its segment"
                    ));
                }
                if b.allocated {
                    allocated += b.size;
                    requested += b.requested;
                    live_blocks += 1;
                    prev_free = false;
                } else {
                    if prev_free {
                        return bad(format!("block {at:#x}: two neighbouring free blocks"));
                    }
                    if !self.free_set_ref(b.pool).contains(&(b.stream, b.size, at)) {
                        return bad(format!("free block {at:#x} missing from its pool"));
                    }
                    free_blocks += 1;
                    free += b.size;
                    if b.is_split() {
                        split_free += 1;
                        split_free_bytes += b.size;
                    }
                    prev_free = true;
                }
                let next_at = at + b.size;
                match b.next {
                    Some(n) if n == next_at && n < end => {
                        prev = Some(at);
                        at = n;
                    }
                    None if next_at == end => break,
                    other => {
                        return bad(format!(
                            "block {at:#x}+{}: next {other:?} does not tile segment {base:#x}+{}",
                            b.size, seg.bytes
                        ))
                    }
                }
            }
        }
        if seen_blocks != self.blocks.len() {
            return bad(format!(
                "{} blocks recorded, {seen_blocks} reachable from segments",
                self.blocks.len()
            ));
        }
        if free_blocks != self.small_free.len() + self.large_free.len() {
            return bad(format!(
                "{free_blocks} free blocks, {} in the pools",
                self.small_free.len() + self.large_free.len()
            ));
        }
        if free_blocks as u64 != self.free_sizes.values().sum::<u64>() || free != self.free_bytes {
            return bad("free size multiset or free bytes out of step".into());
        }
        if self.live.len() as u64 != live_blocks {
            return bad(format!(
                "{} live addresses, {live_blocks} allocated blocks",
                self.live.len()
            ));
        }
        for (&u, &a) in &self.live {
            if !self.blocks.get(&a).is_some_and(|b| b.allocated) {
                return bad(format!("live address {u:#x} maps to non-allocated {a:#x}"));
            }
        }
        let s = &self.tracker.stats;
        let t = &self.torch;
        let checks = [
            ("allocated_bytes", s.allocated_bytes.current, allocated),
            ("requested_bytes", s.requested_bytes.current, requested),
            ("reserved_bytes", s.reserved_bytes.current, reserved),
            (
                "segment_count",
                s.segment_count.current,
                self.segments.len() as u64,
            ),
            ("allocation_count", s.allocation_count.current, live_blocks),
            ("active", t.active.current, live_blocks),
            ("active_bytes", t.active_bytes.current, allocated),
            ("inactive_split", t.inactive_split.current, split_free),
            (
                "inactive_split_bytes",
                t.inactive_split_bytes.current,
                split_free_bytes,
            ),
        ];
        for (name, counter, actual) in checks {
            if counter != actual {
                return bad(format!("{name}: counter {counter}, actual {actual}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::sim::SimDevice;
    use std::collections::BTreeMap;

    const MIB: u64 = 1 << 20;

    fn new() -> (TorchCachingPool, SimDevice) {
        (
            TorchCachingPool::new(&AllocatorConfig::default()),
            SimDevice::default(),
        )
    }

    fn alloc(t: &mut TorchCachingPool, d: &mut SimDevice, size: u64) -> Block {
        let b = t.allocate(d, size, 512, 0).expect("allocate");
        t.validate().expect("valid");
        b
    }

    fn free(t: &mut TorchCachingPool, d: &mut SimDevice, addr: u64) {
        t.deallocate(d, addr).expect("deallocate");
        t.validate().expect("valid");
    }

    #[test]
    fn rounding_follows_round_size() {
        assert_eq!(round_size(0), Some(512));
        assert_eq!(round_size(1), Some(512));
        assert_eq!(round_size(511), Some(512));
        assert_eq!(round_size(512), Some(512));
        assert_eq!(round_size(513), Some(1024));
        assert_eq!(round_size(1_000_000), Some(1_000_448));
        assert_eq!(round_size(u64::MAX), None);
        let (mut t, mut d) = new();
        let b = alloc(&mut t, &mut d, 513);
        assert_eq!((b.requested_bytes, b.allocated_bytes), (513, 1024));
        let s = t.stats();
        assert_eq!(s.requested_bytes.current, 513);
        assert_eq!(s.allocated_bytes.current, 1024);
    }

    #[test]
    fn pool_choice_and_segment_sizes() {
        assert_eq!(PoolKind::for_size(MIB), PoolKind::Small);
        assert_eq!(PoolKind::for_size(MIB + 512), PoolKind::Large);
        assert_eq!(allocation_size(MIB), Some(2 * MIB));
        assert_eq!(allocation_size(MIB + 512), Some(20 * MIB));
        assert_eq!(allocation_size(10 * MIB - 512), Some(20 * MIB));
        assert_eq!(allocation_size(10 * MIB), Some(10 * MIB));
        assert_eq!(allocation_size(10 * MIB + 512), Some(12 * MIB));
        for (req, seg, pool) in [
            (MIB, 2 * MIB, PoolKind::Small),
            (5 * MIB, 20 * MIB, PoolKind::Large),
            (11 * MIB, 12 * MIB, PoolKind::Large),
        ] {
            let (mut t, mut d) = new();
            alloc(&mut t, &mut d, req);
            let segs = t.segments();
            assert_eq!(segs.len(), 1, "request {req}");
            assert_eq!((segs[0].1, segs[0].2), (seg, pool), "request {req}");
            assert_eq!(t.stats().reserved_bytes.current, seg);
            assert_eq!(d.used_bytes(), seg);
            assert_eq!(t.torch_stats().num_device_alloc, 1);
        }
    }

    #[test]
    fn split_thresholds() {
        assert!(should_split(PoolKind::Small, 2 * MIB, 2 * MIB - 512));
        assert!(!should_split(PoolKind::Small, 2 * MIB, 2 * MIB));
        assert!(should_split(PoolKind::Large, 20 * MIB, 19 * MIB - 512));
        assert!(!should_split(PoolKind::Large, 20 * MIB, 19 * MIB));

        // Small pool: 1 MiB + 512 B left of a 2 MiB segment is split off.
        let (mut t, mut d) = new();
        let a = alloc(&mut t, &mut d, MIB - 512);
        assert_eq!(a.allocated_bytes, MIB - 512);
        assert_eq!(t.torch_stats().inactive_split_bytes.current, MIB + 512);
        assert_eq!(t.torch_stats().inactive_split.current, 1);

        // Large pool: 12 MiB request in a 12 MiB segment: no split. A 19 MiB request from
        // a cached 20 MiB block leaves exactly 1 MiB: not split either.
        let (mut t, mut d) = new();
        let b = alloc(&mut t, &mut d, 5 * MIB); // 20 MiB segment, 15 MiB remainder split
        assert_eq!(b.allocated_bytes, 5 * MIB);
        free(&mut t, &mut d, b.addr);
        let c = alloc(&mut t, &mut d, 19 * MIB);
        assert_eq!(c.allocated_bytes, 20 * MIB);
        assert_eq!(c.addr, b.addr);
        assert_eq!(t.torch_stats().inactive_split.current, 0);
        free(&mut t, &mut d, c.addr);
        let e = alloc(&mut t, &mut d, 19 * MIB - 512);
        assert_eq!(e.allocated_bytes, 19 * MIB - 512);
        assert_eq!(t.torch_stats().inactive_split_bytes.current, MIB + 512);
        assert_eq!(t.torch_stats().num_device_alloc, 1);
    }

    #[test]
    fn merge_on_free() {
        let (mut t, mut d) = new();
        let a = alloc(&mut t, &mut d, 4096);
        let b = alloc(&mut t, &mut d, 4096);
        let c = alloc(&mut t, &mut d, 4096);
        assert_eq!(b.addr, a.addr + 4096);
        assert_eq!(c.addr, b.addr + 4096);
        free(&mut t, &mut d, a.addr);
        free(&mut t, &mut d, c.addr); // merges with the tail remainder
        assert_eq!(t.torch_stats().inactive_split.current, 2);
        assert_eq!(t.stats().largest_free_bytes, 2 * MIB - 8192);
        free(&mut t, &mut d, b.addr); // merges both sides: the segment is whole again
        let s = t.stats();
        assert_eq!(s.largest_free_bytes, 2 * MIB);
        assert_eq!(s.free_bytes, 2 * MIB);
        assert_eq!(t.torch_stats().inactive_split.current, 0);
        assert_eq!(t.torch_stats().inactive_split_bytes.current, 0);
        // The whole segment can be handed out again at its base.
        let w = alloc(&mut t, &mut d, MIB);
        assert_eq!(w.addr, a.addr);
        assert_eq!(t.empty_cache(&mut d).expect("release"), 0);
        free(&mut t, &mut d, w.addr);
        assert_eq!(t.empty_cache(&mut d).expect("release"), 2 * MIB);
        assert_eq!(d.live_objects(), (0, 0, 0, 0));
        assert_eq!(t.stats().reserved_bytes.current, 0);
        assert_eq!(t.torch_stats().num_device_free, 1);
    }

    #[test]
    fn reuse_is_best_fit_then_lowest_address() {
        let (mut t, mut d) = new();
        // Three large blocks in one 20 MiB segment with gaps of 3 and 2 MiB.
        let a = alloc(&mut t, &mut d, 3 * MIB);
        let _k1 = alloc(&mut t, &mut d, 2 * MIB);
        let b = alloc(&mut t, &mut d, 2 * MIB);
        let _k2 = alloc(&mut t, &mut d, 2 * MIB);
        free(&mut t, &mut d, a.addr);
        free(&mut t, &mut d, b.addr);
        // 2 MiB fits the 2 MiB hole best, not the first (3 MiB) hole nor the 11 MiB tail.
        let c = alloc(&mut t, &mut d, 2 * MIB);
        assert_eq!(c.addr, b.addr);
        // Equal sizes: the lower address wins.
        let e = alloc(&mut t, &mut d, 2 * MIB + 512);
        assert_eq!(e.addr, a.addr);
        assert_eq!(t.torch_stats().num_device_alloc, 1);
    }

    #[test]
    fn streams_do_not_share_blocks() {
        let (mut t, mut d) = new();
        let a = t.allocate(&mut d, 4096, 512, 1).expect("alloc");
        t.deallocate(&mut d, a.addr).expect("free");
        let b = t.allocate(&mut d, 4096, 512, 2).expect("alloc");
        assert_ne!(t.segments()[0].0, t.segments()[1].0);
        assert_eq!(t.torch_stats().num_device_alloc, 2);
        let c = t.allocate(&mut d, 4096, 512, 1).expect("alloc");
        assert_eq!(c.addr, a.addr);
        assert_ne!(b.addr, a.addr);
        t.validate().expect("valid");
    }

    #[test]
    fn oom_releases_cache_then_retries() {
        let mut d = SimDevice::new(24 * MIB);
        let mut t = TorchCachingPool::new(&AllocatorConfig::default());
        let a = alloc(&mut t, &mut d, 12 * MIB); // a 12 MiB segment
        let before = t.stats();
        // 8 MiB wants a 20 MiB segment: 12 + 20 > 24, nothing cached to release.
        let e = t
            .allocate(&mut d, 8 * MIB, 512, 0)
            .expect_err("must not fit");
        assert!(e.is_oom(), "{e}");
        t.validate().expect("valid");
        assert_eq!(t.torch_stats().num_ooms, 1);
        assert_eq!(t.torch_stats().num_alloc_retries, 1);
        let after = t.stats();
        assert_eq!(after.reserved_bytes, before.reserved_bytes);
        assert_eq!(after.allocated_bytes, before.allocated_bytes);
        assert_eq!(after.allocation_count, before.allocation_count);
        // With `a` freed its segment is cached; 14 MiB does not fit in it, the cudaMalloc
        // of 14 MiB fails (12 + 14 > 24), the cache is released, and the retry succeeds.
        free(&mut t, &mut d, a.addr);
        assert_eq!(t.stats().reserved_bytes.current, 12 * MIB);
        let b = alloc(&mut t, &mut d, 14 * MIB);
        assert_eq!(b.allocated_bytes, 14 * MIB);
        let ts = t.torch_stats();
        assert_eq!(
            (ts.num_alloc_retries, ts.num_device_free, ts.num_ooms),
            (2, 1, 1)
        );
        assert_eq!(ts.num_device_alloc, 2);
        assert_eq!(t.stats().reserved_bytes.current, 14 * MIB);
        assert_eq!(t.stats().reserved_bytes.peak, 14 * MIB);
        assert_eq!(t.stats().alloc_retries, 2);
        assert_eq!(d.used_bytes(), 14 * MIB);
    }

    #[test]
    fn fault_at_cuda_malloc_changes_nothing() {
        let (mut t, mut d) = new();
        let a = alloc(&mut t, &mut d, 4096); // call 0
        let before = t.stats();
        d.inject_fault_at(Some(d.calls_made()));
        // A large request needs cudaMalloc, which fails with a non-OOM error: reported at
        // once, no cache release, no retry (C10_CUDA_CHECK).
        let e = t.allocate(&mut d, 50 * MIB, 512, 0).expect_err("fault");
        assert!(
            matches!(e, AllocError::Device(DeviceError::Driver { .. })),
            "{e}"
        );
        assert!(!e.is_oom());
        t.validate().expect("valid");
        assert_eq!(t.stats(), before);
        assert_eq!(t.torch_stats().num_alloc_retries, 0);
        assert_eq!(t.torch_stats().num_device_alloc, 1);
        // The small pool still serves from its cached segment without the device.
        let b = alloc(&mut t, &mut d, 4096);
        assert_eq!(b.addr, a.addr + 4096);
        // And the device works again.
        let c = alloc(&mut t, &mut d, 50 * MIB);
        assert_eq!(c.allocated_bytes, 50 * MIB);
        assert_eq!(t.torch_stats().num_device_alloc, 2);
    }

    #[test]
    fn fault_at_cuda_free_during_release_keeps_state_valid() {
        let mut d = SimDevice::new(30 * MIB);
        let mut t = TorchCachingPool::new(&AllocatorConfig::default());
        let a = alloc(&mut t, &mut d, 12 * MIB);
        free(&mut t, &mut d, a.addr);
        // cudaMalloc (OOM) is the next call, then the cudaFree of the cached segment.
        d.inject_fault_at(Some(d.calls_made() + 1));
        let e = t.allocate(&mut d, 20 * MIB, 512, 0).expect_err("fault");
        assert!(
            matches!(e, AllocError::Device(DeviceError::Driver { .. })),
            "{e}"
        );
        t.validate().expect("valid");
        assert_eq!(t.stats().reserved_bytes.current, 12 * MIB);
        assert_eq!(t.stats().allocation_count.current, 0);
        let b = alloc(&mut t, &mut d, 20 * MIB);
        assert_eq!(b.allocated_bytes, 20 * MIB);
        assert_eq!(t.stats().reserved_bytes.current, 20 * MIB);
    }

    #[test]
    fn alignment_up_to_granularity() {
        let (mut t, mut d) = new();
        for align in [1, 256, 512] {
            let b = t.allocate(&mut d, 100, align, 0).expect("alloc");
            assert_eq!(b.allocated_bytes, 512);
        }
        let _spacer = alloc(&mut t, &mut d, 512);
        let b = t.allocate(&mut d, 100, 4096, 0).expect("alloc");
        assert_eq!(b.addr % 4096, 0);
        assert_eq!(b.requested_bytes, 100);
        assert_eq!(b.allocated_bytes, 4096);
        t.validate().expect("valid");
        t.deallocate(&mut d, b.addr).expect("free");
        let big = t.allocate(&mut d, 3 * MIB, 2 * MIB, 0).expect("alloc");
        assert_eq!(big.addr % (2 * MIB), 0);
        t.validate().expect("valid");
        for bad in [0, 3, 4 * MIB] {
            assert!(matches!(
                t.allocate(&mut d, 100, bad, 0),
                Err(AllocError::InvalidAlignment { .. })
            ));
        }
        assert!(matches!(
            t.allocate(&mut d, u64::MAX - 100, 512, 0),
            Err(AllocError::Overflow { .. })
        ));
        assert!(matches!(
            t.allocate(&mut d, u64::MAX - 100, 4096, 0),
            Err(AllocError::Overflow { .. })
        ));
        t.validate().expect("valid");
    }

    #[test]
    fn unknown_and_double_free_change_nothing() {
        let (mut t, mut d) = new();
        let a = alloc(&mut t, &mut d, 4096);
        assert!(matches!(
            t.deallocate(&mut d, a.addr + 512),
            Err(AllocError::UnknownBlock { .. })
        ));
        free(&mut t, &mut d, a.addr);
        let s = t.stats();
        assert!(matches!(
            t.deallocate(&mut d, a.addr),
            Err(AllocError::UnknownBlock { .. })
        ));
        assert_eq!(t.stats(), s);
        t.validate().expect("valid");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc {
            size: u64,
            stream: u64,
            align_shift: u32,
        },
        Free(usize),
        Release,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            5 => (0u64..3 * MIB, 0u64..2, 0u32..13).prop_map(|(size, stream, a)| Op::Alloc {
                size,
                stream,
                align_shift: a,
            }),
            2 => (3 * MIB..40 * MIB, 0u64..2).prop_map(|(size, stream)| Op::Alloc {
                size,
                stream,
                align_shift: 9,
            }),
            5 => any::<usize>().prop_map(Op::Free),
            1 => Just(Op::Release),
        ]
    }

    proptest::proptest! {
        #[test]
        fn random_operations_keep_every_invariant(ops in proptest::collection::vec(op(), 1..200)) {
            let mut d = SimDevice::new(128 * MIB);
            let mut t = TorchCachingPool::new(&AllocatorConfig::default());
            // user address -> end of the user's bytes
            let mut live: BTreeMap<u64, u64> = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Alloc { size, stream, align_shift } => {
                        let align = 1u64 << align_shift;
                        let before = t.stats();
                        match t.allocate(&mut d, size, align, stream) {
                            Ok(b) => {
                                proptest::prop_assert_eq!(b.addr % align, 0);
                                proptest::prop_assert!(b.allocated_bytes >= size);
                                let end = b.addr + size.max(1);
                                if let Some((_, &pe)) = live.range(..=b.addr).next_back() {
                                    proptest::prop_assert!(pe <= b.addr, "overlap below");
                                }
                                if let Some((&na, _)) = live.range(b.addr..).next() {
                                    proptest::prop_assert!(na >= end, "overlap above");
                                }
                                live.insert(b.addr, end);
                            }
                            Err(e) => {
                                proptest::prop_assert!(e.is_oom(), "{}", e);
                                let after = t.stats();
                                proptest::prop_assert_eq!(after.allocated_bytes, before.allocated_bytes);
                                proptest::prop_assert_eq!(after.requested_bytes, before.requested_bytes);
                            }
                        }
                    }
                    Op::Free(i) => {
                        if !live.is_empty() {
                            let k = *live.keys().nth(i % live.len()).unwrap();
                            live.remove(&k);
                            t.deallocate(&mut d, k).unwrap();
                        }
                    }
                    Op::Release => {
                        t.empty_cache(&mut d).unwrap();
                    }
                }
                t.validate().unwrap();
                proptest::prop_assert_eq!(t.stats().reserved_bytes.current, d.used_bytes());
            }
            for k in live.keys() {
                t.deallocate(&mut d, *k).unwrap();
            }
            t.validate().unwrap();
            t.empty_cache(&mut d).unwrap();
            proptest::prop_assert_eq!(d.live_objects(), (0, 0, 0, 0));
            proptest::prop_assert_eq!(t.stats().reserved_bytes.current, 0);
            proptest::prop_assert_eq!(t.stats().free_bytes, 0);
            proptest::prop_assert_eq!(t.torch_stats().num_device_alloc, t.torch_stats().num_device_free);
        }
    }
}
