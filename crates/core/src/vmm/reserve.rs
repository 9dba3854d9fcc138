//! Reserved virtual ranges (cuMemAddressReserve / cuMemAddressFree): each with its page
//! table (one slot per page, see [`super::slots`]) and the placement's own index over its
//! pages. Ranges are kept in address order; a new one is made one free range of the
//! owner's free map.
use super::map::Page;
use super::range_map::{RangeMap, Tags};
use super::slots::SlotTable;
use super::VA_CAPACITY_FACTOR;
use crate::align::align_up;
use crate::{AllocError, Device};

/// A placement's own per-page state of a reservation (`paged`: its idle pages;
/// `paged-lazy`: its mapped-page counts and extents).
pub(crate) trait PageIndex {
    /// The index of a new reservation of `npages` pages, none mapped.
    fn new(npages: usize) -> Self;
}

/// One reserved virtual range and its pages.
#[derive(Debug, Clone)]
pub(crate) struct Reservation<X> {
    /// First virtual address (a multiple of the page size).
    pub(crate) va: u64,
    /// Bytes reserved (a multiple of the page size).
    pub(crate) bytes: u64,
    /// Pages in the reservation (`bytes / page size`).
    pub(crate) npages: usize,
    /// The page table, one slot per page; which slots of a mapped extent are written is
    /// the placement's choice (its ends only, or every page).
    pub(crate) pages: SlotTable<Page>,
    /// The placement's index over the pages.
    pub(crate) index: X,
}

impl<X> Reservation<X> {
    /// One past the last reserved address.
    #[inline]
    pub(crate) fn end(&self) -> u64 {
        self.va + self.bytes
    }
}

/// Index of the reservation of `rs` (in address order) holding `addr`.
#[inline]
pub(crate) fn res_of<X>(rs: &[Reservation<X>], addr: u64) -> Option<usize> {
    let i = rs.partition_point(|r| r.va <= addr);
    let i = i.checked_sub(1)?;
    (addr < rs[i].end()).then_some(i)
}

/// Reserves a new virtual range of at least `bytes` (cuMemAddressReserve): `va_chunk_bytes`
/// rounded up to the page, or [`VA_CAPACITY_FACTOR`] × the device capacity when that is 0,
/// or `bytes` rounded up to the page when larger. Inserts it in `rs` and makes it one free
/// range of `free`; returns its index.
///
/// # Errors
/// [`AllocError::Overflow`] for a size that cannot be rounded to pages; the device's error
/// when the reservation fails (then nothing changed).
pub(crate) fn reserve<X: PageIndex, T: Tags>(
    rs: &mut Vec<Reservation<X>>,
    free: &mut RangeMap<T>,
    dev: &mut dyn Device,
    bytes: u64,
    page_bytes: u64,
    va_chunk_bytes: u64,
) -> Result<usize, AllocError> {
    let p = page_bytes;
    let chunk = if va_chunk_bytes > 0 {
        align_up(va_chunk_bytes, p)
    } else {
        align_up(dev.capacity_bytes(), p).and_then(|c| c.checked_mul(VA_CAPACITY_FACTOR))
    }
    .unwrap_or(u64::MAX / 2);
    let overflow = || AllocError::Overflow {
        size_bytes: bytes,
        align: p,
    };
    let want = align_up(bytes, p).ok_or_else(overflow)?.max(chunk);
    let npages = usize::try_from(want / p).map_err(|_| overflow())?;
    let va = dev.reserve_va(want)?;
    let ri = rs.partition_point(|r| r.va < va);
    rs.insert(
        ri,
        Reservation {
            va,
            bytes: want,
            npages,
            pages: SlotTable::new(npages),
            index: X::new(npages),
        },
    );
    free.insert(va, want);
    Ok(ri)
}

/// Undoes [`reserve`] after a failed allocation: cuMemAddressFree of reservation `ri`,
/// retried once; on a second failure the empty range stays.
pub(crate) fn unreserve<X, T: Tags>(
    rs: &mut Vec<Reservation<X>>,
    free: &mut RangeMap<T>,
    dev: &mut dyn Device,
    ri: usize,
) {
    let Some(r) = rs.get(ri) else {
        return;
    };
    let (va, bytes) = (r.va, r.bytes);
    if dev.free_va(va, bytes).is_ok() || dev.free_va(va, bytes).is_ok() {
        free.remove(&va);
        rs.remove(ri);
    }
}

/// Gives back (cuMemAddressFree) every reservation that `free` holds whole as one free
/// range: no block, no mapped page.
///
/// # Errors
/// The first failed cuMemAddressFree; that range and those after it stay.
pub(crate) fn release_unused<X, T: Tags>(
    rs: &mut Vec<Reservation<X>>,
    free: &mut RangeMap<T>,
    dev: &mut dyn Device,
) -> Result<(), AllocError> {
    let mut ri = 0;
    while ri < rs.len() {
        let r = &rs[ri];
        if free.get(&r.va) == Some(&r.bytes) {
            let (va, bytes) = (r.va, r.bytes);
            dev.free_va(va, bytes)?;
            free.remove(&va);
            rs.remove(ri);
        } else {
            ri += 1;
        }
    }
    Ok(())
}

/// Checks that the reservations are page-aligned, non-empty, in address order without
/// overlap, each with a page table of its pages.
///
/// # Errors
/// A description of the first broken invariant.
pub(crate) fn validate<X>(rs: &[Reservation<X>], page_bytes: u64) -> Result<(), String> {
    let p = page_bytes;
    for (i, r) in rs.iter().enumerate() {
        if p == 0 || r.va % p != 0 || r.bytes % p != 0 || r.bytes == 0 {
            return Err(format!(
                "reservation {:#x}+{} not page-aligned",
                r.va, r.bytes
            ));
        }
        if r.npages as u64 != r.bytes / p || r.pages.len() != r.npages {
            return Err(format!("reservation {:#x}: page table wrong", r.va));
        }
        if let Some(n) = rs.get(i + 1) {
            if n.va < r.end() {
                return Err(format!("reservations {:#x} and {:#x} overlap", r.va, n.va));
            }
        }
    }
    Ok(())
}
