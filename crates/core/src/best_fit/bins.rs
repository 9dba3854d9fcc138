//! The size bins of [`BestFit`]: free ranges in `(size, offset)` order, a linked list per bin
//! (a B-tree once a bin holds many), the two-level bitmap of non-empty bins, the best-fit
//! search over them, and their check.

use super::*;

impl BestFit {
    /// Marks node `i` free and puts it in the bin of its size, in `(size, offset)` order.
    /// Byte counters are the caller's business.
    #[inline]
    pub(super) fn link(&mut self, i: NodeIndex) {
        self.n_mut(i).used = false;
        let key = self.key(i);
        let bin = Bins::floor(key.0);
        let b = self.bins[bin as usize];
        if b.tree || b.len as usize + 1 >= BIN_TO_TREE {
            self.link_tree(bin, i);
        } else {
            // The last range ordered before the new one, walking from the largest.
            let mut after = b.tail;
            while let Some(x) = after {
                if self.key(x) < key {
                    break;
                }
                after = self.n(x).prev_free;
            }
            let next = match after {
                Some(x) => self.n(x).next_free,
                None => b.head,
            };
            {
                let n = self.n_mut(i);
                n.prev_free = after;
                n.next_free = next;
            }
            match after {
                Some(x) => self.n_mut(x).next_free = Some(i),
                None => self.bins[bin as usize].head = Some(i),
            }
            match next {
                Some(y) => self.n_mut(y).prev_free = Some(i),
                None => self.bins[bin as usize].tail = Some(i),
            }
            self.bins[bin as usize].len += 1;
        }
        self.nonempty.set(bin);
    }

    /// [`Self::link`] into a B-tree bin, turning a full list bin into one first.
    #[cold]
    #[inline(never)]
    pub(super) fn link_tree(&mut self, bin: u32, i: NodeIndex) {
        let b = self.bins[bin as usize];
        if !b.tree {
            let mut tree = BTreeMap::new();
            let mut cur = b.head;
            while let Some(x) = cur {
                tree.insert(self.key(x), x);
                let n = self.n_mut(x);
                cur = n.next_free.take();
                n.prev_free = None;
            }
            self.trees.insert(bin, tree);
            self.bins[bin as usize] = Bin {
                head: None,
                tail: None,
                len: b.len,
                tree: true,
            };
        }
        let key = self.key(i);
        let n = self.n_mut(i);
        n.prev_free = None;
        n.next_free = None;
        self.trees.entry(bin).or_default().insert(key, i);
        self.bins[bin as usize].len += 1;
    }

    /// Takes free node `i` out of its bin, clearing the bitmap bits when the bin empties.
    ///
    /// # Errors
    /// [`AllocError::Internal`] if the node is not in the bin its size says (the arena is
    /// then unchanged).
    #[inline]
    pub(super) fn unlink(&mut self, i: NodeIndex) -> Result<(), AllocError> {
        let (size, offset, prev, next) = {
            let n = self.n(i);
            (n.size, n.offset, n.prev_free, n.next_free)
        };
        let bin = Bins::floor(size);
        let Some(&b) = self.bins.get(bin as usize) else {
            return Err(Self::internal(format!(
                "range of {size} B past the last bin"
            )));
        };
        if b.tree {
            self.unlink_tree(bin, (size, offset), i)?;
        } else {
            // A range with no predecessor must be the head, with no successor the tail.
            if (prev.is_none() && b.head != Some(i)) || (next.is_none() && b.tail != Some(i)) {
                return Err(Self::internal(format!(
                    "free range at {offset} of {size} B missing from bin {bin}"
                )));
            }
            match prev {
                Some(p) => self.n_mut(p).next_free = next,
                None => self.bins[bin as usize].head = next,
            }
            match next {
                Some(x) => self.n_mut(x).prev_free = prev,
                None => self.bins[bin as usize].tail = prev,
            }
            let n = self.n_mut(i);
            n.prev_free = None;
            n.next_free = None;
            self.bins[bin as usize].len -= 1;
        }
        if self.bins[bin as usize].len == 0 {
            self.nonempty.clear(bin);
        }
        Ok(())
    }

    /// [`Self::unlink`] from a B-tree bin, which goes back to a list at [`BIN_TO_VEC`].
    #[cold]
    #[inline(never)]
    pub(super) fn unlink_tree(
        &mut self,
        bin: u32,
        key: (u64, u64),
        i: NodeIndex,
    ) -> Result<(), AllocError> {
        let missing = || {
            Self::internal(format!(
                "free range at {} of {} B missing from the tree of bin {bin}",
                key.1, key.0
            ))
        };
        let tree = self.trees.get_mut(&bin).ok_or_else(missing)?;
        if tree.get(&key) != Some(&i) {
            return Err(missing());
        }
        tree.remove(&key);
        self.bins[bin as usize].len -= 1;
        if tree.len() <= BIN_TO_VEC {
            let tree = self.trees.remove(&bin).unwrap_or_default();
            let mut b = Bin::default();
            for (_, x) in tree {
                let n = self.n_mut(x);
                n.prev_free = b.tail;
                n.next_free = None;
                match b.tail {
                    Some(t) => self.n_mut(t).next_free = Some(x),
                    None => b.head = Some(x),
                }
                b.tail = Some(x);
                b.len += 1;
            }
            self.bins[bin as usize] = b;
        }
        Ok(())
    }

    /// The best fit for `size` bytes aligned to `align`: the node and aligned offset of the
    /// first free range in `(size, offset)` order that holds the block.
    #[inline]
    pub(super) fn find(&self, size: u64, align: u64) -> Option<(NodeIndex, u64)> {
        let mut bin = self.nonempty.next_nonempty(Bins::floor(size))?;
        loop {
            let b = &self.bins[bin as usize];
            if b.tree {
                if let Some(hit) = self.find_in_tree(bin, size, align) {
                    return Some(hit);
                }
            } else {
                let mut cur = b.head;
                while let Some(x) = cur {
                    let n = self.n(x);
                    // Only the request's own bin holds ranges smaller than the request.
                    if n.size >= size {
                        if let Some(a) = fit(n.offset, n.size, size, align) {
                            return Some((x, a));
                        }
                    }
                    cur = n.next_free;
                }
            }
            bin = self.nonempty.next_nonempty(bin + 1)?;
        }
    }

    /// [`Self::find`] in the B-tree of bin `bin`.
    #[cold]
    #[inline(never)]
    pub(super) fn find_in_tree(&self, bin: u32, size: u64, align: u64) -> Option<(NodeIndex, u64)> {
        self.trees
            .get(&bin)?
            .range((size, 0)..)
            .find_map(|(&(s, o), &x)| fit(o, s, size, align).map(|a| (x, a)))
    }

    /// Largest free range, in bytes: the last range of the highest non-empty bin.
    pub(super) fn largest_free(&self) -> u64 {
        let Some(bin) = self.nonempty.last() else {
            return 0;
        };
        match self.bins.get(bin as usize) {
            Some(Bin {
                tree: false,
                tail: Some(t),
                ..
            }) => self.n(*t).size,
            Some(Bin { tree: true, .. }) => self
                .trees
                .get(&bin)
                .and_then(|t| t.last_key_value())
                .map_or(0, |(&(s, _), _)| s),
            _ => 0,
        }
    }

    /// Checks the bins against the free nodes: lists linked both ways and sorted, trees
    /// keyed by their nodes, every range in the bin of its size, counts and bitmaps in step.
    /// `is_free[p]`: node slot `p` is a free range on the physical chain.
    pub(super) fn validate_bins(&self, is_free: &[bool]) -> Result<(), AllocError> {
        let err = Self::internal;
        let total = self.nodes.len();
        let mut listed = vec![false; total];
        let mut count = 0usize;
        let mut visit = |i: NodeIndex, bin: u32, key: (u64, u64)| {
            let p = idx_to_pos(i);
            if p >= total || !is_free[p] || listed[p] {
                return Err(err(format!(
                    "bin {bin} lists node {} twice, or one that is not a free range",
                    i.get()
                )));
            }
            listed[p] = true;
            count += 1;
            let n = &self.nodes[p];
            if (n.size, n.offset) != key || Bins::floor(n.size) != bin {
                return Err(err(format!(
                    "bin {bin} lists the range at {} of {} B under {key:?}",
                    n.offset, n.size
                )));
            }
            Ok(())
        };
        for (bin, b) in (0u32..).zip(self.bins.iter()) {
            let bit = self.nonempty.is_set(bin);
            if bit != (b.len > 0) {
                return Err(err(format!(
                    "bitmap bit of bin {bin} disagrees with its {} ranges",
                    b.len
                )));
            }
            let mut seen = 0u32;
            let mut prev_key: Option<(u64, u64)> = None;
            if b.tree {
                let tree = self
                    .trees
                    .get(&bin)
                    .ok_or_else(|| err(format!("bin {bin} has no tree")))?;
                if tree.len() <= BIN_TO_VEC || b.head.is_some() || b.tail.is_some() {
                    return Err(err(format!(
                        "tree bin {bin}: {} ranges, list ends {:?} {:?}",
                        tree.len(),
                        b.head,
                        b.tail
                    )));
                }
                for (&key, &i) in tree {
                    visit(i, bin, key)?;
                    let n = self.n(i);
                    if n.prev_free.is_some() || n.next_free.is_some() {
                        return Err(err(format!("tree range at {} has list links", n.offset)));
                    }
                    seen += 1;
                }
            } else {
                if b.len as usize >= BIN_TO_TREE || self.trees.contains_key(&bin) {
                    return Err(err(format!("list bin {bin} holds {} ranges", b.len)));
                }
                let mut prev: Option<NodeIndex> = None;
                let mut cur = b.head;
                while let Some(i) = cur {
                    if seen >= b.len {
                        return Err(err(format!("list of bin {bin} longer than {}", b.len)));
                    }
                    let p = idx_to_pos(i);
                    let n = self
                        .nodes
                        .get(p)
                        .ok_or_else(|| err(format!("bad node {p}")))?;
                    let key = (n.size, n.offset);
                    visit(i, bin, key)?;
                    if n.prev_free != prev {
                        return Err(err(format!("list links of the range at {}", n.offset)));
                    }
                    if prev_key.is_some_and(|k| k >= key) {
                        return Err(err(format!("bin {bin} not sorted by (size, offset)")));
                    }
                    prev_key = Some(key);
                    prev = Some(i);
                    seen += 1;
                    cur = n.next_free;
                }
                if b.tail != prev {
                    return Err(err(format!("tail of bin {bin} is not its last range")));
                }
            }
            if seen != b.len {
                return Err(err(format!(
                    "bin {bin} counts {} ranges, holds {seen}",
                    b.len
                )));
            }
        }
        let free = is_free.iter().filter(|&&f| f).count();
        if count != free {
            return Err(err(format!("{free} free ranges but {count} in the bins")));
        }
        if self
            .trees
            .keys()
            .any(|&bin| self.bins.get(bin as usize).is_none_or(|b| !b.tree))
        {
            return Err(err("a tree of a list bin".into()));
        }
        if let Some(fl) = self.nonempty.first_level_disagreement() {
            return Err(err(format!("first-level bit {fl} disagrees")));
        }
        let bins = self.bins.len() as u32;
        if self.nonempty.next_nonempty(bins).is_some() {
            return Err(err(format!("bitmap bits beyond the last bin {bins}")));
        }
        Ok(())
    }
}
