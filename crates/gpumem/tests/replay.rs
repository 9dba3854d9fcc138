//! The replay engine over every allocator on the simulated device.
use gpumem::core::sim::SimDevice;
use gpumem::core::{
    config::AllocatorConfig,
    registry::{self, NAMES},
};
use gpumem::core::{Allocator, Device};
use gpumem::replay::{self, ReplayConfig};
use gpumem::trace::{Event, PreexistingBlock, Trace};

const MIB: u64 = 1 << 20;

/// A small deterministic workload: a sawtooth of mixed sizes with frees in another order.
fn workload() -> Trace {
    let mut t = Trace::default();
    let mut live = Vec::new();
    let mut x: u64 = 12345;
    for i in 0..3000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let size = match x % 10 {
            0..=5 => 512 + x % (64 << 10),
            6..=8 => MIB + x % (8 * MIB),
            _ => 30 * MIB + x % (200 * MIB),
        };
        t.events.push(Event::alloc(0x1000 + i * 64, size));
        live.push(0x1000 + i * 64);
        if live.len() > 40 {
            let k = (x >> 20) as usize % live.len();
            let a = live.swap_remove(k);
            t.events.push(Event::free(a, 0));
        }
    }
    for a in live {
        t.events.push(Event::free(a, 0));
    }
    t
}

#[test]
fn every_allocator_replays_without_oom_and_reserves_at_least_the_peak() {
    let t = workload();
    let s = replay::summarize(&t, 0);
    for name in NAMES {
        let mut a = registry::build(name, &AllocatorConfig::default()).unwrap();
        let mut d = SimDevice::new(64 << 30);
        let r = replay::replay(
            &t,
            a.as_mut(),
            &mut d,
            &ReplayConfig::default(),
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(r.oom_count, 0, "{name}");
        assert!(
            r.peak_reserved_bytes >= s.peak_requested_bytes,
            "{name}: reserved below requested"
        );
        assert_eq!(
            r.peak_requested_bytes, s.peak_requested_bytes,
            "{name}: served requested peak"
        );
        assert!(r.peak_allocated_bytes >= s.peak_requested_bytes, "{name}");
        assert!(r.peak_reserved_bytes >= r.peak_allocated_bytes, "{name}");
        assert_eq!(
            a.stats().allocation_count.current,
            0,
            "{name}: everything freed"
        );
        assert!(r.driver_calls.total() > 0, "{name}: made no driver call");
        a.empty_cache(&mut d).unwrap();
        assert_eq!(d.used_bytes(), 0, "{name}: memory left after empty_cache");
    }
}

#[test]
fn capacity_limit_counts_ooms_and_goes_on() {
    let t = workload();
    let s = replay::summarize(&t, 0);
    for name in NAMES {
        let mut a = registry::build(name, &AllocatorConfig::default()).unwrap();
        // Half the peak cannot hold the workload.
        let mut d = SimDevice::new(s.peak_requested_bytes / 2);
        let r = replay::replay(
            &t,
            a.as_mut(),
            &mut d,
            &ReplayConfig::default(),
            &mut |_| {},
        )
        .unwrap();
        assert!(r.oom_count > 0, "{name}: no OOM at half the peak");
        assert!(r.first_oom_request_bytes.is_some());
        assert!(
            r.peak_reserved_bytes <= s.peak_requested_bytes / 2,
            "{name}: reserved past capacity"
        );
        assert_eq!(
            a.stats().allocation_count.current,
            0,
            "{name}: dropped blocks' frees were skipped"
        );
    }
}

#[test]
fn min_capacity_is_tight() {
    let t = workload();
    for name in ["tlsf", "torch"] {
        let mut make = || -> Box<dyn Allocator> {
            registry::build(name, &AllocatorConfig::default()).unwrap()
        };
        let mut make_dev = |c: u64| -> Box<dyn Device> { Box::new(SimDevice::new(c)) };
        let opts = ReplayConfig::default();
        let m = replay::min_capacity(&t, &mut make, &mut make_dev, 64 << 30, 2 * MIB, &opts)
            .unwrap()
            .unwrap();
        let run = |cap: u64| {
            let mut a = make();
            let mut d = SimDevice::new(cap);
            replay::replay(&t, a.as_mut(), &mut d, &opts, &mut |_| {})
                .unwrap()
                .oom_count
        };
        assert_eq!(run(m), 0, "{name}: min capacity {m} does not complete");
        assert!(run(m - 2 * MIB) > 0, "{name}: {m} - 2 MiB still completes");
    }
}

#[test]
fn preexisting_blocks_are_live_from_the_start() {
    let mut t = Trace::default();
    t.preexisting.push(PreexistingBlock {
        addr: 1,
        size_bytes: 100 * MIB,
        device: 0,
        freed_at_event: Some(1),
    });
    t.events = vec![
        Event::alloc(2, 50 * MIB),
        Event::free(1, 100 * MIB),
        Event::free(2, 0),
    ];
    let mut a = registry::build("tlsf", &AllocatorConfig::default()).unwrap();
    let mut d = SimDevice::new(1 << 40);
    let r = replay::replay(
        &t,
        a.as_mut(),
        &mut d,
        &ReplayConfig::default(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(r.peak_requested_bytes, 150 * MIB);
    assert_eq!(a.stats().allocation_count.current, 0);
}

#[test]
fn timeline_samples_requested_allocated_reserved() {
    let t = workload();
    let mut a = registry::build("best-fit", &AllocatorConfig::default()).unwrap();
    let mut d = SimDevice::new(64 << 30);
    let opts = ReplayConfig {
        timeline_points: 100,
        ..ReplayConfig::default()
    };
    let r = replay::replay(&t, a.as_mut(), &mut d, &opts, &mut |_| {}).unwrap();
    assert!(
        r.timeline.len() >= 100 && r.timeline.len() <= 101,
        "{}",
        r.timeline.len()
    );
    for s in &r.timeline {
        assert!(
            s.requested_bytes <= s.allocated_bytes && s.allocated_bytes <= s.reserved_bytes,
            "{s:?}"
        );
    }
}
