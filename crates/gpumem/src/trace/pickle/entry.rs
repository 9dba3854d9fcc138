//! Trace entries, converted while the pickle is read: a dict that is appended to a list and has
//! an `action` string key becomes an [`Event`] on the spot, and its storage (and that of the
//! containers made inside it, such as `frames`) is recycled, so memory stays proportional to the
//! events, not to the pickle's object tree.

use super::known::Known;
use super::vm::{Kind, Value, Vm, MAX_DEPTH};
use crate::trace::stacks::Frame;
use crate::trace::{Action, Event, StackId};

/// A converted trace entry: the event and what the snapshot reader keeps beside it.
pub(super) struct Converted {
    pub(super) event: Event,
    /// `device_free` of an `oom` entry.
    pub(super) device_free: Option<u64>,
}

impl Vm<'_> {
    /// Converts each trace-entry dict among `items` (a dict with an `action` string key) into a
    /// [`Value::Entry`] (or [`Value::SkipEntry`], [`Value::BadEntry`]) in place and releases its
    /// container. A reference to an entry dict converted earlier (it came back through the
    /// memo) becomes what that entry became.
    pub(super) fn convert_entries(&mut self, items: &mut [Value]) {
        for v in items.iter_mut() {
            let Some((idx, c)) = self.obj(*v) else {
                if let Value::Obj(_, serial) = *v {
                    if let Some(t) = self.tombstone(serial) {
                        *v = t;
                    }
                }
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
            let serial = c.serial;
            let entry = self.to_entry(&c.items);
            let stack = if self.keep_frames {
                // Every entry's stack is interned, a skipped `free_requested` included: its
                // `frames` list is often the very object its `free_completed` refers to.
                let frames = self.dict_value(idx, Known::KeyFrames);
                frames.map_or(StackId::EMPTY, |f| self.intern_stack_of(f))
            } else {
                StackId::EMPTY
            };
            self.converted += 1;
            *v = match entry {
                Ok(Some(c)) if self.events.len() < u32::MAX as usize => {
                    let k = self.events.len() as u32;
                    self.events.push(c.event);
                    if self.keep_frames {
                        self.event_stacks.push(stack);
                    }
                    if c.event.action == Action::Oom {
                        self.oom_free.push((k, c.device_free));
                    }
                    Value::Entry(k)
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
            self.set_tombstone(serial, *v);
            self.release(idx);
        }
    }

    /// Remembers what the entry dict with this serial number became.
    fn set_tombstone(&mut self, serial: u32, v: Value) {
        let (word, bit) = ((serial / 64) as usize, serial % 64);
        if self.entry_serials.len() <= word {
            self.entry_serials.resize(word + 1, 0);
        }
        self.entry_serials[word] |= 1 << bit;
        // Entries are converted in the order they were made, so serials arrive ascending and
        // the list stays sorted (a LIST/APPENDS of an older entry would break that: then it
        // is sorted again at the next look-up).
        if self.tombstones.last().is_some_and(|&(s, _)| s > serial) {
            self.tombstones_sorted = false;
        }
        self.tombstones.push((serial, v));
    }

    /// What the released entry dict with this serial number became, if it was one.
    pub(super) fn tombstone(&mut self, serial: u32) -> Option<Value> {
        // Most stale references are to frames and stacks, not to entries: one bit says.
        let word = self.entry_serials.get((serial / 64) as usize).copied();
        if word.is_none_or(|w| w & (1 << (serial % 64)) == 0) {
            return None;
        }
        if !self.tombstones_sorted {
            self.tombstones.sort_by_key(|&(s, _)| s);
            self.tombstones_sorted = true;
        }
        self.tombstones
            .binary_search_by_key(&serial, |&(s, _)| s)
            .ok()
            .map(|i| self.tombstones[i].1)
    }

    /// The value of the last key of dict `idx` that is the known string `key`.
    fn dict_value(&self, idx: u32, key: Known) -> Option<Value> {
        let c = &self.containers[idx as usize];
        c.items.chunks_exact(2).rev().find_map(|kv| match kv[0] {
            Value::Str(s) if self.strs[s as usize].known == key => Some(kv[1]),
            _ => None,
        })
    }

    /// Interns the stack held by `frames` (a list of frame dicts, live or released earlier).
    /// Anything that is not a list of frame dicts is the empty stack, a frame dict without a
    /// string `filename`/`name` or an integer `line` gets "" or 0 there (stacks are
    /// informational; they never make an entry bad).
    pub(super) fn intern_stack_of(&mut self, frames: Value) -> StackId {
        let Value::Obj(_, serial) = frames else {
            return StackId::EMPTY;
        };
        let Some((slot, c)) = self.obj(frames) else {
            // Released with an entry converted earlier: its stack was interned then.
            return self
                .stack_memo
                .get(&serial)
                .copied()
                .unwrap_or(StackId::EMPTY);
        };
        if c.kind == Kind::Dict {
            return StackId::EMPTY;
        }
        if let Some(&id) = self.stack_memo.get(&serial) {
            return id;
        }
        let n = c.items.len();
        let mut ids = std::mem::take(&mut self.frame_scratch);
        ids.clear();
        for i in 0..n {
            let f = self.containers[slot as usize].items[i];
            if let Some(id) = self.intern_frame_of(f) {
                ids.push(id);
            }
        }
        let id = self.stacks.intern_stack(&ids);
        self.frame_scratch = ids;
        self.stack_memo.insert(serial, id);
        id
    }

    /// Interns one frame dict (live or released earlier); `None` for anything else.
    fn intern_frame_of(&mut self, f: Value) -> Option<u32> {
        let Value::Obj(_, serial) = f else {
            return None;
        };
        if let Some(&id) = self.frame_memo.get(&serial) {
            return Some(id);
        }
        let (idx, c) = self.obj(f)?;
        if c.kind != Kind::Dict {
            return None;
        }
        let text = |v: Option<Value>| match v {
            Some(Value::Str(s)) => String::from_utf8_lossy(self.str_bytes(s)).into_owned(),
            _ => String::new(),
        };
        let filename = text(self.dict_value(idx, Known::KeyFilename));
        let name = text(self.dict_value(idx, Known::KeyName));
        let line = match self.dict_value(idx, Known::KeyLine) {
            Some(Value::Int(i)) => i,
            _ => 0,
        };
        let frame = Frame {
            filename: self.stacks.intern_str(&filename),
            line,
            name: self.stacks.intern_str(&name),
        };
        let id = self.stacks.intern_frame(frame);
        self.frame_memo.insert(serial, id);
        Some(id)
    }

    /// Releases container `idx` (a converted entry) and the containers made after it that it
    /// holds (its `frames`, ...): their slots and storage are reused. A container held twice
    /// (a frame repeated in one stack, a list shared by two keys) is released once.
    fn release(&mut self, idx: u32) {
        let root_serial = self.containers[idx as usize].serial;
        let mut todo = std::mem::take(&mut self.todo);
        todo.push((idx, root_serial, 0usize));
        while let Some((i, serial, depth)) = todo.pop() {
            let c = &mut self.containers[i as usize];
            if c.serial != serial {
                continue; // already released through another reference
            }
            c.serial = 0;
            let mut items = std::mem::take(&mut c.items);
            if depth < MAX_DEPTH {
                for &v in &items {
                    if let Some((j, child)) = self.obj(v) {
                        if child.serial > root_serial {
                            todo.push((j, child.serial, depth + 1));
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

    fn to_entry(&self, items: &[Value]) -> Result<Option<Converted>, String> {
        let mut action = None;
        let (mut addr, mut size, mut stream, mut time_us) = (None, None, None, None);
        let mut device_free = None;
        for kv in items.chunks_exact(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = kv[1];
            match self.strs[k as usize].known {
                Known::KeyAction => action = Some(v),
                Known::KeyAddr => addr = Some(v),
                Known::KeySize => size = Some(v),
                Known::KeyStream => stream = Some(v),
                Known::KeyTimeUs => time_us = Some(v),
                Known::KeyDeviceFree => device_free = Some(v),
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
        // A recorded out-of-memory is judged by the request that failed: it needs its size.
        let size_bytes = self.field_u64(size, "size", action != Action::Snapshot)?;
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
        let device_free = match device_free {
            None => None,
            v => Some(self.field_u64(v, "device_free", false)?),
        };
        Ok(Some(Converted {
            event: Event {
                stream,
                time_us,
                ..Event::new(action, addr, size_bytes)
            },
            device_free,
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
}
