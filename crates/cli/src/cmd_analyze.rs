//! State analysis of a snapshot that holds segments but no trace. (Filled in once the readers land.)
use anyhow::{bail, Result};
use gpumem::trace::Trace;

pub fn print_state(path: &std::path::Path, trace: &Trace, _json: bool) -> Result<()> {
    bail!(
        "{}: no alloc or free events and {} recorded segments; state analysis not available yet",
        path.display(),
        trace.segments.len()
    )
}
