//! The handle cache: freed physical handles kept unmapped (by size), idle mapped pages
//! stolen for new runs, the quick-reuse list, and the bound that trims them.
use super::*;

impl PagedPool {
    /// Adds a handle to the cache.
    #[inline]
    pub(super) fn cache_push(&mut self, h: CachedHandle) {
        self.cached_pages += h.pages;
        let at = self.cache.len() as u32;
        self.cache.push(h);
        self.cache_sizes.add(h.pages, at);
    }

    /// Takes the cached handle at `i` (the last handle moves to `i`).
    pub(super) fn cache_take(&mut self, i: usize) -> CachedHandle {
        let pages = self.cache.get(i).map_or(0, |h| h.pages);
        self.cache_take_sized(i, pages)
    }

    /// [`PagedPool::cache_take`] when the handle's size is known to be `pages` (as listed in
    /// `cache_sizes`). Inlined: the cache fill of a mapping allocation takes a handle per
    /// run it fills.
    #[inline(always)]
    pub(super) fn cache_take_sized(&mut self, i: usize, pages: u64) -> CachedHandle {
        let last = self.cache.len() - 1;
        let h = self.cache.swap_remove(i);
        self.cached_pages = self.cached_pages.saturating_sub(h.pages);
        // The handle's size: one fewer, and a new first handle when it was the first.
        if let Some(e) = self.cache_sizes.get_mut(pages) {
            e.count -= 1;
            if e.count == 0 {
                self.cache_sizes.remove(pages);
            } else if e.first as usize == i {
                // The others of this size lie after `i` (the moved handle now at `i` too).
                let next = self.cache[i..]
                    .iter()
                    .position(|c| c.pages == h.pages)
                    .map_or(last, |d| i + d);
                e.first = next as u32;
            }
        }
        // The moved handle: at `i` now, before any other of its size that lay after `i`.
        if let Some(&moved) = self.cache.get(i).filter(|_| i != last) {
            if moved.pages != h.pages {
                if let Some(e) = self.cache_sizes.get_mut(moved.pages) {
                    if e.first as usize == last || (i as u32) < e.first {
                        e.first = i as u32;
                    }
                }
            }
        }
        h
    }

    /// The cached handle to fill `n` pages with: one of exactly `n` pages, else the
    /// largest one smaller than `n`; as the index in `cache` of the first handle of that
    /// size, and the size (for [`PagedPool::cache_take_sized`]).
    #[inline]
    pub(super) fn cache_pick(&self, n: u64) -> Option<(usize, u64)> {
        let e = self.cache_sizes.largest_at_most(n)?;
        Some((e.first as usize, e.pages))
    }

    /// Takes the last handle of `cache`.
    pub(super) fn cache_pop(&mut self) -> Option<CachedHandle> {
        let i = self.cache.len().checked_sub(1)?;
        Some(self.cache_take(i))
    }

    /// Moves up to `want` idle pages lying outside `[lo, hi)` into the cache (as single-page
    /// handles), highest addresses first, one cuMemUnmap per run of neighbouring idle pages.
    /// Pages already moved stay moved if a later unmap fails (the error is returned).
    pub(super) fn steal_idle(
        &mut self,
        dev: &mut dyn Device,
        want: u64,
        lo: u64,
        hi: u64,
    ) -> Result<(), DeviceError> {
        let p = self.page_bytes;
        let sh = p.trailing_zeros();
        let want = usize::try_from(want).unwrap_or(usize::MAX);
        // Pages (a power of two) in `bytes`, rounded up: shifts, not a 64-bit division.
        let pages_up = |bytes: u64| ((bytes >> sh) + u64::from(bytes & (p - 1) != 0)) as usize;
        // Idle pages at or above `hi`, then below `lo`, each from the top down.
        let mut picked = std::mem::take(&mut self.picked_scratch);
        picked.clear();
        for above in [true, false] {
            for r in self.reservations.iter().rev() {
                // Page indices `from..to` of `r` lie in the part searched.
                let (from, to) = if above {
                    (pages_up(hi.saturating_sub(r.va)), r.npages)
                } else {
                    (0, pages_up(lo.saturating_sub(r.va)).min(r.npages))
                };
                let mut i = to;
                while picked.len() < want {
                    match r.idle.prev_before(i) {
                        Some(j) if j >= from => {
                            picked.push(r.va + j as u64 * p);
                            i = j;
                        }
                        _ => break,
                    }
                }
            }
        }
        let mut i = 0;
        let mut result = Ok(());
        while i < picked.len() {
            // `picked` descends: a run is a stretch of addresses one page apart, inside one
            // reservation (neighbouring reservations may touch: the run ends below the
            // start of the reservation of its first page).
            let Some(ri) = self.res_of(picked[i]) else {
                result = Err(DeviceError::Invalid {
                    call: "paged",
                    detail: format!("idle page {:#x} outside VA", picked[i]),
                });
                break;
            };
            let base = self.reservations[ri].va;
            let mut j = i + 1;
            while j < picked.len() && picked[j] + p == picked[j - 1] && picked[j] >= base {
                j += 1;
            }
            let (first, n) = (picked[j - 1], (j - i) as u64);
            if let Err(e) = dev.unmap(first, n * p) {
                result = Err(e);
                break;
            }
            let r = &mut self.reservations[ri];
            let first_page = ((first - base) >> sh) as usize;
            for page in first_page..first_page + n as usize {
                if r.idle.remove(page) {
                    self.idle_count -= 1;
                }
                if let Some(pg) = r.pages.get_mut(page).and_then(Option::take) {
                    self.cached_handle_scratch.push(CachedHandle {
                        handle: pg.handle,
                        pages: 1,
                    });
                    self.mapped_pages = self.mapped_pages.saturating_sub(1);
                }
            }
            let mut moved = std::mem::take(&mut self.cached_handle_scratch);
            for h in moved.drain(..) {
                self.cache_push(h);
            }
            self.cached_handle_scratch = moved;
            i = j;
        }
        self.picked_scratch = picked;
        result
    }

    /// Parks a handle freed by an unmap in the cache; [`PagedPool::trim_cache`] releases what
    /// exceeds the bound at the end of the call.
    pub(super) fn return_handle(&mut self, h: CachedHandle) {
        self.cache_push(h);
        if self.held_free_pages() > self.cache_limit {
            self.trim_pending = true;
        }
    }

    /// Pages held without a block: cached handles plus idle pages.
    pub(super) fn held_free_pages(&self) -> u64 {
        self.cached_pages + self.idle_count
    }

    /// Releases cached handles, largest first, until the cache is within its bound
    /// (cuMemRelease each); stops at the first failure, leaving `trim_pending` set.
    #[inline]
    pub(super) fn trim_cache(&mut self, dev: &mut dyn Device) {
        if self.trim_pending {
            self.trim_cache_now(dev);
        }
    }

    /// [`PagedPool::trim_cache`] once a trim is pending (out of line: most calls find
    /// none).
    #[inline(never)]
    fn trim_cache_now(&mut self, dev: &mut dyn Device) {
        while self.held_free_pages() > self.cache_limit {
            // The last of the largest handles.
            let Some(size) = self.cache_sizes.largest() else {
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
    pub(super) fn untake_handle(
        &mut self,
        dev: &mut dyn Device,
        h: CachedHandle,
        from_cache: bool,
    ) {
        if from_cache {
            self.cache_push(h);
        } else {
            self.release_handle(dev, h);
        }
    }

    /// cuMemRelease, retried once; on a second failure the handle stays cached, even above
    /// the bound.
    pub(super) fn release_handle(&mut self, dev: &mut dyn Device, h: CachedHandle) {
        // Unwinding retries a failed call once before leaving the handle cached.
        if dev.release_physical(h.handle).is_ok() || dev.release_physical(h.handle).is_ok() {
            self.tracker.on_release(h.pages * self.page_bytes);
        } else {
            self.cache_push(h);
            self.trim_pending = true;
        }
    }

    /// Truly frees every block of the quick list; a block whose unmap fails stays listed.
    pub(super) fn flush_quick(&mut self, dev: &mut dyn Device) {
        // The list keeps its allocation (a new one would regrow push by push).
        let mut list = std::mem::take(&mut self.quick);
        list.retain(|q| self.free_span(dev, q.addr, q.bytes).is_err());
        self.quick = list;
    }

    /// Unmaps every idle page (one cuMemUnmap per run of neighbouring idle pages) and
    /// caches its handle.
    pub(super) fn drop_idle_pages(&mut self, dev: &mut dyn Device) -> Result<(), AllocError> {
        let p = self.page_bytes;
        // The lowest idle page, and its reservation.
        let lowest = |this: &Self| {
            this.reservations
                .iter()
                .enumerate()
                .find_map(|(ri, r)| Some((ri, r.va + r.idle.next_at_or_after(0)? as u64 * p)))
        };
        while let Some((ri, first)) = lowest(self) {
            let r = &self.reservations[ri];
            let end = r.end();
            let mut last = first;
            while last + p < end && r.idle.contains(((last + p - r.va) / p) as usize) {
                last += p;
            }
            dev.unmap(first, last + p - first)?;
            let mut va = first;
            while va <= last {
                let page = ((va - self.reservations[ri].va) / p) as usize;
                if self.reservations[ri].idle.remove(page) {
                    self.idle_count -= 1;
                }
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
