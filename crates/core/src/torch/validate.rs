//! The emulation's invariants, walked in full: every segment is tiled by its blocks in
//! address order with consistent links, no two neighbouring free blocks share their mapping,
//! every free block is in its pool's set and every unmapped one in the unmapped set, and
//! every counter equals what the blocks add up to.
use crate::AllocError;

use super::blocks::NIL;
use super::{TorchCachingPool, MIN_BLOCK_BYTES};

/// What the walk of every segment adds up, to be checked against the sets and counters.
#[derive(Default, Clone, Copy)]
struct Tally {
    /// Blocks reached from segment heads.
    seen: usize,
    /// Free blocks that are mapped (in a pool's free set) and unmapped ones.
    free_blocks: usize,
    unmapped_blocks: usize,
    /// Bytes of allocated blocks, of their requests, and of mapped free blocks.
    allocated: u64,
    requested: u64,
    free: u64,
    live_blocks: u64,
    /// Free blocks of split plain segments (PyTorch's inactive split), and their bytes.
    split_free: u64,
    split_free_bytes: u64,
    plain_segments: usize,
    /// Bytes mapped in expandable segments.
    mapped_expandable: u64,
}

pub(super) fn validate(t: &TorchCachingPool) -> Result<(), AllocError> {
    let mut tally = Tally::default();
    for (head, hb) in t.slab.iter() {
        if hb.prev == NIL {
            walk_segment(t, head, &mut tally)?;
        }
    }
    check_sets(t, tally)?;
    check_counters(t, tally)
}

/// Walks the chain of blocks that starts at `head` (a block with no predecessor), adding to
/// `tally`: the chain must tile its segment (plain or expandable) in address order with
/// consistent links, and each free block be in its set.
fn walk_segment(t: &TorchCachingPool, head: u32, tally: &mut Tally) -> Result<(), AllocError> {
    let bad = |m: String| Err(AllocError::Internal(m));
    let hb = t.slab.get(head);
    // The extent this chain must tile.
    let (base, bytes) = if hb.is_expandable() {
        let Some(es) = t
            .expandable
            .get(hb.segment as usize)
            .and_then(Option::as_ref)
        else {
            return bad(format!(
                "block {:#x}: its expandable segment is gone",
                hb.addr
            ));
        };
        tally.mapped_expandable += es.mapped_bytes();
        (es.va, es.range_bytes())
    } else {
        let Some(seg) = t.segments.get(&hb.addr) else {
            return bad(format!("head block {:#x} starts no segment", hb.addr));
        };
        if seg.pool != hb.pool || seg.stream != hb.stream {
            return bad(format!("segment {:#x}: pool/stream differ", hb.addr));
        }
        tally.plain_segments += 1;
        (hb.addr, seg.bytes)
    };
    if hb.addr != base {
        return bad(format!(
            "segment {base:#x} starts with block {:#x}",
            hb.addr
        ));
    }
    let end = base + bytes;
    let (mut at, mut i, mut prev) = (base, head, NIL);
    let mut prev_state: Option<(bool, bool)> = None; // (allocated, mapped)
    loop {
        let b = t.slab.get(i);
        tally.seen += 1;
        if b.addr != at || b.prev != prev {
            return bad(format!(
                "block {:#x} (expected at {at:#x}): links or addresses broken",
                b.addr
            ));
        }
        if b.size == 0
            || !b.size.is_multiple_of(MIN_BLOCK_BYTES)
            || !b.addr.is_multiple_of(MIN_BLOCK_BYTES)
        {
            return bad(format!(
                "block {:#x}: size {} or address unaligned",
                b.addr, b.size
            ));
        }
        if b.pool != hb.pool || b.stream != hb.stream || b.segment != hb.segment {
            return bad(format!("block {:#x}: pool/stream/segment differ", b.addr));
        }
        if b.allocated {
            if !b.mapped {
                return bad(format!("block {:#x}: allocated but unmapped", b.addr));
            }
            tally.allocated += b.size;
            tally.requested += b.requested;
            tally.live_blocks += 1;
        } else {
            if prev_state == Some((false, b.mapped)) {
                return bad(format!("block {:#x}: two neighbouring free blocks", b.addr));
            }
            if b.mapped {
                if !t.free[b.pool.index()].contains(b.stream, b.size, b.addr, i) {
                    return bad(format!("free block {:#x} missing from its pool", b.addr));
                }
                tally.free_blocks += 1;
                tally.free += b.size;
                if b.is_split() && !b.is_expandable() {
                    tally.split_free += 1;
                    tally.split_free_bytes += b.size;
                }
            } else {
                if t.unmapped[b.pool.index()].get(&(b.stream, b.addr)) != Some(&i) {
                    return bad(format!("unmapped block {:#x} missing from its set", b.addr));
                }
                tally.unmapped_blocks += 1;
            }
        }
        prev_state = Some((b.allocated, b.mapped));
        at = b.addr + b.size;
        if b.next == NIL {
            if at != end {
                return bad(format!("segment {base:#x}+{bytes}: blocks end at {at:#x}"));
            }
            break;
        }
        prev = i;
        i = b.next;
    }
    Ok(())
}

/// Every block was reached, and the segment, pool, unmapped and live sets hold exactly the
/// blocks the walk found.
fn check_sets(t: &TorchCachingPool, tally: Tally) -> Result<(), AllocError> {
    let bad = |m: String| Err(AllocError::Internal(m));
    let Tally {
        seen,
        plain_segments,
        free_blocks,
        unmapped_blocks,
        free,
        live_blocks,
        ..
    } = tally;
    if seen != t.slab.len() {
        return bad(format!(
            "{} blocks recorded, {seen} reachable from segments",
            t.slab.len()
        ));
    }
    if plain_segments != t.segments.len() {
        return bad(format!(
            "{} segments recorded, {plain_segments} with blocks",
            t.segments.len()
        ));
    }
    if free_blocks != t.free[0].len() + t.free[1].len() {
        return bad(format!(
            "{free_blocks} free blocks, {} in the pools",
            t.free[0].len() + t.free[1].len()
        ));
    }
    if unmapped_blocks != t.unmapped[0].len() + t.unmapped[1].len() {
        return bad("unmapped sets hold blocks no segment has".into());
    }
    if free != t.free_bytes {
        return bad(format!(
            "free bytes {} counted, {free} actual",
            t.free_bytes
        ));
    }
    if t.live.len() as u64 != live_blocks {
        return bad(format!(
            "{} live addresses, {live_blocks} allocated blocks",
            t.live.len()
        ));
    }
    for (u, i) in t.live.iter() {
        if t.live.get(u) != Some(i) {
            return bad(format!(
                "live address {u:#x} cannot be found in the live table"
            ));
        }
        let b = t.slab.get(i);
        if !b.allocated || u < b.addr || u >= b.addr + b.size {
            return bad(format!(
                "live address {u:#x} is not inside an allocated block"
            ));
        }
    }
    Ok(())
}

/// Every counter equals what the blocks add up to.
fn check_counters(t: &TorchCachingPool, tally: Tally) -> Result<(), AllocError> {
    let bad = |m: String| Err(AllocError::Internal(m));
    let Tally {
        allocated,
        requested,
        live_blocks,
        split_free,
        split_free_bytes,
        mapped_expandable,
        ..
    } = tally;
    // Handles whose release failed hold their memory until released (see `unreleased`).
    let unreleased: u64 = t.unreleased.iter().map(|u| u.bytes).sum();
    let reserved: u64 =
        t.segments.values().map(|s| s.bytes).sum::<u64>() + mapped_expandable + unreleased;
    let s = &t.tracker.stats;
    let ts = &t.torch;
    // Blocks whose free waits for other streams are out of `allocated_bytes` already.
    let mut pending_bytes = 0u64;
    for &i in &t.free_pending {
        let b = t.slab.get(i);
        if !b.allocated {
            return bad(format!(
                "pending free {:#x} is not an allocated block",
                b.addr
            ));
        }
        pending_bytes += b.size;
    }
    let pending = t.free_pending.len() as u64;
    let checks = [
        (
            "allocated_bytes",
            s.allocated_bytes.current,
            allocated - pending_bytes,
        ),
        ("requested_bytes", s.requested_bytes.current, requested),
        ("reserved_bytes", s.reserved_bytes.current, reserved),
        ("total_allocated_memory", t.total_allocated, reserved),
        (
            "segment_count",
            s.segment_count.current,
            t.segments.len() as u64,
        ),
        (
            "allocation_count",
            s.allocation_count.current,
            live_blocks - pending,
        ),
        ("active", ts.active.current, live_blocks),
        ("active_bytes", ts.active_bytes.current, allocated),
        ("inactive_split", ts.inactive_split.current, split_free),
        (
            "inactive_split_bytes",
            ts.inactive_split_bytes.current,
            split_free_bytes,
        ),
    ];
    for (name, counter, actual) in checks {
        if counter != actual {
            return bad(format!("{name}: counter {counter}, actual {actual}"));
        }
    }
    Ok(())
}
