//! SVG plots of an incast with plotters' SVG backend (text is left to the
//! SVG viewer's fonts, so no font files are needed here): per-flow goodput,
//! per-flow congestion-control rate, and the virtual queue with its
//! thresholds.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::report::Report;

const SIZE: (u32, u32) = (960, 540);

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
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
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present()
        .map_err(err)
        .with_context(|| format!("write {}", path.display()))
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
    lines(
        &dir.join("flows.svg"),
        &format!(
            "Per-flow goodput ({} senders, {cc}, {bin} ms bins)",
            flows.len()
        ),
        "goodput (Gbit/s)",
        &flows
            .iter()
            .map(|(n, g, _)| (n.clone(), g.clone()))
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
