//! The form every controller's spec takes (`$XROCE_DCQCN`, `--swift`,
//! `--timely`, ...): a preset, then `key=value` overrides, comma-separated,
//! e.g. `software,t_low=400us`. One parser, so every controller reads and
//! refuses specs the same way; each controller maps its keys to its fields.

use std::str::FromStr;

use super::units::{parse_duration_ns, parse_rate_bps, parse_size_bytes, UnitError};

/// One `key=value` override; its readers' errors name the controller, the
/// key and what was wrong.
pub(super) struct Override<'a> {
    cc: &'static str,
    pub key: &'a str,
    value: &'a str,
}

impl Override<'_> {
    fn unit(&self, r: Result<u64, UnitError>) -> Result<u64, String> {
        r.map_err(|e| format!("{} {}: {e}", self.cc, self.key))
    }

    /// A rate: `5gbit`, `100mbit`.
    pub fn rate_bps(&self) -> Result<u64, String> {
        self.unit(parse_rate_bps(self.value))
    }

    /// A size: `200KB`, `1MiB`, `4096`.
    pub fn size_bytes(&self) -> Result<u64, String> {
        self.unit(parse_size_bytes(self.value))
    }

    /// A duration: `50us`, `10ms`.
    pub fn duration_ns(&self) -> Result<u64, String> {
        self.unit(parse_duration_ns(self.value))
    }

    /// A finite number >= 0.
    pub fn number(&self) -> Result<f64, String> {
        self.value
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| {
                format!(
                    "{} {}={:?}: not a number >= 0",
                    self.cc, self.key, self.value
                )
            })
    }

    /// A whole number.
    pub fn whole<T: FromStr>(&self) -> Result<T, String> {
        self.value.parse().map_err(|_| {
            format!(
                "{} {}={:?}: not a whole number",
                self.cc, self.key, self.value
            )
        })
    }

    /// `true` or `false`.
    pub fn flag(&self) -> Result<bool, String> {
        self.value.parse().map_err(|_| {
            format!(
                "{} {}={:?}: not true or false",
                self.cc, self.key, self.value
            )
        })
    }

    /// How many RTT samples a filter keeps: 1..=64.
    pub fn samples(&self) -> Result<u32, String> {
        self.value
            .parse()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| {
                format!(
                    "{} {}={:?}: not 1..=64 samples",
                    self.cc, self.key, self.value
                )
            })
    }

    /// The error for a key the controller does not have; `keys` lists the
    /// ones it has.
    pub fn unknown(&self, keys: &str) -> String {
        format!("unknown {} parameter {:?}; use {keys}", self.cc, self.key)
    }
}

/// "a, b or c".
fn one_of(names: &[&str]) -> String {
    match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// Parses `spec` for controller `cc`: the first part names one of
/// `presets` (an empty spec takes the first), then `apply` sets each
/// override on the preset's parameters.
pub(super) fn parse<T>(
    cc: &'static str,
    spec: &str,
    presets: &[(&str, &dyn Fn() -> T)],
    mut apply: impl FnMut(&mut T, &Override) -> Result<(), String>,
) -> Result<T, String> {
    let names: Vec<&str> = presets.iter().map(|(n, _)| *n).collect();
    let mut parts = spec.split(',').map(str::trim).filter(|p| !p.is_empty());
    let first = parts.next();
    let make = match first {
        None => presets.first().map(|(_, make)| make),
        Some(name) => presets
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, make)| make),
    };
    let mut cfg = match (make, first) {
        (Some(make), _) => make(),
        (None, Some(part)) if part.contains('=') => {
            return Err(format!(
                "{cc} spec {spec:?} must start with a preset: {}",
                one_of(&names)
            ))
        }
        (None, part) => {
            return Err(format!(
                "unknown {cc} preset {:?}; use {}",
                part.unwrap_or_default(),
                one_of(&names)
            ))
        }
    };
    for part in parts {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("{cc} override {part:?} is not key=value"))?;
        apply(
            &mut cfg,
            &Override {
                cc,
                key: key.trim(),
                value: value.trim(),
            },
        )?;
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_pair(spec: &str) -> Result<(u64, f64), String> {
        let zero = || (0u64, 0.0f64);
        let one = || (1u64, 1.0f64);
        parse("TEST", spec, &[("zero", &zero), ("one", &one)], |c, o| {
            match o.key {
                "d" => c.0 = o.duration_ns()?,
                "x" => c.1 = o.number()?,
                _ => return Err(o.unknown("d or x")),
            }
            Ok(())
        })
    }

    #[test]
    fn presets_then_overrides_and_every_refusal_names_the_fix() {
        assert_eq!(parse_pair(""), Ok((0, 0.0)));
        assert_eq!(parse_pair("one"), Ok((1, 1.0)));
        assert_eq!(parse_pair(" one , d=2us, x=0.5 "), Ok((2000, 0.5)));
        assert_eq!(
            parse_pair("two").unwrap_err(),
            "unknown TEST preset \"two\"; use zero or one"
        );
        assert_eq!(
            parse_pair("d=1us").unwrap_err(),
            "TEST spec \"d=1us\" must start with a preset: zero or one"
        );
        assert!(parse_pair("one,d")
            .unwrap_err()
            .contains("is not key=value"));
        assert!(parse_pair("one,x=-1")
            .unwrap_err()
            .contains("not a number >= 0"));
        assert!(parse_pair("one,d=5")
            .unwrap_err()
            .starts_with("TEST d: invalid duration"));
        assert_eq!(
            parse_pair("one,y=1").unwrap_err(),
            "unknown TEST parameter \"y\"; use d or x"
        );
    }
}
