//! Segments made before recording began, adopted as PyTorch held them, and frees that wait for
//! other streams.
use super::*;

/// A segment made before the emulation existed (a snapshot's pre-existing segment) is taken
/// in whole: its free stretches serve later requests before any cudaMalloc, as in PyTorch.
#[test]
fn adopted_segment_serves_later_requests() {
    use crate::{ForeignBlock, ForeignSegment};
    let (mut t, mut d) = new();
    let seg = ForeignSegment {
        bytes: 20 * MIB,
        small_pool: false,
        stream: 0,
        blocks: vec![ForeignBlock {
            offset: 5 * MIB,
            requested_bytes: 3 * MIB - 100,
            allocated_bytes: None,
        }],
        mapped: None,
    };
    let got = t.adopt_segment(&mut d, &seg).unwrap().expect("adopted");
    t.validate().unwrap();
    let base = t.segments()[0].0;
    assert_eq!(
        got,
        vec![Block {
            addr: base + 5 * MIB,
            requested_bytes: 3 * MIB - 100,
            allocated_bytes: 3 * MIB,
        }]
    );
    let s = t.stats();
    assert_eq!(s.reserved_bytes.current, 20 * MIB);
    assert_eq!(s.allocated_bytes.current, 3 * MIB);
    assert_eq!(s.free_bytes, 17 * MIB);
    assert_eq!(t.torch_stats().inactive_split.current, 2);
    assert_eq!(t.torch_stats().inactive_split_bytes.current, 17 * MIB);
    // Best fit: 4 MiB goes to the 5 MiB stretch at the base, not the 12 MiB one after the block.
    let a = alloc(&mut t, &mut d, 4 * MIB);
    assert_eq!(a.addr, base);
    assert_eq!(
        d.counters().total(),
        1,
        "no cudaMalloc beyond the adopted segment"
    );
    // Freeing everything merges the segment back into one free block, which empty_cache frees.
    free(&mut t, &mut d, got[0].addr);
    free(&mut t, &mut d, a.addr);
    assert_eq!(t.torch_stats().inactive_split.current, 0);
    assert_eq!(t.empty_cache(&mut d).unwrap(), 20 * MIB);
    t.validate().unwrap();
}

#[test]
fn layouts_pytorch_cannot_make_are_not_adopted() {
    use crate::{ForeignBlock, ForeignSegment};
    let block = |offset, requested| ForeignBlock {
        offset,
        requested_bytes: requested,
        allocated_bytes: None,
    };
    let seg = |small_pool, bytes, blocks| ForeignSegment {
        bytes,
        small_pool,
        stream: 0,
        blocks,
        mapped: None,
    };
    for bad in [
        seg(false, 20 * MIB, vec![block(0, 2 * MIB), block(MIB, MIB)]), // overlap
        seg(false, 20 * MIB, vec![block(19 * MIB, 2 * MIB)]),           // past the end
        seg(false, 20 * MIB, vec![block(100, MIB)]),                    // unaligned offset
        seg(false, 20 * MIB + 100, vec![]),                             // unaligned size
        seg(true, 2 * MIB, vec![block(0, 2 * MIB)]),                    // small pool, > 1 MiB
        seg(false, 0, vec![]),
    ] {
        let (mut t, mut d) = new();
        assert_eq!(t.adopt_segment(&mut d, &bad).unwrap(), None, "{bad:?}");
        assert_eq!(d.counters().total(), 0);
        assert_eq!(t.stats().reserved_bytes.current, 0);
        t.validate().unwrap();
    }
    // Expandable segments (and paged-lazy) keep no cudaMalloc segments to adopt.
    let fine = seg(false, 20 * MIB, vec![]);
    let mut d = SimDevice::default();
    let mut t =
        TorchCachingPool::with_conf(TorchConfig::parse("expandable_segments:True").unwrap());
    assert_eq!(t.adopt_segment(&mut d, &fine).unwrap(), None);
    let mut t = TorchCachingPool::paged_lazy(&AllocatorConfig::default());
    assert_eq!(t.adopt_segment(&mut d, &fine).unwrap(), None);
    // A device too small refuses it: out-of-memory, nothing changed.
    let mut d = SimDevice::new(16 * MIB);
    let (mut t, _) = new();
    assert!(t.adopt_segment(&mut d, &fine).unwrap_err().is_oom());
    assert_eq!(t.stats().reserved_bytes.current, 0);
    t.validate().unwrap();
}

/// An expandable segment of a recorded run (`expandable_segments:True`) is taken in with the
/// pages it had mapped: their free parts serve later requests with no map step.
#[test]
fn adopted_expandable_segment_serves_later_requests() {
    use crate::{ForeignBlock, ForeignSegment};
    let mut t =
        TorchCachingPool::with_conf(TorchConfig::parse("expandable_segments:True").unwrap());
    let mut d = SimDevice::default();
    let seg = ForeignSegment {
        bytes: 120 * MIB,
        small_pool: false,
        stream: 0,
        blocks: vec![
            ForeignBlock {
                offset: 10 * MIB,
                requested_bytes: 5 * MIB,
                allocated_bytes: None,
            },
            ForeignBlock {
                offset: 101 * MIB,
                requested_bytes: 2 * MIB - 7,
                allocated_bytes: Some(2 * MIB),
            },
        ],
        mapped: Some(vec![(0, 60 * MIB), (100 * MIB, 20 * MIB)]),
    };
    let got = t.adopt_segment(&mut d, &seg).unwrap().expect("adopted");
    t.validate().unwrap();
    let runs = t.segments();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let base = runs[0].0;
    assert_eq!(
        runs.iter().map(|r| (r.0 - base, r.1)).collect::<Vec<_>>(),
        vec![(0, 60 * MIB), (100 * MIB, 20 * MIB)]
    );
    assert_eq!(
        got.iter()
            .map(|b| (b.addr - base, b.allocated_bytes))
            .collect::<Vec<_>>(),
        vec![(10 * MIB, 5 * MIB), (101 * MIB, 2 * MIB)]
    );
    let s = t.stats();
    assert_eq!(s.reserved_bytes.current, 80 * MIB);
    assert_eq!(s.allocated_bytes.current, 7 * MIB);
    assert_eq!(s.requested_bytes.current, 7 * MIB - 7);
    assert_eq!(d.used_bytes(), 80 * MIB);
    // 30 MiB fits in the free 45 MiB after the first block: no map step.
    let calls = d.calls_made();
    let a = alloc(&mut t, &mut d, 30 * MIB);
    assert_eq!(a.addr - base, 15 * MIB);
    assert_eq!(d.calls_made(), calls);
    for b in got.iter().chain([&a]) {
        t.deallocate(&mut d, b.addr).unwrap();
        t.validate().unwrap();
    }
    t.empty_cache(&mut d).unwrap();
    t.validate().unwrap();
    assert_eq!(t.stats().reserved_bytes.current, 0);
    // Not twice into one pool, not into the native emulation, not a run off the page.
    let mut t =
        TorchCachingPool::with_conf(TorchConfig::parse("expandable_segments:True").unwrap());
    assert!(t.adopt_segment(&mut d, &seg).unwrap().is_some());
    assert_eq!(t.adopt_segment(&mut d, &seg).unwrap(), None);
    let (mut native, _) = new();
    assert_eq!(native.adopt_segment(&mut d, &seg).unwrap(), None);
    let mut t =
        TorchCachingPool::with_conf(TorchConfig::parse("expandable_segments:True").unwrap());
    let odd = ForeignSegment {
        mapped: Some(vec![(MIB, 20 * MIB)]),
        blocks: vec![],
        ..seg.clone()
    };
    assert_eq!(t.adopt_segment(&mut d, &odd).unwrap(), None);
    t.validate().unwrap();
}

/// A free that waits for another stream (`record_stream`): PyTorch's `free()` takes the block
/// out of `allocated_bytes` at once, its `free_block` out of `requested_bytes` and back into
/// the pool only when the stream's work is done.
#[test]
fn a_requested_free_leaves_allocated_bytes_first() {
    let (mut t, mut d) = new();
    let a = alloc(&mut t, &mut d, 3 * MIB - 10);
    t.free_requested(&mut d, a.addr).unwrap();
    t.validate().unwrap();
    let s = t.stats();
    assert_eq!(s.allocated_bytes.current, 0);
    assert_eq!(s.requested_bytes.current, 3 * MIB - 10);
    // Not back in the pool yet: the next request of the same size takes new memory.
    let b = alloc(&mut t, &mut d, 3 * MIB - 10);
    assert_ne!(b.addr, a.addr);
    assert_eq!(t.stats().allocated_bytes.current, 3 * MIB);
    // A second request changes nothing; the completion frees it.
    t.free_requested(&mut d, a.addr).unwrap();
    assert_eq!(t.stats().allocated_bytes.current, 3 * MIB);
    free(&mut t, &mut d, a.addr);
    let s = t.stats();
    assert_eq!(s.allocated_bytes.current, 3 * MIB);
    assert_eq!(s.requested_bytes.current, 3 * MIB - 10);
    assert!(t.free_requested(&mut d, a.addr).is_err());
    free(&mut t, &mut d, b.addr);
    assert_eq!(t.stats().allocated_bytes.current, 0);
    // Never 6 MiB: `a` had left allocated_bytes before `b` came (a free at completion would
    // have made it 6 MiB).
    assert_eq!(t.stats().allocated_bytes.peak, 3 * MIB);
}
