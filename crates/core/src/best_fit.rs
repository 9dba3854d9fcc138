//! STUB: to be replaced by the real implementation.
use crate::arena::{Arena, ArenaReport};
use crate::error::AllocError;

/// STUB arena.
#[derive(Debug, Clone)]
pub struct BestFit {
    capacity: u64,
}

impl BestFit {
    /// An arena over `[0, capacity_bytes)`.
    pub fn new(capacity_bytes: u64) -> Self {
        BestFit {
            capacity: capacity_bytes,
        }
    }
}

impl Arena for BestFit {
    fn name(&self) -> &'static str {
        "best_fit"
    }
    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }
    fn max_align(&self) -> u64 {
        1
    }
    fn allocate(&mut self, _size_bytes: u64, _align: u64) -> Result<(u64, u64), AllocError> {
        Err(AllocError::Internal("not implemented".into()))
    }
    fn deallocate(&mut self, offset: u64) -> Result<u64, AllocError> {
        Err(AllocError::UnknownBlock { addr: offset })
    }
    fn report(&self) -> ArenaReport {
        ArenaReport::default()
    }
    fn validate(&self) -> Result<(), AllocError> {
        Ok(())
    }
}
