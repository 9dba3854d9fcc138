//! Errors of the allocation algorithms. Their messages give sizes in binary units with the
//! exact byte count beside them ([`crate::units::bytes_exact`]: `3.07 GiB (3,298,534,883 B)`).
use crate::device::DeviceError;
use crate::units::bytes_exact;

/// Why an allocation or a free did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// No free range large enough, neither cached nor from the device.
    #[error(
        "out of memory: requested {}; {} free in total, largest free block {}",
        bytes_exact(*.requested_bytes),
        bytes_exact(*.free_bytes),
        bytes_exact(*.largest_free_bytes)
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
    #[error(
        "invalid alignment {align}: expected a power of two between 1 B and {}",
        bytes_exact(*.max)
    )]
    InvalidAlignment {
        /// The alignment asked for, in bytes.
        align: u64,
        /// The largest alignment supported, in bytes.
        max: u64,
    },
    /// Size plus alignment padding does not fit in `u64` (or the arena).
    #[error("size {} with alignment {align} overflows", bytes_exact(*.size_bytes))]
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes in binary units with the exact count beside them (they were raw bytes:
    /// "requested 3298534883 B; 1073741824 B free in total, ...").
    #[test]
    fn messages_give_sizes_in_binary_units_and_exact_bytes() {
        let oom = AllocError::OutOfMemory {
            requested_bytes: 3_298_534_883,
            free_bytes: 1 << 30,
            largest_free_bytes: 512,
        };
        assert_eq!(
            oom.to_string(),
            "out of memory: requested 3.07 GiB (3,298,534,883 B); 1.00 GiB (1,073,741,824 B) free in total, largest free block 512 B"
        );
        let align = AllocError::InvalidAlignment {
            align: 3,
            max: 2 << 20,
        };
        assert_eq!(
            align.to_string(),
            "invalid alignment 3: expected a power of two between 1 B and 2.00 MiB (2,097,152 B)"
        );
        let overflow = AllocError::Overflow {
            size_bytes: u64::MAX - 10,
            align: 256,
        };
        assert_eq!(
            overflow.to_string(),
            "size 16.00 EiB (18,446,744,073,709,551,605 B) with alignment 256 overflows"
        );
        let device = AllocError::Device(DeviceError::OutOfMemory {
            requested_bytes: 20 << 20,
            free_bytes: 0,
            capacity_bytes: 80 << 30,
        });
        assert_eq!(
            device.to_string(),
            "device error: device out of memory: requested 20.00 MiB (20,971,520 B), 0 B free of 80.00 GiB (85,899,345,920 B)"
        );
    }
}
