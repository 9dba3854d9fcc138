//! Python stacks recorded with a snapshot's trace entries (`frames`), kept when
//! [`ReadConfig::keep_frames`](super::ReadConfig::keep_frames) asks for them.
//!
//! A snapshot repeats the same file names, function names, frames and whole stacks thousands of
//! times, so the table stores each once: strings are interned, a frame is three numbers, a
//! stack is a run of frame ids, and identical stacks share one [`StackId`]. The trace keeps one
//! [`StackId`] per event in [`Trace::event_stacks`](super::Trace::event_stacks).
//!
//! ```
//! use gpumem::trace::{read_bytes, ReadConfig, StackId};
//! let log = b"{\"action\":\"alloc\",\"addr\":1,\"size\":4096}\n";
//! let trace = read_bytes("example.jsonl", log, ReadConfig::default())?;
//! // JSON lines carry no stacks: every event has the empty stack (or none at all).
//! assert!(trace.stack_of(0).is_none_or(|s| s == StackId::EMPTY));
//! assert_eq!(trace.stacks.frames(StackId::EMPTY).count(), 0);
//! # Ok::<(), gpumem::trace::TraceError>(())
//! ```
use rustc_hash::FxHashMap;
use serde::Serialize;

/// Index of a stack in a [`StackTable`]. Identical stacks (same frames, same order) have the
/// same id; [`StackId::EMPTY`] is the stack of an event recorded without frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct StackId(pub u32);

impl StackId {
    /// The stack with no frames (entries recorded without context, or other formats).
    pub const EMPTY: StackId = StackId(0);
}

/// One frame as stored: interned file and function names and a line number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Frame {
    /// Index of the file name in [`StackTable::strings`].
    pub filename: u32,
    /// Line number as recorded (0 when the frame had none).
    pub line: i64,
    /// Index of the function name in [`StackTable::strings`].
    pub name: u32,
}

/// One frame with its names resolved, as [`StackTable::frames`] yields it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRef<'a> {
    /// Source file (`filename` of the recorded frame; empty when it had none).
    pub filename: &'a str,
    /// Line number (0 when the frame had none).
    pub line: i64,
    /// Function name (`name` of the recorded frame; empty when it had none).
    pub name: &'a str,
}

impl std::fmt::Display for FrameRef<'_> {
    /// `file:line function`, as a traceback shows it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} {}", self.filename, self.line, self.name)
    }
}

/// Interned Python stacks of a trace. Stack 0 is always the empty stack.
#[derive(Debug, Clone, Serialize)]
pub struct StackTable {
    /// Interned file and function names.
    pub strings: Vec<String>,
    /// Distinct frames.
    pub frame_table: Vec<Frame>,
    /// Stack `s` is `frame_ids[starts[s]..starts[s + 1]]`.
    starts: Vec<u32>,
    /// Frame ids of every stack, one after the other.
    frame_ids: Vec<u32>,
    #[serde(skip)]
    string_index: FxHashMap<String, u32>,
    #[serde(skip)]
    frame_index: FxHashMap<Frame, u32>,
    #[serde(skip)]
    stack_index: FxHashMap<Box<[u32]>, StackId>,
}

impl Default for StackTable {
    fn default() -> Self {
        StackTable {
            strings: Vec::new(),
            frame_table: Vec::new(),
            starts: vec![0, 0],
            frame_ids: Vec::new(),
            string_index: FxHashMap::default(),
            frame_index: FxHashMap::default(),
            stack_index: FxHashMap::default(),
        }
    }
}

impl StackTable {
    /// Number of distinct stacks, the empty one included (so at least 1).
    pub fn len(&self) -> usize {
        self.starts.len().saturating_sub(1).max(1)
    }

    /// Whether the table holds no stack but the empty one.
    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }

    /// The frames of stack `id`, innermost first (the order of the snapshot's `frames` list:
    /// the frame that called the allocator comes first). An id this table did not make yields
    /// nothing.
    pub fn frames(&self, id: StackId) -> impl ExactSizeIterator<Item = FrameRef<'_>> + '_ {
        let s = id.0 as usize;
        let range = match (self.starts.get(s), self.starts.get(s + 1)) {
            (Some(&a), Some(&b)) => a as usize..b as usize,
            _ => 0..0,
        };
        self.frame_ids[range].iter().map(move |&f| {
            let fr = self.frame_table[f as usize];
            FrameRef {
                filename: &self.strings[fr.filename as usize],
                line: fr.line,
                name: &self.strings[fr.name as usize],
            }
        })
    }

    /// Interns a string; returns its index in [`StackTable::strings`].
    pub(crate) fn intern_str(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.string_index.get(s) {
            return i;
        }
        let i = self.strings.len() as u32;
        self.strings.push(s.to_string());
        self.string_index.insert(s.to_string(), i);
        i
    }

    /// Interns a frame; returns its frame id.
    pub(crate) fn intern_frame(&mut self, f: Frame) -> u32 {
        if let Some(&i) = self.frame_index.get(&f) {
            return i;
        }
        let i = self.frame_table.len() as u32;
        self.frame_table.push(f);
        self.frame_index.insert(f, i);
        i
    }

    /// Interns a stack of frame ids (innermost first); the empty slice is [`StackId::EMPTY`].
    pub(crate) fn intern_stack(&mut self, frames: &[u32]) -> StackId {
        if frames.is_empty() {
            return StackId::EMPTY;
        }
        if let Some(&id) = self.stack_index.get(frames) {
            return id;
        }
        let id = StackId((self.starts.len() - 1) as u32);
        self.frame_ids.extend_from_slice(frames);
        self.starts.push(self.frame_ids.len() as u32);
        self.stack_index.insert(frames.into(), id);
        id
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn identical_stacks_share_an_id_and_names_are_interned_once() {
        let mut t = StackTable::default();
        let file = t.intern_str("train.py");
        let step = t.intern_str("step");
        let main = t.intern_str("main");
        let f1 = t.intern_frame(Frame {
            filename: file,
            line: 10,
            name: step,
        });
        let again = t.intern_str("train.py");
        let f2 = t.intern_frame(Frame {
            filename: again,
            line: 3,
            name: main,
        });
        assert_eq!(t.intern_str("train.py"), file);
        assert_eq!(t.strings.len(), 3);
        let a = t.intern_stack(&[f1, f2]);
        let b = t.intern_stack(&[f1, f2]);
        let c = t.intern_stack(&[f2]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, StackId::EMPTY);
        assert_eq!(t.intern_stack(&[]), StackId::EMPTY);
        assert_eq!(t.len(), 3);
        let shown: Vec<String> = t.frames(a).map(|f| f.to_string()).collect();
        assert_eq!(shown, ["train.py:10 step", "train.py:3 main"]);
        assert_eq!(t.frames(StackId(99)).count(), 0);
        assert_eq!(t.frames(StackId::EMPTY).count(), 0);
    }
}
