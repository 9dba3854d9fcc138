//! A device-level pool of segments (cuMemAlloc), each sub-allocated by its own [`Arena`].
//!
//! The classic design (a pre-allocated 256 MiB pool, grown by more pools) generalised
//! over the three range allocators: [`SegmentedPool::buddy`], [`SegmentedPool::tlsf`],
//! [`SegmentedPool::best_fit`].
//!
//! Policy:
//! - Sizes are rounded up to 256 B and blocks are at least 256-byte aligned, like cudaMalloc.
//! - A request tries the cached segments oldest first and takes the first one whose arena
//!   can hold it (first fit over segments, the arena's own policy inside a segment). Creation
//!   order, not address order: the driver hands out newer segments at lower addresses, and
//!   preferring the newest would spread small blocks over every segment.
//! - Otherwise the pool takes a new segment of `max(config.segment_bytes, size)`, rounded up
//!   to the device granularity (and, for buddy, to a power of two).
//! - If the device refuses with out-of-memory, the pool frees its empty segments
//!   ([`Allocator::empty_cache`]) and asks again for the same size; if that is refused too
//!   and a smaller segment would do (just the request rounded up), it asks once for that.
//!   Only then does it report [`AllocError::OutOfMemory`] with the pool's free figures.
//! - Empty segments stay cached until [`Allocator::empty_cache`].
//!
//! Alignment: any power of two up to the device granularity (segment bases are granularity
//! aligned on current GPUs and on the simulated device; a segment whose base is less aligned
//! than a request is skipped for that request).
use std::fmt;

use rustc_hash::FxHashMap;

use crate::align::{align_up, is_pow2};
use crate::arena::{Arena, ArenaReport};
use crate::best_fit::BestFit;
use crate::buddy::Buddy;
use crate::config::AllocatorConfig;
use crate::tlsf::Tlsf;
use crate::{AllocError, Allocator, Block, Device, DeviceError, Stats, StatsTracker};

/// Every size is rounded up to this many bytes and every block aligned to it (cudaMalloc's
/// 256-byte guarantee).
pub const ROUND_BYTES: u64 = crate::DEFAULT_ALIGN;

/// The range allocator that manages each segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArenaKind {
    /// [`Buddy`] with the given minimum block, in bytes; segments are powers of two.
    Buddy {
        /// Smallest block, in bytes.
        min_block_bytes: u64,
    },
    /// [`Tlsf`].
    Tlsf,
    /// [`BestFit`].
    BestFit,
}

impl ArenaKind {
    fn name(self) -> &'static str {
        match self {
            ArenaKind::Buddy { .. } => "buddy",
            ArenaKind::Tlsf => "tlsf",
            ArenaKind::BestFit => "best-fit",
        }
    }

    fn make(self, capacity_bytes: u64) -> Box<dyn Arena> {
        match self {
            ArenaKind::Buddy { min_block_bytes } => {
                Box::new(Buddy::with_min_block(capacity_bytes, min_block_bytes))
            }
            ArenaKind::Tlsf => Box::new(Tlsf::new(capacity_bytes)),
            ArenaKind::BestFit => Box::new(BestFit::new(capacity_bytes)),
        }
    }

    /// Segment size for `bytes`, rounded to the granularity (for buddy: to a power of two of
    /// at least one minimum block).
    fn segment_size(self, bytes: u64, granularity: u64) -> Option<u64> {
        let s = align_up(bytes.max(1), granularity)?;
        match self {
            ArenaKind::Buddy { min_block_bytes } => s
                .max(min_block_bytes.max(1).checked_next_power_of_two()?)
                .checked_next_power_of_two(),
            _ => Some(s),
        }
    }
}

struct Segment {
    /// Base address (the device's answer).
    base: u64,
    /// Bytes obtained from the device.
    bytes: u64,
    /// Creation sequence number (the order of `SegmentedPool::segments`).
    seq: u64,
    arena: Box<dyn Arena>,
    /// The arena's report, taken after every operation on it: a request skips a segment
    /// that cannot hold it without touching the arena, and `stats` reads no arena.
    report: ArenaReport,
}

#[derive(Debug, Clone, Copy)]
struct LiveBlock {
    /// Sequence number of the segment holding the block.
    segment: u64,
    /// Bytes the user asked for.
    requested_bytes: u64,
}

/// A pool of device segments, each managed by an arena of one [`ArenaKind`].
///
/// ```
/// use gpumem_core::{config::AllocatorConfig, segmented::SegmentedPool, sim::SimDevice};
/// use gpumem_core::{Allocator, Device};
/// let mut dev = SimDevice::new(1 << 30);
/// let mut pool = SegmentedPool::tlsf(&AllocatorConfig::default());
/// let b = pool.allocate(&mut dev, 1000, 256, 0).unwrap();
/// assert_eq!(b.allocated_bytes, 1024);
/// assert_eq!(dev.used_bytes(), 256 << 20, "one 256 MiB segment");
/// pool.deallocate(&mut dev, b.addr).unwrap();
/// assert_eq!(pool.empty_cache(&mut dev).unwrap(), 256 << 20);
/// assert_eq!(dev.used_bytes(), 0);
/// ```
pub struct SegmentedPool {
    kind: ArenaKind,
    /// Preferred segment size, in bytes (before rounding to the granularity).
    segment_bytes: u64,
    /// The segments in creation order (sorted by sequence number), the order a request
    /// tries them in; a block finds its segment by a binary search on the number.
    segments: Vec<Segment>,
    /// Sequence number of the next segment.
    next_seq: u64,
    /// Live blocks by address.
    blocks: FxHashMap<u64, LiveBlock>,
    tracker: StatsTracker,
}

impl fmt::Debug for SegmentedPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentedPool")
            .field("kind", &self.kind)
            .field("segment_bytes", &self.segment_bytes)
            .field("segments", &self.segments.len())
            .field("blocks", &self.blocks.len())
            .field("stats", &self.stats())
            .finish()
    }
}

impl SegmentedPool {
    /// An empty pool whose segments are managed by `kind`, preferring segments of
    /// `config.segment_bytes`.
    pub fn new(kind: ArenaKind, config: &AllocatorConfig) -> Self {
        SegmentedPool {
            kind,
            segment_bytes: config.segment_bytes,
            segments: Vec::new(),
            next_seq: 0,
            blocks: FxHashMap::default(),
            tracker: StatsTracker::default(),
        }
    }

    /// Buddy segments with `config.min_block_bytes` minimum blocks.
    pub fn buddy(config: &AllocatorConfig) -> Self {
        Self::new(
            ArenaKind::Buddy {
                min_block_bytes: config.min_block_bytes,
            },
            config,
        )
    }

    /// TLSF segments.
    pub fn tlsf(config: &AllocatorConfig) -> Self {
        Self::new(ArenaKind::Tlsf, config)
    }

    /// Best-fit segments.
    pub fn best_fit(config: &AllocatorConfig) -> Self {
        Self::new(ArenaKind::BestFit, config)
    }

    /// Segments held, as `(base address, bytes, live blocks)` in address order (sorts a
    /// copy of the list).
    pub fn segments(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let mut v: Vec<(u64, u64, u64)> = self
            .segments
            .iter()
            .map(|s| (s.base, s.bytes, s.report.allocations))
            .collect();
        v.sort_unstable();
        v.into_iter()
    }

    /// Free bytes and largest free block over every segment, from the cached reports.
    fn free_figures(&self) -> (u64, u64) {
        self.segments.iter().fold((0, 0), |(f, l), s| {
            (f + s.report.free_bytes, l.max(s.report.largest_free_bytes))
        })
    }

    /// Position in `segments` of segment number `seq`.
    fn position(&self, seq: u64) -> Option<usize> {
        self.segments.binary_search_by_key(&seq, |s| s.seq).ok()
    }

    fn oom(&self, requested_bytes: u64) -> AllocError {
        let (free_bytes, largest_free_bytes) = self.free_figures();
        AllocError::OutOfMemory {
            requested_bytes,
            free_bytes,
            largest_free_bytes,
        }
    }

    /// Takes a new segment of `want` bytes (or `min` after a refusal), releasing the cache
    /// and retrying when the device is out of memory. Returns `(base, bytes)`.
    fn grow(
        &mut self,
        dev: &mut dyn Device,
        want: u64,
        min: u64,
        requested: u64,
    ) -> Result<(u64, u64), AllocError> {
        match dev.alloc_segment(want) {
            Ok(base) => return Ok((base, want)),
            Err(DeviceError::OutOfMemory { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        self.tracker.stats.alloc_retries += 1;
        self.empty_cache(dev)?;
        match dev.alloc_segment(want) {
            Ok(base) => return Ok((base, want)),
            Err(DeviceError::OutOfMemory { .. }) if min < want => {}
            Err(DeviceError::OutOfMemory { .. }) => return Err(self.oom(requested)),
            Err(e) => return Err(e.into()),
        }
        match dev.alloc_segment(min) {
            Ok(base) => Ok((base, min)),
            Err(DeviceError::OutOfMemory { .. }) => Err(self.oom(requested)),
            Err(e) => Err(e.into()),
        }
    }

    /// Records a block at `addr` in segment number `seq`.
    fn record(&mut self, seq: u64, addr: u64, requested: u64, allocated: u64) -> Block {
        self.blocks.insert(
            addr,
            LiveBlock {
                segment: seq,
                requested_bytes: requested,
            },
        );
        self.tracker.on_alloc(requested, allocated);
        Block {
            addr,
            requested_bytes: requested,
            allocated_bytes: allocated,
        }
    }
}

impl Allocator for SegmentedPool {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn allocate(
        &mut self,
        dev: &mut dyn Device,
        size_bytes: u64,
        align: u64,
        _stream: u64,
    ) -> Result<Block, AllocError> {
        let granularity = dev.granularity_bytes();
        if !is_pow2(align) || align > granularity {
            return Err(AllocError::InvalidAlignment {
                align,
                max: granularity,
            });
        }
        let overflow = AllocError::Overflow { size_bytes, align };
        let rounded = align_up(size_bytes.max(1), ROUND_BYTES).ok_or(overflow.clone())?;
        let a = align.max(ROUND_BYTES);
        let mut hit = None;
        for seg in &mut self.segments {
            // Most segments of a busy pool cannot hold the request: skip them unread.
            if seg.report.largest_free_bytes < rounded || seg.base % a != 0 {
                continue;
            }
            let r = seg.arena.allocate(rounded, a);
            seg.report = seg.arena.report();
            match r {
                Ok((off, bytes)) => {
                    hit = Some((seg.seq, seg.base + off, bytes));
                    break;
                }
                Err(e) if e.is_oom() => {}
                Err(e) => return Err(e),
            }
        }
        if let Some((seq, addr, bytes)) = hit {
            return Ok(self.record(seq, addr, size_bytes, bytes));
        }
        let min = self
            .kind
            .segment_size(rounded, granularity)
            .ok_or(overflow.clone())?;
        let want = self
            .kind
            .segment_size(self.segment_bytes, granularity)
            .ok_or(overflow)?
            .max(min);
        let (base, bytes) = self.grow(dev, want, min, size_bytes)?;
        let mut arena = self.kind.make(bytes);
        let placed = if base % a == 0 {
            arena.allocate(rounded, a)
        } else {
            Err(AllocError::InvalidAlignment {
                align,
                max: 1 << base.trailing_zeros(),
            })
        };
        let report = arena.report();
        let seq = self.next_seq;
        // Sequence numbers only grow: pushing keeps the list sorted.
        self.segments.push(Segment {
            base,
            bytes,
            seq,
            arena,
            report,
        });
        self.next_seq += 1;
        self.tracker.on_reserve(bytes);
        let (off, allocated) = placed?;
        Ok(self.record(seq, base + off, size_bytes, allocated))
    }

    fn deallocate(&mut self, _dev: &mut dyn Device, addr: u64) -> Result<(), AllocError> {
        // One hash lookup on the hit path: take the entry out, put it back on an error.
        let Some(live) = self.blocks.remove(&addr) else {
            return Err(AllocError::UnknownBlock { addr });
        };
        let freed = match self.position(live.segment) {
            Some(pos) => {
                let seg = &mut self.segments[pos];
                let r = match addr.checked_sub(seg.base) {
                    Some(off) => seg.arena.deallocate(off).map_err(|e| {
                        AllocError::Internal(format!("block {addr:#x} not in its arena: {e}"))
                    }),
                    None => Err(AllocError::Internal(format!(
                        "block {addr:#x} below its segment {:#x}",
                        seg.base
                    ))),
                };
                seg.report = seg.arena.report();
                r
            }
            None => Err(AllocError::Internal(format!(
                "block {addr:#x} refers to a missing segment number {}",
                live.segment
            ))),
        };
        let allocated = match freed {
            Ok(a) => a,
            Err(e) => {
                self.blocks.insert(addr, live);
                return Err(e);
            }
        };
        self.tracker.on_free(live.requested_bytes, allocated);
        Ok(())
    }

    /// Frees every segment without live blocks (cuMemFree), in address order. On a device
    /// error the segments freed so far stay freed and the rest stay cached.
    fn empty_cache(&mut self, dev: &mut dyn Device) -> Result<u64, AllocError> {
        let mut empty: Vec<(u64, u64, u64)> = self
            .segments
            .iter()
            .filter(|s| s.report.allocations == 0)
            .map(|s| (s.base, s.bytes, s.seq))
            .collect();
        empty.sort_unstable();
        let mut released = 0;
        for (base, bytes, seq) in empty {
            dev.free_segment(base)?;
            if let Some(pos) = self.position(seq) {
                self.segments.remove(pos);
            }
            self.tracker.on_release(bytes);
            released += bytes;
        }
        Ok(released)
    }

    /// Counters are O(1); free, largest-free and inactive-split bytes are one pass over the
    /// segments' cached arena reports (no arena is asked).
    fn stats(&self) -> Stats {
        let mut s = self.tracker.stats;
        let (mut free, mut largest, mut split) = (0u64, 0u64, 0u64);
        for r in self.segments.iter().map(|g| &g.report) {
            free += r.free_bytes;
            largest = largest.max(r.largest_free_bytes);
            if r.allocations > 0 {
                split += r.free_bytes;
            }
        }
        s.free_bytes = free;
        s.largest_free_bytes = largest;
        s.inactive_split_bytes.add(split);
        s
    }

    fn reserved_bytes(&self) -> crate::Counter {
        self.tracker.stats.reserved_bytes
    }

    fn validate(&self) -> Result<(), AllocError> {
        let err = |m: String| AllocError::Internal(format!("{} pool: {m}", self.kind.name()));
        let st = &self.tracker.stats;
        let mut reserved = 0u64;
        let mut allocations = 0u64;
        let mut in_use = 0u64;
        if self.segments.windows(2).any(|w| w[0].seq >= w[1].seq) {
            return Err(err("segments not in creation order".into()));
        }
        if self.segments.iter().any(|s| s.seq >= self.next_seq) {
            return Err(err(format!("a segment numbered past {}", self.next_seq)));
        }
        let mut ranges: Vec<(u64, u64)> = self.segments.iter().map(|s| (s.base, s.bytes)).collect();
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            if w[0].0.checked_add(w[0].1).is_none_or(|end| end > w[1].0) {
                return Err(err(format!(
                    "segments at {:#x} and {:#x} overlap",
                    w[0].0, w[1].0
                )));
            }
        }
        for seg in &self.segments {
            let base = seg.base;
            let r = seg.arena.report();
            if seg.report != r {
                return Err(err(format!(
                    "segment {base:#x}: cached report {:?}, its arena says {r:?}",
                    seg.report
                )));
            }
            seg.arena
                .validate()
                .map_err(|e| err(format!("segment {base:#x}: {e}")))?;
            if seg.arena.capacity_bytes() != seg.bytes {
                return Err(err(format!(
                    "segment {base:#x} has {} B but its arena {}",
                    seg.bytes,
                    seg.arena.capacity_bytes()
                )));
            }
            reserved += seg.bytes;
            allocations += r.allocations;
            in_use += seg.bytes - r.free_bytes;
        }
        if reserved != st.reserved_bytes.current {
            return Err(err(format!(
                "segments hold {reserved} B, reserved counter {}",
                st.reserved_bytes.current
            )));
        }
        if self.segments.len() as u64 != st.segment_count.current {
            return Err(err(format!(
                "{} segments, counter {}",
                self.segments.len(),
                st.segment_count.current
            )));
        }
        if allocations != self.blocks.len() as u64 || allocations != st.allocation_count.current {
            return Err(err(format!(
                "arenas hold {allocations} blocks, block map {}, counter {}",
                self.blocks.len(),
                st.allocation_count.current
            )));
        }
        if in_use != st.allocated_bytes.current {
            return Err(err(format!(
                "arenas hold {in_use} B, allocated counter {}",
                st.allocated_bytes.current
            )));
        }
        let mut requested = 0u64;
        for (&addr, b) in &self.blocks {
            let seg = self
                .position(b.segment)
                .map(|pos| &self.segments[pos])
                .ok_or_else(|| err(format!("block {addr:#x} in missing segment")))?;
            if addr < seg.base || addr - seg.base >= seg.bytes {
                return Err(err(format!("block {addr:#x} outside its segment")));
            }
            requested += b.requested_bytes;
        }
        if requested != st.requested_bytes.current {
            return Err(err(format!(
                "blocks requested {requested} B, counter {}",
                st.requested_bytes.current
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sim::SimDevice;

    const MIB: u64 = 1 << 20;

    #[test]
    fn large_request_gets_its_own_segment_and_buddy_rounds_to_pow2() {
        let mut dev = SimDevice::new(4 << 30);
        let mut pool = SegmentedPool::buddy(&AllocatorConfig::default());
        let b = pool.allocate(&mut dev, 300 * MIB, 256, 0).unwrap();
        assert_eq!(b.allocated_bytes, 512 * MIB);
        assert_eq!(dev.used_bytes(), 512 * MIB);
        let mut t = SegmentedPool::tlsf(&AllocatorConfig::default());
        let c = t.allocate(&mut dev, 300 * MIB + 1, 256, 0).unwrap();
        assert_eq!(c.allocated_bytes, 300 * MIB + 256);
        assert_eq!(t.stats().reserved_bytes.current, 302 * MIB);
        pool.validate().unwrap();
        t.validate().unwrap();
    }

    #[test]
    fn refused_segment_releases_cache_then_tries_smaller() {
        let mut dev = SimDevice::new(300 * MIB);
        let mut pool = SegmentedPool::tlsf(&AllocatorConfig::default());
        let a = pool.allocate(&mut dev, MIB, 256, 0).unwrap(); // 256 MiB segment
        pool.deallocate(&mut dev, a.addr).unwrap();
        // 257 MiB does not fit in the cached segment; the device has only 44 MiB more.
        let b = pool.allocate(&mut dev, 257 * MIB, 256, 0).unwrap();
        assert_eq!(pool.stats().alloc_retries, 1);
        assert_eq!(pool.stats().segment_count.current, 1);
        assert_eq!(dev.used_bytes(), 258 * MIB);
        // 1 MiB is left in the segment. Only 42 MiB are left on the device: a 2 MiB block
        // gets a 2 MiB segment, not 256 MiB.
        let c = pool.allocate(&mut dev, 2 * MIB, 256, 0).unwrap();
        assert_eq!(pool.stats().alloc_retries, 2);
        assert_eq!(dev.used_bytes(), 260 * MIB);
        let e = pool.allocate(&mut dev, 100 * MIB, 256, 0).unwrap_err();
        assert_eq!(
            e,
            AllocError::OutOfMemory {
                requested_bytes: 100 * MIB,
                free_bytes: MIB,
                largest_free_bytes: MIB,
            }
        );
        assert_eq!(pool.stats().alloc_retries, 3);
        assert_eq!(pool.stats().segment_count.current, 2);
        pool.validate().unwrap();
        pool.deallocate(&mut dev, b.addr).unwrap();
        pool.deallocate(&mut dev, c.addr).unwrap();
        assert_eq!(pool.empty_cache(&mut dev).unwrap(), 260 * MIB);
        assert_eq!(dev.live_objects(), (0, 0, 0, 0));
    }

    #[test]
    fn buddy_segment_holds_at_least_one_minimum_block() {
        let mut dev = SimDevice::new(1 << 30);
        let config = AllocatorConfig {
            segment_bytes: 2 * MIB,
            min_block_bytes: 8 * MIB,
            ..AllocatorConfig::default()
        };
        let mut pool = SegmentedPool::buddy(&config);
        let b = pool.allocate(&mut dev, 1, 1, 0).unwrap();
        assert_eq!(b.allocated_bytes, 8 * MIB);
        assert_eq!(pool.stats().reserved_bytes.current, 8 * MIB);
        pool.validate().unwrap();
    }

    #[test]
    fn alignment_up_to_granularity() {
        let mut dev = SimDevice::new(1 << 30);
        let mut pool = SegmentedPool::best_fit(&AllocatorConfig::default());
        let _pin = pool.allocate(&mut dev, 100, 1, 0).unwrap();
        for shift in 0..=21 {
            let b = pool.allocate(&mut dev, 3000, 1 << shift, 0).unwrap();
            assert_eq!(b.addr % (1 << shift).max(256), 0);
        }
        assert_eq!(
            pool.allocate(&mut dev, 1, 4 << 20, 0),
            Err(AllocError::InvalidAlignment {
                align: 4 << 20,
                max: 2 << 20
            })
        );
        pool.validate().unwrap();
    }
}
