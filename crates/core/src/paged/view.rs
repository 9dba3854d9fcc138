//! The page-table view of a [`PagedPool`]: one row per reserved range, mapped handle, idle
//! page or hole (the "address translation table" of the design notes), and the counters
//! read from outside.
use super::*;

/// State of one row of the page-table view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PageState {
    /// Pages mapped to one physical handle.
    Mapped {
        /// The cuMemCreate handle mapped there.
        handle: PhysHandle,
        /// Blocks touching the row's pages, live or held for quick reuse (0: idle pages,
        /// mapped and kept for reuse in place).
        live_blocks: u32,
        /// Whether cuMemSetAccess opened it to the device.
        access: bool,
    },
    /// Reserved virtual addresses with no physical memory behind them.
    ReservedUnmapped,
}

/// One row of a page table ([`PagedPool::page_table`],
/// [`LazyPagedPool::page_table`](crate::paged_lazy::LazyPagedPool::page_table)): a stretch of
/// one reserved range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct VaRangeView {
    /// First virtual address of the row.
    pub va: u64,
    /// Length of the row in bytes (the handle's size when mapped; any number of pages when
    /// not).
    pub bytes: u64,
    /// Physical page size (the device granularity), in bytes.
    pub page_bytes: u64,
    /// Mapped (with its handle) or reserved-unmapped.
    pub state: PageState,
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
        match self.state {
            PageState::Mapped {
                handle,
                live_blocks,
                access,
            } => {
                let what = match (live_blocks, access) {
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
            PageState::ReservedUnmapped => write!(
                f,
                "{:#x} - {end:#x} | unmapped | {page} | reserved, {} pages",
                self.va,
                self.bytes / self.page_bytes.max(1)
            ),
        }
    }
}

/// Adds the unmapped page at `va` (`p` bytes) to the page-table rows: it lengthens the last
/// row when that is an unmapped run ending at `va`, else starts one. Shared by `paged` and
/// `paged-lazy`.
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
        }),
    }
}

impl PagedPool {
    /// Idle pages: mapped, but touched by no live block.
    pub fn idle_pages(&self) -> u64 {
        self.idle_count
    }

    /// Page size in bytes (the device granularity); 0 before the first allocation.
    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// Pages mapped now (under live blocks, plus idle pages left by a failed unwind).
    pub fn mapped_pages(&self) -> u64 {
        self.mapped_pages
    }

    /// Unmapped physical handles in the cache.
    pub fn cached_handles(&self) -> &[CachedHandle] {
        self.cache.as_slice()
    }

    /// Pages of the unmapped handles in the cache.
    pub fn cached_pages(&self) -> u64 {
        self.cache.pages()
    }

    /// Reserved virtual ranges as `(start, bytes)`.
    pub fn reserved_ranges(&self) -> Vec<(u64, u64)> {
        self.reservations.iter().map(|r| (r.va, r.bytes)).collect()
    }

    /// Live blocks as `(addr, allocated_bytes)` in address order.
    pub fn live_blocks(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<_> = self.live.iter().map(|(&a, b)| (a, b.bytes)).collect();
        v.sort_unstable();
        v
    }

    /// The page table (the address translation table, "地址翻译表"): every reserved range from low to high
    /// addresses, one row per mapped handle (one or more pages, with its physical handle) and
    /// one row per run of unmapped pages. O(reserved pages).
    pub fn page_table(&self) -> Vec<VaRangeView> {
        let p = self.page_bytes;
        let mut rows: Vec<VaRangeView> = Vec::new();
        for r in &self.reservations {
            // Extent by extent: a mapped handle's entry sits in its first page's slot.
            let mut i = 0;
            while i < r.npages {
                let va = r.va + i as u64 * p;
                match r.pages.get(i).copied().flatten() {
                    Some(pg) if pg.ext_first as usize == i => {
                        rows.push(VaRangeView {
                            va,
                            bytes: u64::from(pg.ext_pages) * p,
                            page_bytes: p,
                            state: PageState::Mapped {
                                handle: pg.handle,
                                live_blocks: pg.refs,
                                access: pg.access,
                            },
                        });
                        i += (pg.ext_pages as usize).max(1);
                    }
                    // An extent's last slot is passed over above; a stray one shows as
                    // unmapped (`validate` refuses it).
                    _ => {
                        push_unmapped_page(&mut rows, va, p);
                        i += 1;
                    }
                }
            }
        }
        rows
    }
}
