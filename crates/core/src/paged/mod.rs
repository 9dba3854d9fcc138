//! A page-mapped allocator over CUDA virtual memory management (cuMemAddressReserve,
//! cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree), the
//! mechanism behind PyTorch's `expandable_segments` and the "地址翻译表" of the seed text:
//! virtual addresses are reserved in large ranges and cost nothing, and physical pages of the
//! device granularity are mapped only under live blocks.
//!
//! # Strategy
//! - **Virtual ranges.** The first allocation reserves `2 × capacity` of virtual address space
//!   (rounded to the granularity; more ranges are reserved when no free range is long enough).
//!   Blocks are placed anywhere in them, in 256-byte units; the VA is free to waste.
//! - **Physical pages** of [`Device::granularity_bytes`] are mapped under a block when it needs
//!   them; once no live block touches a page it joins the bounded page cache (below). Blocks
//!   share pages freely: a small block and the head of a 1 GiB block may sit in one page.
//! - **Placement** minimises the pages a new block maps. The fast path finds, in O(log n),
//!   the lowest-addressed free range whose *mapped* part (the free tail of the page before it,
//!   or the free head of the page after it) holds the whole block: no driver call at all.
//!   Otherwise every free range is scored by the pages the block would newly map when placed
//!   flush against its start or its end, then by the bytes of those new pages it would leave
//!   free (the waste it adds), then by address; this O(free ranges) scan only runs when at
//!   least one cuMemMap follows (≥ 25 µs on an H200), or when alignment above 256 bytes
//!   defeats the fast path. On the three shipped PyTorch traces (`traces/`), peak reserved /
//!   peak requested is 1.0016 (resnet_train), 1.0014 (gpt2_train) and 1.0110 (mixed_sizes),
//!   against 1.115 / 1.213 / 1.714 for PyTorch's native allocator.
//! - **Handles.** The pages a block covers whole can never be shared, so each run of them
//!   gets one handle (one cuMemCreate and one cuMemMap for the run: 13 µs for 64 MiB against
//!   10 µs per 2 MiB page); a page the block covers in part, which a later block may share,
//!   gets a handle of its own so that it can be unmapped alone.
//! - **Page cache.** Single pages no block touches any more stay mapped where they are
//!   ("idle", reused in place without a driver call); other freed handles are unmapped and
//!   kept whole. Idle pages and cached handles together stay within
//!   [`AllocatorConfig::page_cache_pages`](crate::config::AllocatorConfig::page_cache_pages) pages (beyond it the largest cached handles are released).
//!   A run of new pages is filled from the cache (a handle of the same size first, else the
//!   largest that fits, repeatedly), then from idle pages elsewhere (unmapped in runs, one
//!   call per run); only what is still missing is created, after the cached handles too
//!   large to use are released. No further bound by a fraction of usage is needed for the
//!   peak: cuMemCreate runs only when nothing cached or idle is left, so the peak of
//!   `reserved_bytes` (mapped + cached) equals the peak of pages under blocks.
//! - **Quick reuse.** Up to [`QUICK_SLOTS`] freed blocks (at most
//!   `page_cache_pages × page` bytes in all) are kept whole and handed out again to a request
//!   of the same rounded size and a compatible alignment: the O(1) hit path (≈ 30 ns per
//!   allocate + free pair). They are given back to the free map before any page is mapped,
//!   so they never raise the peak either.
//! - **Batching.** One cuMemSetAccess (24–93 µs) opens all the pages an allocation maps,
//!   spanning any already open page between them; a free unmaps the run of pages only it
//!   touched with one cuMemUnmap.
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
mod maxtree;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::align::{align_down, align_up, is_pow2};
use crate::config::AllocatorConfig;
use crate::device::{DeviceError, PhysHandle};
use crate::{AllocError, Allocator, Block, Device, Stats, StatsTracker, DEFAULT_ALIGN};
use maxtree::MaxTree;

/// Allocation unit in bytes: every block size and address is a multiple of it.
pub const UNIT_BYTES: u64 = DEFAULT_ALIGN;

/// Virtual address space reserved by the first reservation, as a multiple of the device
/// capacity.
pub const VA_CAPACITY_FACTOR: u64 = 2;

/// Multiplicative hasher for block addresses (the keys are 256-byte-aligned device
/// addresses; SipHash would cost more than the rest of the fast path).
#[derive(Default, Clone, Copy)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n >> 8).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// [`PagedPool::usable_head`] with page size `p`.
fn usable_head_at(p: u64, base: u64, st: u64, len: u64) -> u64 {
    let rel = st - base;
    let i0 = rel.div_ceil(p);
    let i1 = (rel + len) / p;
    if i1 <= i0 {
        len
    } else {
        i0 * p - rel
    }
}

/// The tail leaf the free range `[st, st + len)` of a reservation starting at `base` feeds:
/// `(page, bytes)` when it ends inside page `page` and covers the whole page before it
/// (so the free bytes at that page's head are usable next to its mapped part).
fn tail_leaf(p: u64, base: u64, st: u64, len: u64) -> Option<(usize, u64)> {
    let b = st + len;
    let page = (b - base) / p;
    let ps = base + page * p;
    (b > ps && st + p <= ps).then_some((page as usize, b - ps))
}

/// A live block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LiveBlock {
    /// Bytes set aside (multiple of [`UNIT_BYTES`]).
    bytes: u64,
    /// Bytes the user asked for.
    requested: u64,
}

/// A freed block held in the quick-reuse list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QuickBlock {
    addr: u64,
    /// Allocated bytes (multiple of [`UNIT_BYTES`]).
    bytes: u64,
}

/// Freed blocks held for same-size reuse, at most (default of [`PagedPool::with_quick_slots`]).
pub const QUICK_SLOTS: usize = 16;

/// A mapped physical page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Page {
    /// The handle mapped over this page's extent.
    handle: PhysHandle,
    /// First page (index in the reservation) of the extent the handle covers.
    ext_first: u32,
    /// Pages in that extent (1 for a single-page handle).
    ext_pages: u32,
    /// Live or quick-reuse blocks touching the page (0 for an idle page).
    refs: u32,
    /// Whether cuMemSetAccess succeeded over it.
    access: bool,
}

/// One reserved virtual range and its pages.
#[derive(Debug, Clone)]
struct Reservation {
    va: u64,
    bytes: u64,
    /// One slot per page: `Some` when mapped.
    pages: Vec<Option<Page>>,
    /// Leaf `2p` = free bytes usable at the head of page `p` by the free range ending in it;
    /// leaf `2p + 1` = the most usable mapped bytes of a free range starting in page `p`;
    /// in [`UNIT_BYTES`] units.
    tree: MaxTree,
    /// Free ranges starting in each page (tells [`PagedPool::update_leaves`] when a head leaf
    /// can be recomputed without reading the free map).
    starts: Vec<u32>,
}

impl Reservation {
    fn end(&self) -> u64 {
        self.va + self.bytes
    }
}

/// State of one row of the page-table view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PageState {
    /// Pages mapped to one physical handle.
    Mapped {
        /// The cuMemCreate handle mapped there.
        handle: PhysHandle,
        /// Blocks touching the page, live or held for quick reuse (0: an idle page).
        live_blocks: u32,
        /// Whether cuMemSetAccess opened it to the device.
        access: bool,
    },
    /// Reserved virtual addresses with no physical memory behind them.
    ReservedUnmapped,
}

/// One row of [`PagedPool::page_table`]: a stretch of one reserved range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct VaRangeView {
    /// First virtual address of the row.
    pub va: u64,
    /// Length of the row in bytes (the handle's size when mapped; any number of pages when
    /// not).
    pub bytes: u64,
    /// Physical page size (the device granularity), in bytes.
    pub page_bytes: u64,
    /// Mapped (with its handle) or reserved-unmapped.
    pub state: PageState,
}

impl std::fmt::Display for VaRangeView {
    /// One row of the seed's table: `virtual range | physical | page size | state`, e.g.
    /// `0x7f0000000000 - 0x7f0000200000 | handle 3 | 2 MiB | mapped, 2 blocks`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let end = self.va.saturating_add(self.bytes);
        let page = if self.page_bytes >= 1 << 20 && self.page_bytes.is_multiple_of(1 << 20) {
            format!("{} MiB", self.page_bytes >> 20)
        } else {
            format!("{} KiB", self.page_bytes >> 10)
        };
        match self.state {
            PageState::Mapped {
                handle,
                live_blocks,
                access,
            } => {
                let what = match (live_blocks, access) {
                    (0, _) => "mapped, idle".to_string(),
                    (n, true) => format!("mapped, {n} block{}", if n == 1 { "" } else { "s" }),
                    (n, false) => format!("mapped without access, {n} blocks"),
                };
                write!(
                    f,
                    "{:#x} - {end:#x} | handle {} | {page} | {what}",
                    self.va, handle.0
                )
            }
            PageState::ReservedUnmapped => write!(
                f,
                "{:#x} - {end:#x} | unmapped | {page} | reserved, {} pages",
                self.va,
                self.bytes / self.page_bytes.max(1)
            ),
        }
    }
}

/// Where a new block goes.
#[derive(Debug, Clone, Copy)]
struct Placement {
    /// Index into `reservations`.
    res: usize,
    /// Start of the free range it is cut from.
    range_start: u64,
    /// Block address.
    addr: u64,
}

/// A physical handle of `pages` pages (cuMemCreate of `pages × page_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CachedHandle {
    /// The cuMemCreate handle.
    pub handle: PhysHandle,
    /// Its size in pages.
    pub pages: u64,
}

/// A handle mapped for a new block during an allocation, to give back on failure.
#[derive(Debug, Clone, Copy)]
struct Taken {
    /// First page (index in the reservation) it is mapped at.
    page: usize,
    handle: CachedHandle,
    from_cache: bool,
}

/// The page-mapped allocator (see the module documentation).
///
/// ```
/// use gpumem_core::paged::{PageState, PagedPool};
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
///     .filter(|row| matches!(row.state, PageState::Mapped { .. }))
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
    /// Bound on idle pages + cached handles, in pages ([`AllocatorConfig::page_cache_pages`](crate::config::AllocatorConfig::page_cache_pages)).
    cache_limit: u64,
    /// Virtual bytes per reservation; 0 = [`VA_CAPACITY_FACTOR`] × device capacity.
    va_chunk_bytes: u64,
    /// Page size in bytes (the device granularity), known after the first allocation.
    page_bytes: u64,
    /// Reserved ranges in address order.
    reservations: Vec<Reservation>,
    /// Free virtual ranges: start → length in bytes; coalesced within a reservation.
    free: BTreeMap<u64, u64>,
    /// Live blocks by address.
    live: AddrMap<LiveBlock>,
    /// Unmapped physical handles kept for reuse.
    cache: Vec<CachedHandle>,
    /// How many handles of each size (in pages) `cache` holds, so that a pick finds the
    /// size it wants without walking the cache.
    cache_sizes: BTreeMap<u64, u32>,
    /// Pages of the handles in `cache`.
    cached_pages: u64,
    /// Spans (address, bytes) of whole pages left mapped without access by an unwind whose
    /// cuMemUnmap failed twice; kept out of the free map until [`Allocator::empty_cache`].
    quarantine: Vec<(u64, u64)>,
    /// Pages currently mapped (including idle ones).
    mapped_pages: u64,
    /// Virtual addresses of idle pages: single-page handles mapped, but touched by no block,
    /// kept mapped for reuse in place (lazy unmapping).
    idle: BTreeSet<u64>,
    /// Whether pages no block touches stay mapped (idle) while the page cache has room.
    lazy_unmap: bool,
    /// Set while the cache is above its bound (handles parked by a flush, or a failed
    /// cuMemRelease); the next successful call trims it.
    trim_pending: bool,
    /// Recently freed blocks kept whole for reuse by a request of the same size (the O(1)
    /// hit path), oldest first; their bytes stay out of the free map.
    quick: Vec<QuickBlock>,
    /// Bytes of the blocks in `quick`.
    quick_bytes: u64,
    /// Most blocks `quick` may hold.
    quick_slots: usize,
    /// Figures in PyTorch's vocabulary.
    tracker: StatsTracker,
}

impl PagedPool {
    /// A new, empty allocator; it reserves nothing until the first allocation.
    /// Uses `config.page_cache_pages` as the bound of the page cache.
    pub fn new(config: &AllocatorConfig) -> Self {
        PagedPool {
            cache_limit: config.page_cache_pages,
            va_chunk_bytes: 0,
            page_bytes: 0,
            reservations: Vec::new(),
            free: BTreeMap::new(),
            live: AddrMap::default(),
            cache: Vec::new(),
            cache_sizes: BTreeMap::new(),
            cached_pages: 0,
            quarantine: Vec::new(),
            mapped_pages: 0,
            idle: BTreeSet::new(),
            lazy_unmap: true,
            trim_pending: false,
            quick: Vec::new(),
            quick_bytes: 0,
            quick_slots: QUICK_SLOTS,
            tracker: StatsTracker::default(),
        }
    }

    /// Sets the virtual bytes reserved per cuMemAddressReserve (rounded up to the page size;
    /// a larger block gets a range of its own size). The default, 0, reserves
    /// [`VA_CAPACITY_FACTOR`] × the device capacity.
    pub fn with_va_chunk_bytes(mut self, bytes: u64) -> Self {
        self.va_chunk_bytes = bytes;
        self
    }

    /// Sets how many freed blocks the quick-reuse list may hold (0 disables it: every free
    /// then unmaps at once the pages no live block touches). Default [`QUICK_SLOTS`].
    pub fn with_quick_slots(mut self, slots: usize) -> Self {
        self.quick_slots = slots;
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

    /// Idle pages: mapped, but touched by no live block.
    pub fn idle_pages(&self) -> u64 {
        self.idle.len() as u64
    }

    /// Page size in bytes (the device granularity); 0 before the first allocation.
    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// Pages mapped now (under live blocks, plus idle pages left by a failed unwind).
    pub fn mapped_pages(&self) -> u64 {
        self.mapped_pages
    }

    /// Unmapped physical handles in the cache.
    pub fn cached_handles(&self) -> &[CachedHandle] {
        &self.cache
    }

    /// Pages of the unmapped handles in the cache.
    pub fn cached_pages(&self) -> u64 {
        self.cached_pages
    }

    /// Reserved virtual ranges as `(start, bytes)`.
    pub fn reserved_ranges(&self) -> Vec<(u64, u64)> {
        self.reservations.iter().map(|r| (r.va, r.bytes)).collect()
    }

    /// Live blocks as `(addr, allocated_bytes)` in address order.
    pub fn live_blocks(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<_> = self.live.iter().map(|(&a, b)| (a, b.bytes)).collect();
        v.sort_unstable();
        v
    }

    /// The page table, the seed's "地址翻译表": every reserved range from low to high
    /// addresses, one row per mapped handle (one or more pages, with its physical handle) and
    /// one row per run of unmapped pages. O(reserved pages).
    pub fn page_table(&self) -> Vec<VaRangeView> {
        let p = self.page_bytes;
        let mut rows: Vec<VaRangeView> = Vec::new();
        for r in &self.reservations {
            for (i, slot) in r.pages.iter().enumerate() {
                let va = r.va + i as u64 * p;
                match slot {
                    Some(pg) if pg.ext_first as usize != i => {}
                    Some(pg) => rows.push(VaRangeView {
                        va,
                        bytes: u64::from(pg.ext_pages) * p,
                        page_bytes: p,
                        state: PageState::Mapped {
                            handle: pg.handle,
                            live_blocks: pg.refs,
                            access: pg.access,
                        },
                    }),
                    None => match rows.last_mut() {
                        Some(last)
                            if last.state == PageState::ReservedUnmapped
                                && last.va + last.bytes == va =>
                        {
                            last.bytes += p
                        }
                        _ => rows.push(VaRangeView {
                            va,
                            bytes: p,
                            page_bytes: p,
                            state: PageState::ReservedUnmapped,
                        }),
                    },
                }
            }
        }
        rows
    }

    /// Index of the reservation holding `addr`.
    fn res_of(&self, addr: u64) -> Option<usize> {
        let i = self.reservations.partition_point(|r| r.va <= addr);
        let i = i.checked_sub(1)?;
        (addr < self.reservations[i].end()).then_some(i)
    }

    /// Mapped bytes a block may use at the start of the free range `[st, st+len)` in a
    /// reservation starting at `base`: the whole range when it has no interior page, else the
    /// free tail of the page holding `st`.
    fn usable_head(&self, base: u64, st: u64, len: u64) -> u64 {
        usable_head_at(self.page_bytes, base, st, len)
    }

    /// Updates the tree leaves after the free map of reservation `ri` lost the ranges
    /// `removed` and gained `added` (`(start, bytes)` each; the map already changed). Each
    /// range feeds the tail leaf of the page it ends in (no other range can: it covers that
    /// page's start) and the head leaf of the page it starts in (a maximum over the ranges
    /// starting there). Only a head leaf whose maximum was a removed range, on a page where
    /// other ranges still start, reads the free map again.
    fn update_leaves(&mut self, ri: usize, removed: &[(u64, u64)], added: &[(u64, u64)]) {
        let p = self.page_bytes;
        let free = &self.free;
        let Some(r) = self.reservations.get_mut(ri) else {
            return;
        };
        let base = r.va;
        let units = |b: u64| u32::try_from(b / UNIT_BYTES).unwrap_or(u32::MAX);
        let page_of = |a: u64| ((a - base) / p) as usize;
        let mut rescan = [usize::MAX; 4];
        let mut n_rescan = 0;
        for &(st, len) in removed {
            if let Some((pg, _)) = tail_leaf(p, base, st, len) {
                r.tree.set(2 * pg, 0);
            }
            let pg = page_of(st);
            if let Some(c) = r.starts.get_mut(pg) {
                *c = c.saturating_sub(1);
            }
            let u = units(usable_head_at(p, base, st, len));
            if u > 0 && r.tree.get(2 * pg + 1) == u && !rescan[..n_rescan].contains(&pg) {
                if let Some(slot) = rescan.get_mut(n_rescan) {
                    *slot = pg;
                    n_rescan += 1;
                }
            }
        }
        for &(st, len) in added {
            if let Some((pg, t)) = tail_leaf(p, base, st, len) {
                r.tree.set(2 * pg, units(t));
            }
            let pg = page_of(st);
            if let Some(c) = r.starts.get_mut(pg) {
                *c += 1;
            }
            let u = units(usable_head_at(p, base, st, len));
            if !rescan[..n_rescan].contains(&pg) && u > r.tree.get(2 * pg + 1) {
                r.tree.set(2 * pg + 1, u);
            }
        }
        for &pg in &rescan[..n_rescan] {
            let mut here = 0u32;
            let mut head = 0u64;
            for &(st, len) in added.iter().filter(|&&(st, _)| page_of(st) == pg) {
                here += 1;
                head = head.max(usable_head_at(p, base, st, len));
            }
            if r.starts.get(pg).copied() != Some(here) {
                let ps = base + pg as u64 * p;
                head = free
                    .range(ps..ps + p)
                    .map(|(&st, &len)| usable_head_at(p, base, st, len))
                    .max()
                    .unwrap_or(0);
            }
            r.tree.set(2 * pg + 1, units(head));
        }
    }

    /// Fast path: the lowest-addressed spot where `bytes` fit (aligned to `align`) without
    /// mapping a page.
    fn find_mapped_fit(&self, bytes: u64, align: u64) -> Option<Placement> {
        let p = self.page_bytes;
        let need = bytes + align.saturating_sub(UNIT_BYTES);
        let need = u32::try_from(need / UNIT_BYTES).ok()?;
        for (ri, r) in self.reservations.iter().enumerate() {
            let Some(leaf) = r.tree.first_at_least(need) else {
                continue;
            };
            let page = (leaf / 2) as u64;
            let ps = r.va + page * p;
            if leaf % 2 == 0 {
                let (&st, &len) = self.free.range(r.va..ps).next_back()?;
                let b = st + len;
                let addr = align_down(b.checked_sub(bytes)?, align);
                if addr >= st && addr >= ps {
                    return Some(Placement {
                        res: ri,
                        range_start: st,
                        addr,
                    });
                }
            } else {
                for (&st, &len) in self.free.range(ps..ps + p) {
                    let usable = self.usable_head(r.va, st, len);
                    let addr = align_up(st, align)?;
                    if addr + bytes <= st + usable {
                        return Some(Placement {
                            res: ri,
                            range_start: st,
                            addr,
                        });
                    }
                }
            }
            // The tree promised a fit that the free map does not hold: fall back to the scan.
            return None;
        }
        None
    }

    /// Slow path: scores both ends of every free range by the pages the block would map,
    /// then by the bytes of those pages it would leave free (the waste it adds), then by
    /// address. Returns the best placement and its page count.
    fn find_scored_fit(&self, bytes: u64, align: u64) -> Option<(Placement, u64)> {
        let p = self.page_bytes;
        // Pages are a power of two (checked when learnt): shifts instead of divisions.
        let sh = p.trailing_zeros();
        let mut best: Option<(u64, u64, u64, Placement)> = None;
        let mut ri = 0usize;
        for (&st, &len) in &self.free {
            // A range shorter than the block holds it at neither end.
            if len < bytes {
                continue;
            }
            while ri < self.reservations.len() && self.reservations[ri].end() <= st {
                ri += 1;
            }
            let r = self.reservations.get(ri)?;
            let b = st + len;
            let i0 = (st - r.va + p - 1) >> sh;
            let i1 = (b - r.va) >> sh;
            // (pages newly mapped, bytes of them the block leaves free) for a block at `x`.
            let cost = |x: u64| -> (u64, u64) {
                let (xr, er) = (x - r.va, x - r.va + bytes);
                let lo = (xr >> sh).max(i0);
                let hi = (((er - 1) >> sh) + 1).min(i1);
                if hi <= lo {
                    return (0, 0);
                }
                let covered = er.min(hi << sh) - xr.max(lo << sh);
                ((hi - lo), ((hi - lo) << sh) - covered)
            };
            let mut consider = |x: u64| {
                let (k, slack) = cost(x);
                if best.is_none_or(|(bk, bs, bx, _)| (k, slack, x) < (bk, bs, bx)) {
                    best = Some((
                        k,
                        slack,
                        x,
                        Placement {
                            res: ri,
                            range_start: st,
                            addr: x,
                        },
                    ));
                }
            };
            if let Some(x) = align_up(st, align) {
                if x.checked_add(bytes).is_some_and(|e| e <= b) {
                    consider(x);
                }
            }
            if let Some(x) = b.checked_sub(bytes).map(|x| align_down(x, align)) {
                if x >= st {
                    consider(x);
                }
            }
        }
        best.map(|(k, _, _, pl)| (pl, k))
    }

    /// Reserves a new virtual range of at least `bytes` and makes it one free range.
    fn grow(&mut self, dev: &mut dyn Device, bytes: u64) -> Result<usize, AllocError> {
        let p = self.page_bytes;
        let chunk = if self.va_chunk_bytes > 0 {
            align_up(self.va_chunk_bytes, p)
        } else {
            align_up(dev.capacity_bytes(), p).and_then(|c| c.checked_mul(VA_CAPACITY_FACTOR))
        }
        .unwrap_or(u64::MAX / 2);
        let want = align_up(bytes, p)
            .ok_or(AllocError::Overflow {
                size_bytes: bytes,
                align: p,
            })?
            .max(chunk);
        let npages = usize::try_from(want / p).map_err(|_| AllocError::Overflow {
            size_bytes: bytes,
            align: p,
        })?;
        let va = dev.reserve_va(want)?;
        let ri = self.reservations.partition_point(|r| r.va < va);
        self.reservations.insert(
            ri,
            Reservation {
                va,
                bytes: want,
                pages: vec![None; npages],
                tree: MaxTree::new(2 * npages),
                starts: vec![0; npages],
            },
        );
        self.free.insert(va, want);
        self.update_leaves(ri, &[], &[(va, want)]);
        Ok(ri)
    }

    /// Undoes [`PagedPool::grow`] after a failed allocation.
    fn ungrow(&mut self, dev: &mut dyn Device, ri: usize) {
        let Some(r) = self.reservations.get(ri) else {
            return;
        };
        let (va, bytes) = (r.va, r.bytes);
        if dev.free_va(va, bytes).is_ok() || dev.free_va(va, bytes).is_ok() {
            self.free.remove(&va);
            self.reservations.remove(ri);
        }
    }

    /// Adds a handle to the cache.
    fn cache_push(&mut self, h: CachedHandle) {
        self.cached_pages += h.pages;
        self.cache.push(h);
        *self.cache_sizes.entry(h.pages).or_insert(0) += 1;
    }

    /// Takes the cached handle at `i`.
    fn cache_take(&mut self, i: usize) -> CachedHandle {
        let h = self.cache.swap_remove(i);
        self.cache_sizes_drop(h.pages);
        self.cached_pages = self.cached_pages.saturating_sub(h.pages);
        h
    }

    /// Index of the cached handle to fill `n` pages with: one of exactly `n` pages, else the
    /// largest one smaller than `n`.
    /// The first handle of that size in `cache` order.
    fn cache_pick(&self, n: u64) -> Option<usize> {
        let (&size, _) = self.cache_sizes.range(..=n).next_back()?;
        self.cache.iter().position(|h| h.pages == size)
    }

    /// Counts one handle of `pages` pages out of `cache_sizes`.
    fn cache_sizes_drop(&mut self, pages: u64) {
        if let Some(c) = self.cache_sizes.get_mut(&pages) {
            *c -= 1;
            if *c == 0 {
                self.cache_sizes.remove(&pages);
            }
        }
    }

    /// Takes the last handle of `cache`.
    fn cache_pop(&mut self) -> Option<CachedHandle> {
        let h = self.cache.pop()?;
        self.cached_pages = self.cached_pages.saturating_sub(h.pages);
        self.cache_sizes_drop(h.pages);
        Some(h)
    }

    /// Moves up to `want` idle pages lying outside `[lo, hi)` into the cache (as single-page
    /// handles), highest addresses first, one cuMemUnmap per run of neighbouring idle pages.
    /// Pages already moved stay moved if a later unmap fails (the error is returned).
    fn steal_idle(
        &mut self,
        dev: &mut dyn Device,
        want: u64,
        lo: u64,
        hi: u64,
    ) -> Result<(), DeviceError> {
        let p = self.page_bytes;
        let picked: Vec<u64> = self
            .idle
            .range(hi..)
            .rev()
            .chain(self.idle.range(..lo).rev())
            .copied()
            .take(usize::try_from(want).unwrap_or(usize::MAX))
            .collect();
        let mut i = 0;
        while i < picked.len() {
            // `picked` descends: a run is a stretch of addresses one page apart, inside one
            // reservation (neighbouring reservations may touch).
            let res = self.res_of(picked[i]);
            let mut j = i + 1;
            while j < picked.len()
                && picked[j] + p == picked[j - 1]
                && self.res_of(picked[j]) == res
            {
                j += 1;
            }
            let (first, n) = (picked[j - 1], (j - i) as u64);
            let Some(ri) = self.res_of(first) else {
                return Err(DeviceError::Invalid {
                    call: "paged",
                    detail: format!("idle page {first:#x} outside VA"),
                });
            };
            dev.unmap(first, n * p)?;
            let base = self.reservations[ri].va;
            for k in 0..n {
                let va = first + k * p;
                self.idle.remove(&va);
                let page = ((va - base) / p) as usize;
                let taken = self.reservations[ri]
                    .pages
                    .get_mut(page)
                    .and_then(Option::take);
                if let Some(pg) = taken {
                    self.cache_push(CachedHandle {
                        handle: pg.handle,
                        pages: 1,
                    });
                    self.mapped_pages = self.mapped_pages.saturating_sub(1);
                }
            }
            i = j;
        }
        Ok(())
    }

    /// Parks a handle freed by an unmap in the cache; [`PagedPool::trim_cache`] releases what
    /// exceeds the bound at the end of the call.
    fn return_handle(&mut self, h: CachedHandle) {
        self.cache_push(h);
        if self.held_free_pages() > self.cache_limit {
            self.trim_pending = true;
        }
    }

    /// Pages held without a block: cached handles plus idle pages.
    fn held_free_pages(&self) -> u64 {
        self.cached_pages + self.idle.len() as u64
    }

    /// Releases cached handles, largest first, until the cache is within its bound
    /// (cuMemRelease each); stops at the first failure, leaving `trim_pending` set.
    fn trim_cache(&mut self, dev: &mut dyn Device) {
        if !self.trim_pending {
            return;
        }
        while self.held_free_pages() > self.cache_limit {
            // The last of the largest handles.
            let Some((&size, _)) = self.cache_sizes.last_key_value() else {
                break;
            };
            let Some(i) = self.cache.iter().rposition(|h| h.pages == size) else {
                break;
            };
            let h = self.cache_take(i);
            if dev.release_physical(h.handle).is_err() {
                self.cache_push(h);
                return;
            }
            self.tracker.on_release(h.pages * self.page_bytes);
        }
        self.trim_pending = self.held_free_pages() > self.cache_limit;
    }

    /// Gives back a handle taken by a failed allocation: to the cache if it came from there,
    /// else cuMemRelease (so the allocation leaves `reserved_bytes` as it found it).
    fn untake_handle(&mut self, dev: &mut dyn Device, h: CachedHandle, from_cache: bool) {
        if from_cache {
            self.cache_push(h);
        } else {
            self.release_handle(dev, h);
        }
    }

    /// cuMemRelease, retried once; on a second failure the handle stays cached, even above
    /// the bound.
    fn release_handle(&mut self, dev: &mut dyn Device, h: CachedHandle) {
        // Unwinding retries a failed call once before leaving the handle cached.
        if dev.release_physical(h.handle).is_ok() || dev.release_physical(h.handle).is_ok() {
            self.tracker.on_release(h.pages * self.page_bytes);
        } else {
            self.cache_push(h);
            self.trim_pending = true;
        }
    }

    /// Unmaps the handles of `taken` (all in reservation `ri`, ascending) and gives them
    /// back, one cuMemUnmap per run of neighbouring mappings, retried once. A run whose unmap
    /// fails twice is quarantined: cut out of the free map, its pages held mapped until
    /// [`Allocator::empty_cache`].
    fn unwind_maps(&mut self, dev: &mut dyn Device, ri: usize, taken: &[Taken]) {
        let p = self.page_bytes;
        let Some(base) = self.reservations.get(ri).map(|r| r.va) else {
            return;
        };
        let mut i = 0;
        while i < taken.len() {
            let mut j = i + 1;
            while j < taken.len()
                && taken[j].page as u64 == taken[j - 1].page as u64 + taken[j - 1].handle.pages
            {
                j += 1;
            }
            let run = &taken[i..j];
            let va = base + run[0].page as u64 * p;
            let pages: u64 = run.iter().map(|t| t.handle.pages).sum();
            let bytes = pages * p;
            if dev.unmap(va, bytes).is_ok() || dev.unmap(va, bytes).is_ok() {
                for t in run {
                    self.untake_handle(dev, t.handle, t.from_cache);
                }
            } else {
                self.quarantine_run(ri, run, va, bytes);
            }
            i = j;
        }
    }

    /// Records `run` (mapped at `[va, va + bytes)`, inside one free range, without access)
    /// as quarantined.
    fn quarantine_run(&mut self, ri: usize, run: &[Taken], va: u64, bytes: u64) {
        let Some((&st, &len)) = self.free.range(..=va).next_back() else {
            return;
        };
        if st + len < va + bytes {
            return;
        }
        self.free.remove(&st);
        let mut added = [(0, 0); 2];
        let mut n = 0;
        if va > st {
            self.free.insert(st, va - st);
            added[n] = (st, va - st);
            n += 1;
        }
        if va + bytes < st + len {
            self.free.insert(va + bytes, st + len - va - bytes);
            added[n] = (va + bytes, st + len - va - bytes);
            n += 1;
        }
        self.update_leaves(ri, &[(st, len)], &added[..n]);
        for t in run {
            self.set_extent(ri, t.page, t.handle, 1, false);
            self.mapped_pages += t.handle.pages;
        }
        self.quarantine.push((va, bytes));
    }

    /// Writes the page-table entries of handle `h` mapped from page `first`.
    fn set_extent(&mut self, ri: usize, first: usize, h: CachedHandle, refs: u32, access: bool) {
        let (Ok(ext_first), Ok(ext_pages)) = (u32::try_from(first), u32::try_from(h.pages)) else {
            return;
        };
        if let Some(r) = self.reservations.get_mut(ri) {
            for slot in r.pages.iter_mut().skip(first).take(h.pages as usize) {
                *slot = Some(Page {
                    handle: h.handle,
                    ext_first,
                    ext_pages,
                    refs,
                    access,
                });
            }
        }
    }

    /// Maps and opens the pages a block at `addr` of `bytes` needs, as few handles as it
    /// can: the pages the block covers whole get one handle per run (one cuMemCreate and one
    /// cuMemMap), a page it covers in part (and may later share) gets its own. Handles come
    /// from the cache (same size first, else the largest that fits), then from idle pages
    /// elsewhere; only then, after releasing the cached handles too large to use (so that the
    /// peak stays the pages under live blocks), are new ones created. On failure unwinds
    /// everything it mapped and returns the error.
    fn map_block_pages(
        &mut self,
        dev: &mut dyn Device,
        ri: usize,
        addr: u64,
        bytes: u64,
    ) -> Result<(), DeviceError> {
        let p = self.page_bytes;
        let Some(r) = self.reservations.get(ri) else {
            return Err(DeviceError::Invalid {
                call: "paged",
                detail: "reservation vanished".into(),
            });
        };
        let base = r.va;
        let p0 = ((addr - base) / p) as usize;
        let p1 = ((addr + bytes - 1 - base) / p) as usize;
        let (lo, hi) = (base + p0 as u64 * p, base + (p1 as u64 + 1) * p);
        let head_partial = !(addr - base).is_multiple_of(p);
        let tail_partial = !(addr + bytes - base).is_multiple_of(p);
        // Gaps to fill: runs of unmapped pages, a partly covered end page on its own.
        let mut gaps: Vec<(usize, u64)> = Vec::new();
        let mut page = p0;
        while page <= p1 {
            if r.pages.get(page).is_some_and(Option::is_some) {
                page += 1;
                continue;
            }
            let start = page;
            while page <= p1 && r.pages.get(page).is_some_and(Option::is_none) {
                page += 1;
            }
            let mut a = start;
            let mut b = page; // exclusive
            if a == p0 && head_partial {
                gaps.push((a, 1));
                a += 1;
            }
            let tail_single = b == p1 + 1 && tail_partial && b > a;
            if tail_single {
                b -= 1;
            }
            if b > a {
                gaps.push((a, (b - a) as u64));
            }
            if tail_single {
                gaps.push((b, 1));
            }
        }
        // Plan: fill each gap from the cache, then from idle pages, then create.
        let mut plan: Vec<(usize, Option<CachedHandle>, u64)> = Vec::new(); // (page, handle, pages)
        let mut leftover = 0u64;
        let fill = |this: &mut Self, plan: &mut Vec<(usize, Option<CachedHandle>, u64)>| {
            let mut left = 0;
            let mut out = Vec::with_capacity(plan.len());
            for &(page, h, n) in plan.iter() {
                if h.is_some() {
                    out.push((page, h, n));
                    continue;
                }
                let (mut at, mut rest) = (page, n);
                while rest > 0 {
                    let Some(i) = this.cache_pick(rest) else {
                        break;
                    };
                    let c = this.cache_take(i);
                    out.push((at, Some(c), c.pages));
                    at += c.pages as usize;
                    rest -= c.pages;
                }
                if rest > 0 {
                    out.push((at, None, rest));
                    left += rest;
                }
            }
            *plan = out;
            left
        };
        for &(page, n) in &gaps {
            plan.push((page, None, n));
        }
        if !plan.is_empty() {
            leftover = fill(self, &mut plan);
        }
        let give_back = |this: &mut Self, plan: &[(usize, Option<CachedHandle>, u64)]| {
            for &(_, h, _) in plan {
                if let Some(h) = h {
                    this.cache_push(h);
                }
            }
        };
        if leftover > 0 && !self.idle.is_empty() {
            if let Err(e) = self.steal_idle(dev, leftover, lo, hi) {
                give_back(self, &plan);
                return Err(e);
            }
            leftover = fill(self, &mut plan);
        }
        if leftover > 0 {
            // Nothing cached fits what is left: give it back before creating anything.
            while let Some(h) = self.cache_pop() {
                self.release_handle(dev, h);
            }
        }
        // Create and map, in address order.
        plan.sort_unstable_by_key(|&(page, _, _)| page);
        let mut taken: Vec<Taken> = Vec::with_capacity(plan.len());
        for (k, &(page, h, n)) in plan.iter().enumerate() {
            let (h, from_cache) = match h {
                Some(h) => (h, true),
                None => match dev.create_physical(n * p) {
                    Ok(handle) => {
                        self.tracker.on_reserve(n * p);
                        (CachedHandle { handle, pages: n }, false)
                    }
                    Err(e) => {
                        give_back(self, &plan[k..]);
                        self.unwind_maps(dev, ri, &taken);
                        return Err(e);
                    }
                },
            };
            if let Err(e) = dev.map(base + page as u64 * p, n * p, h.handle) {
                self.untake_handle(dev, h, from_cache);
                give_back(self, &plan[k + 1..]);
                self.unwind_maps(dev, ri, &taken);
                return Err(e);
            }
            taken.push(Taken {
                page,
                handle: h,
                from_cache,
            });
        }
        // One cuMemSetAccess from the first to the last page without access: every page of
        // the block is mapped by now, so the range may span pages already open.
        // `taken` ascends and is not in the page table yet; a page already mapped needs it
        // when it is still closed.
        let closed = |pg: usize| {
            self.reservations
                .get(ri)
                .and_then(|r| r.pages.get(pg))
                .and_then(|s| *s)
                .is_some_and(|s| !s.access)
        };
        let first_new = taken.first().map(|t| t.page);
        let last_new = taken
            .last()
            .map(|t| t.page + (t.handle.pages as usize).saturating_sub(1));
        let first = (p0..first_new.unwrap_or(p1 + 1))
            .find(|&pg| closed(pg))
            .or(first_new);
        let last = (last_new.map_or(p0, |l| l + 1)..=p1)
            .rev()
            .find(|&pg| closed(pg))
            .or(last_new);
        if let (Some(a), Some(b)) = (first, last) {
            if let Err(e) = dev.set_access(base + a as u64 * p, (b - a + 1) as u64 * p) {
                self.unwind_maps(dev, ri, &taken);
                return Err(e);
            }
        }
        // Commit the new pages (refs are raised by the caller).
        for t in &taken {
            self.set_extent(ri, t.page, t.handle, 0, true);
            self.mapped_pages += t.handle.pages;
        }
        // Idle pages the block covers are now open.
        for page in p0..=p1 {
            if let Some(Some(pg)) = self
                .reservations
                .get_mut(ri)
                .and_then(|r| r.pages.get_mut(page))
            {
                pg.access = true;
            }
        }
        Ok(())
    }

    /// Cuts the block out of its free range and raises the refs of its pages.
    fn commit_block(&mut self, pl: Placement, bytes: u64, requested: u64) {
        let p = self.page_bytes;
        let Some(len) = self.free.remove(&pl.range_start) else {
            return;
        };
        let st = pl.range_start;
        let end = st + len;
        let mut added = [(0, 0); 2];
        let mut n = 0;
        if pl.addr > st {
            self.free.insert(st, pl.addr - st);
            added[n] = (st, pl.addr - st);
            n += 1;
        }
        let bend = pl.addr + bytes;
        if bend < end {
            self.free.insert(bend, end - bend);
            added[n] = (bend, end - bend);
            n += 1;
        }
        self.update_leaves(pl.res, &[(st, len)], &added[..n]);
        let Some(r) = self.reservations.get_mut(pl.res) else {
            return;
        };
        let p0 = ((pl.addr - r.va) / p) as usize;
        let p1 = ((bend - 1 - r.va) / p) as usize;
        let base = r.va;
        for (i, slot) in r.pages.iter_mut().enumerate().take(p1 + 1).skip(p0) {
            if let Some(pg) = slot {
                if pg.refs == 0 && !self.idle.is_empty() {
                    self.idle.remove(&(base + i as u64 * p));
                }
                pg.refs += 1;
            }
        }
        self.live.insert(pl.addr, LiveBlock { bytes, requested });
        self.tracker.on_alloc(requested, bytes);
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
        if let Some(i) = self
            .quick
            .iter()
            .rposition(|q| q.bytes == bytes && q.addr % align == 0)
        {
            let q = self.quick.remove(i);
            self.quick_bytes = self.quick_bytes.saturating_sub(q.bytes);
            self.live.insert(q.addr, LiveBlock { bytes, requested });
            self.tracker.on_alloc(requested, bytes);
            return Ok(block(q.addr));
        }
        if let Some(pl) = self.find_mapped_fit(bytes, align) {
            self.commit_block(pl, bytes, requested);
            return Ok(block(pl.addr));
        }
        // Pages will be mapped: first give the quick list's blocks back, so that no page is
        // mapped while a block nobody uses holds another one (the peak stays exact).
        if !self.quick.is_empty() {
            self.flush_quick(dev);
            if let Some(pl) = self.find_mapped_fit(bytes, align) {
                self.commit_block(pl, bytes, requested);
                return Ok(block(pl.addr));
            }
        }
        let mut grown = None;
        let pl = match self.find_scored_fit(bytes, align) {
            Some((pl, _)) => pl,
            None => {
                let ri = self.grow(dev, bytes)?;
                grown = Some(ri);
                let r = &self.reservations[ri];
                Placement {
                    res: ri,
                    range_start: r.va,
                    addr: r.va,
                }
            }
        };
        if let Err(e) = self.map_block_pages(dev, pl.res, pl.addr, bytes) {
            if let Some(ri) = grown {
                self.ungrow(dev, ri);
            }
            return Err(e.into());
        }
        self.commit_block(pl, bytes, requested);
        Ok(block(pl.addr))
    }

    fn oom(&self, requested_bytes: u64) -> AllocError {
        let s = self.stats();
        AllocError::OutOfMemory {
            requested_bytes,
            free_bytes: s.free_bytes,
            largest_free_bytes: s.largest_free_bytes,
        }
    }

    /// Learns the page size from the device on first use.
    fn learn_page_size(&mut self, dev: &dyn Device) -> Result<(), AllocError> {
        let g = dev.granularity_bytes();
        if self.page_bytes == 0 {
            if !is_pow2(g) || !(UNIT_BYTES..=(1 << 40)).contains(&g) {
                return Err(DeviceError::Unsupported(format!(
                    "page-mapped allocator needs a power-of-two granularity of 256 B .. 1 TiB, got {g} B"
                ))
                .into());
            }
            self.page_bytes = g;
        } else if g != self.page_bytes {
            return Err(AllocError::Internal(format!(
                "device granularity changed from {} to {g} bytes (another device?)",
                self.page_bytes
            )));
        }
        Ok(())
    }

    /// Returns the span of a block (live or quick) to the free map: one cuMemUnmap over
    /// the pages only it touched, whose handles go to the cache, then coalescing. If the
    /// unmap fails nothing changes.
    fn free_span(&mut self, dev: &mut dyn Device, addr: u64, bytes: u64) -> Result<(), AllocError> {
        let p = self.page_bytes;

        let ri = self
            .res_of(addr)
            .ok_or_else(|| AllocError::Internal(format!("block {addr:#x} outside VA")))?;
        let base = self.reservations[ri].va;
        let p0 = ((addr - base) / p) as usize;
        let p1 = ((addr + bytes - 1 - base) / p) as usize;
        // Pages only this block touches form one contiguous run.
        let mut run: Option<(usize, usize)> = None;
        for page in p0..=p1 {
            match self.reservations[ri].pages.get(page).copied().flatten() {
                Some(pg) if pg.refs == 1 => {
                    run = Some(match run {
                        None => (page, page),
                        Some((a, _)) => (a, page),
                    })
                }
                Some(_) => {}
                None => {
                    return Err(AllocError::Internal(format!(
                        "page {page} under block {addr:#x} is not mapped"
                    )))
                }
            }
        }
        // Lazy unmapping keeps the first pages of the run mapped while the cache has room
        // (single-page handles only); the rest is unmapped with one call.
        let mut keep_until = p0;
        if let Some((a, b)) = run {
            let mut all_single = true;
            for page in a..=b {
                if let Some(pg) = self.reservations[ri].pages.get(page).copied().flatten() {
                    let (f, n) = (pg.ext_first as usize, pg.ext_pages as usize);
                    if f < a || f + n > b + 1 {
                        return Err(AllocError::Internal(format!(
                            "handle at page {f} ({n} pages) straddles the freed run {a}..={b}"
                        )));
                    }
                    all_single &= n == 1;
                }
            }
            let room = if self.lazy_unmap && all_single {
                self.cache_limit.saturating_sub(self.held_free_pages())
            } else {
                0
            };
            let n = (b - a + 1) as u64;
            let kept = room.min(n);
            keep_until = a + kept as usize;
            if kept < n {
                dev.unmap(base + keep_until as u64 * p, (n - kept) * p)?;
            }
        }
        // Committed from here on.
        let mut freed_handles = Vec::new();
        let mut unmapped = 0u64;
        for page in p0..=p1 {
            if let Some(slot) = self.reservations[ri].pages.get_mut(page) {
                if let Some(pg) = slot {
                    pg.refs = pg.refs.saturating_sub(1);
                    if pg.refs == 0 {
                        if page < keep_until {
                            self.idle.insert(base + page as u64 * p);
                        } else {
                            if pg.ext_first as usize == page {
                                freed_handles.push(CachedHandle {
                                    handle: pg.handle,
                                    pages: u64::from(pg.ext_pages),
                                });
                            }
                            *slot = None;
                            unmapped += 1;
                        }
                    }
                }
            }
        }
        self.mapped_pages = self.mapped_pages.saturating_sub(unmapped);
        for h in freed_handles {
            self.return_handle(h);
        }
        // Give the range back, coalescing within the reservation.
        // The merged range's ends are the only addresses whose pages can change besides the
        // block's own ends (the old neighbours' far ends are the merged range's ends).
        let mut st = addr;
        let mut len = bytes;
        let res_end = self.reservations[ri].end();
        let mut removed = [(0, 0); 2];
        let mut n = 0;
        if st > base {
            if let Some((&ps, &pl)) = self.free.range(..st).next_back() {
                if ps + pl == st {
                    self.free.remove(&ps);
                    removed[n] = (ps, pl);
                    n += 1;
                    st = ps;
                    len += pl;
                }
            }
        }
        if st + len < res_end {
            if let Some(nl) = self.free.remove(&(st + len)) {
                removed[n] = (st + len, nl);
                n += 1;
                len += nl;
            }
        }
        self.free.insert(st, len);
        self.update_leaves(ri, &removed[..n], &[(st, len)]);
        Ok(())
    }

    /// Truly frees every block of the quick list; a block whose unmap fails stays listed.
    fn flush_quick(&mut self, dev: &mut dyn Device) {
        let list = std::mem::take(&mut self.quick);
        for q in list {
            if self.free_span(dev, q.addr, q.bytes).is_ok() {
                self.quick_bytes = self.quick_bytes.saturating_sub(q.bytes);
            } else {
                self.quick.push(q);
            }
        }
    }

    /// [`PagedPool::try_allocate`], and on out-of-memory [`Allocator::empty_cache`] and one
    /// retry.
    fn allocate_with_retry(
        &mut self,
        dev: &mut dyn Device,
        bytes: u64,
        align: u64,
        size_bytes: u64,
    ) -> Result<Block, AllocError> {
        match self.try_allocate(dev, bytes, align, size_bytes) {
            Err(e) if e.is_oom() => {
                let released = self.empty_cache(dev).unwrap_or(0);
                if released == 0 {
                    return Err(self.oom(size_bytes));
                }
                self.tracker.stats.alloc_retries += 1;
                match self.try_allocate(dev, bytes, align, size_bytes) {
                    Err(e) if e.is_oom() => Err(self.oom(size_bytes)),
                    r => r,
                }
            }
            r => r,
        }
    }

    /// Unmaps every idle page (one cuMemUnmap per run of neighbouring idle pages) and
    /// caches its handle.
    fn drop_idle_pages(&mut self, dev: &mut dyn Device) -> Result<(), AllocError> {
        let p = self.page_bytes;
        while let Some(&first) = self.idle.iter().next() {
            let ri = self
                .res_of(first)
                .ok_or_else(|| AllocError::Internal(format!("idle page {first:#x} outside VA")))?;
            let end = self.reservations[ri].end();
            let mut last = first;
            while last + p < end && self.idle.contains(&(last + p)) {
                last += p;
            }
            dev.unmap(first, last + p - first)?;
            let mut va = first;
            while va <= last {
                self.idle.remove(&va);
                let page = ((va - self.reservations[ri].va) / p) as usize;
                let taken = self.reservations[ri]
                    .pages
                    .get_mut(page)
                    .and_then(Option::take);
                if let Some(pg) = taken {
                    self.cache_push(CachedHandle {
                        handle: pg.handle,
                        pages: 1,
                    });
                }
                self.mapped_pages = self.mapped_pages.saturating_sub(1);
                va += p;
            }
        }
        Ok(())
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
        self.learn_page_size(dev)?;
        if !is_pow2(align) || align > self.page_bytes {
            return Err(AllocError::InvalidAlignment {
                align,
                max: self.page_bytes,
            });
        }
        let align = align.max(UNIT_BYTES);
        let bytes = align_up(size_bytes.max(1), UNIT_BYTES)
            .filter(|b| b.checked_add(2 * self.page_bytes).is_some())
            .ok_or(AllocError::Overflow { size_bytes, align })?;
        // More pages than the device has can never be mapped: refuse before reserving VA.
        if bytes.div_ceil(self.page_bytes) > dev.capacity_bytes() / self.page_bytes {
            return Err(self.oom(size_bytes));
        }
        let result = self.allocate_with_retry(dev, bytes, align, size_bytes);
        if result.is_ok() {
            self.trim_cache(dev);
        }
        result
    }

    fn deallocate(&mut self, dev: &mut dyn Device, addr: u64) -> Result<(), AllocError> {
        let Some(&blk) = self.live.get(&addr) else {
            return Err(AllocError::UnknownBlock { addr });
        };
        let limit = self.cache_limit.saturating_mul(self.page_bytes);
        if blk.bytes <= limit && self.quick_slots > 0 {
            // Make room in the quick list by truly freeing its oldest blocks.
            while self.quick.len() >= self.quick_slots || self.quick_bytes + blk.bytes > limit {
                let Some(&old) = self.quick.first() else {
                    break;
                };
                if self.free_span(dev, old.addr, old.bytes).is_err() {
                    break;
                }
                self.quick.remove(0);
                self.quick_bytes = self.quick_bytes.saturating_sub(old.bytes);
            }
            if self.quick.len() < self.quick_slots && self.quick_bytes + blk.bytes <= limit {
                self.live.remove(&addr);
                self.tracker.on_free(blk.requested, blk.bytes);
                self.quick.push(QuickBlock {
                    addr,
                    bytes: blk.bytes,
                });
                self.quick_bytes += blk.bytes;
                self.trim_cache(dev);
                return Ok(());
            }
        }
        self.free_span(dev, addr, blk.bytes)?;
        self.live.remove(&addr);
        self.tracker.on_free(blk.requested, blk.bytes);
        self.trim_cache(dev);
        Ok(())
    }
    fn empty_cache(&mut self, dev: &mut dyn Device) -> Result<u64, AllocError> {
        let p = self.page_bytes;
        while let Some(&q) = self.quick.first() {
            self.free_span(dev, q.addr, q.bytes)?;
            self.quick.remove(0);
            self.quick_bytes = self.quick_bytes.saturating_sub(q.bytes);
        }
        while let Some(&(va, bytes)) = self.quarantine.first() {
            self.free_span(dev, va, bytes)?;
            self.quarantine.remove(0);
        }
        self.drop_idle_pages(dev)?;
        let mut released = 0;
        while let Some(h) = self.cache_pop() {
            if let Err(e) = dev.release_physical(h.handle) {
                self.cache_push(h);
                return Err(e.into());
            }
            self.tracker.on_release(h.pages * p);
            released += h.pages * p;
        }
        self.trim_pending = false;
        // Reservations without a live block go back too.
        let mut ri = 0;
        while ri < self.reservations.len() {
            let r = &self.reservations[ri];
            if self.free.get(&r.va) == Some(&r.bytes) {
                let (va, bytes) = (r.va, r.bytes);
                dev.free_va(va, bytes)?;
                self.free.remove(&va);
                self.reservations.remove(ri);
            } else {
                ri += 1;
            }
        }
        Ok(released)
    }

    fn stats(&self) -> Stats {
        let mut s = self.tracker.stats;
        let in_use = self.mapped_pages.saturating_sub(self.idle.len() as u64) * self.page_bytes;
        s.free_bytes = in_use
            .saturating_sub(s.allocated_bytes.current)
            .saturating_sub(self.quick_bytes);
        s.largest_free_bytes = self
            .reservations
            .iter()
            .map(|r| u64::from(r.tree.max()) * UNIT_BYTES)
            .max()
            .unwrap_or(0);
        // Free bytes inside mapped pages that hold live blocks (idle pages are excluded above).
        s.inactive_split_bytes.add(s.free_bytes);
        s
    }

    fn validate(&self) -> Result<(), AllocError> {
        validate::run(self).map_err(AllocError::Internal)
    }
}

pub mod check;
mod validate;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
