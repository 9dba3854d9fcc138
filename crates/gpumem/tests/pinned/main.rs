//! Pinned host memory's tests, in one binary: the pool and the staging ring without CUDA,
//! the CUDA paths against the fake driver (`fake_driver`), and on a real GPU (`device`:
//! ignored as "needs a CUDA device", run by scripts/gpu-check.sh).
mod device;
mod fake_driver;
mod pool;
mod staging;
#[path = "../support/fakecuda.rs"]
mod support;
