//! `pace-lab`: the common limiters side by side on traffic shapes, judged by
//! the worst window of the admitted stream. See README.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use pace_lab::{
    compare, parse_arrivals, parse_shapes, text_table, write_svg, Balancer, Clocks, LabError,
    LimiterSpec, Settings, Shape, Topology,
};

/// Compare rate limiters on traffic shapes by the worst window of what they
/// admit.
#[derive(Parser, Debug)]
#[command(name = "pace-lab", version)]
struct Args {
    /// Requests allowed per window.
    #[arg(long, default_value_t = 100)]
    limit: u64,

    /// The window, e.g. 60s, 1m, 500ms.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    window: Duration,

    /// Shapes, comma-separated: boundary, steady-2x, steady-1.1x,
    /// quiet-burst, poisson-1.5x, on-off; or `documents` (the design
    /// documents' four) or `all` [default: all, or none with --arrivals].
    #[arg(long)]
    shape: Option<String>,

    /// A file of arrival times, one per line, in seconds (decimal).
    #[arg(long)]
    arrivals: Option<PathBuf>,

    /// Nodes the client's requests are spread over.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    nodes: u64,

    /// How requests are spread over the nodes.
    #[arg(long, value_enum, default_value_t = BalancerArg::Rr)]
    balancer: BalancerArg,

    /// Node i's clock runs i x this ahead of true time, e.g. 2s.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    clock_offset: Duration,

    /// Each clock reading is off by a uniform random amount within +- this.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    jitter: Duration,

    /// Seed of the random shapes and of the clock jitter.
    #[arg(long, default_value_t = 1)]
    seed: u64,

    /// Capacity of the small token bucket [default: limit/10, at least 1].
    #[arg(long)]
    small_capacity: Option<u64>,

    /// Slots per window of the sub-window counter (k).
    #[arg(long, default_value_t = 6)]
    slots: u32,

    /// Print one JSON object per row instead of the table.
    #[arg(long)]
    json: bool,

    /// Draw admitted-in-trailing-window over time to this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum BalancerArg {
    /// Round robin.
    Rr,
    /// Node 0 takes half of the requests, the others share the rest.
    Uneven,
    /// Every request to node 0 (the client is hashed to one node).
    Sticky,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write e.g. 60s, 1m, 500ms)"))
}

/// Longest offset or jitter accepted (keeps readings far from overflow).
const MAX_SKEW: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

fn main() -> ExitCode {
    let args = Args::parse();
    match lab(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pace-lab: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn lab(args: &Args) -> Result<(), LabError> {
    let settings = Settings::new(args.limit, args.window)?;
    if args.clock_offset > MAX_SKEW || args.jitter > MAX_SKEW {
        return Err(LabError::OutOfRange(format!(
            "clock offset and jitter must be at most {MAX_SKEW:?}"
        )));
    }
    let mut shapes = match (&args.shape, &args.arrivals) {
        (Some(spec), _) => parse_shapes(spec)?,
        (None, Some(_)) => Vec::new(),
        (None, None) => Shape::BUILT_IN.to_vec(),
    };
    if let Some(path) = &args.arrivals {
        let text = std::fs::read_to_string(path)
            .map_err(|e| LabError::Read(format!("cannot read {}: {e}", path.display())))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        shapes.push(Shape::File {
            name,
            times: parse_arrivals(&text)?,
        });
    }
    let small = args
        .small_capacity
        .unwrap_or_else(|| LimiterSpec::small_capacity(&settings));
    let specs = LimiterSpec::lineup(&settings, small, args.slots);
    let topology = Topology {
        nodes: args.nodes,
        balancer: match args.balancer {
            BalancerArg::Rr => Balancer::RoundRobin,
            BalancerArg::Uneven => Balancer::Uneven,
            BalancerArg::Sticky => Balancer::Sticky,
        },
        clocks: Clocks {
            offset_ns: args.clock_offset.as_nanos() as u64,
            jitter_ns: args.jitter.as_nanos() as u64,
        },
        seed: args.seed,
    };
    let result = compare(&settings, &specs, &shapes, &topology, args.seed)?;
    if args.json {
        for row in &result.rows {
            println!(
                "{}",
                serde_json::to_string(row).map_err(|e| LabError::Config(e.to_string()))?
            );
        }
    } else {
        print!("{}", text_table(&result.rows));
    }
    if let Some(path) = &args.svg {
        write_svg(path, &settings, &result.panels)?;
    }
    Ok(())
}
