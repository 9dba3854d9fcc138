//! Where the emulation keeps its blocks: a slab of [`Block`] records linked to their
//! neighbours by index (PyTorch's `Block` with its `prev`/`next` pointers), and per pool the
//! ordered sets PyTorch keeps: free blocks by `(stream, size, address)`
//! (`BlockComparatorSize`) and unmapped ranges of expandable segments by
//! `(stream, address)` (`BlockComparatorAddress`).
//!
//! Speed: a free block's key is one `u128` (`size << 64 | address`) in a B-tree per stream,
//! so the best-fit search, an insert and a removal are one B-tree walk each over integer keys;
//! neighbours and live blocks are reached by slab index, never by hashing an address.
use std::collections::BTreeMap;

use super::sizes::PoolKind;

/// "No block" in a link (`nullptr`).
pub(crate) const NIL: u32 = u32::MAX;

/// One block: a range of a segment, allocated, free, or (expandable segments) unmapped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    /// Address of the first byte.
    pub addr: u64,
    /// Bytes of the block (a multiple of 512).
    pub size: u64,
    /// Bytes the user asked for (0 while free).
    pub requested: u64,
    /// Stream the block belongs to.
    pub stream: u64,
    /// The pool's `get_free_blocks` call count when the block entered the free set
    /// (`gc_count_base`, for the garbage collector's age).
    pub gc_base: u64,
    /// Slab index of the previous block of the same segment, or [`NIL`].
    pub prev: u32,
    /// Slab index of the next block of the same segment, or [`NIL`].
    pub next: u32,
    /// Index of the expandable segment holding the block, or [`NIL`] for a cudaMalloc segment.
    pub segment: u32,
    /// The pool of the block.
    pub pool: PoolKind,
    /// Handed out to a user.
    pub allocated: bool,
    /// Backed by physical pages (always true outside expandable segments).
    pub mapped: bool,
}

impl Block {
    /// PyTorch's `is_split`: part of a segment that holds other blocks.
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    /// Whether the block lies in an expandable segment.
    pub fn is_expandable(&self) -> bool {
        self.segment != NIL
    }
}

/// Block records by index; freed slots are reused.
#[derive(Debug, Default)]
pub(crate) struct Slab {
    blocks: Vec<Block>,
    vacant: Vec<u32>,
    live: usize,
}

impl Slab {
    /// Stores `b` and returns its index.
    pub fn insert(&mut self, b: Block) -> u32 {
        self.live += 1;
        match self.vacant.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    /// Forgets the block at `i` (its slot is reused later).
    pub fn remove(&mut self, i: u32) {
        self.live -= 1;
        self.vacant.push(i);
    }

    /// The block at `i`.
    ///
    /// # Panics
    /// If `i` was never handed out (a bug of the emulation; indices come only from `insert`).
    #[inline]
    pub fn get(&self, i: u32) -> &Block {
        &self.blocks[i as usize]
    }

    /// The block at `i`, mutable (panics like [`Slab::get`]).
    #[inline]
    pub fn get_mut(&mut self, i: u32) -> &mut Block {
        &mut self.blocks[i as usize]
    }

    /// Blocks stored.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Every stored block with its index (vacant slots skipped), for validation.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Block)> {
        let mut vacant = self.vacant.clone();
        vacant.sort_unstable();
        self.blocks
            .iter()
            .enumerate()
            .filter(move |(i, _)| vacant.binary_search(&(*i as u32)).is_err())
            .map(|(i, b)| (i as u32, b))
    }
}

/// Key of a free block inside its stream's set: size first, then address.
#[inline]
pub(crate) fn size_key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

/// Size of a [`size_key`].
#[inline]
pub(crate) fn key_size(key: u128) -> u64 {
    (key >> 64) as u64
}

/// The size classes of a [`SizeIndex`]: gpumem's one log-linear binning
/// ([`crate::size_class::LogLinear`], 16 classes per power of two) over units of 512 B.
type Classes = crate::size_class::LogLinear<4>;
/// Size classes.
const CLASSES: usize = Classes::BIN_COUNT as usize;
/// Words of the class bitmap.
const WORDS: usize = CLASSES.div_ceil(64);

/// Size class of a size in bytes, monotone in the size (sizes below 512 B share class 0).
#[inline]
fn class_of(size: u64) -> usize {
    Classes::floor(size >> 9) as usize
}

/// Where an entry sits in a [`SizeIndex`]: its class and its index in the class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos(u32, u32);

/// One stream's free blocks in `(size, address)` order: log-linear size classes, each a
/// sorted vector of keys, and a bitmap of the non-empty classes. A search looks in the class
/// of the size, then jumps to the next non-empty class; inserts and removals touch one
/// short vector. (A B-tree over the same `u128` keys costs several times the instructions
/// per operation on the shipped traces.)
#[derive(Debug)]
pub(crate) struct SizeIndex {
    classes: Vec<Vec<(u128, u32)>>,
    bits: [u64; WORDS],
    len: usize,
}

impl Default for SizeIndex {
    fn default() -> Self {
        SizeIndex {
            // Grown up to the largest class used (most streams use a few hundred of the
            // classes; fewer pages to touch on a short replay).
            classes: Vec::new(),
            bits: [0; WORDS],
            len: 0,
        }
    }
}

impl SizeIndex {
    /// First non-empty class at or after `c`.
    #[inline]
    fn next_class(&self, c: usize) -> Option<usize> {
        let mut w = c / 64;
        if w >= WORDS {
            return None;
        }
        let mut bits = self.bits[w] & (u64::MAX << (c % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            if w >= WORDS {
                return None;
            }
            bits = self.bits[w];
        }
    }

    /// Last non-empty class before `c` (exclusive).
    fn prev_class(&self, c: usize) -> Option<usize> {
        let last = c.min(CLASSES).checked_sub(1)?;
        let mut w = last / 64;
        let b = last % 64;
        let mut bits = self.bits[w] & (u64::MAX >> (63 - b));
        loop {
            if bits != 0 {
                return Some(w * 64 + 63 - bits.leading_zeros() as usize);
            }
            w = w.checked_sub(1)?;
            bits = self.bits[w];
        }
    }

    #[inline]
    fn insert(&mut self, key: u128, idx: u32) {
        let c = class_of(key_size(key));
        if c >= self.classes.len() {
            self.classes.resize_with(c + 1, Vec::new);
        }
        let v = &mut self.classes[c];
        let at = v.partition_point(|e| e.0 < key);
        v.insert(at, (key, idx));
        self.bits[c / 64] |= 1 << (c % 64);
        self.len += 1;
    }

    #[inline]
    fn remove(&mut self, key: u128) -> Option<u32> {
        let c = class_of(key_size(key));
        let v = self.classes.get_mut(c)?;
        let at = v.partition_point(|e| e.0 < key);
        if v.get(at).is_none_or(|e| e.0 != key) {
            return None;
        }
        let (_, idx) = v.remove(at);
        if v.is_empty() {
            self.bits[c / 64] &= !(1 << (c % 64));
        }
        self.len -= 1;
        Some(idx)
    }

    fn get(&self, key: u128) -> Option<u32> {
        let v = self.classes.get(class_of(key_size(key)))?;
        let at = v.partition_point(|e| e.0 < key);
        v.get(at).filter(|e| e.0 == key).map(|e| e.1)
    }

    /// The first entry at or after `key`.
    #[inline]
    fn at_or_after(&self, key: u128) -> Option<(u128, u32)> {
        self.at_or_after_pos(key).map(|(e, _)| e)
    }

    /// The first entry at or after `key` with its position `(class, index in the class)`.
    #[inline]
    fn at_or_after_pos(&self, key: u128) -> Option<((u128, u32), Pos)> {
        let c = class_of(key_size(key));
        if let Some(v) = self.classes.get(c) {
            let at = v.partition_point(|e| e.0 < key);
            if let Some(&e) = v.get(at) {
                return Some((e, Pos(c as u32, at as u32)));
            }
        }
        let n = self.next_class(c + 1)?;
        self.classes.get(n)?.first().map(|&e| (e, Pos(n as u32, 0)))
    }

    /// The entry after the one at `pos` (from [`SizeIndex::at_or_after_pos`] or this, nothing
    /// changed since), with its position.
    #[inline]
    fn next_pos(&self, pos: Pos) -> Option<((u128, u32), Pos)> {
        let (c, at) = (pos.0 as usize, pos.1 as usize + 1);
        if let Some(&e) = self.classes.get(c).and_then(|v| v.get(at)) {
            return Some((e, Pos(c as u32, at as u32)));
        }
        let n = self.next_class(c + 1)?;
        self.classes.get(n)?.first().map(|&e| (e, Pos(n as u32, 0)))
    }

    /// Removes the entry at `pos` (from [`SizeIndex::at_or_after_pos`], nothing changed
    /// since) and returns it.
    #[inline]
    fn remove_at(&mut self, pos: Pos) -> Option<(u128, u32)> {
        let c = pos.0 as usize;
        let v = self.classes.get_mut(c)?;
        if pos.1 as usize >= v.len() {
            return None;
        }
        let e = v.remove(pos.1 as usize);
        if v.is_empty() {
            self.bits[c / 64] &= !(1 << (c % 64));
        }
        self.len -= 1;
        Some(e)
    }

    /// Entries before `key`, largest first.
    fn before(&self, key: u128) -> impl Iterator<Item = (u128, u32)> + '_ {
        let c = class_of(key_size(key));
        let v = self.classes.get(c).map_or(&[][..], Vec::as_slice);
        let at = v.partition_point(|e| e.0 < key);
        let head = v[..at].iter().rev().copied();
        let mut k = c;
        let rest = std::iter::from_fn(move || {
            let p = self.prev_class(k)?;
            k = p;
            Some(self.classes.get(p)?.iter().rev().copied())
        })
        .flatten();
        head.chain(rest)
    }

    /// Every entry in order.
    fn iter(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        let mut k = 0usize;
        std::iter::from_fn(move || {
            let c = self.next_class(k)?;
            k = c + 1;
            Some(self.classes.get(c)?.iter().copied())
        })
        .flatten()
    }

    fn last(&self) -> Option<(u128, u32)> {
        let c = self.prev_class(CLASSES)?;
        self.classes.get(c)?.last().copied()
    }
}

/// The free blocks of one pool in PyTorch's `(stream, size, address)` order: one
/// [`SizeIndex`] per stream, streams in ascending order.
#[derive(Debug, Default)]
pub(crate) struct FreeSet {
    streams: Vec<(u64, SizeIndex)>,
    len: usize,
}

impl FreeSet {
    fn stream_pos(&self, stream: u64) -> Result<usize, usize> {
        // Few streams: a linear scan beats a binary search.
        for (i, (s, _)) in self.streams.iter().enumerate() {
            if *s == stream {
                return Ok(i);
            }
            if *s > stream {
                return Err(i);
            }
        }
        Err(self.streams.len())
    }

    /// The index of one stream, if it has ever held a block.
    #[inline]
    fn of(&self, stream: u64) -> Option<&SizeIndex> {
        if let Some((s, m)) = self.streams.first() {
            if *s == stream {
                return Some(m);
            }
        }
        self.stream_pos(stream).ok().map(|i| &self.streams[i].1)
    }

    /// Adds the free block `idx` of `(stream, size, addr)`.
    #[inline]
    pub fn insert(&mut self, stream: u64, size: u64, addr: u64, idx: u32) {
        self.len += 1;
        let pos = match self.streams.first() {
            Some((s, _)) if *s == stream => 0,
            _ => match self.stream_pos(stream) {
                Ok(i) => i,
                Err(i) => {
                    self.streams.insert(i, (stream, SizeIndex::default()));
                    i
                }
            },
        };
        self.streams[pos].1.insert(size_key(size, addr), idx);
    }

    /// Removes the block of `(stream, size, addr)`; whether it was there.
    #[inline]
    pub fn remove(&mut self, stream: u64, size: u64, addr: u64) -> bool {
        let pos = match self.streams.first() {
            Some((s, _)) if *s == stream => 0,
            _ => match self.stream_pos(stream) {
                Ok(i) => i,
                Err(_) => return false,
            },
        };
        let found = self.streams[pos].1.remove(size_key(size, addr)).is_some();
        if found {
            self.len -= 1;
        }
        found
    }

    /// Whether the block of `(stream, size, addr)` is in the set with index `idx`.
    pub fn contains(&self, stream: u64, size: u64, addr: u64, idx: u32) -> bool {
        self.of(stream)
            .and_then(|m| m.get(size_key(size, addr)))
            .is_some_and(|i| i == idx)
    }

    /// The first block of `stream` in `(size, address)` order at or after `(size, 0)`
    /// (`lower_bound` with a search key), as `(key, index)`.
    #[inline]
    pub fn lower_bound(&self, stream: u64, size: u64) -> Option<(u128, u32)> {
        self.of(stream)?.at_or_after(size_key(size, 0))
    }

    /// [`FreeSet::lower_bound`] with the position of the block, for [`FreeSet::remove_at`].
    #[inline]
    pub fn lower_bound_pos(&self, stream: u64, size: u64) -> Option<(u128, u32, Pos)> {
        self.of(stream)?
            .at_or_after_pos(size_key(size, 0))
            .map(|((k, i), p)| (k, i, p))
    }

    /// Removes the block of `stream` at `pos` (found by [`FreeSet::lower_bound_pos`] with no
    /// change since); the removed `(key, index)`.
    #[inline]
    pub fn remove_at(&mut self, stream: u64, pos: Pos) -> Option<(u128, u32)> {
        let i = match self.streams.first() {
            Some((s, _)) if *s == stream => 0,
            _ => self.stream_pos(stream).ok()?,
        };
        let e = self.streams[i].1.remove_at(pos)?;
        self.len -= 1;
        Some(e)
    }

    /// The block of `stream` after the one at `pos` (found by [`FreeSet::lower_bound_pos`] or
    /// this, with no change since), as `(key, index, position)`.
    #[inline]
    pub fn next_pos(&self, stream: u64, pos: Pos) -> Option<(u128, u32, Pos)> {
        self.of(stream)?.next_pos(pos).map(|((k, i), p)| (k, i, p))
    }

    /// Blocks of `stream` before `(size, 0)`, largest first.
    pub fn below(&self, stream: u64, size: u64) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.of(stream)
            .into_iter()
            .flat_map(move |m| m.before(size_key(size, 0)))
    }

    /// Every block in `(stream, size, address)` order, as `(stream, key, index)`.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u128, u32)> + '_ {
        self.streams
            .iter()
            .flat_map(|(s, m)| m.iter().map(move |(k, i)| (*s, k, i)))
    }

    /// Blocks in the set.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Size of the largest block, 0 if none.
    pub fn largest(&self) -> u64 {
        self.streams
            .iter()
            .filter_map(|(_, m)| m.last().map(|(k, _)| key_size(k)))
            .max()
            .unwrap_or(0)
    }
}

/// Unmapped ranges of expandable segments of one pool, by `(stream, address)`.
pub(crate) type UnmappedSet = BTreeMap<(u64, u64), u32>;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn classes_are_monotone_and_bounded() {
        let mut last = 0;
        let mut s = 0u64;
        while s < u64::MAX / 3 {
            let c = class_of(s);
            assert!(c >= last && c < CLASSES, "{s}");
            last = c;
            s = s / 8 * 9 + 512;
        }
        assert!(class_of(u64::MAX) < CLASSES);
    }

    proptest::proptest! {
        /// The index answers every query as a B-tree over the same keys does.
        #[test]
        fn size_index_matches_a_btree(ops in proptest::collection::vec((0u64..64, 0u64..8, proptest::bool::ANY), 1..300)) {
            let mut ix = SizeIndex::default();
            let mut bt: BTreeMap<u128, u32> = BTreeMap::new();
            for (n, (units, addr, add)) in ops.into_iter().enumerate() {
                let size = (units * units * units + 1) * 512;
                let key = size_key(size, addr * 4096);
                if add && !bt.contains_key(&key) {
                    ix.insert(key, n as u32);
                    bt.insert(key, n as u32);
                } else {
                    proptest::prop_assert_eq!(ix.remove(key), bt.remove(&key));
                }
                proptest::prop_assert_eq!(ix.len, bt.len());
                let q = size_key(size, 0);
                proptest::prop_assert_eq!(ix.at_or_after(q), bt.range(q..).next().map(|(&k, &i)| (k, i)));
                // Walking on with next_pos from the search's position gives every later key.
                let mut walked = Vec::new();
                let mut at = ix.at_or_after_pos(q);
                while let Some((e, pos)) = at {
                    walked.push(e);
                    at = ix.next_pos(pos);
                }
                let want: Vec<_> = bt.range(q..).map(|(&k, &i)| (k, i)).collect();
                proptest::prop_assert_eq!(walked, want);
                let before: Vec<_> = ix.before(q).collect();
                let want: Vec<_> = bt.range(..q).rev().map(|(&k, &i)| (k, i)).collect();
                proptest::prop_assert_eq!(before, want);
                let all: Vec<_> = ix.iter().collect();
                let want: Vec<_> = bt.iter().map(|(&k, &i)| (k, i)).collect();
                proptest::prop_assert_eq!(all, want);
                proptest::prop_assert_eq!(ix.last(), bt.last_key_value().map(|(&k, &i)| (k, i)));
            }
        }
    }
}
