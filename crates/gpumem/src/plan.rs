//! The planned layout of a trace: how much memory a placement needs when it knows the whole
//! trace in advance and never moves a block. Every block gets one offset for its whole life;
//! two blocks live at the same time never overlap; the layout's extent is what a single
//! mapping of that size would reserve, with no driver call after it.
//!
//! Finding the smallest such layout is NP-hard (dynamic storage allocation, Garey and Johnson
//! 1979). This is the *greedy by size* planner of TensorFlow Lite's arena planner (Pisarchyk
//! and Lee, "Efficient Memory Management for Deep Neural Net Inference", 2020): blocks in
//! decreasing size, each at the smallest gap between the blocks already placed that overlap it
//! in time, else above them; and the same placement with the longest-lived blocks first
//! ([`PlanOrder`]); the smaller of the two layouts is kept. Neither is optimal, but on DNN
//! training traces the better lands close to the peak of live bytes, the floor for any
//! placement: by size on most, longest-lived first where a few small blocks live long
//! (BENCHMARKS.md, "Allocators on traces", the planned layout column). Set beside an
//! allocator's peak, it says how much of that allocator's overhead a better placement could
//! save and how much comes from not knowing the future.
//!
//! Blocks are sized as allocated by PyTorch's caching allocator: the request rounded up to
//! [`PLAN_ROUND_BYTES`]. Time is the event index: a block lives from its allocation event to
//! the event that frees it (blocks live before recording started from the first event, blocks
//! never freed to the last).
use rustc_hash::FxHashMap;

use crate::trace::{Action, Trace};

/// Requests are rounded up to this many bytes (PyTorch's smallest block).
pub const PLAN_ROUND_BYTES: u64 = 512;

/// Most blocks [`planned_layout`] plans: the planner's time grows with the number of blocks
/// times the blocks live beside each, up to quadratically (its time on the shipped traces:
/// BENCHMARKS.md, "Allocators on traces"); above it `gpumem replay` says the layout was
/// skipped.
pub const PLAN_MAX_BLOCKS: usize = 250_000;

/// The order in which [`plan_ordered`] places blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanOrder {
    /// Largest first (TensorFlow Lite's greedy by size).
    Size,
    /// Longest-lived first, then largest.
    Lifetime,
}

/// One block's size and lifetime, for [`plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// Bytes the block occupies.
    pub bytes: u64,
    /// First moment it is live (an event index).
    pub start: u64,
    /// First moment it is no longer live (`end > start`; `end == start` is treated as
    /// `start + 1`).
    pub end: u64,
}

impl Lifetime {
    /// Whether the two blocks are live at some same moment (so may not share an address).
    pub fn overlaps(&self, o: &Lifetime) -> bool {
        self.start < o.end.max(o.start + 1) && o.start < self.end.max(self.start + 1)
    }
}

/// The planned layout of one device's events ([`planned_layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PlannedLayout {
    /// Blocks planned.
    pub blocks: u64,
    /// Highest sum of live block bytes (rounded sizes): no layout is smaller.
    pub peak_live_bytes: u64,
    /// Extent of the layout, in bytes: the memory it needs.
    pub layout_bytes: u64,
    /// The order that gave it ([`plan`] keeps the smaller of the two layouts).
    pub order: PlanOrder,
}

/// Why no layout was planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// More blocks than [`PLAN_MAX_BLOCKS`].
    #[error("{blocks} blocks, more than the planner's limit of {limit}")]
    TooManyBlocks {
        /// Blocks in the trace.
        blocks: usize,
        /// [`PLAN_MAX_BLOCKS`].
        limit: usize,
    },
}

/// The extent of a layout: the largest `offset + bytes`.
pub fn extent(blocks: &[Lifetime], offsets: &[u64]) -> u64 {
    blocks
        .iter()
        .zip(offsets)
        .map(|(b, &o)| o.saturating_add(b.bytes))
        .max()
        .unwrap_or(0)
}

/// The smaller of the layouts of [`plan_ordered`] in both [`PlanOrder`]s (by size on a tie),
/// worked out side by side in two threads: the offsets and the order that gave them.
pub fn plan(blocks: &[Lifetime]) -> (Vec<u64>, PlanOrder) {
    let (by_size, by_life) = std::thread::scope(|sc| {
        let life = sc.spawn(|| plan_ordered(blocks, PlanOrder::Lifetime));
        let size = plan_ordered(blocks, PlanOrder::Size);
        // A panic in the other thread is a bug of `plan_ordered`: raise it here.
        let life = life.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        (size, life)
    });
    if extent(blocks, &by_life) < extent(blocks, &by_size) {
        (by_life, PlanOrder::Lifetime)
    } else {
        (by_size, PlanOrder::Size)
    }
}

/// Offsets, in bytes, one per block of `blocks` (same order), such that two blocks whose
/// lifetimes overlap never overlap in address: blocks taken in `order_by`, each at the
/// smallest gap that holds it among the blocks already placed that overlap it in time, else
/// above them (see the module docs).
pub fn plan_ordered(blocks: &[Lifetime], order_by: PlanOrder) -> Vec<u64> {
    let n = blocks.len();
    let end = |b: &Lifetime| b.end.max(b.start + 1);
    let mut order: Vec<usize> = (0..n).collect();
    // Largest (or longest-lived, then largest) first; ties by start, then by index, so the
    // plan is deterministic.
    let key = |i: usize| {
        let b = &blocks[i];
        match order_by {
            PlanOrder::Size => (b.bytes, 0),
            PlanOrder::Lifetime => (end(b) - b.start, b.bytes),
        }
    };
    order.sort_by(|&a, &b| {
        key(b)
            .cmp(&key(a))
            .then(blocks[a].start.cmp(&blocks[b].start))
            .then(a.cmp(&b))
    });
    // The blocks that overlap one in time are found through the blocks in order of start,
    // in chunks that know the latest end of their placed blocks: a chunk whose placed
    // blocks all ended before the block starts is skipped whole, so a training trace's
    // thousands of short-lived blocks are not walked for every block.
    const CHUNK: usize = 64;
    let mut by_start: Vec<usize> = (0..n).collect();
    by_start.sort_by_key(|&i| (blocks[i].start, i));
    let mut pos = vec![0usize; n];
    for (p, &i) in by_start.iter().enumerate() {
        pos[i] = p;
    }
    let mut placed = vec![false; n];
    let mut chunk_end = vec![0u64; n.div_ceil(CHUNK)];
    let mut offsets = vec![0u64; n];
    let mut busy: Vec<(u64, u64)> = Vec::new();
    for &i in &order {
        let b = &blocks[i];
        let (s, e) = (b.start, end(b));
        // Blocks at positions below `limit` start before this one ends.
        let limit = by_start.partition_point(|&j| blocks[j].start < e);
        busy.clear();
        for (c, &ce) in chunk_end.iter().enumerate().take(limit.div_ceil(CHUNK)) {
            if ce <= s {
                continue;
            }
            for p in c * CHUNK..((c + 1) * CHUNK).min(limit) {
                let j = by_start[p];
                if placed[p] && end(&blocks[j]) > s {
                    busy.push((offsets[j], offsets[j].saturating_add(blocks[j].bytes)));
                }
            }
        }
        busy.sort_unstable();
        // The smallest gap that holds the block (the lowest of equal gaps), else the top.
        let mut best: Option<(u64, u64)> = None;
        let mut cursor = 0u64;
        for &(lo, hi) in &busy {
            if lo > cursor {
                let gap = lo - cursor;
                if gap >= b.bytes && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(hi);
        }
        offsets[i] = best.map_or(cursor, |(_, at)| at);
        placed[pos[i]] = true;
        let c = pos[i] / CHUNK;
        chunk_end[c] = chunk_end[c].max(e);
    }
    offsets
}

/// The bytes a request of `requested` bytes takes in a plan: rounded up to
/// [`PLAN_ROUND_BYTES`] (at least one unit); `None` when that rounding overflows, a request
/// every allocator refuses.
pub fn planned_bytes(requested: u64) -> Option<u64> {
    requested
        .max(1)
        .div_ceil(PLAN_ROUND_BYTES)
        .checked_mul(PLAN_ROUND_BYTES)
}

/// The lifetimes of `device`'s blocks in `trace`, sizes rounded up to [`PLAN_ROUND_BYTES`].
/// An allocation at an address that is still live ends the block there first (as a free
/// would); a free of an unknown address is ignored (replay counts those). A request too
/// large to round has no block (every allocator refuses it, and replay drops it with its
/// free).
pub fn lifetimes(trace: &Trace, device: u32) -> Vec<Lifetime> {
    let mut open: FxHashMap<u64, (u64, u64)> = FxHashMap::default();
    let mut out = Vec::new();
    for p in trace.preexisting.iter().filter(|p| p.device == device) {
        if let Some(bytes) = planned_bytes(p.size_bytes) {
            open.insert(p.addr, (0, bytes));
        }
    }
    let mut t = 0u64;
    for e in trace.events.iter().filter(|e| e.device == device) {
        match e.action {
            Action::Alloc => {
                // An allocation at a live address ends the block there first.
                let ended = match planned_bytes(e.size_bytes) {
                    Some(bytes) => open.insert(e.addr, (t, bytes)),
                    None => open.remove(&e.addr),
                };
                if let Some((start, bytes)) = ended {
                    out.push(Lifetime {
                        bytes,
                        start,
                        end: t,
                    });
                }
            }
            Action::Free => {
                if let Some((start, bytes)) = open.remove(&e.addr) {
                    out.push(Lifetime {
                        bytes,
                        start,
                        end: t,
                    });
                }
            }
            _ => {}
        }
        t += 1;
    }
    let mut rest: Vec<(u64, (u64, u64))> = open.into_iter().collect();
    rest.sort_unstable();
    out.extend(rest.into_iter().map(|(_, (start, bytes))| Lifetime {
        bytes,
        start,
        end: t.max(start + 1),
    }));
    out
}

/// Plans the layout of `device`'s blocks in `trace` ([`lifetimes`], [`plan`]).
///
/// # Errors
/// [`PlanError::TooManyBlocks`] above [`PLAN_MAX_BLOCKS`] blocks.
pub fn planned_layout(trace: &Trace, device: u32) -> Result<PlannedLayout, PlanError> {
    let blocks = lifetimes(trace, device);
    if blocks.len() > PLAN_MAX_BLOCKS {
        return Err(PlanError::TooManyBlocks {
            blocks: blocks.len(),
            limit: PLAN_MAX_BLOCKS,
        });
    }
    let (offsets, order) = plan(&blocks);
    Ok(PlannedLayout {
        blocks: blocks.len() as u64,
        peak_live_bytes: peak_live(&blocks),
        layout_bytes: extent(&blocks, &offsets),
        order,
    })
}

/// Highest sum of bytes of blocks live at the same moment.
pub fn peak_live(blocks: &[Lifetime]) -> u64 {
    let mut edges: Vec<(u64, bool, u64)> = Vec::with_capacity(blocks.len() * 2);
    for b in blocks {
        edges.push((b.start, true, b.bytes));
        edges.push((b.end.max(b.start + 1), false, b.bytes));
    }
    // Ends before starts at the same moment (`false < true`): a block freed at t and one
    // allocated at t do not overlap.
    edges.sort_unstable();
    let (mut live, mut peak) = (0u64, 0u64);
    for (_, start, bytes) in edges {
        if start {
            live = live.saturating_add(bytes);
            peak = peak.max(live);
        } else {
            live = live.saturating_sub(bytes);
        }
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Event;
    use proptest::prelude::*;

    fn lt(bytes: u64, start: u64, end: u64) -> Lifetime {
        Lifetime { bytes, start, end }
    }

    fn check(blocks: &[Lifetime], offsets: &[u64]) {
        for (i, a) in blocks.iter().enumerate() {
            for (j, b) in blocks.iter().enumerate().skip(i + 1) {
                if a.overlaps(b) {
                    let (oa, ob) = (offsets[i], offsets[j]);
                    assert!(
                        oa + a.bytes <= ob || ob + b.bytes <= oa,
                        "{a:?} at {oa} and {b:?} at {ob} overlap"
                    );
                }
            }
        }
    }

    #[test]
    fn blocks_apart_in_time_share_addresses() {
        let blocks = [lt(100, 0, 2), lt(100, 2, 4), lt(50, 4, 6)];
        assert_eq!(plan(&blocks), (vec![0, 0, 0], PlanOrder::Size));
        assert_eq!(peak_live(&blocks), 100);
    }

    #[test]
    fn a_small_block_goes_into_the_smallest_gap_that_holds_it() {
        // Live together: 300 @0, 100 @300 (placed by size), then a hole is made by a block
        // that ends early. Layout: A=300 [0,10), B=200 [0,4), C=200 [5,10), D=100 [0,10).
        // By size: A at 0; B at 300; C at 300 (B is over by then); D above: 500.
        let blocks = [
            lt(300, 0, 10),
            lt(200, 0, 4),
            lt(200, 5, 10),
            lt(100, 0, 10),
        ];
        let o = plan_ordered(&blocks, PlanOrder::Size);
        check(&blocks, &o);
        assert_eq!(o, vec![0, 300, 300, 500]);
        // A gap of exactly the block's size between two busy ranges is taken: A @0, B @100
        // (over at 3), C @200, then D (from 4) in B's place between A and C.
        let blocks = [lt(100, 0, 9), lt(100, 0, 3), lt(100, 0, 9), lt(100, 4, 9)];
        let o = plan_ordered(&blocks, PlanOrder::Size);
        check(&blocks, &o);
        assert_eq!(o, vec![0, 100, 200, 100]);
        // Of two gaps that hold it, the smaller: A @0 and C @600 end at 3, B @400 and D @760
        // stay; from 4 the gaps are [0, 400) and [600, 760), and E (150) takes the second.
        let blocks = [
            lt(400, 0, 3),
            lt(200, 0, 9),
            lt(160, 0, 3),
            lt(155, 0, 9),
            lt(150, 4, 9),
        ];
        let o = plan_ordered(&blocks, PlanOrder::Size);
        check(&blocks, &o);
        assert_eq!(o, vec![0, 400, 600, 760, 600]);
    }

    #[test]
    fn longest_lived_first_wins_where_largest_first_leaves_a_hole_too_small() {
        // A 30 [1, 6), B 20 [5, 10), C 20 [3, 7), D 30 [0, 3); peak live 70 at t = 5.
        let blocks = [lt(30, 1, 6), lt(20, 5, 10), lt(20, 3, 7), lt(30, 0, 3)];
        // Largest first: D @0, A @30, C @0 (D is over), then B finds only [20, 30) free
        // beside C and A and goes on top: 80.
        let by_size = plan_ordered(&blocks, PlanOrder::Size);
        assert_eq!(by_size, vec![30, 60, 0, 0]);
        // Longest-lived first (A and B, 5 events; then C; then D): A @0, B @30, C @50,
        // D @30 (B has not started): 70, the peak.
        let by_life = plan_ordered(&blocks, PlanOrder::Lifetime);
        assert_eq!(by_life, vec![0, 30, 50, 30]);
        check(&blocks, &by_size);
        check(&blocks, &by_life);
        assert_eq!(plan(&blocks), (by_life, PlanOrder::Lifetime));
        assert_eq!(peak_live(&blocks), 70);
    }

    /// A request no allocator can serve (its rounding overflows) has no block, and its free
    /// nothing to end: the layout is that of the rest of the trace.
    #[test]
    fn an_impossible_request_has_no_block() {
        let t = Trace {
            events: vec![
                Event::new(Action::Alloc, 0x10, u64::MAX),
                Event::new(Action::Alloc, 0x20, 1000),
                Event::new(Action::Free, 0x10, 0),
                Event::new(Action::Free, 0x20, 0),
            ],
            ..Trace::default()
        };
        assert_eq!(lifetimes(&t, 0), vec![lt(1024, 1, 3)]);
        assert_eq!(planned_layout(&t, 0).unwrap().peak_live_bytes, 1024);
    }

    #[test]
    fn lifetimes_from_a_trace() {
        let t = Trace {
            events: vec![
                Event::new(Action::Alloc, 0x10, 1000),
                Event::new(Action::Alloc, 0x20, 1),
                Event::new(Action::Free, 0x10, 1000),
                Event::new(Action::Free, 0x99, 8),
            ],
            ..Trace::default()
        };
        let l = lifetimes(&t, 0);
        assert_eq!(l, vec![lt(1024, 0, 2), lt(512, 1, 4)]);
        let p = planned_layout(&t, 0).unwrap();
        assert_eq!(
            p,
            PlannedLayout {
                blocks: 2,
                peak_live_bytes: 1536,
                layout_bytes: 1536,
                order: PlanOrder::Size,
            }
        );
        assert_eq!(lifetimes(&t, 1), vec![]);
    }

    proptest! {
        #[test]
        fn the_plan_never_overlaps_live_blocks_and_is_at_least_the_peak(
            raw in proptest::collection::vec((1u64..10_000, 0u64..200, 1u64..60), 0..120)
        ) {
            let blocks: Vec<Lifetime> =
                raw.iter().map(|&(b, s, d)| lt(b, s, s + d)).collect();
            let (o, order) = plan(&blocks);
            check(&blocks, &o);
            let by_life = plan_ordered(&blocks, PlanOrder::Lifetime);
            check(&blocks, &by_life);
            let by_size = plan_ordered(&blocks, PlanOrder::Size);
            // The smaller of the two, by size on a tie.
            let (es, el) = (extent(&blocks, &by_size), extent(&blocks, &by_life));
            prop_assert_eq!(extent(&blocks, &o), es.min(el));
            prop_assert_eq!(order, if el < es { PlanOrder::Lifetime } else { PlanOrder::Size });
            let extent = extent(&blocks, &o);
            let peak = peak_live(&blocks);
            prop_assert!(extent >= peak);
            // Never worse than stacking every block: the sum of all sizes.
            prop_assert!(extent <= blocks.iter().map(|b| b.bytes).sum::<u64>());
            // The peak by brute force over every moment.
            let brute = (0..260u64)
                .map(|t| blocks.iter().filter(|b| b.start <= t && t < b.end).map(|b| b.bytes).sum::<u64>())
                .max()
                .unwrap_or(0);
            prop_assert_eq!(peak, brute);
        }
    }
}
