//! Line-chart data that sweeps and experiments produce and the CLI draws.
//!
//! The data is panels of labelled series.

/// One line of a panel: (x, y) points in drawing order.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The series' name in the panel's legend.
    pub label: String,
    /// (x, y) points in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// One chart with titled axes.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    /// The panel's caption.
    pub title: String,
    /// Description of the x axis.
    pub x_label: String,
    /// Description of the y axis.
    pub y_label: String,
    /// The lines drawn in the panel.
    pub series: Vec<Series>,
}

/// A figure to write: its file name, title, panels and how many panels per row.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// File name of the figure, relative to the directory it is written to.
    pub file: String,
    /// The figure's title, above its panels.
    pub title: String,
    /// The panels, row by row.
    pub panels: Vec<Panel>,
    /// Panels per row.
    pub columns: usize,
}
