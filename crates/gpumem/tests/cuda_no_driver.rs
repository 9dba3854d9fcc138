//! Without a CUDA driver (forced here with GPUMEM_NO_CUDA, so it holds on any machine), the
//! CUDA entry points return a clear error naming what was searched, and never panic.
use gpumem::cuda::{self, CudaError};

#[test]
fn no_driver_is_a_clear_error_not_a_panic() {
    std::env::set_var("GPUMEM_NO_CUDA", "1");
    assert!(!cuda::driver_present());
    for r in [
        cuda::device_count().map(|_| ()),
        cuda::open(0).map(|_| ()),
        cuda::devices().map(|_| ()),
    ] {
        let e = r.expect_err("no driver");
        let CudaError::NoDriver { searched } = &e else {
            panic!("expected NoDriver, got {e:?}");
        };
        assert!(searched.iter().any(|s| s == "libcuda.so"), "{searched:?}");
        let msg = e.to_string();
        assert!(
            msg.starts_with("no CUDA driver found (searched libcuda.so"),
            "{msg}"
        );
        assert!(
            msg.ends_with("; use the simulated device: --device sim"),
            "{msg}"
        );
    }
    assert!(cuda::peer_matrix().is_err());
    assert!(cuda::DeviceSel::All.ordinals().is_err());
}
