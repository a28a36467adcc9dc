//! SVG charts of `tessera simulate`: predicted against measured step times (one point per
//! measured row, the line of equality, the ±10% band), and predicted step time against the
//! number of sub-batches (one line per step shape).

use std::path::Path;

use plotters::prelude::*;

use crate::report::{Compared, SimRow};

fn err(e: impl std::fmt::Display) -> String {
    format!("plot: {e}")
}

/// Predicted (y) against measured (x) step time, log-log.
pub fn predicted_vs_measured(path: &Path, rows: &[Compared], title: &str) -> Result<(), String> {
    if rows.is_empty() {
        return Err("nothing to plot".into());
    }
    let lo = rows
        .iter()
        .flat_map(|r| [r.predicted_ms, r.measured_ms])
        .fold(f64::INFINITY, f64::min)
        .max(1e-3)
        * 0.8;
    let hi = rows
        .iter()
        .flat_map(|r| [r.predicted_ms, r.measured_ms])
        .fold(0.0, f64::max)
        * 1.25;
    let root = SVGBackend::new(path, (640, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("measured step time (ms)")
        .y_desc("predicted step time (ms)")
        .draw()
        .map_err(err)?;
    let line = |f: f64| {
        (0..=40).map(move |i| {
            let x = lo * (hi / lo).powf(i as f64 / 40.0);
            (x, x * f)
        })
    };
    chart
        .draw_series(LineSeries::new(line(1.0), BLACK.stroke_width(1)))
        .map_err(err)?
        .label("predicted = measured");
    for f in [0.9, 1.1] {
        chart
            .draw_series(LineSeries::new(line(f), BLACK.mix(0.3).stroke_width(1)))
            .map_err(err)?;
    }
    let colors = [RED, BLUE, GREEN, MAGENTA];
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.tokens).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for (i, &t) in sizes.iter().enumerate() {
        let c = colors[i % colors.len()];
        chart
            .draw_series(
                rows.iter()
                    .filter(|r| r.tokens == t)
                    .map(|r| Circle::new((r.measured_ms, r.predicted_ms), 4, c.filled())),
            )
            .map_err(err)?
            .label(format!("{t} tokens"))
            .legend(move |(x, y)| Circle::new((x, y), 4, c.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// Predicted step time against S (split by tokens; S = 1 included), one line per step shape.
pub fn step_time_vs_s(path: &Path, rows: &[SimRow], title: &str) -> Result<(), String> {
    let pick: Vec<&SimRow> = rows
        .iter()
        .filter(|r| r.s == 1 || r.split == "tokens")
        .collect();
    if pick.is_empty() {
        return Err("nothing to plot".into());
    }
    let max_s = pick.iter().map(|r| r.s).max().unwrap_or(1);
    let mut shapes: Vec<(String, usize, usize)> = Vec::new();
    for r in &pick {
        let k = (r.phase.clone(), r.tokens, r.context);
        if !shapes.contains(&k) {
            shapes.push(k);
        }
    }
    let root = SVGBackend::new(path, (720, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((1, 1));
    let mut chart = ChartBuilder::on(&areas[0])
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1usize..max_s, 0f64..1.15)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("sub-batches S (split by tokens)")
        .y_desc("step time relative to S = 1")
        .draw()
        .map_err(err)?;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    for (i, (phase, tokens, context)) in shapes.iter().enumerate() {
        let c = colors[i % colors.len()];
        let line: Vec<&&SimRow> = pick
            .iter()
            .filter(|r| &r.phase == phase && r.tokens == *tokens && r.context == *context)
            .collect();
        let base = line
            .iter()
            .find(|r| r.s == 1)
            .map_or(1.0, |r| r.predicted_ms);
        let label = if phase == "decode" {
            format!("decode, {tokens} seqs at {context}")
        } else {
            format!("prefill, {tokens} tokens")
        };
        chart
            .draw_series(LineSeries::new(
                line.iter().map(|r| (r.s, r.predicted_ms / base)),
                c.stroke_width(2),
            ))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}
