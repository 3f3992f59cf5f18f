//! The lease protocol (`pace_models::leases`) against the promise: over
//! every window of kept admissions at their true instants, at most
//! `capacity + span / interval` tokens, in random histories of several
//! replicas with drifting clocks, a network that delays, duplicates and
//! loses messages, replica kills, and failovers to a standby.

use pace_models::leases::{run, run_params, Answer, LeaseServer, Params, Stats};
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

/// One scenario per server-side rule, at hand-picked readings (capacity 1,
/// 100 ns a token): a token granted at 0 and let through at 90 is reported
/// kept by a call read at 95. It settles from that reading (tat 195), so a
/// decision at 100 is denied: admitted, two tokens would fall in [90, 100].
#[test]
fn a_reported_token_settles_from_the_reports_reading() {
    let mut s = LeaseServer::new(100, 1, 1_000, 0);
    let first = s.call(0, 0, 1, true, 0, 0, 1);
    assert_eq!(
        first,
        Answer::Granted {
            granted: 1,
            remaining: 1_000,
            born: 0
        }
    );
    s.call(95, 0, 1, false, 1, 0, 0);
    assert_eq!(
        (s.tat(), s.held()),
        (195, 0),
        "a token let through at 90 settled from before the report"
    );
    assert!(!s.direct(100, 1));
}

/// A lease of 50 ns nobody renews (its token let through at 40) settles as
/// kept from its expiry at the next call: a decision at 60 is denied.
#[test]
fn an_expired_lease_settles_as_kept_from_its_expiry() {
    let mut s = LeaseServer::new(100, 1, 50, 0);
    s.call(0, 0, 1, true, 0, 0, 1);
    assert!(!s.direct(60, 1), "an expired lease was dropped as refunded");
    assert_eq!((s.tat(), s.held()), (150, 0));
    // Its record is gone: a later call for it is answered `Unknown`.
    assert_eq!(s.call(70, 0, 1, false, 1, 0, 0), Answer::Unknown);
}

/// Capacity 4: a lease of 2 tokens (a lone lease's share: half the
/// capacity) releases one; the call is delivered twice. The second
/// delivery changes nothing: one token stays held (the replica may still
/// use it), so a decision of 4 is denied.
#[test]
fn a_duplicated_report_applies_once() {
    let mut s = LeaseServer::new(100, 4, 1_000, 0);
    let grant = s.call(0, 0, 1, true, 0, 0, 4);
    assert!(
        matches!(grant, Answer::Granted { granted: 2, .. }),
        "{grant:?}"
    );
    s.call(10, 0, 1, false, 0, 1, 0);
    s.call(20, 0, 1, false, 0, 1, 0);
    assert_eq!(s.held(), 1, "a duplicated release applied twice");
    assert!(!s.direct(30, 4));
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
