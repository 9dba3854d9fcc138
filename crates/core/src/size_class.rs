//! Log-linear size classes, the one binning of gpumem: the two-level index of TLSF
//! (Masmano et al., "TLSF: a New Dynamic Memory Allocator for Real-Time Systems", ECRTS 2004),
//! laid out as in offset-allocator (a tiny floating-point number: exponent, then mantissa),
//! and parametrised, as rlsf's `map_floor`/`map_ceil`, by the bits of the second level.
//! Users: the TLSF arena's bins ([`TlsfBins`], 16 slices per power of two), the device pool's
//! size classes (4 per power of two, `gpumem::pool`) and the pinned pool's (32 per power of
//! two in whole pages, `gpumem::pinned::size_class`).
//!
//! With `B = SUB_BITS`, a size in bytes maps to a *bin* `first_level * 2^B + second_level`:
//! - sizes below `2^B` are exact (first level 0, second level = the size);
//! - a larger size with highest set bit `l` has first level `l - B + 1` and second level
//!   the `B` bits right below bit `l`, so each power-of-two range is cut into `2^B` equal
//!   slices, and rounding up to a bin wastes less than `1 / 2^B` of the size.
//!
//! Every size in bin `b` is at least [`LogLinear::min_bytes`]`(b)` and below
//! `min_bytes(b + 1)`. A free block goes to [`LogLinear::floor`] of its size; a request of
//! `n` bytes searches from [`LogLinear::ceil`]`(n)` upward, where every block is large enough.

/// The log-linear binning with `2^SUB_BITS` slices per power of two (see the module docs).
/// A type without values: everything is an associated constant or function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLinear<const SUB_BITS: u32>;

impl<const SUB_BITS: u32> LogLinear<SUB_BITS> {
    /// Bits of the second level.
    pub const SUB_BITS: u32 = SUB_BITS;
    /// Slices per power-of-two range.
    pub const SUB_COUNT: u32 = 1 << SUB_BITS;
    /// Mask of the second-level part of a bin index.
    pub const SUB_MASK: u32 = Self::SUB_COUNT - 1;
    /// First-level classes: one linear class below `SUB_COUNT` bytes, then one per power of
    /// two from `2^SUB_BITS` to `2^63`.
    pub const FL_COUNT: u32 = u64::BITS - SUB_BITS + 1;
    /// Bins in all.
    pub const BIN_COUNT: u32 = Self::FL_COUNT * Self::SUB_COUNT;

    /// The bin a free block of `size_bytes` belongs to (rounds down): the last bin whose
    /// [`Self::min_bytes`] is ≤ `size_bytes`.
    #[inline]
    pub const fn floor(size_bytes: u64) -> u32 {
        if size_bytes < Self::SUB_COUNT as u64 {
            // Exact classes; the cast is lossless because the value is below SUB_COUNT.
            return size_bytes as u32;
        }
        let top = u64::BITS - 1 - size_bytes.leading_zeros(); // ≥ SUB_BITS
        let fl = top - SUB_BITS + 1;
        // The SUB_BITS bits right below the top bit; masking makes the cast lossless.
        let sl = ((size_bytes >> (top - SUB_BITS)) & Self::SUB_MASK as u64) as u32;
        (fl << SUB_BITS) | sl
    }

    /// The first bin all of whose sizes are at least `size_bytes` (rounds up); `None` when no
    /// bin does (sizes above the last bin's minimum).
    #[inline]
    pub const fn ceil(size_bytes: u64) -> Option<u32> {
        let b = Self::floor(size_bytes);
        if Self::min_bytes(b) == size_bytes {
            Some(b)
        } else if b + 1 < Self::BIN_COUNT {
            Some(b + 1)
        } else {
            None
        }
    }

    /// The smallest size, in bytes, that belongs to `bin` (`bin < BIN_COUNT`).
    #[inline]
    pub const fn min_bytes(bin: u32) -> u64 {
        let fl = bin >> SUB_BITS;
        let sl = (bin & Self::SUB_MASK) as u64;
        if fl == 0 {
            sl
        } else {
            (Self::SUB_COUNT as u64 | sl) << (fl - 1)
        }
    }

    /// `size_bytes` rounded up to the smallest size of its [`Self::ceil`] bin; `None` past the
    /// last bin. The same as `min_bytes(ceil(size))` (the property test checks it), computed
    /// with one mask: the step of the range holding `size - 1` is a power of two.
    #[inline]
    pub const fn round_up(size_bytes: u64) -> Option<u64> {
        if size_bytes <= Self::SUB_COUNT as u64 {
            return Some(size_bytes);
        }
        let p = u64::BITS - 1 - (size_bytes - 1).leading_zeros(); // ≥ SUB_BITS
        let mask = (1u64 << (p - SUB_BITS)) - 1;
        match size_bytes.checked_add(mask) {
            Some(x) => Some(x & !mask),
            None => None,
        }
    }
}

/// Bits of the TLSF arena's second level: each power-of-two range is cut into 16 slices.
pub const SL_BITS: u32 = 4;
/// The TLSF arena's bins.
pub type TlsfBins = LogLinear<SL_BITS>;
/// Slices per power-of-two range of the TLSF bins (16).
pub const SL_COUNT: u32 = TlsfBins::SUB_COUNT;
/// Mask of the second-level part of a TLSF bin index.
pub const SL_MASK: u32 = TlsfBins::SUB_MASK;
/// First-level classes of the TLSF bins (61).
pub const FL_COUNT: u32 = TlsfBins::FL_COUNT;
/// TLSF bins in all (976).
pub const BIN_COUNT: u32 = TlsfBins::BIN_COUNT;

/// [`LogLinear::floor`] of the TLSF bins.
#[inline]
pub fn bin_floor(size_bytes: u64) -> u32 {
    TlsfBins::floor(size_bytes)
}

/// [`LogLinear::ceil`] of the TLSF bins.
#[inline]
pub fn bin_ceil(size_bytes: u64) -> Option<u32> {
    TlsfBins::ceil(size_bytes)
}

/// [`LogLinear::min_bytes`] of the TLSF bins.
#[inline]
pub fn bin_min_bytes(bin: u32) -> u64 {
    TlsfBins::min_bytes(bin)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The one property check, for any binning: floor and ceil bracket the size, a bin's
    /// minimum maps back to it, rounding up wastes less than `1 / 2^B` of the size, and bins
    /// are ordered.
    fn check_binning<const B: u32>(n: u64) -> Result<(), TestCaseError> {
        type L<const B: u32> = LogLinear<B>;
        let f = L::<B>::floor(n);
        prop_assert!(f < L::<B>::BIN_COUNT);
        prop_assert!(L::<B>::min_bytes(f) <= n);
        if f + 1 < L::<B>::BIN_COUNT {
            prop_assert!(L::<B>::min_bytes(f + 1) > n);
        }
        prop_assert_eq!(L::<B>::floor(L::<B>::min_bytes(f)), f);
        match L::<B>::ceil(n) {
            Some(c) => {
                prop_assert!(c == f || c == f + 1);
                let up = L::<B>::min_bytes(c);
                prop_assert!(up >= n);
                prop_assert_eq!(L::<B>::round_up(n), Some(up));
                // Waste below 1/2^B of the size (exact below 2^B).
                prop_assert!(((up - n) as u128) << B < (n as u128).max(1) || up == n);
                prop_assert!(c == 0 || L::<B>::min_bytes(c - 1) < n);
            }
            None => {
                prop_assert!(n > L::<B>::min_bytes(L::<B>::BIN_COUNT - 1));
                prop_assert_eq!(L::<B>::round_up(n), None);
            }
        }
        Ok(())
    }

    /// Every size below 2^16 and every power of two and its neighbours, for each binning used.
    #[test]
    fn round_up_is_the_ceil_bins_minimum() {
        fn check<const B: u32>(n: u64) {
            let want = LogLinear::<B>::ceil(n).map(LogLinear::<B>::min_bytes);
            assert_eq!(LogLinear::<B>::round_up(n), want, "B = {B}, n = {n}");
        }
        let edges = (0..64).flat_map(|e| {
            let p = 1u64 << e;
            [p - 1, p, p + 1, p.saturating_mul(3) / 2, u64::MAX - p + 1]
        });
        for n in (0u64..1 << 16).chain(edges).chain([u64::MAX]) {
            check::<2>(n);
            check::<4>(n);
            check::<5>(n);
        }
    }

    proptest! {
        #[test]
        fn every_binning_brackets_and_bounds_waste(
            n in prop_oneof![0u64..1 << 20, any::<u64>(), (0u32..64).prop_map(|e| 1u64 << e)]
        ) {
            check_binning::<2>(n)?;
            check_binning::<4>(n)?;
            check_binning::<5>(n)?;
        }
    }

    #[test]
    fn layout_constants() {
        assert_eq!(SL_COUNT, 16);
        assert_eq!(FL_COUNT, 61);
        assert_eq!(BIN_COUNT, 976);
        assert_eq!(bin_floor(u64::MAX), BIN_COUNT - 1);
        assert_eq!(bin_min_bytes(BIN_COUNT - 1), 31 << 59);
    }

    /// Every bin: its minimum maps back to it (round trip), the byte before it maps to the
    /// previous bin, and minima strictly increase.
    #[test]
    fn every_bin_round_trips() {
        for b in 0..BIN_COUNT {
            let m = bin_min_bytes(b);
            assert_eq!(bin_floor(m), b, "floor of the minimum of bin {b}");
            assert_eq!(bin_ceil(m), Some(b), "ceil of the minimum of bin {b}");
            if b > 0 {
                assert!(bin_min_bytes(b - 1) < m);
                assert_eq!(bin_floor(m - 1), b - 1, "byte below bin {b}");
                if m - 1 > bin_min_bytes(b - 1) {
                    assert_eq!(bin_ceil(m - 1), Some(b));
                }
            }
            if b + 1 < BIN_COUNT {
                let next = bin_min_bytes(b + 1);
                assert_eq!(bin_floor(next - 1), b, "last byte of bin {b}");
            }
        }
        assert_eq!(bin_ceil(u64::MAX), None);
        assert_eq!(bin_ceil((31 << 59) + 1), None);
    }

    /// Every size below 2^20 exhaustively, and both rounding directions.
    #[test]
    fn floor_and_ceil_bracket_every_small_size() {
        for n in 0u64..(1 << 20) {
            let f = bin_floor(n);
            assert!(bin_min_bytes(f) <= n);
            assert!(bin_min_bytes(f + 1) > n);
            let c = bin_ceil(n).unwrap();
            assert!(bin_min_bytes(c) >= n);
            assert!(c == f || c == f + 1);
            assert!(c == 0 || bin_min_bytes(c - 1) < n);
        }
    }
}

/// Which bins of [`LogLinear<4>`] (16 bins per power of two) are non-empty: a first-level
/// bitmap (one bit per power of two) over second-level ones (one bit per bin), so the first
/// non-empty bin at or above a size and the highest non-empty bin are found in O(1) (the
/// bitmaps of TLSF, Masmano et al. 2004). Shared by the TLSF and best-fit arenas and `paged-lazy`'s
/// index of mapped runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BinBitmap {
    /// Bit `fl`: some bin of first level `fl` is non-empty.
    fl: u64,
    /// Per first level, bit `sl`: bin `fl · 16 + sl` is non-empty.
    sl: [u16; BinBitmap::SL_SLOTS],
}

// One `u16` second-level bitmap per first level, one `u64` first-level bitmap.
const _: () = assert!(
    LogLinear::<4>::SUB_COUNT == u16::BITS
        && LogLinear::<4>::FL_COUNT as usize <= BinBitmap::SL_SLOTS
);

impl Default for BinBitmap {
    fn default() -> Self {
        BinBitmap {
            fl: 0,
            sl: [0; BinBitmap::SL_SLOTS],
        }
    }
}

impl BinBitmap {
    /// Entries of the second-level table (first levels rounded up to a power of two).
    pub(crate) const SL_SLOTS: usize = 64;
    const SUB_BITS: u32 = 4;
    const SUB_MASK: u32 = LogLinear::<4>::SUB_MASK;

    /// Index of first level `fl` in the second-level table (the mask is a no-op for every
    /// valid first level).
    #[inline]
    fn slot(fl: u32) -> usize {
        fl as usize & (Self::SL_SLOTS - 1)
    }

    /// Marks `bin` non-empty.
    #[inline]
    pub(crate) fn set(&mut self, bin: u32) {
        let fl = bin >> Self::SUB_BITS;
        self.fl |= 1 << fl;
        self.sl[Self::slot(fl)] |= 1 << (bin & Self::SUB_MASK);
    }

    /// Marks `bin` empty.
    #[inline]
    pub(crate) fn clear(&mut self, bin: u32) {
        let fl = bin >> Self::SUB_BITS;
        let sl = &mut self.sl[Self::slot(fl)];
        *sl &= !(1 << (bin & Self::SUB_MASK));
        if *sl == 0 {
            self.fl &= !(1 << fl);
        }
    }

    /// Whether `bin` is marked non-empty.
    pub(crate) fn is_set(&self, bin: u32) -> bool {
        let fl = bin >> Self::SUB_BITS;
        self.sl[Self::slot(fl)] & (1 << (bin & Self::SUB_MASK)) != 0
    }

    /// Whether every first-level bit says what its second-level bitmap says (for the
    /// invariant checks); the first level that disagrees otherwise.
    pub(crate) fn first_level_disagreement(&self) -> Option<u32> {
        (0..Self::SL_SLOTS as u32)
            .find(|&fl| (self.fl & (1 << fl) != 0) != (self.sl[Self::slot(fl)] != 0))
    }

    /// The first non-empty bin ≥ `bin`.
    #[inline]
    pub(crate) fn next_nonempty(&self, bin: u32) -> Option<u32> {
        if bin >= LogLinear::<4>::BIN_COUNT {
            return None;
        }
        let fl = bin >> Self::SUB_BITS;
        let sl_map = u32::from(self.sl[Self::slot(fl)]) & (u32::MAX << (bin & Self::SUB_MASK));
        if sl_map != 0 {
            return Some((fl << Self::SUB_BITS) | sl_map.trailing_zeros());
        }
        let fl_map = if fl + 1 >= 64 {
            0
        } else {
            self.fl & (u64::MAX << (fl + 1))
        };
        if fl_map == 0 {
            return None;
        }
        let fl2 = fl_map.trailing_zeros();
        let sl2 = u32::from(self.sl[Self::slot(fl2)]).trailing_zeros();
        Some((fl2 << Self::SUB_BITS) | sl2)
    }

    /// The highest non-empty bin, if any.
    #[inline]
    pub(crate) fn last(&self) -> Option<u32> {
        if self.fl == 0 {
            return None;
        }
        let fl = 63 - self.fl.leading_zeros();
        let sl = 15 - self.sl[Self::slot(fl)].leading_zeros();
        Some((fl << Self::SUB_BITS) | sl)
    }
}
