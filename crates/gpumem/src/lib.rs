//! # gpumem
//!
//! GPU memory management on top of the pure algorithms of [`gpumem_core`]:
//! - [`trace`]: readers for PyTorch memory snapshots, RMM logs and gpumem's JSON lines;
//! - [`replay`]: replays a trace through allocators on a simulated (or real) device;
//! - [`cuda`]: the CUDA backend (cudarc, loaded at run time);
//! - [`pinned`]: page-locked host memory, a capped caching pool and staged copies.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod cuda;
pub mod pinned;
pub mod plot;
pub mod recorded_oom;
pub mod replay;
pub mod trace;

pub use gpumem_core as core;
pub use gpumem_core::sim::SimDevice;
