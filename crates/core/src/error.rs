//! Errors of the allocation algorithms.
use crate::device::DeviceError;

/// Why an allocation or a free did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// No free range large enough, neither cached nor from the device.
    #[error(
        "out of memory: requested {requested_bytes} B; {free_bytes} B free in total, largest free block {largest_free_bytes} B"
    )]
    OutOfMemory {
        /// Bytes asked for.
        requested_bytes: u64,
        /// Free bytes in the pool at the time (cached, unused).
        free_bytes: u64,
        /// Largest contiguous free block in the pool, in bytes.
        largest_free_bytes: u64,
    },
    /// Alignment not a power of two, or above what the strategy supports.
    #[error("invalid alignment {align}: expected a power of two between 1 and {max} bytes")]
    InvalidAlignment {
        /// The alignment asked for, in bytes.
        align: u64,
        /// The largest alignment supported, in bytes.
        max: u64,
    },
    /// Size plus alignment padding does not fit in `u64` (or the arena).
    #[error("size {size_bytes} B with alignment {align} overflows")]
    Overflow {
        /// Bytes asked for.
        size_bytes: u64,
        /// Alignment asked for, in bytes.
        align: u64,
    },
    /// Free of an address that is not the start of a live block (double free or never allocated).
    #[error("free of unknown block at {addr:#x} (double free, or never allocated)")]
    UnknownBlock {
        /// The address or offset given.
        addr: u64,
    },
    /// The device refused a call for a reason other than running out of memory.
    #[error("device error: {0}")]
    Device(#[from] DeviceError),
    /// An internal invariant is broken: a bug in gpumem.
    #[error("internal invariant broken: {0}")]
    Internal(String),
}

impl AllocError {
    /// Whether this is an out-of-memory error (from the pool or the device).
    pub fn is_oom(&self) -> bool {
        matches!(
            self,
            AllocError::OutOfMemory { .. } | AllocError::Device(DeviceError::OutOfMemory { .. })
        )
    }
}
