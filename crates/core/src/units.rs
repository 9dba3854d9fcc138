//! Sizes for people, in the messages of the algorithms' errors: binary units with three
//! significant digits ([`bytes`]: `1.50 KiB`, `256.0 MiB`), and with the exact byte count
//! beside them where a message must not round ([`bytes_exact`]: `3.07 GiB (3,298,534,883 B)`).
//! The `gpumem` crate prints every size of its tables with these ([`bytes`] is
//! `gpumem::units::bytes`).

/// The binary units, from bytes up: each is 1024 of the one before.
pub const BINARY_UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// `b` bytes with a binary unit and three significant digits: `512 B`, `1.50 KiB`,
/// `256.0 MiB`, up to `16.00 EiB` (`u64::MAX`).
pub fn bytes(b: u64) -> String {
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut i = 1;
    while v >= 1024.0 && i < BINARY_UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v >= 100.0 {
        format!("{v:.1} {}", BINARY_UNITS[i])
    } else {
        format!("{v:.2} {}", BINARY_UNITS[i])
    }
}

/// `b` bytes as [`bytes`] prints them, then the exact count in bytes, its digits grouped by
/// three: `3.07 GiB (3,298,534,883 B)`. Below 1 KiB the exact count alone: `512 B`.
pub fn bytes_exact(b: u64) -> String {
    if b < 1024 {
        return format!("{b} B");
    }
    format!("{} ({} B)", bytes(b), grouped(b))
}

/// `n` with its digits grouped by three with commas: `3,298,534,883`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.00 KiB");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(256 << 20), "256.0 MiB");
        assert_eq!(bytes(3_298_534_883), "3.07 GiB");
        assert_eq!(bytes(u64::MAX), "16.00 EiB");
        assert_eq!(bytes(1 << 60), "1.00 EiB");
    }

    #[test]
    fn exact_sizes_keep_every_byte() {
        assert_eq!(bytes_exact(0), "0 B");
        assert_eq!(bytes_exact(512), "512 B");
        assert_eq!(bytes_exact(1024), "1.00 KiB (1,024 B)");
        assert_eq!(bytes_exact(3_298_534_883), "3.07 GiB (3,298,534,883 B)");
        assert_eq!(bytes_exact(2 << 20), "2.00 MiB (2,097,152 B)");
        assert_eq!(
            bytes_exact(u64::MAX),
            "16.00 EiB (18,446,744,073,709,551,615 B)"
        );
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(100_000), "100,000");
        assert_eq!(grouped(1_000_000), "1,000,000");
    }
}
