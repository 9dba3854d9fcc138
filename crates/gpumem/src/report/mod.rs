//! `gpumem report` and `gpumem map`: what each allocator would have done with a trace, as
//! one self-contained HTML page and as a text memory map.
//!
//! [`build`] replays the trace through each allocator twice: once through
//! [`crate::replay::replay`] for the comparison table (the figures of `replay --json`), once
//! through [`record::record`], which wraps the simulated device in a
//! [`record::RecordingDevice`] and stamps every segment, VA range, mapping and block placement
//! with the event during which it happened. From those few arrays the page rebuilds the
//! memory map of any event ([`map::MemoryMap::at`] does the same in Rust), and the per-event
//! figures are folded into [`downsample::Columns`] (min and max per column, so that no peak is
//! lost).
//!
//! [`html::render`] writes the page: uPlot (MIT, vendored from the npm registry with its
//! licence, `vendor/uplot/`) and the page's own script and style inlined, the bulk arrays
//! gzip'd and base64'd into one `<script type="application/json">`, which the page inflates
//! with the browser's `DecompressionStream`. It references no external resource.
use gpumem_core::config::AllocatorConfig;
use gpumem_core::sim::SimDevice;
use gpumem_core::strategy::Strategy;
use gpumem_core::AllocError;
use serde::Serialize;

use crate::replay::{self, ReplayConfig, ReplayError, ReplayReport, TraceSummary};
use crate::trace::{Format, StackId, Trace};

pub mod downsample;
pub mod html;
pub mod map;
pub mod record;

use map::MemoryMap;
use record::{AllocatorRun, TraceBlock, NEVER};

/// How to build a report.
#[derive(Debug, Clone)]
pub struct ReportConfig {
    /// Allocators to compare, in the order shown.
    pub allocators: Vec<Strategy>,
    /// Capacity of the simulated device, in bytes.
    pub capacity_bytes: u64,
    /// Settings of the allocators.
    pub allocator_config: AllocatorConfig,
    /// Device ordinal of the trace to show (`None`: the first one with events).
    pub device: Option<u32>,
    /// Columns of the downsampled timelines (the page is about this many pixels wide).
    pub columns: usize,
    /// The torch emulation runs the recorded run's own setting with no capacity given: its
    /// device hands out the addresses the trace recorded
    /// ([`crate::torch_replay::recording_device`]), as `gpumem replay`'s does, so that its
    /// ties between equal free blocks fall as PyTorch's did and the page's figures are
    /// `replay`'s.
    pub follow_recorded: bool,
}

impl Default for ReportConfig {
    fn default() -> Self {
        ReportConfig {
            allocators: Strategy::ALL.to_vec(),
            capacity_bytes: gpumem_core::sim::DEFAULT_CAPACITY,
            allocator_config: AllocatorConfig::default(),
            device: None,
            columns: 2000,
            follow_recorded: false,
        }
    }
}

/// A report that could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The comparison replay failed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// The recording replay failed (an allocator error other than out-of-memory).
    #[error("event {event}: {allocator}: {source}")]
    Record {
        /// Index of the event.
        event: u64,
        /// Allocator name.
        allocator: String,
        /// The error.
        #[source]
        source: AllocError,
    },
    /// The trace has no allocation or free on the chosen device.
    #[error("the trace has no allocation on device {0}: nothing to show")]
    Empty(u32),
    /// `--event` past the end of the trace.
    #[error("event {event} is past the end of the trace ({events} events)")]
    EventOutOfRange {
        /// The event asked for.
        event: u64,
        /// Events in the trace.
        events: u64,
    },
}

/// PyTorch's own `memory_stats()` figures for the traced run (reference lines).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordedFigures {
    /// `native` or `expandable_segments` (from `<stem>-native.stats.json`,
    /// `<stem>-expandable_segments_True.stats.json`), or `traced run` (from
    /// `<stem>.stats.json`: the recorded run itself, under the trace's own setting).
    pub conf: String,
    /// `reserved_bytes.all.peak`.
    pub reserved_peak_bytes: u64,
    /// `allocated_bytes.all.peak`, when given.
    pub allocated_peak_bytes: Option<u64>,
}

/// Reads the `<stem>-<conf>.stats.json` files (as in `traces/`) and the `<stem>.stats.json`
/// file (as in `traces/validation/`) that lie beside `trace_path`: PyTorch's
/// `torch.cuda.memory_stats()` for the recorded run. Files that are missing or do not parse
/// are skipped ([`recorded_figures_checked`] says why).
pub fn recorded_figures(trace_path: &std::path::Path) -> Vec<RecordedFigures> {
    recorded_figures_checked(trace_path).0
}

/// [`recorded_figures`], with a warning for each such file that is there but cannot be read,
/// is not JSON, or has no whole `reserved_bytes.all.peak` (naming the file and what was
/// expected).
pub fn recorded_figures_checked(
    trace_path: &std::path::Path,
) -> (Vec<RecordedFigures>, Vec<String>) {
    let mut warnings = Vec::new();
    let Some(name) = trace_path.file_name().and_then(|f| f.to_str()) else {
        return (Vec::new(), warnings);
    };
    let stem = name.split('.').next().unwrap_or(name);
    let dir = trace_path.parent().unwrap_or(std::path::Path::new("."));
    let mut out = Vec::new();
    for (suffix, conf) in [
        ("-native", "native"),
        ("-expandable_segments_True", "expandable_segments"),
        ("", "traced run"),
    ] {
        let p = dir.join(format!("{stem}{suffix}.stats.json"));
        let text = match std::fs::read_to_string(&p) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                warnings.push(format!("{}: {e}; PyTorch's figures not shown", p.display()));
                continue;
            }
        };
        let v = match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) => v,
            Err(e) => {
                warnings.push(format!(
                    "{}: not JSON ({e}), expected torch.cuda.memory_stats() as a JSON object; PyTorch's figures not shown",
                    p.display()
                ));
                continue;
            }
        };
        let reserved = v
            .get("reserved_bytes.all.peak")
            .and_then(serde_json::Value::as_u64);
        if reserved.is_none() {
            warnings.push(format!(
                "{}: no whole number under \"reserved_bytes.all.peak\" (expected torch.cuda.memory_stats() as a JSON object); PyTorch's figures not shown",
                p.display()
            ));
        }
        if let Some(r) = reserved {
            out.push(RecordedFigures {
                conf: conf.to_string(),
                reserved_peak_bytes: r,
                allocated_peak_bytes: v
                    .get("allocated_bytes.all.peak")
                    .and_then(serde_json::Value::as_u64),
            });
        }
    }
    (out, warnings)
}

/// Python stacks, interned: frames as `file:line function` strings, stacks as lists of
/// frame indices (innermost first).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StackTable {
    /// Distinct frames.
    pub frames: Vec<String>,
    /// Distinct stacks, innermost frame first.
    pub stacks: Vec<Vec<u32>>,
}

impl StackTable {
    /// The frames of stack `id`, innermost first (empty for an unknown id).
    pub fn frames_of(&self, id: u32) -> Vec<&str> {
        self.stacks
            .get(id as usize)
            .map(|s| {
                s.iter()
                    .filter_map(|&f| self.frames.get(f as usize).map(String::as_str))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The stacks of a trace's events: the table and each event's stack id (by index into
/// `trace.events`; `None` for an event without frames). A trace read without
/// [`ReadConfig::keep_frames`](crate::trace::ReadConfig::keep_frames) gives an empty table.
pub fn trace_stacks(trace: &Trace) -> (StackTable, Vec<Option<u32>>) {
    let mut table = StackTable::default();
    if trace.event_stacks.is_empty() {
        return (table, Vec::new());
    }
    let mut frame_ids: std::collections::HashMap<String, u32> = Default::default();
    // Trace stack id -> ours, made on first use so that only stacks of events are kept.
    let mut ours: Vec<Option<u32>> = vec![None; trace.stacks.len()];
    let mut per_event = Vec::with_capacity(trace.event_stacks.len());
    for &id in &trace.event_stacks {
        if id == StackId::EMPTY {
            per_event.push(None);
            continue;
        }
        let slot = id.0 as usize;
        if let Some(Some(s)) = ours.get(slot) {
            per_event.push(Some(*s));
            continue;
        }
        let mut frames = Vec::new();
        for f in trace.stacks.frames(id) {
            let text = f.to_string();
            let next = table.frames.len() as u32;
            let fid = *frame_ids.entry(text.clone()).or_insert_with(|| {
                table.frames.push(text);
                next
            });
            frames.push(fid);
        }
        let s = table.stacks.len() as u32;
        table.stacks.push(frames);
        if let Some(o) = ours.get_mut(slot) {
            *o = Some(s);
        }
        per_event.push(Some(s));
    }
    (table, per_event)
}

/// Whether a frame (`file:line function`) is in PyTorch, another installed package or native
/// code rather than the user's Python code. A snapshot recorded with C++ stacks
/// (`_record_memory_history(stacks="all")`) puts the allocator's own frames innermost
/// (`??:0 torch::unwind::unwind()`, `CUDACachingAllocator.cpp:0 ...malloc(...)`): a frame
/// whose file is not a `.py` file is native.
fn is_library_frame(frame: &str) -> bool {
    frame.starts_with("torch/")
        || frame.contains("/torch/")
        || frame.contains("site-packages/")
        || frame.contains("dist-packages/")
        || frame.starts_with('<')
        || !frame_file(frame).ends_with(".py")
}

/// The allocation site of a stack (innermost first): its innermost frame in the user's code;
/// when every frame is in a library, its innermost Python frame, else its innermost frame.
pub fn site_frame<'a>(frames: &[&'a str]) -> Option<&'a str> {
    frames
        .iter()
        .copied()
        .find(|f| !is_library_frame(f))
        .or_else(|| {
            frames
                .iter()
                .copied()
                .find(|f| frame_file(f).ends_with(".py"))
        })
        .or_else(|| frames.first().copied())
}

/// The file of a frame `file:line function`.
fn frame_file(frame: &str) -> &str {
    let location = frame.split_once(' ').map_or(frame, |(l, _)| l);
    location.rsplit_once(':').map_or(location, |(f, _)| f)
}

/// Live blocks of one allocation site at the moment of peak requested memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SiteShare {
    /// The site: the innermost frame of the stack in the user's code ([`site_frame`]), or
    /// `(no stack recorded)`.
    pub site: String,
    /// A representative stack id (for the page's tooltip).
    pub stack: Option<u32>,
    /// Live blocks from it.
    pub blocks: u64,
    /// Their requested bytes.
    pub requested_bytes: u64,
}

/// Everything the page shows.
#[derive(Debug, Clone)]
pub struct Report {
    /// The trace's name (its path as given).
    pub trace_name: String,
    /// Its format.
    pub format: Option<Format>,
    /// Device ordinal shown.
    pub device: u32,
    /// Every device ordinal of the trace, in order: the page names the others when there
    /// are several (the page shows one; `--trace-device N` another).
    pub trace_devices: Vec<u32>,
    /// Figures of the trace alone.
    pub summary: TraceSummary,
    /// Capacity of the simulated device, in bytes.
    pub capacity_bytes: u64,
    /// The trace's blocks (every run's placements follow them index for index).
    pub blocks: Vec<TraceBlock>,
    /// Event after which requested bytes were highest (first such event).
    pub peak_requested_event: u64,
    /// One recorded run per allocator.
    pub runs: Vec<AllocatorRun>,
    /// The comparison replay of each allocator (the figures of `replay --json`).
    pub replays: Vec<ReplayReport>,
    /// PyTorch's recorded figures, when they came with the trace.
    pub recorded: Vec<RecordedFigures>,
    /// The segments the snapshot recorded at dump time, as a map.
    pub snapshot_map: Option<MemoryMap>,
    /// Python stacks, when the trace recorded them.
    pub stacks: StackTable,
    /// The settings of the configurable allocators replayed, `(allocator, settings, what
    /// they do)`: the torch emulation's PYTORCH_CUDA_ALLOC_CONF (and no explanation),
    /// `paged-lazy`'s items that take effect and its placement in words
    /// ([`crate::lazy_conf::describe`]).
    pub settings: Vec<(String, String, String)>,
    /// What a lenient read left out, as `replay` says it under its `read` line
    /// ([`Trace::lenient_notes`]). Empty for a trace read whole.
    pub read_notes: Vec<String>,
}

impl Report {
    /// Events of the shown device.
    pub fn events(&self) -> u64 {
        self.summary.events
    }

    /// The map of allocator `run` after `event` (`None`: at its peak reserved bytes).
    ///
    /// # Errors
    /// [`ReportError::EventOutOfRange`] for an event past the end.
    pub fn map(&self, run: usize, event: Option<u64>) -> Result<MemoryMap, ReportError> {
        let r = &self.runs[run.min(self.runs.len().saturating_sub(1))];
        let e = match event {
            Some(e) if e >= self.events().max(1) => {
                return Err(ReportError::EventOutOfRange {
                    event: e,
                    events: self.events(),
                })
            }
            Some(e) => e,
            None => r.peak_reserved_event,
        };
        Ok(MemoryMap::at(r, &self.blocks, e))
    }

    /// Blocks live after event `event`, largest requested first (indices into `blocks`).
    pub fn live_at(&self, event: u64) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.blocks.len())
            .filter(|&i| {
                let b = &self.blocks[i];
                b.alloc_event <= event && (b.free_event == NEVER || event < b.free_event)
            })
            .collect();
        v.sort_by(|&a, &b| {
            self.blocks[b]
                .requested_bytes
                .cmp(&self.blocks[a].requested_bytes)
                .then(a.cmp(&b))
        });
        v
    }

    /// The allocation sites of the blocks live at the peak of requested bytes, most bytes first.
    pub fn sites_at_peak(&self) -> Vec<SiteShare> {
        let mut by: std::collections::HashMap<String, SiteShare> = Default::default();
        for i in self.live_at(self.peak_requested_event) {
            let b = &self.blocks[i];
            let site = b
                .stack
                .and_then(|s| site_frame(&self.stacks.frames_of(s)).map(str::to_string))
                .unwrap_or_else(|| "(no stack recorded)".to_string());
            let e = by.entry(site.clone()).or_insert(SiteShare {
                site,
                stack: b.stack,
                blocks: 0,
                requested_bytes: 0,
            });
            e.blocks += 1;
            e.requested_bytes = e.requested_bytes.saturating_add(b.requested_bytes);
        }
        let mut v: Vec<SiteShare> = by.into_values().collect();
        v.sort_by(|a, b| {
            b.requested_bytes
                .cmp(&a.requested_bytes)
                .then(a.site.cmp(&b.site))
        });
        v
    }
}

/// The first event after which the sum of requested bytes of live blocks is highest.
fn peak_requested_event(blocks: &[TraceBlock], events: u64) -> u64 {
    let n = events.max(1) as usize;
    let mut delta = vec![0i128; n + 1];
    for b in blocks {
        delta[(b.alloc_event as usize).min(n)] += i128::from(b.requested_bytes);
        if b.free_event != NEVER {
            delta[(b.free_event as usize).min(n)] -= i128::from(b.requested_bytes);
        }
    }
    let (mut cur, mut best, mut at) = (0i128, i128::MIN, 0u64);
    for (e, d) in delta.iter().take(n).enumerate() {
        cur += d;
        if cur > best {
            best = cur;
            at = e as u64;
        }
    }
    at
}

/// Replays `trace` through each allocator of `cfg` on the simulated device and gathers
/// everything the page and the map show. `trace_name` labels the page; `progress` is told
/// which allocator is being replayed.
///
/// # Errors
/// [`ReportError`]: an empty trace, an allocator failing for a reason
/// other than out-of-memory.
pub fn build(
    trace: &Trace,
    trace_name: &str,
    cfg: &ReportConfig,
    progress: &mut dyn FnMut(&str),
) -> Result<Report, ReportError> {
    let devices = replay::devices(trace);
    let device = cfg.device.unwrap_or_else(|| {
        devices
            .iter()
            .copied()
            .find(|&d| trace.events.iter().any(|e| e.device == d))
            .unwrap_or(0)
    });
    let summary = replay::summarize(trace, device);
    if summary.allocs == 0 && summary.preexisting_blocks == 0 {
        return Err(ReportError::Empty(device));
    }
    let (stacks, event_stacks) = trace_stacks(trace);
    let blocks = record::trace_blocks(trace, device, &event_stacks);
    let events = summary.events.max(1);
    let mut runs = Vec::new();
    let mut replays = Vec::new();
    // As the replay does for the torch emulation: the segments the recorded run already
    // held, and where it released its cache.
    let replay::TorchInputs {
        segments: preexisting_segments,
        releases,
    } = replay::TorchInputs::of(trace, device);
    let mut empty_cache_at: Vec<u64> = releases.into_iter().collect();
    empty_cache_at.sort_unstable();
    // The torch emulation's device that hands out the recorded addresses, built once (it
    // replays the pre-existing blocks through the emulation) and cloned, untouched, for the
    // recording replay and the comparison replay.
    let mut recording_device: Option<SimDevice> = None;
    for &strategy in &cfg.allocators {
        progress(strategy.name());
        let mut alloc = strategy.build(&cfg.allocator_config);
        // Both for the torch emulation only, as the replay does.
        let torch = replay::TorchInputs::wanted_by(strategy);
        let setup = record::RecordSetup {
            preexisting_segments: if torch {
                preexisting_segments.clone()
            } else {
                Vec::new()
            },
            empty_cache_at: if torch {
                empty_cache_at.clone()
            } else {
                Vec::new()
            },
        };
        let fresh = if torch && cfg.follow_recorded {
            recording_device
                .get_or_insert_with(|| {
                    crate::torch_replay::recording_device(
                        trace,
                        device,
                        &cfg.allocator_config.torch,
                        cfg.capacity_bytes,
                    )
                })
                .clone()
        } else {
            SimDevice::new(cfg.capacity_bytes)
        };
        let run = record::record(
            &blocks,
            events,
            alloc.as_mut(),
            fresh.clone(),
            cfg.columns,
            &setup,
        )
        .map_err(|(event, source)| ReportError::Record {
            event,
            allocator: strategy.to_string(),
            source,
        })?;
        runs.push(run);
        let mut alloc = strategy.build(&cfg.allocator_config);
        let mut dev = fresh;
        let opts = ReplayConfig {
            device,
            ..ReplayConfig::default()
        };
        replays.push(replay::replay(
            trace,
            alloc.as_mut(),
            &mut dev,
            &opts,
            &mut |_| {},
        )?);
    }
    let snapshot_map = (!trace.segments.is_empty())
        .then(|| MemoryMap::from_snapshot(&trace.segments, device))
        .filter(|m| !m.rows.is_empty());
    Ok(Report {
        trace_name: trace_name.to_string(),
        format: trace.format,
        device,
        trace_devices: devices,
        summary,
        capacity_bytes: cfg.capacity_bytes,
        peak_requested_event: peak_requested_event(&blocks, events),
        blocks,
        runs,
        replays,
        recorded: Vec::new(),
        snapshot_map,
        stacks,
        settings: cfg
            .allocators
            .iter()
            .filter_map(|&strategy| match strategy {
                Strategy::Torch => Some((
                    strategy.to_string(),
                    format!("PYTORCH_CUDA_ALLOC_CONF {}", cfg.allocator_config.torch),
                    String::new(),
                )),
                Strategy::PagedLazy => {
                    let (items, what) = crate::lazy_conf::describe(&cfg.allocator_config.lazy);
                    Some((strategy.to_string(), items, what))
                }
                Strategy::Buddy | Strategy::Tlsf | Strategy::BestFit | Strategy::Paged => None,
            })
            .collect(),
        read_notes: trace.lenient_notes(),
    })
}

#[cfg(test)]
mod tests;
