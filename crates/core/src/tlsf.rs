//! Two-level segregated fit (TLSF) over byte offsets.
//!
//! Follows Masmano, Ripoll, Crespo and Real, "TLSF: a New Dynamic Memory Allocator for
//! Real-Time Systems" (ECRTS 2004), in the shape of the offset-allocator crate: free blocks
//! sit in doubly linked lists, one per size class ([`crate::size_class`]); a 64-bit
//! first-level bitmap and one 16-bit second-level bitmap per first level say which lists
//! are non-empty, so finding a block is a couple of `trailing_zeros`. Every block (free or
//! used) knows its physical neighbours, so a free coalesces in O(1). Nodes live in a `Vec`
//! and refer to each other by [`NonZeroU32`] indices, so `Option<index>` costs nothing.
//! Freeing looks the block up by offset in an Fx hash map.
//!
//! Search policy ("good fit"): a request of `n` bytes aligned to `a` first looks in the
//! size classes where every block holds `n + a - 1` bytes (O(1), any block there fits).
//! Only when that finds nothing does it scan the few classes below, block by block, for one
//! that happens to fit; so an allocation fails only when no free block can hold it.
//!
//! Splitting keeps the free node where it is as the remainder, and a free grows its free
//! neighbour over the block; so when the remainder stays in the same size class (the common
//! case for a small block cut from a large range) no free list is touched at all.
//!
//! Alignment: any power of two. When the chosen block's offset is not aligned, the front
//! padding is split off as a free block of its own.
use std::num::NonZeroU32;

use rustc_hash::FxHashMap;

use crate::align::{align_up, is_pow2};
use crate::arena::{Arena, ArenaReport};
use crate::error::AllocError;
use crate::size_class::{bin_ceil, bin_floor, BinBitmap, BIN_COUNT};

/// Index of a node: its position in `nodes` plus one.
type NodeIndex = NonZeroU32;

/// Largest number of nodes (the index is a `u32` counted from 1).
const MAX_NODES: usize = (u32::MAX - 1) as usize;

/// Slots of the bin-head table: `BIN_COUNT` rounded up to a power of two, so that a masked
/// index needs no bounds check. Slots from `BIN_COUNT` on stay empty.
const HEAD_SLOTS: usize = 1024;
const _: () = assert!(BIN_COUNT as usize <= HEAD_SLOTS);

/// Index of `bin` in the head table (the mask is a no-op for every valid bin).
#[inline]
fn slot(bin: u32) -> usize {
    bin as usize & (HEAD_SLOTS - 1)
}

/// Largest alignment the TLSF arena accepts, in bytes (any power of two).
pub const TLSF_MAX_ALIGN: u64 = 1 << 63;

#[derive(Debug, Clone)]
struct Node {
    /// First byte of the block.
    offset: u64,
    /// Bytes in the block.
    size: u64,
    prev_phys: Option<NodeIndex>,
    next_phys: Option<NodeIndex>,
    /// Free-list links (for a spare node slot, `next_free` chains the spare slots).
    prev_free: Option<NodeIndex>,
    next_free: Option<NodeIndex>,
    /// Bin of a free block (`bin_floor(size)`, set when it joins a free list).
    bin: u32,
    used: bool,
}

/// The TLSF arena over `[0, capacity_bytes)`, byte-granular.
///
/// ```
/// use gpumem_core::{tlsf::Tlsf, Arena};
/// let mut t = Tlsf::new(1 << 20);
/// let (a, _) = t.allocate(1000, 256).unwrap();
/// let (b, _) = t.allocate(4096, 4096).unwrap();
/// assert_eq!(a % 256, 0);
/// assert_eq!(b % 4096, 0);
/// t.deallocate(a).unwrap();
/// t.deallocate(b).unwrap();
/// assert_eq!(t.allocate(1 << 20, 1).unwrap(), (0, 1 << 20));
/// ```
#[derive(Debug, Clone)]
pub struct Tlsf {
    capacity: u64,
    nodes: Vec<Node>,
    /// Head of the chain of spare node slots.
    spare: Option<NodeIndex>,
    spare_count: usize,
    /// Head of each bin's free list.
    heads: Box<[Option<NodeIndex>; HEAD_SLOTS]>,
    /// Which bins' free lists are non-empty (the two-level bitmap of TLSF).
    bins: BinBitmap,
    /// Live allocations: offset -> node.
    used: FxHashMap<u64, NodeIndex>,
    free_bytes: u64,
}

fn idx_to_pos(i: NodeIndex) -> usize {
    // u32 -> usize is lossless on every platform Rust targets with 32+ bit pointers.
    (i.get() - 1) as usize
}

impl Tlsf {
    /// An arena over `[0, capacity_bytes)`, all free.
    pub fn new(capacity_bytes: u64) -> Self {
        let mut t = Tlsf {
            capacity: capacity_bytes,
            nodes: Vec::new(),
            spare: None,
            spare_count: 0,
            heads: Box::new([None; HEAD_SLOTS]),
            bins: BinBitmap::default(),
            used: FxHashMap::default(),
            free_bytes: 0,
        };
        if capacity_bytes > 0 {
            t.nodes.push(Node {
                offset: 0,
                size: capacity_bytes,
                prev_phys: None,
                next_phys: None,
                prev_free: None,
                next_free: None,
                bin: 0,
                used: false,
            });
            t.link(NodeIndex::MIN);
            t.free_bytes = capacity_bytes;
        }
        t
    }

    #[inline]
    fn n(&self, i: NodeIndex) -> &Node {
        &self.nodes[idx_to_pos(i)]
    }

    #[inline]
    fn n_mut(&mut self, i: NodeIndex) -> &mut Node {
        &mut self.nodes[idx_to_pos(i)]
    }

    /// Node slots that can still be handed out without failing.
    fn nodes_available(&self) -> usize {
        self.spare_count + MAX_NODES.saturating_sub(self.nodes.len())
    }

    /// A node slot holding `node`. Callers check [`Self::nodes_available`] first.
    fn new_node(&mut self, node: Node) -> NodeIndex {
        if let Some(i) = self.spare {
            self.spare = self.n(i).next_free;
            self.spare_count -= 1;
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
        let spare = self.spare;
        let n = self.n_mut(i);
        n.next_free = spare;
        n.prev_free = None;
        n.prev_phys = None;
        n.next_phys = None;
        n.size = 0;
        n.used = false;
        self.spare = Some(i);
        self.spare_count += 1;
    }

    /// Puts free node `i` at the head of the list of its size's bin. Byte counters are the
    /// caller's business.
    #[inline(always)]
    fn link(&mut self, i: NodeIndex) {
        let bin = bin_floor(self.n(i).size);
        let head = self.heads[slot(bin)];
        {
            let n = self.n_mut(i);
            n.bin = bin;
            n.used = false;
            n.prev_free = None;
            n.next_free = head;
        }
        if let Some(h) = head {
            self.n_mut(h).prev_free = Some(i);
        }
        self.heads[slot(bin)] = Some(i);
        self.bins.set(bin);
    }

    /// Takes free node `i` off the list of the bin it was linked into.
    #[inline(always)]
    fn unlink(&mut self, i: NodeIndex) {
        let (prev, next, bin) = {
            let n = self.n(i);
            (n.prev_free, n.next_free, n.bin)
        };
        match prev {
            Some(p) => self.n_mut(p).next_free = next,
            None => self.heads[slot(bin)] = next,
        }
        if let Some(nx) = next {
            self.n_mut(nx).prev_free = prev;
        }
        if prev.is_none() && next.is_none() {
            // It was the only block of its bin.
            self.bins.clear(bin);
        }
        let n = self.n_mut(i);
        n.prev_free = None;
        n.next_free = None;
    }

    /// After free node `i` changed size: moves it to its new bin, if the bin changed (for a
    /// large block that gave up or took back a small piece, it usually did not).
    #[inline(always)]
    fn rebin(&mut self, i: NodeIndex) {
        let n = self.n(i);
        if bin_floor(n.size) != n.bin {
            self.unlink(i);
            self.link(i);
        }
    }

    /// The first non-empty bin ≥ `bin`, from the bitmaps.
    #[inline]
    fn next_nonempty_bin(&self, bin: u32) -> Option<u32> {
        self.bins.next_nonempty(bin)
    }

    /// Whether free node `i` can hold `size` bytes at an `align`-aligned offset.
    fn fits(&self, i: NodeIndex, size: u64, align: u64) -> bool {
        let n = self.n(i);
        match align_up(n.offset, align) {
            Some(a) => a - n.offset <= n.size && n.size - (a - n.offset) >= size,
            None => false,
        }
    }

    /// Finds a free node that holds `size` bytes aligned to `align`.
    fn find(&self, size: u64, align: u64) -> Option<NodeIndex> {
        // O(1) good fit: every block in bins ≥ bin_ceil(size + align - 1) fits.
        let worst = size.checked_add(align - 1);
        let guaranteed = worst.and_then(bin_ceil);
        if let Some(b) = guaranteed.and_then(|g| self.next_nonempty_bin(g)) {
            return self.heads[slot(b)];
        }
        // Slow path: blocks in [bin_floor(size), guaranteed) may still fit.
        let limit = guaranteed.unwrap_or(BIN_COUNT);
        let mut bin = self.next_nonempty_bin(bin_floor(size));
        while let Some(b) = bin.filter(|&b| b < limit) {
            let mut cur = self.heads[slot(b)];
            while let Some(i) = cur {
                if self.fits(i, size, align) {
                    return Some(i);
                }
                cur = self.n(i).next_free;
            }
            bin = self.next_nonempty_bin(b + 1);
        }
        None
    }

    /// Largest free block, in bytes: the largest block of the highest non-empty bin.
    fn largest_free(&self) -> u64 {
        let Some(bin) = self.bins.last() else {
            return 0;
        };
        let mut best = 0;
        let mut cur = self.heads[slot(bin)];
        while let Some(i) = cur {
            let n = self.n(i);
            best = best.max(n.size);
            cur = n.next_free;
        }
        best
    }

    fn oom(&self, size: u64) -> AllocError {
        AllocError::OutOfMemory {
            requested_bytes: size,
            free_bytes: self.free_bytes,
            largest_free_bytes: self.largest_free(),
        }
    }

    fn internal(msg: String) -> AllocError {
        AllocError::Internal(format!("tlsf: {msg}"))
    }
}

impl Arena for Tlsf {
    fn name(&self) -> &'static str {
        "tlsf"
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn max_align(&self) -> u64 {
        TLSF_MAX_ALIGN
    }

    /// Allocates `size_bytes` (0 takes one byte) at an `align`-aligned offset; the block
    /// takes exactly the bytes asked for.
    fn allocate(&mut self, size_bytes: u64, align: u64) -> Result<(u64, u64), AllocError> {
        if !is_pow2(align) {
            return Err(AllocError::InvalidAlignment {
                align,
                max: TLSF_MAX_ALIGN,
            });
        }
        let size = size_bytes.max(1);
        if size > self.free_bytes {
            return Err(self.oom(size_bytes));
        }
        // A split needs up to two new nodes (front padding, tail).
        if self.nodes_available() < 2 {
            return Err(self.oom(size_bytes));
        }
        let i = self.find(size, align).ok_or_else(|| self.oom(size_bytes))?;
        let (offset, block_size, prev) = {
            let n = self.n(i);
            (n.offset, n.size, n.prev_phys)
        };
        // find() checked that the aligned offset and the size fit inside the block.
        let aligned = align_up(offset, align).unwrap_or(offset);
        let pad = aligned - offset;
        let rest = block_size - pad - size;
        // Physical order afterwards: prev, [front padding], block, [tail], next.
        let block = if rest > 0 {
            // The free node stays where it is as the tail; often its bin does not change,
            // and then no list is touched.
            let u = self.new_node(Node {
                offset: aligned,
                size,
                prev_phys: prev,
                next_phys: Some(i),
                prev_free: None,
                next_free: None,
                bin: 0,
                used: true,
            });
            if pad == 0 {
                if let Some(p) = prev {
                    self.n_mut(p).next_phys = Some(u);
                }
            }
            {
                let n = self.n_mut(i);
                n.offset = aligned + size;
                n.size = rest;
                n.prev_phys = Some(u);
            }
            self.rebin(i);
            u
        } else {
            self.unlink(i);
            let n = self.n_mut(i);
            n.offset = aligned;
            n.size = size;
            n.used = true;
            i
        };
        if pad > 0 {
            let front = self.new_node(Node {
                offset,
                size: pad,
                prev_phys: prev,
                next_phys: Some(block),
                prev_free: None,
                next_free: None,
                bin: 0,
                used: false,
            });
            if let Some(p) = prev {
                self.n_mut(p).next_phys = Some(front);
            }
            self.n_mut(block).prev_phys = Some(front);
            self.link(front);
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
        self.free_bytes += size;
        let prev_free = prev.filter(|&p| !self.n(p).used);
        let next_free = next.filter(|&x| !self.n(x).used);
        match (prev_free, next_free) {
            (None, None) => self.link(i),
            (None, Some(x)) => {
                // The free successor grows backwards over the block.
                {
                    let xn = self.n_mut(x);
                    xn.offset = offset;
                    xn.size += size;
                    xn.prev_phys = prev;
                }
                if let Some(p) = prev {
                    self.n_mut(p).next_phys = Some(x);
                }
                self.release_node(i);
                self.rebin(x);
            }
            (Some(p), None) => {
                {
                    let pn = self.n_mut(p);
                    pn.size += size;
                    pn.next_phys = next;
                }
                if let Some(nn) = next {
                    self.n_mut(nn).prev_phys = Some(p);
                }
                self.release_node(i);
                self.rebin(p);
            }
            (Some(p), Some(x)) => {
                let (xsize, xnext) = {
                    let xn = self.n(x);
                    (xn.size, xn.next_phys)
                };
                self.unlink(x);
                {
                    let pn = self.n_mut(p);
                    pn.size += size + xsize;
                    pn.next_phys = xnext;
                }
                if let Some(nn) = xnext {
                    self.n_mut(nn).prev_phys = Some(p);
                }
                self.release_node(i);
                self.release_node(x);
                self.rebin(p);
            }
        }
        Ok(size)
    }

    /// Free bytes and allocations are O(1); the largest free block scans one bin.
    fn report(&self) -> ArenaReport {
        ArenaReport {
            free_bytes: self.free_bytes,
            largest_free_bytes: self.largest_free(),
            allocations: self.used.len() as u64,
        }
    }

    /// Walks the spare chain, the physical chain and every free list (see the checks of
    /// `Tlsf::spare_slots`, `Tlsf::check_physical_chain` and `Tlsf::check_free_lists`).
    fn validate(&self) -> Result<(), AllocError> {
        let (is_spare, spares) = self.spare_slots()?;
        let live = self.nodes.len() - spares;
        let free_nodes = self.check_physical_chain(&is_spare, live)?;
        self.check_free_lists(&is_spare, free_nodes)
    }
}

/// The three walks of [`Arena::validate`].
impl Tlsf {
    /// Marks the spare node slots (the chain from `spare`) and counts them.
    fn spare_slots(&self) -> Result<(Vec<bool>, usize), AllocError> {
        let total = self.nodes.len();
        let err = Self::internal;
        let mut is_spare = vec![false; total];
        let mut cur = self.spare;
        let mut spares = 0usize;
        while let Some(i) = cur {
            let p = idx_to_pos(i);
            if p >= total || is_spare[p] {
                return Err(err(format!("spare chain broken at node {}", i.get())));
            }
            is_spare[p] = true;
            spares += 1;
            cur = self.nodes[p].next_free;
        }
        if spares != self.spare_count {
            return Err(err(format!(
                "spare count {} but {spares} spare slots",
                self.spare_count
            )));
        }
        Ok((is_spare, spares))
    }

    /// Walks the blocks by address from offset 0: contiguous, non-empty, linked both ways,
    /// free neighbours coalesced, used blocks in the offset map, counters right. Returns the
    /// number of free blocks.
    fn check_physical_chain(&self, is_spare: &[bool], live: usize) -> Result<usize, AllocError> {
        let total = self.nodes.len();
        let err = Self::internal;
        let first = (0..total).find(|&p| !is_spare[p] && self.nodes[p].prev_phys.is_none());
        let mut visited = 0usize;
        let mut free_nodes = 0usize;
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
                    "block at {} should start at {expect_offset}",
                    n.offset
                )));
            }
            if n.size == 0 {
                return Err(err(format!("empty block at {}", n.offset)));
            }
            if n.prev_phys != prev {
                return Err(err(format!("prev link of block at {} is wrong", n.offset)));
            }
            if n.used {
                used_nodes += 1;
                if self.used.get(&n.offset) != Some(&i) {
                    return Err(err(format!(
                        "used block at {} missing from the offset map",
                        n.offset
                    )));
                }
                prev_free = false;
            } else {
                if prev_free {
                    return Err(err(format!(
                        "free block at {} not coalesced with its free predecessor",
                        n.offset
                    )));
                }
                free_nodes += 1;
                free_sum += n.size;
                prev_free = true;
            }
            expect_offset = n
                .offset
                .checked_add(n.size)
                .ok_or_else(|| err(format!("block at {} overflows", n.offset)))?;
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
                "blocks cover {expect_offset} of {} bytes",
                self.capacity
            )));
        }
        if used_nodes != self.used.len() {
            return Err(err(format!(
                "{used_nodes} used blocks but {} in the offset map",
                self.used.len()
            )));
        }
        if free_sum != self.free_bytes {
            return Err(err(format!(
                "free blocks hold {free_sum} B but the counter says {}",
                self.free_bytes
            )));
        }
        Ok(free_nodes)
    }

    /// Walks every bin's free list: bitmap bits agree with the lists, each block in the bin of
    /// its size, links both ways, and every free block listed once.
    fn check_free_lists(&self, is_spare: &[bool], free_nodes: usize) -> Result<(), AllocError> {
        let total = self.nodes.len();
        let err = Self::internal;
        let mut listed = 0usize;
        for bin in 0..BIN_COUNT {
            let bit = self.bins.is_set(bin);
            let head = self.heads[slot(bin)];
            if bit != head.is_some() {
                return Err(err(format!(
                    "bitmap bit of bin {bin} disagrees with its list"
                )));
            }
            let mut prev: Option<NodeIndex> = None;
            let mut cur = head;
            while let Some(i) = cur {
                let p = idx_to_pos(i);
                if p >= total || is_spare[p] || listed >= free_nodes {
                    return Err(err(format!("free list of bin {bin} is broken")));
                }
                listed += 1;
                let n = &self.nodes[p];
                if n.used {
                    return Err(err(format!("used block at {} on a free list", n.offset)));
                }
                if bin_floor(n.size) != bin || n.bin != bin {
                    return Err(err(format!(
                        "block of {} B in bin {bin}, belongs in {}",
                        n.size,
                        bin_floor(n.size)
                    )));
                }
                if n.prev_free != prev {
                    return Err(err(format!("free list links of block at {}", n.offset)));
                }
                prev = Some(i);
                cur = n.next_free;
            }
        }
        if let Some(fl) = self.bins.first_level_disagreement() {
            return Err(err(format!("first-level bit {fl} disagrees")));
        }
        if self.bins.last().is_some_and(|b| b >= BIN_COUNT)
            || self.heads[BIN_COUNT as usize..].iter().any(Option::is_some)
        {
            return Err(err("bitmap bits or list heads beyond the last class".into()));
        }
        if listed != free_nodes {
            return Err(err(format!(
                "{free_nodes} free blocks but {listed} on the free lists"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn split_align_and_coalesce() {
        let mut t = Tlsf::new(10_000);
        let (a, sa) = t.allocate(100, 1).unwrap();
        assert_eq!((a, sa), (0, 100));
        let (b, _) = t.allocate(10, 256).unwrap();
        assert_eq!(b, 256, "front padding 100..256 split off");
        t.validate().unwrap();
        assert_eq!(t.report().free_bytes, 10_000 - 110);
        t.deallocate(a).unwrap();
        t.validate().unwrap();
        t.deallocate(b).unwrap();
        t.validate().unwrap();
        assert_eq!(t.report().largest_free_bytes, 10_000);
        assert_eq!(t.allocate(10_000, 1).unwrap(), (0, 10_000));
    }

    #[test]
    fn slow_path_finds_an_exact_fit() {
        // Capacity not a bin minimum: the good-fit bin is empty, the slow path finds it.
        let cap = 1_000_003;
        let mut t = Tlsf::new(cap);
        assert_eq!(t.allocate(cap, 1).unwrap(), (0, cap));
        assert!(t.allocate(0, 1).unwrap_err().is_oom());
        t.deallocate(0).unwrap();
        t.validate().unwrap();
    }

    #[test]
    fn node_slots_are_recycled() {
        let mut t = Tlsf::new(1 << 20);
        for _ in 0..100 {
            let (a, _) = t.allocate(100, 64).unwrap();
            let (b, _) = t.allocate(300, 1).unwrap();
            t.deallocate(a).unwrap();
            t.deallocate(b).unwrap();
        }
        assert!(t.nodes.len() <= 4, "{} node slots", t.nodes.len());
        t.validate().unwrap();
    }
}
