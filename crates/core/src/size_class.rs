//! Size classes of the TLSF arena ([`crate::tlsf::Tlsf`]): the two-level index of
//! Masmano et al., "TLSF: a New Dynamic Memory Allocator for Real-Time Systems" (ECRTS 2004),
//! laid out as in offset-allocator (a tiny floating-point number: exponent, then mantissa).
//!
//! A size in bytes maps to a *bin* `first_level * SL_COUNT + second_level`:
//! - sizes below [`SL_COUNT`] are exact (first level 0, second level = the size);
//! - a larger size with highest set bit `l` has first level `l - SL_BITS + 1` and second level
//!   the [`SL_BITS`] bits right below bit `l`, so each power-of-two range is cut into
//!   [`SL_COUNT`] equal slices.
//!
//! Every block in bin `b` has at least [`bin_min_bytes`]`(b)` bytes and fewer than
//! `bin_min_bytes(b + 1)`. Free blocks go to [`bin_floor`] of their size; a request of `n`
//! bytes searches from [`bin_ceil`]`(n)` upward, where every block is large enough.

/// Bits of the second level: each power-of-two range is cut into `2^SL_BITS` slices.
pub const SL_BITS: u32 = 4;
/// Slices per power-of-two range (16).
pub const SL_COUNT: u32 = 1 << SL_BITS;
/// Mask of the second-level part of a bin index.
pub const SL_MASK: u32 = SL_COUNT - 1;
/// First-level classes: one linear class below `SL_COUNT` bytes, then one per power of two
/// from `2^SL_BITS` to `2^63` (61).
pub const FL_COUNT: u32 = u64::BITS - SL_BITS + 1;
/// Bins in all (976).
pub const BIN_COUNT: u32 = FL_COUNT * SL_COUNT;

/// The bin a free block of `size_bytes` belongs to (rounds down): the last bin whose
/// [`bin_min_bytes`] is ≤ `size_bytes`.
pub fn bin_floor(size_bytes: u64) -> u32 {
    if size_bytes < u64::from(SL_COUNT) {
        // Exact classes; the cast is lossless because the value is below 16.
        return size_bytes as u32;
    }
    let top = u64::BITS - 1 - size_bytes.leading_zeros(); // ≥ SL_BITS
    let fl = top - SL_BITS + 1;
    // The SL_BITS bits right below the top bit; masking makes the cast lossless.
    let sl = ((size_bytes >> (top - SL_BITS)) & u64::from(SL_MASK)) as u32;
    (fl << SL_BITS) | sl
}

/// The first bin all of whose blocks hold at least `size_bytes` (rounds up); `None` when
/// no bin does (sizes above the last bin's minimum).
pub fn bin_ceil(size_bytes: u64) -> Option<u32> {
    let b = bin_floor(size_bytes);
    if bin_min_bytes(b) == size_bytes {
        Some(b)
    } else if b + 1 < BIN_COUNT {
        Some(b + 1)
    } else {
        None
    }
}

/// The smallest size, in bytes, that belongs to `bin` (`bin < BIN_COUNT`).
pub fn bin_min_bytes(bin: u32) -> u64 {
    let fl = bin >> SL_BITS;
    let sl = u64::from(bin & SL_MASK);
    if fl == 0 {
        sl
    } else {
        (u64::from(SL_COUNT) | sl) << (fl - 1)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
