//! Mapping bookkeeping: the page-table entry of a mapped handle, the plan of an
//! allocation's new mappings (cuMemCreate where no cached handle fits, then cuMemMap, in
//! address order), the handles it took, and what unwinding a failed allocation needs.
use super::handles::{CachedHandle, HandleCache};
use crate::device::{DeviceError, PhysHandle};
use crate::{Device, StatsTracker};

/// The page-table entry of a mapped handle (see [`super::reserve::Reservation::pages`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Page {
    /// The handle mapped over the extent.
    pub(crate) handle: PhysHandle,
    /// First page (index in the reservation) of the extent the handle covers.
    pub(crate) ext_first: u32,
    /// Pages in that extent (1 for a single-page handle).
    pub(crate) ext_pages: u32,
    /// Live or quick-reuse blocks touching each page of the extent, for a placement that
    /// counts them (`paged`: 0 for an idle page, 1 for a handle of several pages, which one
    /// block covers whole); 0 for one that does not (`paged-lazy`).
    pub(crate) refs: u32,
    /// Whether cuMemSetAccess succeeded over it.
    pub(crate) access: bool,
}

/// One run of an allocation's plan: `(first page, handle, pages)`, the handle `None` where
/// one is to be created.
pub(crate) type PlanRun = (usize, Option<CachedHandle>, u64);

/// A handle mapped for a new block during an allocation, to give back on failure.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taken {
    /// First page (index in the reservation) it is mapped at.
    pub(crate) page: usize,
    /// The handle.
    pub(crate) handle: CachedHandle,
    /// From the cache (or moved from idle pages elsewhere): goes back there on failure.
    pub(crate) from_cache: bool,
}

/// Puts the handles of `plan` (those taken from the cache, not yet mapped) back in the cache.
pub(crate) fn give_back(cache: &mut HandleCache, plan: &[PlanRun]) {
    for &(_, h, _) in plan {
        if let Some(h) = h {
            cache.push(h);
        }
    }
}

/// Rewrites `plan` with cached handles where they fit, into `out`, which then becomes the
/// plan (no shift of the entries, no allocation once both have grown): each run without a
/// handle is filled, from its first page, with the handle [`HandleCache::pick`] names for
/// what is left of it (one of that size, else the largest smaller), repeatedly; what no
/// cached handle fits stays a run to create. Returns the pages still to create.
#[inline(always)]
pub(crate) fn fill_from_cache(
    cache: &mut HandleCache,
    plan: &mut Vec<PlanRun>,
    out: &mut Vec<PlanRun>,
) -> u64 {
    let mut left = 0;
    out.clear();
    for &(page, h, n) in plan.iter() {
        if h.is_some() {
            out.push((page, h, n));
            continue;
        }
        let (mut at, mut rest) = (page, n);
        while rest > 0 {
            let Some((i, k)) = cache.pick(rest) else {
                break;
            };
            let c = cache.take_sized(i, k);
            out.push((at, Some(c), c.pages));
            at += c.pages as usize;
            rest -= c.pages;
        }
        if rest > 0 {
            out.push((at, None, rest));
            left += rest;
        }
    }
    std::mem::swap(plan, out);
    left
}

/// Carries out `plan` (runs in ascending page order) in the reservation at `base`: for each
/// run, cuMemCreate of its pages where it has no handle (counted in `tracker`'s reserved
/// bytes), then cuMemMap at its page; each mapping is pushed on `taken`. Opens nothing
/// (the caller sets access over all of them at once).
///
/// # Errors
/// The first failed call. The handle of the failing run and those of the runs not reached
/// are given back (to the cache, or released when just created); the mappings in `taken`
/// stay for the caller to unwind its own way.
pub(crate) fn map_plan(
    dev: &mut dyn Device,
    cache: &mut HandleCache,
    tracker: &mut StatsTracker,
    base: u64,
    page_bytes: u64,
    plan: &[PlanRun],
    taken: &mut Vec<Taken>,
) -> Result<(), DeviceError> {
    let p = page_bytes;
    for (k, &(page, h, n)) in plan.iter().enumerate() {
        let (h, from_cache) = match h {
            Some(h) => (h, true),
            None => match dev.create_physical(n * p) {
                Ok(handle) => {
                    tracker.on_reserve(n * p);
                    (CachedHandle { handle, pages: n }, false)
                }
                Err(e) => {
                    give_back(cache, &plan[k..]);
                    return Err(e);
                }
            },
        };
        if let Err(e) = dev.map(base + page as u64 * p, n * p, h.handle) {
            cache.untake(dev, h, from_cache, p, tracker);
            give_back(cache, &plan[k + 1..]);
            return Err(e);
        }
        taken.push(Taken {
            page,
            handle: h,
            from_cache,
        });
    }
    Ok(())
}

/// The runs of `taken` (ascending) that one unwinding cuMemUnmap each covers: neighbouring
/// mappings together (`merge`), or one mapping a run.
pub(crate) fn unwind_runs(taken: &[Taken], merge: bool) -> impl Iterator<Item = &[Taken]> {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= taken.len() {
            return None;
        }
        let mut j = i + 1;
        while merge
            && j < taken.len()
            && taken[j].page as u64 == taken[j - 1].page as u64 + taken[j - 1].handle.pages
        {
            j += 1;
        }
        let run = &taken[i..j];
        i = j;
        Some(run)
    })
}

/// cuMemUnmap of `[va, va + bytes)` while unwinding, retried once; whether it succeeded.
#[inline]
pub(crate) fn unmap_retried(dev: &mut dyn Device, va: u64, bytes: u64) -> bool {
    dev.unmap(va, bytes).is_ok() || dev.unmap(va, bytes).is_ok()
}
