//! The lease protocol (`pace_models::leases`) against the promise: over
//! every window of kept admissions at their true instants, at most
//! `capacity + span / interval` tokens, in random histories of several
//! replicas with drifting clocks, a network that delays, duplicates and
//! loses messages, replica kills, and failovers to a standby.

use pace_models::leases::{run, Stats};
use proptest::prelude::*;

fn check(seed: u64, failover: bool) -> Result<(), TestCaseError> {
    let (p, worst, stats) = run(seed, failover);
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

/// The figures of DESIGN.md §11: over seeds 0..300 of each mode, how many
/// histories exceed the bound and by how much at worst (run by hand, with
/// each variant too: `PACE_MUTANT=NAME cargo test --release -p
/// pace-models --test leases -- --ignored --nocapture survey`).
#[test]
#[ignore = "a survey, run by hand"]
fn survey() {
    for failover in [false, true] {
        let mut over = 0;
        let mut worst = (i128::MIN, 0u64, 0u64);
        for seed in 0..300 {
            let (p, w, _) = run(seed, failover);
            if w > 0 {
                over += 1;
            }
            if w * 100 / i128::from(p.interval) > worst.0 {
                worst = (w * 100 / i128::from(p.interval), seed, p.capacity);
            }
        }
        eprintln!(
            "failover {failover}: {over} of 300 histories over the bound; worst excess {}/100 \
             tokens (seed {}, capacity {})",
            worst.0, worst.1, worst.2
        );
    }
}
