//! A map keyed by a device address (or any `u64`): an open-addressing hash table with linear
//! probing, for maps that take an insert and a removal on every allocate/free pair (`paged`'s
//! live blocks, the replay's live trace addresses).
//!
//! A general hash map (`hashbrown` through [`crate::hash::AddrMap`]) costs several times this
//! table's instructions a pair there (the SIMD group probe, control bytes, growth checks and
//! an out-of-line insert), and under steady insert/remove churn the tombstones its removals
//! leave make an insert rehash the whole table in place now and then. This one hashes the key
//! with one multiply (Fibonacci hashing: the top bits of `key × 2^64/φ` pick the slot, and
//! they depend on every bit of the key, so aligned addresses and small ids both spread),
//! probes slots in a line, keeps the load at most one quarter (short probes, short runs to
//! shift), and deletes by shifting the entries after the hole back: no tombstones, so
//! look-ups never slow down as a replay goes on. The key `u64::MAX` marks an empty slot; an
//! entry under that key is held beside the slots.
//!
//! What it trades: it iterates in slot order (no order a caller may rely on), and takes 4–8
//! slots an entry.

/// The key of an empty slot (an entry under this key lives in `AddrTable::max_key`).
const EMPTY: u64 = u64::MAX;

/// Slots of a table's first allocation (a power of two).
const MIN_SLOTS: usize = 64;

/// Fibonacci hashing's multiplier, `2^64 / φ` rounded to odd.
const FIB: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Debug, Clone, Copy)]
struct Slot<V> {
    key: u64,
    value: V,
}

/// `u64` → `V` (see the module documentation).
///
/// ```
/// use gpumem_core::addr_table::AddrTable;
///
/// let mut m = AddrTable::default();
/// assert_eq!(m.insert(0x7f00_0020_0000, 1u32), None);
/// assert_eq!(m.insert(0x7f00_0020_0000, 2), Some(1));
/// assert_eq!(m.get(&0x7f00_0020_0000), Some(&2));
/// assert_eq!(m.remove(&0x7f00_0020_0000), Some(2));
/// assert!(m.is_empty());
/// ```
#[derive(Debug, Clone)]
pub struct AddrTable<V> {
    /// A power of two of slots (or none before the first insert).
    slots: Vec<Slot<V>>,
    /// Entries held in `slots`.
    len: usize,
    /// `64 − log2(slots)`: the hash's top bits pick the home slot.
    shift: u32,
    /// The entry under the key `u64::MAX`, which marks empty slots.
    max_key: Option<V>,
}

impl<V> Default for AddrTable<V> {
    fn default() -> Self {
        AddrTable {
            slots: Vec::new(),
            len: 0,
            shift: 64,
            max_key: None,
        }
    }
}

impl<V: Copy + Default> AddrTable<V> {
    /// The home slot of `key` (the table has slots).
    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(FIB) >> self.shift) as usize
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The slot holding `key` (not [`EMPTY`]), if any.
    #[inline(always)]
    fn find(&self, key: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.slots.get(i)?.key;
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len + usize::from(self.max_key.is_some())
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value under `key`.
    #[inline]
    pub fn get(&self, key: &u64) -> Option<&V> {
        if *key == EMPTY {
            return self.max_key.as_ref();
        }
        let i = self.find(*key)?;
        self.slots.get(i).map(|s| &s.value)
    }

    /// Sets the value under `key`; the one it replaces, if any.
    #[inline]
    pub fn insert(&mut self, key: u64, value: V) -> Option<V> {
        if key == EMPTY {
            return self.max_key.replace(value);
        }
        if (self.len + 1) * 4 > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let s = self.slots.get_mut(i)?;
            if s.key == EMPTY {
                *s = Slot { key, value };
                self.len += 1;
                return None;
            }
            if s.key == key {
                return Some(std::mem::replace(&mut s.value, value));
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes the entry under `key` and returns its value. The entries after the hole that
    /// may move back (their home slot is not between the hole and them) shift into it, so
    /// that every entry stays reachable from its home slot without tombstones.
    #[inline]
    pub fn remove(&mut self, key: &u64) -> Option<V> {
        if *key == EMPTY {
            return self.max_key.take();
        }
        let mut hole = self.find(*key)?;
        let value = self.slots.get(hole)?.value;
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let Some(&s) = self.slots.get(j) else {
                break;
            };
            if s.key == EMPTY {
                break;
            }
            // `s` may fill the hole when the hole lies cyclically in [home, j].
            let home = self.home(s.key);
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                if let Some(h) = self.slots.get_mut(hole) {
                    *h = s;
                }
                hole = j;
            }
        }
        if let Some(h) = self.slots.get_mut(hole) {
            h.key = EMPTY;
        }
        self.len -= 1;
        Some(value)
    }

    /// Twice the slots (or the first [`MIN_SLOTS`]), every entry placed again (out of line:
    /// a handful of times a replay).
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(MIN_SLOTS);
        let empty = Slot {
            key: EMPTY,
            value: V::default(),
        };
        let old = std::mem::replace(&mut self.slots, vec![empty; n]);
        self.shift = 64 - n.trailing_zeros();
        self.len = 0;
        for s in old.into_iter().filter(|s| s.key != EMPTY) {
            self.insert(s.key, s.value);
        }
    }

    /// Every entry, in slot order (the key `u64::MAX` last).
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &V)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.key != EMPTY)
            .map(|s| (&s.key, &s.value))
            .chain(self.max_key.as_ref().map(|v| (&EMPTY, v)))
    }

    /// Every value, in slot order.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, v)| v)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// After every operation: the same answers as a `HashMap`, and every entry reachable.
    fn same(m: &AddrTable<u64>, model: &HashMap<u64, u64>, probes: &[u64]) {
        assert_eq!(m.len(), model.len());
        assert_eq!(m.is_empty(), model.is_empty());
        for (&a, b) in model {
            assert_eq!(m.get(&a), Some(b), "{a:#x}");
        }
        for a in probes {
            assert_eq!(m.get(a), model.get(a), "{a:#x}");
        }
        let mut got: Vec<_> = m.iter().map(|(&a, &b)| (a, b)).collect();
        got.sort_unstable();
        let mut want: Vec<_> = model.iter().map(|(&a, &b)| (a, b)).collect();
        want.sort_unstable();
        assert_eq!(got, want);
        assert_eq!(m.values().sum::<u64>(), model.values().sum::<u64>());
        // At most a quarter full.
        assert!(m.len * 4 <= m.slots.len() || m.slots.is_empty());
    }

    #[test]
    fn grows_replaces_and_removes() {
        let mut m = AddrTable::default();
        let mut model = HashMap::new();
        assert_eq!(m.remove(&0), None);
        assert_eq!(m.get(&EMPTY), None);
        for i in 0..1000u64 {
            assert_eq!(m.insert(i << 21, i), None);
            model.insert(i << 21, i);
        }
        same(&m, &model, &[1, 256, 1000 << 21]);
        assert_eq!(m.insert(5 << 21, 7), Some(5));
        model.insert(5 << 21, 7);
        for i in (0..1000u64).step_by(3) {
            assert_eq!(m.remove(&(i << 21)), model.remove(&(i << 21)));
        }
        same(&m, &model, &[0, 3 << 21, 999 << 21]);
        assert_eq!(m.remove(&(3 << 21)), None);
        // The key that marks empty slots is held beside them.
        assert_eq!(m.insert(EMPTY, 1), None);
        model.insert(EMPTY, 1);
        assert_eq!(m.insert(EMPTY, 2), Some(1));
        model.insert(EMPTY, 2);
        same(&m, &model, &[EMPTY, 0]);
        assert_eq!(m.remove(&EMPTY), Some(2));
        model.remove(&EMPTY);
        same(&m, &model, &[EMPTY]);
    }

    #[test]
    fn small_consecutive_keys_spread() {
        // Keys that differ only in their low bits (ids rather than addresses) get distinct
        // home slots: no probe run longer than a few slots.
        let mut m = AddrTable::default();
        for k in 0..256u64 {
            m.insert(k, k);
        }
        let homes: std::collections::HashSet<usize> = (0..256u64).map(|k| m.home(k)).collect();
        assert!(homes.len() > 200, "{} distinct home slots", homes.len());
    }

    proptest! {
        /// Inserts and removes of colliding keys (few distinct keys, so probe runs wrap and
        /// backward shifts cross the end of the table), aligned or not, keep every answer.
        #[test]
        fn same_as_a_hashmap(ops in prop::collection::vec((any::<bool>(), 0u64..300, 0u32..3), 1..400)) {
            let mut m = AddrTable::default();
            let mut model = HashMap::new();
            for (ins, k, form) in ops {
                let a = match form {
                    0 => k * 256,
                    1 => k,
                    _ => EMPTY - k % 3,
                };
                if ins {
                    prop_assert_eq!(m.insert(a, k), model.insert(a, k));
                } else {
                    prop_assert_eq!(m.remove(&a), model.remove(&a));
                }
                same(&m, &model, &[a, a.wrapping_add(256)]);
            }
        }
    }
}
