//! The CLI's units are the library's ([`gpumem::units`]); this keeps the old names for the
//! modules that still use them.
pub use gpumem::units::{bytes as human_bytes, parse_positive_size};

/// "yes" or "no", for tables.
pub fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// `n` and `noun`, plural unless `n` is 1: `1 event`, `0 frees`, `2 allocs`.
pub fn counted(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
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

/// A whole number of at least `min` for a flag that counts or numbers something (`what`: `an
/// event index`, `repeats`): a negative number, a fraction or a word is refused saying what
/// was expected. Flags that use it take hyphen values, so that `-1` reaches it: clap took
/// `--event -1` for an unknown flag `-1` and suggested `-- -1`.
///
/// # Errors
/// Anything but a whole number from `min` to `T`'s largest.
pub fn whole_number<T: TryFrom<u64>>(s: &str, min: u64, what: &str) -> Result<T, String> {
    let expected = || {
        if min == 0 {
            format!("`{s}`: expected {what} (a whole number)")
        } else {
            format!("`{s}`: expected {what} (a whole number ≥ {min})")
        }
    };
    let t = s.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(expected());
    }
    match t
        .parse::<u64>()
        .ok()
        .and_then(|n| T::try_from(n).ok().map(|v| (n, v)))
    {
        Some((n, _)) if n < min => Err(expected()),
        Some((_, v)) => Ok(v),
        None => Err(format!("`{s}`: too large for {what}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_say_what_was_expected() {
        assert_eq!(whole_number::<u64>("12", 0, "an event index"), Ok(12));
        assert_eq!(whole_number::<u32>(" 7 ", 1, "repeats"), Ok(7));
        assert_eq!(
            whole_number::<u64>("-1", 0, "an event index"),
            Err("`-1`: expected an event index (a whole number)".to_string())
        );
        assert_eq!(
            whole_number::<usize>("0", 1, "repeats"),
            Err("`0`: expected repeats (a whole number ≥ 1)".to_string())
        );
        assert_eq!(
            whole_number::<u64>("1.5", 1, "repeats"),
            Err("`1.5`: expected repeats (a whole number ≥ 1)".to_string())
        );
        assert_eq!(
            whole_number::<u32>("4294967296", 0, "a device ordinal"),
            Err("`4294967296`: too large for a device ordinal".to_string())
        );
        assert_eq!(
            whole_number::<u64>("99999999999999999999", 0, "an event index"),
            Err("`99999999999999999999`: too large for an event index".to_string())
        );
    }
}
