//! Address-ordered best fit with splitting and coalescing, the family of TensorFlow's BFC
//! ("best-fit with coalescing") allocator and of PyTorch's block pools.
//!
//! Free ranges are kept twice: in an ordered set by `(size, offset)`, where the best fit is
//! the first entry at or above the request (ties go to the lowest address), and in an ordered
//! map by offset, where a freed range finds its neighbours to merge with. Live blocks are an
//! Fx hash map from offset to size. Every operation is O(log n), except that an aligned
//! request walks the candidates in size order until one holds the aligned block.
//!
//! Alignment: any power of two; unaligned front padding is split off as a free range.
use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use crate::align::{align_up, is_pow2};
use crate::arena::{Arena, ArenaReport};
use crate::error::AllocError;

/// Largest alignment the best-fit arena accepts, in bytes (any power of two).
pub const BEST_FIT_MAX_ALIGN: u64 = 1 << 63;

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
#[derive(Debug, Clone)]
pub struct BestFit {
    capacity: u64,
    /// Free ranges by `(size, offset)`.
    by_size: BTreeSet<(u64, u64)>,
    /// Free ranges by offset -> size.
    by_offset: BTreeMap<u64, u64>,
    /// Live blocks: offset -> size.
    used: FxHashMap<u64, u64>,
    free_bytes: u64,
}

impl BestFit {
    /// An arena over `[0, capacity_bytes)`, all free.
    pub fn new(capacity_bytes: u64) -> Self {
        let mut a = BestFit {
            capacity: capacity_bytes,
            by_size: BTreeSet::new(),
            by_offset: BTreeMap::new(),
            used: FxHashMap::default(),
            free_bytes: 0,
        };
        if capacity_bytes > 0 {
            a.insert_free(0, capacity_bytes);
        }
        a
    }

    /// Free ranges as `(offset, bytes)`, in address order (for reports and tests).
    pub fn free_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_offset.iter().map(|(&o, &s)| (o, s))
    }

    fn insert_free(&mut self, offset: u64, size: u64) {
        self.by_size.insert((size, offset));
        self.by_offset.insert(offset, size);
        self.free_bytes += size;
    }

    fn remove_free(&mut self, offset: u64, size: u64) {
        self.by_size.remove(&(size, offset));
        self.by_offset.remove(&offset);
        self.free_bytes -= size;
    }

    fn largest_free(&self) -> u64 {
        self.by_size.last().map_or(0, |&(s, _)| s)
    }

    fn oom(&self, size: u64) -> AllocError {
        AllocError::OutOfMemory {
            requested_bytes: size,
            free_bytes: self.free_bytes,
            largest_free_bytes: self.largest_free(),
        }
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
        let found = self.by_size.range((size, 0)..).find_map(|&(s, o)| {
            let a = align_up(o, align)?;
            let pad = a - o;
            (pad <= s && s - pad >= size).then_some((s, o, a))
        });
        let (s, o, a) = found.ok_or_else(|| self.oom(size_bytes))?;
        self.remove_free(o, s);
        if a > o {
            self.insert_free(o, a - o);
        }
        let end = a + size;
        if end < o + s {
            self.insert_free(end, o + s - end);
        }
        self.used.insert(a, size);
        Ok((a, size))
    }

    fn deallocate(&mut self, offset: u64) -> Result<u64, AllocError> {
        let Some(size) = self.used.remove(&offset) else {
            return Err(AllocError::UnknownBlock { addr: offset });
        };
        let mut start = offset;
        let mut len = size;
        if let Some((&po, &ps)) = self.by_offset.range(..offset).next_back() {
            if po + ps == offset {
                self.remove_free(po, ps);
                start = po;
                len += ps;
            }
        }
        if let Some(&ns) = self.by_offset.get(&(offset + size)) {
            self.remove_free(offset + size, ns);
            len += ns;
        }
        self.insert_free(start, len);
        Ok(size)
    }

    fn report(&self) -> ArenaReport {
        ArenaReport {
            free_bytes: self.free_bytes,
            largest_free_bytes: self.largest_free(),
            allocations: self.used.len() as u64,
        }
    }

    fn validate(&self) -> Result<(), AllocError> {
        let err = |m: String| AllocError::Internal(format!("best-fit: {m}"));
        if self.by_size.len() != self.by_offset.len() {
            return Err(err(format!(
                "{} ranges by size, {} by offset",
                self.by_size.len(),
                self.by_offset.len()
            )));
        }
        for &(s, o) in &self.by_size {
            if self.by_offset.get(&o) != Some(&s) {
                return Err(err(format!("free range {o}+{s} missing by offset")));
            }
        }
        let mut ranges: Vec<(u64, u64, bool)> = self
            .by_offset
            .iter()
            .map(|(&o, &s)| (o, s, false))
            .chain(self.used.iter().map(|(&o, &s)| (o, s, true)))
            .collect();
        ranges.sort_unstable();
        let mut end = 0u64;
        let mut prev_free = false;
        let mut free_sum = 0u64;
        for &(o, s, used) in &ranges {
            if o != end {
                return Err(err(format!("range at {o} should start at {end}")));
            }
            if s == 0 {
                return Err(err(format!("empty range at {o}")));
            }
            if !used && prev_free {
                return Err(err(format!(
                    "free range at {o} not merged with the one before"
                )));
            }
            if !used {
                free_sum += s;
            }
            prev_free = !used;
            end = o
                .checked_add(s)
                .ok_or_else(|| err(format!("range at {o} overflows")))?;
        }
        if end != self.capacity {
            return Err(err(format!("ranges cover {end} of {} B", self.capacity)));
        }
        if free_sum != self.free_bytes {
            return Err(err(format!(
                "free ranges hold {free_sum} B, counter says {}",
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
}
