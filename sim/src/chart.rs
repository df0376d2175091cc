//! Line-chart data that sweeps and experiments produce and the CLI draws.
//!
//! The data is panels of labelled series.

/// One line of a panel: (x, y) points in drawing order.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart with titled axes.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

/// A figure to write: its file name, title, panels and how many panels per row.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    pub file: String,
    pub title: String,
    pub panels: Vec<Panel>,
    pub columns: usize,
}
