//! SVG plots of an incast with plotters' SVG backend (text is left to the
//! SVG viewer's fonts, so no font files are needed here): per-flow goodput,
//! per-flow congestion-control rate, and the virtual queue with its
//! thresholds.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::report::Report;

const SIZE: (u32, u32) = (960, 540);

/// plotters' errors as anyhow's (every plot of the experiments).
pub(super) fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Draws `chart`'s legend at `legend_at` and writes the SVG to `path`:
/// how every plot of the experiments ends.
pub(super) fn finish<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    legend_at: SeriesLabelPosition,
    path: &Path,
) -> anyhow::Result<()>
where
    X: plotters::coord::ranged1d::Ranged,
    Y: plotters::coord::ranged1d::Ranged,
{
    chart
        .configure_series_labels()
        .position(legend_at)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present()
        .map_err(err)
        .with_context(|| format!("write {}", path.display()))
}

/// Draws lines (one per series, named) into an SVG file.
fn lines(
    path: &Path,
    title: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
    hlines: &[(String, f64)],
) -> anyhow::Result<()> {
    let x_max = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let y_max = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.1))
        .chain(hlines.iter().map(|h| h.1))
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    for (i, (name, points)) in series.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    // Threshold lines: green, orange, black, ...
    let threshold_colours = [RGBColor(0, 150, 0), RGBColor(230, 120, 0), BLACK];
    for (i, (name, y)) in hlines.iter().enumerate() {
        let style = threshold_colours[i % threshold_colours.len()].mix(0.7);
        chart
            .draw_series(LineSeries::new([(0.0, *y), (x_max, *y)], style))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperRight, path)
}

/// Each point's y replaced by the mean of the last `window` points' (fewer
/// at the start).
fn moving_average(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    let mut sum = 0.0;
    points
        .iter()
        .enumerate()
        .map(|(i, &(x, y))| {
            sum += y;
            if i >= window {
                sum -= points[i - window].1;
            }
            (x, sum / (i + 1).min(window) as f64)
        })
        .collect()
}

/// flows.svg, rates.svg and queue.svg in `dir`.
pub fn all(report: &Report, dir: &Path) -> anyhow::Result<()> {
    let bin = report.args.bin_ms;
    let cc = &report.args.cc;
    let flows: Vec<_> = report
        .flows
        .iter()
        .map(|f| {
            let s = f.series(bin);
            (
                format!("flow {}", f.index),
                s.iter().map(|p| (p.0 / 1e3, p.1)).collect::<Vec<_>>(),
                s.iter().map(|p| (p.0 / 1e3, p.2)).collect::<Vec<_>>(),
            )
        })
        .collect();
    let link_gbps = report.link_rate_bps as f64 / 1e9;
    let fair = link_gbps / report.flows.len().max(1) as f64;
    // Whole messages complete per bin, so short bins are spiky: plot a
    // moving average over about 50 ms (flows.csv keeps every bin).
    let window = (50 / bin).max(1) as usize;
    let title = if window > 1 {
        format!(
            "Per-flow goodput ({} senders, {cc}; {} ms moving average of {bin} ms bins)",
            flows.len(),
            window as u32 * bin
        )
    } else {
        format!(
            "Per-flow goodput ({} senders, {cc}, {bin} ms bins)",
            flows.len()
        )
    };
    lines(
        &dir.join("flows.svg"),
        &title,
        "goodput (Gbit/s)",
        &flows
            .iter()
            .map(|(n, g, _)| (n.clone(), moving_average(g, window)))
            .collect::<Vec<_>>(),
        &[("fair share".to_string(), fair)],
    )?;
    lines(
        &dir.join("rates.svg"),
        &format!("Congestion-control rate per flow ({cc})"),
        "rate (Gbit/s)",
        &flows
            .iter()
            .map(|(n, _, r)| (n.clone(), r.clone()))
            .collect::<Vec<_>>(),
        &[("link rate".to_string(), link_gbps)],
    )?;
    let queue: Vec<(f64, f64)> = report
        .samples
        .iter()
        .map(|s| (s.t_ms / 1e3, s.queue_bytes as f64 / 1e3))
        .collect();
    let mut marks = vec![("kmin".to_string(), report.ecn.kmin as f64 / 1e3)];
    if report.ecn.kmax > report.ecn.kmin {
        marks.push(("kmax".to_string(), report.ecn.kmax as f64 / 1e3));
    }
    if let Some(b) = report.buffer_bytes {
        marks.push(("buffer".to_string(), b as f64 / 1e3));
    }
    lines(
        &dir.join("queue.svg"),
        &format!(
            "Virtual queue at the receiver ({} bottleneck, {cc})",
            report.args.link_rate
        ),
        "queue (KB)",
        &[("queue".to_string(), queue)],
        &marks,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn moving_average_by_hand() {
        let p = [(0.0, 1.0), (1.0, 3.0), (2.0, 5.0), (3.0, 7.0)];
        let m = super::moving_average(&p, 2);
        assert_eq!(m, vec![(0.0, 1.0), (1.0, 2.0), (2.0, 4.0), (3.0, 6.0)]);
        assert_eq!(super::moving_average(&p, 1), p.to_vec());
    }
}
