//! Unit tests of the emulation: PyTorch's rules one by one, each option with figures derived
//! by hand from PyTorch's code, fault injection at every driver call, and a property test
//! that runs `validate()` after every operation. One file per idea; the helpers here.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::sim::SimDevice;
use crate::Block;
use std::collections::BTreeMap;

const MIB: u64 = 1 << 20;

fn new() -> (TorchCachingPool, SimDevice) {
    (
        TorchCachingPool::new(&AllocatorConfig::default()),
        SimDevice::default(),
    )
}

fn alloc(t: &mut TorchCachingPool, d: &mut SimDevice, size: u64) -> Block {
    let b = t.allocate(d, size, 512, 0).expect("allocate");
    t.validate().expect("valid");
    b
}

fn free(t: &mut TorchCachingPool, d: &mut SimDevice, addr: u64) {
    t.deallocate(d, addr).expect("deallocate");
    t.validate().expect("valid");
}

fn with(conf: &str, capacity: u64) -> (TorchCachingPool, SimDevice) {
    (
        TorchCachingPool::with_conf(TorchConfig::parse(conf).unwrap()),
        SimDevice::new(capacity),
    )
}

mod adopted;
mod caching;
mod conf;
mod expandable;
mod properties;
