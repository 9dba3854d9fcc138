//! Invariant walks shared by both placements: spans tiling the reserved ranges, and the
//! block counters against the live blocks.
use super::UNIT_BYTES;

/// Spans (start, bytes, kind; kind 0 = free, any other = held) tile every reservation
/// `(start, end)` exactly, in order: no gap, no overlap, whole [`UNIT_BYTES`] units, free
/// ranges coalesced, no span outside every reservation. `per_span(reservation index, start,
/// bytes, kind)` checks what else each span must satisfy. Sorts `spans`.
pub(crate) fn spans_tile(
    reservations: impl IntoIterator<Item = (u64, u64)>,
    spans: &mut [(u64, u64, u8)],
    mut per_span: impl FnMut(usize, u64, u64, u8) -> Result<(), String>,
) -> Result<(), String> {
    spans.sort_unstable();
    let mut idx = 0;
    for (ri, (va, end)) in reservations.into_iter().enumerate() {
        let mut at = va;
        let mut prev_free = false;
        while at < end {
            let Some(&(s, l, kind)) = spans.get(idx) else {
                return Err(format!(
                    "{at:#x} in reservation {va:#x} is neither free nor held"
                ));
            };
            if s != at {
                return Err(format!("gap or overlap at {at:#x} (next span at {s:#x})"));
            }
            if l == 0 || l % UNIT_BYTES != 0 || s % UNIT_BYTES != 0 {
                return Err(format!("span {s:#x}+{l} not in {UNIT_BYTES}-byte units"));
            }
            if kind == 0 && prev_free {
                return Err(format!("free ranges not coalesced at {s:#x}"));
            }
            per_span(ri, s, l, kind)?;
            prev_free = kind == 0;
            at = s + l;
            idx += 1;
        }
        if at != end {
            return Err(format!("a span crosses the end of reservation {va:#x}"));
        }
    }
    if idx != spans.len() {
        return Err(format!(
            "{} spans lie outside every reservation",
            spans.len() - idx
        ));
    }
    Ok(())
}

/// A live block's requested bytes fit in its allocated ones.
pub(crate) fn block_fits(live: Option<&super::LiveBlock>, s: u64) -> Result<(), String> {
    match live {
        Some(blk) if blk.requested > blk.bytes => Err(format!(
            "block {s:#x}: requested {} > allocated {}",
            blk.requested, blk.bytes
        )),
        _ => Ok(()),
    }
}

/// The block counters of `stats` (allocated, requested, count) against the live blocks;
pub(crate) fn block_counters<'a>(
    s: &crate::Stats,
    live: impl Iterator<Item = &'a super::LiveBlock>,
) -> Result<(), String> {
    let (mut alloc, mut req, mut n) = (0u64, 0u64, 0usize);
    for b in live {
        alloc += b.bytes;
        req += b.requested;
        n += 1;
    }
    if s.allocated_bytes.current != alloc
        || s.requested_bytes.current != req
        || s.allocation_count.current != n as u64
    {
        return Err(format!(
            "counters say {} allocated / {} requested / {} blocks, blocks sum to {alloc} / {req} / {}",
            s.allocated_bytes.current,
            s.requested_bytes.current,
            s.allocation_count.current,
            n
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod spans_tile_tests {
    use super::{spans_tile, UNIT_BYTES};

    const U: u64 = UNIT_BYTES;

    fn tile(spans: &[(u64, u64, u8)]) -> Result<Vec<(usize, u64)>, String> {
        let mut seen = Vec::new();
        let mut spans = spans.to_vec();
        spans_tile([(0, 4 * U), (8 * U, 10 * U)], &mut spans, |ri, s, _, _| {
            seen.push((ri, s));
            Ok(())
        })?;
        Ok(seen)
    }

    #[test]
    fn an_exact_tiling_passes_and_every_span_is_checked_in_order() {
        let seen = tile(&[(8 * U, 2 * U, 0), (2 * U, 2 * U, 1), (0, 2 * U, 0)]).unwrap();
        assert_eq!(seen, [(0, 0), (0, 2 * U), (1, 8 * U)]);
    }

    #[test]
    fn gaps_overlaps_uncoalesced_free_ranges_and_strays_are_refused() {
        let gap = tile(&[(0, U, 0), (2 * U, 2 * U, 1), (8 * U, 2 * U, 0)]).unwrap_err();
        assert!(gap.contains("gap or overlap at"), "{gap}");
        let free = tile(&[(0, U, 0), (U, 3 * U, 0), (8 * U, 2 * U, 1)]).unwrap_err();
        assert!(free.contains("not coalesced"), "{free}");
        let cross = tile(&[(0, 5 * U, 1), (8 * U, 2 * U, 1)]).unwrap_err();
        assert!(cross.contains("crosses the end"), "{cross}");
        let stray = tile(&[(0, 4 * U, 1), (8 * U, 2 * U, 1), (20 * U, U, 1)]).unwrap_err();
        assert!(stray.contains("1 spans lie outside"), "{stray}");
        let short = tile(&[(0, 4 * U, 1)]).unwrap_err();
        assert!(short.contains("neither free nor held"), "{short}");
        let unit = tile(&[(0, 4 * U, 1), (8 * U, U + 1, 1)]).unwrap_err();
        assert!(unit.contains("-byte units"), "{unit}");
    }
}
