//! The page cache of `paged`: idle mapped pages (stolen for new runs or dropped into the
//! handle cache), the bound they share with the cached handles, and the quick-reuse flush.
use super::*;

impl PagedPool {
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
        let p = self.vmm.page_bytes;
        let sh = p.trailing_zeros();
        let want = usize::try_from(want).unwrap_or(usize::MAX);
        // Pages (a power of two) in `bytes`, rounded up: shifts, not a 64-bit division.
        let pages_up = |bytes: u64| ((bytes >> sh) + u64::from(bytes & (p - 1) != 0)) as usize;
        // Idle pages at or above `hi`, then below `lo`, each from the top down.
        let mut picked = std::mem::take(&mut self.picked_scratch);
        picked.clear();
        for above in [true, false] {
            for r in self.vmm.reservations.iter().rev() {
                // Page indices `from..to` of `r` lie in the part searched.
                let (from, to) = if above {
                    (pages_up(hi.saturating_sub(r.va)), r.npages)
                } else {
                    (0, pages_up(lo.saturating_sub(r.va)).min(r.npages))
                };
                let mut i = to;
                while picked.len() < want {
                    match r.index.prev_before(i) {
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
            let Some(ri) = self.vmm.res_of(picked[i]) else {
                result = Err(DeviceError::Invalid {
                    call: "paged",
                    detail: format!("idle page {:#x} outside VA", picked[i]),
                });
                break;
            };
            let base = self.vmm.reservations[ri].va;
            let mut j = i + 1;
            while j < picked.len() && picked[j] + p == picked[j - 1] && picked[j] >= base {
                j += 1;
            }
            let (first, n) = (picked[j - 1], (j - i) as u64);
            if let Err(e) = dev.unmap(first, n * p) {
                result = Err(e);
                break;
            }
            let r = &mut self.vmm.reservations[ri];
            let first_page = ((first - base) >> sh) as usize;
            for page in first_page..first_page + n as usize {
                if r.index.remove(page) {
                    self.idle_count -= 1;
                }
                if let Some(pg) = r.pages.get_mut(page).and_then(Option::take) {
                    self.cached_handle_scratch.push(CachedHandle {
                        handle: pg.handle,
                        pages: 1,
                    });
                    self.vmm.mapped_pages = self.vmm.mapped_pages.saturating_sub(1);
                }
            }
            let mut moved = std::mem::take(&mut self.cached_handle_scratch);
            for h in moved.drain(..) {
                self.vmm.cache.push(h);
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
        self.vmm.cache.push(h);
        if self.vmm.cache.over(self.idle_count) {
            self.vmm.cache.trim_pending = true;
        }
    }

    /// Pages held without a block: cached handles plus idle pages.
    pub(super) fn held_free_pages(&self) -> u64 {
        self.vmm.cache.pages() + self.idle_count
    }

    /// Releases cached handles, largest first, until the cache and the idle pages are
    /// within their bound (cuMemRelease each); stops at the first failure, leaving the trim
    /// pending. Only runs when one is pending.
    #[inline]
    pub(super) fn trim_cache(&mut self, dev: &mut dyn Device) {
        if self.vmm.cache.trim_pending {
            self.vmm.trim_cache(dev, self.idle_count);
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
        let p = self.vmm.page_bytes;
        // The lowest idle page, and its reservation.
        let lowest = |this: &Self| {
            this.vmm
                .reservations
                .iter()
                .enumerate()
                .find_map(|(ri, r)| Some((ri, r.va + r.index.next_at_or_after(0)? as u64 * p)))
        };
        while let Some((ri, first)) = lowest(self) {
            let r = &self.vmm.reservations[ri];
            let end = r.end();
            let mut last = first;
            while last + p < end && r.index.contains(((last + p - r.va) / p) as usize) {
                last += p;
            }
            dev.unmap(first, last + p - first)?;
            let mut va = first;
            while va <= last {
                let page = ((va - self.vmm.reservations[ri].va) / p) as usize;
                if self.vmm.reservations[ri].index.remove(page) {
                    self.idle_count -= 1;
                }
                let taken = self.vmm.reservations[ri]
                    .pages
                    .get_mut(page)
                    .and_then(Option::take);
                if let Some(pg) = taken {
                    self.vmm.cache.push(CachedHandle {
                        handle: pg.handle,
                        pages: 1,
                    });
                }
                self.vmm.mapped_pages = self.vmm.mapped_pages.saturating_sub(1);
                va += p;
            }
        }
        Ok(())
    }
}
