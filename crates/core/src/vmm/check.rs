//! Cross-check of a page-mapped pool against the simulated device's own view: what the
//! pool holds against what the device holds.
use crate::sim::SimDevice;
use crate::{AllocError, Device};

/// What a page-mapped allocator holds, as [`device_agrees`] compares it with the device.
pub(crate) struct Held {
    /// Reserved virtual ranges.
    pub ranges: usize,
    /// Physical handles mapped somewhere.
    pub mapped_handles: usize,
    /// Physical handles held unmapped (the handle cache).
    pub cached_handles: usize,
    /// The allocator's `reserved_bytes`.
    pub reserved_bytes: u64,
    /// Live blocks as `(addr, bytes)`.
    pub live_blocks: Vec<(u64, u64)>,
}

/// The body of both allocators' `check_device`: the device holds exactly the allocator's
/// reserved ranges, one mapping per mapped handle, one live handle per held handle (mapped or
/// cached), `used_bytes` equal to `reserved_bytes`, and every live block is mapped with
/// access. Assumes nothing else uses `dev`.
///
/// # Errors
/// [`AllocError::Internal`] naming the first disagreement.
pub(crate) fn device_agrees(dev: &SimDevice, held: &Held) -> Result<(), AllocError> {
    let (segments, reserved, mappings, handles) = dev.live_objects();
    let held_handles = held.mapped_handles + held.cached_handles;
    if segments != 0
        || reserved != held.ranges
        || mappings != held.mapped_handles
        || handles != held_handles
    {
        return Err(AllocError::Internal(format!(
            "device holds {segments} segments, {reserved} ranges, {mappings} mappings, \
             {handles} handles; allocator: {} ranges, {} mapped handles, {held_handles} held \
             handles",
            held.ranges, held.mapped_handles
        )));
    }
    if dev.used_bytes() != held.reserved_bytes {
        return Err(AllocError::Internal(format!(
            "device uses {} B, allocator reserves {} B",
            dev.used_bytes(),
            held.reserved_bytes
        )));
    }
    for &(addr, bytes) in &held.live_blocks {
        if !dev.is_accessible(addr, bytes) {
            return Err(AllocError::Internal(format!(
                "live block {addr:#x}+{bytes} is not mapped with access"
            )));
        }
    }
    Ok(())
}
