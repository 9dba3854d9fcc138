//! The live blocks by user address: an open-addressing table with linear probing and
//! backward-shift deletion (no tombstones), keyed by addresses that are never 0.
//!
//! Every allocation inserts and every free removes one entry, so this table is on the hot path
//! of a replay; a general hash map costs several times the instructions per operation
//! (`docs/decisions.md`, "A slab of blocks and log-linear free sets").

/// User address → slab index of its block.
#[derive(Debug, Clone, Default)]
pub(crate) struct LiveMap {
    /// `(address, index)`; address 0 marks an empty slot.
    slots: Vec<(u64, u32)>,
    len: usize,
    /// `64 − log2(slots.len())`.
    shift: u32,
}

impl LiveMap {
    #[inline]
    fn home(&self, addr: u64) -> usize {
        // Addresses are multiples of 512: drop the zero bits, then a multiplicative hash.
        ((addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    fn grow(&mut self) {
        let cap = (self.slots.len() * 2).max(64);
        let old = std::mem::replace(&mut self.slots, vec![(0, 0); cap]);
        self.shift = 64 - cap.trailing_zeros();
        self.len = 0;
        for (a, i) in old {
            if a != 0 {
                self.insert(a, i);
            }
        }
    }

    /// Maps `addr` (not 0) to `idx`, replacing an older entry.
    #[inline]
    pub fn insert(&mut self, addr: u64, idx: u32) {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut at = self.home(addr);
        loop {
            let slot = &mut self.slots[at];
            if slot.0 == 0 {
                *slot = (addr, idx);
                self.len += 1;
                return;
            }
            if slot.0 == addr {
                slot.1 = idx;
                return;
            }
            at = (at + 1) & mask;
        }
    }

    /// The index of `addr`, if live.
    pub fn get(&self, addr: u64) -> Option<u32> {
        if self.slots.is_empty() || addr == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut at = self.home(addr);
        loop {
            let (a, i) = self.slots[at];
            if a == addr {
                return Some(i);
            }
            if a == 0 {
                return None;
            }
            at = (at + 1) & mask;
        }
    }

    /// Removes `addr`, returning its index.
    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<u32> {
        if self.slots.is_empty() || addr == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut at = self.home(addr);
        let idx = loop {
            let (a, i) = self.slots[at];
            if a == addr {
                break i;
            }
            if a == 0 {
                return None;
            }
            at = (at + 1) & mask;
        };
        // Backward-shift deletion: move later entries of the probe run into the hole when
        // their home lies at or before it.
        let mut hole = at;
        let mut next = (hole + 1) & mask;
        loop {
            let (a, _) = self.slots[next];
            if a == 0 {
                break;
            }
            let home = self.home(a);
            // Whether `home` lies cyclically outside (hole, next].
            let movable = if hole <= next {
                home <= hole || home > next
            } else {
                home <= hole && home > next
            };
            if movable {
                self.slots[hole] = self.slots[next];
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.slots[hole] = (0, 0);
        self.len -= 1;
        Some(idx)
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Every `(address, index)`.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.slots.iter().copied().filter(|e| e.0 != 0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    proptest::proptest! {
        /// Same answers as a `HashMap` through any sequence of inserts and removes, with
        /// addresses crowded into few slots.
        #[test]
        fn behaves_like_a_hash_map(ops in proptest::collection::vec((1u64..200, proptest::bool::ANY), 1..600)) {
            let mut m = LiveMap::default();
            let mut h: HashMap<u64, u32> = HashMap::new();
            for (n, (k, ins)) in ops.into_iter().enumerate() {
                let addr = k << 21; // 2 MiB apart: the low bits all equal
                if ins {
                    m.insert(addr, n as u32);
                    h.insert(addr, n as u32);
                } else {
                    proptest::prop_assert_eq!(m.remove(addr), h.remove(&addr));
                }
                proptest::prop_assert_eq!(m.len(), h.len());
                for (&a, &i) in &h {
                    proptest::prop_assert_eq!(m.get(a), Some(i));
                }
                proptest::prop_assert_eq!(m.iter().count(), h.len());
            }
        }
    }
}
