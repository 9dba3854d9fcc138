//! `gpumem bench alloc`, `bench transfer`, `bench pinned`: one file (or folder) per
//! subcommand; what they share is here.

pub mod alloc;
pub mod pinned;
pub mod transfer;

/// When a table was measured, for its `source` line.
pub(crate) fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("unix time {secs}")
}
