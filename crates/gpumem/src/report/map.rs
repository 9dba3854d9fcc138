//! The memory map at one event: segments and VA ranges as rows, each cut into spans by state.
//!
//! The states, in PyTorch's vocabulary where it has one:
//! - **live**: a block a user holds;
//! - **split remainder**: free bytes of a segment that also holds live blocks (PyTorch's
//!   *inactive split*: the segment cannot go back to the driver);
//! - **free (cached)**: a segment with no live block, kept by the pool;
//! - **idle mapped page**: physical pages mapped into a VA range under no live block;
//! - **unmapped**: reserved virtual addresses with no physical memory behind them.
//!
//! The page rebuilds the same map in JavaScript from the same arrays (`report.js`); the
//! text rendering here is `gpumem map`'s.
use serde::Serialize;

use super::record::{AllocatorRun, RegionKind, TraceBlock, NEVER};
use crate::trace::SnapshotSegment;
use crate::units::bytes as human;

/// State of a span of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanState {
    /// A live block.
    Live = 0,
    /// Free bytes of a segment that also holds live blocks.
    SplitRemainder = 1,
    /// A segment with no live block, cached by the pool.
    FreeCached = 2,
    /// Mapped physical pages under no live block.
    IdleMapped = 3,
    /// Reserved virtual addresses with nothing mapped.
    Unmapped = 4,
}

/// Never-mapped stretches of a VA range shorter than this are shown inside one row; longer
/// ones split the range into rows (bytes).
pub const VA_GAP_MERGE_BYTES: u64 = 256 << 20;

/// Every state, in legend order.
pub const STATES: [SpanState; 5] = [
    SpanState::Live,
    SpanState::SplitRemainder,
    SpanState::FreeCached,
    SpanState::IdleMapped,
    SpanState::Unmapped,
];

impl SpanState {
    /// Name in the legend.
    pub fn label(self) -> &'static str {
        match self {
            SpanState::Live => "live",
            SpanState::SplitRemainder => "split remainder",
            SpanState::FreeCached => "free (cached)",
            SpanState::IdleMapped => "idle mapped page",
            SpanState::Unmapped => "unmapped",
        }
    }
    /// Character in plain text.
    pub fn plain_char(self) -> char {
        match self {
            SpanState::Live => '#',
            SpanState::SplitRemainder => '=',
            SpanState::FreeCached => '-',
            SpanState::IdleMapped => ':',
            SpanState::Unmapped => '.',
        }
    }
    fn ansi(self) -> (&'static str, char) {
        match self {
            SpanState::Live => ("\x1b[32m", '█'),
            SpanState::SplitRemainder => ("\x1b[33m", '▓'),
            SpanState::FreeCached => ("\x1b[34m", '░'),
            SpanState::IdleMapped => ("\x1b[35m", '▒'),
            SpanState::Unmapped => ("\x1b[90m", '·'),
        }
    }
}

/// A run of bytes of one state inside a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Span {
    /// Offset from the row's base, in bytes.
    pub offset: u64,
    /// Length in bytes.
    pub bytes: u64,
    /// State.
    pub state: SpanState,
    /// For a live block: its index in the trace's block list (`None` in a recorded map).
    pub block: Option<usize>,
    /// For a live block: the bytes requested.
    pub requested_bytes: u64,
}

/// One row: a segment, or a part of a VA range.
///
/// A VA range is mostly addresses that are never mapped (gpumem reserves a multiple of the
/// device's memory), and its pages may be used at both ends: it is shown as one row per
/// cluster of pages the run ever mapped, clusters closer than [`VA_GAP_MERGE_BYTES`] merged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MapRow {
    /// Segment or VA range.
    pub kind: RegionKind,
    /// First address of the segment or VA range the row belongs to.
    pub region_base: u64,
    /// Bytes of that segment or VA range.
    pub bytes: u64,
    /// First address shown in the row.
    pub base: u64,
    /// Bytes shown from `base`: the whole segment, or one cluster of a VA range.
    pub shown_bytes: u64,
    /// Spans covering `[0, shown_bytes)` in order.
    pub spans: Vec<Span>,
}

/// The memory map of one allocator at one event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryMap {
    /// Allocator name (or `pytorch (recorded)`).
    pub allocator: String,
    /// The event after which the map is taken.
    pub event: u64,
    /// Rows in address order.
    pub rows: Vec<MapRow>,
}

/// Appends `s`, merging it into the last span when both have the same state and block.
fn push(out: &mut Vec<Span>, s: Span) {
    if let Some(l) = out.last_mut() {
        if l.state == s.state && l.block == s.block && l.offset + l.bytes == s.offset {
            l.bytes += s.bytes;
            return;
        }
    }
    out.push(s);
}

/// Cuts `[0, len)` into spans: `ivs` (sorted, disjoint `(offset, bytes, block, requested)`)
/// get `state`, the rest keeps the state of `under`.
fn paint(under: Vec<Span>, ivs: &[(u64, u64, Option<usize>, u64)], state: SpanState) -> Vec<Span> {
    let mut out = Vec::with_capacity(under.len() + 2 * ivs.len());
    let mut i = 0usize;
    for s in under {
        let mut at = s.offset;
        let end = s.offset + s.bytes;
        while i < ivs.len() && at < end {
            let (o, b, blk, req) = ivs[i];
            let iv_end = o + b;
            if iv_end <= at {
                i += 1;
                continue;
            }
            if o >= end {
                break;
            }
            if o > at {
                push(
                    &mut out,
                    Span {
                        offset: at,
                        bytes: o - at,
                        ..s
                    },
                );
                at = o;
            }
            let stop = iv_end.min(end);
            push(
                &mut out,
                Span {
                    offset: at,
                    bytes: stop - at,
                    state,
                    block: blk,
                    requested_bytes: req,
                },
            );
            at = stop;
            if iv_end <= end {
                i += 1;
            }
        }
        if at < end {
            push(
                &mut out,
                Span {
                    offset: at,
                    bytes: end - at,
                    ..s
                },
            );
        }
    }
    out
}

fn whole(bytes: u64, state: SpanState) -> Vec<Span> {
    vec![Span {
        offset: 0,
        bytes,
        state,
        block: None,
        requested_bytes: 0,
    }]
}

impl MemoryMap {
    /// The map of `run` after event `event`; `blocks` are the trace's blocks (the run's
    /// placements follow them index for index).
    pub fn at(run: &AllocatorRun, blocks: &[TraceBlock], event: u64) -> MemoryMap {
        let live_at = |from: u64, to: u64| from <= event && (to == NEVER || event < to);
        let mut regions: Vec<_> = run
            .regions
            .iter()
            .filter(|r| live_at(r.created, r.released))
            .collect();
        regions.sort_by_key(|r| r.base);
        let mut live: Vec<(u64, u64, usize, u64)> = blocks
            .iter()
            .zip(&run.placements)
            .enumerate()
            .filter_map(|(i, (b, p))| {
                let p = (*p)?;
                live_at(b.alloc_event, b.free_event).then_some((
                    p.addr,
                    p.allocated_bytes,
                    i,
                    b.requested_bytes,
                ))
            })
            .collect();
        live.sort_unstable();
        let mut maps_now: Vec<(u64, u64)> = run
            .mappings
            .iter()
            .filter(|m| live_at(m.mapped, m.unmapped))
            .map(|m| (m.va, m.bytes))
            .collect();
        maps_now.sort_unstable();
        let mut rows = Vec::with_capacity(regions.len());
        for r in regions {
            let end = r.base + r.bytes;
            let lo = live.partition_point(|b| b.0 < r.base);
            let hi = live.partition_point(|b| b.0 < end);
            let ivs: Vec<_> = live[lo..hi]
                .iter()
                .map(|&(a, n, i, req)| (a - r.base, n.min(end - a), Some(i), req))
                .collect();
            match r.kind {
                RegionKind::Segment => {
                    let free = if ivs.is_empty() {
                        SpanState::FreeCached
                    } else {
                        SpanState::SplitRemainder
                    };
                    rows.push(MapRow {
                        kind: r.kind,
                        region_base: r.base,
                        bytes: r.bytes,
                        base: r.base,
                        shown_bytes: r.bytes,
                        spans: paint(whole(r.bytes, free), &ivs, SpanState::Live),
                    });
                }
                RegionKind::VaRange => {
                    let ml = maps_now.partition_point(|m| m.0 < r.base);
                    let mh = maps_now.partition_point(|m| m.0 < end);
                    let mapped: Vec<_> = maps_now[ml..mh]
                        .iter()
                        .map(|&(va, n)| (va - r.base, n.min(end - va), None, 0))
                        .collect();
                    let spans = paint(
                        paint(
                            whole(r.bytes, SpanState::Unmapped),
                            &mapped,
                            SpanState::IdleMapped,
                        ),
                        &ivs,
                        SpanState::Live,
                    );
                    for (ws, we) in va_clusters(run, r.base, r.bytes) {
                        rows.push(MapRow {
                            kind: r.kind,
                            region_base: r.base,
                            bytes: r.bytes,
                            base: r.base + ws,
                            shown_bytes: we - ws,
                            spans: window(&spans, ws, we),
                        });
                    }
                }
            }
        }
        MemoryMap {
            allocator: run.name.clone(),
            event,
            rows,
        }
    }

    /// The map of the segments a PyTorch snapshot recorded at dump time (device `device`).
    pub fn from_snapshot(segments: &[SnapshotSegment], device: u32) -> MemoryMap {
        let mut segs: Vec<_> = segments.iter().filter(|s| s.device == device).collect();
        segs.sort_by_key(|s| s.address);
        let rows = segs
            .into_iter()
            .map(|s| {
                let split = s.blocks.len() > 1;
                let mut spans = Vec::with_capacity(s.blocks.len());
                for b in &s.blocks {
                    let offset = b.address.saturating_sub(s.address);
                    if offset >= s.total_size_bytes {
                        continue;
                    }
                    let live = b.state.starts_with("active");
                    spans.push(Span {
                        offset,
                        bytes: b.size_bytes.min(s.total_size_bytes - offset),
                        state: if live {
                            SpanState::Live
                        } else if split {
                            SpanState::SplitRemainder
                        } else {
                            SpanState::FreeCached
                        },
                        // Recorded blocks carry no trace index.
                        block: None,
                        requested_bytes: if live { b.requested_bytes } else { 0 },
                    });
                }
                MapRow {
                    kind: RegionKind::Segment,
                    region_base: s.address,
                    base: s.address,
                    bytes: s.total_size_bytes,
                    shown_bytes: s.total_size_bytes,
                    spans,
                }
            })
            .collect();
        MemoryMap {
            allocator: "pytorch (recorded)".into(),
            event: NEVER,
            rows,
        }
    }

    /// Bytes in each state (indexed like [`STATES`]), over the shown part of every row.
    pub fn totals(&self) -> [u64; 5] {
        let mut t = [0u64; 5];
        for s in self.rows.iter().flat_map(|r| &r.spans) {
            t[s.state as usize] += s.bytes;
        }
        t
    }

    /// Live blocks in the map.
    pub fn live_blocks(&self) -> usize {
        let mut v: Vec<(u64, u64, Option<usize>)> = self
            .rows
            .iter()
            .flat_map(|r| r.spans.iter().map(move |s| (r.base, s)))
            .filter(|(_, s)| s.state == SpanState::Live)
            .map(|(b, s)| (b, s.offset, s.block))
            .collect();
        // A block cut by a row boundary counts once; a recorded map has no block ids.
        v.sort_unstable();
        let mut ids: Vec<usize> = v.iter().filter_map(|x| x.2).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len() + v.iter().filter(|x| x.2.is_none()).count()
    }

    /// The smallest power-of-two cell size (at least 512 bytes) with which every row, one
    /// blank cell apart, fits in `width × max_lines` cells; when the rows are too many to fit
    /// at all, the smallest with which every row is one cell.
    pub fn cell_bytes(&self, width: usize, max_lines: usize) -> u64 {
        let budget = (width.max(1) * max_lines.max(1)) as u64;
        // Once every row is one cell, larger cells change nothing: the map cannot fit.
        let largest = self.rows.iter().map(|r| r.shown_bytes).max().unwrap_or(0);
        let mut cell = 512u64;
        loop {
            let cells: u64 = self
                .rows
                .iter()
                .map(|r| r.shown_bytes.div_ceil(cell).max(1) + 1)
                .sum();
            if cells <= budget || cell >= largest || cell >= 1 << 50 {
                return cell;
            }
            cell *= 2;
        }
    }

    /// The cells of the map, `cell` bytes each: every row cut into cells (each the state
    /// holding most of its bytes, live first on a tie), rows separated by one `None`.
    pub fn cells(&self, cell: u64) -> Vec<Option<SpanState>> {
        let mut out = Vec::new();
        for (ri, r) in self.rows.iter().enumerate() {
            if ri > 0 {
                out.push(None);
            }
            let n = r.shown_bytes.div_ceil(cell).max(1) as usize;
            let mut acc = vec![[0u64; 5]; n];
            for s in &r.spans {
                let mut at = s.offset;
                let end = s.offset + s.bytes;
                while at < end {
                    let c = (at / cell) as usize;
                    let stop = ((c as u64 + 1) * cell).min(end);
                    if let Some(a) = acc.get_mut(c) {
                        a[s.state as usize] += stop - at;
                    }
                    at = stop;
                }
            }
            for a in acc {
                let mut best = None;
                let mut best_bytes = 0;
                for (i, &b) in a.iter().enumerate() {
                    if b > best_bytes {
                        best_bytes = b;
                        best = Some(STATES[i]);
                    }
                }
                out.push(Some(best.unwrap_or(SpanState::Unmapped)));
            }
        }
        out
    }

    /// The map as text, `width` cells a line and at most about `max_lines` lines, with a
    /// header and a legend; ANSI colours when `color`.
    pub fn render_text(&self, width: usize, max_lines: usize, color: bool) -> String {
        let width = width.max(8);
        let cell = self.cell_bytes(width, max_lines);
        let t = self.totals();
        let segs = self
            .rows
            .iter()
            .filter(|r| r.kind == RegionKind::Segment)
            .count();
        let mut va_bases: Vec<u64> = self
            .rows
            .iter()
            .filter(|r| r.kind == RegionKind::VaRange)
            .map(|r| r.region_base)
            .collect();
        va_bases.dedup();
        let vas = va_bases.len();
        let mut o = String::new();
        let at = if self.event == NEVER {
            "at dump time".to_string()
        } else {
            format!("after event {}", self.event)
        };
        o.push_str(&format!(
            "{} {at}: {} segment{}, {} VA range{}; {} live in {} block{}\n",
            self.allocator,
            segs,
            if segs == 1 { "" } else { "s" },
            vas,
            if vas == 1 { "" } else { "s" },
            human(t[0]),
            self.live_blocks(),
            if self.live_blocks() == 1 { "" } else { "s" },
        ));
        let cells = self.cells(cell);
        for line in cells.chunks(width) {
            // In colour, one escape code per run of cells of the same state.
            let mut last: Option<SpanState> = None;
            for c in line {
                match (c, color) {
                    (None, _) => o.push(' '),
                    (Some(s), false) => o.push(s.plain_char()),
                    (Some(s), true) => {
                        let (code, ch) = s.ansi();
                        if last != Some(*s) {
                            o.push_str(code);
                            last = Some(*s);
                        }
                        o.push(ch);
                    }
                }
            }
            if last.is_some() {
                o.push_str("\x1b[0m");
            }
            o.push('\n');
        }
        o.push_str(&format!(
            "one cell = {}; ",
            crate::units::bytes_compact(cell)
        ));
        let mut first = true;
        for (i, s) in STATES.iter().enumerate() {
            if t[i] == 0 && *s != SpanState::Live {
                continue;
            }
            if !first {
                o.push_str("  ");
            }
            first = false;
            if color {
                let (code, ch) = s.ansi();
                o.push_str(&format!("{code}{ch}\x1b[0m"));
            } else {
                o.push(s.plain_char());
            }
            o.push_str(&format!(" {} {}", s.label(), human(t[i])));
        }
        o.push('\n');
        o
    }
}

/// The clusters `(start, end)` (offsets from `base`) of the pages `run` ever mapped in the VA
/// range `[base, base + bytes)`, merged across gaps up to [`VA_GAP_MERGE_BYTES`]; one empty
/// cluster at 0 when nothing was ever mapped there.
pub fn va_clusters(run: &AllocatorRun, base: u64, bytes: u64) -> Vec<(u64, u64)> {
    let end = base + bytes;
    let mut iv: Vec<(u64, u64)> = run
        .mappings
        .iter()
        .filter(|m| m.va >= base && m.va < end)
        .map(|m| (m.va - base, (m.va + m.bytes).min(end) - base))
        .collect();
    iv.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in iv {
        match out.last_mut() {
            Some(l) if s <= l.1.saturating_add(VA_GAP_MERGE_BYTES) => l.1 = l.1.max(e),
            _ => out.push((s, e)),
        }
    }
    if out.is_empty() {
        out.push((0, 0));
    }
    out
}

/// The spans of `[ws, we)`, with offsets from `ws`.
fn window(spans: &[Span], ws: u64, we: u64) -> Vec<Span> {
    spans
        .iter()
        .filter(|s| s.offset < we && s.offset + s.bytes > ws)
        .map(|s| {
            let a = s.offset.max(ws);
            let b = (s.offset + s.bytes).min(we);
            Span {
                offset: a - ws,
                bytes: b - a,
                ..*s
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sp(offset: u64, bytes: u64, state: SpanState) -> Span {
        Span {
            offset,
            bytes,
            state,
            block: None,
            requested_bytes: 0,
        }
    }

    #[test]
    fn paint_cuts_spans() {
        let base = whole(100, SpanState::Unmapped);
        let m = paint(
            base,
            &[(10, 20, None, 0), (50, 50, None, 0)],
            SpanState::IdleMapped,
        );
        assert_eq!(
            m,
            vec![
                sp(0, 10, SpanState::Unmapped),
                sp(10, 20, SpanState::IdleMapped),
                sp(30, 20, SpanState::Unmapped),
                sp(50, 50, SpanState::IdleMapped),
            ]
        );
        let l = paint(m, &[(20, 40, Some(3), 7)], SpanState::Live);
        assert_eq!(l.iter().map(|s| s.bytes).sum::<u64>(), 100);
        // The block's pieces over mapped and unmapped bytes merge into one span.
        assert_eq!(
            l.iter()
                .map(|s| (s.offset, s.bytes, s.state))
                .collect::<Vec<_>>(),
            vec![
                (0, 10, SpanState::Unmapped),
                (10, 10, SpanState::IdleMapped),
                (20, 40, SpanState::Live),
                (60, 40, SpanState::IdleMapped),
            ]
        );
        assert_eq!(l[2].block, Some(3));
        assert_eq!(l[2].requested_bytes, 7);
    }
}
