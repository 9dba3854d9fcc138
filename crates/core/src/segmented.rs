//! STUB: a pool of device segments, each managed by an [`Arena`].
use crate::arena::Arena;
use crate::registry::Config;
use crate::{AllocError, Allocator, Block, Device, Stats};

/// STUB pool.
pub struct SegmentedPool {
    name: &'static str,
    _arenas: Vec<Box<dyn Arena>>,
}

impl SegmentedPool {
    /// Buddy segments.
    pub fn buddy(_c: &Config) -> Self {
        SegmentedPool {
            name: "buddy",
            _arenas: Vec::new(),
        }
    }
    /// TLSF segments.
    pub fn tlsf(_c: &Config) -> Self {
        SegmentedPool {
            name: "tlsf",
            _arenas: Vec::new(),
        }
    }
    /// Best-fit segments.
    pub fn best_fit(_c: &Config) -> Self {
        SegmentedPool {
            name: "best-fit",
            _arenas: Vec::new(),
        }
    }
}

impl Allocator for SegmentedPool {
    fn name(&self) -> &'static str {
        self.name
    }
    fn allocate(
        &mut self,
        _d: &mut dyn Device,
        _s: u64,
        _a: u64,
        _st: u64,
    ) -> Result<Block, AllocError> {
        Err(AllocError::Internal("not implemented".into()))
    }
    fn deallocate(&mut self, _d: &mut dyn Device, addr: u64) -> Result<(), AllocError> {
        Err(AllocError::UnknownBlock { addr })
    }
    fn release_cached(&mut self, _d: &mut dyn Device) -> Result<u64, AllocError> {
        Ok(0)
    }
    fn stats(&self) -> Stats {
        Stats::default()
    }
    fn validate(&self) -> Result<(), AllocError> {
        Ok(())
    }
}
