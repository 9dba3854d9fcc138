//! Shared by the cuda_* tests: a tiny allocator that does not depend on the strategies in
//! gpumem-core (so the pool's logic is tested on its own).
#![allow(dead_code)]
use std::collections::{BTreeMap, HashMap};

use gpumem_core::{AllocError, Allocator, Block, Device, Stats, StatsTracker};

/// A tiny allocator for these tests: one device segment per block (rounded to 256 B), freed
/// segments cached by exact size and reused LIFO; `empty_cache` frees the cached ones.
#[derive(Default)]
pub struct SegmentPerBlock {
    live: HashMap<u64, (u64, u64)>,  // addr -> (requested, bytes)
    cached: BTreeMap<u64, Vec<u64>>, // bytes -> addrs
    st: StatsTracker,
}

impl Allocator for SegmentPerBlock {
    fn name(&self) -> &'static str {
        "segment-per-block"
    }
    fn allocate(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        align: u64,
        _stream: u64,
    ) -> Result<Block, AllocError> {
        if !align.is_power_of_two() || align > 256 {
            return Err(AllocError::InvalidAlignment { align, max: 256 });
        }
        let bytes = size.max(1).div_ceil(256) * 256;
        let addr = match self.cached.get_mut(&bytes).and_then(Vec::pop) {
            Some(a) => a,
            None => match dev.alloc_segment(bytes) {
                Ok(a) => {
                    self.st.on_reserve(bytes);
                    a
                }
                Err(e) => {
                    let is_oom = matches!(e, gpumem_core::DeviceError::OutOfMemory { .. });
                    if !is_oom {
                        return Err(e.into());
                    }
                    self.empty_cache(dev)?;
                    self.st.stats.alloc_retries += 1;
                    match dev.alloc_segment(bytes) {
                        Ok(a) => {
                            self.st.on_reserve(bytes);
                            a
                        }
                        Err(_) => {
                            let s = self.stats();
                            return Err(AllocError::OutOfMemory {
                                requested_bytes: size,
                                free_bytes: s.free_bytes,
                                largest_free_bytes: s.largest_free_bytes,
                            });
                        }
                    }
                }
            },
        };
        self.live.insert(addr, (size, bytes));
        self.st.on_alloc(size, bytes);
        Ok(Block {
            addr,
            requested_bytes: size,
            allocated_bytes: bytes,
        })
    }
    fn deallocate(&mut self, _dev: &mut dyn Device, addr: u64) -> Result<(), AllocError> {
        let (req, bytes) = self
            .live
            .remove(&addr)
            .ok_or(AllocError::UnknownBlock { addr })?;
        self.cached.entry(bytes).or_default().push(addr);
        self.st.on_free(req, bytes);
        Ok(())
    }
    fn empty_cache(&mut self, dev: &mut dyn Device) -> Result<u64, AllocError> {
        let mut n = 0;
        for (bytes, addrs) in std::mem::take(&mut self.cached) {
            for a in addrs {
                dev.free_segment(a)?;
                self.st.on_release(bytes);
                n += bytes;
            }
        }
        Ok(n)
    }
    fn stats(&self) -> Stats {
        let mut s = self.st.stats;
        s.free_bytes = self.cached.iter().map(|(b, v)| b * v.len() as u64).sum();
        s.largest_free_bytes = self
            .cached
            .iter()
            .rev()
            .find(|(_, v)| !v.is_empty())
            .map_or(0, |(b, _)| *b);
        s
    }
    fn validate(&self) -> Result<(), AllocError> {
        Ok(())
    }
}
