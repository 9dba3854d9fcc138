//! The CUDA backend's tests, in one binary: on the simulated device (`pool_sim`), against the
//! fake driver (`fake_driver`), without a driver (`no_driver`), and on a real GPU (`device`:
//! ignored as "needs a CUDA device", run by scripts/gpu-check.sh), and with two devices
//! (`multigpu`: against the fake driver with two devices, and on two GPUs).
mod common;
mod device;
mod fake_driver;
mod multigpu;
mod no_driver;
mod pool_sim;
#[path = "../support/fakecuda.rs"]
mod support;
