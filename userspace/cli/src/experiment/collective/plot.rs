//! jct.svg: each run's JCT per iteration, one line per transport, loss,
//! op and size, on a log scale (a retransmission timeout stands out from
//! the lossless steps by orders of magnitude).

use std::path::Path;

use plotters::prelude::*;

use super::super::plot::{err, finish};

use super::results::Figure;

const SIZE: (u32, u32) = (960, 540);

/// The series' name: "xroce 1% allreduce 64 KiB".
fn label(f: &Figure) -> String {
    let size = if f.bytes >= 1 << 20 && f.bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", f.bytes >> 20)
    } else if f.bytes >= 1 << 10 && f.bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", f.bytes >> 10)
    } else {
        format!("{} B", f.bytes)
    };
    format!("{} {}% {} {size}", f.transport, f.loss * 100.0, f.op)
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
