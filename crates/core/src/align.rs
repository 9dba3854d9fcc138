//! Overflow-checked alignment arithmetic.

/// Whether `align` is a power of two (1, 2, 4, ...).
pub fn is_pow2(align: u64) -> bool {
    align != 0 && align & (align - 1) == 0
}

/// Rounds `value` up to a multiple of `align` (a power of two); `None` on overflow.
pub fn align_up(value: u64, align: u64) -> Option<u64> {
    debug_assert!(is_pow2(align));
    let mask = align.wrapping_sub(1);
    value.checked_add(mask).map(|v| v & !mask)
}

/// Rounds `value` down to a multiple of `align` (a power of two).
pub fn align_down(value: u64, align: u64) -> u64 {
    debug_assert!(is_pow2(align));
    value & !align.wrapping_sub(1)
}

/// Rounds `value` up to a multiple of `unit` (any non-zero value); `None` on overflow.
pub fn round_up(value: u64, unit: u64) -> Option<u64> {
    if unit == 0 {
        return None;
    }
    let rem = value % unit;
    if rem == 0 {
        Some(value)
    } else {
        value.checked_add(unit - rem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_up_every_pow2_near_max_never_overflows() {
        for shift in 0..=12 {
            let a = 1u64 << shift;
            for v in [
                u64::MAX,
                u64::MAX - 1,
                u64::MAX - a,
                u64::MAX - 2 * a + 1,
                0,
                1,
                a - 1,
                a,
                a + 1,
            ] {
                match align_up(v, a) {
                    Some(r) => {
                        assert!(r >= v);
                        assert_eq!(r % a, 0);
                        assert!(r - v < a);
                    }
                    None => assert!(v > u64::MAX - (a - 1)),
                }
            }
        }
    }

    #[test]
    fn round_up_handles_non_pow2_and_zero_unit() {
        assert_eq!(round_up(5, 3), Some(6));
        assert_eq!(round_up(6, 3), Some(6));
        assert_eq!(round_up(1, 0), None);
        assert_eq!(round_up(u64::MAX, 2), None);
    }
}
