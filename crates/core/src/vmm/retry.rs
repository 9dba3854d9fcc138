//! The request checks and the out-of-memory path of a page-mapped pool: the page size
//! learnt from the device, a request rounded to the allocation unit, one retry after
//! giving the cache back.
use super::UNIT_BYTES;
use crate::align::{align_up, is_pow2};
use crate::device::DeviceError;
use crate::{AllocError, Allocator, Block, Device};

/// What the shared allocation path ([`allocate`]) asks of a placement over the substrate.
pub(crate) trait VmmPool: Allocator {
    /// The page size learnt so far (0 before the first allocation).
    fn page_bytes_mut(&mut self) -> &mut u64;

    /// Called on every allocation once the page size is known, before the request is
    /// checked: where a placement derives bounds from the page size.
    fn pages_known(&mut self);

    /// One allocation attempt of `bytes` (rounded) at `align` for a request of `requested`
    /// bytes, with no retry.
    ///
    /// # Errors
    /// Out of memory, or a device error (after unwinding what the attempt did).
    fn try_allocate(
        &mut self,
        dev: &mut dyn Device,
        bytes: u64,
        align: u64,
        requested: u64,
    ) -> Result<Block, AllocError>;

    /// Counts a retry after out-of-memory in the figures.
    fn count_retry(&mut self);

    /// Called after a successful allocation: where a placement trims its cache.
    fn allocated(&mut self, dev: &mut dyn Device);
}

/// [`Allocator::allocate`] of a placement: learns the page size, checks and rounds the
/// request ([`page_request`]: a block larger than the device is out of memory at once), then
/// [`retry_once_after_empty_cache`] around [`VmmPool::try_allocate`], then
/// [`VmmPool::allocated`] on success.
///
/// # Errors
/// As [`learn_page_size`] and [`page_request`]; out of memory after the retry; a device
/// error of the attempt.
#[inline]
pub(crate) fn allocate<P: VmmPool>(
    pool: &mut P,
    dev: &mut dyn Device,
    size_bytes: u64,
    align: u64,
) -> Result<Block, AllocError> {
    learn_page_size(pool.page_bytes_mut(), dev)?;
    pool.pages_known();
    let page_bytes = *pool.page_bytes_mut();
    let Some((bytes, align)) = page_request(page_bytes, dev, size_bytes, align)? else {
        return Err(out_of_memory(pool, size_bytes));
    };
    let result = retry_once_after_empty_cache(
        pool,
        dev,
        size_bytes,
        |a, dev| a.try_allocate(dev, bytes, align, size_bytes),
        |a| a.count_retry(),
    );
    if result.is_ok() {
        pool.allocated(dev);
    }
    result
}

/// The out-of-memory error of a page-mapped pool: the request and the pool's free bytes as
/// [`Allocator::stats`] reports them.
pub(crate) fn out_of_memory(pool: &dyn Allocator, requested_bytes: u64) -> AllocError {
    let s = pool.stats();
    AllocError::OutOfMemory {
        requested_bytes,
        free_bytes: s.free_bytes,
        largest_free_bytes: s.largest_free_bytes,
    }
}

/// One allocation attempt, and on out-of-memory [`Allocator::empty_cache`] and one retry
/// (counted by `count_retry`) when that gave anything back; a second out-of-memory, or one
/// with nothing to give back, is [`out_of_memory`] of `size_bytes`.
pub(crate) fn retry_once_after_empty_cache<A: Allocator>(
    pool: &mut A,
    dev: &mut dyn Device,
    size_bytes: u64,
    mut attempt: impl FnMut(&mut A, &mut dyn Device) -> Result<Block, AllocError>,
    count_retry: impl FnOnce(&mut A),
) -> Result<Block, AllocError> {
    match attempt(pool, dev) {
        Err(e) if e.is_oom() => {
            let released = pool.empty_cache(dev).unwrap_or(0);
            if released == 0 {
                return Err(out_of_memory(pool, size_bytes));
            }
            count_retry(pool);
            match attempt(pool, dev) {
                Err(e) if e.is_oom() => Err(out_of_memory(pool, size_bytes)),
                r => r,
            }
        }
        r => r,
    }
}

/// Learns the page size from the device on first use (`*page_bytes == 0`), else checks that
/// it has not changed.
///
/// # Errors
/// [`DeviceError::Unsupported`] for a granularity that is not a power of two of 256 B .. 1 TiB;
/// [`AllocError::Internal`] when it differs from the one learnt (another device).
pub(crate) fn learn_page_size(page_bytes: &mut u64, dev: &dyn Device) -> Result<(), AllocError> {
    let g = dev.granularity_bytes();
    if *page_bytes == 0 {
        if !is_pow2(g) || !(UNIT_BYTES..=(1 << 40)).contains(&g) {
            return Err(DeviceError::Unsupported(format!(
                "page-mapped allocator needs a power-of-two granularity of 256 B .. 1 TiB, got {g} B"
            ))
            .into());
        }
        *page_bytes = g;
    } else if g != *page_bytes {
        return Err(AllocError::Internal(format!(
            "device granularity changed from {} to {g} bytes (another device?)",
            *page_bytes
        )));
    }
    Ok(())
}

/// A request to a page-mapped allocator with pages of `page_bytes`, as `(bytes, align)`: the
/// size rounded up to [`UNIT_BYTES`] (at least one unit), the alignment at least that. `None`
/// when the block needs more pages than the device has (it can never be mapped: the caller
/// refuses it as out of memory before reserving address space).
///
/// # Errors
/// [`AllocError::InvalidAlignment`] for an alignment that is not a power of two or exceeds a
/// page; [`AllocError::Overflow`] for a size too close to `u64::MAX`.
pub(crate) fn page_request(
    page_bytes: u64,
    dev: &dyn Device,
    size_bytes: u64,
    align: u64,
) -> Result<Option<(u64, u64)>, AllocError> {
    if !is_pow2(align) || align > page_bytes {
        return Err(AllocError::InvalidAlignment {
            align,
            max: page_bytes,
        });
    }
    let align = align.max(UNIT_BYTES);
    let bytes = align_up(size_bytes.max(1), UNIT_BYTES)
        .filter(|b| b.checked_add(2 * page_bytes).is_some())
        .ok_or(AllocError::Overflow { size_bytes, align })?;
    // Pages are a power of two once learnt: shifts, not two 64-bit divisions per request.
    let fits = if is_pow2(page_bytes) {
        let sh = page_bytes.trailing_zeros();
        (bytes >> sh) + u64::from(bytes & (page_bytes - 1) != 0) <= dev.capacity_bytes() >> sh
    } else {
        bytes.div_ceil(page_bytes) <= dev.capacity_bytes() / page_bytes
    };
    Ok(fits.then_some((bytes, align)))
}
