//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`), read by a small pickle VM.
//!
//! The VM follows the opcode table of CPython's `Lib/pickletools.py` and implements only the
//! opcodes that build plain data: dicts, lists, tuples, sets, str, bytes, int, float, bool and
//! None, for protocols 0 to 5 (the binary ones in full, the text ones for ints, floats, strings
//! and the memo). It **never executes anything from the file**: an opcode that asks for a class,
//! a global, an extension or a persistent id (`GLOBAL`, `STACK_GLOBAL`, `INST`, `OBJ`, `REDUCE`,
//! `NEWOBJ`, `NEWOBJ_EX`, `BUILD`, `EXT1/2/4`, `PERSID`, `BINPERSID`, `NEXT_BUFFER`,
//! `READONLY_BUFFER`) is refused with [`TraceError::Refused`] naming it and its byte offset.
//!
//! Speed: values are 16-byte `Copy` enums; strings live in one byte buffer and containers in one
//! arena, so the memo (`BINGET` of `'alloc'`, `'addr'`, ...) is a copy of an index. A dict that
//! is appended to a list and has an `action` string key is converted to an [`Event`] on the spot
//! and its storage (and that of the containers created inside it, such as `frames`) is recycled,
//! so memory stays proportional to the events, not to the pickle's object tree.
//!
//! Snapshot layout: a dict with `segments` (the allocator state at dump time), `device_traces`
//! (one list of trace-entry dicts per device), optional `allocator_settings` and
//! `external_annotations` (ignored). Entries: `action`, `addr`, `size`, `stream`, optional
//! `time_us`, other keys ignored. `alloc` → [`Action::Alloc`], `free_completed` (and the older
//! `free`) → [`Action::Free`], `free_requested` is skipped, the segment, `oom` and `snapshot`
//! actions become the informational variants. A free of an address the trace never allocated
//! is a block that existed before recording started: it goes to [`Trace::preexisting`]. Blocks
//! the segments show allocated at dump time at addresses no event touches are pre-existing too,
//! live through the whole recording (`freed_at_event: None`). Several devices: their events are
//! interleaved by `time_us` when every entry has one, else listed device by device. A root that is a list (very old
//! PyTorch dumped only the segments) is read as segments without a trace.
use super::live::{AddrMap, Liveness, UnknownFree};
use super::{
    Action, Event, Format, PreexistingBlock, ReadConfig, SnapshotBlock, SnapshotSegment, Trace,
    TraceError,
};

/// A pickle value. Containers and strings are indices into the VM's arenas.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer above `i64::MAX` that fits a `u64`.
    UInt(u64),
    /// An integer outside the `i64`/`u64` range (value not kept).
    BigInt,
    Float(f64),
    Str(u32),
    /// Bytes or bytearray (contents not kept).
    Bytes,
    /// List, tuple, set or dict: index into `Vm::containers` and the container's serial
    /// number (a slot is reused once its container is released; a stale reference then no
    /// longer matches the slot's serial).
    Obj(u32, u32),
    /// A converted trace entry: index into `Vm::events`.
    Entry(u32),
    /// A `free_requested` trace entry (memory is not back in the pool yet).
    SkipEntry,
    /// A malformed trace entry: index into `Vm::bad`.
    BadEntry(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    List,
    Tuple,
    Set,
    Dict,
}

#[derive(Debug)]
struct Container {
    kind: Kind,
    /// Items; a dict holds key, value, key, value, ...
    items: Vec<Value>,
    /// Serial number of the container in this slot (0: the slot is free).
    serial: u32,
    /// Items already scanned for an `action` key (none was found).
    scanned: usize,
}

#[derive(Debug, Clone, Copy)]
struct StrRef {
    start: u32,
    len: u32,
    known: Known,
}

/// Strings the converter looks for, recognised once when the string is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    Other,
    KeyAction,
    KeyAddr,
    KeySize,
    KeyStream,
    KeyTimeUs,
    Act(Option<Action>),
}

fn classify(s: &[u8]) -> Known {
    match s {
        b"action" => Known::KeyAction,
        b"addr" => Known::KeyAddr,
        b"size" => Known::KeySize,
        b"stream" => Known::KeyStream,
        b"time_us" => Known::KeyTimeUs,
        b"alloc" => Known::Act(Some(Action::Alloc)),
        b"free_completed" | b"free" => Known::Act(Some(Action::Free)),
        b"free_requested" => Known::Act(None),
        b"segment_alloc" => Known::Act(Some(Action::SegmentAlloc)),
        b"segment_free" => Known::Act(Some(Action::SegmentFree)),
        b"segment_map" => Known::Act(Some(Action::SegmentMap)),
        b"segment_unmap" => Known::Act(Some(Action::SegmentUnmap)),
        b"oom" => Known::Act(Some(Action::Oom)),
        b"snapshot" => Known::Act(Some(Action::Snapshot)),
        _ => Known::Other,
    }
}

/// Why the VM stopped.
#[derive(Debug)]
enum VmError {
    Truncated { offset: usize, what: String },
    Refused { offset: usize, opcode: &'static str },
    Malformed { offset: usize, what: String },
}

/// Opcodes refused because they would look up or call code.
fn refused_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'i' => "INST",
        b'o' => "OBJ",
        b'R' => "REDUCE",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        b'b' => "BUILD",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => return None,
    })
}

/// Largest gap allowed between the memo's length and a `PUT` index (a hostile index must not
/// make the VM allocate gigabytes).
const MAX_MEMO_GAP: usize = 1 << 20;
/// Most keys a segment or block dict may have (PyTorch writes about a dozen).
const MAX_RECORD_KEYS: usize = 1024;
/// Nesting depth beyond which the converter stops following containers.
const MAX_DEPTH: usize = 64;

struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Vec<Value>,
    text: Vec<u8>,
    strs: Vec<StrRef>,
    containers: Vec<Container>,
    /// Released container slots.
    free_slots: Vec<u32>,
    /// Serial number of the last container made.
    serial: u32,
    pool: Vec<Vec<Value>>,
    /// Converted trace entries, in the order they were converted.
    events: Vec<Event>,
    /// What was wrong with each malformed trace entry.
    bad: Vec<String>,
    /// Trace entries converted so far (events, skipped and malformed).
    converted: u64,
    /// Work list of [`Vm::recycle`], kept to avoid an allocation per entry.
    todo: Vec<(u32, usize)>,
    /// Items being appended by [`Vm::appends`], kept to avoid an allocation per batch.
    scratch: Vec<Value>,
}

type VmResult<T> = Result<T, VmError>;

impl<'a> Vm<'a> {
    fn new(data: &'a [u8]) -> Self {
        Self {
            data,
            pos: 0,
            stack: Vec::with_capacity(1024),
            marks: Vec::with_capacity(16),
            memo: Vec::with_capacity(data.len() / 16),
            text: Vec::with_capacity(4096),
            strs: Vec::with_capacity(data.len() / 64),
            containers: Vec::with_capacity(4096),
            free_slots: Vec::with_capacity(4096),
            serial: 0,
            pool: Vec::new(),
            events: Vec::with_capacity(data.len() / 64),
            bad: Vec::new(),
            converted: 0,
            todo: Vec::new(),
            scratch: Vec::new(),
        }
    }

    #[inline]
    fn take(&mut self, n: usize, what: &str) -> VmResult<&'a [u8]> {
        let data = self.data;
        let end = self.pos.checked_add(n).filter(|&e| e <= data.len());
        match end {
            Some(end) => {
                let s = &data[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(VmError::Truncated {
                offset: self.pos,
                what: format!(
                    "{what} needs {n} bytes, {} left",
                    data.len().saturating_sub(self.pos)
                ),
            }),
        }
    }

    #[inline]
    fn u8(&mut self, what: &str) -> VmResult<u8> {
        Ok(self.take(1, what)?[0])
    }

    #[inline]
    fn u16(&mut self, what: &str) -> VmResult<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    #[inline]
    fn u32(&mut self, what: &str) -> VmResult<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    #[inline]
    fn u64(&mut self, what: &str) -> VmResult<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn line(&mut self, what: &str) -> VmResult<&'a [u8]> {
        let data = self.data;
        let rest = &data[self.pos.min(data.len())..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                let line = &rest[..n];
                Ok(line.strip_suffix(b"\r").unwrap_or(line))
            }
            None => Err(VmError::Truncated {
                offset: self.pos,
                what: format!("{what} needs a line ending in a newline"),
            }),
        }
    }

    fn malformed<T>(&self, offset: usize, what: impl Into<String>) -> VmResult<T> {
        Err(VmError::Malformed {
            offset,
            what: what.into(),
        })
    }

    #[inline]
    fn pop(&mut self, offset: usize, op: &str) -> VmResult<Value> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.malformed(offset, format!("{op} on an empty stack"));
        }
        self.stack.pop().map_or_else(
            || self.malformed(offset, format!("{op} on an empty stack")),
            Ok,
        )
    }

    #[inline]
    fn pop_mark(&mut self, offset: usize, op: &str) -> VmResult<usize> {
        match self.marks.pop() {
            Some(m) => Ok(m),
            None => self.malformed(offset, format!("{op} without a MARK")),
        }
    }

    fn push_str(&mut self, s: &[u8], offset: usize) -> VmResult<()> {
        let start = self.text.len();
        let (Ok(start32), Ok(len32)) = (u32::try_from(start), u32::try_from(s.len())) else {
            return self.malformed(offset, "more than 4 GiB of strings");
        };
        if self.strs.len() >= u32::MAX as usize {
            return self.malformed(offset, "too many strings");
        }
        self.text.extend_from_slice(s);
        self.strs.push(StrRef {
            start: start32,
            len: len32,
            known: classify(s),
        });
        self.stack.push(Value::Str((self.strs.len() - 1) as u32));
        Ok(())
    }

    fn new_container(&mut self, kind: Kind, offset: usize) -> VmResult<Value> {
        if self.serial == u32::MAX {
            return self.malformed(offset, "more than 4 billion containers");
        }
        self.serial += 1;
        let items = self.pool.pop().unwrap_or_default();
        let c = Container {
            kind,
            items,
            serial: self.serial,
            scanned: 0,
        };
        let idx = match self.free_slots.pop() {
            Some(i) => {
                self.containers[i as usize] = c;
                i
            }
            None => {
                if self.containers.len() >= u32::MAX as usize {
                    return self.malformed(offset, "too many live containers");
                }
                self.containers.push(c);
                (self.containers.len() - 1) as u32
            }
        };
        Ok(Value::Obj(idx, self.serial))
    }

    /// The live container a value refers to (`None` for a released one or a non-container).
    #[inline]
    fn obj(&self, v: Value) -> Option<(u32, &Container)> {
        match v {
            Value::Obj(i, serial) => {
                let c = &self.containers[i as usize];
                (c.serial == serial).then_some((i, c))
            }
            _ => None,
        }
    }

    /// Builds a container from the items above the last mark.
    fn build_from_mark(&mut self, kind: Kind, offset: usize, op: &str) -> VmResult<()> {
        let mark = self.pop_mark(offset, op)?;
        if kind == Kind::Dict && (self.stack.len() - mark) & 1 != 0 {
            return self.malformed(offset, format!("{op} with an odd number of items"));
        }
        let v = self.new_container(kind, offset)?;
        let Value::Obj(idx, _) = v else {
            return self.malformed(offset, "internal: not a container");
        };
        let mut items = std::mem::take(&mut self.containers[idx as usize].items);
        items.extend_from_slice(&self.stack[mark..]);
        self.stack.truncate(mark);
        if kind == Kind::List {
            self.convert_entries(&mut items);
        }
        self.containers[idx as usize].items = items;
        self.stack.push(v);
        Ok(())
    }

    fn tuple_n(&mut self, n: usize, offset: usize, op: &str) -> VmResult<()> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() < floor + n {
            return self.malformed(offset, format!("{op} needs {n} items on the stack"));
        }
        let v = self.new_container(Kind::Tuple, offset)?;
        let at = self.stack.len() - n;
        if let Value::Obj(idx, _) = v {
            let c = &mut self.containers[idx as usize];
            c.items.extend_from_slice(&self.stack[at..]);
        }
        self.stack.truncate(at);
        self.stack.push(v);
        Ok(())
    }

    /// The container at the top of the stack below `at`, checked to be of one of `kinds`.
    fn target(&self, at: usize, offset: usize, op: &str, kinds: &[Kind]) -> VmResult<u32> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if at == 0 || at - 1 < floor {
            return self.malformed(offset, format!("{op} without a target container"));
        }
        let v = self.stack[at - 1];
        match self.obj(v) {
            Some((i, c)) if kinds.contains(&c.kind) => Ok(i),
            _ => self.malformed(
                offset,
                format!("{op} into {}, expected {:?}", self.describe(v), kinds),
            ),
        }
    }

    fn setitems(&mut self, offset: usize) -> VmResult<()> {
        let mark = self.pop_mark(offset, "SETITEMS")?;
        if (self.stack.len() - mark) & 1 != 0 {
            return self.malformed(offset, "SETITEMS with an odd number of items");
        }
        let target = self.target(mark, offset, "SETITEMS", &[Kind::Dict])?;
        let c = &mut self.containers[target as usize];
        c.items.extend_from_slice(&self.stack[mark..]);
        self.stack.truncate(mark);
        Ok(())
    }

    fn appends(&mut self, mark: usize, offset: usize, op: &str) -> VmResult<()> {
        let target = self.target(mark, offset, op, &[Kind::List, Kind::Set])?;
        let mut items = std::mem::take(&mut self.scratch);
        items.clear();
        items.extend_from_slice(&self.stack[mark..]);
        self.stack.truncate(mark);
        self.convert_entries(&mut items);
        self.containers[target as usize]
            .items
            .extend_from_slice(&items);
        self.scratch = items;
        Ok(())
    }

    /// Converts each trace-entry dict among `items` (a dict with an `action` string key) into a
    /// [`Value::Entry`] (or [`Value::SkipEntry`], [`Value::BadEntry`]) in place and releases its
    /// container.
    fn convert_entries(&mut self, items: &mut [Value]) {
        for v in items.iter_mut() {
            let Some((idx, c)) = self.obj(*v) else {
                continue;
            };
            if c.kind != Kind::Dict {
                continue;
            }
            // Only the items added since the last look are scanned, so that appending one big
            // dict many times (through the memo) stays linear.
            let from = c.scanned.min(c.items.len()) & !1;
            let is_entry = c.items[from..].chunks_exact(2).any(|kv| {
                matches!(kv[0], Value::Str(s) if self.strs[s as usize].known == Known::KeyAction)
            });
            if !is_entry {
                let len = c.items.len();
                self.containers[idx as usize].scanned = len;
                continue;
            }
            let entry = self.to_entry(&c.items);
            self.converted += 1;
            *v = match entry {
                Ok(Some(ev)) if self.events.len() < u32::MAX as usize => {
                    self.events.push(ev);
                    Value::Entry((self.events.len() - 1) as u32)
                }
                Ok(Some(_)) => {
                    self.bad.push("more than 4 billion trace entries".into());
                    Value::BadEntry((self.bad.len() - 1) as u32)
                }
                Ok(None) => Value::SkipEntry,
                Err(e) => {
                    self.bad.push(e);
                    Value::BadEntry((self.bad.len() - 1) as u32)
                }
            };
            self.release(idx);
        }
    }

    /// Releases container `idx` (a converted entry) and the containers made after it that it
    /// holds (its `frames`, ...): their slots and storage are reused.
    fn release(&mut self, idx: u32) {
        let root_serial = self.containers[idx as usize].serial;
        let mut todo = std::mem::take(&mut self.todo);
        todo.push((idx, 0usize));
        while let Some((i, depth)) = todo.pop() {
            let c = &mut self.containers[i as usize];
            c.serial = 0;
            let mut items = std::mem::take(&mut c.items);
            if depth < MAX_DEPTH {
                for &v in &items {
                    if let Some((j, child)) = self.obj(v) {
                        if child.serial > root_serial {
                            todo.push((j, depth + 1));
                        }
                    }
                }
            }
            self.free_slots.push(i);
            items.clear();
            if items.capacity() <= 64 {
                self.pool.push(items);
            }
        }
        self.todo = todo;
    }

    fn to_entry(&self, items: &[Value]) -> Result<Option<Event>, String> {
        let mut action = None;
        let (mut addr, mut size, mut stream, mut time_us) = (None, None, None, None);
        for kv in items.chunks_exact(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = kv[1];
            match self.strs[k as usize].known {
                Known::KeyAction => action = Some(v),
                Known::KeyAddr => addr = Some(v),
                Known::KeySize => size = Some(v),
                Known::KeyStream => stream = Some(v),
                Known::KeyTimeUs => time_us = Some(v),
                _ => {}
            }
        }
        let action = match action {
            Some(Value::Str(s)) => match self.strs[s as usize].known {
                Known::Act(Some(a)) => a,
                Known::Act(None) => return Ok(None),
                _ => {
                    return Err(format!(
                        "unknown action {}, expected alloc, free_requested, free_completed, \
                         segment_alloc, segment_free, segment_map, segment_unmap, oom or snapshot",
                        self.describe(Value::Str(s))
                    ))
                }
            },
            Some(v) => {
                return Err(format!(
                    "'action' is {}, expected a string",
                    self.describe(v)
                ))
            }
            None => return Err("no 'action'".into()),
        };
        let needs_addr = !matches!(action, Action::Oom | Action::Snapshot);
        let addr = self.field_u64(addr, "addr", needs_addr)?;
        let size_bytes = self.field_u64(size, "size", needs_addr)?;
        let stream = match stream {
            None | Some(Value::None) => 0,
            Some(Value::Int(i)) => i as u64, // a cudaStream_t stored as a signed int64
            Some(Value::UInt(u)) => u,
            Some(v) => {
                return Err(format!(
                    "'stream' is {}, expected an integer",
                    self.describe(v)
                ))
            }
        };
        let time_us = match time_us {
            None | Some(Value::None) => None,
            Some(Value::Int(i)) => Some(i),
            Some(Value::Float(f)) if f.is_finite() => Some(f as i64),
            Some(v) => {
                return Err(format!(
                    "'time_us' is {}, expected an integer",
                    self.describe(v)
                ))
            }
        };
        Ok(Some(Event {
            action,
            addr,
            size_bytes,
            stream,
            device: 0,
            time_us,
            align: None,
        }))
    }

    fn field_u64(&self, v: Option<Value>, name: &str, required: bool) -> Result<u64, String> {
        match v {
            Some(Value::Int(i)) if i >= 0 => Ok(i as u64),
            Some(Value::UInt(u)) => Ok(u),
            None if !required => Ok(0),
            None => Err(format!("no '{name}', expected a non-negative integer")),
            Some(v) => Err(format!(
                "'{name}' is {}, expected a non-negative integer",
                self.describe(v)
            )),
        }
    }

    fn str_bytes(&self, s: u32) -> &[u8] {
        let r = self.strs[s as usize];
        &self.text[r.start as usize..(r.start + r.len) as usize]
    }

    fn describe(&self, v: Value) -> String {
        match v {
            Value::None => "None".into(),
            Value::Bool(b) => format!("bool {b}"),
            Value::Int(i) => format!("integer {i}"),
            Value::UInt(u) => format!("integer {u}"),
            Value::BigInt => "an integer out of the 64-bit range".into(),
            Value::Float(f) => format!("float {f}"),
            Value::Str(s) => {
                let b = self.str_bytes(s);
                format!(
                    "string {:?}",
                    String::from_utf8_lossy(&b[..b.len().min(60)])
                )
            }
            Value::Bytes => "bytes".into(),
            Value::Obj(..) => match self.obj(v).map(|(_, c)| c.kind) {
                Some(Kind::List) => "a list".into(),
                Some(Kind::Tuple) => "a tuple".into(),
                Some(Kind::Set) => "a set".into(),
                Some(Kind::Dict) => "a dict".into(),
                None => "a container that was part of a trace entry".into(),
            },
            Value::Entry(_) | Value::SkipEntry | Value::BadEntry(_) => "a trace entry".into(),
        }
    }

    fn long(&self, b: &[u8], offset: usize) -> VmResult<Value> {
        if b.is_empty() {
            return Ok(Value::Int(0));
        }
        let negative = b[b.len() - 1] & 0x80 != 0;
        if b.len() <= 8 {
            let mut a = if negative { [0xffu8; 8] } else { [0u8; 8] };
            a[..b.len()].copy_from_slice(b);
            return Ok(Value::Int(i64::from_le_bytes(a)));
        }
        let _ = offset;
        let fill = if negative { 0xff } else { 0 };
        if b[8..].iter().all(|&x| x == fill) {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[..8]);
            let low = u64::from_le_bytes(a);
            if !negative {
                return Ok(match i64::try_from(low) {
                    Ok(i) => Value::Int(i),
                    Err(_) => Value::UInt(low),
                });
            }
            let i = low as i64;
            if i < 0 {
                return Ok(Value::Int(i));
            }
        }
        Ok(Value::BigInt)
    }

    fn text_int(&self, line: &[u8], offset: usize, op: &str) -> VmResult<Value> {
        let s = std::str::from_utf8(line).unwrap_or("");
        let s = s.strip_suffix('L').unwrap_or(s);
        if op == "INT" && s == "00" {
            return Ok(Value::Bool(false));
        }
        if op == "INT" && s == "01" {
            return Ok(Value::Bool(true));
        }
        if let Ok(i) = s.parse::<i64>() {
            return Ok(Value::Int(i));
        }
        if let Ok(u) = s.parse::<u64>() {
            return Ok(Value::UInt(u));
        }
        if !s.is_empty()
            && s.trim_start_matches('-')
                .bytes()
                .all(|b| b.is_ascii_digit())
        {
            return Ok(Value::BigInt);
        }
        self.malformed(offset, format!("{op} argument {s:?} is not an integer"))
    }

    fn memo_put(&mut self, i: usize, offset: usize) -> VmResult<()> {
        let Some(&top) = self.stack.last() else {
            return self.malformed(offset, "PUT on an empty stack");
        };
        if i >= self.memo.len() {
            if i - self.memo.len() > MAX_MEMO_GAP {
                return self.malformed(offset, format!("memo index {i} far beyond the memo"));
            }
            self.memo.resize(i + 1, Value::None);
        }
        self.memo[i] = top;
        Ok(())
    }

    #[inline]
    fn memo_get(&mut self, i: usize, offset: usize) -> VmResult<()> {
        match self.memo.get(i) {
            Some(&v) => {
                self.stack.push(v);
                Ok(())
            }
            None => self.malformed(
                offset,
                format!("GET of memo index {i}, which was never PUT"),
            ),
        }
    }

    /// Runs the pickle to its `STOP`; returns the root value.
    fn run(&mut self) -> VmResult<Value> {
        loop {
            let offset = self.pos;
            let Some(&op) = self.data.get(self.pos) else {
                return Err(VmError::Truncated {
                    offset,
                    what: "the pickle ends without STOP".into(),
                });
            };
            self.pos += 1;
            match op {
                // LONG_BINGET, BINGET: the most frequent opcodes in snapshots.
                b'j' => {
                    let i = self.u32("LONG_BINGET")? as usize;
                    self.memo_get(i, offset)?;
                }
                b'h' => {
                    let i = self.u8("BINGET")? as usize;
                    self.memo_get(i, offset)?;
                }
                0x94 => {
                    // MEMOIZE
                    let Some(&top) = self.stack.last() else {
                        return self.malformed(offset, "MEMOIZE on an empty stack");
                    };
                    self.memo.push(top);
                }
                b'K' => {
                    let v = self.u8("BININT1")?;
                    self.stack.push(Value::Int(i64::from(v)));
                }
                b'M' => {
                    let v = self.u16("BININT2")?;
                    self.stack.push(Value::Int(i64::from(v)));
                }
                b'J' => {
                    let v = self.u32("BININT")? as i32;
                    self.stack.push(Value::Int(i64::from(v)));
                }
                0x8a => {
                    let n = self.u8("LONG1")? as usize;
                    let b = self.take(n, "LONG1")?;
                    let v = self.long(b, offset)?;
                    self.stack.push(v);
                }
                0x8b => {
                    let n = self.u32("LONG4")? as i32;
                    if n < 0 {
                        return self.malformed(offset, "LONG4 with a negative length");
                    }
                    let b = self.take(n as usize, "LONG4")?;
                    let v = self.long(b, offset)?;
                    self.stack.push(v);
                }
                0x8c => {
                    let n = self.u8("SHORT_BINUNICODE")? as usize;
                    let s = self.take(n, "SHORT_BINUNICODE")?;
                    self.push_str(s, offset)?;
                }
                b'X' => {
                    let n = self.u32("BINUNICODE")? as usize;
                    let s = self.take(n, "BINUNICODE")?;
                    self.push_str(s, offset)?;
                }
                0x8d => {
                    let n = self.u64("BINUNICODE8")?;
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    let s = self.take(n, "BINUNICODE8")?;
                    self.push_str(s, offset)?;
                }
                b'}' => {
                    let v = self.new_container(Kind::Dict, offset)?;
                    self.stack.push(v);
                }
                b']' => {
                    let v = self.new_container(Kind::List, offset)?;
                    self.stack.push(v);
                }
                b')' => {
                    let v = self.new_container(Kind::Tuple, offset)?;
                    self.stack.push(v);
                }
                0x8f => {
                    let v = self.new_container(Kind::Set, offset)?;
                    self.stack.push(v);
                }
                b'(' => self.marks.push(self.stack.len()),
                b'u' => self.setitems(offset)?,
                b's' => {
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + 3 {
                        return self.malformed(offset, "SETITEM needs a dict, a key and a value");
                    }
                    let at = self.stack.len() - 2;
                    let target = self.target(at, offset, "SETITEM", &[Kind::Dict])?;
                    let c = &mut self.containers[target as usize];
                    c.items.extend_from_slice(&self.stack[at..]);
                    self.stack.truncate(at);
                }
                b'e' => {
                    let mark = self.pop_mark(offset, "APPENDS")?;
                    self.appends(mark, offset, "APPENDS")?;
                }
                b'a' => {
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + 2 {
                        return self.malformed(offset, "APPEND needs a list and an item");
                    }
                    let at = self.stack.len() - 1;
                    self.appends(at, offset, "APPEND")?;
                }
                0x90 => {
                    let mark = self.pop_mark(offset, "ADDITEMS")?;
                    self.appends(mark, offset, "ADDITEMS")?;
                }
                b'd' => self.build_from_mark(Kind::Dict, offset, "DICT")?,
                b'l' => self.build_from_mark(Kind::List, offset, "LIST")?,
                b't' => self.build_from_mark(Kind::Tuple, offset, "TUPLE")?,
                0x91 => self.build_from_mark(Kind::Set, offset, "FROZENSET")?,
                0x85 => self.tuple_n(1, offset, "TUPLE1")?,
                0x86 => self.tuple_n(2, offset, "TUPLE2")?,
                0x87 => self.tuple_n(3, offset, "TUPLE3")?,
                b'G' => {
                    let b = self.take(8, "BINFLOAT")?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.stack.push(Value::Float(f64::from_be_bytes(a)));
                }
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                b'N' => self.stack.push(Value::None),
                b'q' => {
                    let i = self.u8("BINPUT")? as usize;
                    self.memo_put(i, offset)?;
                }
                b'r' => {
                    let i = self.u32("LONG_BINPUT")? as usize;
                    self.memo_put(i, offset)?;
                }
                b'C' => {
                    let n = self.u8("SHORT_BINBYTES")? as usize;
                    self.take(n, "SHORT_BINBYTES")?;
                    self.stack.push(Value::Bytes);
                }
                b'B' => {
                    let n = self.u32("BINBYTES")? as usize;
                    self.take(n, "BINBYTES")?;
                    self.stack.push(Value::Bytes);
                }
                0x8e | 0x96 => {
                    let name = if op == 0x8e {
                        "BINBYTES8"
                    } else {
                        "BYTEARRAY8"
                    };
                    let n = self.u64(name)?;
                    self.take(usize::try_from(n).unwrap_or(usize::MAX), name)?;
                    self.stack.push(Value::Bytes);
                }
                b'U' => {
                    let n = self.u8("SHORT_BINSTRING")? as usize;
                    let s = self.take(n, "SHORT_BINSTRING")?;
                    self.push_str(s, offset)?;
                }
                b'T' => {
                    let n = self.u32("BINSTRING")? as i32;
                    if n < 0 {
                        return self.malformed(offset, "BINSTRING with a negative length");
                    }
                    let s = self.take(n as usize, "BINSTRING")?;
                    self.push_str(s, offset)?;
                }
                0x80 => {
                    let p = self.u8("PROTO")?;
                    if p > 5 {
                        return self
                            .malformed(offset, format!("pickle protocol {p} (expected 0 to 5)"));
                    }
                }
                0x95 => {
                    self.take(8, "FRAME")?;
                }
                b'.' => {
                    let v = self.pop(offset, "STOP")?;
                    return Ok(v);
                }
                b'0' => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop(offset, "POP")?;
                    }
                }
                b'1' => {
                    let mark = self.pop_mark(offset, "POP_MARK")?;
                    self.stack.truncate(mark);
                }
                b'2' => {
                    let v = self.pop(offset, "DUP")?;
                    self.stack.push(v);
                    self.stack.push(v);
                }
                b'I' | b'L' => {
                    let name = if op == b'I' { "INT" } else { "LONG" };
                    let line = self.line(name)?;
                    let v = self.text_int(line, offset, name)?;
                    self.stack.push(v);
                }
                b'F' => {
                    let line = self.line("FLOAT")?;
                    let s = std::str::from_utf8(line).unwrap_or("");
                    match s.trim().parse::<f64>() {
                        Ok(f) => self.stack.push(Value::Float(f)),
                        Err(_) => {
                            return self
                                .malformed(offset, format!("FLOAT argument {s:?} is not a float"))
                        }
                    }
                }
                b'V' => {
                    let line = self.line("UNICODE")?;
                    let s = raw_unicode_escape(line);
                    self.push_str(s.as_bytes(), offset)?;
                }
                b'S' => {
                    let line = self.line("STRING")?;
                    match py_string_literal(line) {
                        Some(s) => self.push_str(&s, offset)?,
                        None => {
                            return self.malformed(offset, "STRING argument is not a quoted string")
                        }
                    }
                }
                b'p' | b'g' => {
                    let name = if op == b'p' { "PUT" } else { "GET" };
                    let line = self.line(name)?;
                    let i = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse::<usize>().ok());
                    let Some(i) = i else {
                        return self
                            .malformed(offset, format!("{name} argument is not a memo index"));
                    };
                    if op == b'p' {
                        self.memo_put(i, offset)?;
                    } else {
                        self.memo_get(i, offset)?;
                    }
                }
                _ => {
                    if let Some(opcode) = refused_name(op) {
                        return Err(VmError::Refused { offset, opcode });
                    }
                    return self.malformed(offset, format!("unknown pickle opcode {op:#04x}"));
                }
            }
        }
    }

    // ---- access to the finished tree ----

    fn dict_get(&self, dict: u32, key: &str) -> Option<Value> {
        let c = &self.containers[dict as usize];
        c.items.chunks_exact(2).rev().find_map(|kv| match kv[0] {
            Value::Str(s) if self.str_bytes(s) == key.as_bytes() => Some(kv[1]),
            _ => None,
        })
    }

    fn as_dict(&self, v: Value) -> Option<u32> {
        match self.obj(v) {
            Some((i, c)) if c.kind == Kind::Dict => Some(i),
            _ => None,
        }
    }

    fn as_seq(&self, v: Value) -> Option<&[Value]> {
        match self.obj(v) {
            Some((_, c)) if c.kind != Kind::Dict => Some(&c.items),
            _ => None,
        }
    }

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

    fn segment(&self, v: Value) -> Result<SnapshotSegment, String> {
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
        let mut blocks = Vec::new();
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
                blocks.push(SnapshotBlock {
                    address,
                    size_bytes,
                    requested_bytes: if state.starts_with("active") {
                        requested
                    } else {
                        0
                    },
                    state,
                });
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
            blocks,
        })
    }
}

/// Decodes Python's `raw-unicode-escape` (text-protocol `UNICODE` argument).
fn raw_unicode_escape(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() && (b[i + 1] == b'u' || b[i + 1] == b'U') {
            let n = if b[i + 1] == b'u' { 4 } else { 8 };
            if let Some(hex) = b.get(i + 2..i + 2 + n) {
                if let Some(c) = std::str::from_utf8(hex)
                    .ok()
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .and_then(char::from_u32)
                {
                    out.push(c);
                    i += 2 + n;
                    continue;
                }
            }
        }
        out.push(char::from(b[i]));
        i += 1;
    }
    out
}

/// Decodes a Python 2 `repr` of a str (text-protocol `STRING` argument).
fn py_string_literal(line: &[u8]) -> Option<Vec<u8>> {
    let q = *line.first()?;
    if !(q == b'\'' || q == b'"') || line.len() < 2 || line[line.len() - 1] != q {
        return None;
    }
    let body = &line[1..line.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i] == b'\\' && i + 1 < body.len() {
            let c = body[i + 1];
            i += 2;
            match c {
                b'n' => out.push(b'\n'),
                b't' => out.push(b'\t'),
                b'r' => out.push(b'\r'),
                b'x' => {
                    let h = body.get(i..i + 2)?;
                    out.push(u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?);
                    i += 2;
                }
                other => out.push(other),
            }
        } else {
            out.push(body[i]);
            i += 1;
        }
    }
    Some(out)
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
/// pickle (the message gives the byte offset), a bad trace entry (its event index, the device and
/// the position in that device's trace) or an alloc at an address already live (unless
/// `options.lenient`, which skips and counts bad entries).
pub fn read_snapshot(name: &str, data: &[u8], options: ReadConfig) -> Result<Trace, TraceError> {
    let mut vm = Vm::new(data);
    let root = match vm.run() {
        Ok(v) => v,
        Err(VmError::Refused { offset, opcode }) => {
            return Err(TraceError::Refused {
                path: name.to_string(),
                message: format!(
                    "pickle opcode {opcode} at byte offset {offset} asks for a class, global or \
                     external object; a trace reader never imports or executes anything"
                ),
            })
        }
        Err(VmError::Truncated { offset, what }) => {
            return Err(malformed(
                name,
                vm.converted,
                format!(
                    "pickle truncated at byte offset {offset} of {} ({what}), after {} trace \
                     entries",
                    data.len(),
                    vm.converted
                ),
            ))
        }
        Err(VmError::Malformed { offset, what }) => {
            return Err(malformed(
                name,
                vm.converted,
                format!(
                    "corrupt pickle at byte offset {offset}: {what} (after {} trace entries)",
                    vm.converted
                ),
            ))
        }
    };
    let events = std::mem::take(&mut vm.events);
    build_trace(name, &vm, events, root, options)
}

fn build_trace(
    name: &str,
    vm: &Vm<'_>,
    mut events: Vec<Event>,
    root: Value,
    options: ReadConfig,
) -> Result<Trace, TraceError> {
    let mut trace = Trace {
        format: Some(Format::TorchSnapshot),
        ..Trace::default()
    };
    let (segments_v, traces_v) = match vm.as_dict(root) {
        Some(d) => (vm.dict_get(d, "segments"), vm.dict_get(d, "device_traces")),
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
    if let Some(sv) = segments_v {
        let list = vm.as_seq(sv).ok_or_else(|| {
            malformed(
                name,
                0,
                format!("'segments' is {}, expected a list", vm.describe(sv)),
            )
        })?;
        for (i, &s) in list.iter().enumerate() {
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
    }
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
    let mut live = Liveness::new(UnknownFree::Preexisting);
    let size_hint = |d: u32, a: u64| block_sizes.get(&(d, a)).copied().unwrap_or(0);
    // Several devices with timestamps: interleave by time (stable, so ties keep file order).
    let time_of = |v: Value| match v {
        Value::Entry(k) => events.get(k as usize).and_then(|e| e.time_us),
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
        // Gather the events in that order, so that the pass below reads them in index order.
        let mut sorted = Vec::with_capacity(events.len());
        for slot in &mut order {
            if let Value::Entry(k) = slot.2 {
                if let Some(&e) = events.get(k as usize) {
                    sorted.push(e);
                    slot.2 = Value::Entry((sorted.len() - 1) as u32);
                }
            }
        }
        events = sorted;
    }
    let items: Box<dyn Iterator<Item = (u32, u32, Value)>> = if interleave {
        Box::new(order.into_iter())
    } else {
        Box::new(devices.iter().enumerate().flat_map(|(d, l)| {
            l.iter()
                .enumerate()
                .map(move |(i, &v)| (d as u32, i as u32, v))
        }))
    };
    // Events are compacted in place: `w` is where the next kept event goes, `r` the first
    // event not read yet (each converted entry is read once, in index order).
    let (mut w, mut r) = (0usize, 0usize);
    for (d, i, v) in items {
        let global = first[d as usize] + u64::from(i);
        let result = match v {
            Value::SkipEntry => continue,
            Value::Entry(k) if (k as usize) >= r && (k as usize) < events.len() => {
                let k = k as usize;
                r = k + 1;
                let mut ev = events[k];
                ev.device = d;
                let checked = live.check(&mut ev, w as u64, &mut trace.preexisting, size_hint);
                if checked.is_ok() {
                    events[w] = ev;
                    w += 1;
                }
                checked
            }
            Value::Entry(_) => Err("a trace entry listed twice".to_string()),
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
    events.truncate(w);
    trace.events = events;
    // Blocks allocated at dump time at addresses no event touches: live all along.
    // (Only the active blocks are looked up, so this costs a map of those, not of all events.)
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
                    trace.preexisting.push(PreexistingBlock {
                        addr: b.address,
                        size_bytes: if b.requested_bytes > 0 {
                            b.requested_bytes
                        } else {
                            b.size_bytes
                        },
                        device: s.device,
                        freed_at_event: None,
                    });
                }
            }
        }
    }
    Ok(trace)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn read(b: &[u8]) -> Result<Trace, TraceError> {
        read_snapshot("t", b, ReadConfig::default())
    }

    #[test]
    fn long1_decoding() {
        let vm = Vm::new(b"");
        assert_eq!(vm.long(&[], 0).unwrap(), Value::Int(0));
        assert_eq!(vm.long(&[0xff], 0).unwrap(), Value::Int(-1));
        assert_eq!(vm.long(&[0x00, 0x80, 0x00], 0).unwrap(), Value::Int(0x8000));
        assert_eq!(
            vm.long(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00], 0)
                .unwrap(),
            Value::UInt(u64::MAX)
        );
        assert_eq!(
            vm.long(&[1, 0, 0, 0, 0, 0, 0, 0, 1], 0).unwrap(),
            Value::BigInt
        );
    }

    #[test]
    fn text_helpers() {
        assert_eq!(raw_unicode_escape(b"a\\u00e9b"), "a\u{e9}b");
        assert_eq!(py_string_literal(b"'a\\nb'").unwrap(), b"a\nb");
        assert!(py_string_literal(b"abc").is_none());
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
        let t = read_snapshot("t", &p, ReadConfig { lenient: true }).unwrap();
        assert_eq!(t.skipped_count, u64::from(n) + 1);
        assert!(
            start.elapsed().as_secs() < 20,
            "quadratic: {:?}",
            start.elapsed()
        );
    }
}
