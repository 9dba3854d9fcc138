//! A fixed-size max tree over `u32` leaves: set a leaf, read the maximum, and find the
//! first leaf (in index order) holding at least a value, each in O(log n).
//!
//! The page-mapped strategy keeps one leaf per (page, edge) of a VA reservation, holding the
//! usable free bytes (in 256-byte units) next to that page's mapped edge, so "the lowest
//! address where a block fits without mapping a page" is one descent.
//!
//! The tree is [`FANOUT`]-ary (a B-tree-like layout, as in cache-conscious search trees):
//! each level is one array, the children of node `i` are entries `FANOUT·i ..` of the
//! level below, contiguous (one 64-byte cache line). A reservation of `2 × 141 GB` has
//! 269 k leaves: 5 levels of ≈ 1.1 MiB in all, against 20 levels and 4 MiB for a binary
//! tree rounded up to a power of two.

/// Children per node.
const FANOUT: usize = 16;

/// Max tree; `levels[0]` are the leaves, `levels[l][i]` is the maximum of
/// `levels[l - 1][FANOUT·i .. FANOUT·(i + 1)]`, the last level has one entry (the root).
#[derive(Debug, Clone)]
pub(crate) struct MaxTree {
    levels: Vec<Vec<u32>>,
}

impl MaxTree {
    /// A tree of at least `leaves` leaves, all 0.
    pub(crate) fn new(leaves: usize) -> Self {
        let mut levels = Vec::new();
        let mut n = leaves.max(1);
        loop {
            let padded = n.div_ceil(FANOUT) * FANOUT;
            levels.push(vec![0; padded]);
            n = padded / FANOUT;
            if n == 1 {
                levels.push(vec![0; 1]);
                break;
            }
        }
        MaxTree { levels }
    }

    /// Number of leaves (at least the number asked for).
    pub(crate) fn len(&self) -> usize {
        self.levels.first().map_or(0, Vec::len)
    }

    /// Value of leaf `i` (0 outside the tree).
    pub(crate) fn get(&self, i: usize) -> u32 {
        self.levels
            .first()
            .and_then(|l| l.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// Largest leaf value.
    pub(crate) fn max(&self) -> u32 {
        self.levels
            .last()
            .and_then(|l| l.first())
            .copied()
            .unwrap_or(0)
    }

    /// Maximum of the `FANOUT` children of node `i` of the level above `level`.
    fn children_max(level: &[u32], i: usize) -> u32 {
        level
            .get(i * FANOUT..(i + 1) * FANOUT)
            .map_or(0, |c| c.iter().fold(0, |m, &v| m.max(v)))
    }

    /// Sets leaf `i` to `value` (ignored outside the tree); stops climbing as soon as an
    /// ancestor's maximum does not change. A rise only compares with the ancestors; a fall
    /// reads a node's children only where the old value was that node's maximum.
    pub(crate) fn set(&mut self, i: usize, value: u32) {
        let Some(leaf) = self.levels.first_mut().and_then(|l| l.get_mut(i)) else {
            return;
        };
        let old = *leaf;
        if old == value {
            return;
        }
        *leaf = value;
        let mut idx = i;
        for l in 1..self.levels.len() {
            idx /= FANOUT;
            if value > old {
                // The new maximum of every ancestor below `value` is `value`.
                match self.levels[l].get_mut(idx) {
                    Some(v) if *v < value => *v = value,
                    _ => break,
                }
            } else {
                // Each node on the way up held `old`; its parent changes only if `old` was
                // the parent's maximum and no other child holds it.
                if self.levels[l].get(idx) != Some(&old) {
                    break;
                }
                let m = Self::children_max(&self.levels[l - 1], idx);
                match self.levels[l].get_mut(idx) {
                    Some(v) if *v != m => *v = m,
                    _ => break,
                }
            }
        }
    }

    /// Index of the first leaf holding at least `need` (`need` ≥ 1).
    pub(crate) fn first_at_least(&self, need: u32) -> Option<usize> {
        if self.max() < need {
            return None;
        }
        let mut idx = 0;
        for level in self.levels.iter().rev().skip(1) {
            let children = level.get(idx * FANOUT..(idx + 1) * FANOUT)?;
            idx = idx * FANOUT + children.iter().position(|&v| v >= need)?;
        }
        Some(idx)
    }

    /// Checks that every inner node is the maximum of its children (0 for a padding node
    /// without children).
    pub(crate) fn check(&self) -> Result<(), String> {
        for l in 1..self.levels.len() {
            let (below, level) = (&self.levels[l - 1], &self.levels[l]);
            if level.len() * FANOUT < below.len() {
                return Err(format!(
                    "max tree level {l} has {} nodes for {} below",
                    level.len(),
                    below.len()
                ));
            }
            let bad = (0..level.len()).find(|&i| level[i] != Self::children_max(below, i));
            if let Some(i) = bad {
                return Err(format!(
                    "max tree node {i} of level {l} holds {} not the maximum of its children",
                    level[i]
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn first_at_least_matches_a_linear_scan() {
        let mut t = MaxTree::new(37);
        assert_eq!(t.len(), 48);
        let mut model = [0u32; 64];
        let mut seed = 12345u64;
        for _ in 0..2000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let i = (seed >> 33) as usize % 37;
            let v = (seed >> 20) as u32 % 50;
            t.set(i, v);
            model[i] = v;
            t.check().unwrap();
            for need in 1..52 {
                let want = model.iter().position(|&x| x >= need);
                assert_eq!(t.first_at_least(need), want, "need {need}");
            }
            assert_eq!(t.max(), *model.iter().max().unwrap());
            assert_eq!(t.get(i), v);
        }
        t.set(1000, 7);
        assert_eq!(t.get(1000), 0);
    }
}
