//! SVG charts of a GEMM sweep: one panel per (dtype, K, N), GFLOP/s against M (log2 axis),
//! with lines for the planned, oracle, best-fixed and OpenBLAS figures.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use tessera_core::DType;

use crate::gemm::{dtype_name, Row};

const PANEL_W: u32 = 360;
const PANEL_H: u32 = 260;

/// The (K, N) panels of the sweep in first-seen order.
pub fn panels(rows: &[Row]) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = Vec::new();
    for r in rows {
        if !v.contains(&(r.k, r.n)) {
            v.push((r.k, r.n));
        }
    }
    v
}

/// Writes the chart grid (rows: dtypes, columns: shapes) to `path` as SVG.
pub fn plot_gemm(path: &Path, rows: &[Row], dtypes: &[DType]) -> Result<()> {
    let shapes = panels(rows);
    if shapes.is_empty() || dtypes.is_empty() {
        return Err(anyhow!("nothing to plot"));
    }
    let (nr, nc) = (dtypes.len(), shapes.len());
    let root =
        SVGBackend::new(path, (PANEL_W * nc as u32, PANEL_H * nr as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let areas = root.split_evenly((nr, nc));
    for (i, &dtype) in dtypes.iter().enumerate() {
        for (j, &(k, n)) in shapes.iter().enumerate() {
            let mut pts: Vec<&Row> = rows
                .iter()
                .filter(|r| r.dtype == dtype && r.k == k && r.n == n)
                .collect();
            pts.sort_by_key(|r| r.m);
            draw_panel(&areas[i * nc + j], dtype, k, n, &pts).map_err(|e| anyhow!("plot: {e}"))?;
        }
    }
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}

type Series<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    dtype: DType,
    k: usize,
    n: usize,
    pts: &[&Row],
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    if pts.is_empty() {
        return Ok(());
    }
    let x = |r: &Row| (r.m as f64).log2();
    let mut series: Vec<Series> = vec![
        (
            "planned",
            RGBColor(214, 39, 40),
            pts.iter().map(|r| (x(r), r.gflops_planned)).collect(),
        ),
        (
            "oracle",
            RGBColor(31, 119, 180),
            pts.iter().map(|r| (x(r), r.gflops_oracle)).collect(),
        ),
        (
            "fixed",
            RGBColor(44, 160, 44),
            pts.iter().map(|r| (x(r), r.gflops_fixed)).collect(),
        ),
    ];
    let blas: Vec<(f64, f64)> = pts
        .iter()
        .filter_map(|r| r.gflops_openblas.map(|g| (x(r), g)))
        .collect();
    if !blas.is_empty() {
        series.push(("openblas", RGBColor(128, 128, 128), blas));
    }
    for s in series.iter_mut() {
        s.2.retain(|p| p.1.is_finite());
    }
    let xmax = pts.iter().map(|r| x(r)).fold(0.0, f64::max).max(1.0);
    let ymax = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{} K={k} N={n}", dtype_name(dtype)),
            ("sans-serif", 14),
        )
        .margin(6)
        .x_label_area_size(28)
        .y_label_area_size(44)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)?;
    chart
        .configure_mesh()
        .x_labels(xmax as usize + 1)
        .x_label_formatter(&|v| format!("{}", 2f64.powf(*v).round()))
        .x_desc("M")
        .y_desc("GFLOP/s")
        .draw()?;
    for (name, color, data) in series {
        chart
            .draw_series(LineSeries::new(data, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    Ok(())
}
