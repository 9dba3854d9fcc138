//! The magazine of a thread slot: up to [`super::MAGAZINE_BLOCKS`] addresses per size class,
//! one stream at a time, taken without a lock (one `compare_exchange` on an ownership flag).
//! The fastest cache of [`super::DevicePool`] (see the module notes there).
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::shard::Cached;
use super::{class_of_index, MAGAZINE_BLOCKS, MAGAZINE_CLASSES};

/// Per-slot cache of one stream's blocks (see the module docs): per class index, a stack of
/// addresses whose storage is allocated once, on the class's first push.
pub(super) struct Magazine {
    /// Stream of every block in the magazine.
    pub(super) stream: u64,
    /// Blocks in the magazine.
    pub(super) blocks: u64,
    /// Bytes of those blocks (their size classes).
    pub(super) bytes: u64,
    pub(super) hits: u64,
    pub(super) live_blocks: i64,
    pub(super) live_requested: i64,
    /// Addresses per class index (at most [`MAGAZINE_CLASSES`] entries, each at most
    /// [`MAGAZINE_BLOCKS`] long).
    pub(super) addrs: Vec<Vec<u64>>,
}

impl Magazine {
    pub(super) fn new() -> Self {
        Magazine {
            stream: 0,
            blocks: 0,
            bytes: 0,
            hits: 0,
            live_blocks: 0,
            live_requested: 0,
            addrs: Vec::new(),
        }
    }

    /// Pops a block of class index `idx` and size `class` bytes.
    #[inline]
    pub(super) fn pop(&mut self, idx: usize, class: u64) -> Option<u64> {
        let addr = self.addrs.get_mut(idx)?.pop()?;
        self.blocks -= 1;
        self.bytes -= class;
        Some(addr)
    }

    /// Pushes a block; false if its class is full or not held here.
    #[inline]
    pub(super) fn push(&mut self, idx: usize, addr: u64, class: u64) -> bool {
        if idx >= MAGAZINE_CLASSES {
            return false;
        }
        if self.addrs.len() <= idx {
            self.addrs.resize_with(idx + 1, Vec::new);
        }
        let v = &mut self.addrs[idx];
        if v.len() >= MAGAZINE_BLOCKS {
            return false;
        }
        if v.capacity() == 0 {
            v.reserve_exact(MAGAZINE_BLOCKS);
        }
        v.push(addr);
        self.blocks += 1;
        self.bytes += class;
        true
    }

    /// Empties the magazine into `out` (one entry per block: class index and block).
    pub(super) fn drain_into(&mut self, out: &mut Vec<(usize, Cached)>) {
        if self.blocks == 0 {
            return;
        }
        for (idx, v) in self.addrs.iter_mut().enumerate() {
            let class = class_of_index(idx);
            out.extend(v.drain(..).map(|addr| (idx, Cached { addr, class })));
        }
        self.blocks = 0;
        self.bytes = 0;
    }
}

/// A magazine behind an ownership flag: the thread of the slot takes it with one
/// `compare_exchange` and gives up at once if it is taken; `trim` and `stats` wait for it.
pub(super) struct MagazineSlot {
    pub(super) busy: AtomicBool,
    /// Blocks in `mag`, stored by the holder of `busy` (read without it to skip empty
    /// magazines when stealing).
    pub(super) blocks: AtomicU64,
    pub(super) mag: UnsafeCell<Magazine>,
}

// SAFETY: `mag` is only reached through a `MagazineGuard`, which exists only while `busy`
// was switched from false to true by its creator (acquire) and is switched back on drop
// (release): at most one thread touches the magazine at a time, and each sees the writes of
// the previous one. `Magazine` holds plain integers (it is `Send`).
unsafe impl Sync for MagazineSlot {}

pub(super) struct MagazineGuard<'a>(&'a MagazineSlot);

impl MagazineSlot {
    pub(super) fn new() -> Self {
        MagazineSlot {
            busy: AtomicBool::new(false),
            blocks: AtomicU64::new(0),
            mag: UnsafeCell::new(Magazine::new()),
        }
    }

    /// Takes the magazine if no one holds it.
    #[inline]
    pub(super) fn try_take(&self) -> Option<MagazineGuard<'_>> {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| MagazineGuard(self))
    }

    /// Takes the magazine, yielding while another thread holds it (holders keep it for a
    /// few instructions, or for a move to the shard).
    pub(super) fn take(&self) -> MagazineGuard<'_> {
        loop {
            if let Some(g) = self.try_take() {
                return g;
            }
            std::thread::yield_now();
        }
    }
}

impl std::ops::Deref for MagazineGuard<'_> {
    type Target = Magazine;
    fn deref(&self) -> &Magazine {
        // SAFETY: the guard holds the flag (see `impl Sync for MagazineSlot`).
        unsafe { &*self.0.mag.get() }
    }
}

impl std::ops::DerefMut for MagazineGuard<'_> {
    fn deref_mut(&mut self) -> &mut Magazine {
        // SAFETY: the guard holds the flag, and `&mut self` makes this the only reference.
        unsafe { &mut *self.0.mag.get() }
    }
}

impl Drop for MagazineGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the guard still holds the flag.
        let blocks = unsafe { (*self.0.mag.get()).blocks };
        self.0.blocks.store(blocks, Ordering::Relaxed);
        self.0.busy.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magazine_caps_each_class_and_drains_everything() {
        let mut m = Magazine::new();
        let idx = super::super::class_index(4096);
        for i in 0..MAGAZINE_BLOCKS as u64 {
            assert!(m.push(idx, i * 4096, 4096));
        }
        assert!(!m.push(idx, 1 << 40, 4096), "a full class refuses");
        assert!(
            !m.push(MAGAZINE_CLASSES, 0, 8 << 30),
            "classes past the range refuse"
        );
        assert!(m.push(0, 1 << 41, 256));
        assert_eq!(
            (m.blocks, m.bytes),
            (MAGAZINE_BLOCKS as u64 + 1, 4096 * 64 + 256)
        );
        assert_eq!(m.pop(idx, 4096), Some((MAGAZINE_BLOCKS as u64 - 1) * 4096));
        let mut out = Vec::new();
        m.drain_into(&mut out);
        assert_eq!(out.len(), MAGAZINE_BLOCKS);
        assert!(out.iter().all(|(i, c)| c.class == class_of_index(*i)));
        assert_eq!((m.blocks, m.bytes), (0, 0));
        assert_eq!(m.pop(idx, 4096), None);
    }
}
