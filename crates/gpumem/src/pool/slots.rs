//! Thread slots: each thread that uses a pool takes a slot index (its magazine and shard)
//! from a free list on first use and gives it back when it exits, so short-lived threads
//! inherit the caches of those before them.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::SHARDS;

/// A thread's slot index; given back to [`FREE_SLOTS`] when the thread exits.
struct SlotId(usize);

impl Drop for SlotId {
    fn drop(&mut self) {
        if let Ok(mut f) = FREE_SLOTS.lock() {
            f.push(self.0);
        }
    }
}

thread_local! {
    static SLOT: SlotId = SlotId(take_slot());
}
/// Slots of exited threads, reused before new ones.
static FREE_SLOTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

pub(super) fn take_slot() -> usize {
    if let Some(i) = FREE_SLOTS.lock().ok().and_then(|mut f| f.pop()) {
        return i;
    }
    NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SHARDS
}

/// The calling thread's slot (0 while its thread-locals are being destroyed).
#[inline]
pub(super) fn my_shard() -> usize {
    SLOT.try_with(|s| s.0).unwrap_or(0)
}
