//! The sizes of the cached handles (a [`HandleCache`](super::handles::HandleCache)'s index):
//! for each size in pages, how many handles of it the cache holds and where the first of
//! them lies.
//!
//! Sizes of at most [`SMALL_SIZES`] pages (the end pages of blocks and the runs of most
//! blocks under 128 MiB with 2 MiB pages) sit in a slot of their own, indexed by the size,
//! with a bit mask of the sizes present: a look-up is an indexing, and the largest size at
//! most `n` is the highest set bit of the mask below `n` (a `leading_zeros`, one `bsr`).
//! Larger sizes are a vector in ascending order, searched by bisection. Every cuMemMap of a
//! cached handle and every handle a free caches looks a size up two or three times; a sorted
//! vector of all sizes cost a bisection each time. The trade: 64 slots (1 KiB) a pool,
//! and two places to look for the largest size.

/// The cached handles of one size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CacheSize {
    /// The size, in pages.
    pub(crate) pages: u64,
    /// Handles of this size in the cache (never 0 for a size listed).
    pub(crate) count: u32,
    /// Index in the cache of the first of them.
    pub(crate) first: u32,
}

/// Sizes, in pages, with a slot of their own (at most 64: one bit each in a `u64`).
pub(crate) const SMALL_SIZES: u64 = 64;

/// The handle sizes of a cache (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct CacheSizes {
    /// `small[s - 1]`: the handles of `s` pages (`count` 0: none; `pages` is always `s`).
    small: [CacheSize; SMALL_SIZES as usize],
    /// Bit `s - 1` set exactly when `small[s - 1].count > 0`.
    mask: u64,
    /// Sizes above [`SMALL_SIZES`] pages, ascending, no zero count.
    large: Vec<CacheSize>,
}

impl Default for CacheSizes {
    fn default() -> Self {
        let mut small = [CacheSize {
            pages: 0,
            count: 0,
            first: 0,
        }; SMALL_SIZES as usize];
        for (s, e) in (1..).zip(small.iter_mut()) {
            e.pages = s;
        }
        CacheSizes {
            small,
            mask: 0,
            large: Vec::new(),
        }
    }
}

impl CacheSizes {
    /// The entry of the handles of `pages` pages, if the cache holds any.
    #[inline(always)]
    pub(crate) fn get_mut(&mut self, pages: u64) -> Option<&mut CacheSize> {
        if pages.wrapping_sub(1) < SMALL_SIZES {
            let e = self.small.get_mut(pages as usize - 1)?;
            return (e.count > 0).then_some(e);
        }
        let k = self.large.binary_search_by_key(&pages, |e| e.pages).ok()?;
        self.large.get_mut(k)
    }

    /// One more handle of `pages` pages, at index `at` of the cache (its first when it is
    /// the only one).
    #[inline(always)]
    pub(crate) fn add(&mut self, pages: u64, at: u32) {
        if pages.wrapping_sub(1) < SMALL_SIZES {
            let Some(e) = self.small.get_mut(pages as usize - 1) else {
                return;
            };
            if e.count == 0 {
                e.first = at;
                self.mask |= 1 << (pages - 1);
            }
            e.count += 1;
            return;
        }
        match self.large.binary_search_by_key(&pages, |e| e.pages) {
            Ok(k) => self.large[k].count += 1,
            Err(k) => self.large.insert(
                k,
                CacheSize {
                    pages,
                    count: 1,
                    first: at,
                },
            ),
        }
    }

    /// Forgets the size `pages` (its count has dropped to 0).
    #[inline(always)]
    pub(crate) fn remove(&mut self, pages: u64) {
        if pages.wrapping_sub(1) < SMALL_SIZES {
            self.mask &= !(1 << (pages - 1));
            if let Some(e) = self.small.get_mut(pages as usize - 1) {
                e.count = 0;
            }
        } else if let Ok(k) = self.large.binary_search_by_key(&pages, |e| e.pages) {
            self.large.remove(k);
        }
    }

    /// The entry of the largest size of at most `n` pages in the cache.
    #[inline(always)]
    pub(crate) fn largest_at_most(&self, n: u64) -> Option<&CacheSize> {
        if n > SMALL_SIZES {
            let below = self.large.partition_point(|e| e.pages <= n);
            if let Some(k) = below.checked_sub(1) {
                return self.large.get(k);
            }
        }
        // The sizes of at most `min(n, 64)` pages: bits `0 .. min(n, 64)`.
        let m = match n {
            0 => 0,
            1..SMALL_SIZES => self.mask & ((1 << n) - 1),
            _ => self.mask,
        };
        let s = SMALL_SIZES - u64::from(m.leading_zeros());
        self.small.get(usize::try_from(s.checked_sub(1)?).ok()?)
    }

    /// The largest size in the cache, in pages.
    pub(crate) fn largest(&self) -> Option<u64> {
        self.largest_at_most(u64::MAX).map(|e| e.pages)
    }

    /// Whether the mask has a bit exactly for the small sizes held, each small slot names
    /// its own size, and the large sizes are above [`SMALL_SIZES`] (for the invariant
    /// checker; the counts and firsts are checked against the cache by the caller).
    pub(crate) fn consistent(&self) -> bool {
        (1..)
            .zip(&self.small)
            .all(|(s, e)| e.pages == s && (self.mask >> (s - 1) & 1 == 1) == (e.count > 0))
            && self.large.iter().all(|e| e.pages > SMALL_SIZES)
    }

    /// Every size held, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &CacheSize> + '_ {
        self.small
            .iter()
            .filter(|e| e.count > 0)
            .chain(self.large.iter())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Against a sorted map of size → (count, first), on sizes around the small/large
    /// boundary: every look-up and the largest size at most `n` for every `n` tried.
    #[test]
    fn same_answers_as_a_sorted_map() {
        let mut s = CacheSizes::default();
        let mut model: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
        let sizes = [1u64, 2, 3, 7, 63, 64, 65, 66, 100, 1 << 20];
        let mut x = 12345u64;
        for step in 0..4000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let pages = sizes[(x >> 33) as usize % sizes.len()];
            if (x >> 20).is_multiple_of(3) {
                if let Some(e) = model.get_mut(&pages) {
                    e.0 -= 1;
                    if e.0 == 0 {
                        model.remove(&pages);
                        s.remove(pages);
                    } else {
                        s.get_mut(pages).unwrap().count -= 1;
                    }
                }
            } else {
                model.entry(pages).or_insert((0, step)).0 += 1;
                s.add(pages, step);
            }
            let listed: Vec<(u64, u32, u32)> =
                s.iter().map(|e| (e.pages, e.count, e.first)).collect();
            let want: Vec<(u64, u32, u32)> = model.iter().map(|(&p, &(c, f))| (p, c, f)).collect();
            assert_eq!(listed, want);
            for &p in &sizes {
                assert_eq!(s.get_mut(p).map(|e| e.count), model.get(&p).map(|e| e.0));
            }
            for n in [0, 1, 2, 5, 62, 63, 64, 65, 99, 100, 1000, 1 << 20, u64::MAX] {
                let want = model.range(..=n).next_back().map(|(&p, _)| p);
                assert_eq!(s.largest_at_most(n).map(|e| e.pages), want, "n = {n}");
            }
            assert_eq!(s.largest(), model.keys().next_back().copied());
            assert!(s.consistent());
        }
    }
}
