//! The cache shard of a thread slot: free blocks per stream and size class, behind a mutex
//! (the second cache of [`super::DevicePool`], after the magazine).
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

#[derive(Debug, Clone, Copy)]
pub(super) struct Cached {
    pub(super) addr: u64,
    pub(super) class: u64,
}

#[derive(Debug, Default)]
pub(super) struct StreamCache {
    pub(super) stream: u64,
    /// Free blocks per size class index.
    pub(super) classes: Vec<Vec<Cached>>,
}

#[derive(Debug, Default)]
pub(super) struct Shard {
    pub(super) streams: Vec<StreamCache>,
    pub(super) bytes: u64,
    pub(super) blocks: u64,
    pub(super) live_blocks: i64,
    pub(super) live_requested: i64,
    pub(super) hits: u64,
    pub(super) misses: u64,
}

impl Shard {
    /// Pops a cached block of `stream` and class index `idx`.
    pub(super) fn pop(&mut self, stream: u64, idx: usize) -> Option<Cached> {
        let c = self
            .streams
            .iter_mut()
            .find(|s| s.stream == stream)
            .and_then(|s| s.classes.get_mut(idx))
            .and_then(Vec::pop)?;
        self.bytes -= c.class;
        self.blocks -= 1;
        Some(c)
    }

    /// Caches `c` (class index `idx`) for `stream`.
    pub(super) fn push(&mut self, stream: u64, idx: usize, c: Cached) {
        let pos = match self.streams.iter().position(|s| s.stream == stream) {
            Some(p) => p,
            None => {
                self.streams.push(StreamCache {
                    stream,
                    classes: Vec::new(),
                });
                self.streams.len() - 1
            }
        };
        let sc = &mut self.streams[pos];
        if sc.classes.len() <= idx {
            sc.classes.resize_with(idx + 1, Vec::new);
        }
        sc.classes[idx].push(c);
        self.bytes += c.class;
        self.blocks += 1;
    }

    pub(super) fn take_all(&mut self) -> Vec<(u64, Vec<Cached>)> {
        let mut out = Vec::new();
        for sc in &mut self.streams {
            let mut v = Vec::new();
            for c in &mut sc.classes {
                v.append(c);
            }
            if !v.is_empty() {
                out.push((sc.stream, v));
            }
        }
        self.bytes = 0;
        self.blocks = 0;
        out
    }
}

#[repr(align(128))]
#[derive(Debug, Default)]
pub(super) struct Padded<T>(pub(super) T);

/// A thread slot's cache shard, with its block count readable without the lock (so that
/// stealing skips empty shards).
#[derive(Debug, Default)]
pub(super) struct ShardSlot {
    pub(super) shard: Mutex<Shard>,
    /// Blocks in `shard` (written under its lock).
    pub(super) blocks: AtomicU64,
}
