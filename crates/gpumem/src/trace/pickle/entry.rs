//! Trace entries, converted while the pickle is read: a dict that is appended to a list and has
//! an `action` string key becomes an [`Event`] on the spot, and its storage (and that of the
//! containers made inside it, such as `frames`) is recycled, so memory stays proportional to the
//! events, not to the pickle's object tree.

use super::vm::{Kind, Value, Vm, MAX_DEPTH};
use crate::trace::{Action, Event};

/// Strings the converter looks for, recognised once when the string is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Known {
    Other,
    KeyAction,
    KeyAddr,
    KeySize,
    KeyStream,
    KeyTimeUs,
    Act(Option<Action>),
}

pub(super) fn classify(s: &[u8]) -> Known {
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

impl Vm<'_> {
    /// Converts each trace-entry dict among `items` (a dict with an `action` string key) into a
    /// [`Value::Entry`] (or [`Value::SkipEntry`], [`Value::BadEntry`]) in place and releases its
    /// container.
    pub(super) fn convert_entries(&mut self, items: &mut [Value]) {
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
}
