//! The full invariant walk behind [`Allocator::validate`](crate::Allocator::validate) for
//! [`PagedPool`]: reservations, the free-range map, the live blocks tiling the VA with it, each
//! page's reference count against the live blocks (and those held in the quick list), the fit tags, the cache bound and
//! the byte counters. O(reserved pages + blocks · log blocks).
use super::PagedPool;
use crate::vmm::validate::{block_counters, block_fits, spans_tile};

pub(super) fn run(a: &PagedPool) -> Result<(), String> {
    // The substrate: reservations, handles, the cache and its bound (shared with the idle
    // pages), the mapped-page and reserved counters.
    a.vmm.validate(a.idle_count)?;
    let p = a.vmm.page_bytes;
    if p == 0 {
        if !a.live.is_empty() || !a.quick.is_empty() {
            return Err("blocks without a known page size".into());
        }
        return Ok(());
    }
    a.quick.validate()?;
    // Free ranges, live blocks (and those in the quick list) and quarantined spans tile
    // every reservation exactly.
    let mut spans: Vec<(u64, u64, u8)> = a.free.iter().map(|(&s, &l)| (s, l, 0)).collect();
    spans.extend(a.live.iter().map(|(&s, b)| (s, b.bytes, 1)));
    spans.extend(a.quick.iter().map(|q| (q.addr, q.bytes, 1)));
    spans.extend(a.vmm.quarantine.iter().map(|&(s, l)| (s, l, 1)));
    spans_tile(
        a.vmm.reservations.iter().map(|r| (r.va, r.end())),
        &mut spans,
        |_, s, _, kind| {
            if kind == 0 {
                Ok(())
            } else {
                block_fits(a.live.get(&s), s)
            }
        },
    )?;
    // Page reference counts against the live blocks.
    let mut mapped = 0u64;
    let mut idle = 0u64;
    for r in &a.vmm.reservations {
        // Blocks (live or quick) and quarantined spans touching each page.
        let mut refs = vec![0u32; r.npages];
        let mut quarantined = vec![false; r.npages];
        let held = a.live.iter().map(|(&s, b)| (s, b.bytes, false));
        let held = held.chain(a.quick.iter().map(|q| (q.addr, q.bytes, false)));
        let held = held.chain(a.vmm.quarantine.iter().map(|&(s, l)| (s, l, true)));
        for (s, bytes, q) in held.filter(|&(s, _, _)| s >= r.va && s < r.end()) {
            let p0 = ((s - r.va) / p) as usize;
            let p1 = ((s + bytes - 1 - r.va) / p) as usize;
            for x in refs.iter_mut().take(p1 + 1).skip(p0) {
                *x += 1;
            }
            if q {
                for x in quarantined.iter_mut().take(p1 + 1).skip(p0) {
                    *x = true;
                }
            }
        }
        // Extent by extent: an entry in the extent's first slot, a copy in its last, and
        // `None` between them and on every unmapped page.
        let mut i = 0;
        while i < r.npages {
            let va = r.va + i as u64 * p;
            let Some(pg) = r.pages.get(i).copied().flatten() else {
                if refs[i] > 0 {
                    return Err(format!(
                        "page {va:#x} touched by {} blocks is not mapped",
                        refs[i]
                    ));
                }
                i += 1;
                continue;
            };
            let (f, n) = (pg.ext_first as usize, pg.ext_pages as usize);
            if f != i || n == 0 || i + n > r.npages {
                return Err(format!(
                    "page {va:#x}: entry of extent {f}+{n} where an extent starts"
                ));
            }
            if n > 1 {
                if r.pages.get(i + n - 1).copied().flatten() != Some(pg) {
                    return Err(format!(
                        "extent {va:#x}+{n} pages: its last page does not repeat its entry"
                    ));
                }
                if let Some(j) =
                    (i + 1..i + n - 1).find(|&j| r.pages.get(j).copied().flatten().is_some())
                {
                    return Err(format!(
                        "extent {va:#x}+{n} pages: an entry inside it, at page {j}"
                    ));
                }
            }
            mapped += n as u64;
            for j in i..i + n {
                let (want, va) = (refs[j], r.va + j as u64 * p);
                if pg.refs != want {
                    return Err(format!(
                        "page {va:#x}: {} refs recorded, {want} blocks touch it",
                        pg.refs
                    ));
                }
                if pg.refs == 0 {
                    idle += 1;
                    if !r.index.contains(j) || n != 1 {
                        return Err(format!("idle page {va:#x} not a listed single page"));
                    }
                } else if !pg.access && !quarantined[j] {
                    return Err(format!("page {va:#x} in use without access"));
                }
            }
            i += n;
        }
        r.index.check()?;
    }
    check_fit_tags(a)?;
    let listed: usize = a.vmm.reservations.iter().map(|r| r.index.len()).sum();
    if mapped != a.vmm.mapped_pages || idle != a.idle_count || listed as u64 != idle {
        return Err(format!(
            "counted {mapped} mapped / {idle} idle pages, recorded {} / {} ({listed} listed)",
            a.vmm.mapped_pages, a.idle_count
        ));
    }
    block_counters(&a.vmm.tracker.stats, a.live.values())?;
    Ok(())
}

/// Every free range's fit tag against [`super::placement::fit_of`] recomputed from the
/// range, and the recorded maximum against the tags.
fn check_fit_tags(a: &PagedPool) -> Result<(), String> {
    let p = a.vmm.page_bytes;
    let mut max = 0;
    for (i, (&st, &len)) in a.free.iter().enumerate() {
        let Some(r) = a.vmm.res_of(st).and_then(|ri| a.vmm.reservations.get(ri)) else {
            return Err(format!("free range {st:#x} outside every reservation"));
        };
        let want = super::placement::fit_of(p, r.va, st, len);
        let tag = a.free.tag(i);
        if tag != want {
            return Err(format!(
                "free range {st:#x}+{len}: fit tag {tag} units, the range offers {want}"
            ));
        }
        max = max.max(tag);
    }
    if a.free.max_tag() != max {
        return Err(format!(
            "largest fit tag recorded as {}, the tags say {max}",
            a.free.max_tag()
        ));
    }
    Ok(())
}
