//! The sub-allocator trait: one contiguous range of byte offsets `[0, capacity_bytes)`.

use crate::error::AllocError;

/// A storage report, O(1) to produce (offset-allocator's `StorageReport`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArenaReport {
    /// Bytes not held by any live allocation, in bytes.
    pub free_bytes: u64,
    /// Largest allocation that could succeed right now with alignment 1, in bytes.
    pub largest_free_bytes: u64,
    /// Live allocations.
    pub allocations: u64,
}

/// A range allocator over byte offsets. Knows nothing about devices.
///
/// Contract: never panics; a failed call changes nothing; `allocate` returns an offset
/// aligned to `align` (a power of two ≤ [`Arena::max_align`]) with `size` bytes inside the
/// arena that overlap no live allocation; after every live allocation is freed, an
/// allocation of the whole capacity succeeds at offset 0.
pub trait Arena: Send {
    /// Short name (`buddy`, `tlsf`, `best-fit`).
    fn name(&self) -> &'static str;
    /// Size of the managed range, in bytes.
    fn capacity_bytes(&self) -> u64;
    /// Largest alignment supported, in bytes.
    fn max_align(&self) -> u64;
    /// Allocates `size_bytes` (0 takes the smallest block) aligned to `align`.
    /// Returns `(offset, allocated_bytes)`.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`], [`AllocError::InvalidAlignment`], [`AllocError::Overflow`].
    fn allocate(&mut self, size_bytes: u64, align: u64) -> Result<(u64, u64), AllocError>;
    /// Frees the allocation starting at `offset`; returns its allocated bytes.
    ///
    /// # Errors
    /// [`AllocError::UnknownBlock`] if `offset` is not a live allocation.
    fn deallocate(&mut self, offset: u64) -> Result<u64, AllocError>;
    /// O(1) storage report.
    fn report(&self) -> ArenaReport;
    /// Checks every invariant (free lists, bitmaps, neighbour links, byte accounting).
    ///
    /// # Errors
    /// [`AllocError::Internal`] naming the first broken invariant.
    fn validate(&self) -> Result<(), AllocError>;
}
