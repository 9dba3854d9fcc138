//! The full invariant walk behind [`Allocator::validate`](crate::Allocator::validate) for
//! [`Paged`]: reservations, the free-range map, the live blocks tiling the VA with it, each
//! page's reference count against the live blocks (and those held in the quick list), the placement tree, the cache bound and
//! the byte counters. O(reserved pages + blocks · log blocks).
use super::{Paged, UNIT_BYTES};

pub(super) fn run(a: &Paged) -> Result<(), String> {
    let p = a.page_bytes;
    if p == 0 {
        if !a.reservations.is_empty() || !a.live.is_empty() || !a.cache.is_empty() {
            return Err("state without a known page size".into());
        }
        return Ok(());
    }
    // Reservations.
    for (i, r) in a.reservations.iter().enumerate() {
        if r.va % p != 0 || r.bytes % p != 0 || r.bytes == 0 {
            return Err(format!(
                "reservation {:#x}+{} not page-aligned",
                r.va, r.bytes
            ));
        }
        if r.pages.len() as u64 != r.bytes / p || r.tree.len() < 2 * r.pages.len() {
            return Err(format!("reservation {:#x}: page table of wrong size", r.va));
        }
        if let Some(n) = a.reservations.get(i + 1) {
            if n.va < r.end() {
                return Err(format!("reservations {:#x} and {:#x} overlap", r.va, n.va));
            }
        }
    }
    // Free ranges and live blocks tile every reservation exactly.
    let mut spans: Vec<(u64, u64, bool)> = a.free.iter().map(|(&s, &l)| (s, l, true)).collect();
    spans.extend(a.live.iter().map(|(&s, b)| (s, b.bytes, false)));
    spans.extend(a.quick.iter().map(|q| (q.addr, q.bytes, false)));
    if a.quick.len() > a.quick_slots
        || a.quick.iter().map(|q| q.bytes).sum::<u64>() != a.quick_bytes
        || a.quick_bytes > a.cache_limit.saturating_mul(p)
    {
        return Err(format!(
            "quick list: {} blocks of {} B (recorded {} B), bound {} blocks / {} pages",
            a.quick.len(),
            a.quick.iter().map(|q| q.bytes).sum::<u64>(),
            a.quick_bytes,
            a.quick_slots,
            a.cache_limit
        ));
    }
    spans.sort_unstable();
    let mut idx = 0;
    for r in &a.reservations {
        let mut at = r.va;
        let mut prev_free = false;
        while at < r.end() {
            let Some(&(s, l, is_free)) = spans.get(idx) else {
                return Err(format!(
                    "{at:#x} in reservation {:#x} is neither free nor live",
                    r.va
                ));
            };
            if s != at {
                return Err(format!("gap or overlap at {at:#x} (next span at {s:#x})"));
            }
            if l == 0 || l % UNIT_BYTES != 0 || s % UNIT_BYTES != 0 {
                return Err(format!("span {s:#x}+{l} not in {UNIT_BYTES}-byte units"));
            }
            if is_free && prev_free {
                return Err(format!("free ranges not coalesced at {s:#x}"));
            }
            if !is_free {
                if let Some(blk) = a.live.get(&s) {
                    if blk.requested > blk.bytes {
                        return Err(format!(
                            "block {s:#x}: requested {} > allocated {}",
                            blk.requested, blk.bytes
                        ));
                    }
                }
            }
            prev_free = is_free;
            at = s + l;
            idx += 1;
        }
        if at != r.end() {
            return Err(format!("a span crosses the end of reservation {:#x}", r.va));
        }
    }
    if idx != spans.len() {
        return Err(format!(
            "{} spans lie outside every reservation",
            spans.len() - idx
        ));
    }
    // Page reference counts against the live blocks.
    let mut mapped = 0u64;
    let mut idle = 0u64;
    let mut handles = std::collections::HashSet::new();
    for r in &a.reservations {
        let mut refs = vec![0u32; r.pages.len()];
        let held = a.live.iter().map(|(&s, b)| (s, b.bytes));
        let held = held.chain(a.quick.iter().map(|q| (q.addr, q.bytes)));
        for (s, bytes) in held.filter(|&(s, _)| s >= r.va && s < r.end()) {
            let p0 = ((s - r.va) / p) as usize;
            let p1 = ((s + bytes - 1 - r.va) / p) as usize;
            for x in refs.iter_mut().take(p1 + 1).skip(p0) {
                *x += 1;
            }
        }
        for (i, (slot, &want)) in r.pages.iter().zip(&refs).enumerate() {
            match slot {
                Some(pg) => {
                    mapped += 1;
                    if !handles.insert(pg.handle) {
                        return Err(format!("handle {} mapped twice", pg.handle.0));
                    }
                    if pg.refs != want {
                        return Err(format!(
                            "page {:#x}: {} refs recorded, {want} live blocks touch it",
                            r.va + i as u64 * p,
                            pg.refs
                        ));
                    }
                    let va = r.va + i as u64 * p;
                    if pg.refs == 0 {
                        idle += 1;
                        if !a.idle.contains(&va) {
                            return Err(format!("idle page {va:#x} not in the idle set"));
                        }
                    } else if !pg.access {
                        return Err(format!(
                            "page {:#x} in use without access",
                            r.va + i as u64 * p
                        ));
                    }
                }
                None if want > 0 => {
                    return Err(format!(
                        "page {:#x} touched by {want} live blocks is not mapped",
                        r.va + i as u64 * p
                    ))
                }
                None => {}
            }
            let (tail, head) = a.leaf_values(r, i);
            let (t, h) = (r.tree.get(2 * i), r.tree.get(2 * i + 1));
            if u64::from(t) * UNIT_BYTES != tail || u64::from(h) * UNIT_BYTES != head {
                return Err(format!(
                    "page {:#x}: tree leaves ({t}, {h}) units, free map says ({tail}, {head}) bytes",
                    r.va + i as u64 * p
                ));
            }
        }
        r.tree.check()?;
    }
    if mapped != a.mapped_pages || idle != a.idle.len() as u64 {
        return Err(format!(
            "counted {mapped} mapped / {idle} idle pages, recorded {} / {}",
            a.mapped_pages,
            a.idle.len()
        ));
    }
    for h in &a.cache {
        if !handles.insert(*h) {
            return Err(format!("cached handle {} also in use", h.0));
        }
    }
    if a.cache.len() as u64 > a.cache_limit && !a.trim_pending {
        return Err(format!(
            "{} cached pages, bound {}",
            a.cache.len(),
            a.cache_limit
        ));
    }
    // Byte counters.
    let s = &a.tracker.stats;
    let alloc: u64 = a.live.values().map(|b| b.bytes).sum();
    let req: u64 = a.live.values().map(|b| b.requested).sum();
    let held = a.mapped_pages + a.cache.len() as u64;
    if s.allocated_bytes.current != alloc
        || s.requested_bytes.current != req
        || s.allocation_count.current != a.live.len() as u64
    {
        return Err(format!(
            "counters say {} allocated / {} requested / {} blocks, blocks sum to {alloc} / {req} / {}",
            s.allocated_bytes.current,
            s.requested_bytes.current,
            s.allocation_count.current,
            a.live.len()
        ));
    }
    if s.reserved_bytes.current != held * p || s.segment_count.current != held {
        return Err(format!(
            "reserved counter {} B / {} pages, but {held} pages are held",
            s.reserved_bytes.current, s.segment_count.current
        ));
    }
    Ok(())
}
