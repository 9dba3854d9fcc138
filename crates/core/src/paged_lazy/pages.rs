//! Pages: the reserved virtual ranges, their page tables, and every driver call that maps
//! or unmaps physical memory under them (cuMemAddressReserve, cuMemCreate, cuMemMap,
//! cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree), with the unwinding of a
//! failed allocation.
use super::LazyPagedPool;
use crate::device::DeviceError;
use crate::vmm::map::{self, Page, PlanRun, Taken};
use crate::vmm::reserve;
use crate::vmm::CachedHandle;
use crate::{AllocError, Device};

/// One reserved virtual range of a [`LazyPagedPool`]: its page table has a slot per page,
/// `Some` on every page of a mapped extent (sparse in chunks, see
/// [`slots`](crate::vmm::slots), so that a large reservation costs nothing until it is
/// used); its index counts the mapped pages of any span and lists the mapped extents.
pub(super) type Reservation = reserve::Reservation<Extents>;

/// The mapped pages of a reservation, by count and by extent.
#[derive(Debug, Clone)]
pub(super) struct Extents {
    /// How many pages of a span are mapped.
    count: MappedCount,
    /// Mapped extents: first page -> pages (what the idle-extent search walks, instead of
    /// every page slot of the range).
    pub(super) extents: std::collections::BTreeMap<usize, u64>,
}

impl reserve::PageIndex for Extents {
    fn new(npages: usize) -> Self {
        Extents {
            count: MappedCount::new(npages),
            extents: std::collections::BTreeMap::new(),
        }
    }
}

/// Two Fenwick trees (1-based) over the differences `d[i] = m[i] − m[i − 1]` of the mapped
/// flag `m` of each page, and over `d[i] · (i − 1)`: marking a run of pages mapped or
/// unmapped is O(log pages) whatever its length, and so is "how many pages of this span are
/// mapped" (the range-update, range-query Fenwick tree). Both trees are a function of the
/// mapped set alone.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MappedCount {
    /// The tree over `d[i]`.
    d: Vec<i32>,
    /// The tree over `d[i] · (i − 1)`.
    w: Vec<i64>,
}

impl MappedCount {
    fn new(npages: usize) -> Self {
        MappedCount {
            d: vec![0; npages + 1],
            w: vec![0; npages + 1],
        }
    }

    /// Adds `v` to `d[i]` (1-based; ignored past the last page).
    fn add(&mut self, i: usize, v: i32) {
        let w = i64::from(v) * (i as i64 - 1);
        let mut j = i;
        while j < self.d.len() {
            self.d[j] += v;
            self.w[j] += w;
            j += j & j.wrapping_neg();
        }
    }

    /// Marks pages `[first, first + n)` mapped (`up`) or unmapped: O(log pages).
    fn mark_run(&mut self, first: usize, n: usize, up: bool) {
        if n == 0 {
            return;
        }
        let v = if up { 1 } else { -1 };
        self.add(first + 1, v);
        self.add(first + n + 1, -v);
    }

    /// Mapped pages among the first `n`.
    fn mapped_before(&self, n: usize) -> u64 {
        let n = n.min(self.d.len() - 1);
        let (mut s, mut sw) = (0i64, 0i64);
        let mut i = n;
        while i > 0 {
            s += i64::from(self.d[i]);
            sw += self.w[i];
            i -= i & i.wrapping_neg();
        }
        u64::try_from(s * n as i64 - sw).unwrap_or(0)
    }
}

impl Reservation {
    /// Mapped pages in `[a, b)`.
    pub(super) fn mapped_in(&self, a: usize, b: usize) -> u64 {
        self.index.count.mapped_before(b) - self.index.count.mapped_before(a)
    }

    /// Writes the slots of handle `h` mapped from page `first`.
    fn set_extent(&mut self, first: usize, h: CachedHandle, access: bool) {
        let (Ok(ext_first), Ok(ext_pages)) = (u32::try_from(first), u32::try_from(h.pages)) else {
            return;
        };
        self.index.extents.insert(first, h.pages);
        // Runs of slots that were unmapped are marked mapped, one O(log) update each.
        let mut run: Option<usize> = None;
        let mut end = first;
        let slots = self.pages.range_mut(first, first + h.pages as usize);
        for (i, slot) in (first..).zip(slots) {
            let was_unmapped = slot.is_none();
            *slot = Some(Page {
                handle: h.handle,
                ext_first,
                ext_pages,
                refs: 0,
                access,
            });
            if was_unmapped {
                run.get_or_insert(i);
            } else if let Some(s) = run.take() {
                self.index.count.mark_run(s, i - s, true);
            }
            end = i + 1;
        }
        if let Some(s) = run {
            self.index.count.mark_run(s, end - s, true);
        }
    }

    /// Clears the slots of the extent starting at `first`; returns its handle.
    fn clear_extent(&mut self, first: usize) -> Option<CachedHandle> {
        let pg = (*self.pages.get(first)?)?;
        let n = pg.ext_pages as usize;
        self.index.extents.remove(&first);
        // Runs of slots that were mapped are marked unmapped, one O(log) update each.
        let mut run: Option<usize> = None;
        let mut end = first;
        for (i, slot) in (first..).zip(self.pages.range_mut(first, first + n)) {
            if slot.take().is_some() {
                run.get_or_insert(i);
            } else if let Some(s) = run.take() {
                self.index.count.mark_run(s, i - s, false);
            }
            end = i + 1;
        }
        if let Some(s) = run {
            self.index.count.mark_run(s, end - s, false);
        }
        Some(CachedHandle {
            handle: pg.handle,
            pages: n as u64,
        })
    }

    /// Recount of the Fenwick tree and the extent index against the slots (for the
    /// invariant walk).
    pub(super) fn fenwick_ok(&self) -> bool {
        let mut f = <Extents as reserve::PageIndex>::new(self.npages);
        let mut extents = std::collections::BTreeMap::new();
        for (i, s) in self.pages.iter().enumerate() {
            if let Some(pg) = s {
                f.count.mark_run(i, 1, true);
                if pg.ext_first as usize == i {
                    extents.insert(i, u64::from(pg.ext_pages));
                }
            }
        }
        f.count == self.index.count && extents == self.index.extents
    }
}

/// An idle extent: a mapped handle no block touches.
#[derive(Debug, Clone, Copy)]
struct Idle {
    res: usize,
    first: usize,
    pages: u64,
}

impl LazyPagedPool {
    /// Reserves a new virtual range of at least `bytes` and makes it one free range.
    pub(super) fn grow_va(
        &mut self,
        dev: &mut dyn Device,
        bytes: u64,
    ) -> Result<usize, AllocError> {
        reserve::reserve(
            &mut self.vmm.reservations,
            &mut self.space.va,
            dev,
            bytes,
            self.vmm.page_bytes,
            self.vmm.va_chunk_bytes,
        )
    }

    /// Undoes [`LazyPagedPool::grow_va`] after a failed allocation (cuMemAddressFree, retried
    /// once; on a second failure the empty range stays).
    pub(super) fn ungrow_va(&mut self, dev: &mut dyn Device, ri: usize) {
        reserve::unreserve(&mut self.vmm.reservations, &mut self.space.va, dev, ri);
    }

    /// Reserved pages held now: mapped plus cached.
    pub(super) fn held_pages(&self) -> u64 {
        self.vmm.mapped_pages + self.vmm.cache.pages()
    }

    /// How many pages the pool may hold before it moves idle pages instead of creating new
    /// ones: the peak held so far, or the peak of allocated bytes (counting this request)
    /// plus the headroom, whichever is larger.
    fn page_limit(&self, bytes: u64) -> u64 {
        let p = self.vmm.page_bytes;
        let s = &self.vmm.tracker.stats;
        let peak_alloc = s
            .allocated_bytes
            .peak
            .max(s.allocated_bytes.current + self.quick.bytes() + bytes);
        let with_headroom = (peak_alloc as f64 * (1.0 + self.headroom)).ceil() as u64;
        (s.reserved_bytes.peak / p).max(with_headroom.div_ceil(p))
    }

    /// Mapped extents no block touches, outside pages `[lo, hi)` of reservation `skip`, in
    /// address order. Walks the free ranges holding a whole page and, inside each, the
    /// extents it holds whole: O(free ranges + extents in them · log extents), not a search
    /// per mapped extent (most of which lie under blocks).
    fn idle_extents(&self, skip: usize, lo: usize, hi: usize) -> Vec<Idle> {
        let p = self.vmm.page_bytes;
        let mut out = Vec::new();
        for (ri, r) in self.vmm.reservations.iter().enumerate() {
            // Free ranges are coalesced within a reservation: each lies inside one.
            for (&s, &l) in self.space.va.range(r.va..r.end()) {
                let i0 = (s - r.va).div_ceil(p) as usize;
                let i1 = ((s + l - r.va) / p) as usize;
                if i1 <= i0 {
                    continue;
                }
                for (&i, &n) in r.index.extents.range(i0..i1) {
                    let n = n as usize;
                    if i + n > i1 {
                        break;
                    }
                    if !r
                        .pages
                        .get(i)
                        .is_some_and(|s| s.is_some_and(|pg| pg.access))
                    {
                        continue;
                    }
                    if ri == skip && i < hi && i + n > lo {
                        continue;
                    }
                    out.push(Idle {
                        res: ri,
                        first: i,
                        pages: n as u64,
                    });
                }
            }
        }
        out
    }

    /// Unmaps the idle extent `e` (one cuMemUnmap) and returns its handle; its pages leave
    /// the mapped runs.
    fn unmap_idle(&mut self, dev: &mut dyn Device, e: Idle) -> Result<CachedHandle, DeviceError> {
        let p = self.vmm.page_bytes;
        let r = &self.vmm.reservations[e.res];
        let va = r.va + e.first as u64 * p;
        dev.unmap(va, e.pages * p)?;
        let r = &mut self.vmm.reservations[e.res];
        let h = r
            .clear_extent(e.first)
            .ok_or_else(|| DeviceError::Invalid {
                call: "paged",
                detail: format!("idle extent {va:#x} vanished"),
            })?;
        self.vmm.mapped_pages = self.vmm.mapped_pages.saturating_sub(h.pages);
        self.space
            .rebuild_mapped(&self.vmm.reservations[e.res], p, va, va + e.pages * p);
        Ok(h)
    }

    /// Unmaps every idle extent (one cuMemUnmap each) into the cache.
    pub(super) fn drop_idle(&mut self, dev: &mut dyn Device) -> Result<(), AllocError> {
        for e in self.idle_extents(usize::MAX, 0, 0) {
            let h = self.unmap_idle(dev, e)?;
            self.vmm.cache.push(h);
        }
        Ok(())
    }

    /// The runs of pages [`LazyPagedPool::map_for_block`] maps for a block on pages
    /// `p0..=p1` of reservation `ri` (`need` of them unmapped) and `ahead` pages after it, as
    /// `(first page, pages)` in page order: each run of unmapped pages under the block, then
    /// the pages ahead, each cut into handles of a power of two of pages, largest first.
    fn runs_to_map(
        &self,
        ri: usize,
        p0: usize,
        p1: usize,
        need: u64,
        ahead: usize,
    ) -> Vec<(usize, u64)> {
        // Runs of unmapped pages to fill; the pages mapped ahead get a handle of their own,
        // so that either can move once idle without the other.
        let Some(r) = self.vmm.reservations.get(ri) else {
            return Vec::new();
        };
        let mut gaps: Vec<(usize, u64)> = Vec::new();
        if need > 0 {
            let mut start = None;
            for (page, s) in (p0..=p1).zip(r.pages.range(p0, p1 + 1)) {
                match (s, start) {
                    (None, None) => start = Some(page),
                    (Some(_), Some(st)) => {
                        gaps.push((st, (page - st) as u64));
                        start = None;
                    }
                    _ => {}
                }
            }
            if let Some(st) = start {
                gaps.push((st, (p1 + 1 - st) as u64));
            }
        }
        if ahead > 0 {
            gaps.push((p1 + 1, ahead as u64));
        }
        // Handles of a power of two of pages, at most `handle_pages`: a handle moves only
        // whole and only once no block touches it, so smaller handles let the pool take back
        // idle pages between live blocks, at one cuMemCreate and one cuMemMap each; powers
        // of two keep the cached pieces few in sizes, so that they fit later runs.
        let cap = self.handle_pages.max(1);
        gaps.into_iter()
            .flat_map(|(at, n)| {
                let mut out = Vec::new();
                let (mut at, mut rest) = (at, n);
                while rest > 0 {
                    // Largest power of two of pages first: movable pieces of a few sizes
                    // that fit any later run, at most log2(run) handles per run.
                    let k = (1u64 << (63 - rest.leading_zeros())).min(cap);
                    out.push((at, k));
                    at += k as usize;
                    rest -= k;
                }
                out
            })
            .collect()
    }

    /// Maps and opens every page a block at `addr` of `bytes` in reservation `ri` needs,
    /// and, while the pool is below its page limit, up to `ahead_bytes` more pages after it
    /// (one handle per run of new pages, one cuMemSetAccess over all of them). Handles come
    /// from the cache first (a handle of the same size, else the largest that fits); above
    /// the page limit, idle extents elsewhere are unmapped and moved here; only what is still
    /// missing is created, after the cached handles too large to use are released when
    /// creating would otherwise raise the peak. Returns the end address of the last page
    /// under the block or mapped ahead of it. On failure unwinds every map it made.
    pub(super) fn map_for_block(
        &mut self,
        dev: &mut dyn Device,
        ri: usize,
        addr: u64,
        bytes: u64,
    ) -> Result<u64, DeviceError> {
        let p = self.vmm.page_bytes;
        let r = self.vmm.reservation(ri)?;
        let base = r.va;
        let p0 = ((addr - base) / p) as usize;
        let p1 = ((addr + bytes - 1 - base) / p) as usize;
        let need = (p1 - p0 + 1) as u64 - r.mapped_in(p0, p1 + 1);
        let limit = self.page_limit(bytes);
        let held = self.held_pages();
        // Pages after the block, free and unmapped, to map ahead of need.
        let mut ahead = 0usize;
        if need > 0 && held + need < limit {
            let room = (limit - held - need)
                .min(self.ahead_bytes / p)
                .min(dev.capacity_bytes().saturating_sub(dev.used_bytes()) / p);
            let free_end = self
                .space
                .va
                .range(..=addr)
                .next_back()
                .map_or(0, |(&s, &l)| s + l);
            while (ahead as u64) < room {
                let pg = p1 + 1 + ahead;
                if base + (pg as u64 + 1) * p > free_end
                    || r.pages.get(pg).is_some_and(Option::is_some)
                {
                    break;
                }
                ahead += 1;
            }
        }
        let last = p1 + ahead;
        let gaps = self.runs_to_map(ri, p0, p1, need, ahead);
        let total: u64 = gaps.iter().map(|g| g.1).sum();
        // Plan: (page, handle or None = create, pages).
        let mut plan: Vec<PlanRun> = Vec::new();
        let mut missing: Vec<(usize, u64)> = Vec::new();
        for &(page, n) in &gaps {
            let (mut at, mut rest) = (page, n);
            while rest > 0 {
                let Some(c) = self.vmm.cache.take_fitting(rest) else {
                    break;
                };
                plan.push((at, Some(c), c.pages));
                at += c.pages as usize;
                rest -= c.pages;
            }
            if rest > 0 {
                missing.push((at, rest));
            }
        }
        let mut left: u64 = missing.iter().map(|m| m.1).sum();
        if left > 0 && self.held_pages() + left > limit {
            // Above the limit: move idle extents here instead of creating.
            let mut idle = self.idle_extents(ri, p0, last + 1);
            idle.sort_unstable_by_key(|e| std::cmp::Reverse((e.pages, e.res, e.first)));
            let mut still: Vec<(usize, u64)> = Vec::new();
            for &(page, n) in &missing {
                let (mut at, mut rest) = (page, n);
                while rest > 0 {
                    let Some(k) = idle.iter().position(|e| e.pages <= rest) else {
                        break;
                    };
                    let e = idle.remove(k);
                    match self.unmap_idle(dev, e) {
                        Ok(h) => {
                            plan.push((at, Some(h), h.pages));
                            at += h.pages as usize;
                            rest -= h.pages;
                        }
                        Err(err) => {
                            map::give_back(&mut self.vmm.cache, &plan);
                            return Err(err);
                        }
                    }
                }
                if rest > 0 {
                    still.push((at, rest));
                }
            }
            missing = still;
            left = missing.iter().map(|m| m.1).sum();
            if left > 0 && self.held_pages() + left > limit {
                // Nothing cached fits what is left: give it back before creating anything.
                while let Some(h) = self.vmm.cache.take_largest() {
                    self.vmm.release_handle(dev, h);
                }
            }
            // Still above: idle extents too large to move here are unmapped and released
            // (smallest first), so that what is created does not raise the peak.
            idle.sort_unstable_by_key(|e| (e.pages, e.res, e.first));
            let mut i = 0;
            while left > 0 && self.held_pages() + left > limit && i < idle.len() {
                match self.unmap_idle(dev, idle[i]) {
                    Ok(h) => self.vmm.release_handle(dev, h),
                    Err(err) => {
                        map::give_back(&mut self.vmm.cache, &plan);
                        return Err(err);
                    }
                }
                i += 1;
            }
        }
        plan.extend(missing.iter().map(|&(at, n)| (at, None, n)));
        plan.sort_unstable_by_key(|&(page, _, _)| page);
        let mut taken: Vec<Taken> = Vec::with_capacity(plan.len());
        if let Err(e) = self.vmm.map_plan(dev, ri, &plan, &mut taken) {
            self.unwind_maps(dev, ri, &taken);
            return Err(e);
        }
        if let (Some(a), Some(b)) = (taken.first(), taken.last()) {
            // One cuMemSetAccess from the first new page to the last: every page between is
            // mapped by now (and open), so the range may span pages already open.
            let (a, b) = (a.page, b.page + b.handle.pages as usize);
            if let Err(e) = dev.set_access(base + a as u64 * p, (b - a) as u64 * p) {
                self.unwind_maps(dev, ri, &taken);
                return Err(e);
            }
        }
        let r = &mut self.vmm.reservations[ri];
        for t in &taken {
            r.set_extent(t.page, t.handle, true);
        }
        self.vmm.mapped_pages += total;
        Ok(base + (last as u64 + 1) * p)
    }

    /// Releases cached handles, largest first, until the cache is within its bound
    /// (cuMemRelease each); stops at the first failure, leaving the trim pending.
    pub(super) fn trim_cache(&mut self, dev: &mut dyn Device) {
        self.vmm.trim_cache(dev, 0);
    }

    /// Unmaps the handles of `taken` (all in reservation `ri`, ascending) and gives them
    /// back, one cuMemUnmap per handle, retried once. A handle whose unmap fails twice is
    /// quarantined: cut out of the free map, its pages held mapped without access until
    /// [`crate::Allocator::empty_cache`].
    fn unwind_maps(&mut self, dev: &mut dyn Device, ri: usize, taken: &[Taken]) {
        let p = self.vmm.page_bytes;
        let Some(base) = self.vmm.reservations.get(ri).map(|r| r.va) else {
            return;
        };
        for t in map::unwind_runs(taken, false).flatten() {
            let va = base + t.page as u64 * p;
            let bytes = t.handle.pages * p;
            if map::unmap_retried(dev, va, bytes) {
                self.vmm.untake_handle(dev, t.handle, t.from_cache);
            } else {
                self.space.take_va(va, bytes);
                let r = &mut self.vmm.reservations[ri];
                r.set_extent(t.page, t.handle, false);
                self.vmm.mapped_pages += t.handle.pages;
                self.space
                    .rebuild_mapped(&self.vmm.reservations[ri], p, va, va + bytes);
                self.vmm.quarantine.push((va, bytes));
            }
        }
    }

    /// Unmaps the quarantined span `[va, va + bytes)` (one cuMemUnmap per handle), caches
    /// its handles and gives the span back to the free map. Stops at the first failure.
    pub(super) fn release_quarantined(
        &mut self,
        dev: &mut dyn Device,
        va: u64,
        bytes: u64,
    ) -> Result<(), AllocError> {
        let p = self.vmm.page_bytes;
        let ri = self.vmm.res_holding(va, "quarantined")?;
        let (base, end) = (
            self.vmm.reservations[ri].va,
            self.vmm.reservations[ri].end(),
        );
        let mut page = ((va - base) / p) as usize;
        let last = ((va + bytes - base) / p) as usize;
        while page < last {
            let n = self.vmm.reservations[ri].pages.get(page).copied().flatten();
            let Some(pg) = n else {
                page += 1;
                continue;
            };
            let n = pg.ext_pages as usize;
            dev.unmap(base + page as u64 * p, n as u64 * p)?;
            if let Some(h) = self.vmm.reservations[ri].clear_extent(page) {
                self.vmm.mapped_pages = self.vmm.mapped_pages.saturating_sub(h.pages);
                self.vmm.cache.push(h);
            }
            page += n;
        }
        self.space.give(va, bytes, base, end, false);
        Ok(())
    }
}
