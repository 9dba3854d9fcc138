//! The live blocks of a [`PagedPool`](super::PagedPool) by address: an open-addressing hash
//! table with linear probing, keyed by the block address alone.
//!
//! Every allocation inserts one entry and every free removes one, so the table's cost is paid
//! twice an event. A general hash map (`hashbrown` through [`crate::hash::AddrMap`]) costs
//! ≈ 140 instructions a pair there (the SIMD group probe, control bytes, growth checks and an
//! out-of-line insert); this one hashes the address with one multiply (Fibonacci hashing on
//! the 256-byte unit, the top bits picking the slot), probes slots of 24 bytes in a line,
//! keeps the load at most one quarter (short probes and short runs to shift), and deletes by shifting the entries after
//! the hole back (no tombstones, so lookups never slow down as the replay goes on). What it
//! trades: it holds only `u64 → LiveBlock`, iterates in slot order (callers that need
//! address order sort, as they did), and takes 4–8 slots a block (24 bytes each).
use super::LiveBlock;

/// The key of an empty slot (never a block address: blocks are 256-byte aligned).
const EMPTY: u64 = u64::MAX;

/// Slots of a table's first allocation (a power of two).
const MIN_SLOTS: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Slot {
    addr: u64,
    blk: LiveBlock,
}

const EMPTY_SLOT: Slot = Slot {
    addr: EMPTY,
    blk: LiveBlock {
        bytes: 0,
        requested: 0,
    },
};

/// Live blocks, address → [`LiveBlock`] (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct LiveMap {
    /// A power of two of slots (or none before the first insert).
    slots: Vec<Slot>,
    /// Entries held.
    len: usize,
    /// `64 − log2(slots)`: the hash's top bits pick the home slot.
    shift: u32,
}

impl Default for LiveMap {
    fn default() -> Self {
        LiveMap {
            slots: Vec::new(),
            len: 0,
            shift: 64,
        }
    }
}

impl LiveMap {
    /// The home slot of `addr` (the table is not empty).
    #[inline(always)]
    fn home(&self, addr: u64) -> usize {
        ((addr >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The slot holding `addr`, if any.
    #[inline(always)]
    fn find(&self, addr: u64) -> Option<usize> {
        if self.len == 0 || addr == EMPTY {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let a = self.slots.get(i)?.addr;
            if a == addr {
                return Some(i);
            }
            if a == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Whether no entry is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The block at `addr`.
    pub(crate) fn get(&self, addr: &u64) -> Option<&LiveBlock> {
        let i = self.find(*addr)?;
        self.slots.get(i).map(|s| &s.blk)
    }

    /// Sets the block at `addr`; the one it replaces, if any. `addr` must not be `u64::MAX`
    /// (no block starts there: such an insert is ignored).
    #[inline]
    pub(crate) fn insert(&mut self, addr: u64, blk: LiveBlock) -> Option<LiveBlock> {
        if addr == EMPTY {
            return None;
        }
        if (self.len + 1) * 4 > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let s = self.slots.get_mut(i)?;
            if s.addr == EMPTY {
                *s = Slot { addr, blk };
                self.len += 1;
                return None;
            }
            if s.addr == addr {
                return Some(std::mem::replace(&mut s.blk, blk));
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes the block at `addr` and returns it. The entries after the hole that may move
    /// back (their home slot is not between the hole and them) shift into it, so that every
    /// entry stays reachable from its home slot without tombstones.
    #[inline]
    pub(crate) fn remove(&mut self, addr: &u64) -> Option<LiveBlock> {
        let mut hole = self.find(*addr)?;
        let blk = self.slots.get(hole)?.blk;
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let Some(&s) = self.slots.get(j) else {
                break;
            };
            if s.addr == EMPTY {
                break;
            }
            // `s` may fill the hole when the hole lies cyclically in [home, j].
            let home = self.home(s.addr);
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                if let Some(h) = self.slots.get_mut(hole) {
                    *h = s;
                }
                hole = j;
            }
        }
        if let Some(h) = self.slots.get_mut(hole) {
            *h = EMPTY_SLOT;
        }
        self.len -= 1;
        Some(blk)
    }

    /// Twice the slots (or the first [`MIN_SLOTS`]), every entry placed again (out of line:
    /// a handful of times a replay).
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![EMPTY_SLOT; n]);
        self.shift = 64 - n.trailing_zeros();
        self.len = 0;
        for s in old.into_iter().filter(|s| s.addr != EMPTY) {
            self.insert(s.addr, s.blk);
        }
    }

    /// Every entry, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u64, &LiveBlock)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.addr != EMPTY)
            .map(|s| (&s.addr, &s.blk))
    }

    /// Every block, in slot order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &LiveBlock> + '_ {
        self.iter().map(|(_, b)| b)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn blk(n: u64) -> LiveBlock {
        LiveBlock {
            bytes: n * 256,
            requested: n,
        }
    }

    /// After every operation: the same answers as a `HashMap`, and every entry reachable.
    fn same(m: &LiveMap, model: &HashMap<u64, LiveBlock>, probes: &[u64]) {
        assert_eq!(m.len, model.len());
        assert_eq!(m.is_empty(), model.is_empty());
        for (&a, b) in model {
            assert_eq!(m.get(&a), Some(b), "{a:#x}");
        }
        for a in probes {
            assert_eq!(m.get(a), model.get(a), "{a:#x}");
        }
        let mut got: Vec<_> = m.iter().map(|(&a, &b)| (a, b)).collect();
        got.sort_unstable_by_key(|e| e.0);
        let mut want: Vec<_> = model.iter().map(|(&a, &b)| (a, b)).collect();
        want.sort_unstable_by_key(|e| e.0);
        assert_eq!(got, want);
        assert_eq!(
            m.values().map(|b| b.bytes).sum::<u64>(),
            model.values().map(|b| b.bytes).sum::<u64>()
        );
        // At most a quarter full.
        assert!(m.len * 4 <= m.slots.len() || m.slots.is_empty());
    }

    #[test]
    fn grows_replaces_and_removes() {
        let mut m = LiveMap::default();
        let mut model = HashMap::new();
        assert_eq!(m.remove(&0), None);
        assert_eq!(m.get(&EMPTY), None);
        for i in 0..1000u64 {
            assert_eq!(m.insert(i << 21, blk(i)), None);
            model.insert(i << 21, blk(i));
        }
        same(&m, &model, &[1, 256, 1000 << 21]);
        assert_eq!(m.insert(5 << 21, blk(7)), Some(blk(5)));
        model.insert(5 << 21, blk(7));
        for i in (0..1000u64).step_by(3) {
            assert_eq!(m.remove(&(i << 21)), model.remove(&(i << 21)));
        }
        same(&m, &model, &[0, 3 << 21, 999 << 21]);
        assert_eq!(m.remove(&(3 << 21)), None);
        // The empty key is never stored.
        assert_eq!(m.insert(EMPTY, blk(1)), None);
        assert_eq!(m.get(&EMPTY), None);
        same(&m, &model, &[EMPTY]);
    }

    proptest! {
        /// Inserts and removes of colliding keys (few distinct addresses, so probe runs
        /// wrap and backward shifts cross the end of the table) keep every answer.
        #[test]
        fn same_as_a_hashmap(ops in prop::collection::vec((any::<bool>(), 0u64..300), 1..400)) {
            let mut m = LiveMap::default();
            let mut model = HashMap::new();
            for (ins, k) in ops {
                let a = k * 256;
                if ins {
                    prop_assert_eq!(m.insert(a, blk(k)), model.insert(a, blk(k)));
                } else {
                    prop_assert_eq!(m.remove(&a), model.remove(&a));
                }
                same(&m, &model, &[a, a + 256]);
            }
        }
    }
}
