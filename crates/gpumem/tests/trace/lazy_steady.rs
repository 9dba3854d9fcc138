//! `paged-lazy` in a real training loop: the first 200 steps of the plug-in's soak (a small
//! GPT-2, 2 layers, 256 wide, AdamW, bf16, nine batch × sequence shapes drawn at random each
//! step), recorded on the H200 through `libgpumem_torch.so` with
//! `scripts/bench/torch-compare.py --soak --soak-strategy paged-lazy --soak-record` (2026-11-30),
//! first 110,000 events: `tests/fixtures/soak_gpt2_200_steps.jsonl.gz`.
//!
//! Issue 11's test: a repeated training step makes no driver call once the first steps have
//! mapped its pages, and the peak stays bounded; `paged` (eager unmapping) on the same trace
//! calls the driver all the way through.
use std::path::PathBuf;

use gpumem::core::config::AllocatorConfig;
use gpumem::core::sim::SimDevice;
use gpumem::core::strategy::Strategy;
use gpumem::replay::{self, ReplayConfig};
use gpumem::trace::{read_path, ReadConfig};

fn soak() -> gpumem::trace::Trace {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/soak_gpt2_200_steps.jsonl.gz");
    read_path(&p, ReadConfig::default()).unwrap()
}

fn run(name: &str, t: &gpumem::trace::Trace) -> replay::ReplayReport {
    let mut a = name
        .parse::<Strategy>()
        .unwrap()
        .build(&AllocatorConfig::default());
    let mut d = SimDevice::default();
    replay::replay(t, a.as_mut(), &mut d, &ReplayConfig::default(), &mut |_| {}).unwrap()
}

#[test]
fn no_driver_call_in_the_second_half_of_a_recorded_training_loop() {
    let t = soak();
    let lazy = run("paged-lazy", &t);
    let eager = run("paged", &t);
    assert_eq!(lazy.steady_state_driver_calls, 0, "paged-lazy, second half");
    assert!(lazy.driver_calls.total() > 0, "the first steps map pages");
    assert!(
        eager.steady_state_driver_calls > 1000,
        "paged unmaps as it goes: {}",
        eager.steady_state_driver_calls
    );
    // The memory traded: 780 MiB for 686 MiB requested (1.137, as PyTorch's
    // expandable_segments; the page placement 1.134, paged 1.017, the torch emulation 1.265).
    let ratio = lazy.peak_reserved_bytes as f64 / lazy.peak_requested_bytes as f64;
    assert!(ratio < 1.15, "paged-lazy res/req {ratio:.4}");
    let torch = run("torch", &t);
    assert!(lazy.peak_reserved_bytes < torch.peak_reserved_bytes);
}
