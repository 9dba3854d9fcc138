//! Row pitch of 2-D and 3-D allocations.
//!
//! cuMemAllocPitch pads each row so that rows start on an alignment the texture hardware
//! accepts. The driver does not document its rule; what it returns matches rounding the
//! width up to the larger of CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT (512 B on current NVIDIA
//! GPUs) and CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT (32 B). [`pitch_align_for`] takes
//! that maximum; the GPU test `cuda_pitch_matches_driver` compares [`pitch_bytes`] with what
//! cuMemAllocPitch returns on the device for several widths.

/// Pitch alignment used when the device is not known (the simulated device), in bytes.
pub const DEFAULT_PITCH_ALIGN: u64 = 512;

/// The pitch alignment for a device with the given texture alignment and texture pitch
/// alignment (both in bytes): the larger of the two, at least 1, rounded up to a power of two.
pub fn pitch_align_for(texture_alignment_bytes: u64, texture_pitch_alignment_bytes: u64) -> u64 {
    texture_alignment_bytes
        .max(texture_pitch_alignment_bytes)
        .max(1)
        .next_power_of_two()
}

/// Bytes from one row to the next for rows of `width_bytes`: `width_bytes` rounded up to
/// `align_bytes` (a power of two), at least one `align_bytes`. `None` on overflow or a bad
/// alignment.
pub fn pitch_bytes(width_bytes: u64, align_bytes: u64) -> Option<u64> {
    if !align_bytes.is_power_of_two() {
        return None;
    }
    width_bytes
        .max(1)
        .checked_add(align_bytes - 1)
        .map(|x| x & !(align_bytes - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pitch_rounds_rows_up() {
        assert_eq!(pitch_bytes(1, 512), Some(512));
        assert_eq!(pitch_bytes(0, 512), Some(512));
        assert_eq!(pitch_bytes(512, 512), Some(512));
        assert_eq!(pitch_bytes(513, 512), Some(1024));
        assert_eq!(pitch_bytes(4000, 32), Some(4000));
        assert_eq!(pitch_bytes(4001, 32), Some(4032));
        assert_eq!(pitch_bytes(10, 3), None);
        assert_eq!(pitch_bytes(u64::MAX, 512), None);
        assert_eq!(pitch_align_for(512, 32), 512);
        assert_eq!(pitch_align_for(0, 0), 1);
        assert_eq!(pitch_align_for(256, 300), 512);
    }
}
