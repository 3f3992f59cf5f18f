//! Playing arrivals through limiters, on one node or several, with perfect
//! or imperfect clocks, and measuring the result.

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::{worst_window, LabError, Limiter, LimiterSpec, Panel, Settings, Shape};

/// How requests are spread over nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Balancer {
    /// Request `i` goes to node `i mod N`.
    RoundRobin,
    /// Node 0 takes every other request; the others share the rest round
    /// robin (for 3 nodes: 1/2, 1/4, 1/4).
    Uneven,
    /// Every request of the client goes to node 0, as a balancer hashing the
    /// client to a node does.
    Sticky,
}

impl Balancer {
    /// The node that gets request number `i` out of `nodes`.
    pub fn node(&self, i: u64, nodes: u64) -> u64 {
        if nodes <= 1 {
            return 0;
        }
        match self {
            Balancer::RoundRobin => i % nodes,
            Balancer::Uneven if i.is_multiple_of(2) => 0,
            Balancer::Uneven => 1 + (i / 2) % (nodes - 1),
            Balancer::Sticky => 0,
        }
    }

    /// Short name used in shape labels.
    pub fn name(&self) -> &'static str {
        match self {
            Balancer::RoundRobin => "rr",
            Balancer::Uneven => "uneven",
            Balancer::Sticky => "sticky",
        }
    }
}

/// What each node's clock reads for a request at true time `t`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Clocks {
    /// Node `i`'s clock runs `i x offset_ns` ahead of true time.
    pub offset_ns: u64,
    /// Every reading is moved by a uniform random amount in
    /// `[-jitter_ns, +jitter_ns]` (never below zero).
    pub jitter_ns: u64,
}

/// Nodes, balancer and clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Nodes the client's requests are spread over (at least 1).
    pub nodes: u64,
    /// How they are spread.
    pub balancer: Balancer,
    /// Each node's clock.
    pub clocks: Clocks,
    /// Seed of the clock jitter.
    pub seed: u64,
}

impl Default for Topology {
    fn default() -> Self {
        Topology {
            nodes: 1,
            balancer: Balancer::RoundRobin,
            clocks: Clocks::default(),
            seed: 1,
        }
    }
}

/// Where the limiter state lives when there are several nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deployment {
    /// Each node has its own limiter with the full limit.
    PerNode,
    /// Each node has its own limiter with the limit divided by the nodes.
    PerNodeDivided,
    /// One limiter shared by all nodes (a central store); each request is
    /// decided at the clock reading of the node that forwards it.
    Shared,
}

/// What one limiter did to one arrival stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// True times (ns) of the admitted requests, sorted.
    pub admitted: Vec<u64>,
    /// The most admitted in any window `[t, t + W)` of true time.
    pub worst_window: u64,
    /// Requests refused while the client was entitled to them: the
    /// client's true count over the trailing window `(t - W, t]` (its
    /// admitted requests plus those refused with right) was below the limit.
    pub refused_with_right: u64,
    /// The most bytes of state the client's key held at once, summed over
    /// the nodes its requests reached.
    pub bytes_per_key: usize,
}

/// One line of the comparison.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The limiter's label.
    pub limiter: String,
    /// The shape's name (with the balancer when there are several nodes).
    pub shape: String,
    /// Requests offered (not in the JSON rows).
    #[serde(skip)]
    pub offered: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Most admitted in any window of the limit's length.
    pub worst_window: u64,
    /// Refused while the client was under the limit.
    pub refused_with_right: u64,
    /// Bytes of state per key.
    pub bytes_per_key: usize,
}

/// Plays `arrivals` (true times, ns, sorted) through `spec` for `settings`
/// deployed as `deployment` over `topology`; measures against `settings`.
///
/// # Errors
/// [`LabError::Config`] when the limiter cannot be built.
pub fn run(
    spec: &LimiterSpec,
    settings: &Settings,
    arrivals: &[u64],
    topology: &Topology,
    deployment: Deployment,
) -> Result<Outcome, LabError> {
    let nodes = topology.nodes.max(1);
    let (node_spec, node_settings, count) = match deployment {
        Deployment::PerNode => (*spec, *settings, nodes),
        Deployment::PerNodeDivided => (spec.divided(nodes), settings.divided(nodes), nodes),
        Deployment::Shared => (*spec, *settings, 1),
    };
    let mut limiters: Vec<Box<dyn Limiter>> = (0..count)
        .map(|_| node_spec.build(&node_settings))
        .collect::<Result<_, _>>()?;
    // A node holds state for the key only once the key's requests reach it.
    let mut bytes: Vec<usize> = vec![0; limiters.len()];
    let mut peak_bytes = 0;

    let mut rng = StdRng::seed_from_u64(topology.seed);
    let window = settings.window_ns();
    let limit = settings.limit();
    // The client's true count: admitted plus refused with right, by true time.
    let mut charged: VecDeque<u64> = VecDeque::new();
    let mut admitted = Vec::new();
    let mut refused_with_right = 0;

    for (i, &t) in arrivals.iter().enumerate() {
        let node = topology.balancer.node(i as u64, nodes);
        let seen = reading(t, node, &topology.clocks, &mut rng);
        let which = if count == 1 { 0 } else { node as usize };
        let ok = limiters[which].admit(seen);
        bytes[which] = limiters[which].state_bytes();
        peak_bytes = peak_bytes.max(bytes.iter().sum());

        while charged
            .front()
            .is_some_and(|&c| c.saturating_add(window) <= t)
        {
            charged.pop_front();
        }
        if ok {
            admitted.push(t);
            charged.push_back(t);
        } else if (charged.len() as u64) < limit {
            refused_with_right += 1;
            charged.push_back(t);
        }
    }
    Ok(Outcome {
        worst_window: worst_window(&admitted, window),
        admitted,
        refused_with_right,
        bytes_per_key: peak_bytes,
    })
}

/// Node `node`'s clock reading for true time `t`.
fn reading(t: u64, node: u64, clocks: &Clocks, rng: &mut StdRng) -> u64 {
    let ahead = t.saturating_add(node.saturating_mul(clocks.offset_ns));
    if clocks.jitter_ns == 0 {
        return ahead;
    }
    let j = clocks.jitter_ns;
    let shift = rng.gen_range(0..=j.saturating_mul(2));
    // ahead + shift - j, never below zero.
    ahead.saturating_add(shift).saturating_sub(j)
}

/// The table and the picture of a comparison.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// One row per (shape, limiter), grouped by shape.
    pub rows: Vec<Row>,
    /// One panel per shape.
    pub panels: Vec<Panel>,
}

/// Runs every limiter of `specs` on every shape of `shapes`. On one node each
/// limiter runs alone; on several, each runs three ways: a limiter per node
/// with the full limit, a limiter per node with the limit divided by the
/// nodes, and one shared limiter. `seed` drives the random shapes.
///
/// # Errors
/// [`LabError::Config`] when a limiter cannot be built.
pub fn compare(
    settings: &Settings,
    specs: &[LimiterSpec],
    shapes: &[Shape],
    topology: &Topology,
    seed: u64,
) -> Result<Comparison, LabError> {
    let nodes = topology.nodes.max(1);
    let deployments: &[Deployment] = if nodes == 1 {
        &[Deployment::Shared]
    } else {
        &[
            Deployment::PerNode,
            Deployment::PerNodeDivided,
            Deployment::Shared,
        ]
    };
    let mut rows = Vec::new();
    let mut panels = Vec::new();
    for shape in shapes {
        let arrivals = shape.arrivals(settings, seed);
        let shape_name = if nodes == 1 {
            shape.name()
        } else {
            format!(
                "{} ({nodes} nodes, {})",
                shape.name(),
                topology.balancer.name()
            )
        };
        let mut panel = Panel {
            title: shape_name.clone(),
            series: Vec::new(),
            first_arrival: arrivals.first().copied().unwrap_or(0),
            last_arrival: arrivals.last().copied().unwrap_or(0),
        };
        for spec in specs {
            for &deployment in deployments {
                let label = match deployment {
                    _ if nodes == 1 => spec.label(settings),
                    Deployment::PerNode => format!("{} per node", spec.label(settings)),
                    Deployment::PerNodeDivided => format!(
                        "{} per node, limit/{nodes}",
                        spec.divided(nodes).label(&settings.divided(nodes))
                    ),
                    Deployment::Shared => format!("{} shared", spec.label(settings)),
                };
                let out = run(spec, settings, &arrivals, topology, deployment)?;
                rows.push(Row {
                    limiter: label.clone(),
                    shape: shape_name.clone(),
                    offered: arrivals.len() as u64,
                    admitted: out.admitted.len() as u64,
                    worst_window: out.worst_window,
                    refused_with_right: out.refused_with_right,
                    bytes_per_key: out.bytes_per_key,
                });
                panel.series.push((label, out.admitted));
            }
        }
        panels.push(panel);
    }
    Ok(Comparison { rows, panels })
}
