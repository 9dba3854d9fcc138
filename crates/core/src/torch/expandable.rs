//! Expandable segments (PyTorch's "Note [Expandable Segments]", `expandable_segments:True`).
//!
//! A segment is a virtual range reserved once per stream and pool (cuMemAddressReserve of
//! 1⅛ × the device capacity, rounded to whole pages) and backed on demand by physical pages
//! of 2 MiB (small pool) or 20 MiB (large pool): cuMemCreate and cuMemMap per page, one
//! cuMemSetAccess per mapped run. The unmapped part of the range is kept as unmapped blocks;
//! a request that no free block fits maps pages at the lowest address where free and
//! unmapped blocks together leave room (`find_expandable_block`, `map_block`). Pages are
//! unmapped (cuMemUnmap + cuMemRelease per page) only when the cache is released
//! (`unmap_block` from `release_cached_blocks`, on `empty_cache` or an OOM); a segment left
//! with no mapped page gives its range back (cuMemAddressFree). As in PyTorch, a segment
//! whose very first mapping failed (out of memory, or a driver error) keeps its range with
//! nothing mapped (releasing visits mapped free blocks only); it serves a later request on
//! its stream.
//!
//! Driver errors: after any failed call the counters match what the device holds. A failed
//! growth unwinds (nothing stays mapped; a handle whose cuMemRelease fails is kept in
//! `unreleased` and counted as reserved). A failed unmapping keeps what it did: the pages
//! unmapped before the error are split off as an unmapped block and no longer counted, the
//! page whose cuMemUnmap failed stays mapped, a page whose cuMemRelease failed is unmapped
//! but its handle stays counted in `unreleased`. The next release of the cache releases
//! those handles first, and gives back the range of a segment that an error left with
//! nothing mapped (`ranges_to_free`). None of this runs without a failed call, so the calls
//! and figures of a replay are PyTorch's.
//!
//! *Coarse handles* (not PyTorch: the `paged-lazy` strategy's default placement,
//! [`LazyPlacement::Segments`](crate::config::LazyPlacement::Segments), built by
//! [`TorchCachingPool::paged_lazy`]; the other placement, `placement=pages`, is
//! [`crate::paged_lazy::LazyPagedPool`]): a growth creates one handle for all its pages and maps
//! and opens it once (3 driver calls however many pages), and a release of the cache
//! unmaps and releases only the handles that lie whole inside a free block (`first_whole_run`, one per
//! `unmap_block`):
//! a handle is unmapped whole or not at all. So that an out-of-memory can still give back
//! the free pages beside live blocks, a growth is cut into handles of at most 1/8 of the
//! device memory it leaves free ([`coarse_piece_pages`]; one cuMemCreate and one cuMemMap
//! each, one cuMemSetAccess for the growth): one handle while the device has room, down to
//! PyTorch's one page per handle near its limit. Placement and figures are unchanged; a
//! partly used handle stays mapped where PyTorch would unmap its free pages. A segment
//! reserves at least 64 GiB of address space (PyTorch: 1⅛ × the device memory, more than
//! that on an H200), and one whose first mapping failed gives its range back at once.
use crate::device::{DeviceError, PhysHandle};
use crate::{AllocError, Block as UserBlock, Device, ForeignSegment};

use super::blocks::{Block, NIL};
use super::{PoolKind, TorchCachingPool};

/// With coarse handles (`paged-lazy`), the most a growth of the small pool's expandable
/// segment maps beyond what it needs (see [`TorchCachingPool::paged_lazy`]): 4 MiB, two of
/// its pages.
pub const SMALL_GROW_AHEAD_BYTES: u64 = 4 << 20;

/// One expandable segment.
#[derive(Debug, Clone)]
pub(crate) struct ExpandableSegment {
    /// Start of the reserved range.
    pub va: u64,
    /// Bytes of one page (`segment_size_`).
    pub page: u64,
    /// Pages the range holds (`max_handles_`).
    pub max_pages: u64,
    /// The pool it serves.
    pub pool: PoolKind,
    /// Physical handle of each page, `None` where unmapped (trimmed at the end).
    pub handles: Vec<Option<PhysHandle>>,
    /// Coarse handles only: `runs[i]` is the number of pages of the handle mapped from page
    /// `i` (0 where no handle starts).
    pub runs: Vec<u64>,
    /// Coarse handles only: runs (by first page) whose handle is released already but whose
    /// cuMemUnmap failed: still mapped, given back by the next unmap.
    pub released: Vec<u64>,
    /// One handle per mapped run (cuMemCreate, cuMemMap and cuMemSetAccess once per
    /// growth) instead of one per page; runs are unmapped whole.
    pub coarse: bool,
}

impl ExpandableSegment {
    /// Bytes of the whole reserved range.
    pub fn range_bytes(&self) -> u64 {
        self.page * self.max_pages
    }

    /// Mapped bytes.
    pub fn mapped_bytes(&self) -> u64 {
        self.handles.iter().flatten().count() as u64 * self.page
    }

    /// Runs of mapped pages as `(start, bytes)`.
    pub fn mapped_runs(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut run: Option<(u64, u64)> = None;
        for (i, h) in self.handles.iter().enumerate() {
            let at = self.va + i as u64 * self.page;
            match (h.is_some(), run.as_mut()) {
                (true, Some(r)) => r.1 += self.page,
                (true, None) => run = Some((at, self.page)),
                (false, Some(_)) => out.extend(run.take()),
                (false, None) => {}
            }
        }
        out.extend(run);
        out
    }

    /// Releases the handles of pages `begin..end` (unwinding a failed step). A handle whose
    /// cuMemRelease fails goes to `unreleased` (it still holds its memory); the first such
    /// error is returned.
    fn release_pages(
        &mut self,
        dev: &mut dyn Device,
        begin: u64,
        end: u64,
        unreleased: &mut Vec<Unreleased>,
    ) -> Result<(), DeviceError> {
        let mut first = Ok(());
        for i in begin..end {
            if let Some(h) = self.handles.get_mut(i as usize).and_then(Option::take) {
                if let Err(e) = dev.release_physical(h) {
                    unreleased.push(Unreleased {
                        handle: h,
                        bytes: self.page,
                    });
                    first = first.and(Err(e));
                }
            }
        }
        self.trim();
        first
    }

    /// Drops the unmapped pages at the end of `handles`.
    fn trim(&mut self) {
        while self.handles.last().is_some_and(Option::is_none) {
            self.handles.pop();
        }
    }

    /// Unmaps pages `begin..end` while unwinding a failed step (each call retried once, so
    /// that one failed call leaks nothing; a page whose unmap fails twice stays mapped).
    fn unmap_pages(&self, dev: &mut dyn Device, begin: u64, end: u64) {
        for j in begin..end {
            let va = self.va + j * self.page;
            let _ = dev
                .unmap(va, self.page)
                .or_else(|_| dev.unmap(va, self.page));
        }
    }

    /// `ExpandableSegment::map`: maps pages `begin..end` (create every handle, then map each,
    /// then one set-access; with coarse handles one handle for the whole run). `Ok(false)`
    /// when cuMemCreate runs out of memory. After any failure nothing stays mapped and every
    /// handle created is released, except those whose cuMemRelease failed: they go to
    /// `unreleased` (and that error is returned when the step had none of its own).
    fn map(
        &mut self,
        dev: &mut dyn Device,
        begin: u64,
        end: u64,
        unreleased: &mut Vec<Unreleased>,
    ) -> Result<bool, DeviceError> {
        if self.handles.len() < end as usize {
            self.handles.resize(end as usize, None);
        }
        if self.coarse {
            return self.map_coarse(dev, begin, end);
        }
        for i in begin..end {
            match dev.create_physical(self.page) {
                Ok(h) => self.handles[i as usize] = Some(h),
                Err(e) => {
                    self.release_pages(dev, begin, i, unreleased)?;
                    return match e {
                        DeviceError::OutOfMemory { .. } => Ok(false),
                        other => Err(other),
                    };
                }
            }
        }
        for i in begin..end {
            let Some(h) = self.handles[i as usize] else {
                continue;
            };
            if let Err(e) = dev.map(self.va + i * self.page, self.page, h) {
                self.unmap_pages(dev, begin, i);
                let _ = self.release_pages(dev, begin, end, unreleased);
                return Err(e);
            }
        }
        if let Err(e) = dev.set_access(self.va + begin * self.page, (end - begin) * self.page) {
            self.unmap_pages(dev, begin, end);
            let _ = self.release_pages(dev, begin, end, unreleased);
            return Err(e);
        }
        Ok(true)
    }

    /// [`ExpandableSegment::map`] with coarse handles: the run is cut into pieces of at most
    /// [`coarse_piece_pages`] pages, each one cuMemCreate and one cuMemMap, then one
    /// cuMemSetAccess for the whole run (one piece, so three calls, unless the device is
    /// nearly full).
    fn map_coarse(
        &mut self,
        dev: &mut dyn Device,
        begin: u64,
        end: u64,
    ) -> Result<bool, DeviceError> {
        if self.runs.len() < end as usize {
            self.runs.resize(end as usize, 0);
        }
        let piece = coarse_piece_pages(dev, self.page, end - begin);
        // (first page, pages, handle) of the pieces created so far.
        let mut made: Vec<(u64, u64, PhysHandle)> = Vec::new();
        // Unwinding retries each call once, so that one failed call leaks nothing.
        let unwind = |dev: &mut dyn Device, made: &[(u64, u64, PhysHandle)], mapped: usize| {
            for &(i, n, _) in &made[..mapped] {
                let (va, bytes) = (self.va + i * self.page, n * self.page);
                let _ = dev.unmap(va, bytes).or_else(|_| dev.unmap(va, bytes));
            }
            for &(_, _, h) in made {
                let _ = dev.release_physical(h).or_else(|_| dev.release_physical(h));
            }
        };
        let mut i = begin;
        while i < end {
            let n = piece.min(end - i);
            match dev.create_physical(n * self.page) {
                Ok(h) => made.push((i, n, h)),
                Err(e) => {
                    unwind(dev, &made, 0);
                    return match e {
                        DeviceError::OutOfMemory { .. } => Ok(false),
                        other => Err(other),
                    };
                }
            }
            i += n;
        }
        for k in 0..made.len() {
            let (i, n, h) = made[k];
            if let Err(e) = dev.map(self.va + i * self.page, n * self.page, h) {
                unwind(dev, &made, k);
                return Err(e);
            }
        }
        let (va, bytes) = (self.va + begin * self.page, (end - begin) * self.page);
        if let Err(e) = dev.set_access(va, bytes) {
            unwind(dev, &made, made.len());
            return Err(e);
        }
        for &(i, n, h) in &made {
            self.handles[i as usize..(i + n) as usize].fill(Some(h));
            self.runs[i as usize] = n;
        }
        Ok(true)
    }

    /// The first whole coarse run inside pages `begin..end`, as its page range (empty when
    /// none lies whole inside).
    fn first_whole_run(&self, mut begin: u64, end: u64) -> (u64, u64) {
        let run = |i: u64| self.runs.get(i as usize).copied().unwrap_or(0);
        while begin < end && (run(begin) == 0 || begin + run(begin) > end) {
            begin += 1;
        }
        if begin < end {
            (begin, begin + run(begin))
        } else {
            (begin, begin)
        }
    }

    /// Coarse handles: releases, then unmaps the run starting at page `i` (its memory is
    /// freed at the unmap). A failed release changes nothing; after a failed unmap the run
    /// stays mapped, marked released, and the next call only unmaps it.
    fn unmap_run(&mut self, dev: &mut dyn Device, i: u64) -> Result<(), DeviceError> {
        let n = self.runs.get(i as usize).copied().unwrap_or(0);
        let Some(h) = self.handles.get(i as usize).copied().flatten() else {
            return Ok(());
        };
        if n == 0 {
            return Ok(());
        }
        if !self.released.contains(&i) {
            dev.release_physical(h)?;
            self.released.push(i);
        }
        dev.unmap(self.va + i * self.page, n * self.page)?;
        self.released.retain(|&r| r != i);
        self.handles[i as usize..(i + n) as usize].fill(None);
        self.runs[i as usize] = 0;
        self.trim();
        Ok(())
    }

    /// `unmapHandles`: unmaps and releases pages `begin..end`, one page at a time, as
    /// PyTorch does (cuMemUnmap, then cuMemRelease, per page); with coarse handles the one
    /// run `begin..end` (see [`ExpandableSegment::unmap_run`]). Returns the page up to which
    /// pages are unmapped (`end` unless a call failed) with the error, if any: a failed
    /// cuMemUnmap leaves its page and those after it mapped; a page whose cuMemRelease
    /// failed is unmapped, and its handle (which still holds its memory) goes to
    /// `unreleased`.
    fn unmap(
        &mut self,
        dev: &mut dyn Device,
        begin: u64,
        end: u64,
        unreleased: &mut Vec<Unreleased>,
    ) -> (u64, Result<(), DeviceError>) {
        if self.coarse {
            debug_assert_eq!(self.runs.get(begin as usize).copied(), Some(end - begin));
            // A run is unmapped whole or not at all.
            return match self.unmap_run(dev, begin) {
                Ok(()) => (end, Ok(())),
                Err(e) => (begin, Err(e)),
            };
        }
        for i in begin..end {
            let Some(h) = self.handles.get(i as usize).copied().flatten() else {
                continue;
            };
            if let Err(e) = dev.unmap(self.va + i * self.page, self.page) {
                self.trim();
                return (i, Err(e));
            }
            self.handles[i as usize] = None;
            if let Err(e) = dev.release_physical(h) {
                unreleased.push(Unreleased {
                    handle: h,
                    bytes: self.page,
                });
                self.trim();
                return (i + 1, Err(e));
            }
        }
        self.trim();
        (end, Ok(()))
    }
}

/// A physical handle whose cuMemRelease failed while it was being given back: unmapped (or
/// never mapped), it still holds its memory, which stays counted as reserved until a later
/// release of the cache releases it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unreleased {
    /// The handle.
    pub handle: PhysHandle,
    /// Bytes it holds.
    pub bytes: u64,
}

/// An expandable segment with nothing mapped whose cuMemAddressFree failed or was cut
/// short by a failed driver call: the next release of the cache gives its range back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RangeToFree {
    /// Index of the segment.
    pub segment: u32,
    /// Its pool.
    pub pool: PoolKind,
    /// Its stream.
    pub stream: u64,
    /// Start of its range.
    pub va: u64,
}

/// A coarse handle holds at most this share (1/8) of the device memory its growth leaves
/// free ([`coarse_piece_pages`]).
pub(crate) const COARSE_PIECE_DIVISOR: u64 = 8;

/// Most pages of one coarse handle in a growth of `pages` pages of `page` bytes:
/// 1/[`COARSE_PIECE_DIVISOR`] of the device memory the growth leaves free, at least one
/// page. Free memory is [`Device::capacity_bytes`] less [`Device::used_bytes`] (what this
/// device object holds; not cuMemGetInfo, which would also count other processes and make
/// a real replay cut growths where the simulated one does not).
///
/// A handle is given back whole or not at all, so on an out-of-memory the free part of a
/// handle that a live block touches stays held. Pieces that shrink as the device fills keep
/// that part small where it matters: while the device has room a growth is one handle (with
/// 140 GiB and a 25 GiB job, a growth is cut only above ≈ 14 GiB), and near the device's
/// limit handles come down to PyTorch's one page. The divisor trades the smallest device a
/// run fits in (a larger divisor gives back more on an OOM) against driver calls in a job
/// that fills much of the device (a larger divisor cuts its growths sooner); why 8:
/// `docs/decisions.md`, "Coarse handles shrink as the device fills".
pub(crate) fn coarse_piece_pages(dev: &dyn Device, page: u64, pages: u64) -> u64 {
    let free_after = dev
        .capacity_bytes()
        .saturating_sub(dev.used_bytes())
        .saturating_sub(pages.saturating_mul(page));
    (free_after / COARSE_PIECE_DIVISOR / page).clamp(1, pages.max(1))
}

/// Least address space a segment with coarse handles reserves (64 GiB).
const COARSE_MIN_RANGE_BYTES: u64 = 64 << 30;

/// Expandable segment `segment` of `expandable`, unless released.
fn live_segment(
    expandable: &mut [Option<ExpandableSegment>],
    segment: u32,
) -> Option<&mut ExpandableSegment> {
    expandable
        .get_mut(segment as usize)
        .and_then(Option::as_mut)
}

impl TorchCachingPool {
    /// Whether block `i` exists and is not allocated (`allocatable`).
    fn allocatable(&self, i: u32) -> bool {
        i != NIL && !self.slab.get(i).allocated
    }

    /// Whether free and unmapped blocks from `i` on hold `size` bytes
    /// (`has_available_address_space`).
    fn has_room(&self, mut i: u32, size: u64) -> bool {
        let mut bytes = 0u64;
        while bytes < size && self.allocatable(i) {
            bytes += self.slab.get(i).size;
            i = self.slab.get(i).next;
        }
        bytes >= size
    }

    /// `find_expandable_block`: the lowest place in a segment of `stream` and `pool` with
    /// room for `size` bytes (an unmapped block, or the free block just before one); a new
    /// segment when none has room.
    fn find_expandable_block(
        &mut self,
        dev: &mut dyn Device,
        stream: u64,
        pool: PoolKind,
        size: u64,
    ) -> Result<u32, DeviceError> {
        let candidates: Vec<u32> = self.unmapped[pool.index()]
            .range((stream, 0)..=(stream, u64::MAX))
            .map(|(_, &i)| i)
            .collect();
        for mut c in candidates {
            let prev = self.slab.get(c).prev;
            if self.allocatable(prev) {
                c = prev;
            }
            if self.has_room(c, size) {
                return Ok(c);
            }
        }
        self.new_expandable_segment(dev, stream, pool)
    }

    /// A new expandable segment of `stream` and `pool` (cuMemAddressReserve of its range):
    /// the index of the unmapped block that covers all of it.
    pub(super) fn new_expandable_segment(
        &mut self,
        dev: &mut dyn Device,
        stream: u64,
        pool: PoolKind,
    ) -> Result<u32, DeviceError> {
        let page = pool.expandable_page_bytes();
        let total = dev.capacity_bytes();
        let mut range = total.saturating_add(total / 8);
        if self.coarse_handles {
            // Coarse handles (not PyTorch): at least 64 GiB of address space, so that on a
            // small device the range never refuses a request before the device does (the
            // smallest-capacity search assumes that only the device's answers depend on
            // its capacity). On an H200, 1⅛ × its memory is more anyway.
            range = range.max(COARSE_MIN_RANGE_BYTES);
        }
        let max_pages = range.div_ceil(page).max(1);
        let bytes = page.saturating_mul(max_pages);
        let va = dev.reserve_va(bytes)?;
        if va == 0 {
            let _ = dev.free_va(va, bytes);
            return Err(DeviceError::Invalid {
                call: "cuMemAddressReserve",
                detail: "the reserved range is at address 0".into(),
            });
        }
        let id = self.expandable.len() as u32;
        self.expandable.push(Some(ExpandableSegment {
            va,
            page,
            max_pages,
            pool,
            handles: Vec::new(),
            runs: Vec::new(),
            released: Vec::new(),
            coarse: self.coarse_handles,
        }));
        let i = self.slab.insert(Block {
            addr: va,
            size: bytes,
            requested: 0,
            stream,
            gc_base: 0,
            prev: NIL,
            next: NIL,
            segment: id,
            pool,
            allocated: false,
            mapped: false,
        });
        self.unmapped[pool.index()].insert((stream, va), i);
        Ok(i)
    }

    /// [`Allocator::adopt_segment`](crate::Allocator::adopt_segment) of an expandable
    /// segment (`runs`: its mapped pages as `(offset, bytes)`): a new segment of the stream
    /// and pool, those pages mapped (one map step per run, as the device sees it), the live
    /// blocks carved out of them. `Ok(None)` for a layout it cannot hold (see
    /// [`TorchCachingPool::adopt_segment`]); out of memory (or past the memory limit) before
    /// anything is done. A device error part-way leaves the runs mapped so far as free blocks
    /// of the new segment (counted as reserved, like any growth).
    pub(super) fn adopt_expandable(
        &mut self,
        dev: &mut dyn Device,
        seg: &ForeignSegment,
        runs: &[(u64, u64)],
    ) -> Result<Option<Vec<UserBlock>>, AllocError> {
        let pool = if seg.small_pool {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        let page = pool.expandable_page_bytes();
        let total = dev.capacity_bytes();
        let range = page.saturating_mul(total.saturating_add(total / 8).div_ceil(page).max(1));
        // Runs: ascending, whole pages, inside the range.
        let mut end = 0u64;
        for &(off, bytes) in runs {
            let ok = off >= end
                && bytes > 0
                && off.is_multiple_of(page)
                && bytes.is_multiple_of(page)
                && off.checked_add(bytes).is_some_and(|e| e <= range);
            if !ok {
                return Ok(None);
            }
            end = off + bytes;
        }
        if runs.is_empty() || self.expandable.iter().flatten().any(|e| e.pool == pool) {
            return Ok(None);
        }
        // Blocks: each inside one run.
        let Some(blocks) = self.foreign_blocks(seg, |off, end| {
            runs.iter().any(|&(o, n)| o <= off && end <= o + n)
        }) else {
            return Ok(None);
        };
        let mapped: u64 = runs.iter().map(|r| r.1).sum();
        let over_limit = self
            .allowed(dev)
            .is_some_and(|a| self.total_allocated.saturating_add(mapped) > a);
        if over_limit || dev.used_bytes().saturating_add(mapped) > total {
            return Err(self.oom(mapped));
        }
        let first = self.new_expandable_segment(dev, seg.stream, pool)?;
        let va = self.slab.get(first).addr;
        // Map each run out of the unmapped block that covers the rest of the range.
        let mut tail = first;
        for &(off, bytes) in runs {
            let want = va + off;
            let b = *self.slab.get(tail);
            if want > b.addr {
                let rest = self.split_at(tail, want);
                self.unmapped[pool.index()].insert((b.stream, want), rest);
                tail = rest;
            }
            if !self.map_block(dev, tail, bytes)? {
                return Err(self.oom(bytes));
            }
            tail = self.slab.get(tail).next;
            if tail == NIL {
                break;
            }
        }
        // Carve the live blocks out of the free mapped blocks.
        Ok(Some(self.carve_adopted(first, va, &blocks)?))
    }

    /// `map_block`: maps the pages under the first `size` bytes of the unmapped block `i`,
    /// splits off the rest, merges the mapped part with free neighbours and puts it into the
    /// free set. `Ok(false)` when the device has no memory for the pages.
    fn map_block(&mut self, dev: &mut dyn Device, i: u32, size: u64) -> Result<bool, DeviceError> {
        let b = *self.slab.get(i);
        let Some(es) = live_segment(&mut self.expandable, b.segment) else {
            return Err(DeviceError::Invalid {
                call: "cuMemMap",
                detail: format!("block {:#x} has no expandable segment", b.addr),
            });
        };
        let begin = (b.addr - es.va) / es.page;
        let end = (b.addr + size - es.va).div_ceil(es.page);
        if begin == end {
            return Ok(false);
        }
        let held = self.unreleased.len();
        let ok = es.map(dev, begin, end, &mut self.unreleased);
        let mapped = (end - begin) * es.page;
        self.hold_unreleased(held);
        if !ok? {
            return Ok(false);
        }
        self.unmapped[b.pool.index()].remove(&(b.stream, b.addr));
        self.slab.get_mut(i).mapped = true;
        if mapped < b.size {
            let rest = self.slab.insert(Block {
                addr: b.addr + mapped,
                size: b.size - mapped,
                prev: i,
                mapped: false,
                ..b
            });
            if b.next != NIL {
                self.slab.get_mut(b.next).prev = rest;
            }
            let bm = self.slab.get_mut(i);
            bm.next = rest;
            bm.size = mapped;
            self.unmapped[b.pool.index()].insert((b.stream, b.addr + mapped), rest);
        }
        let prev = self.slab.get(i).prev;
        self.try_merge(i, prev);
        let next = self.slab.get(i).next;
        self.try_merge(i, next);
        self.insert_free(i);
        self.total_allocated += mapped;
        self.tracker.stats.reserved_bytes.add(mapped);
        self.torch.num_device_alloc += 1;
        Ok(true)
    }

    /// `try_allocate_expandable_block`: room for `size` bytes mapped in an expandable
    /// segment, taken out of the free set. `Ok(None)` when the pages cannot be had.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        dev: &mut dyn Device,
        stream: u64,
        pool: PoolKind,
        size: u64,
    ) -> Result<Option<u32>, DeviceError> {
        let mut c = self.find_expandable_block(dev, stream, pool, size)?;
        let cb = *self.slab.get(c);
        if !cb.mapped {
            let mapped = self.map_growth(dev, c, size);
            if !matches!(mapped, Ok(true)) {
                // Coarse handles (not PyTorch): a segment left with nothing mapped gives its
                // range back at once instead of waiting for a later request.
                if self.coarse_handles && cb.prev == NIL && cb.next == NIL {
                    self.release_expandable_segment(dev, c)
                        .or_else(|_| self.release_expandable_segment(dev, c))?;
                }
                mapped?;
                return Ok(None);
            }
        }
        while self.slab.get(c).size < size {
            let remaining = size - self.slab.get(c).size;
            let next = self.slab.get(c).next;
            if next == NIL {
                return Ok(None);
            }
            if !self.map_growth(dev, next, remaining)? {
                return Ok(None);
            }
            c = next;
        }
        self.remove_free(c);
        Ok(Some(c))
    }

    /// [`TorchCachingPool::map_block`] of the unmapped block `i` for a growth that needs
    /// `need` bytes: first with [`TorchCachingPool::grow_ahead_bytes`] more (and, in the
    /// small pool, [`TorchCachingPool::small_ahead_bytes`] if that is more), then, when the
    /// device has no room for that (or there is no ahead), only `need` (at most the block).
    fn map_growth(&mut self, dev: &mut dyn Device, i: u32, need: u64) -> Result<bool, DeviceError> {
        let room = self.slab.get(i).size;
        let ahead = self.grow_ahead_bytes().max(self.small_ahead_bytes(i));
        if ahead > 0 && self.map_block(dev, i, room.min(need.saturating_add(ahead)))? {
            return Ok(true);
        }
        self.map_block(dev, i, room.min(need))
    }

    /// Bytes a growth maps beyond what it needs: [`TorchCachingPool::grow_ahead_bp`] of the
    /// bytes taken from the device (0 without coarse handles: PyTorch maps what it needs).
    /// Of all bytes held, not of the growing segment's: the small pool's segment then grows
    /// in steps as large as the large pool's, where a share of its own few bytes would leave
    /// its many small growths as they are (`docs/decisions.md`, "`grow_ahead`, default 0").
    fn grow_ahead_bytes(&self) -> u64 {
        if !self.coarse_handles {
            return 0;
        }
        (u128::from(self.total_allocated) * u128::from(self.grow_ahead_bp) / 10_000) as u64
    }

    /// With coarse handles, bytes a growth of the *small* pool's segment (blocks of at most
    /// 1 MiB, 2 MiB pages) maps beyond what it needs, the unmapped block `i` being where it
    /// grows: as many as the segment holds, at most [`SMALL_GROW_AHEAD_BYTES`], so one or two
    /// pages beyond the request's (0 in the large pool, and without coarse handles: PyTorch
    /// maps the pages the request needs).
    ///
    /// PyTorch's small pool grows one 2 MiB page at a time, and where small blocks creep up
    /// over a run (new shapes, fragmentation among them) every growth is three driver calls
    /// for 2 MiB, in the steady state too. Mapping two pages more (6 MiB a growth once the
    /// segment holds 4 MiB, for requests of at most 1 MiB) removes most of those growths and
    /// holds at most 4 MiB more than PyTorch's growth at the peak; a smaller cap saves fewer
    /// calls, a larger one raises peaks without saving more (`docs/decisions.md`, "The small
    /// pool grows by what it holds, at most 4 MiB").
    fn small_ahead_bytes(&self, i: u32) -> u64 {
        let b = self.slab.get(i);
        if !self.coarse_handles || b.pool != PoolKind::Small {
            return 0;
        }
        self.expandable
            .get(b.segment as usize)
            .and_then(Option::as_ref)
            .map_or(0, |es| es.mapped_bytes().min(SMALL_GROW_AHEAD_BYTES))
    }

    /// `unmap_block`: unmaps the whole pages inside the free block `i` of an expandable
    /// segment, leaving the partial pages at both ends as free blocks. Returns the bytes
    /// unmapped and the index of the unmapped block (which may have merged with unmapped
    /// neighbours).
    ///
    /// # Errors
    /// The driver's error. The pages unmapped before it are accounted for all the same (the
    /// block is split where the unmapping stopped), so that the counters match what is
    /// mapped; a segment left with nothing mapped is given back by the next release of the
    /// cache.
    pub(super) fn unmap_block(
        &mut self,
        dev: &mut dyn Device,
        i: u32,
    ) -> Result<(u64, u32), DeviceError> {
        let b = *self.slab.get(i);
        let Some(es) = live_segment(&mut self.expandable, b.segment) else {
            return Ok((0, i));
        };
        let mut begin = (b.addr - es.va).div_ceil(es.page);
        let mut end = (b.addr + b.size - es.va) / es.page;
        if es.coarse {
            // A handle is unmapped whole or not at all, one per call (the caller repeats).
            (begin, end) = es.first_whole_run(begin, end);
        }
        if begin >= end {
            return Ok((0, i));
        }
        let held = self.unreleased.len();
        let (reached, result) = es.unmap(dev, begin, end, &mut self.unreleased);
        if reached == begin {
            result?;
            return Ok((0, i));
        }
        let start = es.va + begin * es.page;
        let bytes = (reached - begin) * es.page;
        // Pages whose handle could not be released still hold their memory.
        let still_held: u64 = self.unreleased[held..].iter().map(|u| u.bytes).sum();
        self.remove_free(i);
        let before = start - b.addr;
        if before > 0 {
            let f = self.slab.insert(Block {
                size: before,
                prev: b.prev,
                next: i,
                ..b
            });
            if b.prev != NIL {
                self.slab.get_mut(b.prev).next = f;
            }
            self.slab.get_mut(i).prev = f;
            self.insert_free(f);
        }
        let after = b.size - before - bytes;
        if after > 0 {
            let next = self.slab.get(i).next;
            let f = self.slab.insert(Block {
                addr: start + bytes,
                size: after,
                prev: i,
                next,
                ..b
            });
            if next != NIL {
                self.slab.get_mut(next).prev = f;
            }
            self.slab.get_mut(i).next = f;
            self.insert_free(f);
        }
        {
            let bm = self.slab.get_mut(i);
            bm.addr = start;
            bm.size = bytes;
            bm.mapped = false;
        }
        let prev = self.slab.get(i).prev;
        self.try_merge(i, prev);
        let next = self.slab.get(i).next;
        self.try_merge(i, next);
        let u = *self.slab.get(i);
        self.unmapped[u.pool.index()].insert((u.stream, u.addr), i);
        self.total_allocated -= bytes - still_held;
        self.tracker.stats.reserved_bytes.sub(bytes - still_held);
        self.torch.num_device_free += 1;
        if let Err(e) = result {
            if u.prev == NIL && u.next == NIL {
                self.free_range_later(u);
            }
            return Err(e);
        }
        Ok((bytes, i))
    }

    /// `release_expandable_segment`: the unmapped block `i` spans its whole segment; the
    /// range goes back to the device (cuMemAddressFree).
    pub(super) fn release_expandable_segment(
        &mut self,
        dev: &mut dyn Device,
        i: u32,
    ) -> Result<(), DeviceError> {
        let b = *self.slab.get(i);
        let Some(es) = self
            .expandable
            .get_mut(b.segment as usize)
            .and_then(Option::take)
        else {
            return Ok(());
        };
        if let Err(e) = dev.free_va(es.va, es.range_bytes()) {
            self.expandable[b.segment as usize] = Some(es);
            self.free_range_later(b);
            return Err(e);
        }
        self.unmapped[b.pool.index()].remove(&(b.stream, b.addr));
        self.slab.remove(i);
        Ok(())
    }

    /// Counts the memory of the handles pushed to `unreleased` from index `from` on as
    /// reserved (they were created for a mapping that failed, and hold their memory until
    /// released).
    fn hold_unreleased(&mut self, from: usize) {
        let bytes: u64 = self.unreleased[from..].iter().map(|u| u.bytes).sum();
        if bytes > 0 {
            self.total_allocated += bytes;
            self.tracker.stats.reserved_bytes.add(bytes);
        }
    }

    /// Notes that the segment whose one (unmapped) block is `b` should give its range back
    /// at the next release of the cache.
    fn free_range_later(&mut self, b: Block) {
        let r = RangeToFree {
            segment: b.segment,
            pool: b.pool,
            stream: b.stream,
            va: b.addr,
        };
        if !self.ranges_to_free.iter().any(|x| x.segment == r.segment) {
            self.ranges_to_free.push(r);
        }
    }

    /// What failed driver calls left to give back: the handles of `unreleased` and the
    /// ranges of `ranges_to_free` (each still a segment with nothing mapped; one that has
    /// mapped pages again, or is gone, is dropped from the list). Nothing to do unless a
    /// driver call failed. Returns the bytes of memory given back.
    ///
    /// # Errors
    /// The first driver error; what is left stays listed for the next call.
    pub(super) fn release_leftovers(&mut self, dev: &mut dyn Device) -> Result<u64, DeviceError> {
        let mut released = 0;
        while let Some(&u) = self.unreleased.last() {
            dev.release_physical(u.handle)?;
            self.unreleased.pop();
            self.total_allocated -= u.bytes;
            self.tracker.stats.reserved_bytes.sub(u.bytes);
            released += u.bytes;
        }
        while let Some(r) = self.ranges_to_free.pop() {
            let Some(&i) = self.unmapped[r.pool.index()].get(&(r.stream, r.va)) else {
                continue;
            };
            let b = self.slab.get(i);
            if b.segment == r.segment && b.prev == NIL && b.next == NIL {
                self.release_expandable_segment(dev, i)?;
            }
        }
        Ok(released)
    }
}
