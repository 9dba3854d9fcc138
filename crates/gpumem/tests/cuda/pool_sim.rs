//! DevicePool logic on the simulated device (no GPU needed): stream-ordered reuse,
//! record_stream, out-of-memory recovery, trim, release threshold, threads, pitched blocks.
use std::collections::BTreeMap;
use std::sync::Mutex;

use gpumem::pool::{class_bytes, DevicePool, PoolConfig, PoolError};
use gpumem::pool::{ManualEvents, StreamEvents};
use gpumem_core::sim::SimDevice;
use gpumem_core::Device;

use crate::common::SegmentPerBlock;

const MIB: u64 = 1 << 20;

fn opts() -> PoolConfig {
    PoolConfig {
        reserve_bytes: 0,
        ..PoolConfig::default()
    }
}

fn pool_with(capacity: u64, o: PoolConfig, ev: ManualEvents) -> DevicePool<SimDevice> {
    DevicePool::new(
        Box::new(SegmentPerBlock::default()),
        SimDevice::new(capacity),
        Box::new(ev),
        o,
    )
    .expect("pool")
}

/// Events shared between the pool and the test (the pool owns a Box; the test keeps a ref).
struct SharedEvents(&'static ManualEvents);
impl StreamEvents for SharedEvents {
    fn record(&self, s: u64) -> Result<u64, gpumem_core::DeviceError> {
        self.0.record(s)
    }
    fn query(&self, e: u64) -> Result<bool, gpumem_core::DeviceError> {
        self.0.query(e)
    }
    fn synchronize(&self, e: u64) -> Result<(), gpumem_core::DeviceError> {
        self.0.synchronize(e)
    }
    fn recycle(&self, e: u64) {
        self.0.recycle(e)
    }
}

fn leaked_events() -> &'static ManualEvents {
    Box::leak(Box::new(ManualEvents::new()))
}

fn pool_shared(capacity: u64, o: PoolConfig, ev: &'static ManualEvents) -> DevicePool<SimDevice> {
    DevicePool::new(
        Box::new(SegmentPerBlock::default()),
        SimDevice::new(capacity),
        Box::new(SharedEvents(ev)),
        o,
    )
    .expect("pool")
}

#[test]
fn same_stream_reuse_is_immediate_and_needs_no_event() {
    let ev = leaked_events();
    let pool = pool_shared(1 << 30, opts(), ev);
    let a = pool.alloc(1000, 1).expect("alloc");
    let addr = a.addr();
    assert_eq!(a.class_bytes(), 1024);
    drop(a);
    let b = pool.alloc(900, 1).expect("alloc"); // same class (1024)
    assert_eq!(b.addr(), addr);
    assert_eq!(ev.recorded(), 0);
    let s = pool.stats().expect("stats");
    assert_eq!(s.cache_hits, 1);
    assert_eq!(s.cache_misses, 1);
    assert_eq!(s.live_blocks, 1);
    assert_eq!(s.live_requested_bytes, 900);
}

#[test]
fn other_stream_waits_for_the_event_recorded_on_the_freeing_stream() {
    let ev = leaked_events();
    // A zero-byte shard cache sends every free straight behind an event.
    let o = PoolConfig {
        shard_cache_bytes: 0,
        ..opts()
    };
    let pool = pool_shared(1 << 30, o, ev);
    let a = pool.alloc(4096, 1).expect("alloc");
    let addr = a.addr();
    drop(a);
    assert_eq!(ev.recorded(), 1);
    let s = pool.stats().expect("stats");
    assert_eq!((s.pending_blocks, s.pending_bytes), (1, 4096));
    // Event on stream 1 not complete: stream 2 must get other memory.
    let b = pool.alloc(4096, 2).expect("alloc");
    assert_ne!(b.addr(), addr);
    drop(b);
    ev.complete_stream(1);
    let c = pool.alloc(4096, 2).expect("alloc");
    assert_eq!(
        c.addr(),
        addr,
        "after the event the block is reusable on stream 2"
    );
}

#[test]
fn record_stream_waits_for_every_stream_used() {
    let ev = leaked_events();
    let pool = pool_shared(1 << 30, opts(), ev);
    let mut a = pool.alloc(8192, 1).expect("alloc");
    let addr = a.addr();
    a.record_stream(2);
    a.record_stream(2);
    a.record_stream(1); // its own stream: ignored
    drop(a);
    assert_eq!(ev.recorded(), 2, "one event on stream 1, one on stream 2");
    // Not in any cache, so not even stream 1 reuses it yet.
    let b = pool.alloc(8192, 1).expect("alloc");
    assert_ne!(b.addr(), addr);
    ev.complete_stream(1);
    let c = pool.alloc(8192, 3).expect("alloc");
    assert_ne!(c.addr(), addr, "stream 2's event is still pending");
    ev.complete_stream(2);
    let d = pool.alloc(8192, 3).expect("alloc");
    assert_eq!(d.addr(), addr);
    drop((b, c, d));
}

#[test]
fn oom_flushes_caches_waits_and_retries() {
    let ev = leaked_events();
    let pool = pool_shared(8 * MIB, opts(), ev);
    let a = pool.alloc(4 * MIB, 1).expect("alloc");
    let b = pool.alloc(4 * MIB, 1).expect("alloc");
    drop((a, b)); // both cached for stream 1, 8 MiB held
    assert_eq!(pool.with_device(|d| d.used_bytes()).expect("dev"), 8 * MIB);
    // 6 MiB on stream 2: no cache hit, device full -> flush, wait, release, retry.
    let c = pool.alloc(6 * MIB, 2).expect("recovered");
    let s = pool.stats().expect("stats");
    assert_eq!(s.oom_recoveries, 1);
    assert_eq!(s.cached_blocks, 0);
    assert_eq!(s.pending_blocks, 0);
    assert_eq!(
        pool.with_device(|d| d.used_bytes()).expect("dev"),
        class_bytes(6 * MIB)
    );
    drop(c);
}

#[test]
fn oom_error_carries_the_request_and_the_pool_figures() {
    // The simulated device rounds segments to its 2 MiB granularity: 5 MiB takes 6 of 8.
    let pool = pool_with(8 * MIB, opts(), ManualEvents::new());
    let _a = pool.alloc(5 * MIB, 1).expect("alloc");
    let e = pool.alloc(3 * MIB, 1).expect_err("must not fit");
    match e {
        PoolError::OutOfMemory {
            pool: name,
            requested_bytes,
            reserved_bytes,
            allocated_bytes,
            cached_bytes,
            ..
        } => {
            assert_eq!(name, "segment-per-block");
            assert_eq!(requested_bytes, 3 * MIB);
            assert_eq!(reserved_bytes, 5 * MIB);
            assert_eq!(allocated_bytes, 5 * MIB);
            assert_eq!(cached_bytes, 0);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // The failure changed nothing: the pool still works.
    let b = pool.alloc(MIB, 1).expect("small still fits");
    drop(b);
}

#[test]
fn trim_gives_everything_back_and_reserve_pre_allocates() {
    let o = PoolConfig {
        reserve_bytes: 16 * MIB,
        ..opts()
    };
    let pool = pool_with(1 << 30, o, ManualEvents::new());
    assert_eq!(pool.with_device(|d| d.used_bytes()).expect("dev"), 16 * MIB);
    let blocks: Vec<_> = (1..=10)
        .map(|i| pool.alloc(i * 1000, i % 3).expect("alloc"))
        .collect();
    drop(blocks);
    let released = pool.empty_cache().expect("empty_cache");
    assert!(released >= 16 * MIB, "{released}");
    assert_eq!(pool.with_device(|d| d.used_bytes()).expect("dev"), 0);
    let s = pool.stats().expect("stats");
    assert_eq!(s.allocator.reserved_bytes.current, 0);
    assert_eq!(s.live_blocks, 0);
}

#[test]
fn release_threshold_gives_memory_back_after_events() {
    let ev = leaked_events();
    let o = PoolConfig {
        release_threshold_bytes: 0,
        max_cached_block_bytes: MIB, // 2 MiB blocks bypass the cache
        ..opts()
    };
    let pool = pool_shared(1 << 30, o, ev);
    let a = pool.alloc(2 * MIB, 1).expect("alloc");
    drop(a);
    assert_eq!(pool.with_device(|d| d.used_bytes()).expect("dev"), 2 * MIB);
    ev.complete_all();
    let b = pool.alloc(1024, 1).expect("alloc"); // slow path drains and applies the threshold
    let s = pool.stats().expect("stats");
    assert_eq!(
        s.allocator.reserved_bytes.current, 1024,
        "the 2 MiB segment went back"
    );
    assert_eq!(
        pool.with_device(|d| d.counters().get(gpumem_core::DriverCall::Free))
            .expect("dev"),
        1
    );
    drop(b);
}

#[test]
fn pitched_blocks_pad_rows() {
    let pool = pool_with(1 << 30, opts(), ManualEvents::new());
    let p = pool.alloc_pitched(1000, 10, 3, 0).expect("pitched");
    assert_eq!(p.pitch_bytes, 1024);
    assert_eq!(p.block.size_bytes(), 1024 * 10 * 3);
    assert_eq!(p.row_addr(2, 1) - p.block.addr(), (10 + 2) * 1024);
    let q = pool.alloc_pitched(512, 4, 0, 0).expect("2-D");
    assert_eq!((q.pitch_bytes, q.depth), (512, 1));
    assert!(matches!(
        pool.alloc_pitched(u64::MAX - 10, 2, 1, 0),
        Err(PoolError::PitchOverflow { .. })
    ));
}

#[test]
fn threads_never_share_a_live_block() {
    let pool = pool_with(1 << 32, opts(), ManualEvents::immediate());
    let live: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let pool = &pool;
            let live = &live;
            s.spawn(move || {
                let mut x = t + 1;
                let mut held = Vec::new();
                for i in 0..3000 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let size = 256 + (x >> 40) % 200_000;
                    let stream = (x >> 20) % 3;
                    let b = pool.alloc(size, stream).expect("alloc");
                    {
                        let mut l = live.lock().expect("lock");
                        let a = b.addr();
                        if let Some((&s0, &n)) = l.range(..=a).next_back() {
                            assert!(s0 + n <= a, "overlap at {a:#x}");
                        }
                        if let Some((&s1, _)) = l.range(a..).next() {
                            assert!(a + size <= s1, "overlap at {a:#x}");
                        }
                        l.insert(a, size);
                    }
                    held.push(b);
                    if held.len() > 20 || i % 7 == 0 {
                        let b = held.swap_remove((x % held.len() as u64) as usize);
                        live.lock().expect("lock").remove(&b.addr());
                        drop(b);
                    }
                }
                for b in held {
                    live.lock().expect("lock").remove(&b.addr());
                    drop(b);
                }
            });
        }
    });
    let s = pool.stats().expect("stats");
    assert_eq!(s.live_blocks, 0);
    assert_eq!(s.live_requested_bytes, 0);
    assert_eq!(s.cache_hits + s.cache_misses, 8 * 3000);
    assert!(s.cache_hits > 0);
    pool.validate().expect("valid");
    pool.empty_cache().expect("empty_cache");
    assert_eq!(pool.with_device(|d| d.used_bytes()).expect("dev"), 0);
}

// ------------------------------------------------ magazines, thread slots, stealing

#[test]
fn magazine_block_is_reused_at_once_on_its_stream_and_never_early_on_another() {
    let ev = leaked_events();
    let pool = pool_shared(1 << 30, opts(), ev);
    let a = pool.alloc(1000, 1).expect("alloc");
    let a_addr = a.addr();
    drop(a); // into this thread's magazine, stream 1
    let b = pool.alloc(1000, 2).expect("alloc");
    assert_ne!(b.addr(), a_addr, "stream 2 must not get stream 1's block");
    let b_addr = b.addr();
    drop(b); // the magazine moves to stream 2; stream 1's block goes to the shard
    let c = pool.alloc(1000, 1).expect("alloc");
    assert_eq!(c.addr(), a_addr, "stream 1 finds its block in the shard");
    let d = pool.alloc(1000, 2).expect("alloc");
    assert_eq!(d.addr(), b_addr, "stream 2 finds its block in the magazine");
    assert_eq!(ev.recorded(), 0, "same-stream reuse records no event");
    let s = pool.stats().expect("stats");
    assert_eq!((s.cache_hits, s.cache_misses), (2, 2));
    assert_eq!((s.live_blocks, s.live_requested_bytes), (2, 2000));
    drop((c, d));
    let s = pool.stats().expect("stats");
    assert_eq!((s.cached_blocks, s.cached_bytes), (2, 2048));
    // Trim puts both behind events (one per stream) and waits for them.
    pool.empty_cache().expect("empty_cache");
    assert_eq!(ev.recorded(), 2);
    assert_eq!(pool.with_device(|d| d.used_bytes()).expect("dev"), 0);
}

#[test]
fn a_block_in_another_threads_magazine_is_stolen_on_its_stream_only() {
    let ev = leaked_events();
    let pool = pool_shared(1 << 30, opts(), ev);
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let p = &pool;
        s.spawn(move || {
            let a = p.alloc(5000, 1).expect("alloc");
            tx.send(a.addr()).expect("send");
            drop(a); // into that thread's magazine
            tx.send(0).expect("send");
            done_rx.recv().expect("recv"); // stay alive (and keep the slot) meanwhile
        });
        let a_addr = rx.recv().expect("addr");
        rx.recv().expect("freed");
        let b = pool.alloc(5000, 2).expect("alloc");
        // Stream 1 on this thread may take it (stolen from the other thread's magazine).
        let c = pool.alloc(5000, 1).expect("alloc");
        let got = (b.addr(), c.addr());
        drop((b, c));
        // Let the other thread go before asserting (a failed assert must not hang it).
        done_tx.send(()).expect("send");
        assert_ne!(
            got.0, a_addr,
            "stream 2 must not take stream 1's cached block"
        );
        assert_eq!(
            got.1, a_addr,
            "stream 1 takes it from the other thread's magazine"
        );
    });
    assert_eq!(ev.recorded(), 0);
    let s = pool.stats().expect("stats");
    assert_eq!((s.cache_hits, s.cache_misses), (1, 2));
}

#[test]
fn trim_reclaims_blocks_cached_in_live_threads_magazines_and_shards() {
    let pool = pool_with(1 << 34, opts(), ManualEvents::immediate());
    let threads = 4;
    let filled = std::sync::Barrier::new(threads + 1);
    let trimmed = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for t in 0..threads as u64 {
            let (p, filled, trimmed) = (&pool, &filled, &trimmed);
            s.spawn(move || {
                // More blocks of one class than a magazine holds (the rest go to the shard),
                // and a few other classes.
                let mut v: Vec<_> = (0..gpumem::pool::MAGAZINE_BLOCKS + 10)
                    .map(|_| p.alloc(4096, t + 1).expect("alloc"))
                    .collect();
                v.extend((1..20).map(|i| p.alloc(i * 3000, t + 1).expect("alloc")));
                drop(v);
                filled.wait();
                trimmed.wait(); // the thread (and its slot) is alive during the trim
            });
        }
        filled.wait();
        let before = pool.stats().expect("stats");
        let used_before = pool.with_device(|d| d.used_bytes()).expect("dev");
        pool.empty_cache().expect("empty_cache");
        let after = pool.stats().expect("stats");
        let used_after = pool.with_device(|d| d.used_bytes()).expect("dev");
        trimmed.wait(); // release the threads before asserting (a failed assert must not hang)
        let per_thread = gpumem::pool::MAGAZINE_BLOCKS as u64 + 10 + 19;
        assert_eq!(before.cached_blocks, threads as u64 * per_thread);
        assert_eq!(before.live_blocks, 0);
        assert!(used_before > 0);
        assert_eq!((after.cached_blocks, after.cached_bytes), (0, 0));
        assert_eq!(
            (after.pending_blocks, after.allocator.reserved_bytes.current),
            (0, 0)
        );
        assert_eq!(used_after, 0);
    });
}

#[test]
fn threads_that_come_later_reuse_the_blocks_of_threads_gone() {
    // The mixed benchmark's pattern: many live blocks of many classes, freed in allocation
    // order, by a new thread per measurement on the same stream.
    let pool = pool_with(1 << 34, opts(), ManualEvents::immediate());
    let sizes: Vec<u64> = (0..600u64).map(|i| 1024 + (i * 7919) % (4 << 20)).collect();
    let round = |p: &DevicePool<SimDevice>| {
        let live: Vec<_> = sizes
            .iter()
            .map(|&s| p.alloc(s, 7).expect("alloc"))
            .collect();
        drop(live);
    };
    std::thread::scope(|s| {
        s.spawn(|| round(&pool));
    });
    let first = pool.stats().expect("stats");
    assert_eq!(first.cache_misses, sizes.len() as u64);
    let used = pool.with_device(|d| d.used_bytes()).expect("dev");
    for _ in 0..3 {
        std::thread::scope(|s| {
            s.spawn(|| round(&pool));
        });
    }
    let s = pool.stats().expect("stats");
    assert_eq!(s.cache_misses, first.cache_misses, "later threads only hit");
    assert_eq!(s.cache_hits, 3 * sizes.len() as u64);
    assert_eq!(pool.with_device(|d| d.used_bytes()).expect("dev"), used);
    assert_eq!(s.cached_blocks, sizes.len() as u64);
}
