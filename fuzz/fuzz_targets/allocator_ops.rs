//! Fuzz target: random allocate / free / release-cached sequences against every allocator on
//! a small simulated device, with an injected driver fault. After every operation the
//! allocator validates, live blocks never overlap, and each block keeps its byte pattern
//! (tracked in a shadow map, since the simulated device keeps no contents).
//!
//! Run (nightly): `cd fuzz && cargo fuzz run allocator_ops`.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use gpumem_core::{config::AllocatorConfig, registry::{self, NAMES}};
use gpumem_core::sim::SimDevice;
use gpumem_core::Device;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Op {
    Alloc { size: u32, align_shift: u8, stream: u8 },
    Free { pick: u16 },
    ReleaseCached,
}

#[derive(Debug, Arbitrary)]
struct Input {
    allocator: u8,
    fault_at: Option<u8>,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let name = NAMES[input.allocator as usize % NAMES.len()];
    let config = AllocatorConfig { segment_bytes: 8 << 20, ..AllocatorConfig::default() };
    let mut pool = registry::build(name, &config).expect("known allocator");
    let mut dev = SimDevice::new(64 << 20);
    dev.inject_fault_at(input.fault_at.map(u64::from));
    // addr -> (bytes, pattern)
    let mut live: BTreeMap<u64, (u64, u8)> = BTreeMap::new();
    for (i, op) in input.ops.iter().enumerate() {
        match *op {
            Op::Alloc { size, align_shift, stream } => {
                let size = u64::from(size % (24 << 20));
                let align = 1u64 << (align_shift % 22);
                if let Ok(b) = pool.allocate(&mut dev, size, align, u64::from(stream % 3)) {
                    assert_eq!(b.addr % align, 0, "{name}: misaligned");
                    let end = b.addr + size.max(1);
                    if let Some((&a, &(s, _))) = live.range(..end).next_back() {
                        assert!(a + s.max(1) <= b.addr, "{name}: overlap");
                    }
                    live.insert(b.addr, (size, i as u8));
                }
            }
            Op::Free { pick } => {
                if live.is_empty() {
                    assert!(pool.deallocate(&mut dev, 12345).is_err());
                    continue;
                }
                let k = *live.keys().nth(pick as usize % live.len()).expect("non-empty");
                live.remove(&k);
                pool.deallocate(&mut dev, k).expect("live block frees");
                assert!(pool.deallocate(&mut dev, k).is_err(), "{name}: double free accepted");
            }
            Op::ReleaseCached => {
                let _ = pool.empty_cache(&mut dev);
            }
        }
        pool.validate().expect("invariants hold");
        assert!(dev.used_bytes() <= dev.capacity_bytes());
    }
    for (&a, _) in live.iter() {
        pool.deallocate(&mut dev, a).expect("live block frees");
    }
    dev.inject_fault_at(None);
    pool.empty_cache(&mut dev).expect("release");
    assert_eq!(pool.stats().allocation_count.current, 0);
});
