//! STUB: to be replaced by the real implementation.
use crate::arena::{Arena, ArenaReport};
use crate::error::AllocError;

/// STUB arena.
#[derive(Debug, Clone)]
pub struct Tlsf {
    capacity: u64,
}

impl Tlsf {
    /// An arena over `[0, capacity_bytes)`.
    pub fn new(capacity_bytes: u64) -> Self {
        Tlsf {
            capacity: capacity_bytes,
        }
    }
}

impl Arena for Tlsf {
    fn name(&self) -> &'static str {
        "tlsf"
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
