//! A fixed-size max segment tree over `u32` leaves: set a leaf, read the maximum, and find
//! the first leaf (in index order) holding at least a value, each in O(log n).
//!
//! The page-mapped strategy keeps one leaf per (page, edge) of a VA reservation, holding the
//! usable free bytes (in 256-byte units) next to that page's mapped edge, so "the lowest
//! address where a block fits without mapping a page" is one descent.

/// Max segment tree; leaf `i` lives at node `size + i`.
#[derive(Debug, Clone)]
pub(crate) struct MaxTree {
    /// Number of leaves rounded up to a power of two.
    size: usize,
    /// `nodes[1]` is the root; `nodes[n] = max(nodes[2n], nodes[2n + 1])`.
    nodes: Vec<u32>,
}

impl MaxTree {
    /// A tree of at least `leaves` leaves, all 0.
    pub(crate) fn new(leaves: usize) -> Self {
        let size = leaves.max(1).next_power_of_two();
        MaxTree {
            size,
            nodes: vec![0; 2 * size],
        }
    }

    /// Number of leaves (a power of two, at least the number asked for).
    pub(crate) fn len(&self) -> usize {
        self.size
    }

    /// Value of leaf `i` (0 outside the tree).
    pub(crate) fn get(&self, i: usize) -> u32 {
        self.nodes.get(self.size + i).copied().unwrap_or(0)
    }

    /// Largest leaf value.
    pub(crate) fn max(&self) -> u32 {
        self.nodes.get(1).copied().unwrap_or(0)
    }

    /// Sets leaf `i` to `value` (ignored outside the tree); stops climbing as soon as an
    /// ancestor's maximum does not change.
    pub(crate) fn set(&mut self, i: usize, value: u32) {
        if i >= self.size {
            return;
        }
        let mut n = self.size + i;
        if self.nodes[n] == value {
            return;
        }
        self.nodes[n] = value;
        while n > 1 {
            n /= 2;
            let m = self.nodes[2 * n].max(self.nodes[2 * n + 1]);
            if self.nodes[n] == m {
                break;
            }
            self.nodes[n] = m;
        }
    }

    /// Index of the first leaf holding at least `need` (`need` ≥ 1).
    pub(crate) fn first_at_least(&self, need: u32) -> Option<usize> {
        if self.max() < need {
            return None;
        }
        let mut n = 1;
        while n < self.size {
            n = if self.nodes[2 * n] >= need {
                2 * n
            } else {
                2 * n + 1
            };
        }
        Some(n - self.size)
    }

    /// Checks that every inner node is the maximum of its children.
    pub(crate) fn check(&self) -> Result<(), String> {
        let inner = self.nodes.get(1..self.size).unwrap_or(&[]);
        let children = self.nodes.get(2..).unwrap_or(&[]).chunks_exact(2);
        let bad = inner
            .iter()
            .zip(children)
            .position(|(&v, c)| v != c[0].max(c[1]));
        match bad {
            None => Ok(()),
            Some(i) => {
                let n = i + 1;
                let m = self.nodes[2 * n].max(self.nodes[2 * n + 1]);
                Err(format!("max tree node {n} holds {} not {m}", self.nodes[n]))
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn first_at_least_matches_a_linear_scan() {
        let mut t = MaxTree::new(37);
        assert_eq!(t.len(), 64);
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
