//! The page-table view: every reserved range of a [`LazyPagedPool`] as rows of mapped handles
//! and unmapped stretches, for people (`Display`) and machines (`serde`).
use super::LazyPagedPool;
use crate::device::PhysHandle;

/// State of one row of the page-table view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PageState {
    /// Pages mapped to one physical handle.
    Mapped {
        /// The cuMemCreate handle mapped there.
        handle: PhysHandle,
        /// Blocks touching the handle's pages, live or held for quick reuse (0: idle pages,
        /// mapped and kept for reuse in place).
        live_blocks: u32,
        /// Whether cuMemSetAccess opened it to the device.
        access: bool,
    },
    /// Reserved virtual addresses with no physical memory behind them.
    ReservedUnmapped,
}

/// One row of [`LazyPagedPool::page_table`]: a stretch of one reserved range.
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
    /// One row of the address translation table: `virtual range | physical | page size |
    /// state`, e.g. `0x7f0000000000 - 0x7f0000200000 | handle 3 | 2 MiB | mapped, 2 blocks`.
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

impl LazyPagedPool {
    /// The page table (the address translation table): every reserved range from low to
    /// high addresses, one row per mapped handle (one or more pages, with its physical
    /// handle and the blocks touching it) and one row per run of unmapped pages.
    /// O(reserved pages + blocks · log blocks).
    pub fn page_table(&self) -> Vec<VaRangeView> {
        let p = self.page_bytes;
        let mut blocks: Vec<(u64, u64)> = self.blocks_held().collect();
        blocks.sort_unstable();
        // Blocks overlapping [a, b): those starting before b whose end is after a.
        let touching = |a: u64, b: u64| -> u32 {
            let hi = blocks.partition_point(|&(s, _)| s < b);
            let lo = blocks.partition_point(|&(s, l)| s + l <= a).min(hi);
            u32::try_from(blocks[lo..hi].iter().filter(|&&(s, l)| s + l > a).count())
                .unwrap_or(u32::MAX)
        };
        let mut rows: Vec<VaRangeView> = Vec::new();
        for r in &self.reservations {
            for (i, slot) in r.pages.iter().enumerate() {
                let va = r.va + i as u64 * p;
                match slot {
                    Some(pg) if pg.ext_first as usize != i => {}
                    Some(pg) => {
                        let bytes = u64::from(pg.ext_pages) * p;
                        rows.push(VaRangeView {
                            va,
                            bytes,
                            page_bytes: p,
                            state: PageState::Mapped {
                                handle: pg.handle,
                                live_blocks: touching(va, va + bytes),
                                access: pg.access,
                            },
                        })
                    }
                    None => match rows.last_mut() {
                        Some(last)
                            if last.state == PageState::ReservedUnmapped
                                && last.va + last.bytes == va =>
                        {
                            last.bytes += p
                        }
                        _ => rows.push(VaRangeView {
                            va,
                            bytes: p,
                            page_bytes: p,
                            state: PageState::ReservedUnmapped,
                        }),
                    },
                }
            }
            // Page slots past the last one mapped so far are unmapped.
            let tail = r.va + r.pages.len() as u64 * p;
            if tail < r.end() {
                match rows.last_mut() {
                    Some(last)
                        if last.state == PageState::ReservedUnmapped
                            && last.va + last.bytes == tail =>
                    {
                        last.bytes = r.end() - last.va
                    }
                    _ => rows.push(VaRangeView {
                        va: tail,
                        bytes: r.end() - tail,
                        page_bytes: p,
                        state: PageState::ReservedUnmapped,
                    }),
                }
            }
        }
        rows
    }
}
