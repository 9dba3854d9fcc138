//! Without a CUDA driver (forced here with GPUMEM_NO_CUDA, so it holds on any machine), the
//! CUDA and pinned entry points return a clear error, and never panic.
//! Runs in a child process (the presence check is answered once per process).
use gpumem::cuda::CudaContext;
use gpumem::cuda::{self, CudaError};
use gpumem::pinned::{PinnedPool, PinnedPoolConfig};

use crate::support::{in_child, run_in_child, test_name};

#[test]
fn no_driver_is_a_clear_error_not_a_panic() {
    if !in_child() {
        run_in_child(
            &test_name(module_path!(), "no_driver_is_a_clear_error_not_a_panic"),
            &[("GPUMEM_NO_CUDA", "1".into())],
            &[],
        );
        return;
    }
    assert!(!cuda::driver_present());
    // Pinned memory honours it too (it used its own presence check once): no context, and
    // the pool falls back to mlock.
    assert!(matches!(
        CudaContext::new(0),
        Err(CudaError::NoDriver { .. })
    ));
    assert!(!PinnedPool::new(PinnedPoolConfig::auto(0)).is_cuda());
    for r in [
        cuda::device_count().map(|_| ()),
        cuda::open(0).map(|_| ()),
        cuda::devices().map(|_| ()),
    ] {
        let e = r.expect_err("no driver");
        let CudaError::NoDriver { searched } = &e else {
            panic!("expected NoDriver, got {e:?}");
        };
        // GPUMEM_NO_CUDA turned the probe off: nothing was searched.
        assert!(searched.is_empty(), "{searched:?}");
        assert_eq!(
            e.to_string(),
            "no NVIDIA driver (libcuda.so.1) found; use the simulated device: --device sim"
        );
    }
    assert!(cuda::peer_matrix().is_err());
    assert!(cuda::DeviceSel::All.ordinals().is_err());
}
