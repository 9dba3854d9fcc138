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

mod bins;

/// Largest alignment the best-fit arena accepts, in bytes (any power of two).
pub const BEST_FIT_MAX_ALIGN: u64 = 1 << 63;

/// The size bins of the free ranges: 16 per power of two.
type Bins = LogLinear<4>;

/// Ranges at which a bin's sorted list becomes a B-tree. A sorted insertion walks the list,
/// which grows with the bin (many same-size holes in one bin make a sorted `Vec` far slower
/// than a B-tree); 32 is about where the walk costs what the B-tree's search costs
/// (`docs/decisions.md`, "best-fit in log-linear bins").
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
mod tests;
