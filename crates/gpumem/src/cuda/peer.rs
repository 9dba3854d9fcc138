//! Peer access per block of a [`DevicePool`] on a CUDA device (cuMemSetAccess on the pages
//! under the block): CUDA-only, so it lives here, not in [`crate::pool`].
use gpumem_core::{Device, DeviceError};

use super::CudaDevice;
use crate::pool::{DeviceBlock, DevicePool, PoolError};

impl DevicePool<CudaDevice> {
    /// Grants (`grant`) or revokes read-write access of device `peer_ordinal` to the pages
    /// under `block` (cuMemSetAccess with one descriptor, on every granularity page the block
    /// touches). Only blocks of a VMM strategy (`paged`) can be shared this way; pages are
    /// shared whole, so neighbours on the same page become visible too.
    ///
    /// # Errors
    /// `DeviceError::Unsupported` for a block in a cuMemAlloc segment (use peer contexts
    /// there) or when cuDeviceCanAccessPeer says no; a failed driver call.
    pub fn set_peer_access(
        &self,
        block: &DeviceBlock<'_, CudaDevice>,
        peer_ordinal: usize,
        grant: bool,
    ) -> Result<(), PoolError> {
        let mut c = self.central()?;
        let dev = &mut c.dev;
        let g = dev.granularity_bytes();
        if g == 0 || dev.vmm_book().mapping_of(block.addr()).is_none() {
            return Err(DeviceError::Unsupported(format!(
                "block {:#x} is not VMM-mapped ({} strategy): peer access per block needs the paged strategy",
                block.addr(),
                self.name()
            ))
            .into());
        }
        let start = block.addr() / g * g;
        let end = (block.addr() + block.size_bytes().max(1)).div_ceil(g) * g;
        Ok(dev.set_peer_access(start, end - start, peer_ordinal, grant)?)
    }
}
