//! Flow-size distributions: a piecewise-linear CDF in the format the HPCC
//! simulator's traffic generator reads (one `size_bytes cdf_percent` point
//! per line, percentages from 0 to 100), sampled by inverting it with
//! linear interpolation between points, as that generator does. The built-in
//! ones live in `userspace/cli/data/cdf/` (sources cited in its README).

use std::path::Path;

use anyhow::{bail, Context};

/// One distribution: (size in bytes, cumulative fraction in 0..=1) points.
#[derive(Clone, Debug, PartialEq)]
pub struct Cdf {
    /// "websearch", "hadoop" or the file it was read from.
    pub name: String,
    points: Vec<(f64, f64)>,
}

/// Names of the built-in distributions.
pub const BUILTIN: [&str; 2] = ["websearch", "hadoop"];

fn builtin_text(name: &str) -> Option<&'static str> {
    match name {
        "websearch" => Some(include_str!("../../../data/cdf/websearch.txt")),
        "hadoop" => Some(include_str!("../../../data/cdf/hadoop.txt")),
        _ => None,
    }
}

impl Cdf {
    /// A built-in distribution by name, else the file at `spec`.
    pub fn load(spec: &str) -> anyhow::Result<Cdf> {
        if let Some(text) = builtin_text(spec) {
            return Cdf::parse(spec, text);
        }
        let path = Path::new(spec);
        if !path.exists() {
            bail!(
                "--cdf {spec:?}: neither a built-in distribution ({}) nor a file",
                BUILTIN.join(", ")
            );
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("read --cdf {spec}"))?;
        Cdf::parse(spec, &text).with_context(|| format!("--cdf {spec}"))
    }

    /// Parses HPCC's format: `size cdf_percent` per line (any whitespace
    /// between; blank lines and `#` comments skipped). The percentages
    /// start at 0, end at 100 and rise; sizes never fall.
    pub fn parse(name: &str, text: &str) -> anyhow::Result<Cdf> {
        let mut points: Vec<(f64, f64)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() != 2 {
                bail!("line {n}: {raw:?} is not `size_bytes cdf_percent`");
            }
            let num = |s: &str, what: &str| -> anyhow::Result<f64> {
                let v: f64 = s
                    .parse()
                    .map_err(|_| anyhow::anyhow!("line {n}: {what} {s:?} is not a number"))?;
                if !v.is_finite() || v < 0.0 {
                    bail!("line {n}: {what} {s:?} must be a finite number >= 0");
                }
                Ok(v)
            };
            let size = num(fields[0], "size")?;
            let pct = num(fields[1], "percentage")?;
            if pct > 100.0 {
                bail!("line {n}: percentage {pct} is over 100");
            }
            if let Some(&(ps, pp)) = points.last() {
                if size < ps {
                    bail!("line {n}: size {size} is below the previous point's {ps}");
                }
                if pct * 0.01 <= pp {
                    bail!(
                        "line {n}: percentage {pct} does not rise above the previous point's {}",
                        pp * 100.0
                    );
                }
            } else if pct != 0.0 {
                bail!("line {n}: the first point must be at 0 percent, not {pct}");
            }
            points.push((size, pct * 0.01));
        }
        match points.last() {
            None => bail!("no points (expected lines of `size_bytes cdf_percent`)"),
            Some(&(_, p)) if p != 1.0 => {
                bail!(
                    "the last point is at {} percent; a CDF ends at 100",
                    p * 100.0
                )
            }
            _ => {}
        }
        if points.len() < 2 {
            bail!("a CDF needs at least two points (0 and 100 percent)");
        }
        if points.last().expect("two points").0 < 1.0 {
            bail!("every size is below one byte");
        }
        Ok(Cdf {
            name: name.to_string(),
            points,
        })
    }

    /// The size at cumulative fraction `u` in [0, 1): linear between
    /// points; at least one byte.
    pub fn quantile(&self, u: f64) -> u64 {
        let p = &self.points;
        let i = p.partition_point(|&(_, f)| f < u).clamp(1, p.len() - 1);
        let ((x0, y0), (x1, y1)) = (p[i - 1], p[i]);
        let x = x0 + (x1 - x0) * ((u - y0) / (y1 - y0)).clamp(0.0, 1.0);
        (x as u64).max(1)
    }

    /// The mean size (each segment's midpoint times its probability).
    pub fn mean(&self) -> f64 {
        self.points
            .windows(2)
            .map(|w| (w[0].0 + w[1].0) / 2.0 * (w[1].1 - w[0].1))
            .sum()
    }

    /// The largest size it can draw.
    pub fn max(&self) -> u64 {
        self.points.last().map_or(1, |p| p.0 as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse_with_their_published_means() {
        let web = Cdf::load("websearch").unwrap();
        // The DCTCP web-search mix: about 1.7 MB on average (interpolated
        // linearly), up to 30 MB.
        assert!((web.mean() - 1_711_250.0).abs() < 1.0, "{}", web.mean());
        assert_eq!(web.max(), 30_000_000);
        let hadoop = Cdf::load("hadoop").unwrap();
        assert!(
            (hadoop.mean() - 120_420.75).abs() < 1.0,
            "{}",
            hadoop.mean()
        );
        assert_eq!(hadoop.max(), 10_000_000);
    }

    #[test]
    fn hpcc_format_and_interpolation() {
        let c = Cdf::parse("t", "0 0\n100 50\n# a comment\n\n300 100\n").unwrap();
        assert_eq!(c.quantile(0.0), 1);
        assert_eq!(c.quantile(0.25), 50);
        assert_eq!(c.quantile(0.5), 100);
        assert_eq!(c.quantile(0.75), 200);
        assert_eq!(c.quantile(0.999_999), 299);
        // Midpoints: 50 * 0.5 + 200 * 0.5.
        assert!((c.mean() - 125.0).abs() < 1e-9);
        // Tabs and several spaces, fractional percentages (hadoop's 97.5).
        let c = Cdf::parse("t", "0\t0\n10   97.5\n20 100\n").unwrap();
        assert_eq!(c.quantile(0.975), 10);
        // A step (point mass): sizes may repeat.
        let c = Cdf::parse("t", "1000 0\n1000 100\n").unwrap();
        assert_eq!(c.quantile(0.3), 1000);
    }

    #[test]
    fn bad_input_says_what_and_where() {
        let err = |text: &str| format!("{:#}", Cdf::parse("t", text).unwrap_err());
        assert!(err("").contains("no points"));
        assert!(err("0 0\n100\n").contains("line 2"));
        assert!(err("0 0\nabc 100\n").contains("size \"abc\" is not a number"));
        assert!(err("0 10\n100 100\n").contains("first point must be at 0 percent"));
        assert!(err("0 0\n100 90\n").contains("last point is at 90 percent"));
        assert!(err("0 0\n100 50\n50 100\n").contains("line 3: size 50 is below"));
        assert!(err("0 0\n100 50\n200 50\n").contains("line 3: percentage 50 does not rise"));
        assert!(err("0 0\n100 150\n").contains("over 100"));
        assert!(err("0 0\n-5 100\n").contains(">= 0"));
        assert!(err("0 0\n0.5 100\n").contains("below one byte"));
        let e = format!("{:#}", Cdf::load("/nonexistent/cdf.txt").unwrap_err());
        assert!(e.contains("websearch, hadoop"), "{e}");
    }
}
