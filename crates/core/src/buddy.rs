//! Binary buddy system over byte offsets (Knowlton, "A fast storage allocator", CACM 1965;
//! Knuth, TAOCP vol. 1, §2.5): blocks of `min_block << order` bytes, split in halves on
//! allocation and merged with their buddy (`offset ^ size`) on free.
//!
//! The classic pool pre-allocates 256 MiB and hands out power-of-two blocks of at least
//! 256 B; [`Buddy::new`] uses that minimum block, [`Buddy::with_min_block`] another.
//!
//! Capacity: any value. The usable range is the capacity rounded down to a multiple of the
//! minimum block, cut into its power-of-two pieces from the largest down (a 3 MiB arena is a
//! 2 MiB piece at 0 and a 1 MiB piece at 2 MiB); each piece is a buddy tree of its own, so a
//! block never straddles two pieces. The remainder below the minimum block is never handed
//! out. With a power-of-two capacity the whole capacity is one block.
//!
//! Alignment: every block is naturally aligned to its size, so a request for `size` bytes
//! aligned to `align` takes the block of `max(size, align, min_block)` rounded up to a power
//! of two. Any power of two up to the largest piece works.
//!
//! Free lists are ordered sets, so the lowest free block of an order is taken first (an
//! address-ordered buddy system, which keeps the high end free).
use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use crate::align::is_pow2;
use crate::arena::{Arena, ArenaReport};
use crate::error::AllocError;

/// Default minimum block of the buddy system, in bytes (256, the cudaMalloc alignment).
pub const DEFAULT_MIN_BLOCK: u64 = 256;

/// The buddy arena over `[0, capacity_bytes)`.
///
/// ```
/// use gpumem_core::{buddy::Buddy, Arena};
/// let mut b = Buddy::new(1 << 20);
/// let (a, bytes) = b.allocate(1000, 1).unwrap();
/// assert_eq!((a, bytes), (0, 1024));
/// let (c, bytes) = b.allocate(10, 4096).unwrap();
/// assert_eq!((c, bytes), (4096, 4096));
/// b.deallocate(a).unwrap();
/// b.deallocate(c).unwrap();
/// assert_eq!(b.allocate(1 << 20, 1).unwrap(), (0, 1 << 20));
/// ```
#[derive(Debug, Clone)]
pub struct Buddy {
    capacity: u64,
    /// log2 of the minimum block.
    min_shift: u32,
    /// Bytes that belong to some piece (capacity rounded down to the minimum block).
    usable: u64,
    /// Highest order of any piece.
    max_order: u32,
    /// Free block offsets per order.
    free: Vec<BTreeSet<u64>>,
    /// Bit `k` set: `free[k]` is not empty.
    nonempty: u64,
    /// Live blocks: offset -> order.
    used: FxHashMap<u64, u32>,
    free_bytes: u64,
}

impl Buddy {
    /// An arena over `[0, capacity_bytes)` with 256-byte minimum blocks.
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_min_block(capacity_bytes, DEFAULT_MIN_BLOCK)
    }

    /// An arena over `[0, capacity_bytes)` whose smallest block is `min_block_bytes`, rounded
    /// up to a power of two (0 counts as 1; above 2^63 it is 2^63).
    pub fn with_min_block(capacity_bytes: u64, min_block_bytes: u64) -> Self {
        let min_block = min_block_bytes
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(1 << 63);
        let min_shift = min_block.trailing_zeros();
        let usable = capacity_bytes & !(min_block - 1);
        let max_order = if usable == 0 {
            0
        } else {
            (63 - usable.leading_zeros()) - min_shift
        };
        let mut b = Buddy {
            capacity: capacity_bytes,
            min_shift,
            usable,
            max_order,
            free: vec![BTreeSet::new(); max_order as usize + 1],
            nonempty: 0,
            used: FxHashMap::default(),
            free_bytes: 0,
        };
        let mut offset = 0u64;
        for order in (0..=max_order).rev() {
            let size = b.block_bytes(order);
            if usable & size != 0 {
                b.push_free(order, offset);
                offset += size;
            }
        }
        b
    }

    /// The smallest block, in bytes.
    pub fn min_block_bytes(&self) -> u64 {
        1 << self.min_shift
    }

    /// Bytes that can ever be handed out (the capacity rounded down to the minimum block).
    pub fn usable_bytes(&self) -> u64 {
        self.usable
    }

    fn block_bytes(&self, order: u32) -> u64 {
        1u64 << (order + self.min_shift)
    }

    fn push_free(&mut self, order: u32, offset: u64) {
        self.free[order as usize].insert(offset);
        self.nonempty |= 1 << order;
        self.free_bytes += self.block_bytes(order);
    }

    fn pop_free(&mut self, order: u32) -> Option<u64> {
        let set = &mut self.free[order as usize];
        let off = set.pop_first()?;
        if set.is_empty() {
            self.nonempty &= !(1 << order);
        }
        self.free_bytes -= self.block_bytes(order);
        Some(off)
    }

    fn take_free(&mut self, order: u32, offset: u64) -> bool {
        let set = &mut self.free[order as usize];
        if !set.remove(&offset) {
            return false;
        }
        if set.is_empty() {
            self.nonempty &= !(1 << order);
        }
        self.free_bytes -= self.block_bytes(order);
        true
    }

    fn largest_free(&self) -> u64 {
        if self.nonempty == 0 {
            0
        } else {
            self.block_bytes(63 - self.nonempty.leading_zeros())
        }
    }

    fn oom(&self, size: u64) -> AllocError {
        AllocError::OutOfMemory {
            requested_bytes: size,
            free_bytes: self.free_bytes,
            largest_free_bytes: self.largest_free(),
        }
    }
}

impl Arena for Buddy {
    fn name(&self) -> &'static str {
        "buddy"
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    /// The largest piece, in bytes (a block is aligned to its own size).
    fn max_align(&self) -> u64 {
        if self.usable == 0 {
            1
        } else {
            self.block_bytes(self.max_order)
        }
    }

    /// Takes the block of `max(size_bytes, align, min_block)` rounded up to a power of two;
    /// returns its offset and that block size.
    fn allocate(&mut self, size_bytes: u64, align: u64) -> Result<(u64, u64), AllocError> {
        if !is_pow2(align) || align > self.max_align() {
            return Err(AllocError::InvalidAlignment {
                align,
                max: self.max_align(),
            });
        }
        let need = size_bytes.max(align).max(self.min_block_bytes());
        let block = need
            .checked_next_power_of_two()
            .ok_or(AllocError::Overflow { size_bytes, align })?;
        if self.usable == 0 || block > self.block_bytes(self.max_order) {
            return Err(self.oom(size_bytes));
        }
        let order = block.trailing_zeros() - self.min_shift;
        let avail = self.nonempty >> order;
        if avail == 0 {
            return Err(self.oom(size_bytes));
        }
        let mut j = order + avail.trailing_zeros();
        let offset = self.pop_free(j).ok_or_else(|| self.oom(size_bytes))?;
        while j > order {
            j -= 1;
            self.push_free(j, offset + self.block_bytes(j));
        }
        self.used.insert(offset, order);
        Ok((offset, block))
    }

    fn deallocate(&mut self, offset: u64) -> Result<u64, AllocError> {
        let Some(order) = self.used.remove(&offset) else {
            return Err(AllocError::UnknownBlock { addr: offset });
        };
        let freed = self.block_bytes(order);
        let mut off = offset;
        let mut k = order;
        while k < self.max_order {
            let buddy = off ^ self.block_bytes(k);
            if !self.take_free(k, buddy) {
                break;
            }
            off = off.min(buddy);
            k += 1;
        }
        self.push_free(k, off);
        Ok(freed)
    }

    fn report(&self) -> ArenaReport {
        ArenaReport {
            free_bytes: self.free_bytes,
            largest_free_bytes: self.largest_free(),
            allocations: self.used.len() as u64,
        }
    }

    fn validate(&self) -> Result<(), AllocError> {
        let err = |m: String| AllocError::Internal(format!("buddy: {m}"));
        let mut ranges: Vec<(u64, u64, bool)> = Vec::with_capacity(self.used.len() + 64);
        let mut free_sum = 0u64;
        for (k, set) in self.free.iter().enumerate() {
            let order = k as u32;
            let size = self.block_bytes(order);
            if (self.nonempty >> order & 1 == 1) == set.is_empty() {
                return Err(err(format!("bitmap bit of order {order} disagrees")));
            }
            for &off in set {
                if off % size != 0 {
                    return Err(err(format!("free block {off} of order {order} misaligned")));
                }
                if order < self.max_order && set.contains(&(off ^ size)) {
                    return Err(err(format!(
                        "free buddies {off} and {} of order {order} not merged",
                        off ^ size
                    )));
                }
                free_sum += size;
                ranges.push((off, size, false));
            }
        }
        let allowed = u64::MAX >> (63 - self.max_order.min(63));
        if self.nonempty & !allowed != 0 {
            return Err(err("bitmap bits above the highest order".into()));
        }
        for (&off, &order) in &self.used {
            if order > self.max_order {
                return Err(err(format!("used block {off} has order {order}")));
            }
            let size = self.block_bytes(order);
            if off % size != 0 {
                return Err(err(format!("used block {off} of order {order} misaligned")));
            }
            ranges.push((off, size, true));
        }
        ranges.sort_unstable();
        let mut end = 0u64;
        let mut covered = 0u64;
        for &(off, size, _) in &ranges {
            if off < end {
                return Err(err(format!("block at {off} overlaps the one before")));
            }
            end = off
                .checked_add(size)
                .ok_or_else(|| err(format!("block at {off} overflows")))?;
            covered += size;
        }
        if end > self.usable || covered != self.usable {
            return Err(err(format!(
                "blocks cover {covered} B ending at {end}, usable is {}",
                self.usable
            )));
        }
        if free_sum != self.free_bytes {
            return Err(err(format!(
                "free blocks hold {free_sum} B, counter says {}",
                self.free_bytes
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
    fn non_power_of_two_capacity_is_cut_into_pieces() {
        let mut b = Buddy::new((3 << 20) + 300);
        assert_eq!(b.usable_bytes(), (3 << 20) + 256);
        assert_eq!(b.report().free_bytes, (3 << 20) + 256);
        assert_eq!(b.report().largest_free_bytes, 2 << 20);
        b.validate().unwrap();
        assert_eq!(b.allocate(2 << 20, 1).unwrap(), (0, 2 << 20));
        assert_eq!(b.allocate(1 << 20, 1).unwrap(), (2 << 20, 1 << 20));
        assert_eq!(b.allocate(1, 1).unwrap(), (3 << 20, 256));
        assert!(b.allocate(1, 1).unwrap_err().is_oom());
        b.validate().unwrap();
        for off in [0, 2 << 20, 3 << 20] {
            b.deallocate(off).unwrap();
            b.validate().unwrap();
        }
        // The 1 MiB piece must not merge with the 2 MiB one.
        assert_eq!(b.report().largest_free_bytes, 2 << 20);
    }

    #[test]
    fn split_and_merge_back() {
        let mut b = Buddy::with_min_block(1 << 16, 64);
        let blocks: Vec<_> = (0..10).map(|_| b.allocate(100, 1).unwrap()).collect();
        assert!(blocks.iter().all(|&(_, s)| s == 128));
        b.validate().unwrap();
        for (o, _) in blocks.iter().rev() {
            b.deallocate(*o).unwrap();
            b.validate().unwrap();
        }
        assert_eq!(b.report().largest_free_bytes, 1 << 16);
        assert_eq!(b.deallocate(0), Err(AllocError::UnknownBlock { addr: 0 }));
    }

    #[test]
    fn min_block_rounds_to_power_of_two() {
        assert_eq!(Buddy::with_min_block(1 << 20, 300).min_block_bytes(), 512);
        assert_eq!(Buddy::with_min_block(1 << 20, 0).min_block_bytes(), 1);
        let mut tiny = Buddy::new(100);
        assert_eq!(tiny.usable_bytes(), 0);
        assert!(tiny.allocate(1, 1).is_err());
        tiny.validate().unwrap();
    }
}
