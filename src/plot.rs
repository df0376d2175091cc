//! SVG line charts (plotters): a grid of panels, each with titled axes and a legend.

use anyhow::{anyhow, Context};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use std::path::Path;
use syncopate_sim::base::chart::Panel;

const PANEL_WIDTH: u32 = 620;
const PANEL_HEIGHT: u32 = 440;
const TITLE_HEIGHT: u32 = 40;

/// Distinct colours for up to ten series; more cycle with a different marker.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Writes the panels, `columns` per row, under a title. X axes spanning a factor of 8 or more
/// (GPU counts 1..64) are logarithmic so that small counts stay readable.
pub fn write_svg(path: &Path, title: &str, panels: &[Panel], columns: usize) -> anyhow::Result<()> {
    let columns = columns.clamp(1, panels.len().max(1));
    let rows = panels.len().div_ceil(columns).max(1);
    let size = (
        PANEL_WIDTH * columns as u32,
        PANEL_HEIGHT * rows as u32 + TITLE_HEIGHT,
    );
    let root = SVGBackend::new(path, size).into_drawing_area();
    let plot_error = |e: &dyn std::fmt::Display| anyhow!("cannot draw {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let (head, body) = root.split_vertically(TITLE_HEIGHT);
    head.titled(title, ("sans-serif", 22))
        .map_err(|e| plot_error(&e))?;
    for (panel, area) in panels.iter().zip(body.split_evenly((rows, columns))) {
        draw_panel(&area, panel).map_err(|e| plot_error(&e))?;
    }
    root.present()
        .with_context(|| format!("cannot write {}", path.display()))
}

fn draw_panel(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    panel: &Panel,
) -> Result<(), Box<dyn std::error::Error>> {
    let points = || panel.series.iter().flat_map(|s| s.points.iter());
    let (x_min, x_max) = bounds(points().map(|p| p.0));
    let (_, y_max) = bounds(points().map(|p| p.1));
    let y_range = 0.0..(y_max * 1.12).max(1e-9);
    if x_min > 0.0 && x_max / x_min >= 8.0 {
        let x_range = (x_min / 1.15..x_max * 1.15).log_scale();
        draw_chart(area, panel, x_range, y_range)
    } else {
        let pad = ((x_max - x_min) * 0.05).max(0.5);
        draw_chart(area, panel, x_min - pad..x_max + pad, y_range)
    }
}

fn draw_chart<X>(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    panel: &Panel,
    x_range: X,
    y_range: std::ops::Range<f64>,
) -> Result<(), Box<dyn std::error::Error>>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(x_range, y_range)?;
    chart
        .configure_mesh()
        .x_desc(panel.x_label.as_str())
        .y_desc(panel.y_label.as_str())
        .x_label_formatter(&|x| format_tick(*x))
        .y_label_formatter(&|y| format_tick(*y))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, series) in panel.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = ShapeStyle::from(&color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(series.points.iter().copied(), style))?
            .label(series.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        if i < COLORS.len() {
            chart.draw_series(
                series
                    .points
                    .iter()
                    .map(|&p| Circle::new(p, 3, color.filled())),
            )?;
        } else {
            chart.draw_series(
                series
                    .points
                    .iter()
                    .map(|&p| TriangleMarker::new(p, 5, color.filled())),
            )?;
        }
    }
    if !panel.series.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 12))
            .draw()?;
    }
    Ok(())
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo.is_finite() {
        (lo, hi)
    } else {
        (0.0, 1.0)
    }
}

/// Whole numbers without decimals, others with as few as keep them distinct.
fn format_tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
