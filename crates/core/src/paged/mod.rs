//! A page-mapped allocator over CUDA virtual memory management (cuMemAddressReserve,
//! cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree), the
//! mechanism behind PyTorch's `expandable_segments` and the address translation table
//! ("地址翻译表") of GPU memory tutorials: virtual addresses are reserved in large ranges and
//! cost nothing, and physical pages of the device granularity are mapped only under live
//! blocks. It is the page placement of `paged`; the driver's objects and their bookkeeping
//! (reservations, handles and their cache, mapping and unwinding, the quick list, the retry
//! on out-of-memory) are the substrate in [`crate::vmm`], shared with [`crate::paged_lazy`].
//!
//! This one unmaps pages as soon as no block touches them: the least memory of any strategy,
//! for a driver call on almost every allocation. [`crate::paged_lazy`] keeps them mapped
//! instead (no driver call in a repeated training step, some more memory).
//!
//! Where each idea lives: `placement.rs` (where a block goes), `pages.rs` (mapping and
//! unmapping runs of pages, unwinding), `cache.rs` (idle pages and the bound they share with
//! the handle cache), `page_bits.rs` (the idle pages of a reservation as a two-level
//! bitmap), `live.rs` (the live blocks by address: an open-addressing table, one multiply a
//! look-up), `view.rs` (the page-table view), `validate.rs` (the invariant checker).
//!
//! # Strategy
//! - **Virtual ranges.** The first allocation reserves `2 × capacity` of virtual address space
//!   (rounded to the granularity; more ranges are reserved when no free range is long enough).
//!   Blocks are placed anywhere in them, in 256-byte units; the VA is free to waste.
//! - **Physical pages** of [`Device::granularity_bytes`] are mapped under a block when it needs
//!   them; once no live block touches a page it joins the bounded page cache (below). Blocks
//!   share pages freely: a small block and the head of a 1 GiB block may sit in one page.
//! - **Placement** minimises the pages a new block maps. The fast path finds the
//!   lowest-addressed free range whose *mapped* part (the free tail of the page before it,
//!   or the free head of the page after it) holds the whole block: no driver call at all
//!   (each free range is tagged with those mapped bytes; the search compares 16 tags at a
//!   time, O(free ranges) but a few instructions per range).
//!   Otherwise every free range is scored by the pages the block would newly map when placed
//!   flush against its start or its end, then by the bytes of those new pages it would leave
//!   free (the waste it adds), then by address; this O(free ranges) scan only runs when at
//!   least one cuMemMap follows (a driver call costs far more than the scan), or when
//!   alignment above 256 bytes defeats the fast path. BENCHMARKS.md, "Allocators on traces",
//!   has the peaks it reaches on the shipped traces.
//! - **Handles.** The pages a block covers whole can never be shared, so each run of them
//!   gets one handle (one cuMemCreate and one cuMemMap for the whole run, not one per page);
//!   a page the block covers in part, which a later block may share, gets a handle of its
//!   own so that it can be unmapped alone.
//! - **Page cache.** Single pages no block touches any more stay mapped where they are
//!   ("idle", reused in place without a driver call); other freed handles are unmapped and
//!   kept whole. Idle pages and cached handles together stay within
//!   [`AllocatorConfig::page_cache_pages`](crate::config::AllocatorConfig::page_cache_pages)
//!   pages (beyond it the largest cached handles are released).
//!   A run of new pages is filled from the cache (a handle of the same size first, else the
//!   largest that fits, repeatedly), then from idle pages elsewhere (unmapped in runs, one
//!   call per run); only what is still missing is created, after the cached handles too
//!   large to use are released. No further bound by a fraction of usage is needed for the
//!   peak: cuMemCreate runs only when nothing cached or idle is left, so the peak of
//!   `reserved_bytes` (mapped + cached) equals the peak of pages under blocks.
//! - **Quick reuse.** Up to [`QUICK_SLOTS`] freed blocks (at most
//!   `page_cache_pages × page` bytes in all) are kept whole and handed out again to a request
//!   of the same rounded size and a compatible alignment: the O(1) hit path. They are given
//!   back to the free map before any page is mapped, so they never raise the peak either.
//! - **Batching.** One cuMemSetAccess opens all the pages an allocation maps, spanning any
//!   already open page between them; a free unmaps the run of pages only it touched with one
//!   cuMemUnmap.
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
//! - `free_bytes`: bytes left free inside the pages that live blocks (or blocks held for
//!   quick reuse) touch: the fragmentation that costs physical memory. Idle pages, cached
//!   handles and quick-reuse blocks are not counted (they are `reserved − allocated − free`).
//! - `largest_free_bytes`: the longest free run of bytes inside those same pages (the
//!   largest block that can be placed without a driver call).
//! - `segment_count`: physical handles held (mapped + cached).
//!
//! # Failures
//! Every allocation either completes or unwinds exactly the driver calls it made
//! (reservations freed, pages unmapped, created handles released, cached handles returned);
//! blocks and `requested`/`allocated` are then as before. A failed allocation may leave
//! three things changed, none of them memory taken: blocks of the quick-reuse list returned
//! to the free map, idle pages turned into cached handles, and cached handles too large to
//! use released (`reserved_bytes` only drops). On out-of-memory it gives back the whole
//! cache, as the [`Allocator`] contract asks. A free unmaps first (one call); if that call fails the block
//! stays live and nothing changes. If a cuMemUnmap *while unwinding* fails twice, the pages
//! stay mapped, quarantined out of the free map (still counted as reserved), and are given
//! back by [`Allocator::empty_cache`]; if a cuMemRelease fails, the handle stays cached, even
//! above the bound, until a later call trims the cache. Calls made while unwinding are
//! retried once before falling back to that.
mod cache;
mod live;
mod page_bits;
mod pages;
mod placement;
mod view;

use crate::align::{align_down, align_up};
use crate::config::AllocatorConfig;
use crate::device::DeviceError;
use crate::vmm::handles::ReleaseOrder;
use crate::vmm::map::{self, Page, PlanRun, Taken};
use crate::vmm::quick::{QuickBlock, QuickList};
use crate::vmm::range_map;
use crate::vmm::reserve;
use crate::vmm::retry::{self, VmmPool};
use crate::vmm::Vmm;
use crate::vmm::{CachedHandle, LiveBlock, QUICK_SLOTS, UNIT_BYTES};
use crate::{AllocError, Allocator, Block, Device, Stats};

impl reserve::PageIndex for page_bits::PageBits {
    fn new(npages: usize) -> Self {
        page_bits::PageBits::new(npages)
    }
}

/// Where a new block goes.
#[derive(Debug, Clone, Copy)]
struct Placement {
    /// Index into `reservations`.
    res: usize,
    /// Start of the free range it is cut from.
    range_start: u64,
    /// Position of that range in the free map when the search found it (`usize::MAX`
    /// when unknown), so that the commit need not search for it.
    pos: usize,
    /// Block address.
    addr: u64,
}

/// The page-mapped allocator (see the module documentation).
///
/// ```
/// use gpumem_core::paged::PagedPool;
/// use gpumem_core::vmm::PageState;
/// use gpumem_core::config::AllocatorConfig;
/// use gpumem_core::sim::SimDevice;
/// use gpumem_core::{Allocator, Device};
///
/// let mut dev = SimDevice::new(1 << 30); // 1 GiB, 2 MiB pages
/// let mut pool = PagedPool::new(&AllocatorConfig::default());
/// let small = pool.allocate(&mut dev, 1 << 20, 256, 0)?; // 1 MiB: maps one page
/// let big = pool.allocate(&mut dev, 5 << 20, 256, 0)?; // 5 MiB: shares that page, maps 2
/// assert_eq!(big.addr, small.addr + (1 << 20));
/// assert_eq!(pool.stats().reserved_bytes.current, 6 << 20);
/// // The page table: one row per physical handle (the 2 pages `big` covers whole share one).
/// let mapped: Vec<u64> = pool
///     .page_table()
///     .iter()
///     .filter(|row| row.state == PageState::Mapped)
///     .map(|row| row.bytes)
///     .collect();
/// assert_eq!(mapped, [2 << 20, 4 << 20]);
/// pool.deallocate(&mut dev, big.addr)?;
/// pool.deallocate(&mut dev, small.addr)?;
/// pool.empty_cache(&mut dev)?;
/// assert_eq!(dev.used_bytes(), 0);
/// pool.validate()?;
/// # Ok::<(), gpumem_core::AllocError>(())
/// ```
#[derive(Debug, Clone)]
pub struct PagedPool {
    /// The substrate: page size, reservations and their page tables, the handle cache
    /// (bounded with the idle pages by
    /// [`AllocatorConfig::page_cache_pages`](crate::config::AllocatorConfig::page_cache_pages)
    /// pages), quarantined spans, mapped pages and the figures.
    ///
    /// Each reservation's page table is sparse (see
    /// [`slots`](crate::vmm::slots)): a mapped handle's entry sits in the slots of its extent's first and last
    /// pages (one slot for a single page); the slots inside an extent stay `None`, so that
    /// mapping or unmapping a handle of any size writes two slots. Every page a lookup asks
    /// about is a single page or an extent's end: a handle of several pages lies under the
    /// pages one block covers whole, so a page holding a free byte (where a block starts or
    /// ends, or an idle page) is a single page, and a block's end pages are its extents' ends.
    /// Its index is its idle pages: single-page handles mapped, but touched by no block, kept
    /// mapped for reuse in place (lazy unmapping).
    vmm: Vmm<page_bits::PageBits>,
    /// Free virtual ranges: start → length in bytes; coalesced within a reservation. Each
    /// range's tag is its mapped fit ([`placement::fit_of`]): the most bytes a block can take
    /// in it without mapping a page, in [`UNIT_BYTES`] units.
    free: range_map::RangeMap<range_map::FitTags>,
    /// Live blocks by address.
    live: live::LiveMap,
    /// Idle pages in all reservations (each reservation lists its own in its index).
    idle_count: u64,
    /// Whether pages no block touches stay mapped (idle) while the page cache has room.
    lazy_unmap: bool,
    /// Recently freed blocks kept whole for reuse by a request of the same size (the O(1)
    /// hit path), oldest first; their bytes stay out of the free map. Bounded by
    /// [`QUICK_SLOTS`] blocks and by the page cache's bytes.
    quick: QuickList,
    /// Scratch list of the handles a free unmaps (kept to spare an allocation per free).
    freed_scratch: Vec<CachedHandle>,
    /// Scratch list of the handles an allocation maps (kept to spare an allocation per
    /// mapping allocation; an error path may leave it empty).
    taken_scratch: Vec<Taken>,
    /// Scratch plan of the runs an allocation maps, `(first page, handle, pages)` (kept to
    /// spare an allocation per mapping allocation; an error path may leave it empty).
    plan_scratch: Vec<PlanRun>,
    /// The plan's second buffer: the cache fill rewrites the plan into it, then swaps.
    plan_spare: Vec<PlanRun>,
    /// Scratch list of the idle pages an allocation takes (addresses, descending).
    picked_scratch: Vec<u64>,
    /// Scratch list of the handles of a run of idle pages on their way to the cache.
    cached_handle_scratch: Vec<CachedHandle>,
}

impl PagedPool {
    /// A new, empty allocator; it reserves nothing until the first allocation.
    /// Uses `config.page_cache_pages` as the bound of the page cache.
    pub fn new(config: &AllocatorConfig) -> Self {
        PagedPool {
            vmm: Vmm::new(config.page_cache_pages),
            free: range_map::RangeMap::default(),
            live: live::LiveMap::default(),
            idle_count: 0,
            lazy_unmap: true,
            quick: QuickList::new(QUICK_SLOTS),
            freed_scratch: Vec::new(),
            taken_scratch: Vec::new(),
            plan_scratch: Vec::new(),
            plan_spare: Vec::new(),
            picked_scratch: Vec::new(),
            cached_handle_scratch: Vec::new(),
        }
    }

    /// Sets the virtual bytes reserved per cuMemAddressReserve (rounded up to the page size;
    /// a larger block gets a range of its own size). The default, 0, reserves
    /// [`VA_CAPACITY_FACTOR`](crate::vmm::VA_CAPACITY_FACTOR) × the device capacity.
    pub fn with_va_chunk_bytes(mut self, bytes: u64) -> Self {
        self.vmm.va_chunk_bytes = bytes;
        self
    }

    /// Sets how many freed blocks the quick-reuse list may hold (0 disables it: every free
    /// then unmaps at once the pages no live block touches). Default [`QUICK_SLOTS`].
    pub fn with_quick_slots(mut self, slots: usize) -> Self {
        self.quick.set_max_blocks(slots);
        self
    }

    /// Whether a single-page handle that no block touches any more stays mapped, "idle", to
    /// be reused in place without a driver call (default `true`), as long as idle pages and
    /// cached handles together stay within [`AllocatorConfig::page_cache_pages`](crate::config::AllocatorConfig::page_cache_pages); otherwise it is
    /// unmapped at once (one cuMemUnmap per freed run of pages) and its handle cached. Idle pages are taken
    /// (unmapped and remapped elsewhere) before any cuMemCreate, so they never raise the peak.
    pub fn with_lazy_unmap(mut self, lazy: bool) -> Self {
        self.lazy_unmap = lazy;
        self
    }
}

impl VmmPool for PagedPool {
    fn page_bytes_mut(&mut self) -> &mut u64 {
        &mut self.vmm.page_bytes
    }

    /// The quick list holds at most the page cache's bytes.
    #[inline]
    fn pages_known(&mut self) {
        self.quick.set_max_bytes(Some(
            self.vmm
                .cache
                .limit_pages()
                .saturating_mul(self.vmm.page_bytes),
        ));
    }

    /// One allocation attempt (no OOM retry).
    fn try_allocate(
        &mut self,
        dev: &mut dyn Device,
        bytes: u64,
        align: u64,
        requested: u64,
    ) -> Result<Block, AllocError> {
        let block = |addr| Block {
            addr,
            requested_bytes: requested,
            allocated_bytes: bytes,
        };
        if let Some(q) = self.quick.take(bytes, align) {
            self.live.insert(q.addr, LiveBlock { bytes, requested });
            self.vmm.tracker.on_alloc(requested, bytes);
            return Ok(block(q.addr));
        }
        if let Some(pl) = self.find_mapped_fit(bytes, align) {
            self.commit_block(pl, bytes, requested, None);
            return Ok(block(pl.addr));
        }
        // Pages will be mapped: first give the quick list's blocks back, so that no page is
        // mapped while a block nobody uses holds another one (the peak stays exact).
        if !self.quick.is_empty() {
            self.flush_quick(dev);
            if let Some(pl) = self.find_mapped_fit(bytes, align) {
                self.commit_block(pl, bytes, requested, None);
                return Ok(block(pl.addr));
            }
        }
        let mut grown = None;
        let pl = match self.find_scored_fit(bytes, align) {
            Some((pl, _)) => pl,
            None => {
                let ri = self.grow(dev, bytes)?;
                grown = Some(ri);
                let r = &self.vmm.reservations[ri];
                Placement {
                    res: ri,
                    range_start: r.va,
                    pos: usize::MAX,
                    addr: r.va,
                }
            }
        };
        let ends_mapped = match self.map_block_pages(dev, pl.res, pl.addr, bytes) {
            Ok(ends) => ends,
            Err(e) => {
                if let Some(ri) = grown {
                    self.ungrow(dev, ri);
                }
                return Err(e.into());
            }
        };
        self.commit_block(pl, bytes, requested, Some(ends_mapped));
        Ok(block(pl.addr))
    }

    fn count_retry(&mut self) {
        self.vmm.tracker.stats.alloc_retries += 1;
    }

    #[inline]
    fn allocated(&mut self, dev: &mut dyn Device) {
        self.trim_cache(dev);
    }
}

impl Default for PagedPool {
    fn default() -> Self {
        Self::new(&AllocatorConfig::default())
    }
}

impl Allocator for PagedPool {
    fn name(&self) -> &'static str {
        "paged"
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

    fn deallocate(&mut self, dev: &mut dyn Device, addr: u64) -> Result<(), AllocError> {
        // Out of the live map at once (one hash probe); put back if the free fails.
        let Some(blk) = self.live.remove(&addr) else {
            return Err(AllocError::UnknownBlock { addr });
        };
        if self.quick.admits(blk.bytes) {
            // Make room in the quick list by truly freeing its oldest blocks.
            while let Some(old) = self.quick.must_go_for(blk.bytes) {
                if self.free_span(dev, old.addr, old.bytes).is_err() {
                    break;
                }
                self.quick.pop_front();
            }
            if self.quick.has_room(blk.bytes) {
                self.vmm.tracker.on_free(blk.requested, blk.bytes);
                self.quick.push_back(QuickBlock {
                    addr,
                    bytes: blk.bytes,
                });
                self.trim_cache(dev);
                return Ok(());
            }
        }
        if let Err(e) = self.free_span(dev, addr, blk.bytes) {
            self.live.insert(addr, blk);
            return Err(e);
        }
        self.vmm.tracker.on_free(blk.requested, blk.bytes);
        self.trim_cache(dev);
        Ok(())
    }
    fn empty_cache(&mut self, dev: &mut dyn Device) -> Result<u64, AllocError> {
        while let Some(q) = self.quick.front() {
            self.free_span(dev, q.addr, q.bytes)?;
            self.quick.pop_front();
        }
        while let Some(&(va, bytes)) = self.vmm.quarantine.first() {
            self.free_span(dev, va, bytes)?;
            self.vmm.quarantine.remove(0);
        }
        self.drop_idle_pages(dev)?;
        let released = self.vmm.release_cache(dev, ReleaseOrder::LastCached)?;
        // Reservations without a live block go back too.
        reserve::release_unused(&mut self.vmm.reservations, &mut self.free, dev)?;
        Ok(released)
    }

    fn stats(&self) -> Stats {
        let mut s = self.vmm.tracker.stats;
        let in_use = self.vmm.mapped_pages.saturating_sub(self.idle_count) * self.vmm.page_bytes;
        s.free_bytes = in_use
            .saturating_sub(s.allocated_bytes.current)
            .saturating_sub(self.quick.bytes());
        s.largest_free_bytes = u64::from(self.free.max_tag()) * UNIT_BYTES;
        // Free bytes inside mapped pages that hold live blocks (idle pages are excluded above).
        s.inactive_split_bytes.add(s.free_bytes);
        s
    }

    fn reserved_bytes(&self) -> crate::Counter {
        self.vmm.tracker.stats.reserved_bytes
    }

    fn validate(&self) -> Result<(), AllocError> {
        validate::run(self).map_err(AllocError::Internal)
    }
}

pub(crate) mod validate;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
