//! # gpumem-core
//!
//! Pure allocation algorithms for GPU memory. Nothing here touches a driver, a file or
//! `unsafe`: algorithms work on `u64` byte offsets and addresses, and talk to "the device"
//! only through the [`Device`] trait, which the simulated device ([`sim::SimDevice`]) and the
//! CUDA backend (crate `gpumem`) implement.
//!
//! Two layers:
//! - [`Arena`]: a sub-allocator over one contiguous range of `capacity_bytes`
//!   ([`buddy::Buddy`], [`tlsf::Tlsf`], [`best_fit::BestFit`]).
//! - [`Allocator`]: a device-level pool that obtains segments or physical pages from a
//!   [`Device`] and hands out blocks ([`segmented::SegmentedPool`] over any arena,
//!   [`torch::TorchCachingPool`], [`paged::PagedPool`]). Build one by name with [`strategy::Strategy`].
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

pub mod adaptor;
pub mod addr_table;
pub mod align;
pub mod arena;
pub mod best_fit;
pub mod buddy;
pub mod config;
pub mod device;
pub mod error;
pub mod hash;
pub mod paged;
pub mod paged_lazy;
pub mod segmented;
pub mod sim;
pub mod size_class;
pub mod stats;
pub mod strategy;
pub mod tlsf;
pub mod torch;
pub mod units;
pub mod vmm;

pub use adaptor::{Capped, Tracked, VmmBook};
pub use arena::Arena;
pub use config::AllocatorConfig;
pub use device::{Device, DeviceError, DriverCall, DriverCounters, PhysHandle};
pub use error::AllocError;
pub use stats::{Counter, Stats, StatsTracker};

/// One block handed to a user by an [`Allocator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Block {
    /// Device address of the first byte (aligned as requested).
    pub addr: u64,
    /// Bytes the user asked for.
    pub requested_bytes: u64,
    /// Bytes the allocator set aside for the block (≥ `requested_bytes`; the difference is
    /// internal fragmentation).
    pub allocated_bytes: u64,
}

/// Default alignment of a block, in bytes (cudaMalloc guarantees 256).
pub const DEFAULT_ALIGN: u64 = 256;

/// A cudaMalloc segment that existed before an allocator's life began, with the blocks that
/// were live in it then: what a PyTorch memory snapshot shows of the segments made before its
/// trace started recording (for [`Allocator::adopt_segment`]). Every other byte of the
/// segment was free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignSegment {
    /// Bytes of the segment.
    pub bytes: u64,
    /// Whether PyTorch kept it in its small pool (segments of 2 MiB for blocks of at most
    /// 1 MiB) rather than the large one.
    pub small_pool: bool,
    /// The stream it belongs to (as the trace names streams).
    pub stream: u64,
    /// The live blocks, in address order.
    pub blocks: Vec<ForeignBlock>,
    /// For an expandable segment (`expandable_segments:True`): its mapped runs of pages as
    /// `(offset, bytes)` from its lowest known page, in address order (`bytes` above is then
    /// the end of the last run, and block offsets count from the same page). `None` for a
    /// cudaMalloc segment.
    pub mapped: Option<Vec<(u64, u64)>>,
}

/// A live block inside a [`ForeignSegment`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignBlock {
    /// Bytes from the segment's base to the block.
    pub offset: u64,
    /// Bytes the user asked for.
    pub requested_bytes: u64,
    /// Bytes the block holds, when known (a snapshot lists them for the blocks still live at
    /// its dump); `None`: the allocator's rounding of `requested_bytes`.
    pub allocated_bytes: Option<u64>,
}

/// A device-level allocator (a pool): obtains memory from a [`Device`] and sub-allocates it.
///
/// Contract every implementation keeps:
/// - `allocate` honours `align` (any power of two up to the device granularity), returns
///   out-of-memory as [`AllocError::OutOfMemory`] and never panics on any input sequence;
/// - when the device refuses memory, `allocate` first gives back what it caches but does not
///   use ([`Allocator::empty_cache`]), then retries once, and only then reports OOM;
/// - a failed call changes nothing observable (stats, live blocks);
/// - `deallocate` of an unknown or already freed address is [`AllocError::UnknownBlock`] and
///   changes nothing.
pub trait Allocator: Send {
    /// Short name as used on the command line (`buddy`, `tlsf`, `best-fit`, `torch`, `paged`).
    fn name(&self) -> &'static str;

    /// Allocates `size_bytes` aligned to `align` bytes for use on `stream`. 0 is allowed: it
    /// takes the smallest block, or (`torch`, as PyTorch does) a null block at address 0
    /// that reserves nothing and is freed at address 0.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] when neither the cache nor the device can supply the block,
    /// [`AllocError::InvalidAlignment`], [`AllocError::Overflow`], or a device error.
    fn allocate(
        &mut self,
        dev: &mut dyn Device,
        size_bytes: u64,
        align: u64,
        stream: u64,
    ) -> Result<Block, AllocError>;

    /// Returns the block starting at `addr` to the pool.
    ///
    /// # Errors
    /// [`AllocError::UnknownBlock`] if `addr` is not a live block (nothing changes).
    fn deallocate(&mut self, dev: &mut dyn Device, addr: u64) -> Result<(), AllocError>;

    /// Gives every cached but unused segment or page back to the device
    /// (`torch.cuda.empty_cache()`). Returns the bytes released.
    ///
    /// # Errors
    /// A device error from the free/unmap/release call that failed.
    fn empty_cache(&mut self, dev: &mut dyn Device) -> Result<u64, AllocError>;

    /// Current and peak figures. Must be cheap (O(1) or O(log n)) for the
    /// `requested/allocated/reserved` counters; `largest_free_bytes` may cost O(free blocks).
    fn stats(&self) -> Stats;

    /// Reserved bytes, current and peak: [`Stats::reserved_bytes`] without the rest of
    /// [`Allocator::stats`]. O(1) in every allocator of this crate (the replay reads it after
    /// every allocation, to take the full statistics only at the one that raises the peak). The
    /// default takes it from `stats()`.
    fn reserved_bytes(&self) -> Counter {
        self.stats().reserved_bytes
    }

    /// Walks every internal structure and checks the invariants.
    ///
    /// # Errors
    /// [`AllocError::Internal`] describing the first broken invariant.
    fn validate(&self) -> Result<(), AllocError>;

    /// The user freed the live block at `addr`, but it may be reused only once other streams
    /// are done with it; [`Allocator::deallocate`] follows when they are (PyTorch's
    /// `record_stream`: its `free_requested`, then `free_completed`). Only the statistics
    /// change: the `torch` emulation takes the block out of `allocated_bytes` here, as
    /// PyTorch's `free()` does, and out of `requested_bytes` at the `deallocate`. The default
    /// does nothing (the block counts as allocated until it is deallocated).
    ///
    /// # Errors
    /// [`AllocError::UnknownBlock`] if `addr` is not a live block (nothing changes).
    fn free_requested(&mut self, dev: &mut dyn Device, addr: u64) -> Result<(), AllocError> {
        let _ = (dev, addr);
        Ok(())
    }

    /// Takes in a segment made before this allocator existed, with its live blocks, as the
    /// allocator's own: one cudaMalloc of `seg.bytes`, the blocks allocated at their offsets,
    /// the rest of the segment free for later requests. This is how a replay starts from the
    /// state a recorded run was in when its trace began. Returns the blocks (in the order of
    /// `seg.blocks`), or `Ok(None)` when the allocator does not keep segments of PyTorch's
    /// kind, or cannot hold this layout (the caller then allocates the blocks as usual);
    /// only the `torch` emulation adopts. The default adopts nothing.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] when the device refuses the segment (nothing changes), or
    /// a device error.
    fn adopt_segment(
        &mut self,
        dev: &mut dyn Device,
        seg: &ForeignSegment,
    ) -> Result<Option<Vec<Block>>, AllocError> {
        let _ = (dev, seg);
        Ok(None)
    }
}
