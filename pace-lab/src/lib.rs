//! The limiter lab: the common limiters side by side, in
//! virtual time, on the traffic shapes that tell them apart.
//!
//! Everything here is single-threaded and deterministic. A [`Limiter`] decides
//! one key's requests at the timestamps it is shown; [`Shape`]s generate
//! arrival times; [`run`] plays arrivals through one limiter (or one per node)
//! and measures the admitted stream by its *worst window*: the most requests
//! admitted in any half-open window `[t, t + W)` of the limit's length, which
//! is what the service behind the limiter has to survive.
//!
//! The lineup ([`LimiterSpec::lineup`]) is the fixed window counter, a token
//! bucket with capacity = limit and a small one, the sliding log, the
//! sliding-window (two-counter) estimate, a conservative sub-window counter,
//! and the crate's real [`Pace`](pace::Pace) driven by a
//! [`ManualClock`](pace::ManualClock). The `pace-lab` binary prints the
//! comparison table, JSON rows and an SVG picture (README.md).
//!
//! The lab is its own crate because its random shapes, plots and JSON need
//! dependencies the limiter itself does not; it uses only `pace`'s public API.

mod limiters;
mod metrics;
mod plot;
mod run;
mod shapes;

use std::fmt;
use std::time::Duration;

pub use limiters::{
    FixedWindow, Limiter, LimiterSpec, PaceLimiter, SlidingLog, SlidingWindow, SubWindow,
    TokenBucket,
};
pub use metrics::{trailing_series, worst_window};
pub use plot::{write_svg, Panel};
pub use run::{compare, run, Balancer, Clocks, Comparison, Deployment, Outcome, Row, Topology};
pub use shapes::{parse_arrivals, parse_shapes, Shape};

/// The largest limit the lab accepts: shapes send up to 20 x the limit.
pub const MAX_LIMIT: u64 = 1_000_000;
/// The longest window the lab accepts (about a year): shapes run 10 windows.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// The limit under test: `limit` requests per `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    limit: u64,
    window_ns: u64,
}

impl Settings {
    /// `limit` requests per `window`.
    ///
    /// # Errors
    /// [`LabError::ZeroLimit`], [`LabError::ZeroWindow`], or
    /// [`LabError::OutOfRange`] above [`MAX_LIMIT`] / [`MAX_WINDOW`].
    pub fn new(limit: u64, window: Duration) -> Result<Settings, LabError> {
        if limit == 0 {
            return Err(LabError::ZeroLimit);
        }
        if window.is_zero() {
            return Err(LabError::ZeroWindow);
        }
        if limit > MAX_LIMIT {
            return Err(LabError::OutOfRange(format!(
                "limit {limit} is above the lab's maximum of {MAX_LIMIT}"
            )));
        }
        if window > MAX_WINDOW {
            return Err(LabError::OutOfRange(format!(
                "window {window:?} is longer than the lab's maximum of {MAX_WINDOW:?}"
            )));
        }
        Ok(Settings {
            limit,
            window_ns: window.as_nanos() as u64,
        })
    }

    /// Requests allowed per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window in nanoseconds.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// The window.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns)
    }

    /// The same window with the limit divided by `n` (at least 1), for
    /// "each of n nodes gets limit/n".
    pub fn divided(&self, n: u64) -> Settings {
        Settings {
            limit: (self.limit / n.max(1)).max(1),
            window_ns: self.window_ns,
        }
    }
}

/// Why the lab could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LabError {
    /// The limit is zero.
    ZeroLimit,
    /// The window is zero.
    ZeroWindow,
    /// A number is outside what the lab supports.
    OutOfRange(String),
    /// No shape has this name.
    UnknownShape(String),
    /// An arrivals file line could not be read.
    Arrivals {
        /// 1-based line number.
        line: usize,
        /// What was wrong with it.
        message: String,
    },
    /// An arrivals file held no timestamp.
    NoArrivals,
    /// A file could not be read.
    Read(String),
    /// A limiter could not be configured (a capacity of zero, a capacity too
    /// large for its arithmetic, or a rate `Pace` rejects).
    Config(String),
    /// The SVG could not be written.
    Plot(String),
}

impl fmt::Display for LabError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabError::ZeroLimit => f.write_str("the limit must be at least 1 request"),
            LabError::ZeroWindow => f.write_str("the window must be longer than zero"),
            LabError::OutOfRange(m) => f.write_str(m),
            LabError::UnknownShape(name) => write!(
                f,
                "unknown shape {name:?}; known shapes: {}, or the groups `documents` and `all`",
                Shape::BUILT_IN
                    .iter()
                    .map(|s| s.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            LabError::Arrivals { line, message } => {
                write!(f, "arrivals file, line {line}: {message}")
            }
            LabError::NoArrivals => f.write_str("the arrivals file holds no timestamp"),
            LabError::Read(m) => f.write_str(m),
            LabError::Config(m) => write!(f, "limiter configuration: {m}"),
            LabError::Plot(m) => write!(f, "could not draw the SVG: {m}"),
        }
    }
}

impl std::error::Error for LabError {}

/// The rows as an aligned text table, a blank line between shapes.
pub fn text_table(rows: &[Row]) -> String {
    let head = [
        "shape",
        "limiter",
        "offered",
        "admitted",
        "worst_window",
        "refused_with_right",
        "bytes_per_key",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.shape.clone(),
                r.limiter.clone(),
                r.offered.to_string(),
                r.admitted.to_string(),
                r.worst_window.to_string(),
                r.refused_with_right.to_string(),
                r.bytes_per_key.to_string(),
            ]
        })
        .collect();
    let mut width = head.map(str::len);
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cols: [&str; 7]| {
        let mut s = String::new();
        for (i, (c, w)) in cols.iter().zip(width).enumerate() {
            let pad = w - c.chars().count();
            if i < 2 {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            }
            s.push_str(if i < 6 { "  " } else { "\n" });
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(head);
    let mut last_shape: Option<&str> = None;
    for (row, c) in rows.iter().zip(&cells) {
        if last_shape.is_some_and(|s| s != row.shape) {
            out.push('\n');
        }
        last_shape = Some(&row.shape);
        out.push_str(&line([&c[0], &c[1], &c[2], &c[3], &c[4], &c[5], &c[6]]));
    }
    out
}
