//! Cross-checks of a [`Paged`] allocator against the simulated device's own view.
use super::Paged;
use crate::sim::SimDevice;
use crate::{AllocError, Allocator, Device};

impl Paged {
    /// Checks the allocator against `dev`, the [`SimDevice`] it runs on: the device holds
    /// exactly this allocator's reserved ranges, one mapping per mapped page, one live handle
    /// per held page (mapped or cached), `used_bytes` equal to `reserved_bytes`, and every
    /// live block is mapped with access. Assumes nothing else uses `dev`.
    ///
    /// # Errors
    /// [`AllocError::Internal`] naming the first disagreement.
    pub fn check_device(&self, dev: &SimDevice) -> Result<(), AllocError> {
        let (segments, reserved, mappings, handles) = dev.live_objects();
        let held = self.mapped_pages as usize + self.cache.len();
        if segments != 0
            || reserved != self.reservations.len()
            || mappings as u64 != self.mapped_pages
            || handles != held
        {
            return Err(AllocError::Internal(format!(
                "device holds {segments} segments, {reserved} ranges, {mappings} mappings, \
                 {handles} handles; allocator: {} ranges, {} mapped pages, {held} held pages",
                self.reservations.len(),
                self.mapped_pages
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
