//! The mapped free runs by size, for best fit: a segregated index in the log-linear bins of
//! [`crate::size_class`] (16 per power of two), each bin a `Vec` sorted by
//! `(bytes, start)`, with the two-level bitmap of the non-empty bins that [`crate::best_fit`]
//! uses too ([`crate::size_class::BinBitmap`]).
//!
//! It answers what the `BTreeSet<(bytes, start)>` it replaced answered, in the same order:
//! [`SizeIndex::range_from`] walks the runs in `(bytes, start)` order from the first of at
//! least `bytes` bytes (a binary search in the request's own bin, then the next non-empty bins
//! by `trailing_zeros`: every run of a higher bin is longer than any of a lower one), and
//! [`SizeIndex::last`] is the longest run (the last of the highest non-empty bin). An insert
//! or a removal is a binary search and a shift within one bin; runs of one bin are within
//! 1/16 of each other in size, so a bin stays short unless many runs share nearly one size
//! (the shift then moves 16 bytes a run, still well below a B-tree's cost for the few hundred
//! runs of a pool).
use crate::size_class::{BinBitmap, LogLinear};

/// The bins: 16 per power of two.
type Bins = LogLinear<4>;

/// Runs `(bytes, start)` by size (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SizeIndex {
    /// One `Vec` per bin, sorted by `(bytes, start)`; empty until the first insertion.
    bins: Vec<Vec<(u64, u64)>>,
    /// Which bins are non-empty.
    nonempty: BinBitmap,
    /// Runs in all the bins.
    len: usize,
}

impl SizeIndex {
    /// Runs in the index.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Adds the run `(bytes, start)` (a run already there is not added twice).
    pub(crate) fn insert(&mut self, bytes: u64, start: u64) {
        if self.bins.is_empty() {
            self.bins = vec![Vec::new(); Bins::BIN_COUNT as usize];
        }
        let bin = Bins::floor(bytes);
        let Some(v) = self.bins.get_mut(bin as usize) else {
            return;
        };
        let key = (bytes, start);
        if let Err(i) = v.binary_search(&key) {
            v.insert(i, key);
            self.len += 1;
            if v.len() == 1 {
                self.nonempty.set(bin);
            }
        }
    }

    /// Removes the run `(bytes, start)`; whether it was there.
    pub(crate) fn remove(&mut self, bytes: u64, start: u64) -> bool {
        let bin = Bins::floor(bytes);
        let Some(v) = self.bins.get_mut(bin as usize) else {
            return false;
        };
        let Ok(i) = v.binary_search(&(bytes, start)) else {
            return false;
        };
        v.remove(i);
        self.len -= 1;
        if v.is_empty() {
            self.nonempty.clear(bin);
        }
        true
    }

    /// The runs of at least `bytes` bytes, in `(bytes, start)` order (what
    /// `BTreeSet::range((bytes, 0)..)` yields).
    pub(crate) fn range_from(&self, bytes: u64) -> RangeFrom<'_> {
        let first = Bins::floor(bytes);
        let bin = self.nonempty.next_nonempty(first);
        let pos = match bin {
            // Only the request's own bin holds runs shorter than the request.
            Some(b) if b == first => self
                .bins
                .get(b as usize)
                .map_or(0, |v| v.partition_point(|&(l, _)| l < bytes)),
            _ => 0,
        };
        RangeFrom {
            index: self,
            bin,
            pos,
        }
    }

    /// The longest run (the greatest `(bytes, start)`), if any.
    pub(crate) fn last(&self) -> Option<&(u64, u64)> {
        self.bins.get(self.nonempty.last()? as usize)?.last()
    }

    /// Every run in `(bytes, start)` order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &(u64, u64)> + '_ {
        self.bins.iter().flatten()
    }
}

/// Iterator of [`SizeIndex::range_from`].
#[derive(Debug, Clone)]
pub(crate) struct RangeFrom<'a> {
    index: &'a SizeIndex,
    /// Bin being walked (`None`: done).
    bin: Option<u32>,
    /// Next position in it.
    pos: usize,
}

impl Iterator for RangeFrom<'_> {
    type Item = (u64, u64);

    #[inline]
    fn next(&mut self) -> Option<(u64, u64)> {
        loop {
            let b = self.bin?;
            if let Some(&run) = self
                .index
                .bins
                .get(b as usize)
                .and_then(|v| v.get(self.pos))
            {
                self.pos += 1;
                return Some(run);
            }
            self.bin = self.index.nonempty.next_nonempty(b + 1);
            self.pos = 0;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// The index and the `BTreeSet` it replaced answer alike.
    fn same(ix: &SizeIndex, model: &BTreeSet<(u64, u64)>, probes: &[u64]) {
        assert_eq!(ix.len(), model.len());
        assert_eq!(ix.last(), model.last());
        let all: Vec<(u64, u64)> = ix.iter().copied().collect();
        let want: Vec<(u64, u64)> = model.iter().copied().collect();
        assert_eq!(all, want);
        for &b in probes {
            let got: Vec<(u64, u64)> = ix.range_from(b).collect();
            let want: Vec<(u64, u64)> = model.range((b, 0)..).copied().collect();
            assert_eq!(got, want, "range_from({b})");
        }
    }

    #[test]
    fn walks_in_size_then_address_order_across_bins() {
        let mut ix = SizeIndex::default();
        let mut model = BTreeSet::new();
        // Two runs of one size (ties by address), neighbours within one bin, and runs of
        // other powers of two.
        for (l, s) in [
            (4096, 900),
            (4096, 100),
            (4352, 50),
            (1 << 21, 7),
            (3 << 20, 1),
            (256, 3),
        ] {
            ix.insert(l, s);
            model.insert((l, s));
        }
        same(
            &ix,
            &model,
            &[0, 1, 256, 257, 4096, 4097, 4352, 4353, 1 << 21, 1 << 40],
        );
        assert_eq!(ix.range_from(4096).next(), Some((4096, 100)));
        assert_eq!(ix.range_from(4097).next(), Some((4352, 50)));
        assert_eq!(ix.last(), Some(&(3 << 20, 1)));
        assert!(ix.remove(4096, 100));
        assert!(!ix.remove(4096, 100), "already gone");
        assert!(!ix.remove(12345, 1), "never there");
        model.remove(&(4096, 100));
        same(&ix, &model, &[0, 4096, 4097]);
        // Emptying a bin clears its bits: the walk skips it.
        assert!(ix.remove(3 << 20, 1));
        model.remove(&(3 << 20, 1));
        same(&ix, &model, &[0, 1 << 21, (1 << 21) + 1]);
        assert_eq!(ix.last(), Some(&(1 << 21, 7)));
    }

    #[test]
    fn empty_and_extreme_sizes() {
        let mut ix = SizeIndex::default();
        assert_eq!(ix.last(), None);
        assert_eq!(ix.range_from(0).next(), None);
        ix.insert(u64::MAX, 0);
        ix.insert(1, 0);
        ix.insert(1, 0); // not twice
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.range_from(2).collect::<Vec<_>>(), [(u64::MAX, 0)]);
        assert_eq!(ix.last(), Some(&(u64::MAX, 0)));
        assert_eq!(ix.range_from(u64::MAX).count(), 1);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Sizes over a few powers of two, in 256-byte units and crowded into few values
        // (many ties), and addresses from a small set (repeated keys).
        let size = prop_oneof![
            (1u64..64).prop_map(|u| u * 256),
            (1u64..4).prop_map(|k| k << 21),
            any::<u64>(),
        ];
        prop_oneof![
            3 => (size, 0u64..64).prop_map(|(l, s)| Op::Insert(l, s << 8)),
            2 => any::<usize>().prop_map(Op::Remove),
        ]
    }

    proptest! {
        #[test]
        fn same_as_a_btreeset(ops in prop::collection::vec(op(), 1..200), probes in prop::collection::vec(prop_oneof![0u64..20_000, any::<u64>()], 4)) {
            let mut ix = SizeIndex::default();
            let mut model = BTreeSet::new();
            for o in ops {
                match o {
                    Op::Insert(l, s) => {
                        ix.insert(l, s);
                        model.insert((l, s));
                    }
                    Op::Remove(k) => {
                        // Remove an entry that is there (when any), or one that is not.
                        let key = model.iter().nth(k % (model.len() + 1)).copied();
                        let (l, s) = key.unwrap_or((k as u64 | 1, 7));
                        prop_assert_eq!(ix.remove(l, s), model.remove(&(l, s)));
                    }
                }
                let mut p = probes.clone();
                p.extend(model.iter().step_by(7).flat_map(|&(l, _)| [l, l.saturating_add(1)]));
                same(&ix, &model, &p);
            }
        }
    }
}
