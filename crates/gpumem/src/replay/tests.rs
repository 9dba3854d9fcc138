use super::engine::canary_pattern;
use super::*;
use crate::trace::{Action, Event, PreexistingBlock, Trace};
use gpumem_core::strategy::Strategy;

/// A broken snapshot (an expandable segment or a map step of 2^64 bytes, addresses below
/// the page grid) neither hangs nor overflows the listing of pre-existing pages.
#[test]
fn preexisting_pages_of_a_broken_snapshot_are_bounded() {
    use crate::trace::SnapshotSegment;
    let seg = |address, total_size_bytes| SnapshotSegment {
        device: 0,
        address,
        total_size_bytes,
        allocated_size_bytes: 0,
        stream: 0,
        segment_type: "large".into(),
        is_expandable: true,
        private_pool: false,
        blocks: Vec::new(),
    };
    const MIB: u64 = 1 << 20;
    let t = Trace {
        segments: vec![seg(u64::MAX - MIB, u64::MAX), seg(30 * MIB, 40 * MIB)],
        events: vec![
            Event::new(Action::SegmentMap, 5, u64::MAX),
            Event::new(Action::SegmentMap, u64::MAX - 3, 1 << 30),
            Event::new(Action::SegmentUnmap, 30 * MIB, 20 * MIB),
        ],
        ..Trace::default()
    };
    let segs = preexisting_segments(&t, 0);
    // Only the sane segment's pages: its first page was unmapped during the trace (so
    // mapped before it), its second has no event and was mapped at the dump.
    assert_eq!(segs.len(), 1, "{segs:?}");
    assert_eq!(segs[0].segment.mapped, Some(vec![(0, 40 * MIB)]));
}

/// A run of `segment_free` events is the recorded run's `empty_cache()` only when it left
/// no wholly free segment: the garbage collector frees some old segments and keeps others.
#[test]
fn cache_releases_tell_empty_cache_from_the_collector() {
    const MIB: u64 = 1 << 20;
    let (a, b) = (0x1000_0000u64, 0x2000_0000u64);
    let events = vec![
        Event::new(Action::SegmentAlloc, a, 20 * MIB),
        Event::new(Action::Alloc, a, MIB),
        Event::new(Action::SegmentAlloc, b, 20 * MIB),
        Event::new(Action::Alloc, b, MIB),
        Event::new(Action::Free, a, MIB),
        Event::new(Action::Free, b, MIB),
        // 6: the collector frees `a` only; `b` stays cached and wholly free.
        Event::new(Action::SegmentFree, a, 20 * MIB),
        Event::new(Action::SegmentAlloc, a, 40 * MIB),
        Event::new(Action::Alloc, a, 30 * MIB),
        // 9: empty_cache(): `b` goes; `a` holds a live block.
        Event::new(Action::SegmentFree, b, 20 * MIB),
        Event::new(Action::Free, a, 30 * MIB),
        // 11, 12: empty_cache() again, one run of one event.
        Event::new(Action::SegmentFree, a, 40 * MIB),
    ];
    let t = Trace {
        events,
        ..Trace::default()
    };
    let mut got: Vec<u64> = cache_releases(&t, 0).into_iter().collect();
    got.sort_unstable();
    assert_eq!(got, vec![9, 11]);
    // Unmap runs (expandable segments) are releases as before.
    let t = Trace {
        events: vec![
            Event::new(Action::SegmentMap, a, 20 * MIB),
            Event::new(Action::SegmentUnmap, a, 20 * MIB),
        ],
        ..Trace::default()
    };
    assert_eq!(
        cache_releases(&t, 0).into_iter().collect::<Vec<_>>(),
        vec![1]
    );
}

#[test]
fn summary_counts_peak_and_preexisting() {
    let mut t = Trace::default();
    t.preexisting.push(PreexistingBlock {
        addr: 99,
        size_bytes: 10,
        device: 0,
        freed_at_event: Some(4),
    });
    t.events = vec![
        Event::alloc(1, 100),
        Event::alloc(2, 50),
        Event::free(1, 0),
        Event::new(Action::SegmentAlloc, 7, 1 << 21),
        Event::free(99, 10),
        Event::alloc(3, 20),
        Event::free(12345, 0),
    ];
    let s = summarize(&t, 0);
    assert_eq!(s.events, 7);
    assert_eq!(s.allocs, 3);
    assert_eq!(s.frees, 3);
    assert_eq!(s.peak_requested_bytes, 160);
    assert_eq!(s.preexisting_blocks, 1);
    assert_eq!(s.unmatched_frees, 1);
    assert_eq!(s.largest_request_bytes, 100);
    assert_eq!(s.duration_us, None);
    assert_eq!(devices(&t), vec![0]);
}

#[test]
fn summary_saturates_on_sizes_near_2_64() {
    let mut t = Trace {
        events: vec![
            Event::alloc(1, 1000),
            Event::alloc(2, u64::MAX - 511),
            Event::free(2, 0),
            // Too large to round to 512 bytes: every allocator refuses it, so it counts
            // as impossible, not in the peak (nor does its free count as unmatched).
            Event::alloc(3, u64::MAX),
            Event::free(3, 0),
        ],
        ..Trace::default()
    };
    t.events[0].time_us = Some(-5);
    t.events[2].time_us = Some(1_000_000);
    let s = summarize(&t, 0);
    assert_eq!(s.peak_requested_bytes, u64::MAX);
    assert_eq!(s.largest_request_bytes, u64::MAX - 511);
    assert_eq!(s.impossible_requests, 1);
    assert_eq!(s.unmatched_frees, 0);
    assert_eq!(s.duration_us, Some(1_000_005));
}

#[test]
fn canary_patterns_differ_between_neighbours() {
    assert_ne!(canary_pattern(0x1000), canary_pattern(0x1200));
    assert_ne!(canary_pattern(0), 0);
}

/// frag@pk is the external fragmentation right after the event during which reserved
/// bytes reached their final peak, not at the next sample (every 16 events on a short
/// trace). Under the torch emulation: six 3 MiB blocks in one 20 MiB segment, three of them
/// freed (holes of 3 MiB, 2 MiB left at the end), then a 25 MiB block takes a second
/// segment (the peak: 46 MiB), so 11 MiB are free with 3 MiB the largest run: 1 − 3/11.
/// The two neighbours freed next merge the holes, and the 3 MiB blocks allocated and freed
/// after that reserve nothing more: the sample after event 16 saw 1 − 15/17.
#[test]
fn fragmentation_at_peak_is_taken_at_the_peak_event() {
    use gpumem_core::config::AllocatorConfig;
    use gpumem_core::sim::SimDevice;
    const MIB: u64 = 1 << 20;
    let mut trace = Trace::default();
    for a in 1..=6 {
        trace.events.push(Event::new(Action::Alloc, a, 3 * MIB));
    }
    for a in [1, 3, 5] {
        trace.events.push(Event::new(Action::Free, a, 0));
    }
    trace.events.push(Event::new(Action::Alloc, 100, 25 * MIB));
    for a in [2, 4] {
        trace.events.push(Event::new(Action::Free, a, 0));
    }
    for a in 200..215 {
        trace.events.push(Event::new(Action::Alloc, a, 3 * MIB));
        trace.events.push(Event::new(Action::Free, a, 0));
    }
    let run = |trace: &Trace, strategy: Strategy| {
        let mut alloc = strategy.build(&AllocatorConfig::default());
        let mut dev = SimDevice::new(gpumem_core::sim::DEFAULT_CAPACITY);
        replay(
            trace,
            alloc.as_mut(),
            &mut dev,
            &ReplayConfig::default(),
            &mut |_| {},
        )
        .unwrap()
    };
    let torch = run(&trace, Strategy::Torch);
    assert_eq!(torch.peak_reserved_bytes, 46 * MIB);
    assert_eq!(torch.external_fragmentation_at_peak, 1.0 - 3.0 / 11.0);
    // Every strategy: the figure is the one after the first event whose prefix of the
    // trace reaches the whole trace's reserved peak.
    for name in Strategy::ALL {
        let whole = run(&trace, name);
        let at_peak = (1..=trace.events.len())
            .map(|n| Trace {
                events: trace.events[..n].to_vec(),
                ..Trace::default()
            })
            .map(|prefix| run(&prefix, name))
            .find(|r| r.peak_reserved_bytes == whole.peak_reserved_bytes)
            .unwrap();
        assert_eq!(
            whole.external_fragmentation_at_peak,
            at_peak.final_stats.external_fragmentation(),
            "{name}"
        );
        // The highest seen is at least the figure at the peak.
        assert!(
            whole.peak_external_fragmentation >= whole.external_fragmentation_at_peak,
            "{name}"
        );
    }
}
