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

/// The free blocks of one pool in PyTorch's `(stream, size, address)` order: one B-tree per
/// stream, streams in ascending order.
#[derive(Debug, Default)]
pub(crate) struct FreeSet {
    streams: Vec<(u64, BTreeMap<u128, u32>)>,
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

    /// The set of one stream, if it has ever held a block.
    #[inline]
    pub fn of(&self, stream: u64) -> Option<&BTreeMap<u128, u32>> {
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
                    self.streams.insert(i, (stream, BTreeMap::new()));
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
        let found = self.streams[pos].1.remove(&size_key(size, addr)).is_some();
        if found {
            self.len -= 1;
        }
        found
    }

    /// Whether the block of `(stream, size, addr)` is in the set with index `idx`.
    pub fn contains(&self, stream: u64, size: u64, addr: u64, idx: u32) -> bool {
        self.of(stream)
            .and_then(|m| m.get(&size_key(size, addr)))
            .is_some_and(|&i| i == idx)
    }

    /// The first block of `stream` in `(size, address)` order at or after `(size, 0)`
    /// (`lower_bound` with a search key), as `(key, index)`.
    #[inline]
    pub fn lower_bound(&self, stream: u64, size: u64) -> Option<(u128, u32)> {
        self.of(stream)?
            .range(size_key(size, 0)..)
            .next()
            .map(|(&k, &i)| (k, i))
    }

    /// The block of `stream` right after `key`.
    pub fn after(&self, stream: u64, key: u128) -> Option<(u128, u32)> {
        self.of(stream)?
            .range((std::ops::Bound::Excluded(key), std::ops::Bound::Unbounded))
            .next()
            .map(|(&k, &i)| (k, i))
    }

    /// Blocks of `stream` before `(size, 0)`, largest first.
    pub fn below(&self, stream: u64, size: u64) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.of(stream)
            .into_iter()
            .flat_map(move |m| m.range(..size_key(size, 0)).rev().map(|(&k, &i)| (k, i)))
    }

    /// Every block in `(stream, size, address)` order, as `(stream, key, index)`.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u128, u32)> + '_ {
        self.streams
            .iter()
            .flat_map(|(s, m)| m.iter().map(move |(&k, &i)| (*s, k, i)))
    }

    /// Blocks in the set.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Size of the largest block, 0 if none.
    pub fn largest(&self) -> u64 {
        self.streams
            .iter()
            .filter_map(|(_, m)| m.last_key_value().map(|(&k, _)| key_size(k)))
            .max()
            .unwrap_or(0)
    }
}

/// Unmapped ranges of expandable segments of one pool, by `(stream, address)`.
pub(crate) type UnmappedSet = BTreeMap<(u64, u64), u32>;
