//! Pages: reserving virtual ranges, mapping runs of pages under a new block (from the cache,
//! idle pages, or new handles), unmapping what a freed block alone touched, and unwinding a
//! failed allocation call by call.
use super::*;

impl PagedPool {
    /// Reserves a new virtual range of at least `bytes` and makes it one free range.
    pub(super) fn grow(&mut self, dev: &mut dyn Device, bytes: u64) -> Result<usize, AllocError> {
        let ri = reserve::reserve(
            &mut self.vmm.reservations,
            &mut self.free,
            dev,
            bytes,
            self.vmm.page_bytes,
            self.vmm.va_chunk_bytes,
        )?;
        let r = &self.vmm.reservations[ri];
        let (va, want) = (r.va, r.bytes);
        self.refit(ri, &[(va, want)]);
        Ok(ri)
    }

    /// Undoes [`PagedPool::grow`] after a failed allocation.
    pub(super) fn ungrow(&mut self, dev: &mut dyn Device, ri: usize) {
        reserve::unreserve(&mut self.vmm.reservations, &mut self.free, dev, ri);
    }

    /// Unmaps the handles of `taken` (all in reservation `ri`, ascending) and gives them
    /// back, one cuMemUnmap per run of neighbouring mappings, retried once. A run whose unmap
    /// fails twice is quarantined: cut out of the free map, its pages held mapped until
    /// [`Allocator::empty_cache`].
    pub(super) fn unwind_maps(&mut self, dev: &mut dyn Device, ri: usize, taken: &[Taken]) {
        let p = self.vmm.page_bytes;
        let Some(base) = self.vmm.reservations.get(ri).map(|r| r.va) else {
            return;
        };
        for run in map::unwind_runs(taken, true) {
            let va = base + run[0].page as u64 * p;
            let pages: u64 = run.iter().map(|t| t.handle.pages).sum();
            let bytes = pages * p;
            if map::unmap_retried(dev, va, bytes) {
                for t in run {
                    self.vmm.untake_handle(dev, t.handle, t.from_cache);
                }
            } else {
                self.quarantine_run(ri, run, va, bytes);
            }
        }
    }

    /// Records `run` (mapped at `[va, va + bytes)`, inside one free range, without access)
    /// as quarantined.
    pub(super) fn quarantine_run(&mut self, ri: usize, run: &[Taken], va: u64, bytes: u64) {
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
        self.refit(ri, &added[..n]);
        for t in run {
            self.set_extent(ri, t.page, t.handle, 1, false);
            self.vmm.mapped_pages += t.handle.pages;
        }
        self.vmm.quarantine.push((va, bytes));
    }

    /// Writes the page-table entry of handle `h` mapped from page `first` (in the extent's
    /// first and last slots; see [`PagedPool`]'s `vmm`). Inlined: a mapping allocation
    /// writes one extent per handle it maps.
    #[inline(always)]
    pub(super) fn set_extent(
        &mut self,
        ri: usize,
        first: usize,
        h: CachedHandle,
        refs: u32,
        access: bool,
    ) {
        let (Ok(ext_first), Ok(ext_pages)) = (u32::try_from(first), u32::try_from(h.pages)) else {
            return;
        };
        let page = Some(Page {
            handle: h.handle,
            ext_first,
            ext_pages,
            refs,
            access,
        });
        let Some(r) = self.vmm.reservations.get_mut(ri) else {
            return;
        };
        // An extent's entry lives in its first and last slots only (one slot for a single
        // page): mapping `n` pages writes at most two slots.
        if let Some(slot) = r.pages.get_mut(first) {
            *slot = page;
        }
        if h.pages > 1 {
            if let Some(slot) = r.pages.get_mut(first + h.pages as usize - 1) {
                *slot = page;
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
    ///
    /// The pages it maps get the block's reference already (refs 1: only the block touches
    /// a page it newly maps); it returns whether the block's first and last pages were
    /// mapped before, for [`PagedPool::commit_block`] to raise those.
    #[inline(always)]
    pub(super) fn map_block_pages(
        &mut self,
        dev: &mut dyn Device,
        ri: usize,
        addr: u64,
        bytes: u64,
    ) -> Result<[bool; 2], DeviceError> {
        let p = self.vmm.page_bytes;
        let r = self.vmm.reservation(ri)?;
        let base = r.va;
        // Pages are a power of two: shifts and masks, not divisions.
        let sh = p.trailing_zeros();
        let p0 = ((addr - base) >> sh) as usize;
        let p1 = ((addr + bytes - 1 - base) >> sh) as usize;
        let (lo, hi) = (base + p0 as u64 * p, base + (p1 as u64 + 1) * p);
        let head_partial = (addr - base) & (p - 1) != 0;
        let tail_partial = (addr + bytes - base) & (p - 1) != 0;
        // Plan: (page, handle, pages) for each gap to fill, a run of unmapped pages (a partly
        // covered end page on its own); filled from the cache, then from idle pages, then
        // created.
        let mut plan = std::mem::take(&mut self.plan_scratch);
        plan.clear();
        // A run of unmapped pages [a, b): its partly covered end pages go on their own.
        let mut push_run = |mut a: usize, mut b: usize| {
            if a == p0 && head_partial {
                plan.push((a, None, 1));
                a += 1;
            }
            let tail_single = b == p1 + 1 && tail_partial && b > a;
            if tail_single {
                b -= 1;
            }
            if b > a {
                plan.push((a, None, (b - a) as u64));
            }
            if tail_single {
                plan.push((b, None, 1));
            }
        };
        // Whether a page already mapped under the block lacks access (a quarantined one):
        // only then do the set-access range and the opening below look at those pages.
        let mut any_closed = false;
        // The pages already mapped under the block, in order: its end pages (which a
        // neighbour may hold), and between them only idle pages (the block's interior lay
        // in one free range, which no block touches: a page there is mapped only when idle),
        // found through the idle bitmap rather than page by page. The runs between them
        // are the gaps to fill.
        let mut at = p0;
        let mut visit = |page: usize, pg: &Page| {
            any_closed |= !pg.access;
            if at < page {
                push_run(at, page);
            }
            at = page + 1;
        };
        let mut ends_mapped = [false; 2];
        if let Some(Some(pg)) = r.pages.get(p0) {
            ends_mapped[0] = true;
            visit(p0, pg);
        }
        if p1 > p0 + 1 && self.idle_count > 0 {
            let mut i = p0 + 1;
            while let Some(j) = r.index.next_in(i, p1) {
                if let Some(Some(pg)) = r.pages.get(j) {
                    visit(j, pg);
                }
                i = j + 1;
            }
        }
        if p1 > p0 {
            if let Some(Some(pg)) = r.pages.get(p1) {
                ends_mapped[1] = true;
                visit(p1, pg);
            }
        } else {
            ends_mapped[1] = ends_mapped[0];
        }
        if at <= p1 {
            push_run(at, p1 + 1);
        }
        let mut leftover = 0u64;
        // Rewrites the plan with cached handles where they fit, into the spare vector, which
        // then becomes the plan (no shift of the entries, no allocation once both have grown).
        let mut spare = std::mem::take(&mut self.plan_spare);
        if !plan.is_empty() {
            leftover = map::fill_from_cache(&mut self.vmm.cache, &mut plan, &mut spare);
        }
        if leftover > 0 && self.idle_count > 0 {
            if let Err(e) = self.steal_idle(dev, leftover, lo, hi) {
                map::give_back(&mut self.vmm.cache, &plan);
                return Err(e);
            }
            leftover = map::fill_from_cache(&mut self.vmm.cache, &mut plan, &mut spare);
        }
        self.plan_spare = spare;
        if leftover > 0 {
            // Nothing cached fits what is left: give it back before creating anything.
            while let Some(h) = self.vmm.cache.pop_last() {
                self.vmm.release_handle(dev, h);
            }
        }
        // Create and map, in address order.
        // The plan is in page order already: its gaps are found in page order, and the
        // cache fill splits each in place.
        debug_assert!(plan.windows(2).all(|w| w[0].0 < w[1].0));
        let mut taken = std::mem::take(&mut self.taken_scratch);
        taken.clear();
        if let Err(e) = self.vmm.map_plan(dev, ri, &plan, &mut taken) {
            self.unwind_maps(dev, ri, &taken);
            return Err(e);
        }
        let (first, last) = self.access_range(ri, p0, p1, any_closed, &taken);
        if let (Some(a), Some(b)) = (first, last) {
            if let Err(e) = dev.set_access(base + a as u64 * p, (b - a + 1) as u64 * p) {
                self.unwind_maps(dev, ri, &taken);
                return Err(e);
            }
        }
        self.commit_maps(ri, p0, p1, any_closed, &taken);
        self.taken_scratch = taken;
        self.plan_scratch = plan;
        Ok(ends_mapped)
    }

    /// The pages one cuMemSetAccess must open after [`PagedPool::map_block_pages`] mapped
    /// `taken` (ascending, not in the page table yet) for a block on pages `p0..=p1`: from
    /// the first page without access to the last (every page of the block is mapped by
    /// then, so the range may span pages already open). A page mapped before needs it only
    /// when it is still closed (`any_closed`: a quarantined one).
    #[inline(always)]
    fn access_range(
        &self,
        ri: usize,
        p0: usize,
        p1: usize,
        any_closed: bool,
        taken: &[Taken],
    ) -> (Option<usize>, Option<usize>) {
        let closed = |pg: usize| {
            self.vmm
                .reservations
                .get(ri)
                .and_then(|r| r.pages.get(pg))
                .and_then(|s| *s)
                .is_some_and(|s| !s.access)
        };
        let first_new = taken.first().map(|t| t.page);
        let last_new = taken
            .last()
            .map(|t| t.page + (t.handle.pages as usize).saturating_sub(1));
        if any_closed {
            let first = (p0..first_new.unwrap_or(p1 + 1))
                .find(|&pg| closed(pg))
                .or(first_new);
            let last = (last_new.map_or(p0, |l| l + 1)..=p1)
                .rev()
                .find(|&pg| closed(pg))
                .or(last_new);
            (first, last)
        } else {
            (first_new, last_new)
        }
    }

    /// Commits the mappings `taken` of a block on pages `p0..=p1` of reservation `ri`, with
    /// the block's reference (the caller raises the refs of the pages that were mapped
    /// before), and marks the block's pages open (new ones are already; `any_closed`: some
    /// page mapped before was not).
    #[inline(always)]
    fn commit_maps(&mut self, ri: usize, p0: usize, p1: usize, any_closed: bool, taken: &[Taken]) {
        for t in taken {
            self.set_extent(ri, t.page, t.handle, 1, true);
            self.vmm.mapped_pages += t.handle.pages;
        }
        if let (true, Some(r)) = (any_closed, self.vmm.reservations.get_mut(ri)) {
            for pg in r.pages.range_mut(p0, p1 + 1).flatten() {
                pg.access = true;
            }
        }
    }

    /// Returns the span of a block (live or quick) to the free map: one cuMemUnmap over
    /// the pages only it touched, whose handles go to the cache, then coalescing. If the
    /// unmap fails nothing changes.
    pub(super) fn free_span(
        &mut self,
        dev: &mut dyn Device,
        addr: u64,
        bytes: u64,
    ) -> Result<(), AllocError> {
        let p = self.vmm.page_bytes;

        let ri = self.vmm.res_holding(addr, "block")?;
        let base = self.vmm.reservations[ri].va;
        let sh = p.trailing_zeros();
        let p0 = ((addr - base) >> sh) as usize;
        let p1 = ((addr + bytes - 1 - base) >> sh) as usize;
        if p1 >= self.vmm.reservations[ri].npages {
            return Err(AllocError::Internal(format!(
                "block {addr:#x} crosses the end of its reservation"
            )));
        }
        // The common case first: a block of one or two pages, each shared with another
        // block (so no page only it touches: no driver call). Its pages lose its reference
        // (one look-up each) and its span goes back to the free map.
        if !(p1 <= p0 + 1 && self.free_shared_span(ri, p0, p1)) {
            self.release_pages(dev, ri, addr, p0, p1)?;
        }
        // Give the range back, coalescing within the reservation.
        // The merged range's ends are the only addresses whose pages can change besides the
        // block's own ends (the old neighbours' far ends are the merged range's ends).
        let res_end = self.vmm.reservations[ri].end();
        // One entry grows in place (the range before, else the one after), or one is added.
        let (_, _, at) = self.free.join_at(addr, bytes, base, res_end);
        self.refit_at(base, at);
        Ok(())
    }

    /// The pages part of [`PagedPool::free_span`] for a block on pages `p0..=p1` of
    /// reservation `ri` (at `addr`): its references off its end pages, and one cuMemUnmap
    /// over the pages only it touched (or some kept idle), whose handles go to the cache.
    /// If the unmap fails nothing changes.
    fn release_pages(
        &mut self,
        dev: &mut dyn Device,
        ri: usize,
        addr: u64,
        p0: usize,
        p1: usize,
    ) -> Result<(), AllocError> {
        let p = self.vmm.page_bytes;
        let base = self.vmm.reservations[ri].va;
        // Pages only this block touches form one contiguous run: every page it covers
        // whole (no other block can touch one), and each end page that no neighbour shares.
        // In the same walk, extent by extent: the extents of the run's pages (each must lie
        // inside the run), and whether they are all single pages.
        let pages = &self.vmm.reservations[ri].pages;
        let mapped = |page: usize| pages.get(page).copied().flatten();
        let Some(first) = mapped(p0) else {
            return Err(not_mapped(p0, addr));
        };
        let last = if p1 == p0 {
            first
        } else {
            let Some(last) = mapped(p1) else {
                return Err(not_mapped(p1, addr));
            };
            last
        };
        let a = if first.refs == 1 { p0 } else { p0 + 1 };
        let b = if last.refs == 1 {
            p1
        } else {
            p1.wrapping_sub(1)
        };
        let run = (a <= b && b != usize::MAX).then_some((a, b));
        let mut ext_lo = usize::MAX;
        let mut ext_hi = 0usize; // exclusive
        let mut all_single = true;
        if let Some((a, b)) = run {
            let mut page = a;
            while page <= b {
                // The run's first extent is often the block's first page, looked up above.
                let pg = if page == p0 {
                    first
                } else if page == p1 {
                    last
                } else {
                    let Some(pg) = mapped(page) else {
                        return Err(not_mapped(page, addr));
                    };
                    pg
                };
                let (f, n) = (pg.ext_first as usize, pg.ext_pages as usize);
                ext_lo = ext_lo.min(f);
                ext_hi = ext_hi.max(f + n);
                all_single &= n == 1;
                page = (f + n).max(page + 1);
            }
        }
        // Lazy unmapping keeps the first pages of the run mapped while the cache has room
        // (single-page handles only); the rest is unmapped with one call.
        let mut keep_until = p0;
        if let Some((a, b)) = run {
            if ext_lo < a || ext_hi > b + 1 {
                return Err(AllocError::Internal(format!(
                    "handles over pages {ext_lo}..{ext_hi} straddle the freed run {a}..={b}"
                )));
            }
            let room = if self.lazy_unmap && all_single {
                self.vmm
                    .cache
                    .limit_pages()
                    .saturating_sub(self.held_free_pages())
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
        let mut freed_handles = std::mem::take(&mut self.freed_scratch);
        freed_handles.clear();
        let mut unmapped = 0u64;
        let r = &mut self.vmm.reservations[ri];
        // End pages a neighbour shares lose this block's reference.
        for page in [p0, p1] {
            if run.is_none_or(|(a, b)| page < a || page > b) {
                if let Some(Some(pg)) = r.pages.get_mut(page) {
                    pg.refs = pg.refs.saturating_sub(1);
                }
            }
            if p1 == p0 {
                break;
            }
        }
        if let Some((a, b)) = run {
            // Kept pages turn idle.
            for page in a..keep_until {
                if let Some(Some(pg)) = r.pages.get_mut(page) {
                    pg.refs = 0;
                }
                if r.index.insert(page) {
                    self.idle_count += 1;
                }
            }
            // The rest was unmapped: its handles go to the cache (in page order), their
            // extents' end slots are cleared (the run is a whole number of extents, and only
            // an extent's end slots are written).
            let mut page = keep_until;
            while page <= b {
                let Some(slot) = r.pages.get_mut(page) else {
                    break;
                };
                let Some(pg) = slot.take() else {
                    page += 1;
                    continue;
                };
                let (f, n) = (pg.ext_first as usize, pg.ext_pages);
                freed_handles.push(CachedHandle {
                    handle: pg.handle,
                    pages: u64::from(n),
                });
                if n > 1 {
                    if let Some(last) = r.pages.get_mut(f + n as usize - 1) {
                        *last = None;
                    }
                }
                page = (f + n as usize).max(page + 1);
            }
            if keep_until <= b {
                unmapped = (b + 1 - keep_until) as u64;
            }
        }
        self.vmm.mapped_pages = self.vmm.mapped_pages.saturating_sub(unmapped);
        for &h in &freed_handles {
            self.return_handle(h);
        }
        self.freed_scratch = freed_handles;
        Ok(())
    }
}

impl PagedPool {
    /// When the block on pages `p0..=p1` (one or two pages) of reservation `ri` shares
    /// each of them with another block: takes its reference off them and returns `true`
    /// (the free is then a free-map join); else changes nothing and returns `false`.
    #[inline(always)]
    fn free_shared_span(&mut self, ri: usize, p0: usize, p1: usize) -> bool {
        let Some(r) = self.vmm.reservations.get_mut(ri) else {
            return false;
        };
        if p1 == p0 {
            return match r.pages.get_mut(p0) {
                Some(Some(pg)) if pg.refs > 1 => {
                    pg.refs -= 1;
                    true
                }
                _ => false,
            };
        }
        let shared = |pg: Option<&Option<Page>>| matches!(pg, Some(Some(g)) if g.refs > 1);
        if !(shared(r.pages.get(p0)) && shared(r.pages.get(p1))) {
            return false;
        }
        for page in [p0, p1] {
            if let Some(Some(pg)) = r.pages.get_mut(page) {
                pg.refs -= 1;
            }
        }
        true
    }
}

/// The error of a page under a freed block found unmapped (out of line: never on the hot
/// path).
#[cold]
#[inline(never)]
fn not_mapped(page: usize, addr: u64) -> AllocError {
    AllocError::Internal(format!("page {page} under block {addr:#x} is not mapped"))
}
