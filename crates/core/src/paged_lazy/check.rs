//! Cross-checks of a [`LazyPagedPool`] allocator against the simulated device's own view.
use super::LazyPagedPool;
use crate::sim::SimDevice;
use crate::{AllocError, Allocator, Device};

impl LazyPagedPool {
    /// Checks the allocator against `dev`, the [`SimDevice`] it runs on: the device holds
    /// exactly this allocator's reserved ranges, one mapping per mapped handle, one live
    /// handle per held handle (mapped or cached), `used_bytes` equal to `reserved_bytes`, and every
    /// live block is mapped with access. Assumes nothing else uses `dev`.
    ///
    /// # Errors
    /// [`AllocError::Internal`] naming the first disagreement.
    pub fn check_device(&self, dev: &SimDevice) -> Result<(), AllocError> {
        let (segments, reserved, mappings, handles) = dev.live_objects();
        let mapped_handles = self
            .reservations
            .iter()
            .flat_map(|r| r.pages.iter().enumerate())
            .filter(|(i, s)| s.is_some_and(|pg| pg.ext_first as usize == *i))
            .count();
        let held = mapped_handles + self.cache.len();
        if segments != 0
            || reserved != self.reservations.len()
            || mappings != mapped_handles
            || handles != held
        {
            return Err(AllocError::Internal(format!(
                "device holds {segments} segments, {reserved} ranges, {mappings} mappings, \
                 {handles} handles; allocator: {} ranges, {mapped_handles} mapped handles, \
                 {held} held handles",
                self.reservations.len()
            )));
        }
        let reserved_bytes = self.stats().reserved_bytes.current;
        if dev.used_bytes() != reserved_bytes {
            return Err(AllocError::Internal(format!(
                "device uses {} B, allocator reserves {reserved_bytes} B",
                dev.used_bytes()
            )));
        }
        for (addr, bytes) in self.live_blocks() {
            if !dev.is_accessible(addr, bytes) {
                return Err(AllocError::Internal(format!(
                    "live block {addr:#x}+{bytes} is not mapped with access"
                )));
            }
        }
        Ok(())
    }
}
