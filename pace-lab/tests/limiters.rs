//! The lab's limiters, measures, shapes and deployments, rule by rule.

use std::time::Duration;

use pace_lab::{
    compare, parse_arrivals, parse_shapes, run, trailing_series, worst_window, Balancer, Clocks,
    Deployment, LabError, LimiterSpec, Outcome, Settings, Shape, Topology,
};
use proptest::prelude::*;

fn settings(limit: u64, window: Duration) -> Settings {
    Settings::new(limit, window).unwrap()
}

fn play(spec: LimiterSpec, s: &Settings, arrivals: &[u64]) -> Outcome {
    run(&spec, s, arrivals, &Topology::default(), Deployment::Shared).unwrap()
}

/// The most admitted in any `[t, t + w)`, by brute force over every start.
fn brute_worst(times: &[u64], w: u64) -> u64 {
    times
        .iter()
        .map(|&t| times.iter().filter(|&&u| u >= t && u < t + w).count() as u64)
        .max()
        .unwrap_or(0)
}

#[test]
fn sub_window_never_exceeds_the_limit_on_any_shape() {
    let cases = [
        settings(100, Duration::from_secs(60)),
        settings(7, Duration::from_secs(1)),
        settings(1, Duration::from_millis(10)),
        settings(1000, Duration::from_secs(3600)),
    ];
    for s in cases {
        for k in [1, 2, 6, 10] {
            for shape in Shape::BUILT_IN {
                for seed in 1..=3 {
                    let o = play(
                        LimiterSpec::SubWindow { slots: k },
                        &s,
                        &shape.arrivals(&s, seed),
                    );
                    assert!(
                        o.worst_window <= s.limit(),
                        "k={k} {shape:?} {s:?}: {}",
                        o.worst_window
                    );
                }
            }
        }
    }
}

#[test]
fn sub_window_lets_a_quiet_client_burst_the_full_limit() {
    let s = settings(100, Duration::from_secs(60));
    for k in [1, 2, 6, 10] {
        let o = play(
            LimiterSpec::SubWindow { slots: k },
            &s,
            &Shape::QuietBurst.arrivals(&s, 1),
        );
        assert_eq!(o.admitted.len(), 100, "k={k}");
    }
}

#[test]
fn sub_window_costs_at_most_one_slot_of_throughput() {
    // Steady 2x for 10 windows: at least k/(k+1) of the 1000 a window-exact
    // limiter admits. With k = 10 (6 s slots, 20 arrivals each) an admission
    // blocks for 66 s: 100 per 66 s, nine cycles and the first slot of a
    // tenth: 920.
    let s = settings(100, Duration::from_secs(60));
    let arrivals = Shape::Steady2x.arrivals(&s, 1);
    for (k, admitted) in [(1, 500), (2, 700), (6, 900), (10, 920)] {
        let o = play(LimiterSpec::SubWindow { slots: k }, &s, &arrivals);
        assert_eq!(o.admitted.len(), admitted, "k={k}");
        assert!(o.admitted.len() as u64 * (k as u64 + 1) >= 1000 * k as u64);
    }
}

#[test]
fn a_clock_stepping_back_frees_nothing() {
    // Spend the whole limit at 10 W, then show every limiter readings from
    // the past: none of them may admit again.
    let s = settings(10, Duration::from_secs(1));
    let now = 10 * s.window_ns();
    for spec in LimiterSpec::lineup(&s, 10, 6) {
        let mut l = spec.build(&s).unwrap();
        for _ in 0..10 {
            assert!(l.admit(now), "{spec:?}");
        }
        assert!(!l.admit(now), "{spec:?}");
        for back in [1, s.window_ns() / 2, s.window_ns(), 5 * s.window_ns(), now] {
            assert!(!l.admit(now - back), "{spec:?} at -{back} ns");
        }
    }
}

#[test]
fn worst_window_matches_brute_force_on_the_shapes() {
    let s = settings(10, Duration::from_secs(1));
    for shape in Shape::BUILT_IN {
        let a = shape.arrivals(&s, 2);
        assert_eq!(
            worst_window(&a, s.window_ns()),
            brute_worst(&a, s.window_ns())
        );
    }
}

#[test]
fn trailing_series_peaks_at_the_worst_window() {
    let s = settings(100, Duration::from_secs(60));
    let o = play(
        LimiterSpec::FixedWindow,
        &s,
        &Shape::Boundary.arrivals(&s, 1),
    );
    let peak = trailing_series(&o.admitted, s.window_ns())
        .iter()
        .map(|p| p.1)
        .max();
    assert_eq!(peak, Some(200));
}

#[test]
fn several_nodes_leak_n_fold_and_dividing_throws_away_under_sticky_traffic() {
    let s = settings(100, Duration::from_secs(60));
    let arrivals = Shape::QuietBurst.arrivals(&s, 1);
    let rr = Topology {
        nodes: 3,
        ..Topology::default()
    };
    let sticky = Topology {
        balancer: Balancer::Sticky,
        ..rr
    };
    let spec = LimiterSpec::FixedWindow;
    let o = run(&spec, &s, &arrivals, &rr, Deployment::PerNode).unwrap();
    assert_eq!((o.admitted.len(), o.worst_window), (300, 300), "3 windows");
    assert_eq!(o.bytes_per_key, 48, "3 counters");
    let o = run(&spec, &s, &arrivals, &rr, Deployment::PerNodeDivided).unwrap();
    assert_eq!((o.admitted.len(), o.refused_with_right), (99, 1));
    assert_eq!(o.bytes_per_key, 48);
    let o = run(&spec, &s, &arrivals, &sticky, Deployment::PerNodeDivided).unwrap();
    assert_eq!(
        (o.admitted.len(), o.refused_with_right),
        (33, 67),
        "two thirds thrown away"
    );
    assert_eq!(o.bytes_per_key, 16, "only node 0 ever sees the key");
    let o = run(&spec, &s, &arrivals, &sticky, Deployment::PerNode).unwrap();
    assert_eq!((o.admitted.len(), o.bytes_per_key), (100, 16));
    let o = run(&spec, &s, &arrivals, &sticky, Deployment::Shared).unwrap();
    assert_eq!((o.admitted.len(), o.bytes_per_key), (100, 16));
}

#[test]
fn uneven_balancer_sends_half_to_node_zero() {
    let picks: Vec<u64> = (0..8).map(|i| Balancer::Uneven.node(i, 3)).collect();
    assert_eq!(picks, vec![0, 1, 0, 2, 0, 1, 0, 2]);
    let picks: Vec<u64> = (0..4).map(|i| Balancer::RoundRobin.node(i, 3)).collect();
    assert_eq!(picks, vec![0, 1, 2, 0]);
    assert_eq!(Balancer::Sticky.node(5, 3), 0);
    assert_eq!(Balancer::Uneven.node(5, 1), 0);
}

#[test]
fn compare_labels_the_three_deployments() {
    let s = settings(100, Duration::from_secs(60));
    let t = Topology {
        nodes: 3,
        balancer: Balancer::Uneven,
        ..Topology::default()
    };
    let c = compare(
        &s,
        &[LimiterSpec::TokenBucket { capacity: 100 }],
        &[Shape::QuietBurst],
        &t,
        1,
    )
    .unwrap();
    let labels: Vec<(&str, &str, u64)> = c
        .rows
        .iter()
        .map(|r| (r.limiter.as_str(), r.shape.as_str(), r.admitted))
        .collect();
    // Uneven: node 0 gets 150 of the 300, nodes 1 and 2 get 75 each.
    assert_eq!(
        labels,
        vec![
            (
                "token-bucket(cap=100) per node",
                "quiet-burst (3 nodes, uneven)",
                250
            ),
            (
                "token-bucket(cap=33) per node, limit/3",
                "quiet-burst (3 nodes, uneven)",
                99
            ),
            (
                "token-bucket(cap=100) shared",
                "quiet-burst (3 nodes, uneven)",
                100
            ),
        ]
    );
}

#[test]
fn a_log_is_only_as_exact_as_its_timestamps() {
    // Perfect clocks: exactly 100. A second node whose clock runs 30 s ahead,
    // sharing the log: the log is fed stamps from two clocks and leaks.
    let s = settings(100, Duration::from_secs(60));
    let arrivals = Shape::Steady2x.arrivals(&s, 1);
    let perfect = play(LimiterSpec::SlidingLog, &s, &arrivals);
    assert_eq!(perfect.worst_window, 100);
    let skewed = Topology {
        nodes: 2,
        clocks: Clocks {
            offset_ns: 30_000_000_000,
            jitter_ns: 0,
        },
        ..Topology::default()
    };
    let o = run(
        &LimiterSpec::SlidingLog,
        &s,
        &arrivals,
        &skewed,
        Deployment::Shared,
    )
    .unwrap();
    assert_eq!(o.worst_window, 101);
    let jittery = Topology {
        clocks: Clocks {
            offset_ns: 0,
            jitter_ns: 2_000_000_000,
        },
        ..Topology::default()
    };
    let o = run(
        &LimiterSpec::SlidingLog,
        &s,
        &arrivals,
        &jittery,
        Deployment::Shared,
    )
    .unwrap();
    assert_eq!(o.worst_window, 102);
}

#[test]
fn bad_settings_and_names_are_errors_not_panics() {
    assert_eq!(
        Settings::new(0, Duration::from_secs(1)),
        Err(LabError::ZeroLimit)
    );
    assert_eq!(Settings::new(1, Duration::ZERO), Err(LabError::ZeroWindow));
    assert!(matches!(
        Settings::new(2_000_000, Duration::from_secs(1)),
        Err(LabError::OutOfRange(_))
    ));
    let e = parse_shapes("boundary,nope").unwrap_err();
    assert_eq!(e, LabError::UnknownShape("nope".into()));
    assert!(e.to_string().contains("steady-2x"), "{e}");
    let s = settings(10, Duration::from_secs(1));
    for spec in [
        LimiterSpec::TokenBucket { capacity: 0 },
        LimiterSpec::SubWindow { slots: 0 },
        LimiterSpec::Pace { capacity: Some(0) },
    ] {
        assert!(
            matches!(spec.build(&s), Err(LabError::Config(_))),
            "{spec:?}"
        );
    }
}

#[test]
fn shape_groups_parse() {
    assert_eq!(parse_shapes("all").unwrap(), Shape::BUILT_IN.to_vec());
    assert_eq!(
        parse_shapes("documents").unwrap(),
        Shape::DOCUMENTS.to_vec()
    );
    assert_eq!(
        parse_shapes("on-off, boundary,on-off").unwrap(),
        vec![Shape::OnOff, Shape::Boundary]
    );
}

#[test]
fn arrivals_files_parse_exactly_or_say_which_line_is_wrong() {
    assert_eq!(
        parse_arrivals("# seconds\n1.5\n\n0.000000001\n12\n.25\n3.\n").unwrap(),
        vec![1, 250_000_000, 1_500_000_000, 3_000_000_000, 12_000_000_000]
    );
    assert_eq!(
        parse_arrivals("2.1234567899\n").unwrap(),
        vec![2_123_456_789]
    );
    for (text, line) in [
        ("1\nabc\n", 2),
        ("-1\n", 1),
        ("1e3\n", 1),
        ("1.2.3\n", 1),
        ("\n\n.\n", 3),
        ("99999999999999999999\n", 1),
    ] {
        match parse_arrivals(text) {
            Err(LabError::Arrivals { line: l, message }) => {
                assert_eq!(l, line, "{text:?}: {message}")
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
    assert_eq!(parse_arrivals("# nothing\n\n"), Err(LabError::NoArrivals));
}

#[test]
fn a_file_of_the_boundary_arrivals_measures_like_the_boundary_shape() {
    let s = settings(100, Duration::from_secs(60));
    let text: String = Shape::Boundary
        .arrivals(&s, 1)
        .iter()
        .map(|ns| format!("{}.{:09}\n", ns / 1_000_000_000, ns % 1_000_000_000))
        .collect();
    let file = Shape::File {
        name: "b.txt".into(),
        times: parse_arrivals(&text).unwrap(),
    };
    assert_eq!(file.name(), "file:b.txt");
    let o = play(LimiterSpec::FixedWindow, &s, &file.arrivals(&s, 1));
    assert_eq!(o.worst_window, 200);
}

fn arrivals_strategy() -> impl Strategy<Value = Vec<u64>> {
    // Gaps of 0 (simultaneous) to a few windows, sorted by construction.
    prop::collection::vec(prop_oneof![Just(0u64), 0u64..50, 0u64..400], 0..300).prop_map(|gaps| {
        gaps.iter()
            .scan(0u64, |t, g| {
                *t += g;
                Some(*t)
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn sub_window_bound_holds_on_random_arrivals(
        arrivals in arrivals_strategy(),
        limit in 1u64..20,
        window in 1u64..300,
        k in 1u32..9,
    ) {
        let s = settings(limit, Duration::from_nanos(window));
        let o = play(LimiterSpec::SubWindow { slots: k }, &s, &arrivals);
        prop_assert!(o.worst_window <= limit);
        prop_assert_eq!(o.worst_window, brute_worst(&o.admitted, window));
    }

    #[test]
    fn the_other_limiters_keep_their_known_bounds(
        arrivals in arrivals_strategy(),
        limit in 1u64..20,
        window in 20u64..300,
        capacity in 1u64..30,
    ) {
        let s = settings(limit, Duration::from_nanos(window));
        let log = play(LimiterSpec::SlidingLog, &s, &arrivals);
        prop_assert!(log.worst_window <= limit);
        prop_assert_eq!(log.refused_with_right, 0);
        prop_assert!(play(LimiterSpec::FixedWindow, &s, &arrivals).worst_window <= 2 * limit);
        // A window shorter than W refills fewer than `limit` tokens.
        let bucket = play(LimiterSpec::TokenBucket { capacity }, &s, &arrivals);
        prop_assert!(bucket.worst_window < capacity + limit);
        let pace = play(LimiterSpec::Pace { capacity: Some(capacity) }, &s, &arrivals);
        prop_assert!(pace.worst_window < capacity + limit);
        prop_assert_eq!(worst_window(&arrivals, window), brute_worst(&arrivals, window));
    }
}

#[test]
fn a_shared_pace_fed_by_skewed_node_clocks() {
    // Three nodes whose clocks are 0, 5 and 10 s ahead share one Pace with
    // capacity = limit. Its stored time only moves forward, so the node
    // furthest ahead sets the pace: a little less than 199 on steady 2x, and
    // on the quiet burst the nodes behind see a bucket emptier than it is.
    let s = settings(100, Duration::from_secs(60));
    let t = Topology {
        nodes: 3,
        clocks: Clocks {
            offset_ns: 5_000_000_000,
            jitter_ns: 0,
        },
        ..Topology::default()
    };
    let spec = LimiterSpec::Pace {
        capacity: Some(100),
    };
    let o = run(
        &spec,
        &s,
        &Shape::Steady2x.arrivals(&s, 1),
        &t,
        Deployment::Shared,
    )
    .unwrap();
    assert_eq!((o.admitted.len(), o.worst_window), (1092, 189));
    let o = run(
        &spec,
        &s,
        &Shape::QuietBurst.arrivals(&s, 1),
        &t,
        Deployment::Shared,
    )
    .unwrap();
    assert_eq!((o.admitted.len(), o.refused_with_right), (102, 6));
}
