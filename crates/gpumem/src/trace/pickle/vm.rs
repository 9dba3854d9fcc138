//! The pickle VM: a small, non-executing interpreter of CPython's pickle opcodes.
//!
//! It follows the opcode table of CPython's `Lib/pickletools.py` and implements only the
//! opcodes that build plain data: dicts, lists, tuples, sets, str, bytes, int, float, bool and
//! None, for protocols 0 to 5 (the binary ones in full, the text ones for ints, floats, strings
//! and the memo). It **never executes anything from the file**: an opcode that asks for a class,
//! a global, an extension or a persistent id (`GLOBAL`, `STACK_GLOBAL`, `INST`, `OBJ`, `REDUCE`,
//! `NEWOBJ`, `NEWOBJ_EX`, `BUILD`, `EXT1/2/4`, `PERSID`, `BINPERSID`, `NEXT_BUFFER`,
//! `READONLY_BUFFER`) is refused, naming it and its byte offset.
//!
//! Speed: values are 16-byte `Copy` enums; strings live in one byte buffer and containers in one
//! arena, so the memo (`BINGET` of `'alloc'`, `'addr'`, ...) is a copy of an index. Lists hand
//! the items they receive to the trace-entry converter (`entry.rs`) before storing them.
//!
//! Sharing: Python's pickler memoizes every container, so any object can come back through
//! `BINGET`/`LONG_BINGET` anywhere later in the file. The converter recycles the storage of the
//! entries it converted; a later reference to a recycled container is told apart by its serial
//! number (a slot's serial changes when it is reused) and resolved through what the converter
//! kept of it (the event it became, the stack it held), never read as another container.

use super::known::{classify, Known};
use crate::trace::{Event, StackId, StackTable};
use rustc_hash::FxHashMap;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Value {
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
pub(super) enum Kind {
    List,
    Tuple,
    Set,
    Dict,
}

#[derive(Debug)]
pub(super) struct Container {
    pub(super) kind: Kind,
    /// Items; a dict holds key, value, key, value, ...
    pub(super) items: Vec<Value>,
    /// Serial number of the container in this slot (0: the slot is free).
    pub(super) serial: u32,
    /// Items already scanned for an `action` key (none was found).
    pub(super) scanned: usize,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct StrRef {
    pub(super) start: u32,
    pub(super) len: u32,
    pub(super) known: Known,
}

/// Why the VM stopped.
#[derive(Debug)]
pub(super) enum VmError {
    Truncated { offset: usize, what: String },
    Refused { offset: usize, opcode: &'static str },
    Malformed { offset: usize, what: String },
}

/// Opcodes refused because they would look up or call code.
pub(super) fn refused_name(op: u8) -> Option<&'static str> {
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
pub(super) const MAX_MEMO_GAP: usize = 1 << 20;
/// Nesting depth beyond which the converter stops following containers.
pub(super) const MAX_DEPTH: usize = 64;

pub(super) struct Vm<'a> {
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
    pub(super) stack: Vec<Value>,
    pub(super) marks: Vec<usize>,
    pub(super) memo: Vec<Value>,
    pub(super) text: Vec<u8>,
    pub(super) strs: Vec<StrRef>,
    pub(super) containers: Vec<Container>,
    /// Released container slots.
    pub(super) free_slots: Vec<u32>,
    /// Serial number of the last container made.
    pub(super) serial: u32,
    pub(super) pool: Vec<Vec<Value>>,
    /// Converted trace entries, in the order they were converted.
    pub(super) events: Vec<Event>,
    /// What was wrong with each malformed trace entry.
    pub(super) bad: Vec<String>,
    /// Trace entries converted so far (events, skipped and malformed).
    pub(super) converted: u64,
    /// Work list of [`Vm::recycle`], kept to avoid an allocation per entry.
    pub(super) todo: Vec<(u32, u32, usize)>,
    /// Items being appended by [`Vm::appends`], kept to avoid an allocation per batch.
    pub(super) scratch: Vec<Value>,
    /// Keep the Python stacks of the entries ([`crate::trace::ReadConfig::keep_frames`]).
    pub(super) keep_frames: bool,
    /// Interned stacks (when `keep_frames`).
    pub(super) stacks: StackTable,
    /// Stack of each converted event (when `keep_frames`), parallel to `events`.
    pub(super) event_stacks: Vec<StackId>,
    /// Stack interned for a `frames` list, by container serial (it outlives the container).
    pub(super) stack_memo: FxHashMap<u32, StackId>,
    /// Frame interned for a frame dict, by container serial.
    pub(super) frame_memo: FxHashMap<u32, u32>,
    /// Frame ids of the stack being interned, kept to avoid an allocation per entry.
    pub(super) frame_scratch: Vec<u32>,
    /// What each converted entry dict became, by container serial (ascending when
    /// `tombstones_sorted`), for references to it that come back through the memo.
    pub(super) tombstones: Vec<(u32, Value)>,
    pub(super) tombstones_sorted: bool,
    /// One bit per container serial: set for the entry dicts in `tombstones`.
    pub(super) entry_serials: Vec<u64>,
    /// `device_free` of each `oom` event: (index in `events`, bytes).
    pub(super) oom_free: Vec<(u32, Option<u64>)>,
}

pub(super) type VmResult<T> = Result<T, VmError>;

impl<'a> Vm<'a> {
    pub(super) fn new(data: &'a [u8]) -> Self {
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
            keep_frames: false,
            stacks: StackTable::default(),
            event_stacks: Vec::new(),
            stack_memo: FxHashMap::default(),
            frame_memo: FxHashMap::default(),
            frame_scratch: Vec::new(),
            tombstones: Vec::new(),
            tombstones_sorted: true,
            entry_serials: Vec::new(),
            oom_free: Vec::new(),
        }
    }

    #[inline]
    pub(super) fn take(&mut self, n: usize, what: &str) -> VmResult<&'a [u8]> {
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
    pub(super) fn u8(&mut self, what: &str) -> VmResult<u8> {
        Ok(self.take(1, what)?[0])
    }

    #[inline]
    pub(super) fn u16(&mut self, what: &str) -> VmResult<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    #[inline]
    pub(super) fn u32(&mut self, what: &str) -> VmResult<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    #[inline]
    pub(super) fn u64(&mut self, what: &str) -> VmResult<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub(super) fn line(&mut self, what: &str) -> VmResult<&'a [u8]> {
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

    pub(super) fn malformed<T>(&self, offset: usize, what: impl Into<String>) -> VmResult<T> {
        Err(VmError::Malformed {
            offset,
            what: what.into(),
        })
    }

    #[inline]
    pub(super) fn pop(&mut self, offset: usize, op: &str) -> VmResult<Value> {
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
    pub(super) fn pop_mark(&mut self, offset: usize, op: &str) -> VmResult<usize> {
        match self.marks.pop() {
            Some(m) => Ok(m),
            None => self.malformed(offset, format!("{op} without a MARK")),
        }
    }

    pub(super) fn push_str(&mut self, s: &[u8], offset: usize) -> VmResult<()> {
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

    pub(super) fn new_container(&mut self, kind: Kind, offset: usize) -> VmResult<Value> {
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
    pub(super) fn obj(&self, v: Value) -> Option<(u32, &Container)> {
        match v {
            Value::Obj(i, serial) => {
                let c = &self.containers[i as usize];
                (c.serial == serial).then_some((i, c))
            }
            _ => None,
        }
    }

    /// Builds a container from the items above the last mark.
    pub(super) fn build_from_mark(&mut self, kind: Kind, offset: usize, op: &str) -> VmResult<()> {
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

    pub(super) fn tuple_n(&mut self, n: usize, offset: usize, op: &str) -> VmResult<()> {
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
    pub(super) fn target(
        &self,
        at: usize,
        offset: usize,
        op: &str,
        kinds: &[Kind],
    ) -> VmResult<u32> {
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

    pub(super) fn setitems(&mut self, offset: usize) -> VmResult<()> {
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

    pub(super) fn appends(&mut self, mark: usize, offset: usize, op: &str) -> VmResult<()> {
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

    pub(super) fn str_bytes(&self, s: u32) -> &[u8] {
        let r = self.strs[s as usize];
        &self.text[r.start as usize..(r.start + r.len) as usize]
    }

    pub(super) fn describe(&self, v: Value) -> String {
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

    /// A short Python-`repr`-like text of `v` (containers to `depth` levels, at most 64 items).
    pub(super) fn repr(&self, v: Value, depth: usize) -> String {
        match v {
            Value::None => "None".into(),
            Value::Bool(true) => "True".into(),
            Value::Bool(false) => "False".into(),
            Value::Int(i) => i.to_string(),
            Value::UInt(u) => u.to_string(),
            Value::Float(f) => format!("{f:?}"),
            Value::Str(s) => format!("{:?}", String::from_utf8_lossy(self.str_bytes(s))),
            Value::Obj(..) if depth > 0 => match self.obj(v) {
                Some((_, c)) => {
                    let (open, close) = match c.kind {
                        Kind::List => ("[", "]"),
                        Kind::Tuple => ("(", ")"),
                        Kind::Set | Kind::Dict => ("{", "}"),
                    };
                    let parts: Vec<String> = if c.kind == Kind::Dict {
                        c.items
                            .chunks_exact(2)
                            .take(64)
                            .map(|kv| {
                                format!(
                                    "{}: {}",
                                    self.repr(kv[0], depth - 1),
                                    self.repr(kv[1], depth - 1)
                                )
                            })
                            .collect()
                    } else {
                        c.items
                            .iter()
                            .take(64)
                            .map(|&x| self.repr(x, depth - 1))
                            .collect()
                    };
                    format!("{open}{}{close}", parts.join(", "))
                }
                None => self.describe(v),
            },
            other => self.describe(other),
        }
    }

    pub(super) fn long(&self, b: &[u8], offset: usize) -> VmResult<Value> {
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

    pub(super) fn text_int(&self, line: &[u8], offset: usize, op: &str) -> VmResult<Value> {
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

    pub(super) fn memo_put(&mut self, i: usize, offset: usize) -> VmResult<()> {
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
    pub(super) fn memo_get(&mut self, i: usize, offset: usize) -> VmResult<()> {
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
    ///
    /// One `match` over the opcode table, one short arm per opcode in the order of
    /// `pickletools.py`, so that the table reads as one piece against its source; the arms
    /// that do more call a method of their own.
    pub(super) fn run(&mut self) -> VmResult<Value> {
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

    pub(super) fn dict_get(&self, dict: u32, key: &str) -> Option<Value> {
        let c = &self.containers[dict as usize];
        c.items.chunks_exact(2).rev().find_map(|kv| match kv[0] {
            Value::Str(s) if self.str_bytes(s) == key.as_bytes() => Some(kv[1]),
            _ => None,
        })
    }

    pub(super) fn as_dict(&self, v: Value) -> Option<u32> {
        match self.obj(v) {
            Some((i, c)) if c.kind == Kind::Dict => Some(i),
            _ => None,
        }
    }

    pub(super) fn as_seq(&self, v: Value) -> Option<&[Value]> {
        match self.obj(v) {
            Some((_, c)) if c.kind != Kind::Dict => Some(&c.items),
            _ => None,
        }
    }
}

/// Decodes Python's `raw-unicode-escape` (text-protocol `UNICODE` argument).
pub(super) fn raw_unicode_escape(b: &[u8]) -> String {
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
pub(super) fn py_string_literal(line: &[u8]) -> Option<Vec<u8>> {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn long1_decoding() {
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
    pub(super) fn text_helpers() {
        assert_eq!(raw_unicode_escape(b"a\\u00e9b"), "a\u{e9}b");
        assert_eq!(py_string_literal(b"'a\\nb'").unwrap(), b"a\nb");
        assert!(py_string_literal(b"abc").is_none());
    }
}
