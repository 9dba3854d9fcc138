//! A set of page indices of one reservation as a two-level bitmap: one bit per page, and one
//! summary bit per word of pages that says whether the word holds any. `paged` keeps its idle
//! pages in one per reservation: marking and clearing a page is one bit (a `BTreeSet` of
//! addresses cost a few hundred instructions per page), and the ordered searches the page
//! cache needs (the lowest idle page, the highest below a bound) skip empty words through
//! the summary.
//!
//! A reservation of `2 × 141 GB` has 143 k pages: 2,240 words (17.5 KiB, zeroed on
//! allocation and touched only where pages are marked) and 35 summary words.

/// Bits per word.
const WORD_BITS: usize = 64;

/// A set of indices `0..len` (see the module documentation).
#[derive(Debug, Clone, Default)]
pub(crate) struct PageBits {
    /// Bit `i % 64` of word `i / 64`: index `i` is in the set.
    words: Vec<u64>,
    /// Bit `w % 64` of summary word `w / 64`: word `w` is not zero.
    summary: Vec<u64>,
    /// Indices in the set.
    count: usize,
    /// Indices `0..pages` may be in the set.
    pages: usize,
}

impl PageBits {
    /// An empty set of indices below `len`.
    pub(crate) fn new(len: usize) -> Self {
        let words = len.div_ceil(WORD_BITS);
        PageBits {
            words: vec![0; words],
            summary: vec![0; words.div_ceil(WORD_BITS)],
            count: 0,
            pages: len,
        }
    }

    /// Indices in the set.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Whether `i` is in the set (`false` outside `0..len`).
    #[inline]
    pub(crate) fn contains(&self, i: usize) -> bool {
        i < self.pages
            && self
                .words
                .get(i / WORD_BITS)
                .is_some_and(|w| w & (1 << (i % WORD_BITS)) != 0)
    }

    /// Adds `i`; whether it was absent (`false`, and nothing changes, outside `0..len`).
    #[inline]
    pub(crate) fn insert(&mut self, i: usize) -> bool {
        if i >= self.pages {
            return false;
        }
        let w = i / WORD_BITS;
        let Some(word) = self.words.get_mut(w) else {
            return false;
        };
        let bit = 1 << (i % WORD_BITS);
        if *word & bit != 0 {
            return false;
        }
        *word |= bit;
        if let Some(s) = self.summary.get_mut(w / WORD_BITS) {
            *s |= 1 << (w % WORD_BITS);
        }
        self.count += 1;
        true
    }

    /// Removes `i`; whether it was present.
    #[inline]
    pub(crate) fn remove(&mut self, i: usize) -> bool {
        let w = i / WORD_BITS;
        let Some(word) = self.words.get_mut(w) else {
            return false;
        };
        let bit = 1 << (i % WORD_BITS);
        if *word & bit == 0 {
            return false;
        }
        *word &= !bit;
        if *word == 0 {
            if let Some(s) = self.summary.get_mut(w / WORD_BITS) {
                *s &= !(1 << (w % WORD_BITS));
            }
        }
        self.count -= 1;
        true
    }

    /// The lowest index in the set at or above `i`.
    pub(crate) fn next_at_or_after(&self, i: usize) -> Option<usize> {
        let w = i / WORD_BITS;
        let first = self.words.get(w)? & (u64::MAX << (i % WORD_BITS));
        if first != 0 {
            return Some(w * WORD_BITS + first.trailing_zeros() as usize);
        }
        // The next non-zero word after `w`, through the summary.
        let w = w + 1;
        let mut s = w / WORD_BITS;
        let mut bits = self.summary.get(s)? & u64::MAX.checked_shl((w % WORD_BITS) as u32)?;
        loop {
            if bits != 0 {
                let w = s * WORD_BITS + bits.trailing_zeros() as usize;
                let word = self.words.get(w)?;
                return Some(w * WORD_BITS + word.trailing_zeros() as usize);
            }
            s += 1;
            bits = *self.summary.get(s)?;
        }
    }

    /// The lowest index in the set in `i..end`: [`PageBits::next_at_or_after`] that stops
    /// looking at `end` (the words past it are not read).
    #[inline]
    pub(crate) fn next_in(&self, i: usize, end: usize) -> Option<usize> {
        if i >= end {
            return None;
        }
        let w = i / WORD_BITS;
        let first = self.words.get(w)? & (u64::MAX << (i % WORD_BITS));
        if first != 0 {
            let j = w * WORD_BITS + first.trailing_zeros() as usize;
            return (j < end).then_some(j);
        }
        // The next non-zero word after `w` and before the word of `end - 1`, through the
        // summary.
        let last_w = (end - 1) / WORD_BITS;
        let w = w + 1;
        if w > last_w {
            return None;
        }
        let mut s = w / WORD_BITS;
        let last_s = last_w / WORD_BITS;
        let mut bits = self.summary.get(s)? & u64::MAX.checked_shl((w % WORD_BITS) as u32)?;
        loop {
            if bits != 0 {
                let w = s * WORD_BITS + bits.trailing_zeros() as usize;
                if w > last_w {
                    return None;
                }
                let word = self.words.get(w)?;
                let j = w * WORD_BITS + word.trailing_zeros() as usize;
                return (j < end).then_some(j);
            }
            s += 1;
            if s > last_s {
                return None;
            }
            bits = *self.summary.get(s)?;
        }
    }

    /// The highest index in the set below `i`.
    pub(crate) fn prev_before(&self, i: usize) -> Option<usize> {
        let i = i.min(self.words.len() * WORD_BITS);
        if i == 0 {
            return None;
        }
        let last = i - 1;
        let w = last / WORD_BITS;
        let keep = u64::MAX >> (WORD_BITS - 1 - last % WORD_BITS);
        let first = self.words.get(w)? & keep;
        if first != 0 {
            return Some(w * WORD_BITS + 63 - first.leading_zeros() as usize);
        }
        // The previous non-zero word before `w`, through the summary.
        if w == 0 {
            return None;
        }
        let w = w - 1;
        let mut s = w / WORD_BITS;
        let mut bits = self.summary.get(s)? & (u64::MAX >> (WORD_BITS - 1 - w % WORD_BITS));
        loop {
            if bits != 0 {
                let w = s * WORD_BITS + 63 - bits.leading_zeros() as usize;
                let word = self.words.get(w)?;
                return Some(w * WORD_BITS + 63 - word.leading_zeros() as usize);
            }
            s = s.checked_sub(1)?;
            bits = *self.summary.get(s)?;
        }
    }

    /// Checks the count and the summary against the words.
    pub(crate) fn check(&self) -> Result<(), String> {
        let ones: usize = self.words.iter().map(|w| w.count_ones() as usize).sum();
        if ones != self.count {
            return Err(format!(
                "page set counts {} pages, its bitmap {ones}",
                self.count
            ));
        }
        if self.words.len() != self.pages.div_ceil(WORD_BITS)
            || self.next_at_or_after(self.pages).is_some()
        {
            return Err(format!("page set of {} pages holds others", self.pages));
        }
        for (w, &word) in self.words.iter().enumerate() {
            let s = self
                .summary
                .get(w / WORD_BITS)
                .is_some_and(|s| s & (1 << (w % WORD_BITS)) != 0);
            if s != (word != 0) {
                return Err(format!("page set summary wrong for word {w}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn searches_cross_words_and_summary_words() {
        let n = 5 * 64 * 64 + 7;
        let mut b = PageBits::new(n);
        assert_eq!(b.next_at_or_after(0), None);
        assert_eq!(b.prev_before(n), None);
        assert!(b.insert(3));
        assert!(!b.insert(3));
        assert!(b.insert(n - 1));
        assert!(!b.insert(n));
        assert!(b.insert(64 * 64 * 2 + 5));
        assert_eq!(b.len(), 3);
        assert_eq!(b.next_at_or_after(4), Some(64 * 64 * 2 + 5));
        assert_eq!(b.next_at_or_after(64 * 64 * 2 + 6), Some(n - 1));
        assert_eq!(b.next_at_or_after(n), None);
        assert_eq!(b.next_in(4, 64 * 64 * 2 + 5), None);
        assert_eq!(b.next_in(4, 64 * 64 * 2 + 6), Some(64 * 64 * 2 + 5));
        assert_eq!(b.next_in(3, 4), Some(3));
        assert_eq!(b.next_in(4, 4), None);
        assert_eq!(b.next_in(64 * 64 * 2 + 6, n), Some(n - 1));
        assert_eq!(b.next_in(64 * 64 * 2 + 6, n - 1), None);
        assert_eq!(b.prev_before(n - 1), Some(64 * 64 * 2 + 5));
        assert_eq!(b.prev_before(64 * 64 * 2 + 5), Some(3));
        assert_eq!(b.prev_before(3), None);
        assert_eq!(b.prev_before(usize::MAX), Some(n - 1));
        assert!(b.remove(3));
        assert!(!b.remove(3));
        assert_eq!(b.prev_before(64 * 64 * 2 + 5), None);
        b.check().unwrap();
    }

    proptest! {
        /// Every operation answers as a `BTreeSet` of the same indices does.
        #[test]
        fn matches_a_btree_set(
            len in 1usize..20_000,
            ops in prop::collection::vec((0u8..6, any::<usize>()), 1..300),
        ) {
            let mut b = PageBits::new(len);
            let mut m = BTreeSet::new();
            for (op, x) in ops {
                // Mostly indices inside the set's range, some just past it.
                let i = x % (len + 70);
                match op {
                    0 | 1 => {
                        let want = i < len && m.insert(i);
                        prop_assert_eq!(b.insert(i), want);
                    }
                    2 => prop_assert_eq!(b.remove(i), m.remove(&i)),
                    3 => prop_assert_eq!(b.next_at_or_after(i), m.range(i..).next().copied()),
                    4 => prop_assert_eq!(b.prev_before(i), m.range(..i).next_back().copied()),
                    _ => {
                        // A bound from just below `i` to far past it, in other words and
                        // summary words too.
                        let end = i.saturating_sub(3) + (x >> 8) % (3 * 64 * 64);
                        let want = if i < end { m.range(i..end).next().copied() } else { None };
                        prop_assert_eq!(b.next_in(i, end), want);
                    }
                }
                prop_assert_eq!(b.contains(i), m.contains(&i));
                prop_assert_eq!(b.len(), m.len());
            }
            b.check().map_err(TestCaseError::fail)?;
        }
    }
}
