//! Pinned memory against a real CUDA device. Run on a GPU machine with
//! `cargo test -p gpumem --test pinned_cuda -- --ignored` (or the prebuilt test binary with
//! `--ignored`). Without a driver, only the check that every entry point fails cleanly runs.

use gpumem::cuda::{CudaContext, DeviceBuffer, Stream};
use gpumem::pinned::transfer::TransferBench;
use gpumem::pinned::{
    advise::MemoryKind, CopyKind, HostAllocFlags, HostRegistration, PinnedBuffer, PinnedPool,
    PinnedPoolConfig, PinnedSource, StagingConfig, StagingRing,
};

#[test]
fn without_a_driver_every_entry_point_says_so() {
    if gpumem::cuda::init().is_ok() {
        return;
    }
    let e = CudaContext::new(0).map(|_| ()).unwrap_err();
    assert!(
        matches!(
            e,
            gpumem::cuda::CudaError::NoDriver { .. } | gpumem::cuda::CudaError::Unusable(_)
        ),
        "{e:?}"
    );
    // The pool falls back to mlock instead of failing.
    assert!(!PinnedPool::new(PinnedPoolConfig::auto(0)).is_cuda());
}

fn host() -> CudaContext {
    CudaContext::new(0).expect("a CUDA device")
}

#[test]
#[ignore = "needs a CUDA device"]
fn buffers_of_every_flag_and_the_mapped_device_pointer() {
    let h = host();
    for flags in [
        HostAllocFlags::DEFAULT,
        HostAllocFlags::PORTABLE,
        HostAllocFlags::MAPPED,
        HostAllocFlags::WRITE_COMBINED,
    ] {
        let mut b = PinnedBuffer::new_cuda(&h, 3 << 20, flags).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        b[12345] = 9;
        assert_eq!(b.flags(), Some(flags));
        assert_eq!(b.device_ptr().is_some(), flags.mapped, "{flags}");
        // A round trip through the device.
        let s = Stream::new(&h).unwrap();
        let d = DeviceBuffer::new(&h, 3 << 20).unwrap();
        s.copy_h2d(&d, 0, &b).unwrap();
        let mut back = vec![0u8; 3 << 20];
        s.copy_d2h(&mut back, &d, 0).unwrap();
        assert_eq!(back[12345], 9);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn registration_in_chunks() {
    let h = host();
    let mut v = vec![1u8; (10 << 20) + 100];
    {
        let r = HostRegistration::new_cuda(&h, &mut v[100..], 4 << 20, false, true).unwrap();
        assert_eq!(r.chunks().len(), 3);
        assert!(r.device_ptr().is_some());
    }
    // After the drop the memory can be registered again.
    let r = HostRegistration::new_cuda(&h, &mut v, 64 << 30, false, false).unwrap();
    assert_eq!(r.chunks().len(), 1);
}

#[test]
#[ignore = "needs a CUDA device"]
fn pool_on_cuda_waits_for_the_copy_before_reuse() {
    let h = host();
    let pool = PinnedPool::new(PinnedPoolConfig {
        source: PinnedSource::Cuda(h.clone(), HostAllocFlags::DEFAULT),
        cap_bytes: Some(1 << 30),
    });
    let s = Stream::new(&h).unwrap();
    let d = DeviceBuffer::new(&h, 256 << 20).unwrap();
    let mut b = pool.alloc(256 << 20).unwrap();
    b.fill(3);
    // 20 copies: ≈100 ms of work, so the next request surely finds the block busy.
    for _ in 0..20 {
        // SAFETY: the block stays alive until the event recorded below completes: the pool
        // will not hand it out before then.
        unsafe { s.copy_h2d_raw(d.device_ptr(), b.as_ptr(), b.len()).unwrap() };
    }
    b.record_stream(&s).unwrap();
    let addr = b.as_ptr();
    drop(b);
    // While the copies run, a second request gets another block.
    let other = pool.alloc(256 << 20).unwrap();
    assert_ne!(
        other.as_ptr(),
        addr,
        "a block in use by a copy was handed out"
    );
    assert_eq!(pool.stats().busy_skips, 1);
    s.synchronize().unwrap();
    let other_addr = other.as_ptr();
    drop(other);
    // Once it finished, the blocks come back; events are recycled across rounds.
    for _ in 0..3 {
        let mut again = pool.alloc(256 << 20).unwrap();
        assert!(again.as_ptr() == addr || again.as_ptr() == other_addr);
        // SAFETY: as above.
        unsafe {
            s.copy_h2d_raw(d.device_ptr(), again.as_ptr(), again.len())
                .unwrap()
        };
        again.record_stream(&s).unwrap();
        drop(again);
        s.synchronize().unwrap();
    }
    assert_eq!(pool.stats().segment_count.current, 2);
    pool.validate().unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn staged_copies_round_trip() {
    let h = host();
    let s = Stream::new(&h).unwrap();
    let n = (100 << 20) + 12345;
    let d = DeviceBuffer::new(&h, n).unwrap();
    let src: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    for copy in [CopyKind::Libc, CopyKind::NonTemporal] {
        let mut ring = StagingRing::new_cuda(
            &h,
            StagingConfig {
                chunk_bytes: 4 << 20,
                buffers: 3,
                threads: 4,
                copy,
            },
        )
        .unwrap();
        ring.copy_pageable_to_device(&src, &d, 0, &s).unwrap();
        let mut back = vec![0u8; n];
        s.copy_d2h(&mut back, &d, 0).unwrap();
        assert!(back == src, "{copy:?} h2d");
        let mut back2 = vec![0u8; n];
        ring.copy_device_to_pageable(&d, 0, &mut back2, &s).unwrap();
        assert!(back2 == src, "{copy:?} d2h");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn bench_checks_pass_and_figures_are_plausible() {
    let h = host();
    let mut b =
        TransferBench::new(&h, 64 << 20, &MemoryKind::ALL, StagingConfig::default()).unwrap();
    for (what, ok) in b.verify(64 << 20).unwrap() {
        assert!(ok, "{what}");
    }
    use gpumem::pinned::advise::Direction;
    let t = b
        .measure(MemoryKind::Pinned, Direction::H2d, 64 << 20, 5)
        .unwrap()
        .unwrap();
    let gbps = (64u64 << 20) as f64 / t / 1e9;
    assert!(gbps > 1.0 && gbps < 1000.0, "{gbps}");
}
