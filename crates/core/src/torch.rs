//! STUB: to be replaced by the real implementation.
use crate::registry::Config;
use crate::{AllocError, Allocator, Block, Device, Stats};

/// STUB.
#[derive(Debug, Default)]
pub struct TorchCaching {}

impl TorchCaching {
    /// A new, empty allocator.
    pub fn new(_config: &Config) -> Self {
        TorchCaching {}
    }
}

impl Allocator for TorchCaching {
    fn name(&self) -> &'static str {
        "torch"
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
