//! Replays a trace through the plug-in's entry points on the simulated device and prints the
//! figures PyTorch users would read: how the plug-in's settings (`GPUMEM_CONF`) change peak
//! reserved memory before a GPU run.
//!
//! ```text
//! cargo run --release -p gpumem-torch --example replay_sim -- traces/gpt2_train.pickle.gz "strategy=paged"
//! ```
use std::collections::HashMap;

use gpumem::trace::{read_path, Action, ReadConfig};
use gpumem_torch::conf::{parse_strict, Backend};
use gpumem_torch::state::Plugin;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: replay_sim TRACE [GPUMEM_CONF]")?;
    let mut conf = parse_strict(&args.next().unwrap_or_default())?;
    conf.backend = Backend::Sim;
    let trace = read_path(path.as_ref(), ReadConfig::default())?;
    let plugin = Plugin::new(conf, false);
    let mut addr_of: HashMap<u64, u64> = HashMap::new();
    let (mut peak_req, mut req) = (0u64, 0u64);
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    let t = std::time::Instant::now();
    for p in &trace.preexisting {
        if let Some(a) = plugin.malloc(p.size_bytes as i64, 0, 0) {
            addr_of.insert(p.addr, a);
            sizes.insert(p.addr, p.size_bytes);
            req += p.size_bytes;
        }
    }
    for e in &trace.events {
        match e.action {
            Action::Alloc => {
                if let Some(a) = plugin.malloc(e.size_bytes as i64, 0, e.stream) {
                    addr_of.insert(e.addr, a);
                    sizes.insert(e.addr, e.size_bytes);
                    req += e.size_bytes;
                    peak_req = peak_req.max(req);
                }
            }
            Action::Free => {
                if let Some(a) = addr_of.remove(&e.addr) {
                    req -= sizes.remove(&e.addr).unwrap_or(0);
                    plugin.free(a, e.size_bytes as i64, 0, e.stream);
                }
            }
            _ => {}
        }
    }
    let s = plugin.stats_json(0);
    let reserved = s["reserved_bytes.all.peak"].as_u64().unwrap_or(0);
    println!(
        "{path}: {} events in {:.2?}; peak requested {} B, peak allocated {} B, peak reserved {} B ({:.4} x requested), driver calls {} (modelled H200 time {:.3} s), ooms {}",
        trace.events.len(),
        t.elapsed(),
        peak_req,
        s["allocated_bytes.all.peak"],
        reserved,
        reserved as f64 / peak_req.max(1) as f64,
        s["driver_calls.total"],
        s["driver_seconds"].as_f64().unwrap_or(0.0),
        s["num_ooms"],
    );
    Ok(())
}
