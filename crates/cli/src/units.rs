//! The CLI's units are the library's ([`gpumem::units`]); this keeps the old names for the
//! modules that still use them.
pub use gpumem::units::{bytes as human_bytes, parse_size};

/// `n` and `noun`, plural unless `n` is 1: `1 event`, `0 frees`, `2 allocs`.
pub fn counted(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// A size that must be above zero (a capacity, a segment size): [`parse_size`], whose refusal
/// of a negative size then says `> 0` (a 0 is refused by the command, naming the flag).
///
/// # Errors
/// As [`parse_size`].
pub fn parse_positive_size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.replace("expected a size ≥ 0", "expected a size > 0"))
}

/// A comma-separated list of sizes with at least one ([`gpumem::units::parse_size_list`]),
/// for a flag whose empty list would leave the command nothing to do.
///
/// # Errors
/// As [`gpumem::units::parse_size_list`], and a list with no size (`""`, `","`).
pub fn parse_size_list_nonempty(s: &str) -> Result<Vec<u64>, String> {
    let v = gpumem::units::parse_size_list(s)?;
    if v.is_empty() {
        return Err(format!(
            "`{s}`: expected at least one size, separated by commas (e.g. 256,64KiB,3MiB)"
        ));
    }
    Ok(v)
}
