//! The CLI's units are the library's ([`gpumem::units`]); this keeps the old names for the
//! modules that still use them.
pub use gpumem::units::{bytes as human_bytes, parse_size};

/// `n` and `noun`, plural unless `n` is 1: `1 event`, `0 frees`, `2 allocs`.
pub fn counted(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}
