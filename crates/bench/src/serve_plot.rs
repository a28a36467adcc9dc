//! SVG charts of `tessera bench serve`: for a sweep, p50/p99 TTFT and TPOT and the output
//! token throughput against concurrency (log2 axis); for a single run, each request's TTFT
//! and TPOT against the time it was sent.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use crate::serve::{per_request, Load, Outcome, RunStats};

const PANEL_W: u32 = 400;
const PANEL_H: u32 = 300;

/// A line's legend name, colour and points.
pub(crate) type Series = (String, RGBColor, Vec<(f64, f64)>);

/// How the x axis is labelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum XAxis {
    /// The values themselves.
    Linear,
    /// x values are log2 of the real ones, labelled as powers of 2.
    Log2,
    /// As `Log2`, and x = -1 (below 2^0) stands for 0, labelled `base`.
    Log2Base,
}

const RED: RGBColor = RGBColor(214, 39, 40);
const BLUE: RGBColor = RGBColor(31, 119, 180);
const GREEN: RGBColor = RGBColor(44, 160, 44);

/// Latency and throughput against concurrency, one point per measurement.
pub fn plot_sweep(path: &Path, runs: &[RunStats]) -> Result<()> {
    let pts: Vec<(f64, &RunStats)> = runs
        .iter()
        .filter_map(|r| match r.load {
            Load::Concurrency(c) if c > 0 => Some(((c as f64).log2(), r)),
            _ => None,
        })
        .collect();
    if pts.is_empty() {
        return Err(anyhow!("nothing to plot"));
    }
    let line = |f: fn(&RunStats) -> f64| -> Vec<(f64, f64)> {
        pts.iter()
            .map(|(x, r)| (*x, f(r)))
            .filter(|p| p.1.is_finite())
            .collect()
    };
    let panels: Vec<(&str, Vec<Series>)> = vec![
        (
            "TTFT (ms)",
            vec![
                ("p50".into(), BLUE, line(|r| r.ttft_ms.p50)),
                ("p99".into(), RED, line(|r| r.ttft_ms.p99)),
            ],
        ),
        (
            "TPOT (ms)",
            vec![
                ("p50".into(), BLUE, line(|r| r.tpot_ms.p50)),
                ("p99".into(), RED, line(|r| r.tpot_ms.p99)),
            ],
        ),
        (
            "output tokens/s",
            vec![("output tok/s".into(), GREEN, line(|r| r.output_tok_per_s))],
        ),
    ];
    let root = SVGBackend::new(path, (PANEL_W * panels.len() as u32, PANEL_H)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let areas = root.split_evenly((1, panels.len()));
    for (area, (title, series)) in areas.iter().zip(panels) {
        draw_panel(
            area,
            title,
            "concurrency",
            XAxis::Log2,
            false,
            SeriesLabelPosition::UpperLeft,
            series,
        )
        .map_err(|e| anyhow!("plot: {e}"))?;
    }
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}

/// Each completed request's TTFT and TPOT against the time it was sent.
pub fn plot_requests(path: &Path, outcomes: &[Outcome], label: &str) -> Result<()> {
    let ttft = per_request(outcomes, |t| Some(t.ttft * 1e3));
    let tpot = per_request(outcomes, |t| t.tpot.map(|p| p * 1e3));
    if ttft.is_empty() {
        return Err(anyhow!("no completed request to plot"));
    }
    let root = SVGBackend::new(path, (PANEL_W * 2, PANEL_H)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let areas = root.split_evenly((1, 2));
    let t1 = format!("TTFT (ms), {label}");
    let t2 = format!("TPOT (ms), {label}");
    draw_panel(
        &areas[0],
        &t1,
        "request sent at (s)",
        XAxis::Linear,
        true,
        SeriesLabelPosition::UpperLeft,
        vec![("TTFT".into(), BLUE, ttft)],
    )
    .map_err(|e| anyhow!("plot: {e}"))?;
    draw_panel(
        &areas[1],
        &t2,
        "request sent at (s)",
        XAxis::Linear,
        true,
        SeriesLabelPosition::UpperLeft,
        vec![("TPOT".into(), RED, tpot)],
    )
    .map_err(|e| anyhow!("plot: {e}"))?;
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}

/// One chart, y from 0; `scatter`: points instead of lines.
pub(crate) fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x_desc: &str,
    x_axis: XAxis,
    scatter: bool,
    legend: SeriesLabelPosition,
    series: Vec<Series>,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let xs = || series.iter().flat_map(|s| s.2.iter().map(|p| p.0));
    let (mut xmin, mut xmax) = (
        xs().fold(f64::INFINITY, f64::min),
        xs().fold(f64::NEG_INFINITY, f64::max),
    );
    if !xmin.is_finite() || !xmax.is_finite() {
        (xmin, xmax) = (0.0, 1.0);
    }
    if xmax - xmin < 1e-9 {
        xmin -= 0.5;
        xmax += 0.5;
    }
    let pad = (xmax - xmin) * 0.03;
    let ymax = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let ymax = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 14))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(52)
        .build_cartesian_2d((xmin - pad)..(xmax + pad), 0f64..ymax)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc);
    let fmt_log = |v: &f64| format!("{}", 2f64.powf(*v).round());
    let fmt_base = |v: &f64| {
        if *v < -0.5 {
            "base".to_string()
        } else {
            fmt_log(v)
        }
    };
    match x_axis {
        XAxis::Linear => {}
        XAxis::Log2 => {
            mesh.x_labels(((xmax - xmin).ceil() as usize + 1).max(2))
                .x_label_formatter(&fmt_log);
        }
        XAxis::Log2Base => {
            mesh.x_labels(((xmax - xmin).ceil() as usize + 1).max(2))
                .x_label_formatter(&fmt_base);
        }
    }
    mesh.draw()?;
    for (name, color, data) in series {
        if scatter {
            chart
                .draw_series(data.iter().map(|&p| Circle::new(p, 2, color.filled())))?
                .label(name)
                .legend(move |(x, y)| Circle::new((x + 8, y), 3, color.filled()));
        } else {
            chart
                .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            chart.draw_series(data.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(legend)
        .draw()?;
    Ok(())
}
