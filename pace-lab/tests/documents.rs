//! The design documents' table (001/003: limit 100 per 60 s, four shapes,
//! judged by the worst 60 s of the admitted stream), reproduced exactly.

use std::time::Duration;

use pace_lab::{compare, run, Deployment, LimiterSpec, Outcome, Row, Settings, Shape, Topology};

fn documents() -> Settings {
    Settings::new(100, Duration::from_secs(60)).unwrap()
}

fn outcome(spec: LimiterSpec, shape: Shape) -> Outcome {
    let s = documents();
    run(
        &spec,
        &s,
        &shape.arrivals(&s, 1),
        &Topology::default(),
        Deployment::Shared,
    )
    .unwrap()
}

const FIXED: LimiterSpec = LimiterSpec::FixedWindow;
const BIG: LimiterSpec = LimiterSpec::TokenBucket { capacity: 100 };
const SMALL: LimiterSpec = LimiterSpec::TokenBucket { capacity: 10 };
const LOG: LimiterSpec = LimiterSpec::SlidingLog;
const PACE_BIG: LimiterSpec = LimiterSpec::Pace {
    capacity: Some(100),
};

#[test]
fn the_shapes_are_the_documents_shapes() {
    let s = documents();
    let b = Shape::Boundary.arrivals(&s, 1);
    assert_eq!(b.len(), 200);
    assert_eq!(b[0], 59_000_000_000, "last second of the first window");
    assert_eq!(b[99], 59_990_000_000);
    assert_eq!(b[100], 60_000_000_000, "first second of the next");
    assert_eq!(b[199], 60_990_000_000);

    let two = Shape::Steady2x.arrivals(&s, 1);
    assert_eq!(two.len(), 2000, "200 per minute for 10 minutes");
    assert_eq!(&two[..3], &[0, 300_000_000, 600_000_000]);

    let eleven = Shape::Steady11x.arrivals(&s, 1);
    assert_eq!(eleven.len(), 1100, "110 per minute for 10 minutes");
    assert_eq!(eleven[110], 60_000_000_000);

    let quiet = Shape::QuietBurst.arrivals(&s, 1);
    assert_eq!(
        quiet,
        vec![540_000_000_000; 300],
        "9 quiet minutes, then 300"
    );
}

#[test]
fn fixed_window_doubles_on_the_boundary_and_holds_on_steady_overflow() {
    let o = outcome(FIXED, Shape::Boundary);
    assert_eq!((o.admitted.len(), o.worst_window), (200, 200));
    let o = outcome(FIXED, Shape::Steady2x);
    assert_eq!(o.worst_window, 100, "never above 100 on steady 2x");
    assert_eq!(o.admitted.len(), 1000);
}

#[test]
fn token_bucket_with_capacity_limit_pays_out_199_on_steady_overflow() {
    let o = outcome(BIG, Shape::Steady2x);
    assert_eq!(o.worst_window, 199);
    // Capacity plus refill: the worst window is the first one.
    assert_eq!(o.admitted[198], 59_400_000_000);
    assert!(o.admitted[199] >= 60_000_000_000);
}

#[test]
fn small_bucket_holds_109_everywhere_but_admits_10_of_the_quiet_300() {
    let worst: Vec<u64> = Shape::DOCUMENTS
        .iter()
        .map(|s| outcome(SMALL, s.clone()).worst_window)
        .collect();
    assert_eq!(worst, vec![13, 109, 109, 10]);
    let o = outcome(SMALL, Shape::QuietBurst);
    assert_eq!(o.admitted.len(), 10);
    assert_eq!(
        o.refused_with_right, 90,
        "90 refused the client had a right to"
    );
}

#[test]
fn sliding_log_is_exactly_100_on_all_four() {
    for shape in Shape::DOCUMENTS {
        let o = outcome(LOG, shape.clone());
        assert_eq!(o.worst_window, 100, "{shape:?}");
        assert_eq!(o.refused_with_right, 0, "{shape:?}");
        assert_eq!(o.bytes_per_key, 800, "100 stamps of 8 bytes on {shape:?}");
    }
}

#[test]
fn the_quiet_client_gets_a_full_window_from_fixed_window_log_and_big_bucket() {
    for spec in [FIXED, LOG, BIG, PACE_BIG] {
        let o = outcome(spec, Shape::QuietBurst);
        assert_eq!(o.admitted.len(), 100, "{spec:?}");
        assert_eq!(o.refused_with_right, 0, "{spec:?}");
    }
}

#[test]
fn state_bytes_are_the_documents() {
    assert_eq!(outcome(FIXED, Shape::Steady2x).bytes_per_key, 16);
    assert_eq!(outcome(BIG, Shape::Steady2x).bytes_per_key, 16);
    assert_eq!(outcome(SMALL, Shape::Steady2x).bytes_per_key, 16);
    assert_eq!(outcome(PACE_BIG, Shape::Steady2x).bytes_per_key, 8);
    assert_eq!(
        outcome(LimiterSpec::SubWindow { slots: 6 }, Shape::Steady2x).bytes_per_key,
        36
    );
}

#[test]
fn real_pace_at_capacity_limit_decides_exactly_like_the_token_bucket() {
    let s = documents();
    for shape in Shape::BUILT_IN {
        let arrivals = shape.arrivals(&s, 1);
        let t = Topology::default();
        let bucket = run(&BIG, &s, &arrivals, &t, Deployment::Shared).unwrap();
        let pace = run(&PACE_BIG, &s, &arrivals, &t, Deployment::Shared).unwrap();
        assert_eq!(pace.admitted, bucket.admitted, "{shape:?}");
    }
}

#[test]
fn the_whole_table_for_the_documents() {
    let s = documents();
    let specs = LimiterSpec::lineup(&s, 10, 6);
    let table = compare(&s, &specs, &Shape::DOCUMENTS, &Topology::default(), 1).unwrap();
    let got: Vec<(String, String, u64, u64, u64, usize)> = table
        .rows
        .iter()
        .map(|r: &Row| {
            (
                r.shape.clone(),
                r.limiter.clone(),
                r.admitted,
                r.worst_window,
                r.refused_with_right,
                r.bytes_per_key,
            )
        })
        .collect();
    let want: &[(&str, &str, u64, u64, u64, usize)] = &[
        ("boundary", "fixed-window", 200, 200, 0, 16),
        ("boundary", "token-bucket(cap=100)", 103, 103, 0, 16),
        ("boundary", "token-bucket(cap=10)", 13, 13, 89, 16),
        ("boundary", "sliding-log", 100, 100, 0, 800),
        ("boundary", "sliding-window", 101, 101, 0, 16),
        ("boundary", "sub-window(k=6)", 100, 100, 0, 36),
        ("boundary", "pace(cap=100)", 103, 103, 0, 8),
        ("boundary", "pace(cap=1, default)", 4, 4, 98, 8),
        ("steady-2x", "fixed-window", 1000, 100, 0, 16),
        ("steady-2x", "token-bucket(cap=100)", 1099, 199, 0, 16),
        ("steady-2x", "token-bucket(cap=10)", 1009, 109, 41, 16),
        ("steady-2x", "sliding-log", 1000, 100, 0, 800),
        ("steady-2x", "sliding-window", 991, 100, 59, 16),
        ("steady-2x", "sub-window(k=6)", 900, 100, 266, 36),
        ("steady-2x", "pace(cap=100)", 1099, 199, 0, 8),
        ("steady-2x", "pace(cap=1, default)", 1000, 100, 50, 8),
        ("steady-1.1x", "fixed-window", 1000, 100, 0, 16),
        ("steady-1.1x", "token-bucket(cap=100)", 1099, 110, 0, 16),
        ("steady-1.1x", "token-bucket(cap=10)", 1009, 109, 0, 16),
        ("steady-1.1x", "sliding-log", 1000, 100, 0, 800),
        ("steady-1.1x", "sliding-window", 991, 100, 18, 16),
        ("steady-1.1x", "sub-window(k=6)", 872, 100, 147, 36),
        ("steady-1.1x", "pace(cap=100)", 1099, 110, 0, 8),
        ("steady-1.1x", "pace(cap=1, default)", 550, 55, 455, 8),
        ("quiet-burst", "fixed-window", 100, 100, 0, 16),
        ("quiet-burst", "token-bucket(cap=100)", 100, 100, 0, 16),
        ("quiet-burst", "token-bucket(cap=10)", 10, 10, 90, 16),
        ("quiet-burst", "sliding-log", 100, 100, 0, 800),
        ("quiet-burst", "sliding-window", 100, 100, 0, 16),
        ("quiet-burst", "sub-window(k=6)", 100, 100, 0, 36),
        ("quiet-burst", "pace(cap=100)", 100, 100, 0, 8),
        ("quiet-burst", "pace(cap=1, default)", 1, 1, 99, 8),
    ];
    let want: Vec<(String, String, u64, u64, u64, usize)> = want
        .iter()
        .map(|&(a, b, c, d, e, f)| (a.to_string(), b.to_string(), c, d, e, f))
        .collect();
    assert_eq!(got, want);
    assert!(table.rows.iter().all(|r| r.offered > 0));
    assert_eq!(table.panels.len(), 4);
}
