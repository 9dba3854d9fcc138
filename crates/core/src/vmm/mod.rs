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
pub(crate) mod handles;
pub(crate) mod quick;
pub(crate) mod sizes;

pub use handles::CachedHandle;
