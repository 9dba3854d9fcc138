//! # gpumem
//!
//! GPU memory management on top of the pure algorithms of [`gpumem_core`]:
//! - [`trace`]: readers for PyTorch memory snapshots, RMM logs and gpumem's JSON lines;
//! - [`replay`]: replays a trace through allocators on a simulated (or real) device;
//! - [`torch_replay`]: the PyTorch caching-allocator emulation as PyTorch ran a trace, with
//!   its self-check; [`tune`]: which `PYTORCH_CUDA_ALLOC_CONF` a trace needs least memory with;
//! - [`cuda`]: the CUDA backend (cudarc, loaded at run time);
//! - [`pinned`]: page-locked host memory, a capped caching pool and staged copies;
//! - [`pool`]: the stream-ordered device pools over any device ([`pool::DevicePool`],
//!   [`pool::DirectPool`], one interface [`pool::RawPool`]);
//! - [`vmm`]: the page-table view of a device's VMM calls;
//! - [`measure`]: the median and the thread CPU clock the benchmarks share;
//! - [`units`]: sizes, durations and rates for people; [`plot`]: SVG charts.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod conf_items;
pub mod cuda;
pub mod lazy_conf;
pub mod measure;
pub mod pinned;
pub mod plan;
pub mod plot;
pub mod pool;
pub mod recorded_oom;
pub mod replay;
pub mod report;
pub mod session;
pub mod torch_replay;
pub mod trace;
pub mod tune;
pub mod units;
pub mod vmm;

pub use gpumem_core as core;
