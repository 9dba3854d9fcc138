//! State analysis of a snapshot's recorded segments: what the allocator held at dump time.
//!
//! Used when a snapshot has `segments` but no trace (or beside the replay of one). Vocabulary
//! is PyTorch's: a *segment* is what the driver gave (`cudaMalloc`), a *block* is a piece of a
//! segment, *active* blocks are allocated, *inactive* blocks are free; an *inactive split* block
//! is a free block in a segment that is split into more than one block, so it cannot be
//! released to the driver (`inactive_split` in `torch.cuda.memory_stats()`).
//!
//! External fragmentation of a segment is `1 − largest_free / free`: 0 when its free bytes are
//! one block, near 1 when they are scattered in small pieces. The totals use the largest free
//! block of all segments over all free bytes.
use super::SnapshotSegment;
use serde::Serialize;
use std::fmt;

/// The state of one segment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SegmentState {
    /// Device ordinal.
    pub device: u32,
    /// Address of the segment.
    pub address: u64,
    /// `small` or `large` pool (as recorded).
    pub segment_type: String,
    /// Whether it was an expandable segment.
    pub is_expandable: bool,
    /// Bytes of the segment.
    pub size_bytes: u64,
    /// Bytes in active (allocated) blocks.
    pub allocated_bytes: u64,
    /// Bytes requested by the users of the active blocks.
    pub requested_bytes: u64,
    /// Bytes in inactive (free) blocks.
    pub free_bytes: u64,
    /// Bytes of the largest inactive block.
    pub largest_free_bytes: u64,
    /// `1 − largest_free_bytes / free_bytes` (0 when nothing is free).
    pub external_fragmentation: f64,
    /// Number of blocks.
    pub blocks: usize,
    /// Number of active blocks.
    pub active_blocks: usize,
    /// Inactive blocks in this segment when it is split (more than one block).
    pub inactive_split_blocks: usize,
    /// Bytes of those inactive split blocks.
    pub inactive_split_bytes: u64,
}

/// Totals over all segments.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StateTotals {
    /// Number of segments.
    pub segments: usize,
    /// Bytes of all segments (PyTorch `reserved_bytes`).
    pub reserved_bytes: u64,
    /// Bytes in active blocks (PyTorch `allocated_bytes`).
    pub allocated_bytes: u64,
    /// Bytes requested by the users of the active blocks (PyTorch `requested_bytes`).
    pub requested_bytes: u64,
    /// Bytes in inactive blocks.
    pub free_bytes: u64,
    /// Bytes of the largest inactive block in any segment.
    pub largest_free_bytes: u64,
    /// `1 − largest_free_bytes / free_bytes` over all segments (0 when nothing is free).
    pub external_fragmentation: f64,
    /// Number of blocks.
    pub blocks: usize,
    /// Number of active blocks.
    pub active_blocks: usize,
    /// Inactive blocks in split segments (PyTorch `inactive_split`).
    pub inactive_split_blocks: usize,
    /// Bytes of those blocks (PyTorch `inactive_split_bytes`).
    pub inactive_split_bytes: u64,
}

/// The state of all recorded segments (serialises to JSON with serde).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StateAnalysis {
    /// One entry per segment, in the snapshot's order.
    pub segments: Vec<SegmentState>,
    /// Totals.
    pub totals: StateTotals,
}

fn fragmentation(largest: u64, free: u64) -> f64 {
    if free == 0 {
        0.0
    } else {
        1.0 - largest as f64 / free as f64
    }
}

/// Analyses the recorded segments. A segment listed without blocks counts its
/// `allocated_size` as one active block and the rest as one free block.
pub fn analyze(segments: &[SnapshotSegment]) -> StateAnalysis {
    let mut out = StateAnalysis::default();
    let t = &mut out.totals;
    for s in segments {
        let mut st = SegmentState {
            device: s.device,
            address: s.address,
            segment_type: s.segment_type.clone(),
            is_expandable: s.is_expandable,
            size_bytes: s.total_size_bytes,
            allocated_bytes: 0,
            requested_bytes: 0,
            free_bytes: 0,
            largest_free_bytes: 0,
            external_fragmentation: 0.0,
            blocks: s.blocks.len(),
            active_blocks: 0,
            inactive_split_blocks: 0,
            inactive_split_bytes: 0,
        };
        if s.blocks.is_empty() {
            st.allocated_bytes = s.allocated_size_bytes.min(s.total_size_bytes);
            st.free_bytes = s.total_size_bytes - st.allocated_bytes;
            st.largest_free_bytes = st.free_bytes;
            st.active_blocks = usize::from(st.allocated_bytes > 0);
            st.blocks = st.active_blocks + usize::from(st.free_bytes > 0);
        }
        let split = s.blocks.len() > 1;
        for b in &s.blocks {
            if b.state.starts_with("active") {
                st.allocated_bytes = st.allocated_bytes.saturating_add(b.size_bytes);
                st.requested_bytes = st.requested_bytes.saturating_add(b.requested_bytes);
                st.active_blocks += 1;
            } else {
                st.free_bytes = st.free_bytes.saturating_add(b.size_bytes);
                st.largest_free_bytes = st.largest_free_bytes.max(b.size_bytes);
                if split {
                    st.inactive_split_blocks += 1;
                    st.inactive_split_bytes = st.inactive_split_bytes.saturating_add(b.size_bytes);
                }
            }
        }
        st.external_fragmentation = fragmentation(st.largest_free_bytes, st.free_bytes);
        t.segments += 1;
        t.reserved_bytes = t.reserved_bytes.saturating_add(st.size_bytes);
        t.allocated_bytes = t.allocated_bytes.saturating_add(st.allocated_bytes);
        t.requested_bytes = t.requested_bytes.saturating_add(st.requested_bytes);
        t.free_bytes = t.free_bytes.saturating_add(st.free_bytes);
        t.largest_free_bytes = t.largest_free_bytes.max(st.largest_free_bytes);
        t.blocks += st.blocks;
        t.active_blocks += st.active_blocks;
        t.inactive_split_blocks += st.inactive_split_blocks;
        t.inactive_split_bytes = t
            .inactive_split_bytes
            .saturating_add(st.inactive_split_bytes);
        out.segments.push(st);
    }
    out.totals.external_fragmentation =
        fragmentation(out.totals.largest_free_bytes, out.totals.free_bytes);
    out
}

impl fmt::Display for StateAnalysis {
    /// A table of the segments (largest first, at most 40 rows with `{}`; all with `{:#}`),
    /// then the totals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rows: Vec<&SegmentState> = self.segments.iter().collect();
        rows.sort_by_key(|s| std::cmp::Reverse(s.size_bytes));
        let limit = if f.alternate() { rows.len() } else { 40 };
        writeln!(
            f,
            "{:>3} {:>16} {:>5} {:>11} {:>11} {:>11} {:>11} {:>6} {:>7} {:>11}",
            "dev",
            "address",
            "pool",
            "size",
            "allocated",
            "free",
            "largest",
            "frag",
            "splits",
            "split"
        )?;
        for s in rows.iter().take(limit) {
            writeln!(
                f,
                "{:>3} {:>#16x} {:>5} {:>11} {:>11} {:>11} {:>11} {:>5.1}% {:>7} {:>11}",
                s.device,
                s.address,
                if s.is_expandable {
                    "exp"
                } else {
                    &s.segment_type
                },
                crate::units::bytes(s.size_bytes),
                crate::units::bytes(s.allocated_bytes),
                crate::units::bytes(s.free_bytes),
                crate::units::bytes(s.largest_free_bytes),
                100.0 * s.external_fragmentation,
                s.inactive_split_blocks,
                crate::units::bytes(s.inactive_split_bytes),
            )?;
        }
        if rows.len() > limit {
            writeln!(f, "... {} smaller segments not shown", rows.len() - limit)?;
        }
        let t = &self.totals;
        writeln!(
            f,
            "{} segments, {} blocks ({} active): reserved {}, allocated {}, requested {}, free {}",
            t.segments,
            t.blocks,
            t.active_blocks,
            crate::units::bytes(t.reserved_bytes),
            crate::units::bytes(t.allocated_bytes),
            crate::units::bytes(t.requested_bytes),
            crate::units::bytes(t.free_bytes)
        )?;
        write!(
            f,
            "largest free block {}, external fragmentation {:.1}%, inactive split blocks {} ({})",
            crate::units::bytes(t.largest_free_bytes),
            100.0 * t.external_fragmentation,
            t.inactive_split_blocks,
            crate::units::bytes(t.inactive_split_bytes)
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::SnapshotBlock;
    use super::*;

    fn block(address: u64, size: u64, active: bool) -> SnapshotBlock {
        SnapshotBlock {
            address,
            size_bytes: size,
            requested_bytes: if active { size - 1 } else { 0 },
            state: if active {
                "active_allocated"
            } else {
                "inactive"
            }
            .into(),
            stack: crate::trace::StackId::EMPTY,
        }
    }

    fn seg(address: u64, blocks: Vec<SnapshotBlock>) -> SnapshotSegment {
        SnapshotSegment {
            device: 0,
            address,
            total_size_bytes: blocks.iter().map(|b| b.size_bytes).sum(),
            allocated_size_bytes: 0,
            stream: 0,
            segment_type: "large".into(),
            is_expandable: false,
            private_pool: false,
            blocks,
        }
    }

    #[test]
    fn split_segment_and_whole_free_segment() {
        let a = analyze(&[
            seg(
                0,
                vec![
                    block(0, 100, false),
                    block(100, 50, true),
                    block(150, 300, false),
                ],
            ),
            seg(1000, vec![block(1000, 2000, false)]),
        ]);
        let s = &a.segments[0];
        assert_eq!(
            (s.size_bytes, s.allocated_bytes, s.requested_bytes),
            (450, 50, 49)
        );
        assert_eq!((s.free_bytes, s.largest_free_bytes), (400, 300));
        assert!((s.external_fragmentation - 0.25).abs() < 1e-12);
        assert_eq!((s.inactive_split_blocks, s.inactive_split_bytes), (2, 400));
        let w = &a.segments[1];
        assert_eq!(
            (w.inactive_split_blocks, w.external_fragmentation),
            (0, 0.0)
        );
        let t = &a.totals;
        assert_eq!(
            (t.reserved_bytes, t.free_bytes, t.largest_free_bytes),
            (2450, 2400, 2000)
        );
        assert!((t.external_fragmentation - (1.0 - 2000.0 / 2400.0)).abs() < 1e-12);
        assert_eq!(
            (t.blocks, t.active_blocks, t.inactive_split_blocks),
            (4, 1, 2)
        );
        let text = a.to_string();
        assert!(text.contains("2 segments, 4 blocks (1 active)"), "{text}");
    }

    #[test]
    fn segment_without_blocks() {
        let mut s = seg(0, vec![]);
        s.total_size_bytes = 1000;
        s.allocated_size_bytes = 600;
        let a = analyze(&[s]);
        assert_eq!((a.totals.allocated_bytes, a.totals.free_bytes), (600, 400));
        assert_eq!(a.totals.blocks, 2);
    }
}
