//! The quantities of a DCQCN spec ([`super::DcqcnConfig::from_spec`],
//! which the library reads from `$XROCE_DCQCN`): rates ("5gbit"), sizes
//! ("200KB", "1MiB") and durations ("50us"). The CLI's flags take the same
//! forms through these functions (its clap value parsers, with fractions,
//! are in the CLI's units.rs).
//!
//! Numbers may have a decimal point ("2.5gbit"); the result must then be a
//! whole number of the base unit. Units are case-insensitive and may be
//! separated from the number by spaces.

use thiserror::Error;

const RATE_FORMS: &str = "a number of bits per second with a unit: bit, kbit, mbit, gbit or tbit \
     (powers of 1000, as tc spells them), e.g. 5gbit, 100mbit, 2.5gbit";
const SIZE_FORMS: &str = "a number of bytes, optionally with a unit: B, KB, MB, GB (powers of \
     1000) or KiB, MiB, GiB (powers of 1024), e.g. 5KB, 200KB, 1MiB";
const DURATION_FORMS: &str = "a number with a unit: ns, us, ms or s, e.g. 50us, 10ms, 2s";

/// A quantity that could not be parsed; the message names the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UnitError {
    #[error("invalid rate {input:?}: {reason}; expected {RATE_FORMS}")]
    Rate { input: String, reason: String },
    #[error("invalid size {input:?}: {reason}; expected {SIZE_FORMS}")]
    Size { input: String, reason: String },
    #[error("invalid duration {input:?}: {reason}; expected {DURATION_FORMS}")]
    Duration { input: String, reason: String },
}

/// A decimal number split into its digits and the count of fractional ones.
struct Decimal {
    digits: u128,
    scale: u32,
}

/// Splits `s` into a decimal number and the (trimmed, lower-cased) unit.
fn split(s: &str) -> Result<(Decimal, String), String> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    if num.is_empty() {
        return Err("no number".into());
    }
    let mut parts = num.splitn(2, '.');
    let int = parts.next().unwrap_or("");
    let frac = parts.next().unwrap_or("");
    if frac.contains('.') {
        return Err("more than one decimal point".into());
    }
    if int.is_empty() && frac.is_empty() {
        return Err("no digits".into());
    }
    if int.len() + frac.len() > 30 {
        return Err("too many digits".into());
    }
    let mut digits: u128 = 0;
    for c in int.chars().chain(frac.chars()) {
        digits = digits * 10 + c.to_digit(10).unwrap_or(0) as u128;
    }
    Ok((
        Decimal {
            digits,
            scale: frac.len() as u32,
        },
        unit.trim().to_ascii_lowercase(),
    ))
}

/// `value * multiplier` as a whole `u64` of the base unit.
fn scale(d: Decimal, multiplier: u64, base: &str) -> Result<u64, String> {
    let num = d
        .digits
        .checked_mul(multiplier as u128)
        .ok_or("too large")?;
    let den = 10u128.pow(d.scale);
    if num % den != 0 {
        return Err(format!("not a whole number of {base}"));
    }
    u64::try_from(num / den).map_err(|_| "too large".into())
}

/// Parses a link rate into bits per second: "5gbit" -> 5_000_000_000,
/// "100mbit", "2.5gbit", "64kbit", "1000bit", or a bare number of bit/s.
/// "gbps"-style units are refused: tc reads them as bytes per second.
pub fn parse_rate_bps(s: &str) -> Result<u64, UnitError> {
    let err = |reason: String| UnitError::Rate {
        input: s.to_string(),
        reason,
    };
    let (d, unit) = split(s).map_err(err)?;
    let mult = match unit.as_str() {
        "" | "bit" => 1,
        "kbit" => 1_000,
        "mbit" => 1_000_000,
        "gbit" => 1_000_000_000,
        "tbit" => 1_000_000_000_000,
        "bps" | "kbps" | "mbps" | "gbps" | "tbps" => {
            return Err(err(format!(
                "\"{unit}\" is ambiguous (tc reads it as bytes per second); write {}bit",
                &unit[..unit.len() - 3]
            )))
        }
        _ => return Err(err(format!("unknown unit \"{unit}\""))),
    };
    let v = scale(d, mult, "bits per second").map_err(err)?;
    if v == 0 {
        return Err(err("a rate must be above zero".into()));
    }
    Ok(v)
}

/// Parses a size into bytes: "5KB" -> 5_000, "200KB", "1MiB" -> 1_048_576,
/// "1.5MB", "4096", "64B".
pub fn parse_size_bytes(s: &str) -> Result<u64, UnitError> {
    let err = |reason: String| UnitError::Size {
        input: s.to_string(),
        reason,
    };
    let (d, unit) = split(s).map_err(err)?;
    let mult = match unit.as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return Err(err(format!("unknown unit \"{unit}\""))),
    };
    scale(d, mult, "bytes").map_err(err)
}

/// Parses a duration into nanoseconds: "50us", "10ms", "2s", "1.5ms", "100ns".
/// A unit is required.
pub fn parse_duration_ns(s: &str) -> Result<u64, UnitError> {
    let err = |reason: String| UnitError::Duration {
        input: s.to_string(),
        reason,
    };
    let (d, unit) = split(s).map_err(err)?;
    let mult = match unit.as_str() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "" => return Err(err("no unit".into())),
        _ => return Err(err(format!("unknown unit \"{unit}\""))),
    };
    scale(d, mult, "nanoseconds").map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate_bps("5gbit"), Ok(5_000_000_000));
        assert_eq!(parse_rate_bps("100mbit"), Ok(100_000_000));
        assert_eq!(parse_rate_bps("2.5gbit"), Ok(2_500_000_000));
        assert_eq!(parse_rate_bps("5Gbit"), Ok(5_000_000_000));
        assert_eq!(parse_rate_bps(" 40 GBIT "), Ok(40_000_000_000));
        assert_eq!(parse_rate_bps("64kbit"), Ok(64_000));
        assert_eq!(parse_rate_bps("1tbit"), Ok(1_000_000_000_000));
        assert_eq!(parse_rate_bps("1000"), Ok(1000));
        assert_eq!(parse_rate_bps("1000bit"), Ok(1000));
        assert_eq!(parse_rate_bps(".5gbit"), Ok(500_000_000));
    }

    #[test]
    fn rate_errors_name_the_forms() {
        let e = parse_rate_bps("10gbps").unwrap_err().to_string();
        assert!(
            e.contains("ambiguous") && e.contains("10gbps") && e.contains("gbit"),
            "{e}"
        );
        let e = parse_rate_bps("fast").unwrap_err().to_string();
        assert!(
            e.contains("no number") && e.contains("5gbit, 100mbit"),
            "{e}"
        );
        let e = parse_rate_bps("5g").unwrap_err().to_string();
        assert!(e.contains("unknown unit \"g\""), "{e}");
        assert!(parse_rate_bps("0gbit").is_err());
        assert!(parse_rate_bps("1.5bit").is_err());
        assert!(parse_rate_bps("1.2.3gbit").is_err());
        assert!(parse_rate_bps("99999999999tbit").is_err());
        assert!(parse_rate_bps("-5gbit").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size_bytes("5KB"), Ok(5_000));
        assert_eq!(parse_size_bytes("200KB"), Ok(200_000));
        assert_eq!(parse_size_bytes("1MiB"), Ok(1_048_576));
        assert_eq!(parse_size_bytes("1.5MB"), Ok(1_500_000));
        assert_eq!(parse_size_bytes("4096"), Ok(4096));
        assert_eq!(parse_size_bytes("64B"), Ok(64));
        assert_eq!(parse_size_bytes("2kib"), Ok(2048));
        assert_eq!(parse_size_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size_bytes("0"), Ok(0));
        let e = parse_size_bytes("5KiBs").unwrap_err().to_string();
        assert!(
            e.contains("unknown unit") && e.contains("5KB, 200KB, 1MiB"),
            "{e}"
        );
        let e = parse_size_bytes("1.0001KB").unwrap_err().to_string();
        assert!(e.contains("whole number of bytes"), "{e}");
        assert!(parse_size_bytes("").is_err());
        assert!(parse_size_bytes("KB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("50us"), Ok(50_000));
        assert_eq!(parse_duration_ns("10ms"), Ok(10_000_000));
        assert_eq!(parse_duration_ns("2s"), Ok(2_000_000_000));
        assert_eq!(parse_duration_ns("1.5ms"), Ok(1_500_000));
        assert_eq!(parse_duration_ns("100ns"), Ok(100));
        let e = parse_duration_ns("50").unwrap_err().to_string();
        assert!(e.contains("no unit") && e.contains("50us"), "{e}");
        assert!(parse_duration_ns("1.5ns").is_err());
    }
}
