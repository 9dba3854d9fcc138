//! The C ABI with the default strategy, `paged-lazy`, against the simulated device: a
//! training step repeated through `gpumem_malloc` / `gpumem_free` reaches a steady state
//! without driver calls and with a flat reserved figure, from several threads at once (one
//! device each). A process of its own: the plug-in is configured once per process.
use std::ffi::{c_void, CString};

mod common;
use common::{get, stats};
use gpumem_torch::*;

/// One step: activations of a forward pass (some temporaries die early), then the backward
/// pass frees them in reverse, on the device's main stream (a null stream, as PyTorch's
/// default stream).
fn step(device: i32, sizes: &[isize]) {
    let mut live: Vec<(u64, isize)> = Vec::new();
    for (i, &s) in sizes.iter().enumerate() {
        let p = gpumem_malloc(s, device, std::ptr::null_mut()) as u64;
        assert_ne!(p, 0, "malloc({s}) on device {device}");
        live.push((p, s));
        if i % 4 == 3 {
            let (p, s) = live.remove(live.len() / 2);
            gpumem_free(p as *mut c_void, s, device, std::ptr::null_mut());
        }
    }
    while let Some((p, s)) = live.pop() {
        gpumem_free(p as *mut c_void, s, device, std::ptr::null_mut());
    }
}

#[test]
fn a_repeated_step_settles_without_driver_calls_on_every_thread() {
    // No strategy named: the default is paged-lazy.
    let c = CString::new("backend=sim,sim_capacity=8GiB,reserve=0").unwrap();
    // SAFETY: a valid NUL-terminated string.
    assert_eq!(unsafe { gpumem_configure(c.as_ptr()) }, CONF_OK);
    let threads: Vec<_> = (0..3i32)
        .map(|device| {
            std::thread::spawn(move || {
                let sizes: Vec<isize> = (0..48isize)
                    .map(|i| match i % 4 {
                        0 => 768 * (i + 1),
                        1 => (2 << 20) + 4096 * i,
                        2 => 48 << 20,
                        _ => (96 << 20) + 512 * i * (device as isize + 1),
                    })
                    .collect();
                let params = gpumem_malloc(500 << 20, device, std::ptr::null_mut()) as u64;
                assert_ne!(params, 0);
                for _ in 0..3 {
                    step(device, &sizes);
                }
                let s = stats(device);
                assert_eq!(s["strategy"], "paged-lazy");
                let (calls, reserved) = (
                    get(&s, "driver_calls.total"),
                    get(&s, "reserved_bytes.all.peak"),
                );
                for k in 4..=12 {
                    step(device, &sizes);
                    let s = stats(device);
                    assert_eq!(
                        get(&s, "driver_calls.total"),
                        calls,
                        "step {k}, device {device}"
                    );
                    assert_eq!(get(&s, "reserved_bytes.all.peak"), reserved, "step {k}");
                }
                assert_eq!(gpumem_validate(), 0);
                gpumem_free(
                    params as *mut c_void,
                    500 << 20,
                    device,
                    std::ptr::null_mut(),
                );
                let s = stats(device);
                assert_eq!(get(&s, "live_blocks"), 0);
                assert!(
                    reserved <= get(&s, "allocated_bytes.all.peak") * 11 / 10,
                    "reserved peak {reserved} B"
                );
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
