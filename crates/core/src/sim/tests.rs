use super::*;

const G: u64 = DEFAULT_GRANULARITY;

#[test]
fn recorded_calls_are_followed_then_checked() {
    let mib = 1u64 << 20;
    let rec = |kind, addr, bytes, event| RecordedCall {
        kind,
        addr,
        bytes,
        event,
    };
    let base = DEFAULT_BASE + (1 << 30);
    let calls = vec![
        rec(RecordedKind::Alloc, base, 2 * mib, 0),
        rec(RecordedKind::Alloc, base + 64 * mib, 20 * mib, 3),
        rec(RecordedKind::Free, base, 2 * mib, 9),
    ];
    let mut d = SimDevice::default();
    d.follow_recorded(calls.clone(), 1);
    let skipped = d.alloc_segment(4 * mib).unwrap(); // placed as usual
    assert_ne!(skipped, base);
    assert_eq!(d.alloc_segment(2 * mib).unwrap(), base);
    assert_eq!(d.alloc_segment(20 * mib).unwrap(), base + 64 * mib);
    assert!(matches!(
        d.recorded_check(),
        Some(RecordedCheck::Diverges {
            event: 9,
            emulated: None,
            ..
        })
    ));
    d.free_segment(base).unwrap();
    assert_eq!(
        d.recorded_check(),
        Some(RecordedCheck::Matches { calls: 3 })
    );
    assert_eq!(
        d.recorded_check().unwrap().to_string(),
        "matches the recorded cudaMalloc sequence (3 calls)"
    );
    // The freed range is address space again.
    assert_eq!(d.alloc_segment(2 * mib).unwrap() % (2 * mib), 0);
    // A size that differs: the device stops following and says where.
    let mut d = SimDevice::default();
    d.follow_recorded(calls, 0);
    let a = d.alloc_segment(4 * mib).unwrap();
    assert_ne!(a, base);
    let check = d.recorded_check().unwrap();
    assert_eq!(
        check.to_string(),
        format!("diverges at event 0: recorded cudaMalloc(2097152) at {base:#x}, emulated cudaMalloc(4194304)")
    );
    assert_ne!(d.alloc_segment(2 * mib).unwrap(), base);
    assert_eq!(d.recorded_check(), Some(check));
}

#[test]
fn segments_count_against_capacity_and_are_rounded() {
    let mut d = SimDevice::new(10 * G);
    let a = d.alloc_segment(1).unwrap();
    assert_eq!(d.used_bytes(), G);
    let err = d.alloc_segment(10 * G).unwrap_err();
    assert!(matches!(err, DeviceError::OutOfMemory { free_bytes, .. } if free_bytes == 9 * G));
    d.free_segment(a).unwrap();
    assert_eq!(d.used_bytes(), 0);
    assert!(d.free_segment(a).is_err());
    assert_eq!(
        d.counters().get(DriverCall::Alloc),
        2,
        "a refused cuMemAlloc is still a call"
    );
    assert_eq!(d.counters().get(DriverCall::Free), 1);
    assert!(d.counters().seconds > 80e-6);
}

/// A request above the whole device is charged what the H200's driver took to refuse
/// it (`h200_refused_call_seconds`), not the cost of a granted call of the device's size
/// (≈ 45 ms for cuMemAlloc).
#[test]
fn refusals_above_the_device_cost_what_the_driver_took() {
    let cap = 16 * G;
    let seconds = |f: &dyn Fn(&mut SimDevice)| {
        let mut d = SimDevice::new(cap);
        f(&mut d);
        (d.counters().seconds_by_call, d.counters().calls)
    };
    let (s, n) = seconds(&|d| assert!(d.alloc_segment(1 << 63).is_err()));
    assert_eq!(n[DriverCall::Alloc as usize], 1);
    assert!((s[DriverCall::Alloc as usize] - 3.7e-6).abs() < 1e-12);
    let (s, _) = seconds(&|d| assert!(d.alloc_segment(cap + G).is_err()));
    assert!((s[DriverCall::Alloc as usize] - 5.5e-3).abs() < 1e-12);
    let (s, _) = seconds(&|d| assert!(d.create_physical(1 << 40).is_err()));
    let (alpha, _) = mapping_cost_factors(DriverCall::Create);
    assert!((s[DriverCall::Create as usize] - alpha * 3.2e-3).abs() < 1e-12);
    // At the device's size the call is granted and priced by the model as before.
    let (s, _) = seconds(&|d| assert!(d.alloc_segment(cap).is_ok()));
    assert_eq!(
        s[DriverCall::Alloc as usize],
        h200_isolated_call_seconds(DriverCall::Alloc, cap)
    );
    // Address space above the device is not a refusal: priced as the device's size.
    let (s, _) = seconds(&|d| assert!(d.reserve_va(4 * cap).is_ok()));
    assert_eq!(
        s[DriverCall::Reserve as usize],
        h200_isolated_call_seconds(DriverCall::Reserve, cap)
    );
}

#[test]
fn vmm_rules_are_enforced() {
    let mut d = SimDevice::new(8 * G);
    let va = d.reserve_va(4 * G).unwrap();
    let h = d.create_physical(G).unwrap();
    assert!(d.map(va + 1, G, h).is_err(), "unaligned va");
    assert!(d.map(va + 4 * G, G, h).is_err(), "outside the reservation");
    d.map(va, G, h).unwrap();
    assert!(d.map(va, G, h).is_err(), "double map");
    assert!(!d.is_accessible(va, 16));
    assert!(d.set_access(va, 2 * G).is_err(), "second page unmapped");
    d.set_access(va, G).unwrap();
    assert!(d.is_accessible(va, G));
    assert!(d.free_va(va, 4 * G).is_err(), "still mapped");
    d.release_physical(h).unwrap();
    assert_eq!(d.used_bytes(), G, "memory lives until unmapped");
    d.unmap(va, G).unwrap();
    assert_eq!(d.used_bytes(), 0);
    d.free_va(va, 4 * G).unwrap();
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
}

#[test]
fn overlapping_maps_are_refused_across_bitmap_words() {
    let mut d = SimDevice::new(1 << 40);
    let va = d.reserve_va(200 * G).unwrap();
    // A 70-granule mapping from granule 60: it crosses the first word of the bitmap.
    let h = d.create_physical(70 * G).unwrap();
    d.map(va + 60 * G, 70 * G, h).unwrap();
    for (at, n) in [(59, 2), (129, 1), (100, 1), (0, 61), (129, 40)] {
        let h2 = d.create_physical(n * G).unwrap();
        assert!(d.map(va + at * G, n * G, h2).is_err(), "{at}+{n} overlaps");
        d.release_physical(h2).unwrap();
    }
    let h3 = d.create_physical(60 * G).unwrap();
    d.map(va, 60 * G, h3).unwrap(); // right below: fits
    let h4 = d.create_physical(G).unwrap();
    d.map(va + 130 * G, G, h4).unwrap(); // right above: fits
                                         // Access over the three, tiled; not past them.
    assert!(d.set_access(va, 132 * G).is_err());
    d.set_access(va, 131 * G).unwrap();
    assert!(d.is_accessible(va + 5, 131 * G - 10));
    assert!(!d.is_accessible(va + 130 * G, G + 1));
    assert!(
        d.unmap(va + 60 * G, 10 * G).is_err(),
        "ends inside a mapping"
    );
    assert!(d.free_va(va, 200 * G).is_err(), "still mapped");
    d.unmap(va, 131 * G).unwrap();
    assert!(!d.is_accessible(va, 1));
    // Unmapped granules can be mapped again.
    d.map(va + 64 * G, 70 * G, h).unwrap();
    d.unmap(va + 64 * G, 70 * G).unwrap();
    for h in [h, h3, h4] {
        d.release_physical(h).unwrap();
    }
    d.free_va(va, 200 * G).unwrap();
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
}

#[test]
fn handle_ids_stay_sequential_when_the_slab_is_trimmed() {
    let mut d = SimDevice::new(1 << 40);
    let hs: Vec<PhysHandle> = (0..300).map(|_| d.create_physical(G).unwrap()).collect();
    assert_eq!(hs.first(), Some(&PhysHandle(1)));
    assert_eq!(hs.last(), Some(&PhysHandle(300)));
    let va = d.reserve_va(4 * G).unwrap();
    // Handle 250 stays mapped while released: it lives until its unmap.
    d.map(va, G, hs[249]).unwrap();
    // Release the first 200 out of order: the front is trimmed once it is all gone.
    for i in (0..200).rev() {
        d.release_physical(hs[i]).unwrap();
    }
    assert!(d.handles.first_id > 1, "the slab was trimmed");
    d.release_physical(hs[249]).unwrap();
    assert_eq!(d.used_bytes(), 100 * G);
    assert_eq!(d.live_objects(), (0, 1, 1, 99));
    assert_eq!(d.create_physical(G).unwrap(), PhysHandle(301));
    for bad in [0, 1, 150, 200, 250, 302, u64::MAX] {
        let e = d.release_physical(PhysHandle(bad)).unwrap_err().to_string();
        assert!(e.contains(&format!("handle {bad} is not live")), "{e}");
        let e = d.map(va + G, G, PhysHandle(bad)).unwrap_err().to_string();
        assert!(e.contains(&format!("handle {bad} is not live")), "{e}");
    }
    d.map(va + G, G, hs[200]).unwrap();
    d.unmap(va, 2 * G).unwrap();
    assert_eq!(d.used_bytes(), 100 * G, "handle 250 gone at its unmap");
    for h in hs[200..300].iter().filter(|h| h.0 != 250) {
        d.release_physical(*h).unwrap();
    }
    d.release_physical(PhysHandle(301)).unwrap();
    d.free_va(va, 4 * G).unwrap();
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
    assert_eq!(d.used_bytes(), 0);
    assert_eq!(d.create_physical(G).unwrap(), PhysHandle(302));
}

#[test]
fn the_bitmap_tiling_check_agrees_with_the_walk() {
    // Random mappings of 1–70 granules in a 300-granule range, then every span from
    // random starts: the bitmap check and the walk must agree on each.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for _ in 0..20 {
        let mut d = SimDevice::new(1 << 40);
        let va = d.reserve_va(300 * G).unwrap();
        for _ in 0..40 {
            let (at, n) = (rnd(300), 1 + rnd(70));
            let h = d.create_physical(n * G).unwrap();
            if d.map(va + at * G, n * G, h).is_err() {
                d.release_physical(h).unwrap();
            }
        }
        let r = &d.reserved[0];
        let mut agreed = (0, 0);
        for first in 0..300 {
            for n in 1..=(300 - first).min(140) {
                let walk = d.check_tiled_in(DriverCall::Unmap, 0, first, n).is_ok();
                assert_eq!(r.tiles(first, n), walk, "granules {first}+{n}");
                if walk {
                    agreed.0 += 1;
                } else {
                    agreed.1 += 1;
                }
            }
        }
        assert!(agreed.0 > 0 && agreed.1 > 0, "{agreed:?}");
    }
}

#[test]
fn bitmap_words_of_a_span() {
    let words = |first, n| {
        let mut v = Vec::new();
        let all = Reserved::words(first, n, |w, m| {
            v.push((w, m));
            true
        });
        assert!(all);
        v
    };
    assert_eq!(words(0, 64), [(0, u64::MAX)]);
    assert_eq!(words(64, 1), [(1, 1)]);
    assert_eq!(words(70, 3), [(1, 0b111 << 6)]);
    assert_eq!(words(127, 1), [(1, 1 << 63)]);
    assert_eq!(words(63, 2), [(0, 1 << 63), (1, 1)]);
    assert_eq!(words(5, 0), []);
    assert_eq!(words(60, 70), [(0, 0xf << 60), (1, u64::MAX), (2, 0b11)]);
    assert_eq!(words(64, 128), [(1, u64::MAX), (2, u64::MAX)]);
    // Stops at the first word refused.
    let mut seen = 0;
    assert!(!Reserved::words(0, 200, |_, _| {
        seen += 1;
        seen < 2
    }));
    assert_eq!(seen, 2);
}

#[test]
fn injected_faults_on_map_access_and_unmap_change_nothing() {
    let mut d = SimDevice::new(8 * G);
    let va = d.reserve_va(4 * G).unwrap();
    let h = d.create_physical(2 * G).unwrap();
    let before = (d.counters(), d.live_objects(), d.used_bytes());
    d.inject_fault_at(Some(d.calls_made()));
    let e = d.map(va, 2 * G, h).unwrap_err();
    assert!(e.to_string().contains("cuMemMap"), "{e}");
    assert_eq!((d.counters(), d.live_objects(), d.used_bytes()), before);
    d.map(va, 2 * G, h).unwrap();
    d.inject_fault_at(Some(d.calls_made()));
    assert!(d.set_access(va, 2 * G).is_err());
    assert!(!d.is_accessible(va, 1), "the failed call granted nothing");
    d.set_access(va, 2 * G).unwrap();
    assert!(d.is_accessible(va, 2 * G));
    d.inject_fault_at(Some(d.calls_made()));
    assert!(d.unmap(va, 2 * G).is_err());
    assert!(
        d.is_accessible(va, 2 * G),
        "the failed call unmapped nothing"
    );
    assert_eq!(d.live_objects(), (0, 1, 1, 1));
    d.unmap(va, 2 * G).unwrap();
    d.release_physical(h).unwrap();
    d.free_va(va, 4 * G).unwrap();
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
    assert_eq!(
        d.counters().total(),
        7,
        "the three failed calls are not counted"
    );
    assert_eq!(d.calls_made(), 10, "but were made");
}

#[test]
fn injected_fault_fails_exactly_that_call() {
    let mut d = SimDevice::new(8 * G);
    d.inject_fault_at(Some(1));
    d.reserve_va(G).unwrap();
    let e = d.create_physical(G).unwrap_err();
    assert!(matches!(
        e,
        DeviceError::Driver {
            call: "cuMemCreate",
            ..
        }
    ));
    assert_eq!(d.used_bytes(), 0);
    d.create_physical(G).unwrap();
}

#[test]
fn time_model_matches_anchor_points() {
    let t = h200_call_seconds(DriverCall::SetAccess, 2 << 20, 0);
    assert!((t - 24e-6 * 0.80).abs() < 1e-9, "{t}");
    // With 1,000 mappings live, set access costs 1.421 × its isolated figure more.
    let t = h200_call_seconds(DriverCall::SetAccess, 2 << 20, 1000);
    assert!((t - 24e-6 * 2.221).abs() < 1e-9, "{t}");
    let t = h200_call_seconds(DriverCall::Release, 1 << 30, 0);
    assert!((t - 490e-6 * 0.71).abs() < 1e-9);
    let t = h200_call_seconds(DriverCall::Release, 16 << 30, 0);
    assert!((t - 10_577e-6 * 0.71).abs() < 1e-9);
    // Address space alone: flat from 1 GiB (6 µs) to 1 TiB.
    let t = h200_call_seconds(DriverCall::Reserve, 64 << 30, 0);
    assert!((t - 6e-6).abs() < 1e-12, "{t}");
    let t = h200_call_seconds(DriverCall::Alloc, 1 << 30, 5000);
    assert!(
        (t - 184e-6).abs() < 1e-9,
        "cuMemAlloc does not depend on mappings"
    );
    let mid = h200_call_seconds(DriverCall::Alloc, 128 << 20, 0);
    assert!(mid > 45e-6 && mid < 81e-6);
}

#[test]
fn a_call_costs_more_with_more_mappings_live() {
    let mut d = SimDevice::new(1 << 30);
    let va = d.reserve_va(128 << 20).unwrap();
    let map_cost = |d: &mut SimDevice, i: u64| {
        let h = d.create_physical(2 << 20).unwrap();
        let before = d.counters().seconds_of(DriverCall::Map);
        d.map(va + i * (2 << 20), 2 << 20, h).unwrap();
        d.counters().seconds_of(DriverCall::Map) - before
    };
    let first = map_cost(&mut d, 0);
    for i in 1..32 {
        map_cost(&mut d, i);
    }
    let at_32 = map_cost(&mut d, 32);
    assert!((first - h200_call_seconds(DriverCall::Map, 2 << 20, 0)).abs() < 1e-12);
    assert!((at_32 - h200_call_seconds(DriverCall::Map, 2 << 20, 32)).abs() < 1e-12);
    assert!(at_32 > first, "{at_32} vs {first}");
}
