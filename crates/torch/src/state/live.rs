//! The plug-in's map of live blocks: what `free` needs to give a block back (its size class
//! and stream), and how a pointer the pool does not own is caught. Sharded by address so
//! that threads freeing different blocks rarely meet on one lock.

use std::sync::Mutex;

use rustc_hash::FxHashMap;

/// Shards of the live-block map (a power of two).
const LIVE_SHARDS: usize = 64;

/// Live block: what `free` needs to give it back.
#[derive(Debug, Clone, Copy)]
pub(super) struct Live {
    pub(super) requested_bytes: u64,
    pub(super) class_bytes: u64,
    pub(super) stream: u64,
}

#[derive(Default)]
pub(super) struct LiveMap {
    shards: Vec<Mutex<FxHashMap<u64, Live>>>,
}

impl LiveMap {
    pub(super) fn new() -> Self {
        LiveMap {
            shards: (0..LIVE_SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
    pub(super) fn shard(&self, addr: u64) -> &Mutex<FxHashMap<u64, Live>> {
        // Blocks are 256-byte aligned at least; mix the rest so neighbours spread.
        let h = (addr >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> (64 - LIVE_SHARDS.trailing_zeros())) as usize]
    }
    /// Inserts; returns false if `addr` was live already.
    pub(super) fn insert(&self, addr: u64, l: Live) -> bool {
        match self.shard(addr).lock() {
            Ok(mut m) => m.insert(addr, l).is_none(),
            Err(_) => false,
        }
    }
    pub(super) fn remove(&self, addr: u64) -> Option<Live> {
        self.shard(addr).lock().ok()?.remove(&addr)
    }
    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map(|m| m.len()).unwrap_or(0))
            .sum()
    }
    pub(super) fn snapshot(&self) -> Vec<(u64, Live)> {
        let mut v = Vec::new();
        for s in &self.shards {
            if let Ok(m) = s.lock() {
                v.extend(m.iter().map(|(a, l)| (*a, *l)));
            }
        }
        v.sort_unstable_by_key(|x| x.0);
        v
    }
}
