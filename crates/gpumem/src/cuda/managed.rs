//! Managed (unified) memory: cuMemAllocManaged, with prefetch (cuMemPrefetchAsync) and
//! advice (cuMemAdvise), behind a guard that never asks for more than the device has free
//! minus a margin: over-asking managed memory can hang a shared GPU.
use gpumem_core::DeviceError;

use super::driver::{self, CUcontext, CUdevice, MemAdvise};
use super::{CudaDevice, CudaError};

/// Smallest margin kept free on the device by the managed guard, in bytes (1 GiB).
pub const MANAGED_MARGIN_BYTES: u64 = 1 << 30;

/// The margin the guard keeps for a device of `total_bytes`: 1 GiB or 5 %, whichever is more.
pub fn managed_margin(total_bytes: u64) -> u64 {
    MANAGED_MARGIN_BYTES.max(total_bytes / 20)
}

/// The guard: `Ok` when `requested_bytes ≤ free_bytes − margin(total_bytes)`.
///
/// # Errors
/// [`CudaError::ManagedRefused`] otherwise.
pub fn managed_guard(
    requested_bytes: u64,
    free_bytes: u64,
    total_bytes: u64,
) -> Result<(), CudaError> {
    let margin_bytes = managed_margin(total_bytes);
    if requested_bytes == 0 || requested_bytes > free_bytes.saturating_sub(margin_bytes) {
        return Err(CudaError::ManagedRefused {
            requested_bytes,
            free_bytes,
            margin_bytes,
        });
    }
    Ok(())
}

/// A hint for cuMemAdvise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// CU_MEM_ADVISE_SET_READ_MOSTLY.
    ReadMostly,
    /// CU_MEM_ADVISE_SET_PREFERRED_LOCATION on the owning device.
    PreferDevice,
    /// CU_MEM_ADVISE_SET_PREFERRED_LOCATION on the host.
    PreferHost,
    /// CU_MEM_ADVISE_SET_ACCESSED_BY the owning device.
    AccessedByDevice,
}

/// A managed allocation; freed (cuMemFree) on drop. It holds its own reference to the
/// device's primary context, so it may outlive the [`CudaDevice`] it came from.
#[derive(Debug)]
pub struct ManagedBuffer {
    dev: CUdevice,
    ctx: CUcontext,
    ordinal: i32,
    addr: u64,
    bytes: u64,
}

/// Kept for the public name in the module list: managed memory is obtained with
/// [`CudaDevice::alloc_managed`].
pub type Managed = ManagedBuffer;

// SAFETY: the buffer's context is made current before every call; the address is plain data.
unsafe impl Send for ManagedBuffer {}

impl CudaDevice {
    /// Allocates `bytes` of managed memory (cuMemAllocManaged, CU_MEM_ATTACH_GLOBAL) after
    /// checking cuMemGetInfo: refused unless `bytes ≤ free − max(1 GiB, 5 % of total)`.
    ///
    /// # Errors
    /// [`CudaError::ManagedRefused`] from the guard; [`CudaError::Device`] for a failed call.
    pub fn alloc_managed(&self, bytes: u64) -> Result<ManagedBuffer, CudaError> {
        let (free, total) = self.mem_info()?;
        managed_guard(bytes, free, total)?;
        let dev = self.device_raw();
        // SAFETY: `dev` is this device's handle; the retain is matched in ManagedBuffer::drop,
        // or just below if the allocation fails.
        let ctx = unsafe { driver::primary_ctx_retain(dev)? };
        // SAFETY: `ctx` was just retained.
        let made =
            unsafe { driver::ctx_set_current(ctx) }.and_then(|()| driver::mem_alloc_managed(bytes));
        match made {
            Ok(addr) => Ok(ManagedBuffer {
                dev,
                ctx,
                ordinal: i32::try_from(self.ordinal()).unwrap_or(i32::MAX),
                addr,
                bytes,
            }),
            Err(e) => {
                // SAFETY: matches the retain above; nothing was allocated.
                let _ = unsafe { driver::primary_ctx_release(dev) };
                Err(e.into())
            }
        }
    }
}

impl ManagedBuffer {
    fn bind(&self) -> Result<(), DeviceError> {
        // SAFETY: our retained primary context, released only in drop.
        unsafe { driver::ctx_set_current(self.ctx) }
    }
    /// Address (valid on host and device).
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.bytes
    }
    /// Prefetches the whole buffer to the device (`to_device`) or the host on stream 0
    /// (cuMemPrefetchAsync) and waits for it.
    ///
    /// # Errors
    /// A failed driver call (e.g. CUDA_ERROR_INVALID_DEVICE without concurrent managed access).
    pub fn prefetch(&self, to_device: bool) -> Result<(), DeviceError> {
        self.bind()?;
        let loc = driver::location(to_device.then_some(self.ordinal));
        // SAFETY: the whole live managed allocation; the null stream is always valid.
        unsafe {
            driver::mem_prefetch(self.addr, self.bytes, loc, std::ptr::null_mut())?;
            driver::stream_synchronize(std::ptr::null_mut())
        }
    }
    /// Gives the driver a hint about the whole buffer (cuMemAdvise).
    ///
    /// # Errors
    /// A failed driver call.
    pub fn advise(&self, advice: Advice) -> Result<(), DeviceError> {
        self.bind()?;
        let (a, loc) = match advice {
            Advice::ReadMostly => (
                MemAdvise::CU_MEM_ADVISE_SET_READ_MOSTLY,
                driver::location(Some(self.ordinal)),
            ),
            Advice::PreferDevice => (
                MemAdvise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                driver::location(Some(self.ordinal)),
            ),
            Advice::PreferHost => (
                MemAdvise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                driver::location(None),
            ),
            Advice::AccessedByDevice => (
                MemAdvise::CU_MEM_ADVISE_SET_ACCESSED_BY,
                driver::location(Some(self.ordinal)),
            ),
        };
        // SAFETY: the whole live managed allocation.
        unsafe { driver::mem_advise(self.addr, self.bytes, a, loc) }
    }
}

impl Drop for ManagedBuffer {
    fn drop(&mut self) {
        if self.bind().is_ok() && self.addr != 0 {
            // SAFETY: our managed allocation, freed once; prefetches were waited for.
            let _ = unsafe { driver::mem_free(self.addr) };
        }
        // SAFETY: matches the retain in alloc_managed.
        let _ = unsafe { driver::primary_ctx_release(self.dev) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_keeps_a_margin() {
        const GIB: u64 = 1 << 30;
        let total = 140 * GIB;
        let margin = managed_margin(total);
        assert_eq!(margin, 7 * GIB);
        assert!(managed_guard(GIB, 100 * GIB, total).is_ok());
        assert!(managed_guard(93 * GIB, 100 * GIB, total).is_ok());
        assert_eq!(
            managed_guard(93 * GIB + 1, 100 * GIB, total),
            Err(CudaError::ManagedRefused {
                requested_bytes: 93 * GIB + 1,
                free_bytes: 100 * GIB,
                margin_bytes: 7 * GIB
            })
        );
        // Small device: the 1 GiB floor applies; little free: refused.
        assert_eq!(managed_margin(8 * GIB), GIB);
        assert!(managed_guard(1, GIB / 2, 8 * GIB).is_err());
        assert!(managed_guard(0, 100 * GIB, total).is_err());
    }
}
