//! Physical handles (cuMemCreate) and their cache: handles not mapped anywhere, kept to be
//! mapped again instead of creating new ones, bounded in pages, released largest first when
//! over the bound. They count in `reserved_bytes`.
//!
//! What counts against the bound is the owner's policy: `paged` adds its idle pages (mapped,
//! under no block) to the cached ones, `paged-lazy` counts the cached ones alone; the owner
//! passes its extra pages to [`HandleCache::trim`] and [`HandleCache::validate`].
use super::sizes::{CacheSize, CacheSizes};
use crate::device::{DeviceError, PhysHandle};
use crate::{Device, StatsTracker};

/// A physical handle of `pages` pages (cuMemCreate of `pages × page_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CachedHandle {
    /// The cuMemCreate handle.
    pub handle: PhysHandle,
    /// Its size in pages.
    pub pages: u64,
}

/// Which cached handle [`HandleCache::release_all`] releases first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseOrder {
    /// The last handle cached first.
    LastCached,
    /// One of the largest first (the last of them cached).
    Largest,
}

/// Unmapped handles, with an index by size (a slot per small size, see [`super::sizes`]) so
/// that a pick finds the handle it wants without walking the cache, and the bound.
#[derive(Debug, Clone)]
pub(crate) struct HandleCache {
    handles: Vec<CachedHandle>,
    /// How many handles of each size `handles` holds, and where the first of them lies.
    sizes: CacheSizes,
    /// Pages of all cached handles.
    pages: u64,
    /// The bound, in pages (on the cached pages plus the owner's extra pages).
    limit_pages: u64,
    /// Set while the cache is above its bound (handles parked by a flush, or a failed
    /// cuMemRelease); the owner's next successful call trims it.
    pub(crate) trim_pending: bool,
}

impl HandleCache {
    /// An empty cache bounded by `limit_pages` pages.
    pub(crate) fn new(limit_pages: u64) -> Self {
        HandleCache {
            handles: Vec::new(),
            sizes: CacheSizes::default(),
            pages: 0,
            limit_pages,
            trim_pending: false,
        }
    }

    /// The handles, in cache order.
    #[inline]
    pub(crate) fn as_slice(&self) -> &[CachedHandle] {
        &self.handles
    }

    /// Pages of all cached handles.
    #[inline]
    pub(crate) fn pages(&self) -> u64 {
        self.pages
    }

    /// The bound, in pages.
    #[inline]
    pub(crate) fn limit_pages(&self) -> u64 {
        self.limit_pages
    }

    /// Handles cached.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether no handle is cached.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Whether the cached pages plus `extra_pages` exceed the bound.
    #[inline]
    pub(crate) fn over(&self, extra_pages: u64) -> bool {
        self.pages + extra_pages > self.limit_pages
    }

    /// Adds a handle.
    #[inline]
    pub(crate) fn push(&mut self, h: CachedHandle) {
        self.pages += h.pages;
        let at = self.handles.len() as u32;
        self.handles.push(h);
        self.sizes.add(h.pages, at);
    }

    /// Takes the handle at `i` (the last handle moves to `i`).
    pub(crate) fn take(&mut self, i: usize) -> CachedHandle {
        let pages = self.handles.get(i).map_or(0, |h| h.pages);
        self.take_sized(i, pages)
    }

    /// [`HandleCache::take`] when the handle's size is known to be `pages` (as the index
    /// lists it). Inlined: the cache fill of a mapping allocation takes a handle per run it
    /// fills.
    ///
    /// # Panics
    /// When `i` is out of range (a caller's bug: indices come from [`HandleCache::pick`]).
    #[inline(always)]
    pub(crate) fn take_sized(&mut self, i: usize, pages: u64) -> CachedHandle {
        let last = self.handles.len() - 1;
        let h = self.handles.swap_remove(i);
        self.pages = self.pages.saturating_sub(h.pages);
        // The handle's size: one fewer, and a new first handle when it was the first.
        if let Some(e) = self.sizes.get_mut(pages) {
            e.count -= 1;
            if e.count == 0 {
                self.sizes.remove(pages);
            } else if e.first as usize == i {
                // The others of this size lie after `i` (the moved handle now at `i` too).
                let next = self.handles[i..]
                    .iter()
                    .position(|c| c.pages == h.pages)
                    .map_or(last, |d| i + d);
                e.first = next as u32;
            }
        }
        // The moved handle: at `i` now, before any other of its size that lay after `i`.
        if let Some(&moved) = self.handles.get(i).filter(|_| i != last) {
            if moved.pages != h.pages {
                if let Some(e) = self.sizes.get_mut(moved.pages) {
                    if e.first as usize == last || (i as u32) < e.first {
                        e.first = i as u32;
                    }
                }
            }
        }
        h
    }

    /// The handle to fill `n` pages with: the first cached of exactly `n` pages, else of the
    /// largest size smaller than `n`; as its index and its size (for
    /// [`HandleCache::take_sized`]).
    #[inline]
    pub(crate) fn pick(&self, n: u64) -> Option<(usize, u64)> {
        let e = self.sizes.largest_at_most(n)?;
        Some((e.first as usize, e.pages))
    }

    /// Takes the handle [`HandleCache::pick`] names for `n` pages.
    #[inline]
    pub(crate) fn take_fitting(&mut self, n: u64) -> Option<CachedHandle> {
        let (i, k) = self.pick(n)?;
        Some(self.take_sized(i, k))
    }

    /// Takes the last cached of the largest handles.
    pub(crate) fn take_largest(&mut self) -> Option<CachedHandle> {
        let size = self.sizes.largest()?;
        let i = self.handles.iter().rposition(|h| h.pages == size)?;
        Some(self.take(i))
    }

    /// Takes the last handle cached.
    pub(crate) fn pop_last(&mut self) -> Option<CachedHandle> {
        let i = self.handles.len().checked_sub(1)?;
        Some(self.take(i))
    }

    /// cuMemRelease of `h` (pages of `page_bytes`), retried once; on a second failure the
    /// handle stays cached, even above the bound, and a trim is pending.
    pub(crate) fn release(
        &mut self,
        dev: &mut dyn Device,
        h: CachedHandle,
        page_bytes: u64,
        tracker: &mut StatsTracker,
    ) {
        // Unwinding retries a failed call once before leaving the handle cached.
        if dev.release_physical(h.handle).is_ok() || dev.release_physical(h.handle).is_ok() {
            tracker.on_release(h.pages * page_bytes);
        } else {
            self.push(h);
            self.trim_pending = true;
        }
    }

    /// Gives back a handle taken by a failed allocation: to the cache if it came from there,
    /// else [`HandleCache::release`] (so the allocation leaves `reserved_bytes` as it found
    /// it).
    pub(crate) fn untake(
        &mut self,
        dev: &mut dyn Device,
        h: CachedHandle,
        from_cache: bool,
        page_bytes: u64,
        tracker: &mut StatsTracker,
    ) {
        if from_cache {
            self.push(h);
        } else {
            self.release(dev, h, page_bytes, tracker);
        }
    }

    /// Releases cached handles, the last of the largest first, until the cached pages plus
    /// `extra_pages` are within the bound (cuMemRelease each); stops at the first failure,
    /// leaving a trim pending.
    #[inline(never)]
    pub(crate) fn trim(
        &mut self,
        dev: &mut dyn Device,
        extra_pages: u64,
        page_bytes: u64,
        tracker: &mut StatsTracker,
    ) {
        while self.over(extra_pages) {
            let Some(h) = self.take_largest() else {
                break;
            };
            if dev.release_physical(h.handle).is_err() {
                self.push(h);
                self.trim_pending = true;
                return;
            }
            tracker.on_release(h.pages * page_bytes);
        }
        self.trim_pending = self.over(extra_pages);
    }

    /// Releases every cached handle in `order` (cuMemRelease each); returns the bytes
    /// released.
    ///
    /// # Errors
    /// The first failed cuMemRelease; its handle and those not reached stay cached.
    pub(crate) fn release_all(
        &mut self,
        dev: &mut dyn Device,
        order: ReleaseOrder,
        page_bytes: u64,
        tracker: &mut StatsTracker,
    ) -> Result<u64, DeviceError> {
        let mut released = 0;
        loop {
            let next = match order {
                ReleaseOrder::LastCached => self.pop_last(),
                ReleaseOrder::Largest => self.take_largest(),
            };
            let Some(h) = next else {
                break;
            };
            if let Err(e) = dev.release_physical(h.handle) {
                self.push(h);
                return Err(e);
            }
            tracker.on_release(h.pages * page_bytes);
            released += h.pages * page_bytes;
        }
        self.trim_pending = false;
        Ok(released)
    }

    /// Checks the size index and the page count against the handles, no empty handle, no
    /// handle twice, and the bound (on the cached pages plus `extra_pages`) unless a trim
    /// is pending.
    ///
    /// # Errors
    /// A description of the first broken invariant.
    pub(crate) fn validate(&self, extra_pages: u64) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        let mut sizes = std::collections::BTreeMap::new();
        for h in &self.handles {
            if h.pages == 0 || !seen.insert(h.handle) {
                return Err(format!(
                    "cached handle {} empty or cached twice",
                    h.handle.0
                ));
            }
            *sizes.entry(h.pages).or_insert(0u32) += 1;
        }
        let listed: std::collections::BTreeMap<u64, u32> =
            self.sizes.iter().map(|e| (e.pages, e.count)).collect();
        let held: Vec<&CacheSize> = self.sizes.iter().collect();
        let ascending = held.windows(2).all(|w| w[0].pages < w[1].pages);
        if sizes != listed
            || !ascending
            || held.iter().any(|e| e.count == 0)
            || !self.sizes.consistent()
        {
            return Err(format!("cache size index {held:?}, cache holds {sizes:?}"));
        }
        for e in held {
            let first = self.handles.iter().position(|h| h.pages == e.pages);
            if first != Some(e.first as usize) {
                return Err(format!(
                    "cache size index: first handle of {} pages at {}, the cache has it at {first:?}",
                    e.pages, e.first
                ));
            }
        }
        if self.handles.iter().map(|h| h.pages).sum::<u64>() != self.pages {
            return Err(format!("cached pages recorded as {}", self.pages));
        }
        if self.over(extra_pages) && !self.trim_pending {
            return Err(format!(
                "{} cached + {extra_pages} other pages, bound {}",
                self.pages, self.limit_pages
            ));
        }
        Ok(())
    }
}
