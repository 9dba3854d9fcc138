//! Integration tests that need no GPU, in one binary (one link instead of seven): the trace
//! readers, the replay engine, the models checked against recorded figures (the torch
//! emulation's fidelity, the driver-cost model, paged's targets) and the report.
//!
//! Run one group with `cargo test -p gpumem --test trace readers::` (or `replay::`,
//! `torch_fidelity::`, `cost_model::`, `paged_targets::`, `lazy_steady::`, `map_golden::`,
//! `report_html::`).
mod cost_model;
mod lazy_steady;
mod map_golden;
mod paged_targets;
mod readers;
mod replay;
mod report_html;
mod torch_fidelity;
