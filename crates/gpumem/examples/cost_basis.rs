//! Replays a trace on the simulated device and prints, per driver call kind, the sums the
//! cost model is linear in (`SimDevice::cost_basis`): one JSON line
//! `{"trace", "allocator", "lazy_conf", "sim": {kind: {calls, isolated_seconds,
//! isolated_seconds_x_mappings}}}`. `scripts/fit/fit-cost-model.py` joins these lines with real
//! replays on the H200 to refit the model.
//!
//! Usage: `cargo run --release --example cost_basis -- TRACE ALLOCATOR [LAZY_CONF]`
//! (`LAZY_CONF` as `gpumem replay --lazy-conf`, e.g. `placement=pages`).
use gpumem::core::config::AllocatorConfig;
use gpumem::core::sim::SimDevice;
use gpumem::core::strategy::Strategy;
use gpumem::core::DriverCall;
use gpumem::replay::{self, ReplayConfig};
use gpumem::trace::{read_path, ReadConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: cost_basis TRACE ALLOCATOR [LAZY_CONF]";
    let path = args.next().ok_or(usage)?;
    let name = args.next().ok_or(usage)?;
    let lazy = args.next().unwrap_or_default();
    let config = AllocatorConfig {
        lazy: gpumem::lazy_conf::parse(&lazy).map_err(|e| format!("LAZY_CONF: {e}"))?,
        ..AllocatorConfig::default()
    };
    let trace = read_path(std::path::Path::new(&path), ReadConfig::default())?;
    let mut alloc = name.parse::<Strategy>()?.build(&config);
    let mut dev = SimDevice::default();
    replay::replay(
        &trace,
        alloc.as_mut(),
        &mut dev,
        &ReplayConfig::default(),
        &mut |_| {},
    )?;
    let basis = dev.cost_basis();
    let sim: serde_json::Map<String, serde_json::Value> = DriverCall::ALL
        .into_iter()
        .zip(basis)
        .filter(|(_, b)| b.calls > 0)
        .map(|(c, b)| (c.short_name().to_string(), serde_json::json!(b)))
        .collect();
    let stem = std::path::Path::new(&path)
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or(&path)
        .split('.')
        .next()
        .unwrap_or_default()
        .to_string();
    println!(
        "{}",
        serde_json::json!({"trace": stem, "allocator": name, "lazy_conf": lazy, "sim": sim})
    );
    Ok(())
}
