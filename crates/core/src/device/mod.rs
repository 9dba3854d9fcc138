//! The device interface the allocators drive: plain segments (cuMemAlloc/cuMemFree) and
//! CUDA virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap,
//! cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree).
//!
//! Implemented by [`crate::sim::SimDevice`] (any machine) and by the CUDA backend in the
//! `gpumem` crate (real GPU, through cudarc).
use serde::Serialize;

mod call;

pub use call::{DriverCall, DriverCounters};

/// A physical memory handle (cuMemCreate's `CUmemGenericAllocationHandle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PhysHandle(pub u64);

/// Why the device refused a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// Not enough physical memory (CUDA_ERROR_OUT_OF_MEMORY).
    #[error(
        "device out of memory: requested {}, {} free of {}",
        crate::units::bytes_exact(*.requested_bytes),
        crate::units::bytes_exact(*.free_bytes),
        crate::units::bytes_exact(*.capacity_bytes)
    )]
    OutOfMemory {
        /// Bytes asked for.
        requested_bytes: u64,
        /// Physical bytes still free on the device.
        free_bytes: u64,
        /// Device capacity in bytes.
        capacity_bytes: u64,
    },
    /// A driver call failed for another reason.
    #[error("{call} failed: {name}")]
    Driver {
        /// The CUDA function, e.g. `cuMemMap`.
        call: &'static str,
        /// The CUDA error name, e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: String,
    },
    /// The arguments broke the call's contract (unaligned size, unknown address or handle).
    #[error("{call}: invalid argument: {detail}")]
    Invalid {
        /// The CUDA function.
        call: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The operation is not supported by this device (e.g. VMM on an old GPU).
    #[error("not supported: {0}")]
    Unsupported(String),
}

/// A GPU as seen by an allocator. Addresses are device virtual addresses; sizes are bytes.
///
/// VMM calls follow the CUDA rules: `reserve_va`, `create_physical`, `map`, `set_access` and
/// `unmap` sizes must be multiples of [`Device::granularity_bytes`], and VA ranges aligned to it.
pub trait Device: Send {
    /// Total device memory in bytes.
    fn capacity_bytes(&self) -> u64;
    /// Physical page size for VMM (cuMemGetAllocationGranularity, 2 MiB on Hopper).
    fn granularity_bytes(&self) -> u64;
    /// Physical bytes currently taken from the device by this process (segments + handles).
    fn used_bytes(&self) -> u64;
    /// Driver calls so far.
    fn counters(&self) -> DriverCounters;

    /// cuMemAlloc: a new segment of `bytes`; returns its address (256-byte aligned at least).
    ///
    /// # Errors
    /// [`DeviceError::OutOfMemory`] when `bytes` more would exceed the capacity.
    fn alloc_segment(&mut self, bytes: u64) -> Result<u64, DeviceError>;
    /// cuMemFree of a segment returned by [`Device::alloc_segment`].
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] for an unknown address.
    fn free_segment(&mut self, addr: u64) -> Result<(), DeviceError>;

    /// cuMemAddressReserve: reserves `bytes` of virtual address space, no physical memory.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] if `bytes` is not a multiple of the granularity.
    fn reserve_va(&mut self, bytes: u64) -> Result<u64, DeviceError>;
    /// cuMemAddressFree of a whole range from [`Device::reserve_va`] (must be unmapped).
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] for an unknown range or one still mapped.
    fn free_va(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError>;
    /// cuMemCreate: `bytes` of physical memory (a multiple of the granularity).
    ///
    /// # Errors
    /// [`DeviceError::OutOfMemory`] past the capacity.
    fn create_physical(&mut self, bytes: u64) -> Result<PhysHandle, DeviceError>;
    /// cuMemRelease of a handle (its memory is freed once it is unmapped everywhere).
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] for an unknown handle.
    fn release_physical(&mut self, handle: PhysHandle) -> Result<(), DeviceError>;
    /// cuMemMap: maps the whole of `handle` (of `bytes`) at `va`, inside a reserved range.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] if the range is not reserved, already mapped, or sizes differ.
    fn map(&mut self, va: u64, bytes: u64, handle: PhysHandle) -> Result<(), DeviceError>;
    /// cuMemSetAccess (read-write for this device) over `[va, va + bytes)`, which must be
    /// mapped; one call may span several neighbouring mappings.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] if part of the range is not mapped.
    fn set_access(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError>;
    /// cuMemUnmap of `[va, va + bytes)`, which must cover whole mappings.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] if the range splits a mapping or is not mapped.
    fn unmap(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError>;

    /// Memory in use on the whole device as the driver reports it (cuMemGetInfo: total − free),
    /// in bytes; `None` on devices that have no such view (the simulated one). The replay
    /// samples it to report the real footprint next to the pool's own count.
    fn driver_used_bytes(&mut self) -> Option<u64> {
        None
    }

    /// Fills `[addr, addr + bytes)` with the 32-bit `pattern` (cuMemsetD32; `bytes` is rounded
    /// down to a multiple of 4). Used by the canary check of a replay.
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`] on devices without memory contents (the simulated one).
    fn fill_pattern(&mut self, addr: u64, bytes: u64, pattern: u32) -> Result<(), DeviceError> {
        let _ = (addr, bytes, pattern);
        Err(DeviceError::Unsupported(
            "this device keeps no memory contents".into(),
        ))
    }

    /// Whether every 32-bit word of `[addr, addr + bytes)` still holds `pattern`.
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`] on devices without memory contents (the simulated one).
    fn check_pattern(&mut self, addr: u64, bytes: u64, pattern: u32) -> Result<bool, DeviceError> {
        let _ = (addr, bytes, pattern);
        Err(DeviceError::Unsupported(
            "this device keeps no memory contents".into(),
        ))
    }
}

/// Implements [`Device`] for an adaptor (a device that wraps another in one of its fields),
/// forwarding every method to that field except the ones written out, so that a method added
/// to [`Device`] needs one edit here rather than one in every adaptor. Used by
/// [`crate::Capped`], [`crate::Tracked`] and the adaptors of the other crates.
///
/// The methods written out are ordinary [`Device`] methods (attributes and doc comments
/// allowed); the impl header takes plain generic parameters with one bound each.
///
/// ```
/// use gpumem_core::sim::SimDevice;
/// use gpumem_core::{forward_device, Device, DeviceError};
///
/// /// Counts the segments allocated through it; everything else goes to `inner` as is.
/// struct Counting<D> {
///     inner: D,
///     segments: u64,
/// }
///
/// forward_device! {
///     impl<D: Device> Device for Counting<D> => inner {
///         fn alloc_segment(&mut self, bytes: u64) -> Result<u64, DeviceError> {
///             self.segments += 1;
///             self.inner.alloc_segment(bytes)
///         }
///     }
/// }
///
/// let mut d = Counting { inner: SimDevice::new(1 << 30), segments: 0 };
/// let a = d.alloc_segment(2 << 20)?;
/// d.free_segment(a)?;
/// assert_eq!((d.segments, d.capacity_bytes(), d.used_bytes()), (1, 1 << 30, 0));
/// # Ok::<(), DeviceError>(())
/// ```
///
/// Adding a method to [`Device`]: add its forwarding rule and its line to the list below it
/// (the two lists of this macro), and the method to the conformance test of
/// [`crate::adaptor`].
#[macro_export]
macro_rules! forward_device {
    (
        impl $(<$($g:ident : $bound:path),+ $(,)?>)? Device for $ty:ty => $field:ident {
            $(
                $(#[$attr:meta])*
                fn $name:ident ($($args:tt)*) $(-> $ret:ty)? $body:block
            )*
        }
    ) => {
        const _: () = {
            // A method written out matches its own rule first and is not forwarded.
            macro_rules! __forward_unless_written {
                $( ($name) => {}; )*
                (capacity_bytes) => {
                    fn capacity_bytes(&self) -> u64 {
                        $crate::Device::capacity_bytes(&self.$field)
                    }
                };
                (granularity_bytes) => {
                    fn granularity_bytes(&self) -> u64 {
                        $crate::Device::granularity_bytes(&self.$field)
                    }
                };
                (used_bytes) => {
                    fn used_bytes(&self) -> u64 {
                        $crate::Device::used_bytes(&self.$field)
                    }
                };
                (counters) => {
                    fn counters(&self) -> $crate::DriverCounters {
                        $crate::Device::counters(&self.$field)
                    }
                };
                (alloc_segment) => {
                    fn alloc_segment(
                        &mut self,
                        bytes: u64,
                    ) -> ::core::result::Result<u64, $crate::DeviceError> {
                        $crate::Device::alloc_segment(&mut self.$field, bytes)
                    }
                };
                (free_segment) => {
                    fn free_segment(
                        &mut self,
                        addr: u64,
                    ) -> ::core::result::Result<(), $crate::DeviceError> {
                        $crate::Device::free_segment(&mut self.$field, addr)
                    }
                };
                (reserve_va) => {
                    fn reserve_va(
                        &mut self,
                        bytes: u64,
                    ) -> ::core::result::Result<u64, $crate::DeviceError> {
                        $crate::Device::reserve_va(&mut self.$field, bytes)
                    }
                };
                (free_va) => {
                    fn free_va(
                        &mut self,
                        va: u64,
                        bytes: u64,
                    ) -> ::core::result::Result<(), $crate::DeviceError> {
                        $crate::Device::free_va(&mut self.$field, va, bytes)
                    }
                };
                (create_physical) => {
                    fn create_physical(
                        &mut self,
                        bytes: u64,
                    ) -> ::core::result::Result<$crate::PhysHandle, $crate::DeviceError> {
                        $crate::Device::create_physical(&mut self.$field, bytes)
                    }
                };
                (release_physical) => {
                    fn release_physical(
                        &mut self,
                        handle: $crate::PhysHandle,
                    ) -> ::core::result::Result<(), $crate::DeviceError> {
                        $crate::Device::release_physical(&mut self.$field, handle)
                    }
                };
                (map) => {
                    fn map(
                        &mut self,
                        va: u64,
                        bytes: u64,
                        handle: $crate::PhysHandle,
                    ) -> ::core::result::Result<(), $crate::DeviceError> {
                        $crate::Device::map(&mut self.$field, va, bytes, handle)
                    }
                };
                (set_access) => {
                    fn set_access(
                        &mut self,
                        va: u64,
                        bytes: u64,
                    ) -> ::core::result::Result<(), $crate::DeviceError> {
                        $crate::Device::set_access(&mut self.$field, va, bytes)
                    }
                };
                (unmap) => {
                    fn unmap(
                        &mut self,
                        va: u64,
                        bytes: u64,
                    ) -> ::core::result::Result<(), $crate::DeviceError> {
                        $crate::Device::unmap(&mut self.$field, va, bytes)
                    }
                };
                (driver_used_bytes) => {
                    fn driver_used_bytes(&mut self) -> ::core::option::Option<u64> {
                        $crate::Device::driver_used_bytes(&mut self.$field)
                    }
                };
                (fill_pattern) => {
                    fn fill_pattern(
                        &mut self,
                        addr: u64,
                        bytes: u64,
                        pattern: u32,
                    ) -> ::core::result::Result<(), $crate::DeviceError> {
                        $crate::Device::fill_pattern(&mut self.$field, addr, bytes, pattern)
                    }
                };
                (check_pattern) => {
                    fn check_pattern(
                        &mut self,
                        addr: u64,
                        bytes: u64,
                        pattern: u32,
                    ) -> ::core::result::Result<bool, $crate::DeviceError> {
                        $crate::Device::check_pattern(&mut self.$field, addr, bytes, pattern)
                    }
                };
            }

            impl $(<$($g: $bound),+>)? $crate::Device for $ty {
                $(
                    $(#[$attr])*
                    fn $name($($args)*) $(-> $ret)? $body
                )*
                __forward_unless_written!(capacity_bytes);
                __forward_unless_written!(granularity_bytes);
                __forward_unless_written!(used_bytes);
                __forward_unless_written!(counters);
                __forward_unless_written!(alloc_segment);
                __forward_unless_written!(free_segment);
                __forward_unless_written!(reserve_va);
                __forward_unless_written!(free_va);
                __forward_unless_written!(create_physical);
                __forward_unless_written!(release_physical);
                __forward_unless_written!(map);
                __forward_unless_written!(set_access);
                __forward_unless_written!(unmap);
                __forward_unless_written!(driver_used_bytes);
                __forward_unless_written!(fill_pattern);
                __forward_unless_written!(check_pattern);
            }
        };
    };
}
