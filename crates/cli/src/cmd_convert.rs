//! `gpumem convert`: any trace to gpumem JSON lines.
use std::path::PathBuf;

use anyhow::{bail, Result};
use gpumem::trace::{self, Action, PreexistingBlock, ReadConfig, Trace};

/// Arguments of `gpumem convert`.
#[derive(clap::Args)]
pub struct ConvertArgs {
    /// The trace to read (format detected from the content; `-` reads standard input).
    pub trace: PathBuf,
    /// Where to write the JSON lines (`-` for standard output). Written to a temporary file
    /// beside it and renamed, so a failed run leaves no half-written file; the input itself is
    /// refused as output.
    #[arg(long, short, default_value = "-")]
    pub output: String,
    /// Skip and count malformed events instead of stopping at the first; salvage a truncated
    /// snapshot.
    #[arg(long)]
    pub lenient: bool,
}

pub fn run(a: ConvertArgs) -> Result<()> {
    let output = (a.output != "-").then(|| PathBuf::from(&a.output));
    if let Some(out) = &output {
        crate::output::check("-o", out, &[&a.trace])?;
    }
    let mut trace = trace::read_path(
        &a.trace,
        ReadConfig {
            lenient: a.lenient,
            ..ReadConfig::default()
        },
    )?;
    crate::output::print_read_notes(&trace);
    let has_blocks = trace
        .events
        .iter()
        .any(|e| matches!(e.action, Action::Alloc | Action::Free));
    let mut from_state = 0;
    if !has_blocks && trace.preexisting.is_empty() {
        if trace.segments.is_empty() {
            bail!(
                "{}: nothing to convert: {}",
                trace::source_name(&a.trace),
                gpumem::session::why_no_allocation(&trace)
            );
        }
        // A snapshot of the allocator's state without a trace: its allocated blocks are what
        // an allocator must hold, so they become `preexisting` lines.
        trace.preexisting = state_as_preexisting(&trace);
        from_state = trace.preexisting.len();
        if from_state == 0 {
            bail!(
                "{}: the snapshot holds {} segments but no allocated block and no trace: nothing to replay (`gpumem replay` shows the segments' state)",
                trace::source_name(&a.trace),
                trace.segments.len()
            );
        }
    }
    let note = if from_state > 0 {
        format!(
            " (no trace in the snapshot: its {from_state} allocated blocks written as preexisting)"
        )
    } else {
        String::new()
    };
    // What JSON lines cannot carry, and a replay of the snapshot uses.
    let mut lost = Vec::new();
    if let Some(conf) = gpumem::session::recorded_conf(&trace)?
        .map(|c| c.to_string())
        .filter(|c| c != "native")
    {
        lost.push(format!(
            "the snapshot's allocator setting (PYTORCH_CUDA_ALLOC_CONF {conf}: give --torch-conf '{conf}' to replay it; the torch emulation of the output runs native)"
        ));
    }
    let segments: usize = gpumem::replay::devices(&trace)
        .iter()
        .map(|&d| gpumem::replay::preexisting_segments(&trace, d).len())
        .sum();
    if segments > 0 {
        lost.push(format!(
            "the {} made before recording began, which the torch emulation of the snapshot starts from (its blocks stay, as preexisting lines)",
            crate::units::counted(segments as u64, "segment")
        ));
    }
    if !lost.is_empty() {
        eprintln!("note: JSON lines do not keep {}", lost.join(", nor "));
    }
    match &output {
        None => {
            trace::jsonl::write_jsonl(&trace, std::io::stdout().lock())?;
        }
        Some(out) => {
            crate::output::write(out, |f| Ok(trace::jsonl::write_jsonl(&trace, f)?))?;
            eprintln!(
                "wrote {} and {} to {}{}{note}",
                crate::units::counted(trace.events.len() as u64, "event"),
                crate::units::counted(trace.preexisting.len() as u64, "pre-existing block"),
                out.display(),
                if trace.skipped_count > 0 {
                    format!(
                        " ({} bad event{} skipped)",
                        trace.skipped_count,
                        if trace.skipped_count == 1 { "" } else { "s" }
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}

/// The blocks a snapshot's segments show allocated (`active_*`), as pre-existing blocks live
/// throughout: the requested bytes when recorded, else the block size.
fn state_as_preexisting(trace: &Trace) -> Vec<PreexistingBlock> {
    trace
        .segments
        .iter()
        .flat_map(|s| {
            s.blocks
                .iter()
                .filter(|b| b.state.starts_with("active"))
                .map(move |b| b.as_preexisting(s.device))
        })
        .collect()
}
