//! The physical handles of a [`super::SimDevice`] (cuMemCreate / cuMemRelease), by id.

#[derive(Debug, Clone, Copy)]
pub(super) struct Handle {
    pub(super) bytes: u64,
    pub(super) released: bool,
    /// Under a mapping (cuMemRelease of a mapped handle frees its memory only at the unmap).
    pub(super) mapped: bool,
}

/// Handles below this many slots are never trimmed from the front of [`Handles`].
pub(super) const HANDLE_TRIM_MIN: usize = 64;

/// The physical handles, by id. Ids are issued in sequence from 1 and never reused (what
/// cuMemCreate answers, seen by the callers), so a handle is found by subtracting the id of
/// the first slot kept: an indexing, not a hash. The slots of handles gone are trimmed from
/// the front once they are at least half of the slab, so that it spans the ids from the
/// oldest live handle to the newest (16 bytes a slot), not every cuMemCreate of the run.
#[derive(Debug, Clone)]
pub(super) struct Handles {
    /// Id of `slots[0]`.
    pub(super) first_id: u64,
    /// Slots below this index are all `None` (handles gone).
    pub(super) head: usize,
    pub(super) slots: Vec<Option<Handle>>,
}

impl Handles {
    pub(super) fn new() -> Self {
        Handles {
            first_id: 1,
            head: 0,
            slots: Vec::new(),
        }
    }

    /// Index of handle `id` in the slab, if it was issued and not trimmed.
    #[inline(always)]
    pub(super) fn index(&self, id: u64) -> Option<usize> {
        usize::try_from(id.checked_sub(self.first_id)?).ok()
    }

    /// The live (or released but still mapped) handle `id`.
    #[inline(always)]
    pub(super) fn get(&self, id: u64) -> Option<&Handle> {
        self.slots.get(self.index(id)?)?.as_ref()
    }

    /// The live (or released but still mapped) handle `id`, to write.
    #[inline(always)]
    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut Handle> {
        let i = self.index(id)?;
        self.slots.get_mut(i)?.as_mut()
    }

    /// Records a new handle and returns its id (the next in sequence).
    #[inline(always)]
    pub(super) fn push(&mut self, h: Handle) -> u64 {
        self.slots.push(Some(h));
        self.first_id + self.slots.len() as u64 - 1
    }

    /// Forgets handle `id` (released and unmapped).
    #[inline]
    pub(super) fn remove(&mut self, id: u64) {
        let Some(i) = self.index(id) else {
            return;
        };
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = None;
        }
        if i == self.head {
            self.trim_front();
        }
    }

    /// Moves `head` past the handles gone at the front, and drops them once they are at
    /// least half of the slab.
    #[cold]
    #[inline(never)]
    pub(super) fn trim_front(&mut self) {
        while self.slots.get(self.head).is_some_and(|s| s.is_none()) {
            self.head += 1;
        }
        if self.head >= HANDLE_TRIM_MIN && self.head * 2 >= self.slots.len() {
            self.slots.drain(..self.head);
            self.first_id += self.head as u64;
            self.head = 0;
        }
    }

    /// Marks handle `id` unmapped; a released one is gone then, and its `bytes` leave
    /// `used`.
    #[inline(always)]
    pub(super) fn unmapped(&mut self, id: u64, used: &mut u64) {
        let Some(h) = self.get_mut(id) else {
            return;
        };
        h.mapped = false;
        if h.released {
            *used -= h.bytes;
            self.remove(id);
        }
    }

    /// Handles not released (mapped or not).
    pub(super) fn unreleased(&self) -> usize {
        self.slots.iter().flatten().filter(|h| !h.released).count()
    }
}
