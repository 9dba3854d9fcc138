//! Human sizes on the command line (`8GiB`, `256MiB`, `1.5GB`) and in tables.

/// Parses a size with an optional unit: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB
/// (powers of 1024), K/M/G/T (taken as binary, like PyTorch and nvidia-smi).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
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
                "`{s}`: unknown unit `{other}` (expected B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"
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
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return Err(format!("`{s}`: out of range"));
    }
    Ok(v.round() as u64)
}

/// Formats bytes with a binary unit: `1.50 GiB`, `256.0 MiB`, `512 B`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v >= 100.0 {
        format!("{v:.1} {}", UNITS[i])
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
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
        assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
    }

    #[test]
    fn formats_bytes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(256 << 20), "256.0 MiB");
    }
}
