//! jct.svg: each run's JCT per iteration, one line per variant, loss,
//! op and size, on a log scale (a retransmission timeout stands out from
//! the lossless steps by orders of magnitude). compare.svg: each
//! variant's JCT p50 and p99, one pair of lines per loss, op and size
//! across the variants.

use std::path::Path;

use plotters::prelude::*;

use super::super::plot::{err, finish};

use super::results::Figure;

const SIZE: (u32, u32) = (960, 540);

/// "64 KiB".
fn size_text(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// The series' name: "xroce 1% allreduce 64 KiB".
fn label(f: &Figure) -> String {
    format!(
        "{} {}% {} {}",
        f.variant,
        f.loss * 100.0,
        f.op,
        size_text(f.bytes)
    )
}

/// compare.svg: x is the variant (in run order), y the JCT (log scale);
/// per loss, op and size a solid line through the p50s and a dashed one
/// through the p99s.
pub fn compare(path: &Path, title: &str, figures: &[Figure]) -> anyhow::Result<()> {
    let mut variants: Vec<&str> = Vec::new();
    let mut cases: Vec<(f64, &str, u64)> = Vec::new();
    for f in figures {
        if !variants.contains(&f.variant.as_str()) {
            variants.push(&f.variant);
        }
        let case = (f.loss, f.op.as_str(), f.bytes);
        if !cases.contains(&case) {
            cases.push(case);
        }
    }
    let all = || {
        figures
            .iter()
            .flat_map(|f| [f.jct_p50_s, f.jct_p99_s])
            .filter(|&y| y > 0.0)
    };
    let y_max = all().fold(1e-6f64, f64::max) * 2.0;
    let y_min = all().fold(y_max, f64::min) / 2.0;
    let n = variants.len() as f64;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..n - 0.5, (y_min * 1e3..y_max * 1e3).log_scale())
        .map_err(err)?;
    let name_at = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < variants.len() {
            variants[i as usize].to_string()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_labels(variants.len() * 2 + 1)
        .x_label_formatter(&name_at)
        .x_desc("variant (same seed)")
        .y_desc("JCT (ms, slowest rank)")
        .draw()
        .map_err(err)?;
    for (i, &(loss, op, bytes)) in cases.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        let points = |p99: bool| -> Vec<(f64, f64)> {
            variants
                .iter()
                .enumerate()
                .filter_map(|(x, v)| {
                    figures
                        .iter()
                        .find(|f| {
                            f.variant == *v && f.loss == loss && f.op == op && f.bytes == bytes
                        })
                        .map(|f| (x as f64, if p99 { f.jct_p99_s } else { f.jct_p50_s } * 1e3))
                })
                .collect()
        };
        let case = format!("{}% {op} {}", loss * 100.0, size_text(bytes));
        let p50 = points(false);
        chart
            .draw_series(LineSeries::new(p50.clone(), colour.stroke_width(2)))
            .map_err(err)?
            .label(format!("p50 {case}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
        chart
            .draw_series(p50.iter().map(|&p| Circle::new(p, 4, colour.filled())))
            .map_err(err)?;
        let p99 = points(true);
        chart
            .draw_series(DashedLineSeries::new(
                p99.clone(),
                6,
                4,
                colour.stroke_width(2),
            ))
            .map_err(err)?
            .label(format!("p99 {case}"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 8, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(
                p99.iter()
                    .map(|&p| TriangleMarker::new(p, 5, colour.filled())),
            )
            .map_err(err)?;
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperRight, path)
}

pub fn jct(path: &Path, title: &str, figures: &[Figure]) -> anyhow::Result<()> {
    let all = || figures.iter().flat_map(|f| f.jct_s.iter().copied());
    let y_max = all().fold(1e-6f64, f64::max) * 2.0;
    let y_min = all().filter(|&y| y > 0.0).fold(y_max, f64::min) / 2.0;
    let x_max = figures.iter().map(|f| f.iters).max().unwrap_or(1).max(2) as f64 - 1.0;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..x_max, (y_min * 1e3..y_max * 1e3).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("iteration")
        .y_desc("JCT (ms, slowest rank)")
        .draw()
        .map_err(err)?;
    for (i, f) in figures.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        let points = f
            .jct_s
            .iter()
            .enumerate()
            .map(|(k, &s)| (k as f64, s * 1e3));
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(err)?
            .label(label(f))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperRight, path)
}
