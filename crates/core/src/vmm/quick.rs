//! The quick-reuse list: freed blocks kept whole, oldest first, and handed out again to a
//! request of the same rounded size and a compatible alignment (the O(1) hit path of both
//! page-mapped strategies). Its bounds are the policy of the pool that owns it: a number of
//! blocks, and optionally a number of bytes (`paged` bounds the bytes by its page cache,
//! `paged-lazy` does not).

/// A freed block held in a [`QuickList`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuickBlock {
    /// Block address.
    pub(crate) addr: u64,
    /// Allocated bytes (a multiple of [`super::UNIT_BYTES`]).
    pub(crate) bytes: u64,
}

/// Gone entries a [`QuickList`] keeps before it shifts its blocks down.
const GONE_MAX: usize = 32;

/// Freed blocks held for same-size reuse, oldest first: a vector whose first `head` entries
/// are gone, so that dropping the oldest block (every free once the list is full) moves
/// nothing; the gone entries are cut off once they are [`GONE_MAX`].
#[derive(Debug, Clone, Default)]
pub(crate) struct QuickList {
    v: Vec<QuickBlock>,
    head: usize,
    /// Bytes of the blocks held.
    bytes: u64,
    /// Most blocks held (0: the list is off).
    max_blocks: usize,
    /// Most bytes held, if bounded.
    max_bytes: Option<u64>,
}

impl QuickList {
    /// An empty list of at most `max_blocks` blocks and no byte bound.
    pub(crate) fn new(max_blocks: usize) -> Self {
        QuickList {
            max_blocks,
            ..QuickList::default()
        }
    }

    /// Sets the most blocks held (0 turns the list off).
    pub(crate) fn set_max_blocks(&mut self, max_blocks: usize) {
        self.max_blocks = max_blocks;
    }

    /// Sets the byte bound (`None`: only the block count bounds the list).
    #[inline]
    pub(crate) fn set_max_bytes(&mut self, max_bytes: Option<u64>) {
        self.max_bytes = max_bytes;
    }

    /// Bytes of the blocks held.
    #[inline]
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The blocks, oldest first.
    #[inline]
    pub(crate) fn as_slice(&self) -> &[QuickBlock] {
        self.v.get(self.head..).unwrap_or_default()
    }

    /// Blocks held.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.v.len() - self.head
    }

    /// Whether no block is held.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The blocks, oldest first.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, QuickBlock> {
        self.as_slice().iter()
    }

    /// The oldest block.
    #[inline]
    pub(crate) fn front(&self) -> Option<QuickBlock> {
        self.v.get(self.head).copied()
    }

    /// Drops the oldest block.
    #[inline]
    pub(crate) fn pop_front(&mut self) {
        if let Some(q) = self.front() {
            self.bytes = self.bytes.saturating_sub(q.bytes);
            self.head += 1;
            if self.head == self.v.len() {
                self.v.clear();
                self.head = 0;
            } else if self.head >= GONE_MAX {
                self.v.drain(..self.head);
                self.head = 0;
            }
        }
    }

    /// Takes the newest block.
    #[inline]
    pub(crate) fn pop_back(&mut self) -> Option<QuickBlock> {
        if self.is_empty() {
            return None;
        }
        let q = self.v.pop()?;
        self.bytes = self.bytes.saturating_sub(q.bytes);
        if self.head == self.v.len() {
            self.v.clear();
            self.head = 0;
        }
        Some(q)
    }

    /// Adds the newest block.
    #[inline]
    pub(crate) fn push_back(&mut self, q: QuickBlock) {
        self.bytes += q.bytes;
        self.v.push(q);
    }

    /// Takes the newest block of exactly `bytes` whose address is a multiple of `align` (a
    /// power of two).
    #[inline]
    pub(crate) fn take(&mut self, bytes: u64, align: u64) -> Option<QuickBlock> {
        let i = self
            .as_slice()
            .iter()
            .rposition(|q| q.bytes == bytes && q.addr & (align - 1) == 0)?;
        let q = self.v.remove(self.head + i);
        self.bytes = self.bytes.saturating_sub(q.bytes);
        Some(q)
    }

    /// Whether a freed block of `bytes` may be held at all: the list is on and the block
    /// is within the byte bound.
    #[inline]
    pub(crate) fn admits(&self, bytes: u64) -> bool {
        self.max_blocks > 0 && self.max_bytes.is_none_or(|m| bytes <= m)
    }

    /// Whether a block of `bytes` fits beside the blocks held.
    #[inline]
    pub(crate) fn has_room(&self, bytes: u64) -> bool {
        self.len() < self.max_blocks && self.max_bytes.is_none_or(|m| self.bytes + bytes <= m)
    }

    /// The oldest block, when it must go before a block of `bytes` fits.
    #[inline]
    pub(crate) fn must_go_for(&self, bytes: u64) -> Option<QuickBlock> {
        if self.has_room(bytes) {
            None
        } else {
            self.front()
        }
    }

    /// Keeps only the blocks for which `keep` is true, oldest first, in their order (the
    /// list keeps its allocation).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(QuickBlock) -> bool) {
        let mut kept = 0;
        for i in self.head..self.v.len() {
            let q = self.v[i];
            if keep(q) {
                self.v[kept] = q;
                kept += 1;
            } else {
                self.bytes = self.bytes.saturating_sub(q.bytes);
            }
        }
        self.v.truncate(kept);
        self.head = 0;
    }

    /// Checks the bounds and the byte count against the blocks.
    ///
    /// # Errors
    /// A description of the first broken invariant.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let sum: u64 = self.iter().map(|q| q.bytes).sum();
        if self.head > self.v.len()
            || self.len() > self.max_blocks
            || sum != self.bytes
            || self.max_bytes.is_some_and(|m| self.bytes > m)
        {
            return Err(format!(
                "quick list: {} blocks of {sum} B (recorded {} B), bound {} blocks / {:?} B",
                self.len(),
                self.bytes,
                self.max_blocks,
                self.max_bytes
            ));
        }
        Ok(())
    }
}
