//! Replays one trace through one strategy many times in a loop, for a sampling profiler
//! (`perf record`) or callgrind: a short trace replays in about a millisecond, too short to
//! sample once. Prints the median events per second of the replay loops (CPU time of the
//! replaying thread is not read here: wall clock, so run it on an idle core).
//!
//! `cargo run --release -p gpumem-bench --example replay_loop -- TRACE ALLOCATOR [RUNS]`
use std::time::Instant;

use gpumem::core::config::AllocatorConfig;
use gpumem::core::sim::SimDevice;
use gpumem::core::strategy::Strategy;
use gpumem::replay::{self, ReplayConfig};
use gpumem::trace::{read_path, ReadConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(name)) = (args.next(), args.next()) else {
        return Err("usage: replay_loop TRACE ALLOCATOR [RUNS]".into());
    };
    let runs: usize = args.next().map_or(Ok(200), |r| r.parse())?;
    let trace = read_path(std::path::Path::new(&path), ReadConfig::default())?;
    let summary = replay::summarize(&trace, 0);
    let opts = ReplayConfig::default();
    let mut rates = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut a = name.parse::<Strategy>()?.build(&AllocatorConfig::default());
        let mut d = SimDevice::default();
        let t = Instant::now();
        let r =
            replay::replay_summarized(&trace, &summary, a.as_mut(), &mut d, &opts, &mut |_| {})?;
        rates.push(r.events_replayed as f64 / t.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "{name} on {path}: median {:.2} M events/s over {runs} runs (wall clock, including the final validate)",
        rates[runs / 2] / 1e6
    );
    Ok(())
}
