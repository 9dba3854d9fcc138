//! Replays a [`Trace`](crate::trace::Trace) through an
//! [`Allocator`](gpumem_core::Allocator) on a [`Device`](gpumem_core::Device) and measures
//! what it would reserve, how fragmented it gets and how many driver calls it makes.
//!
//! Semantics:
//! - blocks live before recording started ([`Trace::preexisting`](crate::trace::Trace::preexisting)) are allocated first;
//! - `Alloc` asks the allocator for `size_bytes` with the event's alignment (or
//!   [`ReplayConfig::default_align`]); `Free` returns the block;
//! - an allocation that fails is counted and dropped together with its later free, and the
//!   replay goes on (PyTorch would raise `OutOfMemoryError` and stop there): out-of-memory
//!   after the allocator released its cache and retried, as every allocator must
//!   ([`ReplayReport::oom_count`], a request of 2^63 bytes is one), or a request the
//!   allocator refuses as impossible, an alignment it does not support or a size that
//!   overflows with its padding ([`ReplayReport::refused_count`]); the report keeps the
//!   index of the first of each;
//! - only events of [`ReplayConfig::device`] are replayed (one pool per device); event
//!   indices count that device's events from 0;
//! - for the `torch` emulation, a run of recorded `segment_free` / `segment_unmap` events that
//!   left no wholly free segment behind is a `torch.cuda.empty_cache()` (or an OOM's cache
//!   release) of the recorded run: the emulation empties its cache there too
//!   ([`cache_releases`]). A run that left some is the allocator's own (its garbage collector,
//!   or oversize blocks freed under a memory limit), which the emulation does by itself. Other
//!   allocators are left alone: `empty_cache()` does not reach a plug-in allocator.
//!
//! Figures: `requested` bytes are those of the blocks actually served, so
//! [`ReplayReport::reserved_over_requested`] is at least 1 even when allocations failed (and 0,
//! no ratio, when no byte was served);
//! events/s is events ÷ CPU seconds of the replaying thread (so replays run side by side on a
//! busy machine measure the same), [`ReplayReport::seconds`] the wall time.
use gpumem_core::{AllocError, DeviceError, DriverCounters, Stats};
use serde::Serialize;

mod capacity;
mod engine;
mod preexisting;
mod summary;
pub use capacity::{min_capacity, Incomplete, MinCapacity, MinCapacityConfig, MinCapacityOutcome};
pub use engine::{replay, replay_prepared, replay_summarized};
pub use preexisting::{
    adopt_preexisting, cache_releases, preexisting_segments, PreexistingSegment, TorchInputs,
};
pub use summary::{devices, summarize, TraceSummary};

/// How to replay.
#[derive(Debug, Clone, Copy)]
pub struct ReplayConfig {
    /// Device ordinal whose events are replayed.
    pub device: u32,
    /// Alignment used when an event carries none, in bytes.
    pub default_align: u64,
    /// Timeline buckets to keep (0 = none): each holds the lowest and highest figures over
    /// its events, so no peak falls between two samples.
    pub timeline_points: u64,
    /// Fill every block with a pattern at allocation and check it at free (needs a device
    /// with memory contents; overlapping blocks show as canary errors).
    pub canary: bool,
    /// Sample fragmentation figures (about 1000 times per replay) and take the external
    /// fragmentation at the event that sets the reserved peak; off for capacity probes.
    pub sample_fragmentation: bool,
    /// Stop at the first out-of-memory (capacity probes only need to know whether the trace
    /// completes; a refused request, an impossible size or alignment, fails at every capacity
    /// and does not stop the replay).
    pub stop_at_first_failure: bool,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            device: 0,
            default_align: gpumem_core::DEFAULT_ALIGN,
            timeline_points: 0,
            canary: false,
            sample_fragmentation: true,
            stop_at_first_failure: false,
        }
    }
}

/// The lowest and highest value of a figure over a stretch of events, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MinMax {
    /// Lowest value.
    pub min: u64,
    /// Highest value.
    pub max: u64,
}

impl MinMax {
    fn new(v: u64) -> Self {
        MinMax { min: v, max: v }
    }
    fn add(&mut self, v: u64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
}

/// One bucket of the timeline: figures over events `first_event..=event` (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// Index of the first event of the bucket.
    pub first_event: u64,
    /// Index of the last event of the bucket.
    pub event: u64,
    /// Requested bytes of live blocks.
    pub requested_bytes: MinMax,
    /// Allocated bytes of live blocks.
    pub allocated_bytes: MinMax,
    /// Reserved bytes held from the device.
    pub reserved_bytes: MinMax,
}

/// What one replay measured.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// Allocator name.
    pub name: String,
    /// Highest reserved bytes (taken from the device) during the replay.
    pub peak_reserved_bytes: u64,
    /// Highest allocated bytes (live blocks after rounding).
    pub peak_allocated_bytes: u64,
    /// Highest requested bytes of the blocks that were actually served.
    pub peak_requested_bytes: u64,
    /// `peak_reserved_bytes / peak_requested_bytes` (1.0 is perfect; at least 1 since both
    /// count only served blocks), or 0 when `peak_requested_bytes` is 0 (zero-byte requests
    /// only, or none served): no ratio. Equals peak reserved ÷ the trace's peak requested
    /// when every allocation was served.
    pub reserved_over_requested: f64,
    /// Highest external fragmentation `1 − largest_free / free` over the samples (about 1000
    /// per replay) and the moment of peak reserved ([`Self::external_fragmentation_at_peak`]).
    pub peak_external_fragmentation: f64,
    /// External fragmentation right after the event during which reserved bytes reached their
    /// final peak (exact: the reserved peak is read after every allocation, the only events
    /// that take memory; 0 without [`ReplayConfig::sample_fragmentation`]).
    pub external_fragmentation_at_peak: f64,
    /// Internal fragmentation `(allocated − requested) / allocated` at peak allocated.
    pub internal_fragmentation_at_peak: f64,
    /// Highest free bytes inside segments or pages that also hold live blocks (PyTorch's
    /// `inactive_split_bytes` peak): exact where the allocator tracks it (torch), else the
    /// highest of the fragmentation samples.
    pub peak_inactive_split_bytes: u64,
    /// Times the pool released its cache and retried after the device refused memory
    /// (PyTorch's `num_alloc_retries`).
    pub alloc_retries: u64,
    /// Allocations that failed with out-of-memory and were dropped.
    pub oom_count: u64,
    /// Index of the first event whose allocation failed with out-of-memory.
    pub first_oom_event: Option<u64>,
    /// Bytes requested by the first allocation that failed with out-of-memory.
    pub first_oom_request_bytes: Option<u64>,
    /// Allocations the allocator refused as impossible (alignment it does not support, size
    /// that overflows) and that were dropped.
    pub refused_count: u64,
    /// The first refusal: event index and the allocator's reason.
    pub first_refusal: Option<String>,
    /// Indices of failed allocations (the first 10 000), for timeline marks.
    #[serde(skip)]
    pub failed_events: Vec<u64>,
    /// Driver calls by kind.
    pub driver_calls: DriverCounters,
    /// Seconds the driver calls took (modelled on the simulated device, measured on CUDA).
    pub modelled_driver_seconds: f64,
    /// Driver calls made while the second half of the events was replayed (the steady state
    /// of a training loop: a caching allocator makes almost none there).
    pub steady_state_driver_calls: u64,
    /// `modelled_driver_seconds` ÷ the trace's own duration (first to last `time_us` of the
    /// replayed device's events), when the trace has timestamps.
    pub driver_share_of_trace: Option<f64>,
    /// Highest physical bytes the device reported in use (the device's own view).
    pub device_peak_used_bytes: u64,
    /// Peak of the driver's own figure of memory in use (cuMemGetInfo total − free) above
    /// what was in use when the replay started, in bytes: the real footprint, including
    /// the driver's rounding. Sampled whenever the device's usage reaches a new high.
    /// `None` on the simulated device.
    pub driver_peak_delta_bytes: Option<u64>,
    /// Events replayed per CPU second of the replaying thread (allocator + bookkeeping).
    pub events_per_second: f64,
    /// Events replayed (fewer than the trace's when stopped at the first failure).
    pub events_replayed: u64,
    /// Wall time of the replay, in seconds.
    pub seconds: f64,
    /// CPU time of the replaying thread, in seconds.
    pub cpu_seconds: f64,
    /// Blocks whose canary pattern was damaged (canary replays only).
    pub canary_errors: u64,
    /// Final statistics of the pool.
    pub final_stats: Stats,
    /// Timeline buckets (when asked for).
    #[serde(skip)]
    pub timeline: Vec<Sample>,
}

impl ReplayReport {
    /// Allocations that failed, whatever the reason.
    pub fn failed_count(&self) -> u64 {
        self.oom_count + self.refused_count
    }
}

/// A replay that could not go on.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The allocator failed for a reason other than out-of-memory or an impossible request
    /// (a device error, or a bug).
    #[error("event index {event}: {allocator}: {source}")]
    Allocator {
        /// Index of the event.
        event: u64,
        /// Allocator name.
        allocator: String,
        /// The error.
        #[source]
        source: AllocError,
    },
    /// The allocator's invariant checker failed after an event.
    #[error("event index {event}: {allocator}: validation failed: {source}")]
    Invalid {
        /// Index of the event.
        event: u64,
        /// Allocator name.
        allocator: String,
        /// The error.
        #[source]
        source: AllocError,
    },
    /// The canary check itself failed (device error).
    #[error("event index {event}: canary: {source}")]
    Canary {
        /// Index of the event.
        event: u64,
        /// The error.
        #[source]
        source: DeviceError,
    },
}

#[cfg(test)]
mod tests;
