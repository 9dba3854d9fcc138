//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`), read by a small pickle VM.
//!
//! Three rooms: `vm.rs` is the pickle VM (CPython's opcodes for plain data, **never executing
//! anything from the file**: an opcode that asks for a class, a global, an extension or a
//! persistent id is refused with [`TraceError::Refused`] naming it and its byte offset);
//! `entry.rs` turns each trace-entry dict into an [`Event`] as soon as it is appended to its list,
//! so memory stays proportional to the events, not to the pickle's object tree; this module
//! assembles the [`Trace`] from what the VM built.
//!
//! Snapshot layout: a dict with `segments` (the allocator state at dump time), `device_traces`
//! (one list of trace-entry dicts per device), optional `allocator_settings` (kept in
//! [`Trace::allocator_settings`]) and `external_annotations` (ignored). Entries: `action`,
//! `addr`, `size`, `stream`, optional `time_us`, `frames` (kept under
//! [`ReadConfig::keep_frames`]) and, for `oom`, `device_free` instead of `addr` (kept in
//! [`Trace::ooms`]); other keys are ignored. `alloc` → [`Action::Alloc`], `free_completed` (and
//! the older `free`) → [`Action::Free`], `free_requested` → [`Action::FreeRequested`] when
//! other entries of its device come before its `free_completed`, or none comes (else it is
//! skipped), the segment, `oom` and
//! `snapshot` actions become the informational variants. A free of an address the trace never
//! allocated is a block that existed before recording started: it goes to
//! [`Trace::preexisting`]. Blocks the segments show allocated at dump time at addresses no event
//! touches are pre-existing too, live through the whole recording (`freed_at_event: None`).
//! Several devices: their events are interleaved by `time_us` when every entry has one, else
//! listed device by device. A root that is a list (very old PyTorch dumped only the segments)
//! is read as segments without a trace.
//!
//! Python's pickler shares objects through its memo (the same frame dict in many stacks, one
//! `frames` list for a `free_requested` and its `free_completed`, ...): the reader reads what
//! Python reads, whatever is shared, which a differential test against python3 checks. Under
//! [`ReadConfig::lenient`] a truncated file gives the entries read before the cut
//! ([`Trace::truncated`] says where).

mod entry;
mod known;
mod vm;

use super::live::{AddrMap, AddrStyle, Liveness, UnknownFree};
use super::{Action, Event, Format, ReadConfig, SnapshotBlock, SnapshotSegment, Trace, TraceError};
use super::{AllocatorSettings, RecordedOom, StackId};
use vm::{Kind, Value, Vm, VmError};

/// Most keys a segment or block dict may have (PyTorch writes about a dozen).
const MAX_RECORD_KEYS: usize = 1024;

impl Vm<'_> {
    fn get_u64(&self, dict: u32, key: &str, default: Option<u64>) -> Result<u64, String> {
        match self.dict_get(dict, key) {
            Some(Value::Int(i)) if i >= 0 => Ok(i as u64),
            Some(Value::UInt(u)) => Ok(u),
            None => default.ok_or_else(|| format!("no '{key}', expected a non-negative integer")),
            Some(v) => Err(format!(
                "'{key}' is {}, expected a non-negative integer",
                self.describe(v)
            )),
        }
    }

    fn get_str(&self, dict: u32, key: &str) -> Result<String, String> {
        match self.dict_get(dict, key) {
            Some(Value::Str(s)) => Ok(String::from_utf8_lossy(self.str_bytes(s)).into_owned()),
            None => Ok(String::new()),
            Some(v) => Err(format!(
                "'{key}' is {}, expected a string",
                self.describe(v)
            )),
        }
    }

    /// Refuses dicts far larger than a segment or block dict (a dozen keys), so that a list
    /// repeating one huge dict cannot make the key look-ups quadratic.
    fn small_dict(&self, d: u32, what: &str) -> Result<u32, String> {
        let n = self.containers[d as usize].items.len() / 2;
        if n > MAX_RECORD_KEYS {
            return Err(format!(
                "{what} dict has {n} keys, expected at most {MAX_RECORD_KEYS}"
            ));
        }
        Ok(d)
    }

    /// After a failed read: how many trace entries were read whole. Entries are converted
    /// when their list's `APPENDS` runs (the pickler writes one per 1,000 items); those still
    /// waiting on the stack are converted here, so the count is exact.
    fn entries_read(&mut self) -> u64 {
        let mut stack = std::mem::take(&mut self.stack);
        self.convert_entries(&mut stack);
        self.stack = stack;
        self.converted
    }

    /// After a truncated read: gathers what the stack holds of a snapshot (the device trace
    /// lists and the entries waiting to be appended to the last one, the `segments` list when
    /// it was complete) into a new root dict.
    fn salvage(&mut self) -> Result<Value, VmError> {
        let mut stack = std::mem::take(&mut self.stack);
        self.convert_entries(&mut stack);
        let is_entry =
            |v: &Value| matches!(v, Value::Entry(_) | Value::SkipEntry | Value::BadEntry(_));
        let mut devices: Vec<Vec<Value>> = Vec::new();
        let mut segments = None;
        for (i, &v) in stack.iter().enumerate() {
            if is_entry(&v) {
                if devices.is_empty() {
                    devices.push(Vec::new());
                }
                if let Some(d) = devices.last_mut() {
                    d.push(v);
                }
                continue;
            }
            let Some((_, c)) = self.obj(v) else { continue };
            match c.kind {
                Kind::List => {
                    let holds_entries = c.items.iter().any(is_entry);
                    let next_is_entry = stack.get(i + 1).is_some_and(is_entry);
                    if holds_entries || next_is_entry || !devices.is_empty() {
                        devices.push(c.items.clone());
                    } else if i > 0 {
                        if let Value::Str(k) = stack[i - 1] {
                            if self.str_bytes(k) == b"segments" {
                                segments = Some(v);
                            }
                        }
                    }
                }
                // The entry being built when the file ended: nothing after it is a device list.
                Kind::Dict if !devices.is_empty() => break,
                _ => {}
            }
        }
        if devices.is_empty() && segments.is_none() {
            return Err(VmError::Malformed {
                offset: self.pos,
                what: "nothing to salvage".into(),
            });
        }
        let at = self.pos;
        let mut lists = Vec::with_capacity(devices.len());
        for d in devices {
            let l = self.new_container(Kind::List, at)?;
            if let Value::Obj(i, _) = l {
                self.containers[i as usize].items = d;
            }
            lists.push(l);
        }
        let outer = self.new_container(Kind::List, at)?;
        if let Value::Obj(i, _) = outer {
            self.containers[i as usize].items = lists;
        }
        let root = self.new_container(Kind::Dict, at)?;
        self.push_str(b"device_traces", at)?;
        let mut items = vec![self.stack.pop().unwrap_or(Value::None), outer];
        if let Some(sv) = segments {
            self.push_str(b"segments", at)?;
            items.push(self.stack.pop().unwrap_or(Value::None));
            items.push(sv);
        }
        if let Value::Obj(i, _) = root {
            self.containers[i as usize].items = items;
        }
        Ok(root)
    }

    /// Reads `allocator_settings` (a dict of str keys); `None` when it is not a dict.
    fn allocator_settings(&self, v: Value) -> Option<AllocatorSettings> {
        let d = self.as_dict(v)?;
        let d = self.small_dict(d, "allocator_settings").ok()?;
        let mut out = AllocatorSettings::default();
        for kv in self.containers[d as usize].items.chunks_exact(2) {
            let Value::Str(k) = kv[0] else { continue };
            let key = String::from_utf8_lossy(self.str_bytes(k)).into_owned();
            let v = kv[1];
            match (key.as_str(), v) {
                (k, Value::Str(s)) if k.starts_with("PYTORCH_") && k.ends_with("_ALLOC_CONF") => {
                    out.alloc_conf = String::from_utf8_lossy(self.str_bytes(s)).into_owned();
                }
                ("max_split_size", Value::Int(i)) => {
                    out.max_split_size_bytes = u64::try_from(i).ok();
                }
                ("max_split_size", Value::UInt(u)) => out.max_split_size_bytes = Some(u),
                ("garbage_collection_threshold", Value::Float(f)) => {
                    out.garbage_collection_threshold = Some(f);
                }
                ("garbage_collection_threshold", Value::Int(i)) => {
                    out.garbage_collection_threshold = Some(i as f64);
                }
                ("expandable_segments", Value::Bool(b)) => out.expandable_segments = Some(b),
                ("roundup_power2_divisions", _) => {
                    if let Some(rd) = self.as_dict(v) {
                        for kv in self.containers[rd as usize].items.chunks_exact(2).take(64) {
                            if let (Value::Str(k), Value::Int(n)) = (kv[0], kv[1]) {
                                let k = String::from_utf8_lossy(self.str_bytes(k)).into_owned();
                                out.roundup_power2_divisions.push((k, n.max(0) as u64));
                            }
                        }
                    } else if let Some(list) = self.as_seq(v) {
                        for (i, &n) in list.iter().enumerate().take(64) {
                            if let Value::Int(n) = n {
                                let k = (1u64 << i.min(63)).to_string();
                                out.roundup_power2_divisions.push((k, n.max(0) as u64));
                            }
                        }
                    }
                }
                _ => {}
            }
            out.all.push((key, self.repr(v, 2)));
        }
        Some(out)
    }

    fn segment(&mut self, v: Value) -> Result<SnapshotSegment, String> {
        let d = self
            .as_dict(v)
            .ok_or_else(|| format!("{}, expected a segment dict", self.describe(v)))?;
        let d = self.small_dict(d, "segment")?;
        let address = self.get_u64(d, "address", None)?;
        let device = self.get_u64(d, "device", Some(0))?;
        let device = u32::try_from(device).map_err(|_| format!("'device' {device} too large"))?;
        let is_expandable = match self.dict_get(d, "is_expandable") {
            None | Some(Value::None) => false,
            Some(Value::Bool(b)) => b,
            Some(Value::Int(i)) => i != 0,
            Some(v) => {
                return Err(format!(
                    "'is_expandable' is {}, expected a bool",
                    self.describe(v)
                ))
            }
        };
        let stream = match self.dict_get(d, "stream") {
            Some(Value::Int(i)) => i as u64,
            Some(Value::UInt(u)) => u,
            None | Some(Value::None) => 0,
            Some(v) => {
                return Err(format!(
                    "'stream' is {}, expected an integer",
                    self.describe(v)
                ))
            }
        };
        // `segment_pool_id`: (0, 0) for the default pool, else a CUDA graph's private pool.
        let private_pool = match self.dict_get(d, "segment_pool_id") {
            Some(v) => self.as_seq(v).is_some_and(|ids| {
                ids.iter()
                    .any(|&x| !matches!(x, Value::Int(0) | Value::UInt(0)))
            }),
            None => false,
        };
        let mut blocks = Vec::new();
        let mut block_frames = Vec::new();
        if let Some(bv) = self.dict_get(d, "blocks") {
            let list = self
                .as_seq(bv)
                .ok_or_else(|| format!("'blocks' is {}, expected a list", self.describe(bv)))?;
            let mut at = address;
            for (j, &b) in list.iter().enumerate() {
                let bd = self
                    .as_dict(b)
                    .ok_or_else(|| format!("block {j} is {}, expected a dict", self.describe(b)))?;
                let bd = self.small_dict(bd, &format!("block {j}"))?;
                let block = |e: String| format!("block {j}: {e}");
                let size_bytes = self.get_u64(bd, "size", None).map_err(block)?;
                let state = self.get_str(bd, "state").map_err(block)?;
                let requested = self.get_u64(bd, "requested_size", Some(0)).map_err(block)?;
                let address = self.get_u64(bd, "address", Some(at)).map_err(block)?;
                at = address.saturating_add(size_bytes);
                block_frames.push(self.dict_get(bd, "frames"));
                blocks.push(SnapshotBlock {
                    address,
                    size_bytes,
                    requested_bytes: if state.starts_with("active") {
                        requested
                    } else {
                        0
                    },
                    state,
                    stack: StackId::EMPTY,
                });
            }
        }
        if self.keep_frames {
            for (b, f) in blocks.iter_mut().zip(block_frames) {
                if let Some(f) = f {
                    b.stack = self.intern_stack_of(f);
                }
            }
        }
        Ok(SnapshotSegment {
            device,
            address,
            total_size_bytes: self.get_u64(d, "total_size", None)?,
            allocated_size_bytes: self.get_u64(d, "allocated_size", Some(0))?,
            stream,
            segment_type: self.get_str(d, "segment_type")?,
            is_expandable,
            private_pool,
            blocks,
        })
    }
}

fn malformed(name: &str, index: u64, message: String) -> TraceError {
    TraceError::Malformed {
        path: name.to_string(),
        index,
        message,
    }
}

/// Reads an (inflated) PyTorch memory snapshot pickle.
///
/// # Errors
/// [`TraceError::Refused`] for an opcode that would import or call code; [`TraceError::NotATrace`]
/// for a pickle that is not a snapshot; [`TraceError::Malformed`] for a truncated or corrupt
/// pickle (the message gives the byte offset and how many trace entries were read whole before
/// it), a bad trace entry (its event index, the device and the position in that device's
/// trace) or an alloc at an address already live (unless `options.lenient`, which skips and
/// counts bad entries).
pub fn read_snapshot(name: &str, data: &[u8], options: ReadConfig) -> Result<Trace, TraceError> {
    read_snapshot_from(name, data, options, false)
}

/// [`read_snapshot`] of the bytes gunzip gave when `gunzipped`: byte offsets in messages then
/// say that they count bytes of the decompressed pickle, not of the file.
pub(crate) fn read_snapshot_from(
    name: &str,
    data: &[u8],
    options: ReadConfig,
    gunzipped: bool,
) -> Result<Trace, TraceError> {
    let mut vm = Vm::new(data);
    vm.keep_frames = options.keep_frames;
    let of_pickle = if gunzipped {
        " of the decompressed pickle"
    } else {
        ""
    };
    let root = match vm.run() {
        Ok(v) => v,
        Err(VmError::Refused { offset, opcode }) => {
            return Err(TraceError::Refused {
                path: name.to_string(),
                message: format!(
                    "pickle opcode {opcode} at byte offset {offset}{of_pickle} asks for a class, \
                     global or external object; a trace reader never imports or executes anything"
                ),
            })
        }
        Err(VmError::Truncated { offset, what }) if options.lenient => {
            let cut = format!(
                "the {} is cut at byte offset {offset} of {} ({what})",
                if gunzipped {
                    "decompressed pickle"
                } else {
                    "file"
                },
                data.len()
            );
            let root = vm.salvage().map_err(|_| {
                malformed(
                    name,
                    vm.converted,
                    format!("{cut}, and nothing before the cut could be salvaged"),
                )
            })?;
            let events = std::mem::take(&mut vm.events);
            let mut trace = build_trace(name, &mut vm, events, root, options, true)?;
            if options.keep_frames {
                trace.stacks = std::mem::take(&mut vm.stacks);
            }
            // The segments are the state at the dump, after the cut: a block they show live
            // that no event read touches may have been allocated after the cut, so it is not
            // taken for one live since before recording began.
            trace.preexisting.retain(|p| p.freed_at_event.is_some());
            trace.truncated = Some(format!(
                "{cut}: kept the {} events read before the cut (the rest of the recording is \
                 lost{})",
                trace.events.len(),
                if trace.segments.is_empty() {
                    ", and so are the segments"
                } else {
                    "; the segments, the state at the dump after the cut, are not taken for \
                     the state before recording began"
                }
            ));
            return Ok(trace);
        }
        Err(VmError::Truncated { offset, what }) => {
            let whole = vm.entries_read();
            // What a lenient read would keep, to suggest one only when it keeps something.
            let lenient = ReadConfig {
                lenient: true,
                keep_frames: false,
            };
            let kept = vm.salvage().ok().and_then(|root| {
                let events = std::mem::take(&mut vm.events);
                build_trace(name, &mut vm, events, root, lenient, true).ok()
            });
            let hint = match kept {
                Some(t) if !t.events.is_empty() => format!(
                    "; a lenient read (--lenient) keeps the {} event{} read before the cut",
                    t.events.len(),
                    if t.events.len() == 1 { "" } else { "s" }
                ),
                Some(t) if !t.segments.is_empty() => {
                    "; a lenient read (--lenient) keeps the segments read before the cut".into()
                }
                _ => String::new(),
            };
            return Err(malformed(
                name,
                whole,
                format!(
                    "pickle truncated at byte offset {offset} of {}{of_pickle} ({what}), after \
                     {}{hint}",
                    data.len(),
                    entries(whole)
                ),
            ));
        }
        Err(VmError::Malformed { offset, what }) => {
            let whole = vm.entries_read();
            return Err(malformed(
                name,
                whole,
                format!(
                    "corrupt pickle at byte offset {offset}{of_pickle}: {what} (after {})",
                    entries(whole)
                ),
            ));
        }
    };
    let events = std::mem::take(&mut vm.events);
    let mut trace = build_trace(name, &mut vm, events, root, options, false)?;
    if options.keep_frames {
        trace.stacks = std::mem::take(&mut vm.stacks);
    }
    Ok(trace)
}

/// `N complete trace entries`, in words (entries of `device_traces`, `free_requested` ones
/// included, read whole before the damage).
fn entries(n: u64) -> String {
    format!(
        "{n} complete trace entr{}",
        if n == 1 { "y" } else { "ies" }
    )
}

/// The trace of a snapshot's top-level value `root`, from the trace entries `events` the VM
/// converted while reading: the segments, each device's entries in order (interleaved by time
/// when there are several devices), each checked for liveness, and the blocks live all along.
/// `salvaged`: the entries are those read before a cut (a lenient read of a truncated file).
fn build_trace(
    name: &str,
    vm: &mut Vm<'_>,
    events: Vec<Event>,
    root: Value,
    options: ReadConfig,
    salvaged: bool,
) -> Result<Trace, TraceError> {
    let mut trace = Trace {
        format: Some(Format::TorchSnapshot),
        ..Trace::default()
    };
    let (segments_v, traces_v) = snapshot_parts(name, vm, root, &mut trace)?;
    if let Some(sv) = segments_v {
        read_segments(name, vm, sv, options, &mut trace)?;
    }
    let devices = device_lists(name, vm, traces_v)?;
    // Sizes of the recorded blocks, for pre-existing blocks whose free carries no size.
    let mut block_sizes: AddrMap<u64> = AddrMap::default();
    for s in &trace.segments {
        for b in &s.blocks {
            let size = if b.requested_bytes > 0 {
                b.requested_bytes
            } else {
                b.size_bytes
            };
            block_sizes.insert((s.device, b.address), size);
        }
    }
    // Global entry index of each device's first entry, for messages.
    let mut first = Vec::with_capacity(devices.len());
    let mut total = 0u64;
    for l in &devices {
        first.push(total);
        total += l.len() as u64;
    }
    let mut live = Liveness::new(UnknownFree::Preexisting, AddrStyle::Hex);
    let size_hint = |d: u32, a: u64| block_sizes.get(&(d, a)).copied().unwrap_or(0);
    let entry_at = |v: Value| match v {
        Value::Entry(k) => events.get(k as usize),
        _ => None,
    };
    let kept_requests = kept_requests(&devices, &events, salvaged);
    let items = entry_order(&devices, &events);
    let mut out: Vec<Event> = Vec::with_capacity(events.len());
    let keep_frames = options.keep_frames;
    for (d, i, v) in items {
        let global = first[d as usize] + u64::from(i);
        if entry_at(v).is_some_and(|e| e.action == Action::FreeRequested)
            && !kept_requests.contains(&(d, i))
        {
            continue;
        }
        let result = match v {
            Value::SkipEntry => continue,
            // An entry listed twice (the same dict object twice in a list) is read twice, as
            // Python reads it.
            Value::Entry(k) if (k as usize) < events.len() => {
                let k = k as usize;
                let mut ev = events[k];
                ev.device = d;
                let at = out.len() as u64;
                let checked = live.check(&mut ev, at, &mut trace.preexisting, size_hint);
                if checked.is_ok() {
                    out.push(ev);
                    if keep_frames {
                        trace
                            .event_stacks
                            .push(vm.event_stacks.get(k).copied().unwrap_or(StackId::EMPTY));
                    }
                    if ev.action == Action::Oom {
                        let free = vm
                            .oom_free
                            .binary_search_by_key(&(k as u32), |&(e, _)| e)
                            .ok()
                            .and_then(|j| vm.oom_free[j].1);
                        trace.ooms.push(RecordedOom {
                            event: at,
                            device_free_bytes: free,
                        });
                    }
                }
                checked
            }
            Value::BadEntry(b) => Err(vm
                .bad
                .get(b as usize)
                .cloned()
                .unwrap_or_else(|| "malformed".into())),
            v => Err(format!(
                "{}, expected a trace entry dict with an 'action'",
                vm.describe(v)
            )),
        };
        if let Err(e) = result {
            let at = format!("event {global} (device {d} trace entry {i})");
            if options.lenient {
                trace.skip(format!("{at}: {e}"));
            } else {
                return Err(malformed(name, global, format!("{at}: {e}")));
            }
        }
    }
    drop(events);
    trace.events = out;
    add_blocks_live_all_along(&mut trace, &live);
    Ok(trace)
}

/// The snapshot's `segments` and `device_traces` (a bare list is read as segments), and its
/// `allocator_settings` into `trace`.
fn snapshot_parts(
    name: &str,
    vm: &mut Vm<'_>,
    root: Value,
    trace: &mut Trace,
) -> Result<(Option<Value>, Option<Value>), TraceError> {
    let (segments_v, traces_v) = match vm.as_dict(root) {
        Some(d) => {
            if let Some(v) = vm.dict_get(d, "allocator_settings") {
                trace.allocator_settings = vm.allocator_settings(v);
            }
            (vm.dict_get(d, "segments"), vm.dict_get(d, "device_traces"))
        }
        None if vm.as_seq(root).is_some() => (Some(root), None),
        None => {
            return Err(TraceError::NotATrace {
                path: name.to_string(),
                what: format!(
                    "a pickle of {}, not a PyTorch memory snapshot dict",
                    vm.describe(root)
                ),
            })
        }
    };
    if segments_v.is_none() && traces_v.is_none() {
        return Err(TraceError::NotATrace {
            path: name.to_string(),
            what: "a pickled dict without 'segments' or 'device_traces': not a PyTorch memory \
                   snapshot"
                .into(),
        });
    }
    Ok((segments_v, traces_v))
}

/// Reads the snapshot's `segments` list `sv` into `trace` (a segment that does not read is
/// skipped under `options.lenient`).
fn read_segments(
    name: &str,
    vm: &mut Vm<'_>,
    sv: Value,
    options: ReadConfig,
    trace: &mut Trace,
) -> Result<(), TraceError> {
    // Copied: reading a segment may intern the stacks of its blocks (a mutable VM).
    let list: Vec<Value> = vm
        .as_seq(sv)
        .ok_or_else(|| {
            malformed(
                name,
                0,
                format!("'segments' is {}, expected a list", vm.describe(sv)),
            )
        })?
        .to_vec();
    for (i, s) in list.into_iter().enumerate() {
        match vm.segment(s) {
            Ok(seg) => trace.segments.push(seg),
            Err(e) if options.lenient => trace.skip(format!("segment {i}: {e}")),
            Err(e) => {
                return Err(malformed(
                    name,
                    i as u64,
                    format!("segment {i} (not an event): {e}"),
                ))
            }
        }
    }
    Ok(())
}

/// Each device's list of trace entries in `device_traces` (`traces_v`), if any.
fn device_lists<'v>(
    name: &str,
    vm: &'v Vm<'_>,
    traces_v: Option<Value>,
) -> Result<Vec<&'v [Value]>, TraceError> {
    let mut devices: Vec<&[Value]> = Vec::new();
    if let Some(tv) = traces_v {
        let list = vm.as_seq(tv).ok_or_else(|| {
            malformed(
                name,
                0,
                format!("'device_traces' is {}, expected a list", vm.describe(tv)),
            )
        })?;
        for (d, &l) in list.iter().enumerate() {
            devices.push(vm.as_seq(l).ok_or_else(|| {
                malformed(
                    name,
                    0,
                    format!("device_traces[{d}] is {}, expected a list", vm.describe(l)),
                )
            })?);
        }
    }
    Ok(devices)
}

/// The `free_requested` entries kept, as (device, index in its list): those that other
/// entries of their device come between and their own `free_completed` (the block waited for
/// other streams), or that never complete (unless the file was cut); right before its
/// completion, a request adds nothing to the free.
fn kept_requests(
    devices: &[&[Value]],
    events: &[Event],
    salvaged: bool,
) -> rustc_hash::FxHashSet<(u32, u32)> {
    let entry_at = |v: Value| match v {
        Value::Entry(k) => events.get(k as usize),
        _ => None,
    };
    let mut kept_requests: rustc_hash::FxHashSet<(u32, u32)> = rustc_hash::FxHashSet::default();
    for (d, l) in devices.iter().enumerate() {
        // Nearly every `free_requested` is followed by its own completion: only a list with
        // one that is not needs the walk below (a map insert per free).
        let completes_next = |j: usize, addr: u64| {
            l.get(j + 1)
                .and_then(|&w| entry_at(w))
                .is_some_and(|c| c.action == Action::Free && c.addr == addr)
        };
        let any_waiting = l.iter().enumerate().any(|(j, &v)| {
            entry_at(v)
                .is_some_and(|e| e.action == Action::FreeRequested && !completes_next(j, e.addr))
        });
        if !any_waiting {
            continue;
        }
        // Walking back: the index of the next free of each address.
        let mut next_free: AddrMap<usize> = AddrMap::default();
        for (j, &v) in l.iter().enumerate().rev() {
            match entry_at(v) {
                Some(e) if e.action == Action::Free => {
                    next_free.insert((d as u32, e.addr), j);
                }
                Some(e) if e.action == Action::FreeRequested => {
                    // Never completed in the trace: still waiting at the dump (PyTorch's
                    // `allocated_bytes` has dropped), unless the file was cut there.
                    let delayed = match next_free.get(&(d as u32, e.addr)) {
                        Some(&at) => at > j + 1,
                        None => !salvaged,
                    };
                    if delayed {
                        kept_requests.insert((d as u32, j as u32));
                    }
                }
                _ => {}
            }
        }
    }
    kept_requests
}

/// The entries to read, as (device, index in its list, entry): device by device in file
/// order, or, with several devices whose every entry has a time, interleaved by time (stable,
/// so ties keep file order).
fn entry_order<'a>(
    devices: &'a [&'a [Value]],
    events: &'a [Event],
) -> Box<dyn Iterator<Item = (u32, u32, Value)> + 'a> {
    let time_of = |v: Value| match v {
        Value::Entry(k) => events.get(k as usize).and_then(|e| {
            if e.action == Action::FreeRequested {
                // As a skipped entry was: first, unless it has a time.
                Some(e.time_us.unwrap_or(i64::MIN))
            } else {
                e.time_us
            }
        }),
        Value::SkipEntry => Some(i64::MIN),
        _ => None,
    };
    let interleave = devices.iter().filter(|l| !l.is_empty()).count() > 1
        && devices
            .iter()
            .all(|l| l.iter().all(|&v| time_of(v).is_some()));
    let mut order: Vec<(u32, u32, Value)> = Vec::new();
    if interleave {
        for (d, l) in devices.iter().enumerate() {
            order.extend(l.iter().enumerate().map(|(i, &v)| (d as u32, i as u32, v)));
        }
        order.sort_by_key(|&(_, _, v)| time_of(v).unwrap_or(i64::MIN));
    }
    if interleave {
        Box::new(order.into_iter())
    } else {
        Box::new(devices.iter().enumerate().flat_map(|(d, l)| {
            l.iter()
                .enumerate()
                .map(move |(i, &v)| (d as u32, i as u32, v))
        }))
    }
}

/// Blocks allocated at dump time at addresses no event touches: live all along. (Only the
/// active blocks are looked up, so this costs a map of those, not of all events.)
fn add_blocks_live_all_along(trace: &mut Trace, live: &Liveness) {
    let mut active: AddrMap<bool> = AddrMap::default();
    if !trace.events.is_empty() {
        for s in &trace.segments {
            for b in s.blocks.iter().filter(|b| b.state.starts_with("active")) {
                active.insert((s.device, b.address), false);
            }
        }
    }
    if !active.is_empty() {
        for e in &trace.events {
            if matches!(e.action, Action::Alloc | Action::Free) {
                if let Some(touched) = active.get_mut(&(e.device, e.addr)) {
                    *touched = true;
                }
            }
        }
        for s in &trace.segments {
            for b in &s.blocks {
                let key = (s.device, b.address);
                if active.get(&key) == Some(&false) && !live.is_live(s.device, b.address) {
                    trace.preexisting.push(b.as_preexisting(s.device));
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn read(b: &[u8]) -> Result<Trace, TraceError> {
        read_snapshot("t", b, ReadConfig::default())
    }

    #[test]
    fn refuses_global() {
        // GLOBAL 'os\nsystem\n' at offset 2.
        let e = read(b"\x80\x02cos\nsystem\n.").unwrap_err();
        match e {
            TraceError::Refused { message, .. } => {
                assert!(message.contains("GLOBAL at byte offset 2"), "{message}")
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn hand_made_entry() {
        // {'device_traces': [[{'action': 'alloc', 'addr': 512, 'size': 8}]]}, protocol 2 opcodes.
        let mut p = b"\x80\x02}(X\x0d\x00\x00\x00device_traces]](}(".to_vec();
        p.extend_from_slice(b"X\x06\x00\x00\x00actionX\x05\x00\x00\x00alloc");
        p.extend_from_slice(b"X\x04\x00\x00\x00addrM\x00\x02");
        p.extend_from_slice(b"X\x04\x00\x00\x00sizeK\x08");
        p.extend_from_slice(b"ueau.");
        let t = read(&p).unwrap();
        assert_eq!(t.events.len(), 1);
        assert_eq!(t.events[0].action, Action::Alloc);
        assert_eq!((t.events[0].addr, t.events[0].size_bytes), (512, 8));
        assert_eq!(t.events[0].time_us, None);
    }

    #[test]
    fn one_huge_dict_repeated_stays_linear() {
        // [d, d, d, ...] where d has 20,000 integer keys: appending it 20,000 times through the
        // memo must not rescan it, and the segment reader refuses it instead of scanning it.
        let n = 20_000u32;
        let mut p = b"\x80\x04]}\x94(".to_vec();
        for k in 0..n {
            p.push(b'J');
            p.extend_from_slice(&k.to_le_bytes());
            p.extend_from_slice(b"K\x01");
        }
        p.extend_from_slice(b"ua");
        for _ in 0..n {
            p.extend_from_slice(b"h\x00a");
        }
        p.push(b'.');
        let start = std::time::Instant::now();
        let e = read(&p).unwrap_err();
        assert!(e.to_string().contains("segment dict has 20000 keys"), "{e}");
        let t = read_snapshot(
            "t",
            &p,
            ReadConfig {
                lenient: true,
                ..ReadConfig::default()
            },
        )
        .unwrap();
        assert_eq!(t.skipped_count, u64::from(n) + 1);
        assert!(
            start.elapsed().as_secs() < 20,
            "quadratic: {:?}",
            start.elapsed()
        );
    }
}
