//! An ordered map of non-overlapping ranges, start → bytes, kept as one `Vec` sorted by
//! start: the free ranges of both page-mapped pools (`paged`'s free map, `paged-lazy`'s free
//! ranges and mapped free runs).
//!
//! It offers the part of `BTreeMap<u64, u64>`'s interface the pool uses (`get`, `insert`,
//! `remove`, `range`, `range_mut`, `iter`, `values`, `len`), with the same results, plus
//! positional operations ([`RangeMap::at_or_before`], [`RangeMap::set_at`],
//! [`RangeMap::insert_at`], [`RangeMap::remove_at`]) that let the free space cut and coalesce
//! in place: taking the head of a range, or growing a range down to a freed block before it,
//! changes its start without moving any entry, which a B-tree cannot do (its keys are fixed:
//! a removal and an insertion). A look-up is a binary search; only a split or a join shifts
//! the entries after it (16 bytes each). A pool holds one entry per hole between blocks (a
//! few hundred at most on the shipped traces), so the shift costs less than a B-tree's
//! rebalancing; on a pool of many thousands of holes it grows with them.
use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};

/// A range `(start, bytes)`.
pub(crate) type Range = (u64, u64);

/// What a [`RangeMap`] keeps beside each range, position by position: nothing
/// ([`NoTags`], `paged-lazy`), or a `u32` per range ([`FitTags`], `paged`'s fit index).
pub(crate) trait Tags: Clone + Default + std::fmt::Debug + PartialEq + Eq {
    /// A range was inserted at position `i` (its tag starts at 0).
    fn inserted(&mut self, i: usize);
    /// The range at position `i` was removed.
    fn removed(&mut self, i: usize);
}

/// No tags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NoTags;

impl Tags for NoTags {
    #[inline]
    fn inserted(&mut self, _: usize) {}
    #[inline]
    fn removed(&mut self, _: usize) {}
}

/// A `u32` per range, and their maximum (kept as tags change: a tag that rises past it
/// raises it; losing the maximum recounts, one pass over the tags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FitTags {
    tags: Vec<u32>,
    max: u32,
}

impl FitTags {
    fn recount(&mut self) {
        self.max = self.tags.iter().copied().max().unwrap_or(0);
    }
}

impl Tags for FitTags {
    #[inline]
    fn inserted(&mut self, i: usize) {
        self.tags.insert(i, 0);
    }
    #[inline]
    fn removed(&mut self, i: usize) {
        if i < self.tags.len() && self.tags.remove(i) == self.max && self.max > 0 {
            self.recount();
        }
    }
}

/// Ranges `start → bytes` in start order (see the module documentation), each with a tag
/// of `T`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RangeMap<T: Tags = NoTags> {
    v: Vec<(u64, u64)>,
    tags: T,
}

impl RangeMap<FitTags> {
    /// The tag of the range at position `i` (0 past the end).
    #[inline]
    pub(crate) fn tag(&self, i: usize) -> u32 {
        self.tags.tags.get(i).copied().unwrap_or(0)
    }

    /// Sets the tag of the range at position `i`.
    #[inline]
    pub(crate) fn set_tag(&mut self, i: usize, tag: u32) {
        let t = &mut self.tags;
        let Some(slot) = t.tags.get_mut(i) else {
            return;
        };
        let old = std::mem::replace(slot, tag);
        if tag >= t.max {
            t.max = tag;
        } else if old == t.max {
            t.recount();
        }
    }

    /// The largest tag (0 when empty).
    #[inline]
    pub(crate) fn max_tag(&self) -> u32 {
        self.tags.max
    }

    /// Position of the first range (in start order) whose tag is at least `need`: 16 tags
    /// compared at a time (a loop the compiler turns into vector compares), then the one.
    pub(crate) fn first_tag_at_least(&self, need: u32) -> Option<usize> {
        if self.tags.max < need {
            return None;
        }
        const LANES: usize = 16;
        let tags = &self.tags.tags;
        let mut chunks = tags.chunks_exact(LANES);
        let mut base = 0;
        for c in &mut chunks {
            if c.iter().fold(false, |any, &t| any | (t >= need)) {
                return c.iter().position(|&t| t >= need).map(|k| base + k);
            }
            base += LANES;
        }
        chunks
            .remainder()
            .iter()
            .position(|&t| t >= need)
            .map(|k| base + k)
    }
}

impl<T: Tags> RangeMap<T> {
    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.v.len()
    }

    /// Position of `start` (`Ok`) or where it would go (`Err`).
    #[inline]
    fn search<Q: Ord + ?Sized>(&self, start: &Q) -> Result<usize, usize>
    where
        u64: Borrow<Q>,
    {
        self.v.binary_search_by(|e| e.0.borrow().cmp(start))
    }

    /// The bytes of the range starting at `start`.
    #[inline]
    pub(crate) fn get<Q: Ord + ?Sized>(&self, start: &Q) -> Option<&u64>
    where
        u64: Borrow<Q>,
    {
        self.search(start).ok().map(|i| &self.v[i].1)
    }

    /// Sets the range at `start` to `bytes`; the bytes it had, if it was there.
    pub(crate) fn insert(&mut self, start: u64, bytes: u64) -> Option<u64> {
        match self.search(&start) {
            Ok(i) => Some(std::mem::replace(&mut self.v[i].1, bytes)),
            Err(i) => {
                self.v.insert(i, (start, bytes));
                self.tags.inserted(i);
                None
            }
        }
    }

    /// Removes the range at `start`; its bytes, if it was there.
    #[inline]
    pub(crate) fn remove<Q: Ord + ?Sized>(&mut self, start: &Q) -> Option<u64>
    where
        u64: Borrow<Q>,
    {
        let i = self.search(start).ok()?;
        self.tags.removed(i);
        Some(self.v.remove(i).1)
    }

    /// Positions `[a, b)` of the entries whose start lies in `r`.
    fn bounds(&self, r: &impl RangeBounds<u64>) -> (usize, usize) {
        let a = match r.start_bound() {
            Bound::Included(&s) => self.v.partition_point(|e| e.0 < s),
            Bound::Excluded(&s) => self.v.partition_point(|e| e.0 <= s),
            Bound::Unbounded => 0,
        };
        let b = match r.end_bound() {
            Bound::Included(&e) => self.v.partition_point(|x| x.0 <= e),
            Bound::Excluded(&e) => self.v.partition_point(|x| x.0 < e),
            Bound::Unbounded => self.v.len(),
        };
        (a, b.max(a))
    }

    /// The entries whose start lies in `r`, in start order (as `BTreeMap::range`; an empty
    /// range yields nothing rather than panicking).
    pub(crate) fn range(
        &self,
        r: impl RangeBounds<u64>,
    ) -> impl DoubleEndedIterator<Item = (&u64, &u64)> + '_ {
        let (a, b) = self.bounds(&r);
        self.v[a..b].iter().map(|e| (&e.0, &e.1))
    }

    /// [`RangeMap::range`] with the bytes writable (kept for the `BTreeMap` interface that
    /// the pool's code uses; only the tests use it today).
    #[allow(dead_code)]
    pub(crate) fn range_mut(
        &mut self,
        r: impl RangeBounds<u64>,
    ) -> impl DoubleEndedIterator<Item = (&u64, &mut u64)> + '_ {
        let (a, b) = self.bounds(&r);
        self.v[a..b].iter_mut().map(|e| (&e.0, &mut e.1))
    }

    /// Every entry `(start, bytes)` in start order, by position.
    #[inline]
    pub(crate) fn as_slice(&self) -> &[(u64, u64)] {
        &self.v
    }

    /// Every entry in start order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (&u64, &u64)> + '_ {
        self.v.iter().map(|e| (&e.0, &e.1))
    }

    /// Every range's bytes, in start order.
    #[allow(dead_code)] // the `BTreeMap` interface; only the tests use it today
    pub(crate) fn values(&self) -> impl DoubleEndedIterator<Item = &u64> + '_ {
        self.v.iter().map(|e| &e.1)
    }

    /// Every range's start, in order.
    #[allow(dead_code)] // the `BTreeMap` interface; only the tests use it today
    pub(crate) fn keys(&self) -> impl DoubleEndedIterator<Item = &u64> + '_ {
        self.v.iter().map(|e| &e.0)
    }

    /// Whether the map is empty.
    #[allow(dead_code)] // the `BTreeMap` interface; only the tests use it today
    pub(crate) fn is_empty(&self) -> bool {
        self.v.is_empty()
    }

    /// The first range.
    #[allow(dead_code)] // the `BTreeMap` interface; only the tests use it today
    pub(crate) fn first_key_value(&self) -> Option<(&u64, &u64)> {
        self.v.first().map(|e| (&e.0, &e.1))
    }

    /// The last range.
    #[allow(dead_code)] // the `BTreeMap` interface; only the tests use it today
    pub(crate) fn last_key_value(&self) -> Option<(&u64, &u64)> {
        self.v.last().map(|e| (&e.0, &e.1))
    }

    /// Position of the range starting at `start`.
    #[inline]
    pub(crate) fn position(&self, start: u64) -> Option<usize> {
        self.search(&start).ok()
    }

    /// Position of the first range starting at or after `addr` (`len()` when none does).
    #[inline]
    pub(crate) fn first_from(&self, addr: u64) -> usize {
        self.v.partition_point(|e| e.0 < addr)
    }

    /// Position of the last range starting at or before `addr`.
    #[inline]
    pub(crate) fn at_or_before(&self, addr: u64) -> Option<usize> {
        self.v.partition_point(|e| e.0 <= addr).checked_sub(1)
    }

    /// Position of the last range starting before `addr`.
    #[cfg(test)]
    pub(crate) fn before(&self, addr: u64) -> Option<usize> {
        self.v.partition_point(|e| e.0 < addr).checked_sub(1)
    }

    /// The entry at position `i`.
    #[inline]
    pub(crate) fn entry(&self, i: usize) -> Option<(u64, u64)> {
        self.v.get(i).copied()
    }

    /// Rewrites the entry at position `i` as `(start, bytes)`. The caller keeps the order:
    /// `start` stays between the starts of the entries around it.
    #[inline]
    pub(crate) fn set_at(&mut self, i: usize, start: u64, bytes: u64) {
        debug_assert!(i == 0 || self.v[i - 1].0 < start);
        debug_assert!(i + 1 >= self.v.len() || start < self.v[i + 1].0);
        if let Some(e) = self.v.get_mut(i) {
            *e = (start, bytes);
        }
    }

    /// Inserts `(start, bytes)` at position `i` (the caller keeps the order).
    #[inline]
    pub(crate) fn insert_at(&mut self, i: usize, start: u64, bytes: u64) {
        debug_assert!(i == 0 || self.v[i - 1].0 < start);
        debug_assert!(i >= self.v.len() || start < self.v[i].0);
        self.v.insert(i, (start, bytes));
        self.tags.inserted(i);
    }

    /// Removes the entry at position `i`.
    #[inline]
    pub(crate) fn remove_at(&mut self, i: usize) -> (u64, u64) {
        self.tags.removed(i);
        self.v.remove(i)
    }

    /// Cuts the entry at position `i` (starting at `st`) down to a head of `head`
    /// bytes at `st` and a tail of `tail` bytes at `tail_st`, either possibly empty: the head
    /// keeps the entry's slot, or else the tail does (no shift), and only a cut that leaves
    /// both inserts one entry.
    pub(crate) fn cut(&mut self, i: usize, st: u64, head: u64, tail_st: u64, tail: u64) {
        match (head > 0, tail > 0) {
            (true, true) => {
                self.set_at(i, st, head);
                self.insert_at(i + 1, tail_st, tail);
            }
            (true, false) => self.set_at(i, st, head),
            (false, true) => self.set_at(i, tail_st, tail),
            (false, false) => {
                self.remove_at(i);
            }
        }
    }

    /// Adds `[addr, addr + bytes)`, merged with the range ending at `addr` (unless
    /// `addr` is the reservation's start `lo`) and the one starting at its end (unless that is
    /// the reservation's end `hi`): one entry grows in place, and only a join of both removes
    /// one. Returns the ranges `(start, bytes)` merged before and after.
    pub(crate) fn join(
        &mut self,
        addr: u64,
        bytes: u64,
        lo: u64,
        hi: u64,
    ) -> (Option<Range>, Option<Range>) {
        let (prev, next, _) = self.join_at(addr, bytes, lo, hi);
        (prev, next)
    }

    /// [`RangeMap::join`], and the position of the merged range.
    pub(crate) fn join_at(
        &mut self,
        addr: u64,
        bytes: u64,
        lo: u64,
        hi: u64,
    ) -> (Option<Range>, Option<Range>, usize) {
        let end = addr + bytes;
        let i = self.first_from(addr);
        let prev = i
            .checked_sub(1)
            .filter(|_| addr > lo)
            .and_then(|j| self.entry(j))
            .filter(|&(ps, pl)| ps + pl == addr);
        let next = self.entry(i).filter(|&(ns, _)| ns == end && end < hi);
        let at = match (prev, next) {
            (Some((ps, pl)), Some((_, nl))) => {
                self.set_at(i - 1, ps, pl + bytes + nl);
                self.remove_at(i);
                i - 1
            }
            (Some((ps, pl)), None) => {
                self.set_at(i - 1, ps, pl + bytes);
                i - 1
            }
            (None, Some((_, nl))) => {
                self.set_at(i, addr, bytes + nl);
                i
            }
            (None, None) => {
                self.insert_at(i, addr, bytes);
                i
            }
        };
        (prev, next, at)
    }
}

impl<'a, T: Tags> IntoIterator for &'a RangeMap<T> {
    type Item = (&'a u64, &'a u64);
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, (u64, u64)>, fn(&(u64, u64)) -> (&u64, &u64)>;

    fn into_iter(self) -> Self::IntoIter {
        fn pair(e: &(u64, u64)) -> (&u64, &u64) {
            (&e.0, &e.1)
        }
        self.v.iter().map(pair as fn(&(u64, u64)) -> (&u64, &u64))
    }
}

/// The invariant checker recomputes the mapped runs into a `BTreeMap` and compares.
impl<T: Tags> PartialEq<RangeMap<T>> for BTreeMap<u64, u64> {
    fn eq(&self, other: &RangeMap<T>) -> bool {
        self.len() == other.len() && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn same(m: &RangeMap, model: &BTreeMap<u64, u64>, probes: &[u64]) {
        assert!(model == m);
        assert_eq!(m.len(), model.len());
        assert!(m.iter().eq(model.iter()));
        assert!(m.values().eq(model.values()));
        assert!(m.keys().rev().eq(model.keys().rev()));
        assert_eq!(m.is_empty(), model.is_empty());
        assert_eq!(m.first_key_value(), model.first_key_value());
        assert_eq!(m.last_key_value(), model.last_key_value());
        assert!(m.into_iter().eq(model.iter()));
        for &a in probes {
            assert_eq!(m.get(&a), model.get(&a));
            assert!(m.range(..=a).eq(model.range(..=a)), "..={a}");
            assert!(m.range(..a).rev().eq(model.range(..a).rev()), "..{a}");
            assert!(m.range(a..).eq(model.range(a..)), "{a}..");
            let b = a.saturating_add(1000);
            assert!(m.range(a..b).eq(model.range(a..b)), "{a}..{b}");
            let want = model.range(..=a).next_back().map(|(&s, &l)| (s, l));
            assert_eq!(m.at_or_before(a).and_then(|i| m.entry(i)), want);
            let want = model.range(..a).next_back().map(|(&s, &l)| (s, l));
            assert_eq!(m.before(a).and_then(|i| m.entry(i)), want);
        }
    }

    #[test]
    fn positional_edits_keep_the_map() {
        let mut m = RangeMap::default();
        let mut model = BTreeMap::new();
        for (s, l) in [(100, 10), (300, 50), (200, 20)] {
            assert_eq!(m.insert(s, l), model.insert(s, l));
        }
        assert_eq!(m.insert(200, 25), Some(20));
        model.insert(200, 25);
        same(&m, &model, &[0, 100, 150, 200, 299, 300, 400]);
        // The range at 200 gives up its head in place.
        let i = m.at_or_before(210).unwrap();
        assert_eq!(m.entry(i), Some((200, 25)));
        m.set_at(i, 210, 15);
        model.remove(&200);
        model.insert(210, 15);
        same(&m, &model, &[0, 200, 210, 211]);
        m.insert_at(i + 1, 250, 5);
        model.insert(250, 5);
        assert_eq!(m.remove_at(0), (100, 10));
        model.remove(&100);
        same(&m, &model, &[0, 100, 250, 300]);
        assert_eq!(m.remove(&300), Some(50));
        assert_eq!(m.remove(&300), None);
        for (_, l) in m.range_mut(..) {
            *l += 1;
        }
        assert_eq!(
            m.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(),
            [(210, 16), (250, 6)]
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(u64),
        Add(u64, u64),
    }

    proptest! {
        #[test]
        fn same_as_a_btreemap(ops in prop::collection::vec(prop_oneof![
            (0u64..64, 1u64..9).prop_map(|(s, l)| Op::Insert(s * 16, l)),
            (0u64..64).prop_map(|s| Op::Remove(s * 16)),
            (0u64..1100, 1u64..5).prop_map(|(a, d)| Op::Add(a, d)),
        ], 1..120)) {
            let mut m = RangeMap::default();
            let mut model = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Insert(s, l) => prop_assert_eq!(m.insert(s, l), model.insert(s, l)),
                    Op::Remove(s) => prop_assert_eq!(m.remove(&s), model.remove(&s)),
                    Op::Add(a, d) => {
                        // Grow the range starting at or before `a` (`range_mut`), in both.
                        if let Some((_, l)) = m.range_mut(..=a).next_back() {
                            *l += d;
                        }
                        if let Some((_, l)) = model.range_mut(..=a).next_back() {
                            *l += d;
                        }
                    }
                }
                same(&m, &model, &[0, 15, 16, 17, 500, 1023, 1024, 2000]);
            }
        }
    }

    proptest! {
        /// Tags follow their ranges through inserts, removals, cuts and joins; the maximum
        /// and the first tag at least a value match a model's linear scan.
        #[test]
        fn fit_tags_follow_their_ranges(ops in prop::collection::vec(
            (0u8..4, 0u64..80, 1u64..6, 0u32..40), 1..150)
        ) {
            let mut m: RangeMap<FitTags> = RangeMap::default();
            // Model: start -> (bytes, tag).
            let mut model: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
            for (op, a, l, t) in ops {
                let s = a * 16;
                match op {
                    0 => {
                        if m.insert(s, l).is_none() {
                            model.insert(s, (l, 0));
                        } else if let Some(e) = model.get_mut(&s) {
                            e.0 = l;
                        }
                    }
                    1 => {
                        prop_assert_eq!(m.remove(&s), model.remove(&s).map(|e| e.0));
                    }
                    2 => {
                        if let Some(i) = m.position(s) {
                            m.set_tag(i, t);
                            if let Some(e) = model.get_mut(&s) {
                                e.1 = t;
                            }
                        }
                    }
                    _ => {
                        // Cut the range at `s` (if any) into a head and a tail, both new tags 0
                        // except the head's slot, which keeps its tag.
                        if let (Some(i), Some(&(len, tag))) = (m.position(s), model.get(&s)) {
                            if len >= 3 && m.range(s + 1..=s + 2).next().is_none() {
                                m.cut(i, s, 1, s + 2, len - 2);
                                model.insert(s, (1, tag));
                                model.insert(s + 2, (len - 2, 0));
                            }
                        }
                    }
                }
                let tags: Vec<u32> = model.values().map(|e| e.1).collect();
                for (i, &want) in tags.iter().enumerate() {
                    prop_assert_eq!(m.tag(i), want);
                }
                prop_assert_eq!(m.max_tag(), tags.iter().copied().max().unwrap_or(0));
                for need in [1, 5, 20, 39, 40] {
                    prop_assert_eq!(
                        m.first_tag_at_least(need),
                        tags.iter().position(|&x| x >= need)
                    );
                }
            }
        }
    }
}
