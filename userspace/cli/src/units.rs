//! clap value parsers for the flags that take quantities (rates, sizes,
//! fractions, durations) and `--cc`: a bad value fails while clap parses
//! the command line, with a message naming the flag and the accepted forms.
//! Rates, sizes and durations are parsed by [`xroce::cc::units`], the
//! grammar of the DCQCN specs the library reads from `$XROCE_DCQCN`;
//! fractions, which only the CLI's flags take, are parsed here.

use std::fmt;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use xroce::cc::{
    units::{self, UnitError},
    CcKind,
};

/// A flag value as the user typed it and as it was parsed: the value for
/// the program, the text for reports and the command lines of children.
/// Serializes as the text.
#[derive(Clone, Debug, PartialEq)]
pub struct Given<T> {
    text: String,
    pub value: T,
}

impl<T> Given<T> {
    /// The value as typed.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl<T> fmt::Display for Given<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl<T> AsRef<std::ffi::OsStr> for Given<T> {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.text.as_ref()
    }
}

impl<T> serde::Serialize for Given<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

fn given<T, E>(s: &str, parse: impl FnOnce(&str) -> Result<T, E>) -> Result<Given<T>, E> {
    Ok(Given {
        text: s.to_string(),
        value: parse(s)?,
    })
}

/// Bits per second: `5gbit`, `100mbit`, `2.5gbit`.
pub type Rate = Given<u64>;
/// Bytes: `65536`, `64KiB`, `200KB`.
pub type Size = Given<u64>;
/// A fraction in the XDP maps' fixed point: `0.01`, `1%`.
pub type Fraction = Given<u32>;
/// Seconds: `5`, `2.5`, `500ms`.
pub type Seconds = Given<f64>;

/// Value parser of a rate flag.
pub fn rate(s: &str) -> Result<Rate, UnitError> {
    given(s, units::parse_rate_bps)
}

/// Value parser of a size flag.
pub fn size(s: &str) -> Result<Size, UnitError> {
    given(s, units::parse_size_bytes)
}

/// Value parser of a fraction flag (fixed point, as the XDP maps hold it).
pub fn fraction(s: &str) -> Result<Fraction, FractionError> {
    given(s, |s| {
        parse_fraction(s).map(xroce_common::fixed::fraction_to_fixed)
    })
}

/// A fraction flag that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FractionError {
    input: String,
    reason: &'static str,
}

impl fmt::Display for FractionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid fraction {:?}: {}; expected a fraction between 0 and 1 or a percentage, e.g. 0.01 or 1%",
            self.input, self.reason
        )
    }
}

impl std::error::Error for FractionError {}

/// Parses a fraction in `[0, 1]`: "0.01", "1e-3", "1%", "0.5 %".
pub fn parse_fraction(s: &str) -> Result<f64, FractionError> {
    let err = |reason| FractionError {
        input: s.to_string(),
        reason,
    };
    let t = s.trim();
    let (num, div) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 100.0),
        None => (t, 1.0),
    };
    let v: f64 = num.parse().map_err(|_| err("not a number"))?;
    let v = v / div;
    if !(0.0..=1.0).contains(&v) {
        return Err(err("outside 0..1"));
    }
    Ok(v)
}

/// Value parser of a positive duration in seconds: a bare number of
/// seconds ("5", "2.5") or a number with a unit ("500ms", "2s").
pub fn seconds(s: &str) -> Result<Seconds, String> {
    given(s, |s| {
        let secs = match s.trim().parse::<f64>() {
            Ok(v) => v,
            Err(_) => units::parse_duration_ns(s).map_err(|e| e.to_string())? as f64 / 1e9,
        };
        if !(secs > 0.0 && secs.is_finite()) {
            return Err(format!("{s:?} is not a positive duration, e.g. 5 or 500ms"));
        }
        Ok(secs)
    })
}

/// Value parser of `--cc`: one of [`CcKind::ALL`] by name (listed in
/// `--help` and in the error for anything else).
pub fn cc() -> impl TypedValueParser<Value = CcKind> {
    PossibleValuesParser::new(CcKind::ALL.map(CcKind::name)).map(|name| {
        name.parse::<CcKind>()
            .expect("PossibleValuesParser admits only CcKind names")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Flags {
        #[arg(long, value_parser = rate, default_value = "100gbit")]
        rate: Rate,
        #[arg(long, value_parser = size)]
        size: Option<Size>,
        #[arg(long, value_parser = seconds, default_value = "5")]
        duration: Seconds,
        #[arg(long, value_parser = cc(), default_value = "none")]
        cc: CcKind,
    }

    #[test]
    fn quantities_parse_with_clap() {
        let f = Flags::try_parse_from([
            "x",
            "--rate",
            "2.5gbit",
            "--size",
            "64KiB",
            "--duration",
            "500ms",
            "--cc",
            "dcqcn",
        ])
        .unwrap();
        assert_eq!(f.rate.value, 2_500_000_000);
        assert_eq!(f.rate.text(), "2.5gbit");
        assert_eq!(f.size.unwrap().value, 65536);
        assert_eq!(f.duration.value, 0.5);
        assert_eq!(f.cc, CcKind::Dcqcn);
        let d = Flags::try_parse_from(["x"]).unwrap();
        assert_eq!((d.rate.value, d.duration.value), (100_000_000_000, 5.0));
        assert_eq!(serde_json::to_string(&d.rate).unwrap(), "\"100gbit\"");
    }

    #[test]
    fn fractions() {
        assert_eq!(parse_fraction("0.01"), Ok(0.01));
        assert_eq!(parse_fraction("1%"), Ok(0.01));
        assert_eq!(parse_fraction("50 %"), Ok(0.5));
        assert_eq!(parse_fraction("1e-3"), Ok(0.001));
        assert_eq!(parse_fraction("1"), Ok(1.0));
        assert_eq!(fraction("0.5").unwrap().value, 1 << 31);
        assert_eq!(fraction("100%").unwrap().value, u32::MAX);
        assert_eq!(fraction("1%").unwrap().text(), "1%");
        let e = parse_fraction("1.5").unwrap_err().to_string();
        assert!(
            e.contains("outside 0..1") && e.contains("0.01 or 1%"),
            "{e}"
        );
        assert!(parse_fraction("-0.1").is_err());
        assert!(parse_fraction("lots").is_err());
        assert!(parse_fraction("NaN").is_err());
    }

    #[test]
    fn bad_values_fail_at_parse_time_naming_the_flag() {
        for (flag, bad) in [
            ("--rate", "5gbits"),
            ("--size", "12XB"),
            ("--duration", "0"),
            ("--cc", "cubic"),
        ] {
            let e = Flags::try_parse_from(["x", flag, bad]).unwrap_err();
            use clap::error::ErrorKind::{InvalidValue, ValueValidation};
            assert!(matches!(e.kind(), InvalidValue | ValueValidation), "{flag}");
            let text = e.to_string();
            assert!(text.contains(flag) && text.contains(bad), "{text}");
        }
    }
}
