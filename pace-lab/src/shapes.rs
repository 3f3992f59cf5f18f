//! Traffic shapes: arrival times of one client's requests, in nanoseconds of
//! true time, sorted.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp};

use crate::{LabError, Settings};

/// How long the steady and random shapes run, in windows.
pub const RUN_WINDOWS: u64 = 10;
/// How many windows the quiet client stays quiet before its burst.
pub const QUIET_WINDOWS: u64 = 9;

/// A traffic shape for a limit of L requests per window W.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// L requests spread evenly over the last second of the window `[0, W)`
    /// and L over the first second of the next one (half the window when it
    /// is shorter than two seconds): the adversary who knows the edge.
    Boundary,
    /// 2L per window, evenly spaced from time 0, for 10 windows.
    Steady2x,
    /// 1.1 L per window, evenly spaced from time 0, for 10 windows.
    Steady11x,
    /// Nothing for 9 windows, then 3L requests at the same instant.
    QuietBurst,
    /// Poisson arrivals at 1.5 L per window for 10 windows.
    Poisson15x,
    /// On/off bursts for 10 windows: "on" periods (exponential, mean W/6)
    /// of Poisson arrivals at 4L per window, "off" periods (exponential,
    /// mean W/2) of silence; L per window on average.
    OnOff,
    /// Arrivals read from a file ([`parse_arrivals`]).
    File {
        /// Shown as `file:NAME`.
        name: String,
        /// Sorted arrival times in ns.
        times: Vec<u64>,
    },
}

impl Shape {
    /// The built-in shapes, in table order (`--shape all`).
    pub const BUILT_IN: [Shape; 6] = [
        Shape::Boundary,
        Shape::Steady2x,
        Shape::Steady11x,
        Shape::QuietBurst,
        Shape::Poisson15x,
        Shape::OnOff,
    ];

    /// The four shapes of the design documents (`--shape documents`).
    pub const DOCUMENTS: [Shape; 4] = [
        Shape::Boundary,
        Shape::Steady2x,
        Shape::Steady11x,
        Shape::QuietBurst,
    ];

    /// The shape's name, as `--shape` takes it.
    pub fn name(&self) -> String {
        match self {
            Shape::Boundary => "boundary".into(),
            Shape::Steady2x => "steady-2x".into(),
            Shape::Steady11x => "steady-1.1x".into(),
            Shape::QuietBurst => "quiet-burst".into(),
            Shape::Poisson15x => "poisson-1.5x".into(),
            Shape::OnOff => "on-off".into(),
            Shape::File { name, .. } => format!("file:{name}"),
        }
    }

    /// The arrival times (ns, sorted) for `settings`; `seed` drives the
    /// random shapes.
    pub fn arrivals(&self, settings: &Settings, seed: u64) -> Vec<u64> {
        let l = settings.limit();
        let w = settings.window_ns();
        match self {
            Shape::Boundary => {
                let width = (w / 2).min(1_000_000_000);
                let spread = |base: u64| {
                    (0..l).map(move |i| base + (i as u128 * width as u128 / l as u128) as u64)
                };
                spread(w - width).chain(spread(w)).collect()
            }
            Shape::Steady2x => steady(l, w, 2, 1),
            Shape::Steady11x => steady(l, w, 11, 10),
            Shape::QuietBurst => vec![QUIET_WINDOWS * w; 3 * l as usize],
            Shape::Poisson15x => {
                let mut rng = StdRng::seed_from_u64(seed);
                let end = RUN_WINDOWS * w;
                poisson(&mut rng, 0, end, 1.5 * l as f64 / w as f64)
            }
            Shape::OnOff => {
                let mut rng = StdRng::seed_from_u64(seed ^ 0x6f6e_6f66);
                let end = RUN_WINDOWS * w;
                let on_len = Exp::new(6.0 / w as f64).expect("positive rate");
                let off_len = Exp::new(2.0 / w as f64).expect("positive rate");
                let mut out = Vec::new();
                let mut t = 0u64;
                while t < end {
                    let on_end = end.min(t.saturating_add(on_len.sample(&mut rng) as u64));
                    out.extend(poisson(&mut rng, t, on_end, 4.0 * l as f64 / w as f64));
                    t = on_end.saturating_add(off_len.sample(&mut rng) as u64);
                }
                out
            }
            Shape::File { times, .. } => times.clone(),
        }
    }
}

/// `num/den x l` arrivals per window `w`, evenly spaced from 0, for
/// [`RUN_WINDOWS`] windows: arrival `i` at `floor(i x w x den / (l x num))`.
fn steady(l: u64, w: u64, num: u64, den: u64) -> Vec<u64> {
    let end = RUN_WINDOWS as u128 * w as u128;
    (0u128..)
        .map(|i| i * w as u128 * den as u128 / (l as u128 * num as u128))
        .take_while(|&t| t < end)
        .map(|t| t as u64)
        .collect()
}

/// Poisson arrivals at `per_ns` in `[start, end)`.
fn poisson(rng: &mut StdRng, start: u64, end: u64, per_ns: f64) -> Vec<u64> {
    let gap = Exp::new(per_ns).expect("positive rate");
    let mut out = Vec::new();
    let mut t = start as f64;
    loop {
        t += gap.sample(rng);
        if t >= end as f64 {
            return out;
        }
        out.push(t as u64);
    }
}

/// Parses `--shape`: comma-separated shape names, or the groups `all` (the
/// built-in shapes) and `documents` (the design documents' four).
///
/// # Errors
/// [`LabError::UnknownShape`] naming the first unknown name.
pub fn parse_shapes(spec: &str) -> Result<Vec<Shape>, LabError> {
    let mut out: Vec<Shape> = Vec::new();
    for name in spec.split(',').map(str::trim) {
        let group: Vec<Shape> = match name {
            "all" => Shape::BUILT_IN.to_vec(),
            "documents" => Shape::DOCUMENTS.to_vec(),
            _ => vec![Shape::BUILT_IN
                .iter()
                .find(|s| s.name() == name)
                .cloned()
                .ok_or_else(|| LabError::UnknownShape(name.to_string()))?],
        };
        for s in group {
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    Ok(out)
}

/// Parses an arrivals file: one timestamp per line, in seconds, decimal
/// (`12`, `12.5`, `0.000000001`). Blank lines and lines starting with `#` are
/// skipped. Digits past the ninth decimal (below a nanosecond) are dropped.
/// The result is sorted.
///
/// # Errors
/// [`LabError::Arrivals`] with the line number for anything that is not a
/// non-negative decimal number of seconds, [`LabError::NoArrivals`] for a file
/// without timestamps.
pub fn parse_arrivals(text: &str) -> Result<Vec<u64>, LabError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let ns = parse_seconds(line).map_err(|message| LabError::Arrivals {
            line: i + 1,
            message,
        })?;
        out.push(ns);
    }
    if out.is_empty() {
        return Err(LabError::NoArrivals);
    }
    out.sort_unstable();
    Ok(out)
}

fn parse_seconds(s: &str) -> Result<u64, String> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) {
        return Err(format!(
            "{s:?} is not a non-negative decimal number of seconds"
        ));
    }
    let too_large = || format!("{s:?} seconds is too far in the future");
    let secs: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_large())?
    };
    let mut nanos = 0u64;
    for (i, b) in frac.bytes().take(9).enumerate() {
        nanos += (b - b'0') as u64 * 10u64.pow(8 - i as u32);
    }
    secs.checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(nanos))
        .filter(|&n| n <= u64::MAX / 4)
        .ok_or_else(too_large)
}
