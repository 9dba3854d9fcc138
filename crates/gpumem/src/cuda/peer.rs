//! Peer access per block of a [`DevicePool`] on a CUDA device (cuMemSetAccess on the pages
//! under the block): CUDA-only, so it lives here, not in [`crate::pool`].
use gpumem_core::{Device, DeviceError};

use super::CudaDevice;
use crate::pool::{DeviceBlock, DevicePool, PoolError};

impl DevicePool<CudaDevice> {
    /// Grants (`grant`) or revokes read-write access of device `peer_ordinal` to the pages
    /// under `block` (cuMemSetAccess with one descriptor, on every granularity page the block
    /// touches). Only blocks of a VMM strategy (`paged`) can be shared this way; pages are
    /// shared whole, and so are the whole mappings they lie in (cuMemSetAccess takes whole
    /// mappings), so neighbours on the same pages or mappings become visible too.
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
        // cuMemSetAccess takes whole mappings (a range that starts or ends inside one is
        // CUDA_ERROR_INVALID_VALUE on the H200 with driver 580): widen the block's pages to
        // the mappings they lie in.
        let mut start = block.addr() / g * g;
        let mut end = (block.addr() + block.size_bytes().max(1)).div_ceil(g) * g;
        if let Some((s, m)) = dev.vmm_book().mapping_of(start) {
            start = start.min(s);
            end = end.max(s + m.bytes);
        }
        if let Some((s, m)) = dev.vmm_book().mapping_of(end - 1) {
            end = end.max(s + m.bytes);
        }
        Ok(dev.set_peer_access(start, end - start, peer_ordinal, grant)?)
    }
}
