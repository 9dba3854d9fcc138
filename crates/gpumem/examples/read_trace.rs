//! Reads a trace and prints how fast: `cargo run --release --example read_trace -- FILE [--frames]`.
//!
//! The file is read into memory first, so the figure is the reader's own speed (MB/s of the
//! inflated bytes).
use gpumem::trace::{read_bytes, ReadConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: read_trace FILE [--frames]")?;
    let keep_frames = args.any(|a| a == "--frames");
    let bytes = std::fs::read(&path)?;
    let config = ReadConfig {
        keep_frames,
        ..ReadConfig::default()
    };
    let mut best = f64::MAX;
    let mut summary = String::new();
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let trace = read_bytes(&path, &bytes, config)?;
        best = best.min(started.elapsed().as_secs_f64());
        summary = format!(
            "{} events, {} distinct stacks, {} frames, {} names",
            trace.events.len(),
            trace.stacks.len(),
            trace.stacks.frame_table.len(),
            trace.stacks.strings.len()
        );
    }
    println!(
        "{path}: {:.1} MB in {best:.3} s = {:.0} MB/s (best of 3, keep_frames {keep_frames}); {summary}",
        bytes.len() as f64 / 1e6,
        bytes.len() as f64 / 1e6 / best
    );
    Ok(())
}
