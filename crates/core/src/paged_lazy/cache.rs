//! The handle cache: physical handles (cuMemCreate) that are not mapped anywhere, kept to be
//! mapped again instead of creating new ones. They count in `reserved_bytes`.
use std::collections::BTreeMap;

use crate::paged::CachedHandle;

/// Unmapped handles, with a count per size so that a pick finds the size it wants without
/// walking the list.
#[derive(Debug, Clone, Default)]
pub(super) struct HandleCache {
    handles: Vec<CachedHandle>,
    /// Size in pages → handles of that size in `handles`.
    sizes: BTreeMap<u64, u32>,
    /// Pages of all cached handles.
    pages: u64,
}

impl HandleCache {
    pub(super) fn as_slice(&self) -> &[CachedHandle] {
        &self.handles
    }

    pub(super) fn pages(&self) -> u64 {
        self.pages
    }

    pub(super) fn len(&self) -> usize {
        self.handles.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Per-size counts (for the invariant walk).
    pub(super) fn sizes(&self) -> &BTreeMap<u64, u32> {
        &self.sizes
    }

    pub(super) fn push(&mut self, h: CachedHandle) {
        self.pages += h.pages;
        self.handles.push(h);
        *self.sizes.entry(h.pages).or_insert(0) += 1;
    }

    fn take(&mut self, i: usize) -> CachedHandle {
        let h = self.handles.swap_remove(i);
        if let Some(c) = self.sizes.get_mut(&h.pages) {
            *c -= 1;
            if *c == 0 {
                self.sizes.remove(&h.pages);
            }
        }
        self.pages = self.pages.saturating_sub(h.pages);
        h
    }

    /// Takes a handle to fill `n` pages with: one of exactly `n` pages, else the largest one
    /// smaller than `n`.
    pub(super) fn take_fitting(&mut self, n: u64) -> Option<CachedHandle> {
        let (&size, _) = self.sizes.range(..=n).next_back()?;
        let i = self.handles.iter().position(|h| h.pages == size)?;
        Some(self.take(i))
    }

    /// Takes one of the largest handles.
    pub(super) fn take_largest(&mut self) -> Option<CachedHandle> {
        let (&size, _) = self.sizes.last_key_value()?;
        let i = self.handles.iter().rposition(|h| h.pages == size)?;
        Some(self.take(i))
    }
}
