//! Parsing of human-written quantities: byte sizes ("4K", "1M", "1G", "512") and lists of them.

use crate::base::error::{Result, SimError};

/// Parses a byte size with an optional binary suffix (K, M, G, T; optional trailing B or iB),
/// as nccl-tests writes them: `4K` is 4096 bytes.
pub fn parse_bytes(text: &str) -> Result<u64> {
    let trimmed = text.trim();
    let upper = trimmed.to_ascii_uppercase();
    let stripped = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (digits, shift) = match stripped.chars().last() {
        Some('K') => (&stripped[..stripped.len() - 1], 10),
        Some('M') => (&stripped[..stripped.len() - 1], 20),
        Some('G') => (&stripped[..stripped.len() - 1], 30),
        Some('T') => (&stripped[..stripped.len() - 1], 40),
        _ => (stripped, 0),
    };
    let bad = |message: &str| SimError::bad_value("byte size", trimmed, message);
    let value: u64 = digits.parse().map_err(|_| {
        bad("expected a whole number with an optional K, M, G or T suffix, e.g. 4K, 1M, 1G")
    })?;
    if value == 0 {
        return Err(bad("a size must be at least 1 byte"));
    }
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| bad("too large"))
}

/// Parses a comma-separated list of byte sizes; a range `A-B` expands to powers of two.
pub fn parse_byte_list(text: &str) -> Result<Vec<u64>> {
    let mut sizes = Vec::new();
    for item in text.split(',').filter(|s| !s.trim().is_empty()) {
        if let Some((lo, hi)) = item.split_once('-') {
            let (lo, hi) = (parse_bytes(lo)?, parse_bytes(hi)?);
            if lo > hi {
                return Err(SimError::bad_value(
                    "byte range",
                    item,
                    "the first size must not exceed the second",
                ));
            }
            let mut size = lo;
            while size <= hi {
                sizes.push(size);
                size = match size.checked_mul(2) {
                    Some(next) => next,
                    None => break,
                };
            }
        } else {
            sizes.push(parse_bytes(item)?);
        }
    }
    if sizes.is_empty() {
        return Err(SimError::bad_value(
            "byte size list",
            text,
            "no sizes given",
        ));
    }
    Ok(sizes)
}

/// Formats bytes the way nccl-tests users read them (binary units).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    for (suffix, unit) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{}", bytes / unit, suffix);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_suffixes() {
        assert_eq!(parse_bytes("4K").unwrap(), 4096);
        assert_eq!(parse_bytes("1m").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("512").unwrap(), 512);
        assert_eq!(parse_bytes("8B").unwrap(), 8);
    }

    #[test]
    fn rejects_garbage_and_zero() {
        assert!(parse_bytes("abc").is_err());
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("-4K").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }

    #[test]
    fn expands_ranges_in_powers_of_two() {
        assert_eq!(
            parse_byte_list("1K-8K").unwrap(),
            vec![1024, 2048, 4096, 8192]
        );
        assert_eq!(parse_byte_list("4K,1M").unwrap(), vec![4096, 1 << 20]);
    }

    #[test]
    fn formats_round_sizes() {
        assert_eq!(format_bytes(4096), "4K");
        assert_eq!(format_bytes(1 << 30), "1G");
        assert_eq!(format_bytes(1000), "1000");
    }
}
