//! [`RawPool`]: the one interface of the two device pools ([`DevicePool`] and [`DirectPool`])
//! for a caller that holds raw blocks and picks the pool at run time, such as the PyTorch
//! plug-in's C entry points.

use gpumem_core::{Device, DriverCounters};

use super::{Deferral, DevicePool, DirectPool, PoolError, PoolStats, RawBlock};

/// A stream-ordered device pool seen through [`RawBlock`]s, whatever its reuse policy and
/// device type: what a `Box<dyn RawPool>` offers.
pub trait RawPool: Send + Sync {
    /// Allocates `size_bytes` for use on `stream`.
    ///
    /// # Errors
    /// [`PoolError::OutOfMemory`] when the pool cannot supply it after its own recovery
    /// (flushing caches, releasing cached memory, retrying once); other allocator or device
    /// errors.
    fn alloc_raw(&self, size_bytes: u64, stream: u64) -> Result<RawBlock, PoolError>;
    /// Gives back a block from [`RawPool::alloc_raw`].
    ///
    /// # Errors
    /// A device or allocator error.
    fn free_raw(&self, b: RawBlock) -> Result<(), PoolError>;
    /// Returns the cached memory to the device (PyTorch's `empty_cache()`); returns the bytes
    /// released.
    ///
    /// # Errors
    /// A device or allocator error.
    fn empty_cache(&self) -> Result<u64, PoolError>;
    /// The pool's figures.
    ///
    /// # Errors
    /// [`PoolError::Poisoned`].
    fn stats(&self) -> Result<PoolStats, PoolError>;
    /// Checks the pool's and its strategy's invariants.
    ///
    /// # Errors
    /// The strategy's `AllocError::Internal`, or [`PoolError::Poisoned`].
    fn validate(&self) -> Result<(), PoolError>;
    /// Driver calls so far.
    ///
    /// # Errors
    /// [`PoolError::Poisoned`].
    fn counters(&self) -> Result<DriverCounters, PoolError>;
    /// The stream ordering's counts of a [`DirectPool`]; `None` for other pools.
    fn deferral(&self) -> Option<Deferral> {
        None
    }
}

impl<D: Device> RawPool for DirectPool<D> {
    fn alloc_raw(&self, size_bytes: u64, stream: u64) -> Result<RawBlock, PoolError> {
        self.alloc(size_bytes, stream)
    }
    fn free_raw(&self, b: RawBlock) -> Result<(), PoolError> {
        self.free(&b)
    }
    fn empty_cache(&self) -> Result<u64, PoolError> {
        DirectPool::empty_cache(self)
    }
    fn stats(&self) -> Result<PoolStats, PoolError> {
        DirectPool::stats(self)
    }
    fn validate(&self) -> Result<(), PoolError> {
        DirectPool::validate(self)
    }
    fn counters(&self) -> Result<DriverCounters, PoolError> {
        DirectPool::counters(self)
    }
    fn deferral(&self) -> Option<Deferral> {
        self.deferral_counts().ok()
    }
}

impl<D: Device> RawPool for DevicePool<D> {
    fn alloc_raw(&self, size_bytes: u64, stream: u64) -> Result<RawBlock, PoolError> {
        DevicePool::alloc_raw(self, size_bytes, stream)
    }
    fn free_raw(&self, b: RawBlock) -> Result<(), PoolError> {
        DevicePool::free_raw(self, b)
    }
    fn empty_cache(&self) -> Result<u64, PoolError> {
        DevicePool::empty_cache(self)
    }
    fn stats(&self) -> Result<PoolStats, PoolError> {
        DevicePool::stats(self)
    }
    fn validate(&self) -> Result<(), PoolError> {
        DevicePool::validate(self)
    }
    fn counters(&self) -> Result<DriverCounters, PoolError> {
        self.with_device(|d| d.counters())
    }
}
