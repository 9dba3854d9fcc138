//! The VMM substrate under both page-mapped strategies, [`crate::paged`] and
//! [`crate::paged_lazy`]: what CUDA virtual memory management (cuMemAddressReserve,
//! cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree) asks
//! of any allocator that places blocks on mapped pages, whatever its placement.
//!
//! # Note [One substrate, two placements]
//! A page-mapped allocator is a *placement* (where a block goes, which pages it maps, when
//! pages are unmapped) over a *substrate* (the driver's objects and their bookkeeping). The
//! placements differ and stay in their own modules: `paged` places blocks by the pages they
//! map and counts the blocks on each page; `paged-lazy` keeps pages mapped and indexes
//! mapped extents with a Fenwick tree. The substrate is the same for both and lives here:
//! - `quick.rs`: the quick-reuse list (freed blocks kept whole, O(1) to drop the oldest),
//!   bounded by a block count and optionally by bytes;
//! - `handles.rs`: physical handles and their cache (an index by size, `sizes.rs`), the
//!   cuMemRelease of a handle (retried once), the trim to the bound;
//! - more to come in this module: reserved ranges, physical handles and their cache,
//!   mapping bookkeeping and unwinding, the retry on out-of-memory.
//!
//! Where the two strategies' policies differ (the quick list's byte bound, what counts
//! against the cache bound, which handle goes first), the difference is a parameter or a
//! choice of method here, not a second copy.
pub(crate) mod check;
pub(crate) mod handles;
pub(crate) mod map;
pub(crate) mod quick;
pub(crate) mod range_map;
pub(crate) mod reserve;
pub(crate) mod retry;
pub(crate) mod sizes;
pub(crate) mod slots;
pub(crate) mod validate;
pub(crate) mod view;

pub use handles::CachedHandle;
pub use view::{PageState, VaRangeView};

use crate::DEFAULT_ALIGN;

/// Allocation unit in bytes: every block size and address is a multiple of it.
pub const UNIT_BYTES: u64 = DEFAULT_ALIGN;

/// Virtual address space reserved by the first reservation, as a multiple of the device
/// capacity.
pub const VA_CAPACITY_FACTOR: u64 = 2;

/// A live block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LiveBlock {
    /// Bytes set aside (multiple of [`UNIT_BYTES`]).
    pub(crate) bytes: u64,
    /// Bytes the user asked for.
    pub(crate) requested: u64,
}

/// Freed blocks held for same-size reuse, at most (default of
/// [`PagedPool::with_quick_slots`](crate::paged::PagedPool::with_quick_slots) and
/// [`LazyPagedPool::with_quick_slots`](crate::paged_lazy::LazyPagedPool::with_quick_slots)).
pub const QUICK_SLOTS: usize = 16;
