//! The page-table view of a page-mapped pool: one row per reserved stretch, mapped handle
//! or run of unmapped pages (the "address translation table" of GPU memory tutorials), for
//! people (`Display`) and machines (`serde`).
use crate::device::PhysHandle;

/// State of one row of a page table: a pool's ([`VaRangeView`]) or a device's
/// ([`PageRow`](crate::adaptor::PageRow)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PageState {
    /// Physical memory mapped here (one handle).
    Mapped,
    /// Reserved virtual addresses with no physical memory behind them.
    ReservedUnmapped,
}

/// One row of a page table ([`PagedPool::page_table`](crate::paged::PagedPool::page_table),
/// [`LazyPagedPool::page_table`](crate::paged_lazy::LazyPagedPool::page_table)): a stretch of
/// one reserved range, mapped to one physical handle or unmapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct VaRangeView {
    /// First virtual address of the row.
    pub va: u64,
    /// Length of the row in bytes (the handle's size when mapped; any number of pages when
    /// not).
    pub bytes: u64,
    /// Physical page size (the device granularity), in bytes.
    pub page_bytes: u64,
    /// Mapped or reserved-unmapped.
    pub state: PageState,
    /// The cuMemCreate handle mapped there (`None` when unmapped).
    pub handle: Option<PhysHandle>,
    /// Blocks touching the row's pages, live or held for quick reuse (0: idle pages, mapped
    /// and kept for reuse in place; 0 when unmapped).
    pub live_blocks: u32,
    /// Whether cuMemSetAccess opened it to the device (`false` when unmapped).
    pub access: bool,
}

impl VaRangeView {
    /// The row of `handle` mapped over `[va, va + bytes)`.
    pub fn mapped(
        va: u64,
        bytes: u64,
        page_bytes: u64,
        handle: PhysHandle,
        live_blocks: u32,
        access: bool,
    ) -> Self {
        VaRangeView {
            va,
            bytes,
            page_bytes,
            state: PageState::Mapped,
            handle: Some(handle),
            live_blocks,
            access,
        }
    }
}

impl std::fmt::Display for VaRangeView {
    /// One row of the address translation table ("地址翻译表"): `virtual range | physical | page size | state`, e.g.
    /// `0x7f0000000000 - 0x7f0000200000 | handle 3 | 2 MiB | mapped, 2 blocks`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let end = self.va.saturating_add(self.bytes);
        let page = if self.page_bytes >= 1 << 20 && self.page_bytes.is_multiple_of(1 << 20) {
            format!("{} MiB", self.page_bytes >> 20)
        } else {
            format!("{} KiB", self.page_bytes >> 10)
        };
        match (self.state, self.handle) {
            (PageState::Mapped, Some(handle)) => {
                let what = match (self.live_blocks, self.access) {
                    (0, _) => "mapped, idle".to_string(),
                    (n, true) => format!("mapped, {n} block{}", if n == 1 { "" } else { "s" }),
                    (n, false) => format!("mapped without access, {n} blocks"),
                };
                write!(
                    f,
                    "{:#x} - {end:#x} | handle {} | {page} | {what}",
                    self.va, handle.0
                )
            }
            _ => write!(
                f,
                "{:#x} - {end:#x} | unmapped | {page} | reserved, {} pages",
                self.va,
                self.bytes / self.page_bytes.max(1)
            ),
        }
    }
}

/// Adds the unmapped page at `va` (`p` bytes) to the page-table rows: it lengthens the last
/// row when that is an unmapped run ending at `va`, else starts one. Used by both placements.
pub(crate) fn push_unmapped_page(rows: &mut Vec<VaRangeView>, va: u64, p: u64) {
    match rows.last_mut() {
        Some(last) if last.state == PageState::ReservedUnmapped && last.va + last.bytes == va => {
            last.bytes += p
        }
        _ => rows.push(VaRangeView {
            va,
            bytes: p,
            page_bytes: p,
            state: PageState::ReservedUnmapped,
            handle: None,
            live_blocks: 0,
            access: false,
        }),
    }
}
