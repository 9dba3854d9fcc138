//! Replaying a trace through the PyTorch caching-allocator emulation as PyTorch ran it:
//! under a `PYTORCH_CUDA_ALLOC_CONF` (the trace's own by default), on a simulated device that
//! hands out the segment addresses the recorded run got, with a self-check of the emulation's
//! cudaMalloc/cudaFree sequence against the recorded one.
//!
//! PyTorch breaks best-fit ties between free blocks of equal size by address, so where the
//! driver put each segment decides which block serves a request. With the recorded
//! addresses the emulation sees the same ties as PyTorch did; without them (a trace with no
//! `segment_alloc` events, or another setting than the recorded one) the simulated device
//! places newer segments below older ones, as the CUDA driver usually does.
use gpumem_core::config::TorchConfig;
use gpumem_core::sim::{RecordedCall, RecordedCheck, RecordedKind, SimDevice};
use gpumem_core::torch::{TorchCachingPool, TorchStats};
use gpumem_core::Allocator;
use serde::Serialize;

use crate::replay::{
    self, MinCapacity, MinCapacityConfig, MinCapacityOutcome, ReplayConfig, ReplayError,
    ReplayReport, TraceSummary,
};
use crate::trace::{Action, Trace};

/// The cudaMalloc (`segment_alloc`) and cudaFree (`segment_free`) calls the trace recorded
/// on `device`, in order, with their event indices.
pub fn recorded_calls(trace: &Trace, device: u32) -> Vec<RecordedCall> {
    trace
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.device == device)
        .filter_map(|(i, e)| {
            let kind = match e.action {
                Action::SegmentAlloc => RecordedKind::Alloc,
                Action::SegmentFree => RecordedKind::Free,
                _ => return None,
            };
            Some(RecordedCall {
                kind,
                addr: e.addr,
                bytes: e.size_bytes,
                event: i as u64,
            })
        })
        .collect()
}

/// How a replay through the emulation under `conf` starts on `device`: the cudaMallocs of
/// the segments the recorded run already held that the emulation takes in
/// ([`replay::preexisting_segments`], [`Allocator::adopt_segment`]), as recorded calls at
/// their recorded addresses, and the number of cudaMallocs it then makes for the other blocks
/// live before recording started (their segments were made before the recording, so they are
/// not in its `segment_alloc` events, and the replay places them as usual).
pub fn preexisting_allocs(
    trace: &Trace,
    device: u32,
    conf: &TorchConfig,
    capacity: u64,
) -> (Vec<RecordedCall>, u64) {
    let mut pool = TorchCachingPool::with_conf(*conf);
    let mut dev = SimDevice::new(capacity);
    let mut adopted_calls = Vec::new();
    let mut adopted = rustc_hash::FxHashSet::default();
    // As in the replay: what is not adopted is allocated as usual. (A fresh simulated
    // device makes no other error than out of memory, which adopts nothing.)
    let segments = replay::preexisting_segments(trace, device);
    let taken = replay::adopt_preexisting(&mut pool, &mut dev, &segments).unwrap_or_default();
    for (k, _) in taken {
        let f = &segments[k];
        // An expandable segment's pages are map steps, not a recorded cudaMalloc.
        if f.segment.mapped.is_none() {
            adopted_calls.push(RecordedCall {
                kind: RecordedKind::Alloc,
                addr: f.address,
                bytes: f.segment.bytes,
                event: 0,
            });
        }
        adopted.extend(f.block_addrs.iter().copied());
    }
    let before = pool.torch_stats().num_device_alloc;
    for p in trace
        .preexisting
        .iter()
        .filter(|p| p.device == device && !adopted.contains(&p.addr))
    {
        // An allocation that fails here fails in the replay too (and is dropped there).
        let _ = pool.allocate(&mut dev, p.size_bytes, gpumem_core::DEFAULT_ALIGN, 0);
    }
    (adopted_calls, pool.torch_stats().num_device_alloc - before)
}

#[cfg(test)]
thread_local! {
    /// Devices [`recording_device`] built on this thread (a test counts them).
    pub(crate) static RECORDING_DEVICES_BUILT: std::cell::Cell<u64> =
        const { std::cell::Cell::new(0) };
}

/// A simulated device of `capacity_bytes` that hands out the addresses `trace` recorded on
/// `device` (when it recorded segment events) for the emulation under `conf`: first those of
/// the segments held before recording started, then those of its `segment_alloc` events.
///
/// Building it replays the blocks live before recording started through the emulation
/// ([`preexisting_allocs`]) and scans the trace: a caller that replays twice clones one.
pub fn recording_device(
    trace: &Trace,
    device: u32,
    conf: &TorchConfig,
    capacity_bytes: u64,
) -> SimDevice {
    #[cfg(test)]
    RECORDING_DEVICES_BUILT.with(|n| n.set(n.get() + 1));
    let mut dev = SimDevice::new(capacity_bytes);
    let calls = recorded_calls(trace, device);
    if !calls.is_empty() {
        let (mut script, skip) = preexisting_allocs(trace, device, conf, capacity_bytes);
        let skip_from = script.len();
        script.extend(calls);
        dev.follow_recorded_from(script, skip_from, skip);
    }
    dev
}

/// What one replay through the emulation measured.
#[derive(Debug, Clone, Serialize)]
pub struct TorchReplay {
    /// The settings emulated.
    pub conf: String,
    /// The replay's figures.
    pub report: ReplayReport,
    /// `torch.cuda.memory_stats()` figures beyond the report's.
    pub torch_stats: TorchStats,
    /// The self-check against the recorded cudaMalloc/cudaFree sequence, when the device
    /// followed the recorded addresses.
    pub emulation_check: Option<RecordedCheck>,
}

/// Replays `trace` (events of `opts.device`) through the emulation under `conf` on a
/// simulated device of `capacity_bytes`. When `follow_recorded` is set and the trace
/// recorded segment events, the device hands out the recorded addresses and the result
/// carries the self-check; set it only when `conf` is the recorded run's setting and the
/// capacity does not cut the run short (otherwise the sequences differ by design).
///
/// # Errors
/// A [`ReplayError`] from the replay (an emulation bug or an invariant broken).
pub fn replay_torch(
    trace: &Trace,
    conf: &TorchConfig,
    capacity_bytes: u64,
    follow_recorded: bool,
    opts: &ReplayConfig,
    progress: &mut dyn FnMut(u64),
) -> Result<TorchReplay, ReplayError> {
    let mut dev = if follow_recorded {
        recording_device(trace, opts.device, conf, capacity_bytes)
    } else {
        SimDevice::new(capacity_bytes)
    };
    let mut pool = TorchCachingPool::with_conf(*conf);
    let report = replay::replay(trace, &mut pool, &mut dev, opts, progress)?;
    Ok(TorchReplay {
        conf: conf.to_string(),
        report,
        torch_stats: pool.torch_stats(),
        emulation_check: dev.recorded_check(),
    })
}

/// The smallest capacity (to the 2 MiB granularity) with which the trace completes without
/// an out-of-memory under `conf`, between the trace's peak requested bytes and
/// `upper_bytes`; `None` if even `upper_bytes` does not complete. With
/// `garbage_collection_threshold` the capacity is also the memory limit (as
/// `set_per_process_memory_fraction` would set it, so the collector acts), and the search
/// bisects: the collector's behaviour changes with every capacity. At most `max_replays`
/// replays scan for exact figures before the rest is bisected.
///
/// # Errors
/// A [`ReplayError`] from one of the replays.
pub fn min_capacity(
    trace: &Trace,
    summary: &TraceSummary,
    conf: &TorchConfig,
    upper_bytes: u64,
    max_replays: u64,
    opts: &ReplayConfig,
) -> Result<Option<MinCapacity>, ReplayError> {
    let gc = conf.garbage_collection_threshold > 0.0;
    let conf = TorchConfig {
        limit_to_capacity: gc,
        ..*conf
    };
    let make = || -> Box<dyn Allocator> { Box::new(TorchCachingPool::with_conf(conf)) };
    let make_dev = |c: u64| SimDevice::new(c);
    let search = MinCapacityConfig {
        upper_bytes,
        max_replays: if gc { 0 } else { max_replays },
        ..MinCapacityConfig::default()
    };
    Ok(
        match replay::min_capacity(trace, summary, &make, &make_dev, &search, opts)? {
            MinCapacityOutcome::Found(m) => Some(m),
            MinCapacityOutcome::NeverCompletes(_) => None,
        },
    )
}
