//! The VMM substrate under both page-mapped strategies, [`crate::paged`] and
//! [`crate::paged_lazy`]: what CUDA virtual memory management (cuMemAddressReserve,
//! cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree) asks
//! of any allocator that places blocks on mapped pages, whatever its placement.
//!
//! # Note [One substrate, two placements]
//! A page-mapped allocator is a *placement* (where a block goes, which pages it maps, when
//! pages are unmapped) over a *substrate* (the driver's objects and their bookkeeping). The
//! placements differ and stay in their own modules: `paged` places blocks by the pages they
//! map and counts the blocks on each page; `paged-lazy` (`placement=pages`) keeps pages
//! mapped and indexes mapped extents with a Fenwick tree. The substrate is the same for both
//! and lives here; each pool holds one `Vmm` and calls into it:
//! - `reserve.rs`: reserved virtual ranges (cuMemAddressReserve / cuMemAddressFree), each
//!   with its page table (`slots.rs`, sparse) and the placement's own index over its pages;
//! - `handles.rs`: physical handles and their cache (an index by size, `sizes.rs`), the
//!   cuMemRelease of a handle (retried once), the trim to the bound;
//! - `map.rs`: the page-table entry, an allocation's plan of new mappings filled from the
//!   cache, cuMemCreate and cuMemMap in address order, and what unwinding needs;
//! - `quick.rs`: the quick-reuse list (freed blocks kept whole, O(1) to drop the oldest),
//!   bounded by a block count and optionally by bytes;
//! - `retry.rs`: the page size, the request check and one retry after giving the cache back
//!   on out-of-memory, for any placement (the crate-private `VmmPool` trait);
//! - `range_map.rs` (free ranges as one sorted vector), `view.rs` (the page-table rows and
//!   the one [`PageState`]), `validate.rs` and `check.rs` (invariant walks and the cross-check
//!   against the simulated device), and `Vmm::validate`, the substrate's own invariants.
//!
//! Where the two strategies' policies differ, the difference is a parameter or a choice of
//! method here, not a second copy: the quick list's byte bound (`paged`: the page cache's
//! bytes; `paged-lazy`: none), what counts against the cache bound (`paged` adds its idle
//! pages), which handle `empty_cache` releases first (`paged`: the last cached;
//! `paged-lazy`: the largest), whether neighbouring mappings are unwound with one
//! cuMemUnmap (`paged`) or one per handle (`paged-lazy`), and which slots of an extent the
//! page table writes (`paged`: its ends; `paged-lazy`: every page).
pub(crate) mod check;
pub(crate) mod handles;
pub(crate) mod map;
pub(crate) mod quick;
pub(crate) mod range_map;
pub(crate) mod reserve;
pub(crate) mod retry;
pub(crate) mod sizes;
pub(crate) mod slots;
pub(crate) mod validate;
pub(crate) mod view;

pub use handles::CachedHandle;
pub use view::{PageState, VaRangeView};

use crate::DEFAULT_ALIGN;

/// Allocation unit in bytes: every block size and address is a multiple of it.
pub const UNIT_BYTES: u64 = DEFAULT_ALIGN;

/// Virtual address space reserved by the first reservation, as a multiple of the device
/// capacity.
pub const VA_CAPACITY_FACTOR: u64 = 2;

/// A live block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LiveBlock {
    /// Bytes set aside (multiple of [`UNIT_BYTES`]).
    pub(crate) bytes: u64,
    /// Bytes the user asked for.
    pub(crate) requested: u64,
}

/// Freed blocks held for same-size reuse, at most (default of
/// [`PagedPool::with_quick_slots`](crate::paged::PagedPool::with_quick_slots) and
/// [`LazyPagedPool::with_quick_slots`](crate::paged_lazy::LazyPagedPool::with_quick_slots)).
pub const QUICK_SLOTS: usize = 16;

/// The read-only accessors every page-mapped pool offers, over its `vmm` (a [`Vmm`]) and
/// `live` (live blocks by address) fields: one definition for both placements' public API.
macro_rules! vmm_accessors {
    () => {
        /// Page size in bytes (the device granularity); 0 before the first allocation.
        pub fn page_bytes(&self) -> u64 {
            self.vmm.page_bytes
        }

        /// Pages mapped now (under blocks, idle, or quarantined by a failed unwind).
        pub fn mapped_pages(&self) -> u64 {
            self.vmm.mapped_pages
        }

        /// Unmapped physical handles in the cache.
        pub fn cached_handles(&self) -> &[$crate::vmm::CachedHandle] {
            self.vmm.cache.as_slice()
        }

        /// Pages of the unmapped handles in the cache.
        pub fn cached_pages(&self) -> u64 {
            self.vmm.cache.pages()
        }

        /// Reserved virtual ranges as `(start, bytes)`.
        pub fn reserved_ranges(&self) -> Vec<(u64, u64)> {
            self.vmm.reserved_ranges()
        }

        /// Live blocks as `(addr, allocated_bytes)` in address order.
        pub fn live_blocks(&self) -> Vec<(u64, u64)> {
            let mut v: Vec<_> = self.live.iter().map(|(&a, b)| (a, b.bytes)).collect();
            v.sort_unstable();
            v
        }

        /// Checks the allocator against `dev`, the [`SimDevice`]($crate::sim::SimDevice) it
        /// runs on: the device holds exactly this allocator's reserved ranges, one mapping per
        /// mapped handle, one live handle per held handle (mapped or cached), `used_bytes`
        /// equal to `reserved_bytes`, and every live block is mapped with access. Assumes
        /// nothing else uses `dev`.
        ///
        /// # Errors
        /// [`AllocError::Internal`]($crate::AllocError::Internal) naming the first
        /// disagreement.
        pub fn check_device(&self, dev: &$crate::sim::SimDevice) -> Result<(), $crate::AllocError> {
            $crate::vmm::check::device_agrees(dev, &self.vmm.held(self.live_blocks()))
        }
    };
}
pub(crate) use vmm_accessors;

/// The substrate's state of one pool: the page size, its reserved ranges with their page
/// tables, the handle cache, what an unwind left quarantined, the mapped-page count and the
/// figures. Each placement holds one, with its own index `X` on each reservation, and adds
/// its free space, its live blocks and its quick list.
#[derive(Debug, Clone)]
pub(crate) struct Vmm<X> {
    /// Page size in bytes (the device granularity), known after the first allocation.
    pub(crate) page_bytes: u64,
    /// Virtual bytes per reservation; 0 = [`VA_CAPACITY_FACTOR`] × device capacity.
    pub(crate) va_chunk_bytes: u64,
    /// Reserved ranges in address order.
    pub(crate) reservations: Vec<reserve::Reservation<X>>,
    /// Unmapped physical handles kept for reuse.
    pub(crate) cache: handles::HandleCache,
    /// Spans (address, bytes) of pages left mapped without access by an unwind whose
    /// cuMemUnmap failed twice; kept out of the free space until
    /// [`Allocator::empty_cache`](crate::Allocator::empty_cache).
    pub(crate) quarantine: Vec<(u64, u64)>,
    /// Pages currently mapped (under blocks, idle, or quarantined).
    pub(crate) mapped_pages: u64,
    /// Figures in PyTorch's vocabulary.
    pub(crate) tracker: crate::StatsTracker,
}

impl<X> Vmm<X> {
    /// An empty substrate whose handle cache is bounded by `cache_limit_pages` pages.
    pub(crate) fn new(cache_limit_pages: u64) -> Self {
        Vmm {
            page_bytes: 0,
            va_chunk_bytes: 0,
            reservations: Vec::new(),
            cache: handles::HandleCache::new(cache_limit_pages),
            quarantine: Vec::new(),
            mapped_pages: 0,
            tracker: crate::StatsTracker::default(),
        }
    }

    /// Index of the reservation holding `addr`.
    #[inline]
    pub(crate) fn res_of(&self, addr: u64) -> Option<usize> {
        reserve::res_of(&self.reservations, addr)
    }

    /// Index of the reservation holding the `what` at `addr` (a block, a quarantined span).
    ///
    /// # Errors
    /// [`AllocError::Internal`](crate::AllocError::Internal) when no reservation holds it.
    #[inline]
    pub(crate) fn res_holding(&self, addr: u64, what: &str) -> Result<usize, crate::AllocError> {
        self.res_of(addr)
            .ok_or_else(|| crate::AllocError::Internal(format!("{what} {addr:#x} outside VA")))
    }

    /// Reservation `ri`, which an allocation found and is about to map pages in.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`](crate::DeviceError::Invalid) when it is not there (a caller's
    /// bug).
    #[inline]
    pub(crate) fn reservation(
        &self,
        ri: usize,
    ) -> Result<&reserve::Reservation<X>, crate::DeviceError> {
        self.reservations
            .get(ri)
            .ok_or_else(|| crate::DeviceError::Invalid {
                call: "paged",
                detail: "reservation vanished".into(),
            })
    }

    /// What this substrate holds, with the pool's `live_blocks`, for
    /// [`check::device_agrees`].
    pub(crate) fn held(&self, live_blocks: Vec<(u64, u64)>) -> check::Held {
        let mapped_handles = self
            .reservations
            .iter()
            .flat_map(|r| r.pages.iter().enumerate())
            .filter(|(i, s)| s.is_some_and(|pg| pg.ext_first as usize == *i))
            .count();
        check::Held {
            ranges: self.reservations.len(),
            mapped_handles,
            cached_handles: self.cache.len(),
            reserved_bytes: self.tracker.stats.reserved_bytes.current,
            live_blocks,
        }
    }

    /// Reserved virtual ranges as `(start, bytes)`.
    pub(crate) fn reserved_ranges(&self) -> Vec<(u64, u64)> {
        self.reservations.iter().map(|r| (r.va, r.bytes)).collect()
    }

    /// [`handles::HandleCache::release`] with this substrate's page size and figures.
    pub(crate) fn release_handle(&mut self, dev: &mut dyn crate::Device, h: CachedHandle) {
        self.cache
            .release(dev, h, self.page_bytes, &mut self.tracker);
    }

    /// [`handles::HandleCache::untake`] with this substrate's page size and figures.
    pub(crate) fn untake_handle(
        &mut self,
        dev: &mut dyn crate::Device,
        h: CachedHandle,
        from_cache: bool,
    ) {
        self.cache
            .untake(dev, h, from_cache, self.page_bytes, &mut self.tracker);
    }

    /// [`handles::HandleCache::trim`] with this substrate's page size and figures.
    pub(crate) fn trim_cache(&mut self, dev: &mut dyn crate::Device, extra_pages: u64) {
        self.cache
            .trim(dev, extra_pages, self.page_bytes, &mut self.tracker);
    }

    /// [`handles::HandleCache::release_all`] with this substrate's page size and figures.
    ///
    /// # Errors
    /// The first failed cuMemRelease.
    pub(crate) fn release_cache(
        &mut self,
        dev: &mut dyn crate::Device,
        order: handles::ReleaseOrder,
    ) -> Result<u64, crate::DeviceError> {
        self.cache
            .release_all(dev, order, self.page_bytes, &mut self.tracker)
    }

    /// [`map::map_plan`] in reservation `ri` with this substrate's cache and figures.
    ///
    /// # Errors
    /// As [`map::map_plan`]; a reservation that is not there.
    pub(crate) fn map_plan(
        &mut self,
        dev: &mut dyn crate::Device,
        ri: usize,
        plan: &[map::PlanRun],
        taken: &mut Vec<map::Taken>,
    ) -> Result<(), crate::DeviceError> {
        let base = self.reservation(ri)?.va;
        map::map_plan(
            dev,
            &mut self.cache,
            &mut self.tracker,
            base,
            self.page_bytes,
            plan,
            taken,
        )
    }

    /// Checks the substrate's own invariants: the reservations
    /// ([`reserve::validate`]), the handle cache ([`handles::HandleCache::validate`], with
    /// `extra_pages` counted against its bound), every mapped extent inside its reservation,
    /// no handle mapped twice or both mapped and cached, the mapped-page count, quarantined
    /// spans inside reservations, and `reserved_bytes` / `segment_count` against the pages
    /// and handles held. Layout-agnostic: an extent is found by the slot of its first page,
    /// whichever other slots of it the placement writes.
    ///
    /// # Errors
    /// A description of the first broken invariant.
    pub(crate) fn validate(&self, extra_pages: u64) -> Result<(), String> {
        let p = self.page_bytes;
        if p == 0 {
            if !self.reservations.is_empty() || !self.cache.is_empty() || self.mapped_pages != 0 {
                return Err("state without a known page size".into());
            }
            return Ok(());
        }
        reserve::validate(&self.reservations, p)?;
        self.cache.validate(extra_pages)?;
        let mut handles = std::collections::HashSet::new();
        let (mut mapped, mut mapped_handles) = (0u64, 0u64);
        for r in &self.reservations {
            for (i, slot) in r.pages.iter().enumerate() {
                let Some(pg) = slot else {
                    continue;
                };
                if pg.ext_first as usize != i {
                    continue;
                }
                let n = u64::from(pg.ext_pages);
                if n == 0 || i as u64 + n > r.npages as u64 {
                    return Err(format!(
                        "extent at page {i} of {:#x}: {n} pages past the reservation",
                        r.va
                    ));
                }
                if !handles.insert(pg.handle) {
                    return Err(format!("handle {} mapped twice", pg.handle.0));
                }
                mapped += n;
                mapped_handles += 1;
            }
        }
        for h in self.cache.as_slice() {
            if !handles.insert(h.handle) {
                return Err(format!("cached handle {} also mapped", h.handle.0));
            }
        }
        if mapped != self.mapped_pages {
            return Err(format!(
                "counted {mapped} mapped pages, recorded {}",
                self.mapped_pages
            ));
        }
        for &(va, bytes) in &self.quarantine {
            let inside = self
                .res_of(va)
                .is_some_and(|ri| va + bytes <= self.reservations[ri].end());
            if bytes == 0 || !inside || va % p != 0 || bytes % p != 0 {
                return Err(format!("quarantined span {va:#x}+{bytes} out of place"));
            }
        }
        let s = &self.tracker.stats;
        let held_pages = self.mapped_pages + self.cache.pages();
        let held_handles = mapped_handles + self.cache.len() as u64;
        if s.reserved_bytes.current != held_pages * p || s.segment_count.current != held_handles {
            return Err(format!(
                "reserved counter {} B / {} handles, but {held_pages} pages in {held_handles} \
                 handles are held",
                s.reserved_bytes.current, s.segment_count.current
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
