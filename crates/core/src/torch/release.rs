//! Giving cached memory back to the device, PyTorch's three ways:
//! - `release_cached_blocks` (`empty_cache`, and the last step before an OOM): cudaFree of
//!   every whole free segment, large pool first, each pool in `(stream, size, address)`
//!   order; the free pages of expandable segments are unmapped;
//! - `release_available_cached_blocks` (only with `max_split_size_mb`, after a failed
//!   cudaMalloc): the smallest oversize block that covers the request, else oversize blocks
//!   from the largest down until they cover it;
//! - `garbage_collect_cached_blocks` (only with `garbage_collection_threshold` and a memory
//!   limit, before a cudaMalloc once reserved memory passes the threshold): whole free
//!   large-pool segments not reused for longer than the average, oldest first pass by pass,
//!   until reserved memory is back under the threshold.
use crate::device::DeviceError;
use crate::{AllocError, Device};

use super::blocks::{key_size, NIL};
use super::{PoolKind, TorchCachingPool};

impl TorchCachingPool {
    /// `release_block`: cudaFree of the whole free segment that block `i` spans.
    fn release_block(&mut self, dev: &mut dyn Device, i: u32) -> Result<u64, DeviceError> {
        let b = *self.slab.get(i);
        if b.is_split() || b.is_expandable() || b.allocated {
            return Ok(0);
        }
        dev.free_segment(b.addr)?;
        self.remove_free(i);
        self.slab.remove(i);
        self.segments.remove(&b.addr);
        self.total_allocated -= b.size;
        self.tracker.on_release(b.size);
        if b.size >= self.conf.max_split_size_bytes {
            self.torch.oversize_segments.sub(1);
        }
        self.torch.num_device_free += 1;
        Ok(b.size)
    }

    /// `release_blocks` of one pool: whole free segments are cudaFree'd in set order, then
    /// the free blocks of expandable segments unmap their whole pages (and a segment left
    /// with nothing mapped is released). Returns the bytes given back.
    fn release_pool(&mut self, dev: &mut dyn Device, pool: PoolKind) -> Result<u64, DeviceError> {
        let mut released = self.release_pool_pass(dev, pool)?;
        if self.coarse_handles {
            // Coarse handles: each unmap_block gives back one handle; go on until a pass
            // gives nothing.
            loop {
                let more = self.release_pool_pass(dev, pool)?;
                if more == 0 {
                    break;
                }
                released += more;
            }
        }
        Ok(released)
    }

    /// One pass of [`TorchCachingPool::release_pool`] over the pool's free blocks.
    fn release_pool_pass(
        &mut self,
        dev: &mut dyn Device,
        pool: PoolKind,
    ) -> Result<u64, DeviceError> {
        let blocks: Vec<u32> = self.free[pool.index()].iter().map(|(_, _, i)| i).collect();
        let mut released = 0u64;
        let mut to_unmap = Vec::new();
        for i in blocks {
            let b = self.slab.get(i);
            if b.is_expandable() {
                to_unmap.push(i);
            } else if !b.is_split() {
                released += self.release_block(dev, i)?;
            }
        }
        for i in to_unmap {
            let (bytes, u) = self.unmap_block(dev, i)?;
            released += bytes;
            let ub = self.slab.get(u);
            if ub.prev == NIL && ub.next == NIL && !ub.mapped {
                self.release_expandable_segment(dev, u)?;
            }
        }
        Ok(released)
    }

    /// `release_cached_blocks`: every pool, large first. Returns the bytes given back.
    pub(super) fn release_cached_blocks(
        &mut self,
        dev: &mut dyn Device,
    ) -> Result<u64, AllocError> {
        // Empty unless a driver call failed: then what it left is given back first.
        let leftovers = if self.unreleased.is_empty() && self.ranges_to_free.is_empty() {
            0
        } else {
            self.release_leftovers(dev)?
        };
        let large = self.release_pool(dev, PoolKind::Large)?;
        let small = self.release_pool(dev, PoolKind::Small)?;
        Ok(leftovers + large + small)
    }

    /// `release_available_cached_blocks`: with `max_split_size`, frees oversize blocks of
    /// `stream` in `pool` that together cover the request; whether they did.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        dev: &mut dyn Device,
        pool: PoolKind,
        stream: u64,
        rounded: u64,
    ) -> Result<bool, AllocError> {
        let max_split = self.conf.max_split_size_bytes;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let p = pool.index();
        let want = rounded.max(max_split);
        match self.free[p].lower_bound(stream, want) {
            Some((_, i)) if !self.slab.get(i).is_expandable() => {
                self.release_block(dev, i)?;
                Ok(true)
            }
            _ => {
                // No single block is large enough: free oversize blocks, largest first.
                let mut picked = Vec::new();
                let mut total = 0u64;
                for (k, i) in self.free[p].below(stream, want) {
                    if total >= want || key_size(k) < max_split {
                        break;
                    }
                    if !self.slab.get(i).is_expandable() {
                        total += key_size(k);
                        picked.push(i);
                    }
                }
                for i in picked {
                    self.release_block(dev, i)?;
                }
                Ok(total >= want)
            }
        }
    }

    /// `garbage_collect_cached_blocks`: when reserved memory is above
    /// `garbage_collection_threshold` × the memory limit, frees whole free large-pool
    /// segments whose age (calls of `get_free_block` on the large pool since they were
    /// cached) is at least the average, pass after pass, until enough is reclaimed.
    pub(super) fn garbage_collect_cached_blocks(
        &mut self,
        dev: &mut dyn Device,
    ) -> Result<(), AllocError> {
        let Some(allowed) = self.allowed(dev) else {
            return Ok(());
        };
        let threshold = (self.conf.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated <= threshold {
            return Ok(());
        }
        let target = self.total_allocated - threshold;
        let p = PoolKind::Large.index();
        let now = self.get_free_calls[p];
        // PyTorch takes the age as an `int` and sums it in a `size_t`.
        let age = |base: u64| now.wrapping_sub(base) as i32 as i64 as u64;
        let mut total_age = 0u64;
        let mut count = 0u64;
        for (_, _, i) in self.free[p].iter() {
            let b = self.slab.get(i);
            if !b.is_split() {
                total_age = total_age.wrapping_add(age(b.gc_base));
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed = false;
            let blocks: Vec<u32> = self.free[p].iter().map(|(_, _, i)| i).collect();
            for i in blocks {
                let b = *self.slab.get(i);
                let a = age(b.gc_base);
                if !b.is_split() && !b.is_expandable() && a as f64 >= threshold_age {
                    freed = true;
                    reclaimed += b.size;
                    total_age = total_age.wrapping_sub(a);
                    count -= 1;
                    self.release_block(dev, i)?;
                }
            }
        }
        Ok(())
    }
}
