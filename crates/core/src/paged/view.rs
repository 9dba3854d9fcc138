//! The page-table view of a [`PagedPool`]: one row per reserved range, mapped handle, idle
//! page or hole (the "address translation table" of the design notes), and the counters
//! read from outside.
use super::*;
use crate::vmm::view::push_unmapped_page;
use crate::vmm::VaRangeView;

impl PagedPool {
    /// Idle pages: mapped, but touched by no live block.
    pub fn idle_pages(&self) -> u64 {
        self.idle_count
    }

    crate::vmm::vmm_accessors!();

    /// The page table (the address translation table, "地址翻译表"): every reserved range from low to high
    /// addresses, one row per mapped handle (one or more pages, with its physical handle) and
    /// one row per run of unmapped pages. O(reserved pages).
    pub fn page_table(&self) -> Vec<VaRangeView> {
        let p = self.vmm.page_bytes;
        let mut rows: Vec<VaRangeView> = Vec::new();
        for r in &self.vmm.reservations {
            // Extent by extent: a mapped handle's entry sits in its first page's slot.
            let mut i = 0;
            while i < r.npages {
                let va = r.va + i as u64 * p;
                match r.pages.get(i).copied().flatten() {
                    Some(pg) if pg.ext_first as usize == i => {
                        rows.push(VaRangeView::mapped(
                            va,
                            u64::from(pg.ext_pages) * p,
                            p,
                            pg.handle,
                            pg.refs,
                            pg.access,
                        ));
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
