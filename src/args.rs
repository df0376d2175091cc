//! Parsers of numeric flags: each accepts what clap would mistake for a flag (`-5`).
//!
//! Each then rejects such a value with the rule.

/// A whole number of at least 1 (counts: nodes, iterations, streams, ranks).
pub fn count(text: &str) -> Result<u32, String> {
    match text.trim().parse::<i128>() {
        Ok(v) if (1..=i128::from(u32::MAX)).contains(&v) => Ok(v as u32),
        Ok(_) => Err(format!("must be a whole number from 1 to {}", u32::MAX)),
        Err(_) => Err("must be a whole number ≥ 1".into()),
    }
}

/// A whole number of at least 0 (warm-up iterations, dedicated servers).
pub fn whole(text: &str) -> Result<u32, String> {
    match text.trim().parse::<i128>() {
        Ok(v) if (0..=i128::from(u32::MAX)).contains(&v) => Ok(v as u32),
        Ok(_) => Err(format!("must be a whole number from 0 to {}", u32::MAX)),
        Err(_) => Err("must be a whole number ≥ 0".into()),
    }
}

/// Most repeats of one measurement: more would only make a command run for hours.
pub const MAX_REPEATS: u32 = 1000;

/// Repeats of a measurement: 1 to [`MAX_REPEATS`].
pub fn repeats(text: &str) -> Result<u32, String> {
    count(text).and_then(|n| {
        if n <= MAX_REPEATS {
            Ok(n)
        } else {
            Err(format!("must be 1 to {MAX_REPEATS}"))
        }
    })
}

/// Thread-ranks of this machine: 1 to [`MAX_THREAD_RANKS`].
pub const MAX_THREAD_RANKS: u32 = 256;

pub fn thread_ranks(text: &str) -> Result<u32, String> {
    count(text).and_then(|n| {
        if n <= MAX_THREAD_RANKS {
            Ok(n)
        } else {
            Err(format!(
                "must be 1 to {MAX_THREAD_RANKS} (threads of this machine)"
            ))
        }
    })
}

/// The largest tensor a host profile times: [`MIN_PROFILE_ELEMENTS`] to
/// [`MAX_PROFILE_ELEMENTS`] elements (1 GiB of fp32, a few buffers of which the kernels hold).
pub const MIN_PROFILE_ELEMENTS: u32 =
    syncopate_exec::measure::profile_host::SMALLEST_PROFILED as u32;
pub const MAX_PROFILE_ELEMENTS: u32 = 1 << 28;

pub fn profile_elements(text: &str) -> Result<u32, String> {
    count(text).and_then(|n| {
        if (MIN_PROFILE_ELEMENTS..=MAX_PROFILE_ELEMENTS).contains(&n) {
            Ok(n)
        } else {
            Err(format!(
                "must be {MIN_PROFILE_ELEMENTS} to {MAX_PROFILE_ELEMENTS} elements"
            ))
        }
    })
}

/// A seed: any whole number from 0 to 2^64 − 1.
pub fn seed(text: &str) -> Result<u64, String> {
    match text.trim().parse::<i128>() {
        Ok(v) if (0..=i128::from(u64::MAX)).contains(&v) => Ok(v as u64),
        _ => Err(format!("must be a whole number from 0 to {}", u64::MAX)),
    }
}

/// A number (range rules are checked by the command, which names them).
pub fn number(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .map_err(|_| "must be a number".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_and_garbage_values_are_refused_with_the_rule() {
        assert_eq!(count("3"), Ok(3));
        assert!(count("-5").unwrap_err().contains("from 1"));
        assert!(count("0").unwrap_err().contains("from 1"));
        assert!(count("4294967296").is_err());
        assert!(count("two").unwrap_err().contains("≥ 1"));
        assert_eq!(whole("0"), Ok(0));
        assert!(whole("-1").is_err());
        assert_eq!(seed("18446744073709551615"), Ok(u64::MAX));
        assert!(seed("-1").is_err());
        assert_eq!(number("-2.5"), Ok(-2.5));
        assert!(number("x").is_err());
    }
}
