//! Allocation traces: the event model shared by every reader, and format detection.
//!
//! Readers (one module each) turn a file into a [`Trace`]: a flat, time-ordered list of
//! [`Event`]s. Memory returns to the pool at PyTorch's `free_completed` (not
//! `free_requested`), so a reader emits [`Action::Free`] there.
//!
//! Formats, detected from the content (not the extension) by [`detect`]:
//! - PyTorch memory snapshots ([`pickle`]), plain or gzip'd: read by a small pickle VM that never
//!   executes anything from the file;
//! - RMM `logging_resource_adaptor` CSV logs ([`rmm`]);
//! - gpumem JSON lines ([`jsonl`]), which [`jsonl::write_jsonl`] writes from any trace.
//!
//! A snapshot's recorded state (its `segments`) is analysed by [`analysis`].
use serde::Serialize;

pub mod analysis;
pub mod detect;
pub mod jsonl;
mod live;
pub mod pickle;
pub mod rmm;
pub mod stacks;

pub use stacks::{FrameRef, StackId, StackTable};

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A block of `size_bytes` at `addr` was handed out.
    Alloc,
    /// The block at `addr` went back to the allocator.
    Free,
    /// The block at `addr` was freed by its user, but the allocator reuses it only once other
    /// streams are done with it (`record_stream`): PyTorch's `free_requested` when its
    /// `free_completed` (the [`Action::Free`]) comes later. PyTorch takes the block out of
    /// `allocated_bytes` here and out of `requested_bytes` at the `Free`. Read only when
    /// other events come between the two.
    FreeRequested,
    /// The allocator took a segment from the driver (PyTorch `segment_alloc`, informational).
    SegmentAlloc,
    /// The allocator gave a segment back (`segment_free`, informational).
    SegmentFree,
    /// Expandable segments mapped pages (`segment_map`, informational).
    SegmentMap,
    /// Expandable segments unmapped pages (`segment_unmap`, informational).
    SegmentUnmap,
    /// The allocator ran out of memory (`oom`, informational; `size_bytes` is the request).
    Oom,
    /// A snapshot was taken (`snapshot`, informational).
    Snapshot,
}

/// One trace event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Event {
    /// What happened.
    pub action: Action,
    /// Device address (or, for gpumem JSON lines, any unique id) of the block or segment.
    pub addr: u64,
    /// Requested bytes for `Alloc`; for `Free` the size of the block freed (0 when unknown);
    /// segment size for segment events.
    pub size_bytes: u64,
    /// CUDA stream handle (0 = default stream).
    pub stream: u64,
    /// Device ordinal.
    pub device: u32,
    /// Microseconds since an arbitrary epoch, when the file had it.
    pub time_us: Option<i64>,
    /// Requested alignment in bytes (gpumem JSON lines only; default 256).
    pub align: Option<u64>,
}

impl Event {
    /// An event of `action` for the block or segment at `addr` of `size_bytes` bytes, on the
    /// default stream of device 0, with no time and no alignment.
    pub fn new(action: Action, addr: u64, size_bytes: u64) -> Event {
        Event {
            action,
            addr,
            size_bytes,
            stream: 0,
            device: 0,
            time_us: None,
            align: None,
        }
    }

    /// A request of `size_bytes` bytes served at `addr` (device 0, default stream).
    ///
    /// ```
    /// use gpumem::trace::{Action, Event};
    /// let e = Event::alloc(0x1000, 512).on_device(1).on_stream(7);
    /// assert_eq!((e.action, e.addr, e.size_bytes, e.device, e.stream), (Action::Alloc, 0x1000, 512, 1, 7));
    /// ```
    pub fn alloc(addr: u64, size_bytes: u64) -> Event {
        Event::new(Action::Alloc, addr, size_bytes)
    }

    /// The block at `addr` goes back to the allocator; `size_bytes` is its size, 0 when
    /// unknown (device 0, default stream).
    pub fn free(addr: u64, size_bytes: u64) -> Event {
        Event::new(Action::Free, addr, size_bytes)
    }

    /// The same event on device ordinal `device`.
    #[must_use]
    pub fn on_device(mut self, device: u32) -> Event {
        self.device = device;
        self
    }

    /// The same event on stream `stream` (a CUDA stream handle; 0 = default stream).
    #[must_use]
    pub fn on_stream(mut self, stream: u64) -> Event {
        self.stream = stream;
        self
    }
}

/// An out-of-memory that the snapshot recorded (`oom` trace entry): what the failing request
/// met. The request itself is the [`Action::Oom`] event at [`RecordedOom::event`] (its
/// `size_bytes`, `device` and `stream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RecordedOom {
    /// Index in [`Trace::events`] of the [`Action::Oom`] event.
    pub event: u64,
    /// Bytes the driver reported free on the device at that moment (`device_free`), when the
    /// entry had it.
    pub device_free_bytes: Option<u64>,
}

/// The caching allocator's settings recorded in a snapshot (`allocator_settings`, PyTorch 2.1
/// and later).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AllocatorSettings {
    /// The `PYTORCH_CUDA_ALLOC_CONF` string in force (e.g. `expandable_segments:True`); empty
    /// when the variable was unset.
    pub alloc_conf: String,
    /// `max_split_size` in bytes; `None` when unlimited (PyTorch writes -1) or absent.
    pub max_split_size_bytes: Option<u64>,
    /// `garbage_collection_threshold` (fraction of the memory limit; 0 = off).
    pub garbage_collection_threshold: Option<f64>,
    /// `expandable_segments`.
    pub expandable_segments: Option<bool>,
    /// `roundup_power2_divisions` as `(key, divisions)` pairs in the order recorded: the key is
    /// the size interval as PyTorch names it (`"1"`, `"2"`, ... in MiB; the interval of sizes
    /// from that many MiB to twice as many), 0 divisions = no rounding in that interval.
    pub roundup_power2_divisions: Vec<(String, u64)>,
    /// Every recorded key with its value as text (Python's `repr` style), the ones above
    /// included, in the order recorded.
    pub all: Vec<(String, String)>,
}

impl AllocatorSettings {
    /// The torch emulation's setting for these recorded settings
    /// ([`TorchConfig::from_recorded`](gpumem_core::config::TorchConfig::from_recorded): the
    /// `PYTORCH_CUDA_ALLOC_CONF` string when one was recorded, else the individual fields).
    ///
    /// # Errors
    /// [`ConfError`](gpumem_core::config::ConfError) when the string does not parse or a field
    /// is out of PyTorch's range.
    pub fn torch_config(
        &self,
    ) -> Result<gpumem_core::config::TorchConfig, gpumem_core::config::ConfError> {
        gpumem_core::config::TorchConfig::from_recorded(
            &self.alloc_conf,
            self.max_split_size_bytes,
            self.garbage_collection_threshold,
            self.expandable_segments,
            &self.roundup_power2_divisions,
        )
    }
}

/// A block that was already live when recording started: freed in the trace, never allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PreexistingBlock {
    /// Address of the block.
    pub addr: u64,
    /// Its size in bytes, when the free event or the snapshot's segments told it.
    pub size_bytes: u64,
    /// Device ordinal.
    pub device: u32,
    /// Index in [`Trace::events`] of the event that frees it; `None` when the trace never frees
    /// it (a block the snapshot's `segments` show allocated at dump time that no trace event
    /// touches: it was live during the whole recording).
    pub freed_at_event: Option<u64>,
}

/// The file formats gpumem reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// `torch.cuda.memory._dump_snapshot` pickle, optionally gzip'd.
    TorchSnapshot,
    /// RMM `logging_resource_adaptor` CSV.
    RmmCsv,
    /// gpumem JSON lines.
    JsonLines,
}

/// A block recorded in a snapshot's `segments` (state, not trace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotBlock {
    /// Address of the block (the snapshot's `address`, or the segment address plus the sizes
    /// of the blocks before it when the file lacks it).
    pub address: u64,
    /// Bytes of the block.
    pub size_bytes: u64,
    /// Bytes requested for it (0 if free).
    pub requested_bytes: u64,
    /// `active_allocated`, `active_pending_free` or `inactive`.
    pub state: String,
    /// The Python stack recorded with the block (its `frames`, the allocation's stack) when
    /// read with [`ReadConfig::keep_frames`]; [`StackId::EMPTY`] otherwise.
    pub stack: StackId,
}

impl SnapshotBlock {
    /// The block as a pre-existing block of `device` that no trace event frees: its requested
    /// bytes when recorded, else its size.
    pub fn as_preexisting(&self, device: u32) -> PreexistingBlock {
        PreexistingBlock {
            addr: self.address,
            size_bytes: if self.requested_bytes > 0 {
                self.requested_bytes
            } else {
                self.size_bytes
            },
            device,
            freed_at_event: None,
        }
    }
}

/// A segment recorded in a snapshot's `segments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotSegment {
    /// Device ordinal.
    pub device: u32,
    /// Address of the segment.
    pub address: u64,
    /// Bytes of the segment.
    pub total_size_bytes: u64,
    /// Bytes allocated in it.
    pub allocated_size_bytes: u64,
    /// Stream handle.
    pub stream: u64,
    /// `small` or `large` pool.
    pub segment_type: String,
    /// Whether it was an expandable segment.
    pub is_expandable: bool,
    /// Whether it belongs to a CUDA-graph private memory pool (`segment_pool_id` other than
    /// `(0, 0)`: memory allocated while a graph was captured, `torch.cuda.graph` or
    /// `torch.compile(mode="reduce-overhead")`).
    pub private_pool: bool,
    /// Its blocks in address order.
    pub blocks: Vec<SnapshotBlock>,
}

/// A whole trace.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Trace {
    /// The format it was read from, if any.
    pub format: Option<Format>,
    /// Events in order.
    pub events: Vec<Event>,
    /// Blocks live before recording started (frees of never-allocated addresses).
    pub preexisting: Vec<PreexistingBlock>,
    /// Segments the snapshot recorded (its state at dump time); empty for other formats.
    pub segments: Vec<SnapshotSegment>,
    /// Bad events skipped under `--lenient`, with the reason for each (first 100 kept).
    pub skipped: Vec<String>,
    /// How many events were skipped in total.
    pub skipped_count: u64,
    /// Things the reader noticed that do not stop it (an unknown key that looks like a typo
    /// of a known one, ...), each naming its place in the file; first [`SKIPPED_KEPT`] kept.
    pub warnings: Vec<String>,
    /// Set when a lenient read salvaged a truncated file: where it was cut and what was kept.
    pub truncated: Option<String>,
    /// Python stacks of the events, interned (filled only under [`ReadConfig::keep_frames`]).
    pub stacks: StackTable,
    /// The stack of each event (same length as [`Trace::events`]) when the trace was read with
    /// [`ReadConfig::keep_frames`] from a snapshot; empty otherwise. See [`Trace::stack_of`].
    pub event_stacks: Vec<StackId>,
    /// The snapshot's `allocator_settings`, when it had them.
    pub allocator_settings: Option<AllocatorSettings>,
    /// What each recorded out-of-memory met, one per [`Action::Oom`] event, in event order.
    pub ooms: Vec<RecordedOom>,
}

/// How many reasons [`Trace::skipped`] keeps.
pub const SKIPPED_KEPT: usize = 100;

impl Trace {
    /// Records a skipped event (under [`ReadConfig::lenient`]): counts it and keeps the first
    /// [`SKIPPED_KEPT`] reasons.
    pub fn skip(&mut self, reason: String) {
        self.skipped_count += 1;
        if self.skipped.len() < SKIPPED_KEPT {
            self.skipped.push(reason);
        }
    }

    /// The Python stack of event `index` (see [`Trace::stacks`] to read its frames): `None`
    /// when the trace was read without [`ReadConfig::keep_frames`], or `index` is out of range.
    pub fn stack_of(&self, index: usize) -> Option<StackId> {
        self.event_stacks.get(index).copied()
    }

    /// What a lenient read left out, in the words `replay` prints under its `read` line and
    /// `report` shows on its page: the cut of a salvaged file (`truncated: ...`), the
    /// malformed events skipped (`skipped: ...`, the first five, then how many more). Empty
    /// for a trace read whole.
    pub fn lenient_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if let Some(t) = &self.truncated {
            notes.push(format!("truncated: {t}"));
        }
        for s in self.skipped.iter().take(5) {
            notes.push(format!("skipped: {s}"));
        }
        if self.skipped_count > 5 {
            notes.push(format!("... and {} more skipped", self.skipped_count - 5));
        }
        notes
    }

    /// Records a warning (see [`Trace::warnings`]).
    pub fn warn(&mut self, warning: String) {
        if self.warnings.len() < SKIPPED_KEPT {
            self.warnings.push(warning);
        }
    }

    /// Number of events with the given action.
    pub fn count(&self, action: Action) -> usize {
        self.events.iter().filter(|e| e.action == action).count()
    }

    /// A one-paragraph summary for people: event counts, pre-existing blocks (freed in the
    /// trace, or live all along) and skipped events.
    ///
    /// ```
    /// use gpumem::trace::{read_bytes, ReadConfig};
    /// let log = b"{\"action\":\"alloc\",\"addr\":1,\"size\":4096}\n{\"action\":\"free\",\"addr\":1}\n";
    /// let trace = read_bytes("example.jsonl", log, ReadConfig::default())?;
    /// assert!(trace.summary().starts_with("2 events: 1 alloc, 1 free"));
    /// # Ok::<(), gpumem::trace::TraceError>(())
    /// ```
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} event{}: {} alloc, {} free",
            self.events.len(),
            if self.events.len() == 1 { "" } else { "s" },
            self.count(Action::Alloc),
            self.count(Action::Free)
        );
        for (a, name) in [
            (Action::FreeRequested, "free_requested"),
            (Action::SegmentAlloc, "segment_alloc"),
            (Action::SegmentFree, "segment_free"),
            (Action::SegmentMap, "segment_map"),
            (Action::SegmentUnmap, "segment_unmap"),
            (Action::Oom, "oom"),
            (Action::Snapshot, "snapshot"),
        ] {
            let n = self.count(a);
            if n > 0 {
                s.push_str(&format!(", {n} {name}"));
            }
        }
        if !self.preexisting.is_empty() {
            let freed = self
                .preexisting
                .iter()
                .filter(|b| b.freed_at_event.is_some())
                .count();
            let bytes = self
                .preexisting
                .iter()
                .fold(0u64, |a, b| a.saturating_add(b.size_bytes));
            s.push_str(&format!(
                "; {} blocks ({bytes} bytes) allocated before recording started: {freed} freed \
                 in the trace, {} live throughout",
                self.preexisting.len(),
                self.preexisting.len() - freed
            ));
        }
        if !self.segments.is_empty() {
            s.push_str(&format!("; {} recorded segments", self.segments.len()));
        }
        if self.skipped_count > 0 {
            s.push_str(&format!(
                "; {} bad event{} skipped",
                self.skipped_count,
                if self.skipped_count == 1 { "" } else { "s" }
            ));
        }
        s
    }
}

/// A reader error: which file, which event, what was expected.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a trace (an LFS pointer, HTML, an empty file, ...).
    #[error("{path}: not an allocation trace: {what}")]
    NotATrace {
        /// The file.
        path: String,
        /// What it looks like instead.
        what: String,
    },
    /// An event or structure is malformed. The message starts with where: `event N (device D
    /// trace entry I)` for snapshots, `line N` for the text formats, or a byte offset.
    #[error("{path}: {message}")]
    Malformed {
        /// The file.
        path: String,
        /// 0-based index of the event (or line number − 1 for text formats).
        index: u64,
        /// What was found and what was expected.
        message: String,
    },
    /// The file asked for something a reader must never do (a pickle global/class).
    #[error("{path}: refused: {message}")]
    Refused {
        /// The file.
        path: String,
        /// What was refused.
        message: String,
    },
}

/// Reading options.
///
/// ```
/// use gpumem::trace::ReadConfig;
/// let with_stacks = ReadConfig { keep_frames: true, ..ReadConfig::default() };
/// assert!(!with_stacks.lenient);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadConfig {
    /// Skip and count malformed events instead of failing.
    pub lenient: bool,
    /// Keep each snapshot trace entry's Python stack (`frames`: file name, line, function
    /// name) in [`Trace::stacks`] and [`Trace::event_stacks`]. Off by default: a plain replay
    /// does not need them and reads faster without them. Other formats carry no stacks.
    pub keep_frames: bool,
}

/// The name messages give the trace at `path`: `standard input` for `-` (what [`read_path`]
/// reads then), the path otherwise.
///
/// ```
/// use gpumem::trace::source_name;
/// use std::path::Path;
/// assert_eq!(source_name(Path::new("-")), "standard input");
/// assert_eq!(source_name(Path::new("a/t.jsonl")), "a/t.jsonl");
/// ```
pub fn source_name(path: &std::path::Path) -> String {
    if path.as_os_str() == "-" {
        "standard input".to_string()
    } else {
        path.display().to_string()
    }
}

/// Reads a trace file, detecting the format (and gzip) from the content; `-` reads standard
/// input (messages call it [`source_name`]'s `standard input`).
///
/// The first bytes are looked at before the rest is read (see [`detect::read_sniffed`]), so
/// a file that is not a trace is refused at once whatever its size. The whole trace is then
/// read into memory; a gzip'd one is inflated in memory, up to [`detect::inflate_limit`] of
/// its size.
///
/// # Errors
/// [`TraceError::Io`] when the file cannot be read; otherwise as [`read_bytes`].
pub fn read_path(path: &std::path::Path, options: ReadConfig) -> Result<Trace, TraceError> {
    let name = source_name(path);
    if path.as_os_str() == "-" {
        let sniffed = detect::sniff(&name, std::io::stdin().lock(), None)?;
        return read_detected(&name, sniffed, options);
    }
    let io = |source| TraceError::Io {
        path: name.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().ok();
    if meta.as_ref().is_some_and(std::fs::Metadata::is_dir) {
        return Err(TraceError::NotATrace {
            path: name,
            what: "a folder; expected a trace file (a PyTorch snapshot .pickle or .pickle.gz, \
                   an RMM log .csv or gpumem .jsonl)"
                .to_string(),
        });
    }
    let size = meta.map(|m| m.len());
    let reader = std::io::BufReader::new(file);
    let sniffed = detect::sniff(&name, reader, size)?;
    read_detected(&name, sniffed, options)
}

fn read_detected(
    name: &str,
    sniffed: detect::Sniffed,
    options: ReadConfig,
) -> Result<Trace, TraceError> {
    // A line format cut by the gzip damage ends in part of a line: that part belongs to the
    // cut (one note), not to the events (a second note "line N: not valid JSON", or for CSV a
    // number cut short that still parses).
    let (data, cut_line) = match (&sniffed.gzip_cut, sniffed.format) {
        (Some(_), Format::JsonLines | Format::RmmCsv) => whole_lines(&sniffed.data),
        _ => (&sniffed.data[..], None),
    };
    if let (Some(cut), false) = (&sniffed.gzip_cut, options.lenient) {
        // A strict read stops at the damage; it suggests a lenient one when that would keep
        // something.
        let lenient = ReadConfig {
            lenient: true,
            keep_frames: false,
        };
        let hint = match read_format(name, data, sniffed.format, lenient, true) {
            Ok(t) if !t.events.is_empty() => format!(
                "; a lenient read (--lenient) keeps the {} event{} inflated before it",
                t.events.len(),
                if t.events.len() == 1 { "" } else { "s" }
            ),
            Ok(t) if !t.segments.is_empty() => {
                "; a lenient read (--lenient) keeps the segments inflated before it".to_string()
            }
            _ => String::new(),
        };
        return Err(TraceError::Malformed {
            path: name.to_string(),
            index: 0,
            message: format!("{cut}{hint}"),
        });
    }
    let mut trace = read_format(name, data, sniffed.format, options, sniffed.gunzipped)?;
    if let Some(cut) = sniffed.gzip_cut {
        let left_out = cut_line.map_or(String::new(), |n| {
            format!(" (line {n}, cut short, left out)")
        });
        trace.truncated = Some(match trace.truncated.take() {
            Some(t) => format!("{cut}; {t}"),
            None => format!(
                "{cut}; kept the {} event{} inflated before it{left_out}",
                trace.events.len(),
                if trace.events.len() == 1 { "" } else { "s" }
            ),
        });
    }
    Ok(trace)
}

/// `data` up to and including its last line break, and the (1-based) number of the line
/// after it when that line holds more than white space: the part of a line format that a
/// cut left whole.
fn whole_lines(data: &[u8]) -> (&[u8], Option<u64>) {
    let end = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let tail = &data[end..];
    if tail.iter().all(u8::is_ascii_whitespace) {
        return (data, None);
    }
    let line = data[..end].iter().filter(|&&b| b == b'\n').count() as u64 + 1;
    (&data[..end], Some(line))
}

fn read_format(
    name: &str,
    data: &[u8],
    format: Format,
    options: ReadConfig,
    gunzipped: bool,
) -> Result<Trace, TraceError> {
    match format {
        Format::TorchSnapshot => pickle::read_snapshot_from(name, data, options, gunzipped),
        Format::RmmCsv => rmm::read_rmm(name, data, options),
        Format::JsonLines => jsonl::read_jsonl(name, data, options),
    }
}

/// Reads a trace held in memory; `name` is the file name that errors carry.
///
/// # Errors
/// - [`TraceError::NotATrace`]: empty, a Git LFS pointer, HTML, unrelated JSON or binary data;
/// - [`TraceError::Malformed`]: truncated or corrupt data, wrong types, a free of an unknown
///   address (RMM, JSON lines), an alloc at an address already live; the message says whether
///   the index is an event index or a line number. A strict read of a truncated pickle (plain
///   or gzip'd) ends its message with what a lenient read would keep, when it would keep
///   something;
/// - [`TraceError::Refused`]: a pickle that asks for a class, a global or a persistent id.
pub fn read_bytes(name: &str, bytes: &[u8], options: ReadConfig) -> Result<Trace, TraceError> {
    if detect::is_gzip(bytes) {
        let sniffed = detect::sniff(name, bytes, Some(bytes.len() as u64))?;
        return read_detected(name, sniffed, options);
    }
    match detect::detect(bytes) {
        Ok(format) => read_format(name, bytes, format, options, false),
        Err(what) => Err(TraceError::NotATrace {
            path: name.to_string(),
            what,
        }),
    }
}
