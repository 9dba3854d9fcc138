//! A sparse page table: one `Option<T>` slot per page of a reservation, held in chunks of
//! [`CHUNK_SLOTS`] that are allocated when a slot in them is first written.
//!
//! A reservation spans `2 × capacity` of virtual addresses (143 k pages of 2 MiB for an
//! H200) while the pages mapped at any time are a few thousand, at both ends of it (the
//! placement scores both ends of every free range, so blocks land at the top of the
//! reservation too). A flat `Vec<Option<Page>>` (24 bytes a slot, not all-zero when `None`)
//! is 3.4 MiB written out and faulted in by the first allocation that touches the top; the
//! chunks cost 12 KiB each, only where pages are mapped.

/// Slots per chunk (a power of two).
pub(crate) const CHUNK_SLOTS: usize = 512;

/// [`CHUNK_SLOTS`] slots on the heap.
type Chunk<T> = Box<[Option<T>; CHUNK_SLOTS]>;

/// A chunk of `None` slots (out of line: a table allocates a chunk a few times a replay,
/// and writes slots on every allocation).
#[cold]
#[inline(never)]
fn new_chunk<T: Copy>() -> Chunk<T> {
    // Written in place on the heap (`Box::new` of the array would build it on the stack
    // and copy its 12 KiB).
    match vec![None; CHUNK_SLOTS].into_boxed_slice().try_into() {
        Ok(chunk) => chunk,
        Err(_) => Box::new([None; CHUNK_SLOTS]),
    }
}

/// One `Option<T>` per page; see the module documentation.
#[derive(Debug, Clone)]
pub(crate) struct SlotTable<T> {
    /// `chunks[c]` holds slots `c · CHUNK_SLOTS ..`; `None` until one of them is written.
    /// A chunk is an array of fixed length: a slot's index in it needs no bounds check, and
    /// the chunk index holds thin pointers.
    chunks: Vec<Option<Chunk<T>>>,
    /// Number of slots.
    len: usize,
    /// What an unallocated slot reads as.
    none: Option<T>,
    /// What an unallocated chunk reads as.
    nones: Box<[Option<T>]>,
}

impl<T: Copy> SlotTable<T> {
    /// `len` slots, all `None`; allocates only the chunk index.
    pub(crate) fn new(len: usize) -> Self {
        SlotTable {
            chunks: vec![None; len.div_ceil(CHUNK_SLOTS)],
            len,
            none: None,
            nones: vec![None; CHUNK_SLOTS].into_boxed_slice(),
        }
    }

    /// Number of slots.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Slot `i`, `None` past the end.
    pub(crate) fn get(&self, i: usize) -> Option<&Option<T>> {
        if i >= self.len {
            return None;
        }
        match self.chunks.get(i / CHUNK_SLOTS) {
            Some(Some(c)) => Some(&c[i % CHUNK_SLOTS]),
            _ => Some(&self.none),
        }
    }

    /// Slot `i` to write, its chunk allocated if need be; `None` past the end.
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut Option<T>> {
        if i >= self.len {
            return None;
        }
        let chunk = self.chunks.get_mut(i / CHUNK_SLOTS)?;
        if chunk.is_none() {
            *chunk = Some(new_chunk());
        }
        Some(&mut chunk.as_mut()?[i % CHUNK_SLOTS])
    }

    /// Slots `a..b` (clamped to the table) in order.
    pub(crate) fn range(&self, a: usize, b: usize) -> Slots<'_, T> {
        let b = b.min(self.len);
        let a = a.min(b);
        Slots {
            table: self,
            cur: [].iter(),
            chunk: a / CHUNK_SLOTS,
            a,
            b,
        }
    }

    /// Slots `a..b` (clamped to the table) to write, in order; their chunks are allocated.
    pub(crate) fn range_mut(&mut self, a: usize, b: usize) -> SlotsMut<'_, T> {
        let b = b.min(self.len);
        let a = a.min(b);
        let c0 = a / CHUNK_SLOTS;
        let c1 = b.div_ceil(CHUNK_SLOTS);
        SlotsMut {
            chunks: self.chunks.get_mut(c0..c1).unwrap_or_default().iter_mut(),
            cur: [].iter_mut(),
            chunk: c0,
            a,
            b,
        }
    }

    /// The part `lo..hi` of chunk `c` inside slots `a..b`.
    fn chunk_span(c: usize, a: usize, b: usize) -> (usize, usize) {
        let start = c * CHUNK_SLOTS;
        (a.max(start) - start, b.min(start + CHUNK_SLOTS) - start)
    }

    /// `n` (at most [`CHUNK_SLOTS`]) unallocated slots.
    fn nones_slice(&self, n: usize) -> &[Option<T>] {
        self.nones.get(..n).unwrap_or_default()
    }

    /// Every slot in order.
    pub(crate) fn iter(&self) -> Slots<'_, T> {
        self.range(0, self.len)
    }
}

/// The slots of a range, read ([`SlotTable::range`]): a slice iterator per chunk.
#[derive(Debug)]
pub(crate) struct Slots<'a, T> {
    table: &'a SlotTable<T>,
    cur: std::slice::Iter<'a, Option<T>>,
    /// Next chunk to read.
    chunk: usize,
    a: usize,
    b: usize,
}

impl<'a, T: Copy> Iterator for Slots<'a, T> {
    type Item = &'a Option<T>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(s) = self.cur.next() {
                return Some(s);
            }
            let c = self.chunk;
            if c * CHUNK_SLOTS >= self.b {
                return None;
            }
            self.chunk += 1;
            let (lo, hi) = SlotTable::<T>::chunk_span(c, self.a, self.b);
            let slice = match self.table.chunks.get(c) {
                Some(Some(ch)) => ch.get(lo..hi),
                _ => None,
            };
            self.cur = slice
                .unwrap_or_else(|| self.table.nones_slice(hi - lo))
                .iter();
        }
    }
}

/// The slots of a range, to write ([`SlotTable::range_mut`]): a slice iterator per chunk.
#[derive(Debug)]
pub(crate) struct SlotsMut<'a, T> {
    chunks: std::slice::IterMut<'a, Option<Chunk<T>>>,
    cur: std::slice::IterMut<'a, Option<T>>,
    /// Index of the next chunk `chunks` yields.
    chunk: usize,
    a: usize,
    b: usize,
}

impl<'a, T: Copy> Iterator for SlotsMut<'a, T> {
    type Item = &'a mut Option<T>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(s) = self.cur.next() {
                return Some(s);
            }
            let ch = self.chunks.next()?;
            let (lo, hi) = SlotTable::<T>::chunk_span(self.chunk, self.a, self.b);
            self.chunk += 1;
            let ch = ch.get_or_insert_with(new_chunk);
            self.cur = ch.get_mut(lo..hi).unwrap_or_default().iter_mut();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn slots_read_none_until_written_and_chunks_come_on_demand() {
        let mut t: SlotTable<u32> = SlotTable::new(3 * CHUNK_SLOTS + 5);
        assert_eq!(t.len(), 3 * CHUNK_SLOTS + 5);
        assert_eq!(t.get(0), Some(&None));
        assert_eq!(t.get(t.len()), None);
        assert!(t.get_mut(t.len()).is_none());
        *t.get_mut(3 * CHUNK_SLOTS + 4).unwrap() = Some(7);
        *t.get_mut(1).unwrap() = Some(1);
        assert_eq!(t.chunks.iter().filter(|c| c.is_some()).count(), 2);
        assert_eq!(t.get(3 * CHUNK_SLOTS + 4), Some(&Some(7)));
        assert_eq!(t.get(CHUNK_SLOTS), Some(&None));
        let written: Vec<(usize, u32)> = t
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|v| (i, v)))
            .collect();
        assert_eq!(written, [(1, 1), (3 * CHUNK_SLOTS + 4, 7)]);
        assert_eq!(t.iter().count(), t.len());
        // Ranges across chunks, allocated or not, clamped to the table.
        let r: Vec<Option<u32>> = t.range(0, 3).copied().collect();
        assert_eq!(r, [None, Some(1), None]);
        assert_eq!(
            t.range(CHUNK_SLOTS - 2, 3 * CHUNK_SLOTS + 9).count(),
            2 * CHUNK_SLOTS + 7
        );
        let tail: Vec<Option<u32>> = t.range(3 * CHUNK_SLOTS + 3, usize::MAX).copied().collect();
        assert_eq!(tail, [None, Some(7)]);
        for s in t.range_mut(CHUNK_SLOTS - 1, CHUNK_SLOTS + 1) {
            *s = Some(9);
        }
        assert_eq!(t.chunks.iter().filter(|c| c.is_some()).count(), 3);
        let nines = t.iter().filter(|s| **s == Some(9)).count();
        assert_eq!(nines, 2);
        assert_eq!(t.get(CHUNK_SLOTS), Some(&Some(9)));
        *t.get_mut(1).unwrap() = None;
        assert_eq!(t.get(1), Some(&None));
    }
}
