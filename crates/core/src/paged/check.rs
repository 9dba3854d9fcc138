//! Cross-checks of a [`PagedPool`] against the simulated device's own view (the comparison
//! itself is [`crate::vmm`]'s, shared with `paged-lazy`).
use super::PagedPool;
use crate::sim::SimDevice;
use crate::vmm::check::{device_agrees, Held};
use crate::{AllocError, Allocator};

impl PagedPool {
    /// Checks the allocator against `dev`, the [`SimDevice`] it runs on: the device holds
    /// exactly this allocator's reserved ranges, one mapping per mapped handle, one live
    /// handle per held handle (mapped or cached), `used_bytes` equal to `reserved_bytes`, and every
    /// live block is mapped with access. Assumes nothing else uses `dev`.
    ///
    /// # Errors
    /// [`AllocError::Internal`] naming the first disagreement.
    pub fn check_device(&self, dev: &SimDevice) -> Result<(), AllocError> {
        let mapped_handles = self
            .vmm
            .reservations
            .iter()
            .flat_map(|r| r.pages.iter().enumerate())
            .filter(|(i, s)| s.is_some_and(|pg| pg.ext_first as usize == *i))
            .count();
        device_agrees(
            dev,
            &Held {
                ranges: self.vmm.reservations.len(),
                mapped_handles,
                cached_handles: self.vmm.cache.len(),
                reserved_bytes: self.stats().reserved_bytes.current,
                live_blocks: self.live_blocks(),
            },
        )
    }
}
