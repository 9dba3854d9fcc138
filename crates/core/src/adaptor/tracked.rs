//! [`Tracked`]: an adaptor that records the VMM calls and segments passing through to any
//! [`Device`] in a [`VmmBook`] (RMM's `tracking_resource_adaptor`).
use std::collections::BTreeMap;

use super::VmmBook;
use crate::{Device, DeviceError, PhysHandle};

/// Wraps any [`Device`] and records its VMM calls in a [`VmmBook`] (for the simulated device's
/// page table; the CUDA device keeps its own).
#[derive(Debug, Clone, Default)]
pub struct Tracked<D> {
    /// The wrapped device.
    pub inner: D,
    /// What was reserved and mapped through it.
    pub book: VmmBook,
    /// Live segments (cuMemAlloc) made through it: addr -> bytes.
    pub segments: BTreeMap<u64, u64>,
}

impl<D: Device> Tracked<D> {
    /// Wraps `inner`.
    pub fn new(inner: D) -> Self {
        Tracked {
            inner,
            book: VmmBook::default(),
            segments: BTreeMap::new(),
        }
    }
}

crate::forward_device! {
    impl<D: Device> Device for Tracked<D> => inner {
        fn alloc_segment(&mut self, bytes: u64) -> Result<u64, DeviceError> {
            let a = self.inner.alloc_segment(bytes)?;
            self.segments.insert(a, bytes);
            Ok(a)
        }
        fn free_segment(&mut self, addr: u64) -> Result<(), DeviceError> {
            self.inner.free_segment(addr)?;
            self.segments.remove(&addr);
            Ok(())
        }
        fn reserve_va(&mut self, bytes: u64) -> Result<u64, DeviceError> {
            let va = self.inner.reserve_va(bytes)?;
            self.book.on_reserve(va, bytes);
            Ok(va)
        }
        fn free_va(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            self.inner.free_va(va, bytes)?;
            self.book.on_free_va(va);
            Ok(())
        }
        fn create_physical(&mut self, bytes: u64) -> Result<PhysHandle, DeviceError> {
            let h = self.inner.create_physical(bytes)?;
            self.book.on_create(h.0, bytes);
            Ok(h)
        }
        fn release_physical(&mut self, handle: PhysHandle) -> Result<(), DeviceError> {
            self.inner.release_physical(handle)?;
            self.book.on_release(handle.0);
            Ok(())
        }
        fn map(&mut self, va: u64, bytes: u64, handle: PhysHandle) -> Result<(), DeviceError> {
            self.inner.map(va, bytes, handle)?;
            self.book.on_map(va, bytes, handle.0);
            Ok(())
        }
        fn set_access(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            self.inner.set_access(va, bytes)?;
            self.book.on_set_access(va, bytes, 0, true);
            Ok(())
        }
        fn unmap(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            self.inner.unmap(va, bytes)?;
            self.book.on_unmap(va, bytes);
            Ok(())
        }
    }
}
