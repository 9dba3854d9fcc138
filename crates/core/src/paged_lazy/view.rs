//! The page-table view: every reserved range of a [`LazyPagedPool`] as rows of mapped handles
//! and unmapped stretches, for people (`Display`) and machines (`serde`).
use super::LazyPagedPool;
use crate::vmm::view::push_unmapped_page;
use crate::vmm::VaRangeView;

impl LazyPagedPool {
    /// The page table (the address translation table): every reserved range from low to
    /// high addresses, one row per mapped handle (one or more pages, with its physical
    /// handle and the blocks touching it) and one row per run of unmapped pages.
    /// O(reserved pages + blocks · log blocks).
    pub fn page_table(&self) -> Vec<VaRangeView> {
        let p = self.vmm.page_bytes;
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
        for r in &self.vmm.reservations {
            for (i, slot) in r.pages.iter().enumerate() {
                let va = r.va + i as u64 * p;
                match slot {
                    Some(pg) if pg.ext_first as usize != i => {}
                    Some(pg) => {
                        let bytes = u64::from(pg.ext_pages) * p;
                        rows.push(VaRangeView::mapped(
                            va,
                            bytes,
                            p,
                            pg.handle,
                            touching(va, va + bytes),
                            pg.access,
                        ))
                    }
                    None => push_unmapped_page(&mut rows, va, p),
                }
            }
        }
        rows
    }
}
