//! SVG plots of workload runs, one series per run (controller): the
//! slowdown by flow-size bucket (p50 thin, p99 thick) and the CDF of the bottleneck queue.

use std::path::Path;

use plotters::prelude::*;

use super::super::plot::{err, finish};

use super::results::{Bucket, BUCKETS};

const SIZE: (u32, u32) = (960, 540);

/// One run to draw: its name (the controller), slowdown buckets, queue CDF.
pub struct Series<'a> {
    pub name: String,
    pub buckets: &'a [Bucket],
    pub queue_cdf: &'a [(u64, f64)],
}

/// slowdown.svg: p50 (thin) and p99 (thick) slowdown per size bucket.
pub fn slowdown(path: &Path, title: &str, series: &[Series<'_>]) -> anyhow::Result<()> {
    let n = BUCKETS.len();
    let points = |s: &Series<'_>, pick: fn(&Bucket) -> Option<f64>| -> Vec<(f64, f64)> {
        s.buckets
            .iter()
            .take(n)
            .enumerate()
            .filter_map(|(i, b)| pick(b).map(|y| (i as f64, y)))
            .collect()
    };
    let y_max = series
        .iter()
        .flat_map(|s| points(s, |b| b.p99))
        .map(|p| p.1)
        .fold(1.0f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), 0f64..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < BUCKETS.len() {
                BUCKETS[i as usize].2.to_string()
            } else {
                String::new()
            }
        })
        .x_desc("flow size")
        .y_desc("slowdown (FCT / ideal FCT)")
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points(s, |b| b.p99),
                colour.stroke_width(3),
            ))
            .map_err(err)?
            .label(format!("{} p99", s.name))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3))
            });
        chart
            .draw_series(LineSeries::new(
                points(s, |b| b.p50),
                colour.stroke_width(1),
            ))
            .map_err(err)?
            .label(format!("{} p50", s.name))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(1))
            });
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperLeft, path)
}

/// queue_cdf.svg: the fraction of samples with the queue at or below x KB.
pub fn queue_cdf(path: &Path, title: &str, series: &[Series<'_>]) -> anyhow::Result<()> {
    let x_max = series
        .iter()
        .flat_map(|s| s.queue_cdf.iter().map(|p| p.0 as f64 / 1e3))
        .fold(1.0f64, f64::max)
        * 1.05;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..1.02f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("queue (KB)")
        .y_desc("CDF of samples")
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        // A step function: the fraction holds until the next length.
        let mut pts = Vec::new();
        let mut prev = 0.0;
        for &(bytes, frac) in s.queue_cdf {
            let x = bytes as f64 / 1e3;
            pts.push((x, prev));
            pts.push((x, frac));
            prev = frac;
        }
        pts.push((x_max, prev));
        chart
            .draw_series(LineSeries::new(pts, colour.stroke_width(2)))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    finish(&mut chart, &root, SeriesLabelPosition::LowerRight, path)
}
