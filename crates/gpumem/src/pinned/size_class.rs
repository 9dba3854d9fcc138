//! Size classes of the pinned pool: 32 sub-classes per power of two, in whole pages.
//!
//! A request of `n` bytes takes `class_bytes(n)`: `n` rounded up to a multiple of
//! `max(2^(floor(log2 n) − SUBCLASS_BITS), PAGE_BYTES)`. For `n ≥ 128 KiB` the step is
//! `2^floor(log2 n) / 32`, so the waste is below `1/32` (≈3.1 %) of the request; below that,
//! to the next 4 KiB page (PyTorch's host allocator rounds to the next power of two: up
//! to 2×). From 128 KiB on the classes are the log-linear binning of
//! [`gpumem_core::size_class::LogLinear`] with 32 slices per power of two. Pure arithmetic.

use gpumem_core::size_class::LogLinear;

/// The page the classes are counted in, in bytes (`mlock` and `cuMemHostAlloc` pin whole pages).
pub const PAGE_BYTES: u64 = 4096;
/// log2 of the number of sub-classes per power of two.
pub const SUBCLASS_BITS: u32 = 5;
/// Sub-classes per power of two (32).
pub const SUBCLASSES: u64 = 1 << SUBCLASS_BITS;
/// The smallest request, in bytes, from which the waste bound `1/SUBCLASSES` holds
/// (the step reaches one page at `PAGE_BYTES × SUBCLASSES` = 128 KiB).
pub const TIGHT_FROM_BYTES: u64 = PAGE_BYTES * SUBCLASSES;

/// The rounding step for a request of `n` bytes, in bytes (a power of two ≥ [`PAGE_BYTES`]).
pub fn step_bytes(n: u64) -> u64 {
    if n <= PAGE_BYTES {
        return PAGE_BYTES;
    }
    let e = 63 - n.leading_zeros();
    if e <= SUBCLASS_BITS {
        PAGE_BYTES
    } else {
        (1u64 << (e - SUBCLASS_BITS)).max(PAGE_BYTES)
    }
}

/// The binning above [`TIGHT_FROM_BYTES`]: [`LogLinear`] with 32 classes per power of two.
pub type PinnedClasses = LogLinear<SUBCLASS_BITS>;

/// The bytes pinned for a request of `n` bytes (0 counts as 1), or `None` on overflow: whole
/// pages below [`TIGHT_FROM_BYTES`], the [`PinnedClasses`] size from there on.
pub fn class_bytes(n: u64) -> Option<u64> {
    let n = n.max(1);
    if n < TIGHT_FROM_BYTES {
        return Some(n.div_ceil(PAGE_BYTES) * PAGE_BYTES);
    }
    PinnedClasses::round_up(n)
}

/// Number of page-sized classes, up to and including [`TIGHT_FROM_BYTES`] (32).
const PAGE_CLASSES: u32 = (TIGHT_FROM_BYTES / PAGE_BYTES) as u32;

/// Dense index of a class size (as returned by [`class_bytes`]); inverse of [`index_bytes`].
/// `None` if `bytes` is not a class size.
pub fn class_index(bytes: u64) -> Option<u32> {
    if bytes < PAGE_BYTES || class_bytes(bytes) != Some(bytes) {
        return None;
    }
    // Classes up to TIGHT_FROM_BYTES are every page: index = pages − 1.
    if bytes <= TIGHT_FROM_BYTES {
        return u32::try_from(bytes / PAGE_BYTES - 1).ok();
    }
    Some(PAGE_CLASSES - 1 + PinnedClasses::floor(bytes) - PinnedClasses::floor(TIGHT_FROM_BYTES))
}

/// Class size of a dense index; inverse of [`class_index`]. `None` past `u64`.
pub fn index_bytes(index: u32) -> Option<u64> {
    if index < PAGE_CLASSES {
        return Some((u64::from(index) + 1) * PAGE_BYTES);
    }
    let bin = PinnedClasses::floor(TIGHT_FROM_BYTES).checked_add(index - (PAGE_CLASSES - 1))?;
    (bin < PinnedClasses::BIN_COUNT).then(|| PinnedClasses::min_bytes(bin))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_values() {
        assert_eq!(class_bytes(0), Some(4096));
        assert_eq!(class_bytes(1), Some(4096));
        assert_eq!(class_bytes(4097), Some(8192));
        assert_eq!(class_bytes(1 << 20), Some(1 << 20));
        assert_eq!(class_bytes(3 << 20), Some(3 << 20));
        assert_eq!(class_bytes(5 << 20), Some(5 << 20));
        assert_eq!(class_bytes(100 << 20), Some(100 << 20));
        // 300 MiB lies in [256, 512) MiB: step 8 MiB -> 304 MiB.
        assert_eq!(class_bytes(300 << 20), Some(304 << 20));
        // 1 GiB + 1 B: step 32 MiB -> 1 GiB + 32 MiB.
        assert_eq!(class_bytes((1 << 30) + 1), Some((1 << 30) + (32 << 20)));
        assert_eq!(class_bytes(u64::MAX), None);
    }

    #[test]
    fn index_round_trip_exhaustive_low_range() {
        // Every class size up to 64 MiB, and every index of them, round-trips.
        let mut expected_index = 0u32;
        let mut b = PAGE_BYTES;
        while b <= 64 << 20 {
            assert_eq!(class_index(b), Some(expected_index), "bytes {b}");
            assert_eq!(
                index_bytes(expected_index),
                Some(b),
                "index {expected_index}"
            );
            expected_index += 1;
            b = class_bytes(b + 1).unwrap();
        }
        // Non-class sizes have no index.
        assert_eq!(class_index(4095), None);
        assert_eq!(class_index(4097), None);
        assert_eq!(class_index((1 << 20) + 4096), None);
    }

    #[test]
    fn indices_are_dense_and_increasing_to_the_top() {
        let mut prev = 0;
        for i in 0..2000u32 {
            match index_bytes(i) {
                Some(b) => {
                    assert!(b > prev, "index {i}");
                    assert_eq!(class_index(b), Some(i));
                    assert_eq!(class_bytes(b), Some(b));
                    prev = b;
                }
                None => {
                    assert!(prev >= 1 << 62, "ran out at index {i} after {prev}");
                    return;
                }
            }
        }
        panic!("indices never ran out");
    }

    proptest! {
        #[test]
        fn class_is_tight_monotone_and_idempotent(n in 1u64..(1u64 << 50), m in 1u64..(1u64 << 50)) {
            let c = class_bytes(n).unwrap();
            prop_assert!(c >= n);
            prop_assert_eq!(c % PAGE_BYTES, 0);
            prop_assert_eq!(class_bytes(c), Some(c));
            if n >= TIGHT_FROM_BYTES {
                prop_assert!((c - n) * SUBCLASSES < n, "n {} c {}", n, c);
            } else {
                prop_assert!(c - n < PAGE_BYTES);
            }
            let (a, b) = if n <= m { (n, m) } else { (m, n) };
            prop_assert!(class_bytes(a).unwrap() <= class_bytes(b).unwrap());
            prop_assert!(class_index(c).is_some());
        }
    }
}
