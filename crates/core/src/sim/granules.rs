//! The reserved virtual ranges of a [`super::SimDevice`] and the mappings in them, granule by
//! granule: what cuMemMap, cuMemSetAccess and cuMemUnmap check and change.

use crate::device::PhysHandle;

/// A mapping (whether access was granted is a bit of [`Reserved::access`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Mapping {
    /// Never 0 (a mapping is at least a granule): the niche makes a slot 16 bytes.
    pub(super) bytes: std::num::NonZeroU64,
    pub(super) handle: PhysHandle,
}

/// Slots per chunk of a [`GranuleMap`] (a power of two).
pub(super) const MAP_CHUNK: usize = 256;

/// One chunk of a [`GranuleMap`].
pub(super) type MapChunk = Box<[Option<Mapping>; MAP_CHUNK]>;

/// The mappings of one reserved range by the granule they start at: chunks of
/// [`MAP_CHUNK`] slots, each allocated when one of its slots is first written, the chunk
/// index grown on demand (a range costs nothing until mapped, however large). A look-up is
/// two indexings, not a hash: cuMemMap, cuMemSetAccess and cuMemUnmap walk a range mapping
/// by mapping from its start.
#[derive(Debug, Clone, Default)]
pub(super) struct GranuleMap {
    pub(super) chunks: Vec<Option<MapChunk>>,
}

impl GranuleMap {
    /// The slot of granule `i`, if its chunk is allocated.
    #[inline(always)]
    pub(super) fn slot(&self, i: u64) -> Option<&Option<Mapping>> {
        let i = usize::try_from(i).ok()?;
        let chunk = self.chunks.get(i / MAP_CHUNK)?.as_ref()?;
        Some(&chunk[i % MAP_CHUNK])
    }

    /// The slot of granule `i`, to write, if its chunk is allocated.
    #[inline(always)]
    pub(super) fn slot_mut(&mut self, i: u64) -> Option<&mut Option<Mapping>> {
        let i = usize::try_from(i).ok()?;
        let chunk = self.chunks.get_mut(i / MAP_CHUNK)?.as_mut()?;
        Some(&mut chunk[i % MAP_CHUNK])
    }

    /// The mapping starting at granule `i`.
    #[inline(always)]
    pub(super) fn get(&self, i: u64) -> Option<&Mapping> {
        self.slot(i)?.as_ref()
    }

    /// Records `m` as the mapping starting at granule `i`.
    #[inline(always)]
    pub(super) fn insert(&mut self, i: u64, m: Mapping) {
        // The chunk is there (the common case): one write.
        match self.slot_mut(i) {
            Some(slot) => *slot = Some(m),
            None => self.insert_in_new_chunk(i, m),
        }
    }

    /// [`GranuleMap::insert`] where the chunk of granule `i` is not allocated yet.
    #[cold]
    #[inline(never)]
    pub(super) fn insert_in_new_chunk(&mut self, i: u64, m: Mapping) {
        let Ok(i) = usize::try_from(i) else {
            return;
        };
        let c = i / MAP_CHUNK;
        if c >= self.chunks.len() {
            self.chunks.resize_with(c + 1, || None);
        }
        if let Some(chunk) = self.chunks.get_mut(c) {
            let chunk = chunk.get_or_insert_with(|| Box::new([None; MAP_CHUNK]));
            chunk[i % MAP_CHUNK] = Some(m);
        }
    }

    /// Takes the mappings that follow each other from granule `first` (each starting where
    /// the one before ends, mappings of `1 << sh`-byte granules) until granule `end` or
    /// the first granule where none starts, passing each to `f`; returns the granule where
    /// it stopped. One chunk look-up per chunk crossed, not per mapping.
    #[inline(always)]
    pub(super) fn take_run(
        &mut self,
        first: u64,
        end: u64,
        sh: u32,
        mut f: impl FnMut(Mapping),
    ) -> u64 {
        let chunk_slots = MAP_CHUNK as u64;
        let mut gi = first;
        'chunks: while gi < end {
            let Ok(i) = usize::try_from(gi) else {
                break;
            };
            let Some(Some(chunk)) = self.chunks.get_mut(i / MAP_CHUNK) else {
                break;
            };
            let chunk_end = (gi / chunk_slots + 1) * chunk_slots;
            loop {
                let Some(m) = chunk[(gi % chunk_slots) as usize].take() else {
                    break 'chunks;
                };
                f(m);
                gi += m.bytes.get() >> sh;
                if gi >= end {
                    break 'chunks;
                }
                if gi >= chunk_end {
                    continue 'chunks;
                }
            }
        }
        gi
    }

    /// Takes the mapping starting at granule `i`.
    #[inline(always)]
    pub(super) fn remove(&mut self, i: u64) -> Option<Mapping> {
        self.slot_mut(i)?.take()
    }
}

/// 64 granules' state in a reserved range: bit `i` of `mapped` is set when granule `i`
/// is under a mapping, of `starts` when a mapping starts there (it has a slot in the
/// [`GranuleMap`]), of `access` when its mapping was made accessible by cuMemSetAccess
/// (set on whole mappings, cleared at their unmap). `starts` and `access` are subsets of
/// `mapped`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct GranuleBits {
    pub(super) mapped: u64,
    pub(super) starts: u64,
    pub(super) access: u64,
}

/// A reserved virtual range: where it starts, its size, which of its granules are mapped
/// and accessible, and the mappings in it.
#[derive(Debug, Clone)]
pub(super) struct Reserved {
    pub(super) start: u64,
    pub(super) bytes: u64,
    /// The range's granules, 64 a word (what the overlap check of cuMemMap and the tiling
    /// check of cuMemUnmap and cuMemSetAccess read, instead of an ordered search of the
    /// mappings). Grown as granules are mapped (a missing word is all unmapped): a large
    /// range costs nothing until mapped, and a range mapped from its start (expandable
    /// segments) touches a few words, not a bitmap of the whole range.
    pub(super) bits: Vec<GranuleBits>,
    /// Granules mapped (cuMemAddressFree refuses a range with any).
    pub(super) mapped_granules: u64,
    /// Live mappings in the range, by first granule.
    pub(super) maps: GranuleMap,
}

impl Reserved {
    pub(super) fn new(start: u64, bytes: u64) -> Self {
        Reserved {
            start,
            bytes,
            bits: Vec::new(),
            mapped_granules: 0,
            maps: GranuleMap::default(),
        }
    }

    /// Calls `f(word, mask of the span's bits in it)` for each bitmap word that granules
    /// `[first, first + n)` touch, in order, while it returns `true`; whether every call
    /// did. A plain loop: one word for a span inside one (the common case).
    #[inline(always)]
    pub(super) fn words(first: u64, n: u64, mut f: impl FnMut(usize, u64) -> bool) -> bool {
        if n == 0 {
            return true;
        }
        let last = first + (n - 1);
        let (w0, b0) = (first / 64, first % 64);
        let (w1, b1) = (last / 64, last % 64);
        // Words of granules in a range held in memory fit a usize.
        let (w0, w1) = (w0 as usize, w1 as usize);
        if w0 == w1 {
            return f(w0, (u64::MAX >> (63 - (b1 - b0))) << b0);
        }
        if !f(w0, u64::MAX << b0) {
            return false;
        }
        for w in w0 + 1..w1 {
            if !f(w, u64::MAX) {
                return false;
            }
        }
        f(w1, u64::MAX >> (63 - b1))
    }

    /// `(word, mask)` when granules `[first, first + n)` lie in one bitmap word (the common
    /// case: a mapping of fewer than 64 granules).
    #[inline(always)]
    pub(super) fn one_word(first: u64, n: u64) -> Option<(usize, u64)> {
        let b = first % 64;
        // 1 ≤ n ≤ 64 - b (`n - 1` wraps above for n = 0): `n` ones from bit `b`.
        (n.wrapping_sub(1) < 64 - b).then(|| ((first / 64) as usize, (u64::MAX >> (64 - n)) << b))
    }

    /// Whether any granule of `[first, first + n)` is mapped.
    #[inline(always)]
    pub(super) fn any_mapped(&self, first: u64, n: u64) -> bool {
        !Self::words(first, n, |w, mask| {
            self.bits.get(w).is_none_or(|x| x.mapped & mask == 0)
        })
    }

    /// Whether every granule of `[first, first + n)` is mapped.
    #[inline(always)]
    pub(super) fn all_mapped(&self, first: u64, n: u64) -> bool {
        Self::words(first, n, |w, mask| {
            self.bits.get(w).is_some_and(|x| x.mapped & mask == mask)
        })
    }

    /// Whether granule `i`'s bit is set in the bitmap `field` picks (mapped, starts, access).
    #[inline(always)]
    pub(super) fn bit(&self, i: u64, field: impl Fn(&GranuleBits) -> u64) -> bool {
        let w = usize::try_from(i / 64).unwrap_or(usize::MAX);
        self.bits
            .get(w)
            .is_some_and(|x| field(x) >> (i % 64) & 1 != 0)
    }

    /// Whether granule `i` is mapped.
    #[inline(always)]
    pub(super) fn is_mapped(&self, i: u64) -> bool {
        self.bit(i, |x| x.mapped)
    }

    /// Whether a mapping starts at granule `i`.
    #[inline(always)]
    pub(super) fn starts_at(&self, i: u64) -> bool {
        self.bit(i, |x| x.starts)
    }

    /// Whether mappings tile granules `[first, first + n)` exactly (`n` ≥ 1): what the walk
    /// of [`SimDevice::check_tiled_in`] accepts, from the bitmaps instead of a look-up per
    /// mapping. Mappings are runs of granules that never overlap, each starting where its
    /// `starts` bit is, and `mapped` is their union; so the walk from `first` steps from
    /// mapping to mapping exactly when a mapping starts at `first` and every granule up to
    /// `first + n` is mapped, and it stops on `first + n` exactly when no mapping runs
    /// across it (that granule is unmapped, or a mapping starts there).
    #[inline(always)]
    pub(super) fn tiles(&self, first: u64, n: u64) -> bool {
        let end = first + n;
        let end_ok = |x: &GranuleBits| {
            let b = end % 64;
            (x.mapped & !x.starts) >> b & 1 == 0
        };
        if let Some((w, mask)) = Self::one_word(first, n) {
            // The whole span in one word: its start bit, its mapped bits, and the granule
            // after it in the same word or the next.
            let Some(x) = self.bits.get(w) else {
                return false;
            };
            if x.mapped & mask != mask || x.starts >> (first % 64) & 1 == 0 {
                return false;
            }
            let we = usize::try_from(end / 64).unwrap_or(usize::MAX);
            return if we == w {
                end_ok(x)
            } else {
                self.bits.get(we).is_none_or(end_ok)
            };
        }
        self.starts_at(first)
            && self.all_mapped(first, n)
            && (!self.is_mapped(end) || self.starts_at(end))
    }

    /// Whether granule `i` was made accessible.
    pub(super) fn granted(&self, i: u64) -> bool {
        self.bit(i, |x| x.access)
    }

    /// Grows the bitmap to hold granules below `end`.
    #[inline(always)]
    pub(super) fn cover(&mut self, end: u64) {
        let words = usize::try_from(end.div_ceil(64)).unwrap_or(usize::MAX);
        if words > self.bits.len() {
            self.bits.resize(words, GranuleBits::default());
        }
    }

    /// Makes granules `[first, first + n)` accessible (whole mappings).
    #[inline(always)]
    pub(super) fn grant(&mut self, first: u64, n: u64) {
        self.cover(first + n);
        let bits = &mut self.bits;
        Self::words(first, n, |w, mask| {
            if let Some(x) = bits.get_mut(w) {
                x.access |= mask;
            }
            true
        });
    }

    /// Marks granules `[first, first + n)` mapped, by one mapping starting at `first`.
    #[inline(always)]
    pub(super) fn set_mapped(&mut self, first: u64, n: u64) {
        self.cover(first + n);
        let bits = &mut self.bits;
        Self::words(first, n, |w, mask| {
            if let Some(x) = bits.get_mut(w) {
                x.mapped |= mask;
            }
            true
        });
        let w = usize::try_from(first / 64).unwrap_or(usize::MAX);
        if let Some(x) = self.bits.get_mut(w) {
            x.starts |= 1 << (first % 64);
        }
        self.mapped_granules += n;
    }

    /// Marks granules `[first, first + n)` unmapped (no mapping starts there, none is
    /// accessible).
    #[inline(always)]
    pub(super) fn clear_mapped(&mut self, first: u64, n: u64) {
        let bits = &mut self.bits;
        Self::words(first, n, |w, mask| {
            if let Some(x) = bits.get_mut(w) {
                x.mapped &= !mask;
                x.starts &= !mask;
                x.access &= !mask;
            }
            true
        });
        self.mapped_granules = self.mapped_granules.saturating_sub(n);
    }
}

/// Index of the range of `reserved` (in address order) holding `va`.
#[inline(always)]
pub(super) fn reserved_at(reserved: &[Reserved], va: u64) -> Option<usize> {
    let i = reserved.partition_point(|r| r.start <= va).checked_sub(1)?;
    let r = reserved.get(i)?;
    (va - r.start < r.bytes).then_some(i)
}

/// Index of the range of `reserved` (in address order) holding all of `[va, va+bytes)`.
#[inline(always)]
pub(super) fn reserved_holding(reserved: &[Reserved], va: u64, bytes: u64) -> Option<usize> {
    let i = reserved_at(reserved, va)?;
    let r = reserved.get(i)?;
    va.checked_add(bytes)
        .is_some_and(|e| e <= r.start + r.bytes)
        .then_some(i)
}

/// [`reserved_holding`] trying range `*last` first (a pool's calls fall in one or two
/// ranges), and remembering in `*last` the range found: `(its index, offset of va in it)`.
#[inline(always)]
pub(super) fn reserved_holding_from(
    reserved: &[Reserved],
    last: &mut usize,
    va: u64,
    bytes: u64,
) -> Option<(usize, u64)> {
    if let Some(r) = reserved.get(*last) {
        let off = va.wrapping_sub(r.start);
        if off < r.bytes {
            // Ranges do not overlap: this is the one holding `va`.
            return (bytes <= r.bytes - off).then_some((*last, off));
        }
    }
    reserved_holding_elsewhere(reserved, last, va, bytes)
}

/// [`reserved_holding_from`] when `va` is not in range `*last`.
#[inline(never)]
pub(super) fn reserved_holding_elsewhere(
    reserved: &[Reserved],
    last: &mut usize,
    va: u64,
    bytes: u64,
) -> Option<(usize, u64)> {
    let i = reserved_holding(reserved, va, bytes)?;
    *last = i;
    Some((i, va - reserved.get(i)?.start))
}
