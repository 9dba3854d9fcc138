//! Statistics in PyTorch's vocabulary: requested, allocated, reserved; segments and blocks.
use serde::Serialize;

/// A figure with its current and peak value (PyTorch's `current` / `peak`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counter {
    /// Value now.
    pub current: u64,
    /// Highest value seen.
    pub peak: u64,
}

impl Counter {
    /// Adds `n`, raising the peak if needed.
    pub fn add(&mut self, n: u64) {
        self.current = self.current.saturating_add(n);
        self.peak = self.peak.max(self.current);
    }
    /// Subtracts `n` (saturating at 0).
    pub fn sub(&mut self, n: u64) {
        self.current = self.current.saturating_sub(n);
    }
}

/// A pool's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Bytes users asked for, over live blocks.
    pub requested_bytes: Counter,
    /// Bytes set aside for live blocks (after rounding/splitting).
    pub allocated_bytes: Counter,
    /// Bytes taken from the device (segments or mapped/cached physical pages).
    pub reserved_bytes: Counter,
    /// Live blocks.
    pub allocation_count: Counter,
    /// Segments (or physical pages/handles) held from the device.
    pub segment_count: Counter,
    /// Allocations served so far (cumulative).
    pub alloc_calls: u64,
    /// Frees served so far (cumulative).
    pub free_calls: u64,
    /// Times the pool released its cache and retried after the device refused memory.
    pub alloc_retries: u64,
    /// Bytes free inside the reserved memory (reserved − allocated, counting only usable ranges).
    pub free_bytes: u64,
    /// Largest contiguous free range inside reserved memory, in bytes.
    pub largest_free_bytes: u64,
    /// Free bytes inside segments (or mapped pages) that also hold live blocks, in bytes:
    /// PyTorch's `inactive_split_bytes`, memory that only a block fitting the gaps can use
    /// and that `empty_cache()` cannot return. The peak is exact where the allocator tracks
    /// it (torch); elsewhere it equals the current value and callers sample it. 0 where the
    /// allocator does not say.
    pub inactive_split_bytes: Counter,
}

impl Stats {
    /// External fragmentation `1 − largest_free / total_free` (0 when nothing is free).
    pub fn external_fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free_bytes as f64 / self.free_bytes as f64
        }
    }
    /// Internal fragmentation `(allocated − requested) / allocated` (0 when nothing is allocated).
    pub fn internal_fragmentation(&self) -> f64 {
        let a = self.allocated_bytes.current;
        if a == 0 {
            0.0
        } else {
            a.saturating_sub(self.requested_bytes.current) as f64 / a as f64
        }
    }
}

/// Bookkeeping helper every allocator embeds: call it on each event, read it in `stats()`.
#[derive(Debug, Clone, Copy, Default)]
pub struct StatsTracker {
    /// The counters kept so far (free/largest-free are filled in by the allocator).
    pub stats: Stats,
}

impl StatsTracker {
    /// A block of `requested` bytes was handed out taking `allocated` bytes.
    pub fn on_alloc(&mut self, requested: u64, allocated: u64) {
        self.stats.requested_bytes.add(requested);
        self.stats.allocated_bytes.add(allocated);
        self.stats.allocation_count.add(1);
        self.stats.alloc_calls += 1;
    }
    /// A block of `requested` / `allocated` bytes came back.
    pub fn on_free(&mut self, requested: u64, allocated: u64) {
        self.stats.requested_bytes.sub(requested);
        self.stats.allocated_bytes.sub(allocated);
        self.stats.allocation_count.sub(1);
        self.stats.free_calls += 1;
    }
    /// `bytes` more were taken from the device as one segment/page.
    pub fn on_reserve(&mut self, bytes: u64) {
        self.stats.reserved_bytes.add(bytes);
        self.stats.segment_count.add(1);
    }
    /// A segment/page of `bytes` went back to the device.
    pub fn on_release(&mut self, bytes: u64) {
        self.stats.reserved_bytes.sub(bytes);
        self.stats.segment_count.sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragmentation_formulas() {
        let mut s = Stats::default();
        assert_eq!(s.external_fragmentation(), 0.0);
        assert_eq!(s.internal_fragmentation(), 0.0);
        s.free_bytes = 400;
        s.largest_free_bytes = 100;
        assert!((s.external_fragmentation() - 0.75).abs() < 1e-12);
        s.allocated_bytes.add(1000);
        s.requested_bytes.add(900);
        assert!((s.internal_fragmentation() - 0.1).abs() < 1e-12);
    }

    #[test]
    fn counter_keeps_peak() {
        let mut c = Counter::default();
        c.add(10);
        c.sub(4);
        c.add(2);
        assert_eq!(
            c,
            Counter {
                current: 8,
                peak: 10
            }
        );
    }
}
