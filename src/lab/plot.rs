//! The picture: admitted-in-trailing-window over time, one line per
//! limiter, one panel per shape, the limit as a dashed line.

use std::path::Path;

use plotters::prelude::*;

use super::{trailing_series, LabError, Settings};

/// One shape's panel: each limiter's admitted times (true ns, sorted).
#[derive(Clone, Debug)]
pub struct Panel {
    /// The panel's title (the shape).
    pub title: String,
    /// `(limiter label, admitted times)` per line.
    pub series: Vec<(String, Vec<u64>)>,
    /// The last arrival of the shape (ns); the panel runs one window past it.
    pub last_arrival: u64,
}

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

/// Writes the panels to an SVG file at `path`, two panels per row.
///
/// # Errors
/// [`LabError::Plot`] when the file cannot be written.
pub fn write_svg(path: &Path, settings: &Settings, panels: &[Panel]) -> Result<(), LabError> {
    let cols = if panels.len() > 1 { 2 } else { 1 };
    let rows = panels.len().div_ceil(cols).max(1);
    let size = (760 * cols as u32, 460 * rows as u32);
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    for (panel, area) in panels.iter().zip(root.split_evenly((rows, cols)).iter()) {
        draw_panel(area, settings, panel)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

fn plot_err<E: std::fmt::Display>(e: E) -> LabError {
    LabError::Plot(e.to_string())
}

fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    settings: &Settings,
    panel: &Panel,
) -> Result<(), LabError> {
    let window = settings.window_ns();
    let secs = |ns: u64| ns as f64 / 1e9;
    let series: Vec<(&str, Vec<(u64, u64)>)> = panel
        .series
        .iter()
        .map(|(name, times)| (name.as_str(), trailing_series(times, window)))
        .collect();
    let peak = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.1))
        .chain([settings.limit()])
        .max()
        .unwrap_or(1);
    let x_end = secs(panel.last_arrival.saturating_add(window));
    let y_end = (peak as f64 * 1.15).ceil();

    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..x_end, 0f64..y_end)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc(format!(
            "admitted in trailing {:?}",
            std::time::Duration::from_nanos(window)
        ))
        .light_line_style(WHITE)
        .draw()
        .map_err(plot_err)?;

    // Earlier lines are drawn wider, so lines lying on each other stay
    // visible as coloured edges.
    let n = series.len();
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let width = 2 + 2 * (n - 1 - i) as u32 / 2;
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|&(x, y)| (secs(x), y as f64)),
                color.stroke_width(width),
            ))
            .map_err(plot_err)?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3))
            });
    }
    let limit = settings.limit() as f64;
    chart
        .draw_series(DashedLineSeries::new(
            [(0.0, limit), (x_end, limit)],
            8,
            6,
            BLACK.stroke_width(2),
        ))
        .map_err(plot_err)?
        .label(format!("limit {}", settings.limit()))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(plot_err)?;
    Ok(())
}
