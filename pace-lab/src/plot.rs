//! The picture: admitted-in-trailing-window over time, one line per
//! limiter, one panel per shape, the limit as a dashed line.

use std::path::Path;

use plotters::prelude::*;

use crate::{trailing_series, LabError, Settings};

/// One shape's panel: each limiter's admitted times (true ns, sorted).
#[derive(Clone, Debug)]
pub struct Panel {
    /// The panel's title (the shape).
    pub title: String,
    /// `(limiter label, admitted times)` per line.
    pub series: Vec<(String, Vec<u64>)>,
    /// The first arrival of the shape (ns); the panel starts one window
    /// before it.
    pub first_arrival: u64,
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

/// Writes the panels to an SVG file at `path`, two panels per row, one
/// legend for all of them on top.
///
/// # Errors
/// [`LabError::Plot`] when the file cannot be written.
pub fn write_svg(path: &Path, settings: &Settings, panels: &[Panel]) -> Result<(), LabError> {
    let cols = if panels.len() > 1 { 2 } else { 1 };
    let rows = panels.len().div_ceil(cols).max(1);
    let labels: Vec<String> = panels
        .first()
        .map(|p| p.series.iter().map(|(l, _)| l.clone()).collect())
        .unwrap_or_default();
    let width = 760 * cols as u32;
    let per_line = (width as usize / 260).max(1);
    let legend_height = 24 * (labels.len() + 1).div_ceil(per_line) as u32 + 16;
    let size = (width, 440 * rows as u32 + legend_height);
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (legend, grid) = root.split_vertically(legend_height);
    draw_legend(&legend, settings, &labels, per_line)?;
    for (panel, area) in panels.iter().zip(grid.split_evenly((rows, cols)).iter()) {
        draw_panel(area, settings, panel)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

fn plot_err<E: std::fmt::Display>(e: E) -> LabError {
    LabError::Plot(e.to_string())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Line width of series `i` of `n`: earlier lines are drawn wider, so lines
/// lying on each other stay visible as coloured edges.
fn line_width(i: usize, n: usize) -> u32 {
    2 + (5 * (n - 1 - i) / (n.max(2) - 1)) as u32
}

fn draw_legend(
    area: &Area<'_>,
    settings: &Settings,
    labels: &[String],
    per_line: usize,
) -> Result<(), LabError> {
    let font = ("sans-serif", 15).into_font();
    let entries = labels
        .iter()
        .enumerate()
        .map(|(i, l)| (l.clone(), COLORS[i % COLORS.len()].stroke_width(4)))
        .chain([(
            format!("limit {} (dashed)", settings.limit()),
            BLACK.stroke_width(2),
        )]);
    for (i, (label, style)) in entries.enumerate() {
        let x = 16 + 260 * (i % per_line) as i32;
        let y = 16 + 24 * (i / per_line) as i32;
        area.draw(&PathElement::new(vec![(x, y), (x + 28, y)], style))
            .map_err(plot_err)?;
        area.draw(&Text::new(label, (x + 36, y - 8), font.clone()))
            .map_err(plot_err)?;
    }
    Ok(())
}

fn draw_panel(area: &Area<'_>, settings: &Settings, panel: &Panel) -> Result<(), LabError> {
    let window = settings.window_ns();
    let secs = |ns: u64| ns as f64 / 1e9;
    let series: Vec<Vec<(u64, u64)>> = panel
        .series
        .iter()
        .map(|(_, times)| trailing_series(times, window))
        .collect();
    let peak = series
        .iter()
        .flat_map(|pts| pts.iter().map(|p| p.1))
        .chain([settings.limit()])
        .max()
        .unwrap_or(1);
    // From one window before the first arrival (or 0) to one window after
    // the last.
    let x_start = secs(panel.first_arrival.saturating_sub(window));
    let x_end = secs(panel.last_arrival.saturating_add(window));
    let y_end = (peak as f64 * 1.12).ceil();

    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(x_start..x_end, 0f64..y_end)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc(format!(
            "admitted in trailing {:?}",
            std::time::Duration::from_nanos(window)
        ))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE)
        .draw()
        .map_err(plot_err)?;

    let n = series.len();
    for (i, pts) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                thin(pts, (x_end - x_start) / 700.0, secs)
                    .into_iter()
                    .filter(|p| p.0 >= x_start),
                color.stroke_width(line_width(i, n)),
            ))
            .map_err(plot_err)?;
    }
    let limit = settings.limit() as f64;
    chart
        .draw_series(DashedLineSeries::new(
            [(x_start, limit), (x_end, limit)],
            8,
            6,
            BLACK.stroke_width(2),
        ))
        .map_err(plot_err)?;
    Ok(())
}

/// The points of a step series in seconds, thinned to what a picture of a
/// few thousand pixels can show: within each `column` of x, the first, the
/// lowest, the highest and the last point, in order. Peaks survive.
fn thin(pts: &[(u64, u64)], column: f64, secs: impl Fn(u64) -> f64) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    let mut i = 0;
    while i < pts.len() {
        let col = (secs(pts[i].0) / column).floor();
        let mut j = i;
        while j < pts.len() && (secs(pts[j].0) / column).floor() == col {
            j += 1;
        }
        let group = &pts[i..j];
        let lo = group.iter().enumerate().min_by_key(|p| p.1 .1).map(|p| p.0);
        let hi = group.iter().enumerate().max_by_key(|p| p.1 .1).map(|p| p.0);
        let mut keep = vec![0, group.len() - 1];
        keep.extend(lo);
        keep.extend(hi);
        keep.sort_unstable();
        keep.dedup();
        out.extend(keep.iter().map(|&k| (secs(group[k].0), group[k].1 as f64)));
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::thin;

    #[test]
    fn thinning_keeps_first_last_and_extremes_of_each_column() {
        let pts: Vec<(u64, u64)> = vec![(0, 0), (1, 5), (2, 1), (3, 9), (4, 2), (10, 3), (11, 4)];
        // Columns of width 5: x in [0, 5) and [10, 15).
        assert_eq!(
            thin(&pts, 5.0, |x| x as f64),
            vec![(0.0, 0.0), (3.0, 9.0), (4.0, 2.0), (10.0, 3.0), (11.0, 4.0)]
        );
        assert!(thin(&[], 1.0, |x| x as f64).is_empty());
    }
}
