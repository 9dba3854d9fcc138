//! State analysis of a snapshot that holds segments but no trace: per-segment fragmentation,
//! inactive split blocks and the largest free block, from the snapshot's `segments`.
use anyhow::{bail, Result};
use gpumem::trace::analysis::analyze;
use gpumem::trace::Trace;

use gpumem::units::bytes as human_bytes;

/// Prints the state analysis of `trace.segments` (table, or JSON with `json`). A PyTorch
/// snapshot with no segments and no trace (recording was never enabled) is an error that says
/// so, and how to record one (with `json`, the JSON explanation is printed first).
pub fn print_state(path: &std::path::Path, trace: &Trace, json: bool) -> Result<()> {
    if trace.skipped_count > 0 && trace.segments.is_empty() {
        // Not an empty recording: what was there was malformed.
        crate::output::print_read_notes(trace);
        bail!(
            "{}: nothing to replay: {}",
            gpumem::trace::source_name(path),
            gpumem::session::why_no_allocation(trace)
        );
    }
    if trace.segments.is_empty() && trace.format == Some(gpumem::trace::Format::TorchSnapshot) {
        let explanation = format!(
            "the snapshot holds no segments and no trace entries: memory history was not being \
             recorded when it was dumped; {}",
            gpumem::session::HOW_TO_RECORD
        );
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "trace": { "path": path.display().to_string(), "format": trace.format, "events": trace.events.len() },
                    "recording": "empty",
                    "explanation": explanation,
                }))?
            );
            bail!(
                "{}: the snapshot holds no segments and no trace entries: nothing to replay (the JSON above says how to record one)",
                gpumem::trace::source_name(path)
            );
        }
        bail!("{}: {explanation}", gpumem::trace::source_name(path));
    }
    if trace.segments.is_empty() {
        bail!(
            "{}: the file is a valid trace but holds no alloc/free events and no segments: nothing to replay or analyse",
            gpumem::trace::source_name(path)
        );
    }
    let a = analyze(&trace.segments);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "trace": { "path": path.display().to_string(), "format": trace.format, "events": trace.events.len() },
                "state": a,
            }))?
        );
        return Ok(());
    }
    let t = &a.totals;
    println!(
        "{}: no alloc/free events to replay; state of the {} the snapshot recorded:",
        gpumem::trace::source_name(path),
        crate::units::counted(t.segments as u64, "segment")
    );
    println!(
        "reserved {}, allocated {}, requested {}, free {} (largest free block {}, external fragmentation {:.3})",
        human_bytes(t.reserved_bytes),
        human_bytes(t.allocated_bytes),
        human_bytes(t.requested_bytes),
        human_bytes(t.free_bytes),
        human_bytes(t.largest_free_bytes),
        t.external_fragmentation
    );
    println!(
        "{}, {} active, {} holding {}",
        crate::units::counted(t.blocks as u64, "block"),
        t.active_blocks,
        crate::units::counted(t.inactive_split_blocks as u64, "inactive split block"),
        human_bytes(t.inactive_split_bytes)
    );
    println!();
    println!(
        "{:>3} {:>16} {:<6} {:>11} {:>11} {:>11} {:>11} {:>8} {:>7} {:>14}",
        "dev",
        "address",
        "pool",
        "size",
        "allocated",
        "free",
        "largest",
        "ext.frag",
        "blocks",
        "inactive split"
    );
    let mut segs: Vec<_> = a.segments.iter().collect();
    segs.sort_by(|x, y| {
        y.free_bytes
            .cmp(&x.free_bytes)
            .then(x.address.cmp(&y.address))
    });
    let shown = segs.len().min(30);
    for s in &segs[..shown] {
        println!(
            "{:>3} {:>#16x} {:<6} {:>11} {:>11} {:>11} {:>11} {:>8.3} {:>7} {:>14}",
            s.device,
            s.address,
            s.segment_type,
            human_bytes(s.size_bytes),
            human_bytes(s.allocated_bytes),
            human_bytes(s.free_bytes),
            human_bytes(s.largest_free_bytes),
            s.external_fragmentation,
            s.blocks,
            format!(
                "{} ({})",
                s.inactive_split_blocks,
                human_bytes(s.inactive_split_bytes)
            ),
        );
    }
    if segs.len() > shown {
        println!(
            "... {} more segments (sorted by free bytes; --json lists all)",
            segs.len() - shown
        );
    }
    Ok(())
}
