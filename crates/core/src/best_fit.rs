//! Address-ordered best fit with splitting and coalescing, the family of TensorFlow's BFC
//! ("best-fit with coalescing") allocator and of PyTorch's block pools.
//!
//! Policy: a request of `n` bytes aligned to `a` takes, among the free ranges that hold `n`
//! bytes at an `a`-aligned offset, the first in `(size, offset)` order: the smallest range
//! that fits, ties to the lowest address. The block takes exactly the bytes asked for; the
//! front padding (when the range's start is not aligned) and the tail stay free.
//!
//! Structure, a segregated fit that keeps the exact best-fit order:
//! - Every range, free or used, is a node that knows its physical neighbours, so a free finds
//!   the ranges to merge with without a search; live blocks are found by offset in an Fx hash
//!   map. Nodes live in a `Vec` and refer to each other by [`NonZeroU32`] indices.
//! - Free ranges sit in size bins, the log-linear classes of [`crate::size_class`] with 16
//!   bins per power of two, so a bin's ranges are within 1/16 of each other in size. A bin is
//!   a doubly linked list through the nodes, sorted by `(size, offset)`; a bin that comes to
//!   hold 32 ranges (many same-size holes) becomes a B-tree by `(size, offset)` until it
//!   shrinks to 8. A 64-bit first-level bitmap and one 16-bit second-level bitmap per first
//!   level say which bins are non-empty.
//! - The best fit walks the request's own bin from its smallest range to the first that
//!   holds the block, then takes the front of the next non-empty bins (a `trailing_zeros`
//!   each): every range of a higher bin is larger than any of a lower one.
//!
//! Costs: once warm, no heap allocation per operation (node slots are recycled). Allocate
//! and free are a hash operation, a bitmap look-up, O(1) unlinks and a sorted insertion that
//! walks at most 31 ranges of a list bin, or O(log n) in a B-tree bin. The largest free
//! range is O(1): the last range of the highest non-empty bin. An aligned request walks the
//! ranges in best-fit order until one holds the aligned block, as an exact best fit must; a
//! 256-byte-aligned request over ranges that all start 256-byte aligned (the segmented
//! pool's case) takes the first.
//!
//! Alignment: any power of two; unaligned front padding is split off as a free range.
use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;

use rustc_hash::FxHashMap;

use crate::align::{align_up, is_pow2};
use crate::arena::{Arena, ArenaReport};
use crate::error::AllocError;
use crate::size_class::{BinBitmap, LogLinear};

/// Largest alignment the best-fit arena accepts, in bytes (any power of two).
pub const BEST_FIT_MAX_ALIGN: u64 = 1 << 63;

/// The size bins of the free ranges: 16 per power of two.
type Bins = LogLinear<4>;

/// Ranges at which a bin's sorted list becomes a B-tree. A sorted insertion walks the list,
/// which grows with the bin (10,000 same-size holes in one bin made an allocate/free pair
/// 50 times slower in a sorted `Vec` than in a B-tree); at 32 ranges the walk costs about
/// what the B-tree's search costs (measured on this 2-core machine, 2026-11-30).
const BIN_TO_TREE: usize = 32;
/// Ranges at which a B-tree bin goes back to a list (well below [`BIN_TO_TREE`], so that a
/// bin does not switch back and forth).
const BIN_TO_VEC: usize = 8;

/// Index of a node: its position in `nodes` plus one.
type NodeIndex = NonZeroU32;

/// Largest number of nodes (the index is a `u32` counted from 1).
const MAX_NODES: usize = (u32::MAX - 1) as usize;

fn idx_to_pos(i: NodeIndex) -> usize {
    // u32 -> usize is lossless on every platform Rust targets with 32+ bit pointers.
    (i.get() - 1) as usize
}

/// A range of the arena, free or used.
#[derive(Debug, Clone)]
struct Node {
    /// First byte of the range.
    offset: u64,
    /// Bytes in the range (0 for a spare node slot).
    size: u64,
    prev_phys: Option<NodeIndex>,
    next_phys: Option<NodeIndex>,
    /// Neighbours in a list bin's `(size, offset)` order (`None` when used or in a B-tree
    /// bin).
    prev_free: Option<NodeIndex>,
    next_free: Option<NodeIndex>,
    used: bool,
}

/// The `align`-aligned offset at which the range `[offset, offset + range)` holds `size`
/// bytes, if it does.
#[inline]
fn fit(offset: u64, range: u64, size: u64, align: u64) -> Option<u64> {
    let a = align_up(offset, align)?;
    let pad = a - offset;
    (pad <= range && range - pad >= size).then_some(a)
}

/// One size bin: a list through the nodes, or (`tree`) a B-tree in `BestFit::trees`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Bin {
    /// Smallest `(size, offset)` of a list bin.
    head: Option<NodeIndex>,
    /// Largest `(size, offset)` of a list bin.
    tail: Option<NodeIndex>,
    /// Free ranges in the bin.
    len: u32,
    /// The ranges are in the bin's B-tree, not on the list.
    tree: bool,
}

/// The best-fit arena over `[0, capacity_bytes)`, byte-granular.
///
/// ```
/// use gpumem_core::{best_fit::BestFit, Arena};
/// let mut a = BestFit::new(1000);
/// let (x, _) = a.allocate(100, 1).unwrap();
/// let (y, _) = a.allocate(100, 1).unwrap();
/// let (_z, _) = a.allocate(50, 1).unwrap();
/// a.deallocate(x).unwrap(); // 100 free at 0, 750 free at 250
/// assert_eq!(a.allocate(80, 1).unwrap().0, 0, "best fit takes the smaller hole");
/// # let _ = y;
/// ```
#[derive(Clone)]
pub struct BestFit {
    capacity: u64,
    /// Every range, free or used, plus spare slots (size 0).
    nodes: Vec<Node>,
    /// Spare node slots, reused before `nodes` grows.
    spare: Vec<NodeIndex>,
    /// One bin per size class up to the capacity's (no range belongs to a higher one).
    bins: Box<[Bin]>,
    /// The B-trees of the bins that hold many ranges: bin -> `(size, offset)` -> node.
    trees: BTreeMap<u32, BTreeMap<(u64, u64), NodeIndex>>,
    /// Which bins are non-empty.
    nonempty: BinBitmap,
    /// Live blocks: offset -> node.
    used: FxHashMap<u64, NodeIndex>,
    free_bytes: u64,
}

impl fmt::Debug for BestFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BestFit")
            .field("capacity_bytes", &self.capacity)
            .field("free_bytes", &self.free_bytes)
            .field("largest_free_bytes", &self.largest_free())
            .field(
                "free_ranges",
                &self.bins.iter().map(|b| u64::from(b.len)).sum::<u64>(),
            )
            .field("tree_bins", &self.trees.len())
            .field("allocations", &self.used.len())
            .finish()
    }
}

impl BestFit {
    /// An arena over `[0, capacity_bytes)`, all free.
    pub fn new(capacity_bytes: u64) -> Self {
        // A free range is never larger than the capacity, so never in a higher bin.
        let bins = if capacity_bytes > 0 {
            Bins::floor(capacity_bytes) as usize + 1
        } else {
            0
        };
        let mut a = BestFit {
            capacity: capacity_bytes,
            nodes: Vec::new(),
            spare: Vec::new(),
            bins: vec![Bin::default(); bins].into_boxed_slice(),
            trees: BTreeMap::new(),
            nonempty: BinBitmap::default(),
            used: FxHashMap::default(),
            free_bytes: 0,
        };
        if capacity_bytes > 0 {
            a.nodes.push(Node {
                offset: 0,
                size: capacity_bytes,
                prev_phys: None,
                next_phys: None,
                prev_free: None,
                next_free: None,
                used: false,
            });
            a.link(NodeIndex::MIN);
            a.free_bytes = capacity_bytes;
        }
        a
    }

    /// Free ranges as `(offset, bytes)`, in address order (for reports and tests; sorts a
    /// copy, O(n log n)).
    pub fn free_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut v: Vec<(u64, u64)> = self
            .nodes
            .iter()
            .filter(|n| !n.used && n.size > 0)
            .map(|n| (n.offset, n.size))
            .collect();
        v.sort_unstable();
        v.into_iter()
    }

    #[inline]
    fn n(&self, i: NodeIndex) -> &Node {
        &self.nodes[idx_to_pos(i)]
    }

    #[inline]
    fn n_mut(&mut self, i: NodeIndex) -> &mut Node {
        &mut self.nodes[idx_to_pos(i)]
    }

    /// The sort key of node `i` in its bin.
    #[inline]
    fn key(&self, i: NodeIndex) -> (u64, u64) {
        let n = self.n(i);
        (n.size, n.offset)
    }

    /// Node slots that can still be handed out without failing.
    fn nodes_available(&self) -> usize {
        self.spare.len() + MAX_NODES.saturating_sub(self.nodes.len())
    }

    /// A node slot holding `node`. Callers check [`Self::nodes_available`] first.
    fn new_node(&mut self, node: Node) -> NodeIndex {
        if let Some(i) = self.spare.pop() {
            *self.n_mut(i) = node;
            i
        } else {
            self.nodes.push(node);
            // nodes.len() ≤ MAX_NODES < u32::MAX, checked by the caller; fall back to the
            // first slot only if that check was skipped (validate() would then report it).
            u32::try_from(self.nodes.len())
                .ok()
                .and_then(NodeIndex::new)
                .unwrap_or(NodeIndex::MIN)
        }
    }

    fn release_node(&mut self, i: NodeIndex) {
        *self.n_mut(i) = Node {
            offset: 0,
            size: 0,
            prev_phys: None,
            next_phys: None,
            prev_free: None,
            next_free: None,
            used: false,
        };
        self.spare.push(i);
    }

    /// Marks node `i` free and puts it in the bin of its size, in `(size, offset)` order.
    /// Byte counters are the caller's business.
    #[inline]
    fn link(&mut self, i: NodeIndex) {
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
    fn link_tree(&mut self, bin: u32, i: NodeIndex) {
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
    fn unlink(&mut self, i: NodeIndex) -> Result<(), AllocError> {
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
    fn unlink_tree(&mut self, bin: u32, key: (u64, u64), i: NodeIndex) -> Result<(), AllocError> {
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
    fn find(&self, size: u64, align: u64) -> Option<(NodeIndex, u64)> {
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
    fn find_in_tree(&self, bin: u32, size: u64, align: u64) -> Option<(NodeIndex, u64)> {
        self.trees
            .get(&bin)?
            .range((size, 0)..)
            .find_map(|(&(s, o), &x)| fit(o, s, size, align).map(|a| (x, a)))
    }

    /// Largest free range, in bytes: the last range of the highest non-empty bin.
    fn largest_free(&self) -> u64 {
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

    fn oom(&self, size: u64) -> AllocError {
        AllocError::OutOfMemory {
            requested_bytes: size,
            free_bytes: self.free_bytes,
            largest_free_bytes: self.largest_free(),
        }
    }

    fn internal(msg: String) -> AllocError {
        AllocError::Internal(format!("best-fit: {msg}"))
    }

    /// Checks the bins against the free nodes: lists linked both ways and sorted, trees
    /// keyed by their nodes, every range in the bin of its size, counts and bitmaps in step.
    /// `is_free[p]`: node slot `p` is a free range on the physical chain.
    fn validate_bins(&self, is_free: &[bool]) -> Result<(), AllocError> {
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

impl Arena for BestFit {
    fn name(&self) -> &'static str {
        "best-fit"
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn max_align(&self) -> u64 {
        BEST_FIT_MAX_ALIGN
    }

    /// Allocates `size_bytes` (0 takes one byte) in the smallest free range that holds it
    /// aligned; the block takes exactly the bytes asked for.
    fn allocate(&mut self, size_bytes: u64, align: u64) -> Result<(u64, u64), AllocError> {
        if !is_pow2(align) {
            return Err(AllocError::InvalidAlignment {
                align,
                max: BEST_FIT_MAX_ALIGN,
            });
        }
        let size = size_bytes.max(1);
        // A split needs up to two new nodes (front padding, tail).
        if size > self.free_bytes || self.nodes_available() < 2 {
            return Err(self.oom(size_bytes));
        }
        let (i, aligned) = self.find(size, align).ok_or_else(|| self.oom(size_bytes))?;
        self.unlink(i)?;
        let (offset, range_size, next) = {
            let n = self.n(i);
            (n.offset, n.size, n.next_phys)
        };
        // find() checked that the padding and the block fit inside the range.
        let pad = aligned - offset;
        let rest = range_size - pad - size;
        // Physical order afterwards: [front padding], block, [tail], next. The range's node
        // becomes the padding if there is one, else the block.
        let block = if pad == 0 {
            let n = self.n_mut(i);
            n.size = size;
            n.used = true;
            i
        } else {
            let u = self.new_node(Node {
                offset: aligned,
                size,
                prev_phys: Some(i),
                next_phys: next,
                prev_free: None,
                next_free: None,
                used: true,
            });
            if let Some(x) = next {
                self.n_mut(x).prev_phys = Some(u);
            }
            let n = self.n_mut(i);
            n.size = pad;
            n.next_phys = Some(u);
            self.link(i);
            u
        };
        if rest > 0 {
            let t = self.new_node(Node {
                offset: aligned + size,
                size: rest,
                prev_phys: Some(block),
                next_phys: next,
                prev_free: None,
                next_free: None,
                used: false,
            });
            if let Some(x) = next {
                self.n_mut(x).prev_phys = Some(t);
            }
            self.n_mut(block).next_phys = Some(t);
            self.link(t);
        }
        self.free_bytes -= size;
        self.used.insert(aligned, block);
        Ok((aligned, size))
    }

    fn deallocate(&mut self, offset: u64) -> Result<u64, AllocError> {
        let Some(i) = self.used.remove(&offset) else {
            return Err(AllocError::UnknownBlock { addr: offset });
        };
        let (size, prev, next) = {
            let n = self.n(i);
            (n.size, n.prev_phys, n.next_phys)
        };
        let prev_free = prev.filter(|&p| !self.n(p).used);
        let next_free = next.filter(|&x| !self.n(x).used);
        // Take the free neighbours out of their bins before touching anything else, so that
        // a broken invariant leaves the arena as it was.
        if let Some(x) = next_free {
            if let Err(e) = self.unlink(x) {
                self.used.insert(offset, i);
                return Err(e);
            }
        }
        if let Some(p) = prev_free {
            if let Err(e) = self.unlink(p) {
                if let Some(x) = next_free {
                    self.link(x);
                }
                self.used.insert(offset, i);
                return Err(e);
            }
        }
        // The successor merges into the block, the block into its predecessor.
        if let Some(x) = next_free {
            let (xsize, xnext) = {
                let xn = self.n(x);
                (xn.size, xn.next_phys)
            };
            {
                let n = self.n_mut(i);
                n.size += xsize;
                n.next_phys = xnext;
            }
            if let Some(nn) = xnext {
                self.n_mut(nn).prev_phys = Some(i);
            }
            self.release_node(x);
        }
        let merged = match prev_free {
            Some(p) => {
                let (isize, inext) = {
                    let n = self.n(i);
                    (n.size, n.next_phys)
                };
                {
                    let pn = self.n_mut(p);
                    pn.size += isize;
                    pn.next_phys = inext;
                }
                if let Some(nn) = inext {
                    self.n_mut(nn).prev_phys = Some(p);
                }
                self.release_node(i);
                p
            }
            None => i,
        };
        self.link(merged);
        self.free_bytes += size;
        Ok(size)
    }

    /// O(1): counters, and the last range of the highest non-empty bin.
    fn report(&self) -> ArenaReport {
        ArenaReport {
            free_bytes: self.free_bytes,
            largest_free_bytes: self.largest_free(),
            allocations: self.used.len() as u64,
        }
    }

    fn validate(&self) -> Result<(), AllocError> {
        let err = Self::internal;
        let total = self.nodes.len();
        // Spare slots.
        let mut is_spare = vec![false; total];
        for &i in &self.spare {
            let p = idx_to_pos(i);
            if p >= total || is_spare[p] {
                return Err(err(format!(
                    "spare slot {} listed twice or out of range",
                    i.get()
                )));
            }
            if self.nodes[p].size != 0 {
                return Err(err(format!("spare slot {} holds a range", i.get())));
            }
            is_spare[p] = true;
        }
        let live = total - self.spare.len();
        // Physical chain from the range at offset 0.
        let first = (0..total).find(|&p| !is_spare[p] && self.nodes[p].prev_phys.is_none());
        let mut is_free = vec![false; total];
        let mut visited = 0usize;
        let mut free_sum = 0u64;
        let mut used_nodes = 0usize;
        let mut expect_offset = 0u64;
        let mut prev: Option<NodeIndex> = None;
        let mut prev_free = false;
        let mut cur = first.and_then(|p| u32::try_from(p + 1).ok().and_then(NodeIndex::new));
        while let Some(i) = cur {
            let p = idx_to_pos(i);
            if p >= total || is_spare[p] || visited >= live {
                return Err(err(format!(
                    "physical chain reaches a bad node {}",
                    i.get()
                )));
            }
            visited += 1;
            let n = &self.nodes[p];
            if n.offset != expect_offset {
                return Err(err(format!(
                    "range at {} should start at {expect_offset}",
                    n.offset
                )));
            }
            if n.size == 0 {
                return Err(err(format!("empty range at {}", n.offset)));
            }
            if n.prev_phys != prev {
                return Err(err(format!("prev link of range at {} is wrong", n.offset)));
            }
            if n.used {
                used_nodes += 1;
                if self.used.get(&n.offset) != Some(&i) {
                    return Err(err(format!(
                        "used range at {} missing from the offset map",
                        n.offset
                    )));
                }
                if n.prev_free.is_some() || n.next_free.is_some() {
                    return Err(err(format!("used range at {} on a bin list", n.offset)));
                }
                prev_free = false;
            } else {
                if prev_free {
                    return Err(err(format!(
                        "free range at {} not merged with the one before",
                        n.offset
                    )));
                }
                is_free[p] = true;
                free_sum += n.size;
                prev_free = true;
            }
            expect_offset = n
                .offset
                .checked_add(n.size)
                .ok_or_else(|| err(format!("range at {} overflows", n.offset)))?;
            prev = Some(i);
            cur = n.next_phys;
        }
        if visited != live {
            return Err(err(format!(
                "{live} live nodes but {visited} on the physical chain"
            )));
        }
        if expect_offset != self.capacity {
            return Err(err(format!(
                "ranges cover {expect_offset} of {} B",
                self.capacity
            )));
        }
        if used_nodes != self.used.len() {
            return Err(err(format!(
                "{used_nodes} used ranges but {} in the offset map",
                self.used.len()
            )));
        }
        if free_sum != self.free_bytes {
            return Err(err(format!(
                "free ranges hold {free_sum} B, counter says {}",
                self.free_bytes
            )));
        }
        self.validate_bins(&is_free)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The policy written as plainly as possible: free ranges in a `Vec` by address, the
    /// best fit by a scan for the least `(size, offset)` that holds the aligned block.
    #[derive(Debug)]
    struct Reference {
        /// Free ranges `(offset, bytes)`, in address order.
        free: Vec<(u64, u64)>,
        /// Live blocks: offset -> bytes.
        used: BTreeMap<u64, u64>,
    }

    impl Reference {
        fn new(capacity: u64) -> Self {
            let free = if capacity > 0 {
                vec![(0, capacity)]
            } else {
                vec![]
            };
            Reference {
                free,
                used: BTreeMap::new(),
            }
        }

        fn report(&self) -> ArenaReport {
            ArenaReport {
                free_bytes: self.free.iter().map(|r| r.1).sum(),
                largest_free_bytes: self.free.iter().map(|r| r.1).max().unwrap_or(0),
                allocations: self.used.len() as u64,
            }
        }

        fn allocate(&mut self, size_bytes: u64, align: u64) -> Result<(u64, u64), AllocError> {
            let size = size_bytes.max(1);
            let best = (0..self.free.len())
                .filter_map(|k| {
                    let (o, s) = self.free[k];
                    let a = align_up(o, align)?;
                    (a - o <= s && s - (a - o) >= size).then_some((s, o, k, a))
                })
                .min();
            let Some((s, o, k, a)) = best else {
                let r = self.report();
                return Err(AllocError::OutOfMemory {
                    requested_bytes: size_bytes,
                    free_bytes: r.free_bytes,
                    largest_free_bytes: r.largest_free_bytes,
                });
            };
            let mut pieces = Vec::new();
            if a > o {
                pieces.push((o, a - o));
            }
            if a + size < o + s {
                pieces.push((a + size, o + s - a - size));
            }
            self.free.splice(k..=k, pieces);
            self.used.insert(a, size);
            Ok((a, size))
        }

        fn deallocate(&mut self, offset: u64) -> Result<u64, AllocError> {
            let size = self
                .used
                .remove(&offset)
                .ok_or(AllocError::UnknownBlock { addr: offset })?;
            let k = self.free.partition_point(|r| r.0 < offset);
            self.free.insert(k, (offset, size));
            if k + 1 < self.free.len() && offset + size == self.free[k + 1].0 {
                self.free[k].1 += self.free.remove(k + 1).1;
            }
            if k > 0 && self.free[k - 1].0 + self.free[k - 1].1 == offset {
                self.free[k - 1].1 += self.free.remove(k).1;
            }
            Ok(size)
        }
    }

    #[derive(Debug, Clone)]
    enum RefOp {
        Alloc { size: u64, align_shift: u32 },
        Free { pick: usize },
        FreeUnknown { offset: u64 },
    }

    /// Sizes that make ties and bin edges common: multiples of 256 B up to 16 KiB, small odd
    /// sizes, powers of two and their neighbours, and anything up to the capacity.
    fn ref_op(capacity: u64) -> impl Strategy<Value = RefOp> {
        let size = prop_oneof![
            4 => (0u64..=64).prop_map(|k| k * 256),
            2 => 0u64..=600,
            2 => (4u32..20, -1i64..=1).prop_map(|(e, d)| ((1i64 << e) + d) as u64),
            1 => 0u64..=capacity,
        ];
        prop_oneof![
            6 => (size, prop_oneof![3 => Just(0u32), 1 => 0u32..=12])
                .prop_map(|(size, align_shift)| RefOp::Alloc { size, align_shift }),
            5 => any::<usize>().prop_map(|pick| RefOp::Free { pick }),
            1 => (0u64..capacity).prop_map(|offset| RefOp::FreeUnknown { offset }),
        ]
    }

    /// Runs `ops` on a best-fit arena and on the reference side by side, checking after every
    /// operation that they agree and that the arena validates.
    fn same_as_reference(
        a: &mut BestFit,
        r: &mut Reference,
        ops: Vec<RefOp>,
    ) -> Result<(), TestCaseError> {
        for op in ops {
            match op {
                RefOp::Alloc { size, align_shift } => {
                    let align = 1u64 << align_shift;
                    prop_assert_eq!(a.allocate(size, align), r.allocate(size, align));
                }
                RefOp::Free { pick } => {
                    if r.used.is_empty() {
                        continue;
                    }
                    let offset = *r.used.keys().nth(pick % r.used.len()).unwrap();
                    prop_assert_eq!(a.deallocate(offset), r.deallocate(offset));
                }
                RefOp::FreeUnknown { offset } => {
                    prop_assert_eq!(a.deallocate(offset), r.deallocate(offset));
                }
            }
            a.validate().unwrap();
            prop_assert_eq!(a.report(), r.report());
            prop_assert_eq!(a.free_ranges().collect::<Vec<_>>(), r.free.clone());
        }
        Ok(())
    }

    /// Both sides with `holes` free ranges of `hole` bytes between live blocks of `pin`
    /// bytes (as many as fit).
    fn fragmented(capacity: u64, holes: usize, hole: u64, pin: u64) -> (BestFit, Reference) {
        let mut a = BestFit::new(capacity);
        let mut r = Reference::new(capacity);
        let mut freed = Vec::new();
        for _ in 0..holes {
            let h = a.allocate(hole, 1);
            assert_eq!(h, r.allocate(hole, 1));
            assert_eq!(a.allocate(pin, 1), r.allocate(pin, 1));
            freed.extend(h.ok().map(|(o, _)| o));
        }
        for o in freed {
            assert_eq!(a.deallocate(o), r.deallocate(o));
        }
        a.validate().unwrap();
        (a, r)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every choice, error, free range and report figure equals the plain reference's,
        /// and the arena validates, after every operation.
        #[test]
        fn same_choices_as_a_plain_scan(
            capacity in prop_oneof![Just(1u64 << 16), 1u64..=100_000, Just(1u64 << 20)],
            ops in proptest::collection::vec(ref_op(1 << 16), 1..400),
        ) {
            let mut a = BestFit::new(capacity);
            let mut r = Reference::new(capacity);
            same_as_reference(&mut a, &mut r, ops)?;
        }

        /// The same with up to 400 same-size holes first: bins that turn into B-trees and
        /// back, holes that only fit unaligned.
        #[test]
        fn same_choices_with_crowded_bins(
            holes in 0usize..400,
            hole in prop_oneof![Just(256u64), 250u64..=270, 1u64..=600],
            pin in 1u64..=300,
            ops in proptest::collection::vec(ref_op(1 << 16), 1..300),
        ) {
            let (mut a, mut r) = fragmented(1 << 20, holes, hole, pin);
            same_as_reference(&mut a, &mut r, ops)?;
        }
    }

    #[test]
    fn aligned_request_skips_a_hole_that_only_fits_unaligned() {
        let mut a = BestFit::new(1 << 20);
        let (_p, _) = a.allocate(5, 1).unwrap(); // [0, 5)
        let (x, _) = a.allocate(10, 1).unwrap(); // [5, 15)
        let (_y, _) = a.allocate(300, 1).unwrap(); // [15, 315)
        let (_z, _) = a.allocate(1000, 1).unwrap(); // [315, 1315)
        a.deallocate(x).unwrap(); // hole [5, 15): big enough, but not at a 1024 boundary
        let (w, s) = a.allocate(8, 1024).unwrap();
        assert_eq!((w, s), (2048, 8));
        a.validate().unwrap();
        assert_eq!(
            a.free_ranges().collect::<Vec<_>>(),
            vec![(5, 10), (1315, 733), (2056, (1 << 20) - 2056)]
        );
    }

    #[test]
    fn ties_go_to_the_lowest_address_within_a_bin_and_across_bins() {
        // Holes of 300 B at 1000 and at 0, of 290 B (same bin) at 2000, 4096 B at 3000.
        let mut a = BestFit::new(1 << 20);
        let mut at = Vec::new();
        for size in [300, 700, 300, 700, 290, 710, 4096, 100] {
            at.push(a.allocate(size, 1).unwrap().0);
        }
        for k in [4, 2, 0, 6] {
            a.deallocate(at[k]).unwrap();
        }
        a.validate().unwrap();
        assert_eq!(
            a.allocate(295, 1).unwrap().0,
            at[0],
            "300 B at the lower address"
        );
        assert_eq!(a.allocate(295, 1).unwrap().0, at[2], "the other 300 B hole");
        assert_eq!(
            a.allocate(1, 1).unwrap().0,
            at[0] + 295,
            "5 B left of the first hole"
        );
        assert_eq!(
            a.allocate(280, 1).unwrap().0,
            at[4],
            "290 B, smaller than 4096"
        );
        assert_eq!(a.allocate(1000, 1).unwrap().0, at[6], "next bin up");
        a.validate().unwrap();
    }

    #[test]
    fn largest_free_and_node_slots_are_recycled() {
        let mut a = BestFit::new(1 << 20);
        for _ in 0..100 {
            let (x, _) = a.allocate(100, 64).unwrap();
            let (y, _) = a.allocate(300, 1).unwrap();
            a.deallocate(x).unwrap();
            a.deallocate(y).unwrap();
        }
        assert!(a.nodes.len() <= 4, "{} node slots", a.nodes.len());
        assert_eq!(a.report().largest_free_bytes, 1 << 20);
        a.validate().unwrap();
        assert_eq!(a.allocate(1 << 20, 1).unwrap(), (0, 1 << 20));
        assert_eq!(a.report().largest_free_bytes, 0);
    }
}
