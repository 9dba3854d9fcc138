//! Two devices: peer access, peer copies between pool blocks (cuMemAlloc segments and VMM
//! pages) checked byte for byte, and the peer bandwidth run; against the fake driver with
//! `FAKE_CUDA_DEVICES=2`, and on two GPUs (ignored as "needs a CUDA device"; they pass with
//! a "skipped" line where fewer than two devices exist).
use std::ffi::OsString;

use gpumem::cuda::peer_bench::{self, Grant, PeerBenchConfig, PeerError};
use gpumem::cuda::{self, CudaContext, PeerMethod};
use gpumem_core::DeviceError;

use crate::support::{against_fake_driver_with, live, test_name};

const MIB: u64 = 1 << 20;

/// Byte-for-byte peer copies between pools on devices 0 and 1: every method, both ways,
/// over cuMemAlloc segments and VMM pages.
/// Returns how the VMM blocks were shared (pages, or whole mappings where the driver refused
/// the pages).
fn peer_copies_are_exact(bytes: usize) -> Grant {
    let checks = peer_bench::check_pool_peer_copies(0, 1, bytes).expect("peer copies");
    // 2 strategies × 2 directions × 3 methods (the devices can reach each other).
    assert_eq!(checks.len(), 12, "{checks:#?}");
    for c in &checks {
        assert!(c.check.ok(), "{c:#?}");
        assert_eq!(c.check.bytes, bytes as u64 / 16 * 16);
    }
    let vmm_kernel_ways = checks
        .iter()
        .filter(|c| c.vmm && c.check.method == PeerMethod::Kernel)
        .map(|c| (c.check.src_device, c.check.dst_device))
        .collect::<Vec<_>>();
    assert_eq!(vmm_kernel_ways, vec![(0, 1), (1, 0)]);
    assert!(matches!(
        peer_bench::check_pool_peer_copies(1, 1, bytes),
        Err(PeerError::SameDevice(1))
    ));
    for c in &checks {
        assert_eq!(c.grant == Grant::Context, !c.vmm, "{c:?}");
    }
    let vmm_grant = checks.iter().find(|c| c.vmm).expect("VMM checks").grant;
    println!("VMM blocks shared by {vmm_grant:?}");
    vmm_grant
}

fn peer_access_is_enabled_once() {
    let c0 = CudaContext::new(0).expect("cuda:0");
    let c1 = CudaContext::new(1).expect("cuda:1");
    // Enabled now, or earlier in this process: either way a second call says "already".
    cuda::enable_peer_access(&c0, &c1).expect("enable 0 -> 1");
    assert_eq!(cuda::enable_peer_access(&c0, &c1), Ok(false));
    assert!(matches!(
        cuda::enable_peer_access(&c1, &c1),
        Err(DeviceError::Unsupported(_))
    ));
    let p = cuda::p2p_attributes(0, 1).expect("attributes");
    assert!(p.access_supported);
    assert!(p.performance_rank >= 0);
}

fn bandwidth_rows_are_complete(sizes: Vec<u64>) {
    let n_sizes = sizes.len();
    let cfg = PeerBenchConfig {
        sizes,
        repeats: 2,
        check_bytes: 256 * 1024,
    };
    let mut labels = 0;
    let r = peer_bench::peer_bandwidth(0, 1, &cfg, &mut |_| labels += 1).expect("bandwidth");
    assert!(r.peer_access);
    // Baseline + pool × (peer, dtod, kernel), 3 directions, each size.
    assert_eq!(r.rows.len(), 4 * 3 * n_sizes, "{:#?}", r.rows);
    assert_eq!(
        labels,
        r.rows.len() + 1,
        "one label a point, one for the checks"
    );
    for row in &r.rows {
        assert!(row.gbps > 0.0 && row.median_s > 0.0, "{row:?}");
        let p = row.pct_of_baseline.expect("every row has a baseline");
        if row.memory == "cuMemAlloc" {
            assert!((p - 100.0).abs() < 1e-9, "the baseline is 100 % of itself");
        }
    }
    for dir in ["0->1", "1->0", "both"] {
        assert_eq!(
            r.rows.iter().filter(|x| x.direction == dir).count(),
            4 * n_sizes
        );
    }
    assert!(r.pool_min_pct_of_baseline.is_some());
    assert_eq!(r.checks.len(), 12);
    assert!(r.checks.iter().all(|c| c.check.ok()));
    println!(
        "link: {:?}; pool-block copies reach {:.1} % of the cuMemcpyPeerAsync baseline at {} B",
        r.link,
        r.pool_min_pct_of_baseline.unwrap_or(0.0),
        r.rows.iter().map(|x| x.bytes).max().unwrap_or(0)
    );
}

#[test]
fn two_devices_against_a_fake_driver() {
    against_fake_driver_with(
        &test_name(module_path!(), "two_devices_against_a_fake_driver"),
        &[("FAKE_CUDA_DEVICES", OsString::from("2"))],
        || {
            assert_eq!(cuda::device_count().unwrap(), 2);
            assert_eq!(
                cuda::peer_matrix().unwrap(),
                vec![vec![true, true], vec![true, true]]
            );
            let d1 = cuda::open(1).unwrap();
            assert_eq!(d1.ordinal(), 1);
            assert_ne!(
                d1.context().pci_bus_id().unwrap(),
                cuda::open(0).unwrap().context().pci_bus_id().unwrap()
            );
            drop(d1);
            peer_access_is_enabled_once();
            // Past several 2 MiB pages: the paged pool maps more than one page at once.
            assert_eq!(
                peer_copies_are_exact((24 * MIB + 16 * 1001) as usize),
                Grant::Pages
            );
            bandwidth_rows_are_complete(vec![64 * 1024, MIB]);
            assert_eq!(live(1), 0, "every device allocation freed");
            assert_eq!(live(3), 0, "every stream destroyed");
        },
    );
}

/// A driver that takes cuMemSetAccess only over whole mappings: the peer grant of a block
/// inside a larger mapping falls back to the whole mappings, and the copies stay exact.
#[test]
fn two_devices_with_a_driver_strict_about_access_ranges() {
    against_fake_driver_with(
        &test_name(
            module_path!(),
            "two_devices_with_a_driver_strict_about_access_ranges",
        ),
        &[
            ("FAKE_CUDA_DEVICES", OsString::from("2")),
            ("FAKE_CUDA_WHOLE_MAPPINGS", OsString::from("1")),
        ],
        || {
            assert_eq!(
                peer_copies_are_exact((24 * MIB + 16 * 1001) as usize),
                Grant::Mappings
            );
            assert_eq!(live(1), 0, "every device allocation freed");
        },
    );
}

/// The number of devices, or `None` (with a line saying so) where there are fewer than 2.
fn two_devices() -> Option<usize> {
    let n = cuda::device_count().expect("count");
    if n < 2 {
        println!("skipped: {n} device(s); this test needs 2");
        return None;
    }
    Some(n)
}

#[test]
#[ignore = "needs a CUDA device"]
fn multigpu_peer_access_and_attributes() {
    if two_devices().is_none() {
        return;
    }
    if !cuda::peer_matrix().expect("matrix")[0][1] {
        println!("skipped: devices 0 and 1 cannot access each other");
        return;
    }
    peer_access_is_enabled_once();
}

#[test]
#[ignore = "needs a CUDA device"]
fn multigpu_peer_copies_between_pools_byte_for_byte() {
    if two_devices().is_none() {
        return;
    }
    if !cuda::peer_matrix().expect("matrix")[0][1] {
        println!("skipped: devices 0 and 1 cannot access each other");
        return;
    }
    // An odd number of 16-byte words, past several 2 MiB pages.
    peer_copies_are_exact((64 * MIB + 16 * 1001) as usize);
}

#[test]
#[ignore = "needs a CUDA device"]
fn multigpu_peer_bandwidth_against_the_baseline() {
    if two_devices().is_none() {
        return;
    }
    if !cuda::peer_matrix().expect("matrix")[0][1] {
        println!("skipped: devices 0 and 1 cannot access each other");
        return;
    }
    bandwidth_rows_are_complete(vec![MIB, 256 * MIB]);
}
