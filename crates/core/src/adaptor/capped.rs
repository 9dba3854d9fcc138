//! [`Capped`]: a device whose memory is limited below what it really has, so a trace recorded
//! on a smaller GPU replays on a larger one with the same out-of-memory points.
use crate::{Device, DeviceError, PhysHandle};

/// Wraps a device and refuses (CUDA_ERROR_OUT_OF_MEMORY, without calling the driver) any
/// segment or physical allocation that would take its used bytes past `cap_bytes`.
#[derive(Debug)]
pub struct Capped<D> {
    /// The wrapped device.
    pub inner: D,
    /// Bytes the device may hand out, at most.
    pub cap_bytes: u64,
}

impl<D: Device> Capped<D> {
    /// Limits `inner` to `cap_bytes` (or its own capacity if smaller).
    pub fn new(inner: D, cap_bytes: u64) -> Self {
        let cap_bytes = cap_bytes.min(inner.capacity_bytes());
        Capped { inner, cap_bytes }
    }

    fn admit(&self, bytes: u64) -> Result<(), DeviceError> {
        let used = self.inner.used_bytes();
        if used.saturating_add(bytes) > self.cap_bytes {
            return Err(DeviceError::OutOfMemory {
                requested_bytes: bytes,
                free_bytes: self.cap_bytes.saturating_sub(used),
                capacity_bytes: self.cap_bytes,
            });
        }
        Ok(())
    }
}

crate::forward_device! {
    impl<D: Device> Device for Capped<D> => inner {
        fn capacity_bytes(&self) -> u64 {
            self.cap_bytes
        }
        fn alloc_segment(&mut self, bytes: u64) -> Result<u64, DeviceError> {
            self.admit(bytes)?;
            self.inner.alloc_segment(bytes)
        }
        fn create_physical(&mut self, bytes: u64) -> Result<PhysHandle, DeviceError> {
            self.admit(bytes)?;
            self.inner.create_physical(bytes)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::sim::SimDevice;

    #[test]
    fn cap_refuses_past_the_limit_without_calling_the_device() {
        const M: u64 = 2 << 20;
        let mut d = Capped::new(SimDevice::new(1 << 30), 3 * M);
        assert_eq!(d.capacity_bytes(), 3 * M);
        let a = d.alloc_segment(2 * M).expect("fits");
        let calls = d.counters().total();
        let e = d.create_physical(2 * M).expect_err("past the cap");
        assert_eq!(
            e,
            DeviceError::OutOfMemory {
                requested_bytes: 2 * M,
                free_bytes: M,
                capacity_bytes: 3 * M
            }
        );
        assert_eq!(d.counters().total(), calls, "refused before the driver");
        let h = d.create_physical(M).expect("fits");
        d.release_physical(h).expect("release");
        d.free_segment(a).expect("free");
        assert_eq!(d.used_bytes(), 0);
        // A cap above the device's own capacity is the device's capacity.
        assert_eq!(
            Capped::new(SimDevice::new(1 << 30), u64::MAX).capacity_bytes(),
            1 << 30
        );
    }
}
