//! "Would another allocator have avoided my OOM?": verdicts on the out-of-memory errors a
//! PyTorch snapshot recorded.
//!
//! A snapshot's `oom` trace entry holds the request that failed (`size`, `stream`) and what
//! the driver reported free on the device at that moment (`device_free`). The memory the
//! process could really use then is what PyTorch had reserved plus `device_free`: that is the
//! capacity each allocator is given. PyTorch's reserved bytes at the OOM come from the trace's
//! segment events (`segment_alloc` and `segment_map` add, `segment_free` and `segment_unmap`
//! take away), counted back from the segments the snapshot holds at dump time, or forward from
//! zero when it holds none (or when counting back would go below zero).
//!
//! For each OOM and allocator, the events of that device up to the OOM are replayed with the
//! failing request appended, on a simulated device, and the smallest capacity with which that
//! completes with no out-of-memory is bisected ([`crate::replay::min_capacity`], to
//! [`RESOLUTION_BYTES`]). The allocator would have served the request if that capacity is at
//! most the capacity the process had; the difference is the margin (bytes to spare, or bytes
//! short). An allocator that runs out of memory earlier in the run counts as failing.
use gpumem_core::sim::SimDevice;
use gpumem_core::strategy::Strategy;
use gpumem_core::Allocator;
use serde::Serialize;

use crate::replay::{self, MinCapacityConfig, MinCapacityOutcome, ReplayConfig, ReplayError};
use crate::trace::{Action, Event, Trace};

/// Precision of the bisected capacities, in bytes (2 MiB).
pub const RESOLUTION_BYTES: u64 = 2 << 20;
/// The capacity search stops at this many times the larger of the capacity the process had
/// and the run's peak requested bytes (at least 1 GiB).
pub const UPPER_FACTOR: u64 = 4;

/// What one allocator would have done with a recorded OOM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AllocatorVerdict {
    /// The allocator (`name` in JSON).
    #[serde(rename = "name")]
    pub strategy: Strategy,
    /// Whether the run up to the OOM and the failing request fit in the capacity the process
    /// had. `None` when the snapshot did not record `device_free` (no capacity to compare).
    pub fits: Option<bool>,
    /// Smallest device capacity with which the run and the request complete, in bytes (to
    /// [`RESOLUTION_BYTES`]); `None` when even the search's upper bound did not suffice.
    pub min_capacity_bytes: Option<u64>,
    /// Capacity the process had minus `min_capacity_bytes`: bytes to spare when positive,
    /// bytes short when negative. `None` when either is unknown.
    pub margin_bytes: Option<i64>,
}

/// One recorded OOM and the verdict of each allocator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomVerdict {
    /// Index of the `oom` event in [`Trace::events`].
    pub event: u64,
    /// Device ordinal.
    pub device: u32,
    /// Bytes the failing request asked for.
    pub request_bytes: u64,
    /// Stream of the request.
    pub stream: u64,
    /// Bytes PyTorch had reserved at that moment (from the segment events); `None` when the
    /// trace has neither segment events nor segments for the device (then there is no usable
    /// capacity to judge against, only each allocator's need).
    pub reserved_bytes: Option<u64>,
    /// Bytes the driver reported free (`device_free`), when recorded.
    pub device_free_bytes: Option<u64>,
    /// `reserved_bytes + device_free_bytes`: the memory the process could use.
    pub capacity_bytes: Option<u64>,
    /// One verdict per allocator, in the order asked.
    pub allocators: Vec<AllocatorVerdict>,
}

impl OomVerdict {
    /// One line per allocator for people, e.g. `paged: fits, 3.20 GiB to spare` or
    /// `torch: fails, 1.00 GiB short (as recorded)`; `fmt_bytes` formats byte counts.
    pub fn lines(&self, fmt_bytes: &dyn Fn(u64) -> String) -> Vec<String> {
        self.allocators
            .iter()
            .map(|a| {
                let torch = a.strategy == Strategy::Torch;
                match (a.fits, a.margin_bytes, a.min_capacity_bytes) {
                    (Some(true), Some(m), _) => format!(
                        "{}: fits, {} to spare{}",
                        a.strategy,
                        fmt_bytes(m.unsigned_abs()),
                        if torch {
                            " (unlike the recorded run)"
                        } else {
                            ""
                        }
                    ),
                    (Some(false), Some(m), _) => format!(
                        "{}: fails, {} short{}",
                        a.strategy,
                        fmt_bytes(m.unsigned_abs()),
                        if torch { " (as recorded)" } else { "" }
                    ),
                    (Some(false), None, None) => format!(
                        "{}: fails, more than {} short",
                        a.strategy,
                        fmt_bytes(
                            self.capacity_bytes
                                .unwrap_or(0)
                                .saturating_mul(UPPER_FACTOR - 1)
                        )
                    ),
                    (_, _, Some(c)) => format!("{}: needs {}", a.strategy, fmt_bytes(c)),
                    _ => format!("{}: no verdict", a.strategy),
                }
            })
            .collect()
    }
}

/// PyTorch's reserved bytes on `device` just before event `index`, from the segment events
/// (see the module documentation).
pub fn reserved_before(trace: &Trace, device: u32, index: usize) -> u64 {
    let delta = |e: &Event| -> i128 {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => i128::from(e.size_bytes),
            Action::SegmentFree | Action::SegmentUnmap => -i128::from(e.size_bytes),
            _ => 0,
        }
    };
    let on = |e: &&Event| e.device == device;
    let forward: i128 = trace.events[..index.min(trace.events.len())]
        .iter()
        .filter(on)
        .map(delta)
        .sum();
    let at_dump: i128 = trace
        .segments
        .iter()
        .filter(|s| s.device == device)
        .map(|s| i128::from(s.total_size_bytes))
        .sum();
    if at_dump > 0 {
        let after: i128 = trace.events[index.min(trace.events.len())..]
            .iter()
            .filter(on)
            .map(delta)
            .sum();
        let back = at_dump - after;
        if back >= 0 && back >= forward {
            return u64::try_from(back).unwrap_or(u64::MAX);
        }
    }
    u64::try_from(forward.max(0)).unwrap_or(u64::MAX)
}

/// The run of `device` up to event `index` (exclusive), with an alloc of the failing request
/// appended, as a trace of its own.
fn run_up_to(trace: &Trace, device: u32, index: usize, oom: &Event) -> Trace {
    let mut events: Vec<Event> = trace.events[..index.min(trace.events.len())]
        .iter()
        .filter(|e| e.device == device)
        .copied()
        .collect();
    // An address no block of the trace uses: one past the highest.
    let addr = events
        .iter()
        .map(|e| e.addr)
        .chain(trace.preexisting.iter().map(|p| p.addr))
        .max()
        .unwrap_or(0)
        .saturating_add(1);
    events.push(
        Event::alloc(addr, oom.size_bytes)
            .on_device(device)
            .on_stream(oom.stream),
    );
    Trace {
        format: trace.format,
        events,
        preexisting: trace
            .preexisting
            .iter()
            .filter(|p| p.device == device)
            .copied()
            .collect(),
        ..Trace::default()
    }
}

/// Verdicts on every OOM that `trace` recorded, for each of `strategies`.
///
/// `make_alloc(strategy)` builds a fresh allocator, `make_dev(capacity_bytes)` a fresh (simulated)
/// device. Each verdict costs about 20 replays of the events before the OOM per allocator.
///
/// # Errors
/// A [`ReplayError`] from one of the replays.
pub fn verdicts(
    trace: &Trace,
    strategies: &[Strategy],
    make_alloc: &dyn Fn(Strategy) -> Box<dyn Allocator>,
    make_dev: &dyn Fn(u64) -> SimDevice,
) -> Result<Vec<OomVerdict>, ReplayError> {
    let mut out = Vec::new();
    for (i, e) in trace.events.iter().enumerate() {
        if e.action != Action::Oom {
            continue;
        }
        let device_free = trace
            .ooms
            .iter()
            .find(|o| o.event == i as u64)
            .and_then(|o| o.device_free_bytes);
        let knows_segments = trace.segments.iter().any(|s| s.device == e.device)
            || trace.events.iter().any(|x| {
                x.device == e.device
                    && matches!(
                        x.action,
                        Action::SegmentAlloc
                            | Action::SegmentFree
                            | Action::SegmentMap
                            | Action::SegmentUnmap
                    )
            });
        let reserved = knows_segments.then(|| reserved_before(trace, e.device, i));
        let capacity = reserved.and_then(|r| device_free.map(|f| r.saturating_add(f)));
        let run = run_up_to(trace, e.device, i, e);
        let summary = replay::summarize(&run, e.device);
        let floor = summary.peak_requested_bytes;
        let upper = capacity
            .unwrap_or(0)
            .max(floor)
            .saturating_mul(UPPER_FACTOR)
            .max(1 << 30);
        let opts = ReplayConfig {
            device: e.device,
            ..ReplayConfig::default()
        };
        let mut allocators = Vec::with_capacity(strategies.len());
        for &strategy in strategies {
            let make = || make_alloc(strategy);
            let cfg = MinCapacityConfig {
                upper_bytes: upper,
                resolution_bytes: RESOLUTION_BYTES,
                ..MinCapacityConfig::default()
            };
            let min = match replay::min_capacity(&run, &summary, &make, make_dev, &cfg, &opts)? {
                MinCapacityOutcome::Found(m) => Some(m.smallest_bytes),
                MinCapacityOutcome::NeverCompletes(_) => None,
            };
            let (fits, margin) = match (capacity, min) {
                (Some(c), Some(m)) => {
                    let margin = i128::from(c) - i128::from(m);
                    (
                        Some(margin >= 0),
                        Some(margin.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64),
                    )
                }
                (Some(_), None) => (Some(false), None),
                (None, _) => (None, None),
            };
            allocators.push(AllocatorVerdict {
                strategy,
                fits,
                min_capacity_bytes: min,
                margin_bytes: margin,
            });
        }
        out.push(OomVerdict {
            event: i as u64,
            device: e.device,
            request_bytes: e.size_bytes,
            stream: e.stream,
            reserved_bytes: reserved,
            device_free_bytes: device_free,
            capacity_bytes: capacity,
            allocators,
        });
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::trace::SnapshotSegment;

    #[test]
    fn reserved_counts_segment_events_forward_or_back_from_the_dump() {
        let mut t = Trace {
            events: vec![
                Event::new(Action::SegmentAlloc, 0, 100),
                Event::new(Action::SegmentAlloc, 100, 50),
                Event::new(Action::SegmentFree, 0, 100),
                Event::new(Action::Oom, 0, 10),
                Event::new(Action::SegmentAlloc, 200, 30).on_device(1),
            ],
            ..Trace::default()
        };
        assert_eq!(reserved_before(&t, 0, 3), 50);
        assert_eq!(reserved_before(&t, 0, 1), 100);
        // The dump shows 500 bytes on device 0: 450 were there before recording started.
        t.segments.push(SnapshotSegment {
            device: 0,
            address: 1000,
            total_size_bytes: 500,
            allocated_size_bytes: 0,
            stream: 0,
            segment_type: "large".into(),
            is_expandable: false,
            private_pool: false,
            blocks: Vec::new(),
        });
        assert_eq!(reserved_before(&t, 0, 3), 500);
        assert_eq!(reserved_before(&t, 0, 0), 500 - 50);
        assert_eq!(reserved_before(&t, 1, 5), 30);
    }

    #[test]
    fn verdict_lines_say_fits_or_fails_and_by_how_much() {
        let v = OomVerdict {
            event: 3,
            device: 0,
            request_bytes: 10,
            stream: 0,
            reserved_bytes: Some(50),
            device_free_bytes: Some(5),
            capacity_bytes: Some(55),
            allocators: vec![
                AllocatorVerdict {
                    strategy: Strategy::Paged,
                    fits: Some(true),
                    min_capacity_bytes: Some(40),
                    margin_bytes: Some(15),
                },
                AllocatorVerdict {
                    strategy: Strategy::Torch,
                    fits: Some(false),
                    min_capacity_bytes: Some(70),
                    margin_bytes: Some(-15),
                },
            ],
        };
        let b = |n: u64| format!("{n} B");
        assert_eq!(
            v.lines(&b),
            [
                "paged: fits, 15 B to spare",
                "torch: fails, 15 B short (as recorded)"
            ]
        );
    }
}
