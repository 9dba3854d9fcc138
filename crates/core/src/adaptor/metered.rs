//! [`Metered`]: a [`Device`] adaptor that publishes the physical bytes the device holds
//! (PyTorch's `reserved_bytes`) in atomics, so readers (the plug-in's statistics) see them
//! without taking the lock of the pool that owns the device, and a peak that can be reset like
//! `torch.cuda.reset_peak_memory_stats()`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::{forward_device, Device, DeviceError, PhysHandle};

/// Reserved bytes, current and peak, shared between a [`Metered`] device and its readers.
#[derive(Debug, Default)]
pub struct Reserved {
    current: AtomicU64,
    peak: AtomicU64,
    /// Driver calls that take or give back physical memory, so far.
    changes: AtomicU64,
}

impl Reserved {
    /// Bytes held from the device now.
    pub fn current(&self) -> u64 {
        self.current.load(Ordering::Relaxed)
    }
    /// Highest value of [`Reserved::current`] since creation or the last
    /// [`Reserved::reset_peak`].
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
    /// Sets the peak to the current value.
    pub fn reset_peak(&self) {
        self.peak.store(self.current(), Ordering::Relaxed);
    }
    fn set(&self, bytes: u64) {
        self.current.store(bytes, Ordering::Relaxed);
        self.peak.fetch_max(bytes, Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::Relaxed);
    }
}

/// Forwards every call to the inner device and, after each call that changes the physical
/// memory held, stores the inner device's [`Device::used_bytes`] in a shared [`Reserved`].
#[derive(Debug)]
pub struct Metered<D> {
    pub(super) inner: D,
    reserved: Arc<Reserved>,
}

impl<D: Device> Metered<D> {
    /// Wraps `inner`; returns the device and the shared figures.
    pub fn new(inner: D) -> (Self, Arc<Reserved>) {
        let reserved = Arc::new(Reserved::default());
        reserved.set(inner.used_bytes());
        let m = Metered {
            inner,
            reserved: Arc::clone(&reserved),
        };
        (m, reserved)
    }

    /// The wrapped device.
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    fn after<T>(&mut self, r: Result<T, DeviceError>) -> Result<T, DeviceError> {
        self.reserved.set(self.inner.used_bytes());
        r
    }
}

forward_device! {
    impl<D: Device> Device for Metered<D> => inner {
        fn alloc_segment(&mut self, bytes: u64) -> Result<u64, DeviceError> {
            let r = self.inner.alloc_segment(bytes);
            self.after(r)
        }
        fn free_segment(&mut self, addr: u64) -> Result<(), DeviceError> {
            let r = self.inner.free_segment(addr);
            self.after(r)
        }
        fn create_physical(&mut self, bytes: u64) -> Result<PhysHandle, DeviceError> {
            let r = self.inner.create_physical(bytes);
            self.after(r)
        }
        fn release_physical(&mut self, handle: PhysHandle) -> Result<(), DeviceError> {
            let r = self.inner.release_physical(handle);
            self.after(r)
        }
        fn unmap(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            // cuMemUnmap can free memory whose handle was already released.
            let r = self.inner.unmap(va, bytes);
            self.after(r)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimDevice;

    #[test]
    fn reserved_follows_segments_and_pages() {
        let (mut d, r) = Metered::new(SimDevice::new(1 << 30));
        let a = d.alloc_segment(4 << 20).unwrap();
        let b = d.alloc_segment(2 << 20).unwrap();
        assert_eq!((r.current(), r.peak()), (6 << 20, 6 << 20));
        d.free_segment(a).unwrap();
        assert_eq!((r.current(), r.peak()), (2 << 20, 6 << 20));
        r.reset_peak();
        assert_eq!(r.peak(), 2 << 20);
        let g = d.granularity_bytes();
        let va = d.reserve_va(2 * g).unwrap();
        assert_eq!(r.current(), 2 << 20, "address space is not memory");
        let h = d.create_physical(g).unwrap();
        d.map(va, g, h).unwrap();
        assert_eq!(r.current(), (2 << 20) + g);
        d.release_physical(h).unwrap();
        d.unmap(va, g).unwrap();
        d.free_va(va, 2 * g).unwrap();
        d.free_segment(b).unwrap();
        assert_eq!(r.current(), d.used_bytes());
        assert_eq!(r.current(), 0);
        assert_eq!(r.peak(), (2 << 20) + g);
        assert!(d.free_segment(b).is_err(), "errors pass through");
    }
}
