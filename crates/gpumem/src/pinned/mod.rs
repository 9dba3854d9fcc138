//! Pinned (page-locked) host memory.
//!
//! Pageable memory (`malloc`, `Vec`) cannot be read by the GPU's copy engines directly: the
//! driver first copies it into a pinned bounce buffer of its own, then DMAs from there, and
//! an "async" copy from it is synchronous for the host. Page-locked memory is DMA'd directly,
//! at the link's rate (several times the pageable path; BENCHMARKS.md, "Pinned host memory
//! and transfers", has the figures), and lets copies overlap host work and kernels. It costs:
//! allocation is slow (`cuMemHostAlloc` takes milliseconds per MiB-sized buffer and scales
//! with the size), and pinned pages cannot be swapped, so pinning too much starves the rest
//! of the machine (keep it under half of RAM).
//!
//! This module offers:
//! - [`PinnedBuffer`]: one `cuMemHostAlloc` allocation (flags: default, portable, mapped,
//!   write-combined), freed only by its own `Drop` (`cuMemFreeHost`); without a CUDA driver,
//!   anonymous memory locked with `mlock`.
//! - [`HostRegistration`]: `cuMemHostRegister` of memory the caller already holds, in chunks,
//!   rolled back on error.
//! - [`PinnedPool`]: a capped caching allocator so the hot path never calls the driver, with
//!   size classes that waste at most 1/32 for requests ≥ 128 KiB.
//! - [`StagingRing`]: pageable copies streamed through a ring of pinned buffers filled by a
//!   persistent thread pool, overlapping host `memcpy` with DMA.
//! - [`transfer`]: the measurements behind `gpumem bench transfer` / `bench pinned`.
//! - [`advise`]: the pageable / pinned / staged / mapped decision, made quantitative.

use crate::cuda::CudaError;
use gpumem_core::DeviceError;

mod buffer;
mod locked;
mod pool;
pub mod size_class;
mod staging;
pub mod sysinfo;

pub mod advise;
pub mod transfer;

pub use buffer::{HostRegistration, PinnedBuffer, DEFAULT_REGISTER_CHUNK_BYTES};
pub use locked::{memlock_limit, MemlockLimit};
pub use pool::PinnedSource;
pub use pool::{PinnedPool, PinnedPoolConfig, PinnedStats, PooledBuffer};
pub use staging::{CopyKind, CopyPool, NullDma, StagingConfig, StagingDma, StagingRing};

/// How a [`PinnedBuffer`] is allocated (the flags of `cuMemHostAlloc`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct HostAllocFlags {
    /// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every CUDA context, not only the current one.
    pub portable: bool,
    /// `CU_MEMHOSTALLOC_DEVICEMAP`: mapped into the device's address space (zero-copy);
    /// [`PinnedBuffer::device_ptr`] returns its device address.
    pub mapped: bool,
    /// `CU_MEMHOSTALLOC_WRITECOMBINED`: write-combined, fast for the CPU to write and the GPU
    /// to read over PCIe, very slow for the CPU to read.
    pub write_combined: bool,
}

impl HostAllocFlags {
    /// `cudaHostAllocDefault`: plain page-locked memory.
    pub const DEFAULT: Self = Self {
        portable: false,
        mapped: false,
        write_combined: false,
    };
    /// Portable only.
    pub const PORTABLE: Self = Self {
        portable: true,
        mapped: false,
        write_combined: false,
    };
    /// Mapped (zero-copy) only.
    pub const MAPPED: Self = Self {
        portable: false,
        mapped: true,
        write_combined: false,
    };
    /// Write-combined only.
    pub const WRITE_COMBINED: Self = Self {
        portable: false,
        mapped: false,
        write_combined: true,
    };

    /// The `Flags` argument of `cuMemHostAlloc`.
    pub fn to_cuda(self) -> u32 {
        use crate::cuda::driver;
        let mut f = 0;
        if self.portable {
            f |= driver::HOST_ALLOC_PORTABLE;
        }
        if self.mapped {
            f |= driver::HOST_ALLOC_DEVICEMAP;
        }
        if self.write_combined {
            f |= driver::HOST_ALLOC_WRITECOMBINED;
        }
        f
    }
}

impl std::fmt::Display for HostAllocFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names = Vec::new();
        if self.portable {
            names.push("portable");
        }
        if self.mapped {
            names.push("mapped");
        }
        if self.write_combined {
            names.push("write-combined");
        }
        if names.is_empty() {
            f.write_str("default")
        } else {
            f.write_str(&names.join("+"))
        }
    }
}

/// Errors of pinned host memory.
#[derive(Debug, thiserror::Error)]
pub enum PinnedError {
    /// No usable CUDA driver ([`CudaError::NoDriver`], [`CudaError::Unusable`]) or a failed
    /// driver call ([`CudaError::Device`], naming the call and the CUDA error).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// One chunk of a chunked registration failed; the chunks before it were rolled back.
    #[error(
        "{call} of chunk {chunk} (offset {offset_bytes} B, {len_bytes} B) of a {total_bytes} B \
         range failed: {name}; the {chunk} chunk(s) before it were unregistered"
    )]
    Register {
        /// `cuMemHostRegister` or `mlock`.
        call: &'static str,
        /// Index of the chunk that failed (0-based).
        chunk: usize,
        /// Offset of that chunk from the start of the range, in bytes.
        offset_bytes: usize,
        /// Length of that chunk, in bytes.
        len_bytes: usize,
        /// Length of the whole range, in bytes.
        total_bytes: usize,
        /// CUDA error name or OS error.
        name: String,
    },
    /// `mlock` was refused: the process may not lock that much memory.
    #[error(
        "mlock of {bytes} B refused ({os}): RLIMIT_MEMLOCK is {limit}, {locked_bytes} B already \
         locked by this process; raise it with `ulimit -l unlimited` (shell), \
         `LimitMEMLOCK=infinity` (systemd), `--ulimit memlock=-1` (docker) or \
         /etc/security/limits.conf, or run with CAP_IPC_LOCK"
    )]
    MemlockLimit {
        /// Bytes asked for.
        bytes: usize,
        /// The soft limit, as text (`8388608 B`, `unlimited`).
        limit: String,
        /// Bytes this process holds locked (`VmLck` of /proc/self/status), 0 if unknown.
        locked_bytes: u64,
        /// The OS error.
        os: std::io::Error,
    },
    /// Another OS call failed.
    #[error("{call} of {bytes} B failed: {os}")]
    Os {
        /// The call, e.g. `mmap`.
        call: &'static str,
        /// Bytes asked for.
        bytes: usize,
        /// The OS error.
        os: std::io::Error,
    },
    /// The pool's cap on pinned bytes would be passed, even after releasing its cache.
    #[error(
        "pinned memory cap reached: requested {} (size class {}), {} already pinned, cap {}",
        crate::units::bytes(*.requested_bytes),
        crate::units::bytes(*.class_bytes),
        crate::units::bytes(*.pinned_bytes),
        crate::units::bytes(*.cap_bytes)
    )]
    CapExceeded {
        /// Bytes asked for.
        requested_bytes: u64,
        /// Bytes the request's size class takes.
        class_bytes: u64,
        /// Bytes pinned by the pool now (live and cached).
        pinned_bytes: u64,
        /// The pool's cap, in bytes.
        cap_bytes: u64,
    },
    /// A measurement needs more host memory than the machine has available.
    #[error(
        "{what} needs {} of host memory, but only {} are available (MemAvailable, cgroup \
         limit): choose smaller sizes",
        crate::units::bytes(*.needed_bytes),
        crate::units::bytes(*.available_bytes)
    )]
    HostMemory {
        /// What needs it, e.g. `bench pinned at 100 GiB`.
        what: String,
        /// Bytes it needs.
        needed_bytes: u64,
        /// Bytes available.
        available_bytes: u64,
    },
    /// A request that cannot be served as asked (zero size, size overflow, misuse).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A broken invariant (a bug in gpumem).
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<DeviceError> for PinnedError {
    fn from(e: DeviceError) -> Self {
        PinnedError::Cuda(CudaError::Device(e))
    }
}

/// Result of this module.
pub type Result<T, E = PinnedError> = std::result::Result<T, E>;
