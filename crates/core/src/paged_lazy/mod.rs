//! The *page placement* of the `paged-lazy` strategy (`placement=pages`,
//! [`LazyPlacement::Pages`](crate::config::LazyPlacement::Pages)): a page-mapped allocator
//! over CUDA virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap,
//! cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree), like [`crate::paged`], but
//! one that keeps freed pages mapped, as PyTorch's `expandable_segments` does, instead of
//! unmapping them at once. Like `paged`, it is a placement over the substrate in
//! [`crate::vmm`] (reservations, handles and their cache, mapping and unwinding, the quick
//! list, the retry on out-of-memory); what is its own is here: the free space with its
//! mapped runs (`placement.rs`), the page limit, mapping ahead and moving idle extents
//! (`pages.rs`, with the Fenwick count of mapped pages).
//!
//! # Where the strategy's default is
//! This is *not* `paged-lazy`'s default placement. The default,
//! [`LazyPlacement::Segments`](crate::config::LazyPlacement::Segments), is PyTorch's
//! expandable segments with one physical handle per growth: the coarse-handle mode of
//! `crate::torch::expandable`, built by [`crate::torch::TorchCachingPool::paged_lazy`]
//! ([`crate::strategy::Strategy::build`] picks one or the other by
//! `LazyConfig::placement`). The default meets driver-call and driver-time targets more
//! often; this placement keeps the peak closer to the bytes requested on more traces
//! (BENCHMARKS.md, "Open targets: the default placement's peak and calls", compares them).
//! Use this one where memory is tighter than calls.
//!
//! # Policy: map once, keep mapped, move pages only to hold the peak
//! The trade is reserved memory against driver calls. Mapping a page costs a cuMemCreate, a
//! cuMemMap and a cuMemSetAccess (their costs by size: BENCHMARKS.md, "Driver call costs"),
//! unmapping it a cuMemUnmap and perhaps a cuMemRelease. Unmapping every page as soon as no
//! block touches it reserves the least memory but makes a call on almost every allocation of
//! a training loop; a caching allocator makes none after the first step. This one aims at
//! the calls of the second with close to the memory of the first:
//! - **Pages stay mapped.** A freed block's pages stay mapped and open ("idle" when no block
//!   touches them) and are reused in place: a free makes no driver call, ever. The pages of
//!   a training step are mapped during the first steps and reused by the later ones.
//! - **Placement** puts a block best-fit into the free bytes of mapped pages (the smallest
//!   run that holds it, then the lowest address, as PyTorch's caching allocator picks a
//!   cached block): no driver call. Only when none holds it are pages mapped, at the spot
//!   that maps the fewest new pages (`placement.rs`).
//! - **The page limit.** New pages are created only while the pool holds fewer pages than
//!   the larger of its own peak so far and the peak of allocated bytes times
//!   `1 + headroom` ([`LazyPagedPool::with_headroom`]). Above it, idle extents elsewhere are
//!   unmapped and mapped where they are needed (cuMemUnmap + cuMemMap + cuMemSetAccess, no
//!   create or release), so the peak of `reserved_bytes` only moves when that is not enough.
//!   The headroom is the memory traded for calls: idle pages a later step finds mapped.
//! - **Mapping ahead.** Below the limit, a block that maps pages also maps up to
//!   [`LazyPagedPool::with_ahead_bytes`] more free pages after it, in handles of their own
//!   but the same cuMemSetAccess: a growing pool pays per call and per mapping, and the cost
//!   of cuMemSetAccess grows far more slowly than the bytes it opens, so fewer, larger spans
//!   cost less for the same bytes.
//! - **Handles.** Each run of new pages is cut into handles of a power of two of pages,
//!   largest first, at most [`LazyConfig::handle_bytes`](crate::config::LazyConfig::handle_bytes)
//!   (one cuMemCreate and one cuMemMap each; at most log2 of the run's pages handles): a
//!   few sizes of pieces that fit later runs. An idle extent moves whole, and one that a
//!   live block still touches in part cannot move at all: that is where this policy loses
//!   memory against `paged`. Smaller handles move more easily but a repeated step can then
//!   drift, placing a block one page lower each time and creating that page (this module's
//!   repeated-step test shows it); with 1 GiB handles (the default) it settles after the
//!   second step. Unmapped handles
//!   wait in a cache (at most
//!   [`AllocatorConfig::page_cache_pages`](crate::config::AllocatorConfig::page_cache_pages)
//!   pages, the largest released first) and fill later runs before anything is created.
//! - **Quick reuse.** Up to [`QUICK_SLOTS`] freed blocks (no bound on their bytes, unlike
//!   `paged`'s) are kept whole and handed out again to a request of the same rounded size
//!   (the O(1) hit path). They go back to the free space before any page is mapped, so they
//!   never raise the peak.
//!
//! Idle pages are given back only by [`Allocator::empty_cache`] (and on out-of-memory, which
//! calls it and retries), as PyTorch's expandable segments do.
//!
//! # Streams and devices
//! The `stream` argument is ignored: a freed block is reusable at once, on any stream, as
//! after PyTorch's `free_completed` (the caller frees only once the GPU is done with the
//! block). One allocator serves one device: the page size is learnt from the first
//! [`Device`] it is given.
//!
//! # Figures
//! - `allocated_bytes`: bytes of live blocks (requests rounded up to 256 bytes).
//! - `reserved_bytes`: physical bytes held: mapped pages plus cached handles. Its peak also
//!   records handles created by an allocation that later failed and was unwound.
//! - `free_bytes`: free bytes on mapped pages (what can be placed without a driver call);
//!   blocks held for quick reuse and cached handles are not counted.
//! - `largest_free_bytes`: the longest run of those bytes.
//! - `inactive_split_bytes`: the same free bytes on mapped pages while any block is live
//!   (cached memory that only a request fitting it can use, as in PyTorch's expandable
//!   segment, where they are split off the one segment); 0 when no block is live. Unlike
//!   `paged`'s, it includes idle pages that [`Allocator::empty_cache`] would give back.
//! - `segment_count`: physical handles held (mapped + cached).
//!
//! # Failures
//! Every allocation either completes or unwinds exactly the driver calls it made
//! (reservations freed, pages unmapped, created handles released, cached handles returned);
//! blocks and `requested`/`allocated` are then as before. A failed allocation may leave
//! three things changed, none of them memory taken: blocks of the quick-reuse list returned
//! to the free space, idle extents unmapped into the cache, and cached handles released
//! (`reserved_bytes` only drops). On out-of-memory it gives back the whole cache, as the
//! [`Allocator`] contract asks. A free makes no driver call and cannot fail (but for an
//! unknown address). If a cuMemUnmap *while unwinding* fails twice, the handle stays mapped,
//! quarantined out of the free space (still counted as reserved), and is given back by
//! [`Allocator::empty_cache`]; if a cuMemRelease fails twice, the handle stays cached, even
//! above the bound, until a later call trims the cache.
mod pages;
mod placement;
mod validate;
mod view;

use crate::config::AllocatorConfig;
use crate::hash::AddrMap;
use crate::{AllocError, Allocator, Block, Device, Stats};
use pages::Reservation;
use placement::{FreeSpace, Placement};

use crate::vmm::handles::ReleaseOrder;
use crate::vmm::quick::{QuickBlock, QuickList};
use crate::vmm::retry::{self, VmmPool};
use crate::vmm::Vmm;
use crate::vmm::{LiveBlock, QUICK_SLOTS};

/// The page-mapped allocator (see the module documentation).
///
/// ```
/// use gpumem_core::paged_lazy::LazyPagedPool;
/// use gpumem_core::vmm::PageState;
/// use gpumem_core::config::AllocatorConfig;
/// use gpumem_core::sim::SimDevice;
/// use gpumem_core::{Allocator, Device};
///
/// let mut dev = SimDevice::new(1 << 30); // 1 GiB, 2 MiB pages
/// let mut pool = LazyPagedPool::new(&AllocatorConfig::default()).with_ahead_bytes(0);
/// let small = pool.allocate(&mut dev, 1 << 20, 256, 0)?; // 1 MiB: maps one page
/// let big = pool.allocate(&mut dev, 5 << 20, 256, 0)?; // 5 MiB: shares that page, maps 2
/// assert_eq!(big.addr, small.addr + (1 << 20));
/// assert_eq!(pool.stats().reserved_bytes.current, 6 << 20);
/// // The page table: one row per physical handle.
/// let mapped: Vec<u64> = pool
///     .page_table()
///     .iter()
///     .filter(|row| row.state == PageState::Mapped)
///     .map(|row| row.bytes)
///     .collect();
/// assert_eq!(mapped, [2 << 20, 4 << 20]);
/// let calls = dev.calls_made();
/// pool.deallocate(&mut dev, big.addr)?;
/// pool.deallocate(&mut dev, small.addr)?;
/// let again = pool.allocate(&mut dev, 6 << 20, 256, 0)?; // in the idle pages
/// assert_eq!(dev.calls_made(), calls, "no driver call after the first use");
/// pool.deallocate(&mut dev, again.addr)?;
/// pool.empty_cache(&mut dev)?;
/// assert_eq!(dev.used_bytes(), 0);
/// pool.validate()?;
/// # Ok::<(), gpumem_core::AllocError>(())
/// ```
#[derive(Debug, Clone)]
pub struct LazyPagedPool {
    /// Fraction above the peak of allocated bytes the pool may hold before moving pages.
    headroom: f64,
    /// Most bytes mapped ahead of need by one allocation.
    ahead_bytes: u64,
    /// Largest handle created, in pages (0 until the page size is known: then
    /// `handle_bytes / page_bytes`).
    handle_pages: u64,
    /// Largest handle created, in bytes.
    handle_bytes: u64,
    /// The substrate: page size, reservations and their page tables, the handle cache
    /// (at most
    /// [`AllocatorConfig::page_cache_pages`](crate::config::AllocatorConfig::page_cache_pages)
    /// pages of them), quarantined spans, mapped pages and the figures.
    vmm: Vmm<pages::Extents>,
    /// Free ranges and mapped free runs.
    space: FreeSpace,
    /// Live blocks by address.
    live: AddrMap<u64, LiveBlock>,
    /// Recently freed blocks kept whole for reuse by a request of the same size (the O(1)
    /// hit path), oldest first; their bytes stay out of the free space. Bounded by
    /// [`QUICK_SLOTS`] blocks, not by bytes.
    quick: QuickList,
}

impl LazyPagedPool {
    /// A new, empty allocator; it reserves nothing until the first allocation.
    /// Uses `config.page_cache_pages` as the bound of the handle cache.
    pub fn new(config: &AllocatorConfig) -> Self {
        LazyPagedPool {
            headroom: f64::from(config.lazy.headroom_bp) / 10_000.0,
            ahead_bytes: config.lazy.ahead_bytes,
            handle_pages: 0,
            handle_bytes: config.lazy.handle_bytes,
            vmm: Vmm::new(config.page_cache_pages),
            space: FreeSpace::default(),
            live: AddrMap::default(),
            quick: QuickList::new(QUICK_SLOTS),
        }
    }

    /// Sets the headroom: how far above the peak of allocated bytes (as a fraction: 0.01 =
    /// 1 %) the pool may hold pages before it moves idle pages (unmap, map, set access)
    /// instead of creating new ones. More headroom, fewer driver calls in a training loop's
    /// steady state and larger spans while growing; less, a peak of reserved bytes closer to
    /// the peak of allocated ones. 0 keeps the peak as low as page placement allows. Default
    /// [`LazyConfig::headroom_bp`](crate::config::LazyConfig::headroom_bp) of the config; negative or non-finite values count as 0.
    pub fn with_headroom(mut self, fraction: f64) -> Self {
        self.headroom = if fraction.is_finite() {
            fraction.max(0.0)
        } else {
            0.0
        };
        self
    }

    /// Sets the most bytes an allocation that maps pages may map ahead of need (free pages
    /// right after the block, within the headroom; 0: only the pages under the block).
    /// Default [`LazyConfig::ahead_bytes`](crate::config::LazyConfig::ahead_bytes) of the config.
    pub fn with_ahead_bytes(mut self, bytes: u64) -> Self {
        self.ahead_bytes = bytes;
        self
    }

    /// Sets the largest physical handle created, in bytes (rounded down to whole pages, at
    /// least one page): a run of new pages gets one handle per this many bytes (one
    /// cuMemCreate and one cuMemMap each; still one cuMemSetAccess for the run). An idle
    /// handle moves only whole, so smaller handles keep the peak closer to the bytes in use,
    /// larger ones make fewer calls while the pool grows. Default [`LazyConfig::handle_bytes`](crate::config::LazyConfig::handle_bytes) of the config.
    pub fn with_handle_bytes(mut self, bytes: u64) -> Self {
        self.handle_bytes = bytes;
        self
    }

    /// Sets the virtual bytes reserved per cuMemAddressReserve (rounded up to the page size;
    /// a larger block gets a range of its own size). The default, 0, reserves
    /// [`VA_CAPACITY_FACTOR`](crate::vmm::VA_CAPACITY_FACTOR) × the device capacity.
    pub fn with_va_chunk_bytes(mut self, bytes: u64) -> Self {
        self.vmm.va_chunk_bytes = bytes;
        self
    }

    /// Sets how many freed blocks the quick-reuse list may hold (0 disables it). Default
    /// [`QUICK_SLOTS`].
    pub fn with_quick_slots(mut self, slots: usize) -> Self {
        self.quick.set_max_blocks(slots);
        self
    }

    /// Idle pages: mapped, open, and under no block (nor a block held for quick reuse).
    /// O(reserved pages).
    pub fn idle_pages(&self) -> u64 {
        let p = self.vmm.page_bytes;
        let mut n = 0;
        for r in &self.vmm.reservations {
            for (i, s) in r.pages.iter().enumerate() {
                if s.is_some_and(|s| s.access) {
                    let a = r.va + i as u64 * p;
                    let covered = self
                        .space
                        .mapped
                        .range(..=a)
                        .next_back()
                        .is_some_and(|(&st, &l)| st + l >= a + p);
                    n += u64::from(covered);
                }
            }
        }
        n
    }

    crate::vmm::vmm_accessors!();

    /// Blocks holding address space: live ones and those kept for quick reuse.
    fn blocks_held(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.live
            .iter()
            .map(|(&a, b)| (a, b.bytes))
            .chain(self.quick.iter().map(|q| (q.addr, q.bytes)))
    }

    /// Records a new live block.
    fn commit_live(&mut self, addr: u64, bytes: u64, requested: u64) -> Block {
        self.live.insert(addr, LiveBlock { bytes, requested });
        self.vmm.tracker.on_alloc(requested, bytes);
        Block {
            addr,
            requested_bytes: requested,
            allocated_bytes: bytes,
        }
    }

    /// A block in mapped free bytes, if one fits: no driver call.
    fn place_mapped(&mut self, bytes: u64, align: u64, requested: u64) -> Option<Block> {
        let (run, addr) = self.space.best_fit(bytes, align)?;
        self.space.take_mapped(run, addr, bytes);
        Some(self.commit_live(addr, bytes, requested))
    }

    /// Returns a block's span to the free space; its pages stay mapped. No driver call.
    fn free_span(&mut self, addr: u64, bytes: u64) -> Result<(), AllocError> {
        let ri = self.vmm.res_holding(addr, "block")?;
        let r = &self.vmm.reservations[ri];
        self.space.give(addr, bytes, r.va, r.end(), true);
        Ok(())
    }

    /// Gives every block of the quick list back to the free space.
    fn flush_quick(&mut self) -> Result<(), AllocError> {
        while let Some(q) = self.quick.pop_back() {
            self.free_span(q.addr, q.bytes)?;
        }
        Ok(())
    }
}

impl VmmPool for LazyPagedPool {
    fn page_bytes_mut(&mut self) -> &mut u64 {
        &mut self.vmm.page_bytes
    }

    /// The largest handle in pages, once the page size is known.
    fn pages_known(&mut self) {
        if self.handle_pages == 0 {
            self.handle_pages = (self.handle_bytes / self.vmm.page_bytes).max(1);
        }
    }

    /// One allocation attempt (no OOM retry).
    fn try_allocate(
        &mut self,
        dev: &mut dyn Device,
        bytes: u64,
        align: u64,
        requested: u64,
    ) -> Result<Block, AllocError> {
        if let Some(q) = self.quick.take(bytes, align) {
            return Ok(self.commit_live(q.addr, bytes, requested));
        }
        if let Some(b) = self.place_mapped(bytes, align, requested) {
            return Ok(b);
        }
        // Pages will be mapped: first give the quick list's blocks back, so that no page is
        // mapped while a block nobody uses holds mapped bytes.
        if !self.quick.is_empty() {
            self.flush_quick()?;
            if let Some(b) = self.place_mapped(bytes, align, requested) {
                return Ok(b);
            }
        }
        let mut grown = None;
        let pl = match self.place_growth(bytes, align) {
            Some(pl) => pl,
            None => {
                let ri = self.grow_va(dev, bytes)?;
                grown = Some(ri);
                Placement {
                    res: ri,
                    addr: self.vmm.reservations[ri].va,
                }
            }
        };
        let hi = match self.map_for_block(dev, pl.res, pl.addr, bytes) {
            Ok(hi) => hi,
            Err(e) => {
                if let Some(ri) = grown {
                    self.ungrow_va(dev, ri);
                }
                return Err(e.into());
            }
        };
        let p = self.vmm.page_bytes;
        self.space.take_va(pl.addr, bytes);
        let r = &self.vmm.reservations[pl.res];
        // The window: the block's pages and those mapped ahead of it.
        let lo = pl.addr - (pl.addr - r.va) % p;
        self.space.rebuild_mapped(r, p, lo, hi);
        Ok(self.commit_live(pl.addr, bytes, requested))
    }

    fn count_retry(&mut self) {
        self.vmm.tracker.stats.alloc_retries += 1;
    }

    fn allocated(&mut self, dev: &mut dyn Device) {
        if self.vmm.cache.trim_pending || self.vmm.cache.over(0) {
            self.trim_cache(dev);
        }
    }
}

impl Default for LazyPagedPool {
    fn default() -> Self {
        Self::new(&AllocatorConfig::default())
    }
}

impl Allocator for LazyPagedPool {
    fn name(&self) -> &'static str {
        "paged-lazy"
    }

    fn allocate(
        &mut self,
        dev: &mut dyn Device,
        size_bytes: u64,
        align: u64,
        _stream: u64,
    ) -> Result<Block, AllocError> {
        retry::allocate(self, dev, size_bytes, align)
    }

    fn deallocate(&mut self, _dev: &mut dyn Device, addr: u64) -> Result<(), AllocError> {
        let Some(blk) = self.live.remove(&addr) else {
            return Err(AllocError::UnknownBlock { addr });
        };
        self.vmm.tracker.on_free(blk.requested, blk.bytes);
        if self.quick.admits(blk.bytes) {
            // Make room in the quick list by truly freeing its oldest block.
            if let Some(old) = self.quick.must_go_for(blk.bytes) {
                self.quick.pop_front();
                self.free_span(old.addr, old.bytes)?;
            }
            self.quick.push_back(QuickBlock {
                addr,
                bytes: blk.bytes,
            });
            return Ok(());
        }
        self.free_span(addr, blk.bytes)
    }

    fn empty_cache(&mut self, dev: &mut dyn Device) -> Result<u64, AllocError> {
        self.flush_quick()?;
        while let Some(&(va, bytes)) = self.vmm.quarantine.first() {
            self.release_quarantined(dev, va, bytes)?;
            self.vmm.quarantine.remove(0);
        }
        self.drop_idle(dev)?;
        let released = self.vmm.release_cache(dev, ReleaseOrder::Largest)?;
        // Reservations without a live block go back too.
        crate::vmm::reserve::release_unused(&mut self.vmm.reservations, &mut self.space.va, dev)?;
        Ok(released)
    }

    fn stats(&self) -> Stats {
        let mut s = self.vmm.tracker.stats;
        s.free_bytes = self.space.mapped_bytes;
        s.largest_free_bytes = self.space.by_size.last().map_or(0, |&(l, _)| l);
        // Free bytes on mapped pages while some block is live: what PyTorch counts as
        // inactive split blocks of an expandable segment (cached, usable only by a request
        // that fits them). With no live block the free space is one unsplit block, as in
        // PyTorch, and counts nothing.
        if !self.live.is_empty() {
            s.inactive_split_bytes.add(s.free_bytes);
        }
        s
    }

    fn reserved_bytes(&self) -> crate::Counter {
        self.vmm.tracker.stats.reserved_bytes
    }

    fn validate(&self) -> Result<(), AllocError> {
        validate::run(self).map_err(AllocError::Internal)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
