//! The lease protocol (`pace_models::leases`) against the promise: over
//! every window of kept admissions at their true instants, at most
//! `capacity + span / interval` tokens, in random histories of several
//! replicas with drifting clocks, a network that delays, duplicates and
//! loses messages, replica kills, and failovers to a standby.

use pace_models::leases::{run, run_params, Params, Stats};
use proptest::prelude::*;

fn check(seed: u64, failover: bool) -> Result<(), TestCaseError> {
    check_history(seed, run(seed, failover))
}

fn check_history(seed: u64, (p, worst, stats): (Params, i128, Stats)) -> Result<(), TestCaseError> {
    prop_assert!(
        worst <= 0,
        "history {seed} exceeds the bound by {worst} ns ({}/100 tokens): {p:?} {stats:?}",
        worst * 100 / i128::from(p.interval)
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn lease_histories_never_exceed_the_bound(seed in any::<u64>()) {
        check(seed, false)?;
    }

    #[test]
    fn failover_histories_never_exceed_the_bound(seed in any::<u64>()) {
        check(seed, true)?;
    }

    /// Clocks 20% fast or slow, and a margin of 20% (`ε_max` = 20%): the
    /// drift margin at a size the histories meet.
    #[test]
    fn drifting_clock_histories_never_exceed_the_bound(seed in any::<u64>()) {
        let mut p = Params::random_drift(seed, false, 200_000);
        p.grace = 0;
        check_history(seed, run_params(seed, p))?;
    }
}

/// The sum of what `histories` did.
fn sum(histories: impl Iterator<Item = Stats>) -> Stats {
    let mut s = Stats::default();
    for h in histories {
        s.leased += h.leased;
        s.direct += h.direct;
        s.granted += h.granted;
        s.released += h.released;
        s.expired += h.expired;
        s.stranded += h.stranded;
        s.duplicates += h.duplicates;
        s.unknown += h.unknown;
        s.kills += h.kills;
        s.failovers += h.failovers;
        s.lost_with_primary += h.lost_with_primary;
        s.refunded += h.refunded;
    }
    s
}

/// The histories reach every part of the protocol: leased and server
/// decisions, grants, releases, expiries with stranded tokens, duplicated
/// calls, answers for settled leases, kills, local refunds, failovers and
/// replies lost with their primary.
#[test]
fn the_histories_reach_every_part_of_the_protocol() {
    let s = sum((0..60).map(|seed| run(seed, false).2));
    let f = sum((0..60).map(|seed| run(seed, true).2));
    eprintln!("{s:?}\n{f:?}");
    for (what, n) in [
        ("leased decisions", s.leased),
        ("server decisions", s.direct),
        ("granted tokens", s.granted),
        ("released tokens", s.released),
        ("expiries", s.expired),
        ("stranded tokens", s.stranded),
        ("duplicated calls", s.duplicates),
        ("unknown leases", s.unknown),
        ("kills", s.kills),
        ("local refunds", s.refunded),
        ("failovers", f.failovers),
        ("replies lost with their primary", f.lost_with_primary),
    ] {
        assert!(n > 0, "no {what} in 60 histories");
    }
}

/// The figures of DESIGN.md §11: over seeds 0..300 of each kind (without
/// a standby, with one, clocks within 20%), how many histories exceed the
/// bound and by how much at worst (run by hand, with each variant too:
/// `PACE_MUTANT=NAME cargo test --release -p pace-models --test leases --
/// --ignored --nocapture survey`).
#[test]
#[ignore = "a survey, run by hand"]
fn survey() {
    for kind in ["no standby", "a standby", "clocks within 20%"] {
        let mut over = 0;
        let mut worst: Option<(i128, u64)> = None;
        for seed in 0..300 {
            let p = match kind {
                "no standby" => Params::random(seed, false),
                "a standby" => Params::random(seed, true),
                _ => {
                    let mut p = Params::random_drift(seed, false, 200_000);
                    p.grace = 0;
                    p
                }
            };
            let (p, w, _) = run_params(seed, p);
            if w > 0 {
                over += 1;
                let hundredths = w * 100 / i128::from(p.interval);
                if worst.is_none_or(|(x, _)| hundredths > x) {
                    worst = Some((hundredths, seed));
                }
            }
        }
        eprintln!("{kind}: {over} of 300 histories over the bound; worst (hundredths of a token, seed): {worst:?}");
    }
}
