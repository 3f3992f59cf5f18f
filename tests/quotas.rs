//! Quotas per call and a default quota changed live.
//!
//! The contract (DESIGN.md §3): over every window `[t1, t2]` of readings, the
//! kept admissions of a key read in it cost at most `(t2 − t1) +` the largest
//! horizon among the quotas they were decided with, each token costing its
//! own quota's interval; with one quota that is `capacity + span / interval`
//! tokens. Checked exactly (integers) by `pace_models::bound::
//! worst_excess_mixed_ns` over random single-key histories with stale
//! readings, mixed quotas, default-quota changes, refunds in any order and
//! sweeps. The known-wrong variant `quota_cost_of_default` (a call's quota
//! decides the horizon but its tokens cost the default's interval) fails
//! `random_mixed_quota_histories_never_exceed_the_bound`
//! (`.ci/suites/15-mutants.sh`).

use std::collections::hash_map::RandomState;
use std::time::Duration;

use pace::internals::{PaceInternals, ReservationInternals};
use pace::{ConfigError, Debit, DenyReason, ManualClock, Pace, Quota, Rate, Refunded};
use pace_models::bound::{
    worst_excess_mixed_ns, worst_excess_mixed_ns_brute, worst_excess_ns_brute,
};
use rand::{Rng, SeedableRng};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

type P<K> = Pace<K, RandomState, ManualClock>;

fn quota(interval_ns: u64, capacity: u64) -> Quota {
    Quota::new(
        Rate::new(1, Duration::from_nanos(interval_ns)).unwrap(),
        capacity,
    )
    .unwrap()
}

fn limiter<K>(q: Quota) -> P<K> {
    Pace::builder(q.rate())
        .quota(q)
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

#[test]
fn a_quota_is_validated_once() {
    let r = Rate::per_second(10).unwrap();
    assert_eq!(Quota::new(r, 0), Err(ConfigError::ZeroCapacity));
    assert_eq!(
        Quota::new(Rate::new(1, Duration::from_secs(1 << 30)).unwrap(), 1 << 31),
        Err(ConfigError::CapacityTooLarge)
    );
    let q = Quota::per_second(10).unwrap();
    assert_eq!(q, Quota::of(r).unwrap());
    assert_eq!(
        (q.capacity(), q.interval()),
        (10, Duration::from_millis(100))
    );
    assert_eq!(q.horizon(), Duration::from_secs(1));
    let p: P<u64> = limiter(q);
    assert_eq!((p.quota(), p.rate(), p.capacity()), (q, r, 10));
}

/// A key drained under a 10/s plan and then asked under a 1000/s plan owes
/// the 1 s of debt it took: nothing is forgotten across quotas.
#[test]
fn a_key_keeps_its_debt_across_quotas() {
    let free = quota(100 * MS, 10);
    let paid = quota(MS, 1000);
    let p: P<&str> = limiter(free);
    let now = 10 * S;
    for _ in 0..10 {
        drop(p.reserve_n_with_at(&"t", 1, free, now).unwrap());
    }
    assert!(p.reserve_n_with_at(&"t", 1, free, now).is_err());
    // Debt 1 s; the paid horizon is 1 s: no room at all, exactly 1 ms short.
    let d = p.reserve_n_with_at(&"t", 1, paid, now).unwrap_err();
    assert_eq!(d.retry_after(), Duration::from_millis(1));
    assert_eq!(p.peek_at(&"t", now), 0);
    // 300 ms later the paid plan has 300 tokens, the free one 3.
    let later = now + 300 * MS;
    drop(p.reserve_n_with_at(&"t", 300, paid, later).unwrap());
    assert!(p.reserve_n_with_at(&"t", 1, paid, later).is_err());
    assert!(p.reserve_n_with_at(&"t", 1, free, later).is_err());
    // More than a quota's capacity is never admitted under it.
    let never = p.reserve_n_with_at(&"u", 11, free, later).unwrap_err();
    assert_eq!(never.reason(), DenyReason::ExceedsCapacity);
    assert!(p.reserve_n_with_at(&"u", 11, paid, later).is_ok());
}

/// `set_quota` replaces the default for every key at once without touching
/// any row: each key's debt is what it was.
#[test]
fn a_live_default_change_keeps_every_keys_debt() {
    let slow = quota(100 * MS, 10); // 10/s, 1 s horizon
    let fast = quota(10 * MS, 100); // 100/s, 1 s horizon
    let p: P<u64> = limiter(slow);
    let now = 10 * S;
    for k in 0..1_000u64 {
        for _ in 0..(k % 10 + 1) {
            drop(p.reserve_n_at(&k, 1, now).unwrap());
        }
    }
    let rows = p.len();
    p.set_quota(fast);
    assert_eq!((p.quota(), p.capacity(), p.len()), (fast, 100, rows));
    for k in 0..1_000u64 {
        // Debt (k % 10 + 1) × 100 ms, now paid at 10 ms a token.
        let debt = (k % 10 + 1) * 100 * MS;
        assert_eq!(p.peek_at(&k, now), (S - debt) / (10 * MS), "key {k}");
    }
    p.set_quota(slow);
    for k in 0..1_000u64 {
        assert_eq!(p.peek_at(&k, now), 10 - (k % 10 + 1), "key {k}");
    }
    assert_eq!(p.horizon(), Duration::from_secs(1));
}

#[test]
fn the_mixed_check_reduces_to_the_single_quota_check() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for _ in 0..2_000 {
        let len = rng.gen_range(1..12);
        let kept: Vec<(u64, u64)> = (0..len)
            .map(|_| (rng.gen_range(0..50), rng.gen_range(1..4)))
            .collect();
        let (cap, t) = (rng.gen_range(1..4), rng.gen_range(1..10));
        let mixed: Vec<(u64, u64, u64)> = kept.iter().map(|&(r, n)| (r, n * t, cap * t)).collect();
        assert_eq!(
            worst_excess_mixed_ns(&mixed),
            worst_excess_ns_brute(&kept, cap, t),
            "{kept:?} cap {cap} interval {t}"
        );
    }
    // With quotas that differ, the one-pass check agrees with brute force.
    for _ in 0..3_000 {
        let len = rng.gen_range(1..14);
        let kept: Vec<(u64, u64, u64)> = (0..len)
            .map(|_| {
                let t = [1u64, 3, 7][rng.gen_range(0..3)];
                let h = t * rng.gen_range(1..5);
                (rng.gen_range(0..60), t * rng.gen_range(1..4), h)
            })
            .collect();
        assert_eq!(
            worst_excess_mixed_ns(&kept),
            worst_excess_mixed_ns_brute(&kept),
            "{kept:?}"
        );
    }
    // Two quotas: a 10-ns token of horizon 10 and a 1-ns token of horizon
    // 20 at one instant cost 11 <= 20: fine; a third 10-ns token is not.
    assert_eq!(worst_excess_mixed_ns(&[(5, 10, 10), (5, 1, 20)]), -9);
    assert_eq!(
        worst_excess_mixed_ns(&[(5, 10, 10), (5, 1, 20), (5, 10, 10)]),
        1
    );
}

/// A debit held for a later refund.
struct Held<'a> {
    r: pace::Reservation<'a, u64, u64, RandomState, ManualClock>,
    at: usize,
}

#[test]
fn random_mixed_quota_histories_never_exceed_the_bound() {
    let quotas = [quota(100, 3), quota(30, 10), quota(250, 1), quota(7, 40)];
    let mut worst = i128::MIN;
    for seed in 0..4_000u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let p: P<u64> = limiter(quotas[0]);
        let key = 7u64;
        let mut default = quotas[0];
        let mut clock: u64 = 1_000;
        // (reading, cost, horizon, refunded) of each admission.
        let mut admitted: Vec<(u64, u64, u64, bool)> = Vec::new();
        let mut held: Vec<Held<'_>> = Vec::new();
        // Holds (`Pace::hold`) beside the turns, quotas and quota changes:
        // each with the index of its admission.
        let mut holds: Vec<(pace::Hold<'_, u64, u64, RandomState, ManualClock>, usize)> =
            Vec::new();
        for _ in 0..rng.gen_range(5..60) {
            clock += rng.gen_range(0..80);
            // A reading taken up to 400 ns ago by a pre-empted thread.
            let reading = clock - rng.gen_range(0..400).min(clock);
            match rng.gen_range(0..16) {
                0..=5 => {
                    let (q, r) = if rng.gen_bool(0.3) {
                        (default, p.reserve_n_at(&key, 1, reading))
                    } else {
                        let q = quotas[rng.gen_range(0..quotas.len())];
                        let n = rng.gen_range(1..=q.capacity() + 1);
                        (q, p.reserve_n_with_at(&key, n, q, reading))
                    };
                    if let Ok(r) = r {
                        let t = q.interval().as_nanos() as u64;
                        let h = q.horizon().as_nanos() as u64;
                        admitted.push((reading, r.tokens() * t, h, false));
                        if rng.gen_bool(0.5) {
                            held.push(Held {
                                r,
                                at: admitted.len() - 1,
                            });
                        }
                    }
                }
                // A turn up to 300 ns ahead (`acquire`): let through at its
                // slot, which is the reading it counts at.
                10 | 11 => {
                    let q = quotas[rng.gen_range(0..quotas.len())];
                    let n = rng.gen_range(1..=q.capacity() + 1);
                    let wait = rng.gen_range(0..300);
                    if let Ok((r, slot)) = p.reserve_turn_at(&key, n, Some(q), wait, reading) {
                        assert!(slot <= reading + wait, "a turn beyond its wait");
                        let t = q.interval().as_nanos() as u64;
                        let h = q.horizon().as_nanos() as u64;
                        admitted.push((slot.max(reading), r.tokens() * t, h, false));
                        if rng.gen_bool(0.3) {
                            held.push(Held {
                                r,
                                at: admitted.len() - 1,
                            });
                        }
                    }
                }
                6 | 7 if !held.is_empty() => {
                    let h = held.swap_remove(rng.gen_range(0..held.len()));
                    if h.r.refund_at(reading).returned() {
                        admitted[h.at].3 = true;
                    }
                }
                // A hold under the default quota or the call's own; kept
                // (at its reading) or refunded later, or never resolved
                // (then it counts as kept: it expires as kept).
                12 | 13 => {
                    let (q, h) = if rng.gen_bool(0.4) {
                        (default, p.hold_n_at(&key, 1, None, reading))
                    } else {
                        let q = quotas[rng.gen_range(0..quotas.len())];
                        let n = rng.gen_range(1..=q.capacity());
                        (q, p.hold_n_at(&key, n, Some(q), reading))
                    };
                    if let Ok(h) = h {
                        let t = q.interval().as_nanos() as u64;
                        let hz = q.horizon().as_nanos() as u64;
                        admitted.push((reading, h.tokens() * t, hz, false));
                        holds.push((h, admitted.len() - 1));
                    }
                }
                14 | 15 if !holds.is_empty() => {
                    let (h, at) = holds.swap_remove(rng.gen_range(0..holds.len()));
                    let keep = rng.gen_bool(0.5);
                    match P::<u64>::resolve_at(h, keep, reading) {
                        Refunded::Restored => admitted[at].3 = true,
                        got => assert_eq!(got, Refunded::Nothing, "kept within its limit"),
                    }
                }
                8 => {
                    let at = if rng.gen_bool(0.1) {
                        clock + 10_000
                    } else {
                        reading
                    };
                    p.sweep_at(at);
                }
                _ => {
                    default = quotas[rng.gen_range(0..quotas.len())];
                    p.set_quota(default);
                }
            }
        }
        let kept: Vec<(u64, u64, u64)> = admitted
            .iter()
            .filter(|a| !a.3)
            .map(|&(r, c, h, _)| (r, c, h))
            .collect();
        if kept.is_empty() {
            continue;
        }
        let excess = worst_excess_mixed_ns(&kept);
        assert!(
            excess <= 0,
            "kept admissions exceed the bound by {excess} ns (seed {seed}): {kept:?}"
        );
        worst = worst.max(excess);
    }
    // The search reaches the bound, so it would see a step past it.
    assert_eq!(worst, 0, "no history reached the bound");
}

/// A detached debit made under one quota comes back whole under the same
/// rule as any other: restored if nothing was debited since.
#[test]
fn a_debit_made_under_a_quota_is_refunded_by_the_rule() {
    let p: P<u64> = limiter(quota(100 * MS, 10));
    let big = quota(MS, 100);
    let now = 10 * S;
    let d: Debit = p.reserve_n_with_at(&1, 50, big, now).unwrap().detach();
    // 50 ms of debt under the default: (1 s − 50 ms) / 100 ms = 9 tokens.
    assert_eq!(p.peek_at(&1, now), 9);
    assert_eq!(p.refund_at(&1, d, now), Refunded::Removed);
    assert_eq!(p.len(), 0);
}

/// Rows of a quota whose horizon is shorter than the default's go soon after
/// they refill: a call under that quota brings the next sweep pass forward
/// to one of its horizons, where the default's cadence (1 s here) would keep
/// them for a second.
#[test]
fn rows_of_a_short_quota_are_swept_after_its_own_horizon() {
    let default = quota(S, 1); // 1 per second: passes every second
    let short = quota(MS, 10); // horizon 10 ms
    let p: P<u64> = limiter(default);
    let t0 = 5 * S;
    // A pass at t0 sets the next one a default horizon later.
    drop(p.reserve_n_at(&u64::MAX, 1, t0).unwrap());
    for k in 0..5_000u64 {
        drop(p.reserve_n_with_at(&k, 1, short, t0).unwrap());
    }
    let rows = p.len();
    assert!(rows > 1_000, "{rows} rows before they refill");
    // 20 ms later every short row is full; calls on one key (creating no
    // row, so no pass for growth) run the pass that is now due.
    let later = t0 + 20 * MS;
    for _ in 0..40_000 {
        let _ = p.reserve_n_at(&u64::MAX, 1, later);
    }
    assert_eq!(p.len(), 1, "short-quota rows are still held 20 ms on");
}
