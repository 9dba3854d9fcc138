//! The full invariant walk behind [`Allocator::validate`](crate::Allocator::validate) for
//! [`LazyPagedPool`]: reservations, the free ranges and the blocks tiling the VA, every page
//! under a block mapped and open, the mapped free runs recomputed from the free ranges and
//! the page table, the extents and handles, the handle cache and the byte counters.
//! O(reserved pages + blocks · log blocks).
use std::collections::BTreeMap;

use super::LazyPagedPool;

pub(super) fn run(a: &LazyPagedPool) -> Result<(), String> {
    // The substrate: reservations, handles, the cache and its bound, the mapped-page and
    // reserved counters.
    a.vmm.validate(0)?;
    let p = a.vmm.page_bytes;
    if p == 0 {
        if !a.live.is_empty() || !a.quick.is_empty() {
            return Err("blocks without a known page size".into());
        }
        return Ok(());
    }
    for r in &a.vmm.reservations {
        if !r.fenwick_ok() {
            return Err(format!(
                "reservation {:#x}: count tree or extents wrong",
                r.va
            ));
        }
    }
    a.quick.validate()?;
    // Free ranges, blocks and quarantined spans tile every reservation exactly.
    // (start, bytes, kind): 0 free, 1 block, 2 quarantined.
    let mut spans: Vec<(u64, u64, u8)> = a.space.va.iter().map(|(&s, &l)| (s, l, 0)).collect();
    spans.extend(a.blocks_held().map(|(s, l)| (s, l, 1)));
    spans.extend(a.vmm.quarantine.iter().map(|&(s, l)| (s, l, 2)));
    crate::vmm::validate::spans_tile(
        a.vmm.reservations.iter().map(|r| (r.va, r.end())),
        &mut spans,
        |ri, s, l, kind| {
            // Pages under a block (or quarantined) are mapped; open unless quarantined.
            if kind != 0 {
                let r = &a.vmm.reservations[ri];
                let p0 = ((s - r.va) / p) as usize;
                let p1 = ((s + l - 1 - r.va) / p) as usize;
                for i in p0..=p1 {
                    match r.pages.get(i).copied().flatten() {
                        Some(pg) if pg.access || kind == 2 => {}
                        Some(_) => return Err(format!("block {s:#x}: page {i} not open")),
                        None => return Err(format!("block {s:#x}: page {i} not mapped")),
                    }
                }
            }
            crate::vmm::validate::block_fits(a.live.get(&s), s)
        },
    )?;
    // Mapped runs: recomputed from scratch.
    let mut want: BTreeMap<u64, u64> = BTreeMap::new();
    for r in &a.vmm.reservations {
        for (&st, &len) in a.space.va.range(r.va..r.end()) {
            let mut run: Option<u64> = None;
            let mut cur = st;
            while cur < st + len {
                let page = ((cur - r.va) / p) as usize;
                let next = (r.va + (page as u64 + 1) * p).min(st + len);
                let open = r
                    .pages
                    .get(page)
                    .is_some_and(|s| s.is_some_and(|s| s.access));
                match (open, run) {
                    (true, None) => run = Some(cur),
                    (false, Some(s)) => {
                        want.insert(s, cur - s);
                        run = None;
                    }
                    _ => {}
                }
                cur = next;
            }
            if let Some(s) = run {
                want.insert(s, st + len - s);
            }
        }
    }
    if want != a.space.mapped {
        let diff = want
            .iter()
            .find(|(s, l)| a.space.mapped.get(s) != Some(l))
            .map(|(s, l)| format!("expected run {s:#x}+{l}"))
            .or_else(|| {
                a.space
                    .mapped
                    .iter()
                    .find(|(s, l)| want.get(s) != Some(l))
                    .map(|(s, l)| format!("stray run {s:#x}+{l}"))
            });
        return Err(format!(
            "mapped free runs wrong: {}",
            diff.unwrap_or_default()
        ));
    }
    let by_size: Vec<(u64, u64)> = a.space.by_size.iter().copied().collect();
    let mut from_map: Vec<(u64, u64)> = want.iter().map(|(&s, &l)| (l, s)).collect();
    from_map.sort_unstable();
    if by_size != from_map || want.values().sum::<u64>() != a.space.mapped_bytes {
        return Err("mapped runs by size or their byte total disagree".into());
    }
    // Extents: every page of one is mapped to its handle.
    let mut mapped = 0u64;
    for r in &a.vmm.reservations {
        for (i, slot) in r.pages.iter().enumerate() {
            let Some(pg) = slot else { continue };
            let va = r.va + i as u64 * p;
            mapped += 1;
            let (f, n) = (pg.ext_first as usize, pg.ext_pages as usize);
            if n == 0 || f > i || f + n <= i {
                return Err(format!("page {va:#x}: extent {f}+{n} does not hold it"));
            }
            let head = r.pages.get(f).copied().flatten();
            if head.is_none_or(|h| {
                h.handle != pg.handle || h.ext_pages != pg.ext_pages || h.access != pg.access
            }) {
                return Err(format!("page {va:#x}: extent {f}+{n} is not one mapping"));
            }
        }
    }
    if mapped != a.vmm.mapped_pages {
        return Err(format!(
            "counted {mapped} mapped pages, recorded {}",
            a.vmm.mapped_pages
        ));
    }
    crate::vmm::validate::block_counters(&a.vmm.tracker.stats, a.live.values())?;
    Ok(())
}
