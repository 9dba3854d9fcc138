//! The CUDA paths of pinned memory against a fake driver (tests/support/libcuda.c):
//! device memory is host memory and copies are memcpy, so data movement, call sequences,
//! error reporting and the release of every handle are checked on machines without a GPU.
//!
//! The harness (tests/support/fakecuda.rs) builds the fake and runs the test again in a
//! child process that loads it.

use crate::support::{against_fake_driver, live, test_name};
use gpumem::cuda::{CudaContext, DeviceBuffer, Stream};
use gpumem::pinned::advise::{Direction, MemoryKind};
use gpumem::pinned::transfer::{alloc_costs, TransferBench};
use gpumem::pinned::{
    CopyKind, HostAllocFlags, HostRegistration, PinnedBuffer, PinnedError, PinnedPool,
    PinnedPoolConfig, PinnedSource, StagingConfig, StagingRing,
};

#[test]
fn cuda_paths_against_a_fake_driver() {
    against_fake_driver(
        &test_name(module_path!(), "cuda_paths_against_a_fake_driver"),
        child,
    );
}

fn child() {
    gpumem::cuda::init().expect("the fake driver loads");
    let h = CudaContext::new(0).unwrap();
    assert_eq!(h.name().unwrap(), "Fake H200");
    assert_eq!(h.pci_bus_id().unwrap(), "0000:3B:00.0");
    assert!(matches!(
        CudaContext::new(1),
        Err(gpumem::cuda::CudaError::Device(_))
    ));

    buffers(&h);
    registration(&h);
    pool(&h);
    staging(&h);
    bench(&h);

    // Every handle went back to the driver.
    for (what, name) in [
        (0, "host allocations"),
        (1, "device allocations"),
        (2, "events"),
        (3, "streams"),
    ] {
        assert_eq!(live(what), 0, "{name} leaked");
    }
}

fn buffers(h: &CudaContext) {
    for flags in [
        HostAllocFlags::DEFAULT,
        HostAllocFlags::PORTABLE,
        HostAllocFlags::MAPPED,
        HostAllocFlags::WRITE_COMBINED,
    ] {
        let mut b = PinnedBuffer::new_cuda(h, 100_000, flags).unwrap();
        assert!(b.is_cuda());
        assert!(b.iter().all(|&x| x == 0), "zeroed");
        b[99_999] = 5;
        match b.device_ptr() {
            Some(d) => {
                assert!(flags.mapped);
                assert_eq!(d, b.as_ptr() as u64, "the fake maps at the host address");
            }
            None => assert!(!flags.mapped),
        }
        let s = Stream::new(h).unwrap();
        let d = DeviceBuffer::new(h, 100_000).unwrap();
        s.copy_h2d(&d, 0, &b).unwrap();
        let mut back = vec![0u8; 50_000];
        s.copy_d2h(&mut back, &d, 50_000).unwrap();
        assert_eq!(back[49_999], 5);
        assert!(matches!(
            s.copy_d2h(&mut back, &d, 50_001),
            Err(gpumem_core::DeviceError::Invalid { .. })
        ));
    }
    assert_eq!(live(0), 0);
}

fn registration(h: &CudaContext) {
    let mut v = vec![7u8; 10 * 4096 + 123];
    let base = v.as_mut_ptr() as usize;
    {
        let r = HostRegistration::new_cuda(h, &mut v, 4 * 4096, true, true).unwrap();
        assert!(r.chunks().len() >= 3);
        assert_eq!(r.device_ptr(), Some(base as u64));
    }
    // A page in the third chunk already registered by someone else: the call fails at that
    // chunk with the driver's error name, and the first two are rolled back.
    let page = (base + 8 * 4096 + 4095) & !4095;
    // SAFETY: registers one page of `v`, unregistered below.
    unsafe {
        cudarc::driver::sys::cuMemHostRegister_v2(page as *mut _, 4096, 0)
            .result()
            .unwrap()
    };
    let e = HostRegistration::new_cuda(h, &mut v, 4 * 4096, false, false).unwrap_err();
    match &e {
        PinnedError::Register {
            call, chunk, name, ..
        } => {
            assert_eq!(*call, "cuMemHostRegister");
            assert_eq!(*chunk, 2, "{e}");
            assert_eq!(name, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED");
        }
        other => panic!("{other}"),
    }
    // SAFETY: the page registered above.
    unsafe {
        cudarc::driver::sys::cuMemHostUnregister(page as *mut _)
            .result()
            .unwrap()
    };
    // Rolled back: the whole range registers again.
    let r = HostRegistration::new_cuda(h, &mut v, 64 << 30, false, false).unwrap();
    assert_eq!(r.chunks().len(), 1);
}

fn pool(h: &CudaContext) {
    let pool = PinnedPool::new(PinnedPoolConfig {
        source: PinnedSource::Cuda(h.clone(), HostAllocFlags::MAPPED),
        cap_bytes: Some(8 << 20),
    });
    assert!(pool.is_cuda());
    let s = Stream::new(h).unwrap();
    for round in 0..5 {
        let mut b = pool.alloc(3 << 20).unwrap();
        assert!(b.device_ptr().is_some());
        b.fill(round);
        b.record_stream(&s).unwrap();
        drop(b);
    }
    let st = pool.stats();
    assert_eq!((st.cache_misses, st.cache_hits), (1, 4));
    // Events were recycled: one idle event in the pool, none created per round.
    assert_eq!(live(2), 1);
    let b = pool.alloc(3 << 20).unwrap();
    b.release_after(&s).unwrap();
    // 6 MiB beside the cached 3 MiB passes the 8 MiB cap: the cached block is released.
    let big = pool.alloc(6 << 20).unwrap();
    assert_eq!(pool.stats().released_blocks, 1);
    assert_eq!(live(0), 1);
    let e = pool.alloc(3 << 20).unwrap_err();
    assert!(matches!(e, PinnedError::CapExceeded { .. }), "{e}");
    // In human units (it said `requested 3145728 B`).
    assert!(
        e.to_string()
            .starts_with("pinned memory cap reached: requested 3.00 MiB"),
        "{e}"
    );
    assert!(e.to_string().ends_with("cap 8.00 MiB"), "{e}");
    drop(big);
    pool.validate().unwrap();
    drop(pool);
    assert_eq!(live(0), 0, "the pool's blocks were freed");
    assert_eq!(live(2), 0, "the pool's events were destroyed");
}

fn staging(h: &CudaContext) {
    let s = Stream::new(h).unwrap();
    let n = (5 << 20) + 321;
    let d = DeviceBuffer::new(h, n + 100).unwrap();
    let src: Vec<u8> = (0..n).map(|i| (i % 241) as u8).collect();
    for copy in [CopyKind::Libc, CopyKind::NonTemporal] {
        let mut ring = StagingRing::new_cuda(
            h,
            StagingConfig {
                chunk_bytes: 1 << 20,
                buffers: 3,
                threads: 2,
                copy,
            },
        )
        .unwrap();
        ring.copy_pageable_to_device(&src, &d, 100, &s).unwrap();
        let mut back = vec![0u8; n];
        s.copy_d2h(&mut back, &d, 100).unwrap();
        assert!(back == src);
        let mut back = vec![0u8; n];
        ring.copy_device_to_pageable(&d, 100, &mut back, &s)
            .unwrap();
        assert!(back == src);
        assert!(matches!(
            ring.copy_pageable_to_device(&src, &d, 101, &s),
            Err(PinnedError::InvalidArgument(_))
        ));
    }
    // A ring made without CUDA refuses device copies.
    if let Ok(mut r) = StagingRing::new_locked(StagingConfig::default()) {
        assert!(matches!(
            r.copy_pageable_to_device(&src, &d, 0, &s),
            Err(PinnedError::InvalidArgument(_))
        ));
    }
}

fn bench(h: &CudaContext) {
    let mut b = TransferBench::new(
        h,
        4 << 20,
        &MemoryKind::ALL,
        StagingConfig {
            chunk_bytes: 1 << 20,
            buffers: 2,
            threads: 2,
            copy: CopyKind::NonTemporal,
        },
    )
    .unwrap();
    assert_eq!(
        *b.mapped_method(),
        gpumem::pinned::transfer::MappedMethod::Kernel
    );
    let checks = b.verify(3 << 20).unwrap();
    assert_eq!(checks.len(), 3);
    for (what, ok) in checks {
        assert!(ok, "{what}");
    }
    for kind in MemoryKind::ALL {
        for dir in [Direction::H2d, Direction::D2h, Direction::Both] {
            let t = b.measure(kind, dir, 1 << 20, 2).unwrap();
            assert!(t.is_some_and(|t| t >= 0.0), "{kind:?} {dir:?}");
        }
    }
    let o = b.overlap(MemoryKind::Pinned, 4 << 20, 2).unwrap();
    assert!((0.0..=1.0).contains(&o.hidden_fraction));
    assert!(b
        .measure(MemoryKind::Pinned, Direction::H2d, 5 << 20, 1)
        .is_err());
    let (gpu, host) = b.numa();
    assert_eq!(host.len(), 4);
    let _ = gpu;
    b.set_staging(StagingConfig {
        chunk_bytes: 512 << 10,
        buffers: 4,
        threads: 2,
        copy: CopyKind::Libc,
    })
    .unwrap();
    assert!(b
        .measure(MemoryKind::Staged, Direction::Both, 4 << 20, 1)
        .unwrap()
        .is_some());
    drop(b);
    let costs = alloc_costs(Some(h), 1 << 20, 2).unwrap();
    let methods: Vec<&str> = costs.iter().map(|p| p.method.as_str()).collect();
    assert_eq!(
        methods,
        [
            "malloc+touch",
            "cuMemHostAlloc",
            "cuMemHostRegister",
            "pool_cold",
            "pool_warm"
        ]
    );
}
