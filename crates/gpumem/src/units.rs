//! Units for people: sizes in and out (`8GiB`, `1.50 GiB`), durations (`4.55 µs`) and rates
//! (`12.3 M`), in one place for every command. Machines get plain numbers (`--json`).
//!
//! Sizes on the command line take B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers
//! of 1024), or K/M/G/T (binary, like PyTorch and nvidia-smi). Sizes printed are binary.

use gpumem_core::units::BINARY_UNITS;

/// Parses a size with an optional unit (see the module docs): `8GiB`, `256MiB`, `1.5GB`,
/// `4096`, `2g`; `_` may group digits.
///
/// # Errors
/// A message naming the text and what was expected: a negative size, no number, an unknown
/// unit, or a value past `u64`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_size_from(s, "≥ 0")
}

/// [`parse_size`] for a size that must be above zero (a capacity, a segment size, the sizes
/// of a sweep): a negative size is refused as needing `> 0`. A 0 is still read; the caller
/// refuses it, naming its flag.
///
/// # Errors
/// As [`parse_size`].
pub fn parse_positive_size(s: &str) -> Result<u64, String> {
    parse_size_from(s, "> 0")
}

/// [`parse_size`], a negative size refused as needing `bound` (`≥ 0`, `> 0`).
fn parse_size_from(s: &str, bound: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.strip_prefix('-')
        .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit() || c == '.'))
    {
        return Err(format!(
            "`{s}`: expected a size {bound}, such as 8GiB, 256MiB, 1.5GB or 4096"
        ));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    if num.is_empty() {
        return Err(format!(
            "`{s}`: expected a size such as 8GiB, 256MiB, 1.5GB or 4096"
        ));
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "`{s}`: unknown unit `{other}` (expected B, K or KiB, M or MiB, G or GiB, T or TiB, KB, MB, GB or TB)"
            ))
        }
    };
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| format!("`{s}`: too large"));
    }
    let f: f64 = num
        .parse()
        .map_err(|_| format!("`{s}`: `{num}` is not a number"))?;
    let v = f * mult as f64;
    if !v.is_finite() || v < 0.0 || v >= u64::MAX as f64 {
        return Err(format!("`{s}`: out of range"));
    }
    Ok(v.round() as u64)
}

/// Parses a comma-separated list of sizes, in the order given (empty items skipped).
///
/// # Errors
/// The first item [`parse_size`] refuses.
pub fn parse_size_list(s: &str) -> Result<Vec<u64>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(parse_size)
        .collect()
}

/// Parses a comma-separated list of sizes into a sorted set without duplicates, each > 0
/// (for sweeps over sizes).
///
/// # Errors
/// The first item [`parse_positive_size`] refuses, an empty list, or a size of 0.
pub fn parse_size_set(s: &str) -> Result<Vec<u64>, String> {
    let mut v: Vec<u64> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(parse_positive_size)
        .collect::<Result<_, _>>()?;
    if v.is_empty() || v.contains(&0) {
        return Err(format!("`{s}`: give sizes > 0, separated by commas"));
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// Bytes with a binary unit and three significant digits, for tables: `512 B`, `1.50 KiB`,
/// `256.0 MiB` (the algorithms' error messages print sizes with the same function,
/// [`gpumem_core::units::bytes`]).
pub fn bytes(b: u64) -> String {
    gpumem_core::units::bytes(b)
}

/// [`bytes`], then the exact count of bytes, grouped by three: `3.07 GiB (3,298,534,883 B)`
/// (`512 B` below 1 KiB), for messages that must not round (an out-of-memory request).
pub fn bytes_exact(b: u64) -> String {
    gpumem_core::units::bytes_exact(b)
}

/// Bytes with a binary unit, whole numbers without decimals, for sizes that are usually
/// powers of two (pages, benchmark cases): `2 MiB`, `512 B`, `1.5 MiB`.
pub fn bytes_compact(b: u64) -> String {
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < BINARY_UNITS.len() - 2 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", BINARY_UNITS[i])
    } else {
        format!("{v:.1} {}", BINARY_UNITS[i])
    }
}

/// A duration in seconds with the unit that keeps it readable: `1.25 s`, `3.500 ms`,
/// `4.550 µs`, `33 ns`. Not finite or negative: `-`.
pub fn duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        "-".to_string()
    } else if secs >= 1.0 {
        format!("{secs:.2} s")
    } else if secs >= 1e-3 {
        format!("{:.3} ms", secs * 1e3)
    } else if secs >= 1e-6 {
        format!("{:.3} µs", secs * 1e6)
    } else {
        format!("{:.0} ns", secs * 1e9)
    }
}

/// A count per second with a decimal prefix: `12.3 M`, `4.5 k`, `900` (append the unit:
/// `events/s`).
pub fn rate(per_s: f64) -> String {
    if per_s >= 1e6 {
        format!("{:.1} M", per_s / 1e6)
    } else if per_s >= 1e3 {
        format!("{:.1} k", per_s / 1e3)
    } else {
        format!("{per_s:.0}")
    }
}

/// A transfer rate in decimal gigabytes per second (what link specifications use):
/// `55.5 GB/s`.
pub fn gbps(bytes_per_s: f64) -> String {
    format!("{:.1} GB/s", bytes_per_s / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1_024"), Ok(1024));
        assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("-1")
            .unwrap_err()
            .contains("expected a size ≥ 0"));
        assert!(parse_size("-2GiB")
            .unwrap_err()
            .contains("expected a size ≥ 0"));
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
        // 2^64 as a fraction is past u64 (u64::MAX as f64 rounds up to it).
        assert!(parse_size("16777216.0TiB").is_err());
    }

    #[test]
    fn parses_lists_and_sets() {
        assert_eq!(parse_size_list("4KiB, 1KiB,,2"), Ok(vec![4096, 1024, 2]));
        assert_eq!(parse_size_set("4KiB,1KiB,4096"), Ok(vec![1024, 4096]));
        assert!(parse_size_set("0,4KiB").is_err());
        assert!(parse_size_set(",").is_err());
        assert!(parse_size_list("4KiB,x").is_err());
    }

    #[test]
    fn formats_bytes() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(256 << 20), "256.0 MiB");
        assert_eq!(bytes_compact(2 << 20), "2 MiB");
        assert_eq!(bytes_compact(512), "512 B");
        assert_eq!(bytes_compact(3 << 19), "1.5 MiB");
        assert_eq!(bytes_compact(1 << 40), "1 TiB");
    }

    #[test]
    fn formats_durations_and_rates() {
        assert_eq!(duration(1.25), "1.25 s");
        assert_eq!(duration(0.0035), "3.500 ms");
        assert_eq!(duration(4.55e-6), "4.550 µs");
        assert_eq!(duration(33e-9), "33 ns");
        assert_eq!(duration(f64::NAN), "-");
        assert_eq!(rate(12_340_000.0), "12.3 M");
        assert_eq!(rate(4_500.0), "4.5 k");
        assert_eq!(rate(900.0), "900");
        assert_eq!(gbps(55.5e9), "55.5 GB/s");
    }
}
