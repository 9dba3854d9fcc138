//! What `--capacity` and `--segment-size` may be, and the warnings a setting earns.
use gpumem_core::config::TorchConfig;
use gpumem_core::config::{LazyConfig, LazyPlacement};
use gpumem_core::sim::DEFAULT_GRANULARITY;
use gpumem_core::strategy::Strategy;

use super::SessionError;
use crate::replay::TraceSummary;
use crate::trace::Trace;
use crate::units::bytes as human_bytes;

/// The largest capacity accepted, in bytes: the simulated device has 64 TiB of address
/// space, and pools reserve address space of a few times the capacity in it.
pub const MAX_CAPACITY: u64 = 16 << 40;

/// Refuses a capacity of 0 or above [`MAX_CAPACITY`] (above it every pool runs out of the
/// simulated address space, and each allocation would be an OOM).
///
/// # Errors
/// [`SessionError::ZeroCapacity`], [`SessionError::CapacityTooLarge`].
pub fn check_capacity(capacity: Option<u64>) -> Result<(), SessionError> {
    match capacity {
        Some(0) => Err(SessionError::ZeroCapacity),
        Some(c) if c > MAX_CAPACITY => Err(SessionError::CapacityTooLarge(c)),
        _ => Ok(()),
    }
}

/// Refuses a segment size of 0.
///
/// # Errors
/// [`SessionError::ZeroSegmentSize`].
pub fn check_segment_size(segment_bytes: u64) -> Result<(), SessionError> {
    if segment_bytes == 0 {
        return Err(SessionError::ZeroSegmentSize);
    }
    Ok(())
}

/// Warnings that need the trace: a capacity that cannot hold the trace's requests.
pub fn capacity_warnings(capacity: Option<u64>, summaries: &[(u32, TraceSummary)]) -> Vec<String> {
    let Some(c) = capacity else {
        return Vec::new();
    };
    let largest = summaries
        .iter()
        .map(|(_, s)| s.largest_request_bytes)
        .max()
        .unwrap_or(0);
    let peak = summaries
        .iter()
        .map(|(_, s)| s.peak_requested_bytes)
        .max()
        .unwrap_or(0);
    let unit_hint = if c < 1 << 20 {
        " (a number without a unit is bytes: write 24GiB for 24 GiB)"
    } else {
        ""
    };
    if c < largest {
        vec![format!(
            "--capacity {} is smaller than the trace's largest request ({}): those allocations cannot succeed{unit_hint}",
            human_bytes(c),
            human_bytes(largest)
        )]
    } else if c < peak {
        vec![format!(
            "--capacity {} is below the trace's peak requested bytes ({}): allocations will fail{unit_hint}",
            human_bytes(c),
            human_bytes(peak)
        )]
    } else {
        Vec::new()
    }
}

/// Warnings for a `--lazy-conf` that parsed (`lazy`) but has keys with no effect under its
/// placement, or whose strategy is not among `strategies`.
pub fn lazy_conf_warnings(text: &str, lazy: &LazyConfig, strategies: &[Strategy]) -> Vec<String> {
    let mut warnings = Vec::new();
    // The keys given, split as lazy_conf read them (it accepted every item).
    let keys: Vec<&str> = crate::conf_items::items(text, &crate::lazy_conf::KEYS)
        .filter_map(Result::ok)
        .map(|(k, _)| k)
        .collect();
    if lazy.placement == LazyPlacement::Pages && keys.contains(&"grow_ahead") {
        warnings.push(
            "--lazy-conf: grow_ahead tunes placement=segments (the default) only; with placement=pages it has no effect (map_ahead is its counterpart there)".to_string(),
        );
    }
    if lazy.placement == LazyPlacement::Segments {
        let ignored: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| matches!(*k, "headroom" | "max_handle" | "map_ahead"))
            .collect();
        if !ignored.is_empty() {
            warnings.push(format!(
                "--lazy-conf: {} tune{} placement=pages only; with placement=segments (the default) {} no effect",
                ignored.join(", "),
                if ignored.len() == 1 { "s" } else { "" },
                if ignored.len() == 1 { "it has" } else { "they have" },
            ));
        }
    }
    if !strategies.contains(&Strategy::PagedLazy) {
        warnings.push(
            "--lazy-conf configures paged-lazy only, which is not among the allocators replayed (add -a paged-lazy)".into(),
        );
    }
    warnings
}

/// The warning for segments of `segment_bytes` larger than the device of `device_bytes`
/// (when known) when `strategies` holds a segmented pool ([`Strategy::is_segmented`]): each
/// growth of such a pool is refused, its cache emptied and the request retried alone.
pub fn segment_size_warning(
    strategies: &[Strategy],
    segment_bytes: u64,
    device_bytes: Option<u64>,
) -> Option<String> {
    let cap = device_bytes.filter(|&c| segment_bytes > c)?;
    let segmented: Vec<&str> = strategies
        .iter()
        .filter(|s| s.is_segmented())
        .map(|s| s.name())
        .collect();
    if segmented.is_empty() {
        return None;
    }
    let one = segmented.len() == 1;
    Some(format!(
        "segments of {} (--segment-size) are larger than the device ({}): {} {} for one, {} refused, {} cache and {} with the request alone at every growth (counted under retries and driver time)",
        human_bytes(segment_bytes),
        human_bytes(cap),
        segmented.join(", "),
        if one { "asks" } else { "ask" },
        if one { "is" } else { "are" },
        if one { "empties its" } else { "empty their" },
        if one { "retries" } else { "retry" },
    ))
}

/// The warning for a segment size that is not a multiple of the device granularity: the
/// pools round it up.
pub fn segment_granularity_warning(segment_bytes: u64) -> Option<String> {
    if segment_bytes.is_multiple_of(DEFAULT_GRANULARITY) {
        return None;
    }
    Some(format!(
        "--segment-size {}: segments are rounded up to a multiple of the device granularity ({}), so {} is used",
        human_bytes(segment_bytes),
        human_bytes(DEFAULT_GRANULARITY),
        human_bytes(segment_bytes.div_ceil(DEFAULT_GRANULARITY) * DEFAULT_GRANULARITY)
    ))
}

/// Warnings for the torch emulation's setting `torch` (`flag_given`: it came from
/// `--torch-conf`): given while the emulation is not among `strategies`, or a
/// garbage-collection threshold that never acts because no memory limit applies.
pub fn torch_conf_warnings(
    flag_given: bool,
    torch: &TorchConfig,
    capacity: Option<u64>,
    strategies: &[Strategy],
) -> Vec<String> {
    let mut warnings = Vec::new();
    if flag_given && !strategies.contains(&Strategy::Torch) {
        warnings.push(
            "--torch-conf configures the torch emulation only, which is not among the allocators replayed (add -a torch)".into(),
        );
    }
    if strategies.contains(&Strategy::Torch)
        && torch.garbage_collection_threshold > 0.0
        && capacity.is_none()
        && torch.allowed_memory_bytes.is_none()
        && torch.per_process_memory_fraction >= 1.0
    {
        warnings.push(
            "garbage_collection_threshold acts only under a memory limit (PyTorch: set_per_process_memory_fraction, or per_process_memory_fraction in the setting): without one or --capacity the collector never runs and the figures are native's".into(),
        );
    }
    warnings
}

/// What a replay of `trace` says under its `read` line: blocks live before recording began,
/// CUDA-graph private pools the torch emulation does not model, and the segments made
/// before recording that the emulation under `torch` starts from or leaves aside.
pub fn read_notes(
    trace: &Trace,
    summaries: &[(u32, TraceSummary)],
    strategies: &[Strategy],
    torch: &TorchConfig,
) -> Vec<String> {
    let counted = |n: usize, noun: &str| format!("{n} {noun}{}", if n == 1 { "" } else { "s" });
    let mut notes: Vec<String> = Vec::new();
    if !trace.preexisting.is_empty() {
        let n = trace.preexisting.len();
        notes.push(format!(
            "{n} block{} already live when recording started (declared, freed without an alloc, or listed in the snapshot's segments); replayed as live from the start",
            if n == 1 { " was" } else { "s were" }
        ));
    }
    let emulated = strategies.contains(&Strategy::Torch);
    let private = trace.segments.iter().filter(|s| s.private_pool).count();
    if private > 0 && emulated {
        notes.push(format!(
            "{} of the snapshot {} to CUDA-graph private pools (torch.cuda.graph, torch.compile mode=\"reduce-overhead\"), which the torch emulation does not model: its figures may differ from PyTorch's where graphs allocate (the self-check says where)",
            counted(private, "segment"),
            if private == 1 { "belongs" } else { "belong" },
        ));
    }
    // The emulation takes in the segments of the kind its setting makes (cudaMalloc
    // segments, or expandable ones under expandable_segments); the others' blocks are
    // allocated as usual.
    let (mut segs, mut other) = (0usize, 0usize);
    for &(d, _) in summaries {
        for s in crate::replay::preexisting_segments(trace, d) {
            if s.segment.mapped.is_some() == torch.expandable_segments {
                segs += 1;
            } else {
                other += 1;
            }
        }
    }
    if segs > 0 && emulated {
        notes.push(format!(
            "{} made before recording started (no event of the trace made {}); the torch emulation starts from {}, as PyTorch did",
            counted(segs, "segment"),
            if segs == 1 { "it" } else { "them" },
            if segs == 1 { "it" } else { "them" },
        ));
    }
    if other > 0 && emulated {
        notes.push(format!(
            "{} made before recording started {} not of the kind {} makes: the torch emulation allocates {} blocks as usual",
            counted(other, if torch.expandable_segments { "cudaMalloc segment" } else { "expandable segment" }),
            if other == 1 { "is" } else { "are" },
            if torch.expandable_segments { "expandable_segments:True" } else { "this setting" },
            if other == 1 { "its" } else { "their" },
        ));
    }
    notes
}
