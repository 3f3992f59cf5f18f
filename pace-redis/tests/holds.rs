//! Holds (`RedisPace::hold`, README: "Holds"): exact refunds in any order,
//! the over-admission bound kept, and holds of a dead client settled as
//! kept after the hold limit.
//!
//! - `holds_agree_with_the_integer_model`: random histories of reserves,
//!   holds (by two limiters with different hold limits), keeps, hold
//!   refunds, reserve refunds and clock advances on one key, through the script with the time injected and through an integer
//!   model written here; every decision, wait, remaining token count, reset
//!   time, refund outcome and peek must agree, and the admissions that were
//!   not returned (holds counted at their decision, kept, expired or never
//!   resolved) must cost at most `b − a + τ` in every window `[a, b]`.
//!   `random_hold_histories_never_exceed_the_bound`: the bound alone, over
//!   the script's own answers (a known-wrong script fails it too, not only
//!   the comparison with the model).
//! - `an_unresolved_hold_settles_as_kept_after_the_hold_limit` (injected
//!   time) and `a_dead_clients_hold_expires_on_the_servers_clock` (the
//!   server's clock, with the key's expiry): a hold never resolved locks its
//!   token until the hold limit, is then settled as kept from its expiry,
//!   and a stale keep or refund of it returns nothing and mints nothing.

mod common;

use std::time::Duration;

use pace::{DenyReason, Rate};
use pace_redis::{Error, Hold, OnUnavailable, RedisPace, Refunded, Reservation, Source};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// A realistic Unix time in ns (not a round number).
const BASE: u64 = 1_764_000_000_123_456_789;

#[derive(Clone, Debug)]
enum Op {
    Reserve {
        n: u64,
    },
    /// `other`: by a second limiter on the same key with another hold limit
    /// (holds then expire out of the order of their decisions).
    Hold {
        n: u64,
        other: bool,
    },
    /// A turn (`acquire_n`'s reservation, without its sleep) that may wait
    /// up to `quarters / 4` of tau plus `ns`.
    Turn {
        n: u64,
        quarters: u64,
        ns: u64,
    },
    Keep {
        pick: usize,
    },
    Release {
        pick: usize,
    },
    /// A reserve's refund.
    Refund {
        pick: usize,
    },
    /// Advance by `quarters / 4` of tau plus `ns`.
    Advance {
        quarters: u64,
        ns: u64,
    },
}

fn op(cap: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..=cap + 1).prop_map(|n| Op::Reserve { n }),
        5 => (0..=cap + 1, any::<bool>()).prop_map(|(n, other)| Op::Hold { n, other }),
        3 => (0..=cap + 1, 0u64..9, prop_oneof![Just(0u64), Just(1), 0u64..1_000_000_000])
            .prop_map(|(n, quarters, ns)| Op::Turn { n, quarters, ns }),
        3 => any::<usize>().prop_map(|pick| Op::Keep { pick }),
        3 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Refund { pick }),
        4 => (0u64..6, prop_oneof![Just(0u64), Just(1), 0u64..2_000_000_000])
            .prop_map(|(quarters, ns)| Op::Advance { quarters, ns }),
    ]
}

/// The script's denial `d` of a `what` (a reserve or a hold) at `step` is
/// the model's `(reason, wait, debt)`: its reason, and unless it exceeds the
/// capacity its wait, remaining tokens and reset time.
fn denial_agrees(
    model: &Model,
    d: &pace_redis::Denied,
    (reason, wait, debt): (DenyReason, u64, u64),
    what: &str,
    step: usize,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(d.reason(), reason, "{} reason, step {}", what, step);
    if reason != DenyReason::ExceedsCapacity {
        let wait = Duration::from_nanos(wait);
        prop_assert_eq!(d.retry_after(), wait, "{} wait, step {}", what, step);
        let remaining = Some(model.tokens(debt));
        prop_assert_eq!(
            d.remaining(),
            remaining,
            "{} remaining, step {}",
            what,
            step
        );
        let reset = Some(Duration::from_nanos(debt));
        prop_assert_eq!(d.reset_after(), reset, "{} reset, step {}", what, step);
    }
    Ok(())
}

/// (interval, capacity, the two limiters' hold limits as (quarters of tau,
/// ns)), operations.
type Case = (u64, u64, [(u64, u64); 2], Vec<Op>);

fn case() -> impl Strategy<Value = Case> {
    (
        common::interval(),
        1u64..=6,
        proptest::array::uniform2((0u64..10, 0u64..1_000_000_000)),
    )
        .prop_flat_map(|(i, cap, limits)| {
            (
                Just(i),
                Just(cap),
                Just(limits),
                proptest::collection::vec(op(cap), 1..70),
            )
        })
}

#[derive(Clone, Debug)]
struct MHold {
    id: u64,
    cost: u64,
    decided: u64,
    expiry: u64,
}

/// The key as stored: its settled `tat` and its holds in order of expiry.
#[derive(Clone, Debug)]
struct Stored {
    tat: u64,
    holds: Vec<MHold>,
}

/// The rule with holds, in plain integers.
struct Model {
    interval: u64,
    cap: u64,
    stored: Option<Stored>,
}

impl Model {
    fn tau(&self) -> u64 {
        self.interval * self.cap
    }

    /// The key at `now`: the settled tat after settling the expired holds
    /// as kept from their expiry (in order of expiry), the live holds, and
    /// whether any expired.
    fn view(&self, now: u64) -> (u64, Vec<MHold>, bool) {
        let Some(s) = &self.stored else {
            return (0, Vec::new(), false);
        };
        let mut tat = s.tat;
        let mut live = Vec::new();
        let mut changed = false;
        for h in &s.holds {
            if h.expiry > now {
                live.push(h.clone());
            } else {
                tat = tat.max(h.expiry) + h.cost;
                changed = true;
            }
        }
        (tat, live, changed)
    }

    fn put(&mut self, tat: u64, holds: Vec<MHold>, now: u64) {
        self.stored = if holds.is_empty() && tat <= now {
            None
        } else {
            Some(Stored { tat, holds })
        };
    }

    fn tokens(&self, debt: u64) -> u64 {
        if debt >= self.tau() {
            0
        } else {
            (self.tau() - debt) / self.interval
        }
    }

    /// (debt of the settled tat, held) at `now`.
    fn debt(&self, now: u64) -> (u64, u64) {
        let (tat, live, _) = self.view(now);
        (
            tat.saturating_sub(now),
            live.iter().map(|h| h.cost).sum::<u64>(),
        )
    }

    /// A reserve (`hold` None; a turn when `wait` > 0) or a hold (model
    /// id, hold limit): Ok((prev, tat, debt after counting what is held,
    /// a turn's wait until its slot)) or Err((reason, wait, debt before
    /// counting what is held)).
    #[allow(clippy::type_complexity)]
    fn decide(
        &mut self,
        n: u64,
        hold: Option<(u64, u64)>,
        wait: u64,
        now: u64,
    ) -> Result<(u64, u64, u64, u64), (DenyReason, u64, u64)> {
        if n > self.cap {
            return Err((DenyReason::ExceedsCapacity, u64::MAX, 0));
        }
        let (tat, mut live, _) = self.view(now);
        let d = tat.saturating_sub(now);
        let held: u64 = live.iter().map(|h| h.cost).sum();
        let c = n * self.interval;
        // A turn must also fit beside what is held (held tokens do not
        // drain: it goes through at its slot while they may be held).
        if d + c + held > self.tau() + wait || held + c > self.tau() {
            // While tokens are held, the core's reason: `Held`.
            let reason = if held > 0 {
                DenyReason::Held
            } else {
                DenyReason::Exhausted
            };
            // The wait if every held token were kept now (the core's
            // `DenyReason::Held`); without holds, the bucket's own wait.
            return Err((reason, d + held + c - self.tau(), d + held));
        }
        let slot = (d + c + held).saturating_sub(self.tau());
        match hold {
            None => {
                let new = tat.max(now) + c;
                self.put(new, live, now);
                Ok((if tat > now { tat } else { 0 }, new, new - now + held, slot))
            }
            Some((id, limit)) => {
                let expiry = now + limit;
                let at = live.iter().take_while(|h| h.expiry <= expiry).count();
                live.insert(
                    at,
                    MHold {
                        id,
                        cost: c,
                        decided: now,
                        expiry,
                    },
                );
                self.put(tat, live, now);
                Ok((0, tat, d + held + c, 0))
            }
        }
    }

    /// Keep or release of model hold `id`: `Restored` when resolved now,
    /// `Expired` when the key no longer has it.
    fn resolve(&mut self, id: u64, keep: bool, now: u64) -> Refunded {
        let (mut tat, mut live, changed) = self.view(now);
        let Some(i) = live.iter().position(|h| h.id == id) else {
            if changed {
                self.put(tat, live, now);
            }
            return Refunded::Expired;
        };
        let h = live.remove(i);
        if keep {
            tat = tat.max(h.decided) + h.cost;
        }
        self.put(tat, live, now);
        Refunded::Restored
    }

    fn refund(&mut self, prev: u64, mine: u64, now: u64) -> Refunded {
        if self.stored.is_none() {
            return Refunded::Refilled;
        }
        let (tat, live, _) = self.view(now);
        if tat != mine {
            return Refunded::Superseded;
        }
        // A key with holds stays, at `prev` (the core's held row).
        if prev > now || !live.is_empty() {
            self.put(prev, live, now);
            Refunded::Restored
        } else {
            self.put(0, live, now);
            Refunded::Removed
        }
    }
}

/// The admissions not returned cost at most `b − a + tau` over every window
/// `[a, b]` between two of them: `(time, cost)`.
fn check_bound(admissions: &[(u64, u64)], tau: u64) -> Result<(), String> {
    let mut a = admissions.to_vec();
    a.sort_unstable();
    for i in 0..a.len() {
        let mut cost: u128 = 0;
        for j in i..a.len() {
            cost += u128::from(a[j].1);
            let allowed = u128::from(a[j].0 - a[i].0) + u128::from(tau);
            if cost > allowed {
                return Err(format!(
                    "admissions in [{}, {}] cost {cost} ns of tokens: exceeds the bound by {}",
                    a[i].0,
                    a[j].0,
                    cost - allowed
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn holds_agree_with_the_integer_model() {
    run_histories(true, 200);
}

/// The same random histories with the model's answers unchecked: only the
/// bound over the script's own admissions.
#[test]
fn random_hold_histories_never_exceed_the_bound() {
    run_histories(false, 300);
}

/// Runs random histories through the script (and the model); `compare`:
/// every answer must be the model's. The bound is checked either way.
fn run_histories(compare: bool, cases: u32) {
    let server = common::RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let case_no = std::cell::Cell::new(0u64);
    let result = runner.run(&case(), |(interval, cap, limits, ops)| {
        case_no.set(case_no.get() + 1);
        let tau = interval * cap;
        let limits = limits.map(|(lq, lns)| (lq * tau / 4 + lns).max(1));
        // Two limiters on the same key with different hold limits.
        let limiters: Vec<RedisPace> = limits
            .iter()
            .map(|&limit| {
                rt.block_on(
                    RedisPace::builder(Rate::new(1, Duration::from_nanos(interval)).unwrap())
                        .capacity(cap)
                        .prefix(format!("holds{compare}{}:", case_no.get()))
                        .deny_cache(false)
                        .time_injection(true)
                        .hold_limit(Duration::from_nanos(limit))
                        .timeout(Duration::from_secs(5))
                        .connect(&server.url()),
                )
                .unwrap()
            })
            .collect();
        let limiter = &limiters[0];
        let mut model = Model {
            interval,
            cap,
            stored: None,
        };
        let mut now = BASE;
        let mut next_id = 0u64;
        // Outstanding holds (model id, admission index, hold) and
        // reservations (admission index, reservation).
        let mut holds: Vec<(u64, Option<usize>, Hold)> = Vec::new();
        let mut reservations: Vec<(Option<usize>, Reservation)> = Vec::new();
        // (time, cost) of every admission; None once returned.
        let mut admissions: Vec<Option<(u64, u64)>> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Advance { quarters, ns } => now += quarters * tau / 4 + ns,
                Op::Reserve { .. } | Op::Turn { .. } => {
                    let (n, wait) = match *op {
                        Op::Turn { n, quarters, ns } => (n, quarters * tau / 4 + ns),
                        Op::Reserve { n } => (n, 0),
                        _ => unreachable!(),
                    };
                    let got = if wait > 0 {
                        rt.block_on(limiter.reserve_turn_at(
                            "k",
                            n,
                            None,
                            Duration::from_nanos(wait),
                            now,
                        ))
                    } else {
                        rt.block_on(limiter.reserve_n_at("k", n, now))
                    };
                    let expect = if n == 0 {
                        Ok((0, 0, 0, 0))
                    } else {
                        model.decide(n, None, wait, now)
                    };
                    if compare {
                        match (&expect, &got) {
                            (Ok((prev, tat, debt, slot)), Ok(r)) => {
                                prop_assert_eq!(r.tokens(), n);
                                if n > 0 {
                                    prop_assert_eq!(r.prev_ns(), *prev, "prev, step {}", step);
                                    prop_assert_eq!(r.tat_ns(), *tat, "tat, step {}", step);
                                    prop_assert_eq!(
                                        r.remaining(),
                                        Some(model.tokens(*debt)),
                                        "remaining, step {}",
                                        step
                                    );
                                    prop_assert_eq!(
                                        r.reset_after(),
                                        Some(Duration::from_nanos(*debt)),
                                        "reset, step {}",
                                        step
                                    );
                                    prop_assert_eq!(
                                        r.wait(),
                                        Duration::from_nanos(*slot),
                                        "a turn's wait, step {}",
                                        step
                                    );
                                }
                            }
                            (Err(denial), Err(Error::Denied(d))) => {
                                denial_agrees(&model, d, *denial, "reserve", step)?;
                            }
                            (e, g) => prop_assert!(
                                false,
                                "reserve, step {}: model {:?}, script {:?}",
                                step,
                                e,
                                g
                            ),
                        }
                    }
                    match got {
                        Ok(r) => {
                            // A turn goes through at its slot.
                            let at = now + u64::try_from(r.wait().as_nanos()).unwrap();
                            let index = (n > 0).then(|| {
                                admissions.push(Some((at, n * interval)));
                                admissions.len() - 1
                            });
                            reservations.push((index, r));
                        }
                        Err(Error::Denied(_)) => {}
                        Err(e) => prop_assert!(false, "reserve, step {}: {}", step, e),
                    }
                }
                Op::Hold { n, other } => {
                    let which = usize::from(other);
                    let limit = limits[which];
                    let got = rt.block_on(limiters[which].hold_n_at("k", n, None, now));
                    let id = next_id;
                    next_id += 1;
                    let expect = if n == 0 {
                        Ok((0, 0, 0, 0))
                    } else {
                        model.decide(n, Some((id, limit)), 0, now)
                    };
                    if compare {
                        match (&expect, &got) {
                            (Ok((_, _, debt, _)), Ok(h)) => {
                                prop_assert_eq!(h.tokens(), n);
                                if n > 0 {
                                    prop_assert_eq!(h.source(), Source::Server);
                                    prop_assert_eq!(h.server_now_ns(), Some(now));
                                    prop_assert_eq!(h.expires_at_ns(), Some(now + limit));
                                    prop_assert_eq!(
                                        h.remaining(),
                                        Some(model.tokens(*debt)),
                                        "hold remaining, step {}",
                                        step
                                    );
                                    prop_assert_eq!(
                                        h.reset_after(),
                                        Some(Duration::from_nanos(*debt)),
                                        "hold reset, step {}",
                                        step
                                    );
                                } else {
                                    prop_assert_eq!(h.source(), Source::Request);
                                }
                            }
                            (Err(denial), Err(Error::Denied(d))) => {
                                denial_agrees(&model, d, *denial, "hold", step)?;
                            }
                            (e, g) => prop_assert!(
                                false,
                                "hold, step {}: model {:?}, script {:?}",
                                step,
                                e,
                                g
                            ),
                        }
                    }
                    match got {
                        Ok(h) => {
                            let index = (n > 0).then(|| {
                                admissions.push(Some((now, n * interval)));
                                admissions.len() - 1
                            });
                            holds.push((id, index, h));
                        }
                        Err(Error::Denied(_)) => {}
                        Err(e) => prop_assert!(false, "hold, step {}: {}", step, e),
                    }
                }
                Op::Keep { pick } | Op::Release { pick } => {
                    if holds.is_empty() {
                        continue;
                    }
                    let keep = matches!(op, Op::Keep { .. });
                    let (id, index, h) = holds.swap_remove(pick % holds.len());
                    let expect = match (index, keep) {
                        (None, false) => Refunded::Nothing,
                        // A keep of zero tokens: nothing to settle.
                        (None, true) => Refunded::Expired,
                        (Some(_), _) => model.resolve(id, keep, now),
                    };
                    // A keep answers true when it settled the hold.
                    let got = if keep {
                        rt.block_on(h.keep_at(now)).map(|kept| {
                            if kept {
                                Refunded::Restored
                            } else {
                                Refunded::Expired
                            }
                        })
                    } else {
                        rt.block_on(h.refund_at(now))
                    };
                    let got = match got {
                        Ok(got) => got,
                        Err(e) => {
                            return Err(TestCaseError::fail(format!(
                                "keep {keep}, step {step}: {e}"
                            )))
                        }
                    };
                    if compare {
                        prop_assert_eq!(got, expect, "keep {}, step {}", keep, step);
                    }
                    if !keep && got == Refunded::Restored {
                        if let Some(i) = index {
                            admissions[i] = None;
                        }
                    }
                }
                Op::Refund { pick } => {
                    if reservations.is_empty() {
                        continue;
                    }
                    let (index, r) = reservations.swap_remove(pick % reservations.len());
                    let expect = match index {
                        None => Refunded::Nothing,
                        Some(_) => model.refund(r.prev_ns(), r.tat_ns(), now),
                    };
                    let got = match rt.block_on(limiter.refund_at(r, now)) {
                        Ok(got) => got,
                        Err(e) => {
                            return Err(TestCaseError::fail(format!("refund, step {step}: {e}")))
                        }
                    };
                    if compare {
                        prop_assert_eq!(got, expect, "refund, step {}", step);
                    }
                    if got.returned() {
                        if let Some(i) = index {
                            admissions[i] = None;
                        }
                    }
                }
            }
            if compare {
                // The key as peek reads it: what is held counts as debt.
                let (d, held) = model.debt(now);
                let peek = match rt.block_on(limiter.peek_at("k", now)) {
                    Ok(peek) => peek,
                    Err(e) => return Err(TestCaseError::fail(format!("peek, step {step}: {e}"))),
                };
                prop_assert_eq!(
                    peek.remaining(),
                    model.tokens(d + held),
                    "peek, step {}",
                    step
                );
                prop_assert_eq!(
                    peek.reset_after(),
                    Some(Duration::from_nanos(d + held)),
                    "peek reset, step {}",
                    step
                );
            }
        }
        // Holds never resolved count as admissions (they settle as kept).
        for (_, _, h) in holds {
            std::mem::forget(h);
        }
        let live: Vec<(u64, u64)> = admissions.into_iter().flatten().collect();
        if let Err(e) = check_bound(&live, tau) {
            prop_assert!(false, "{}", e);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[tokio::test]
async fn a_refund_leaves_the_settled_debt() {
    let server = common::RedisServer::start();
    // 1 token per 10 s, capacity 3.
    let interval = 10_000_000_000u64;
    let p = RedisPace::builder(Rate::new(1, Duration::from_nanos(interval)).unwrap())
        .capacity(3)
        .prefix("settled:")
        .deny_cache(false)
        .time_injection(true)
        .connect(&server.url())
        .await
        .unwrap();
    let t0 = BASE;
    // One token held, then two reserved (settled): the bucket is empty.
    let h = p.hold_n_at("k", 1, None, t0).await.unwrap();
    let r = p.reserve_n_at("k", 2, t0).await.unwrap();
    assert_eq!(r.remaining(), Some(0));
    // The refund returns the held token only: the two settled stay spent.
    assert_eq!(h.refund_at(t0).await.unwrap(), Refunded::Restored);
    let peek = p.peek_at("k", t0).await.unwrap();
    assert_eq!(peek.remaining(), 1, "a refund rewound the settled debt");
    assert_eq!(peek.reset_after(), Some(Duration::from_nanos(2 * interval)));
    assert!(p.reserve_n_at("k", 1, t0).await.is_ok());
    assert!(
        matches!(p.reserve_n_at("k", 1, t0).await, Err(Error::Denied(_))),
        "a fourth token within one interval exceeds the bound"
    );
}

#[tokio::test]
async fn an_unresolved_hold_settles_as_kept_after_the_hold_limit() {
    let server = common::RedisServer::start();
    // 1 token per 10 s, capacity 3, holds expire after 1 s.
    let interval = 10_000_000_000u64;
    let limit = 1_000_000_000u64;
    let p = RedisPace::builder(Rate::new(1, Duration::from_nanos(interval)).unwrap())
        .capacity(3)
        .prefix("leak:")
        .deny_cache(false)
        .time_injection(true)
        .hold_limit(Duration::from_nanos(limit))
        .connect(&server.url())
        .await
        .unwrap();
    let t0 = BASE;
    let dead = p.hold_n_at("k", 1, None, t0).await.unwrap();
    let stale_keep = p.hold_n_at("k", 1, None, t0 + 1).await.unwrap();
    let live = p.hold_n_at("k", 1, None, t0 + 2).await.unwrap();
    assert_eq!(live.remaining(), Some(0));
    // `live` returns its token: 1 of 3 while the two others are held.
    assert_eq!(live.refund_at(t0 + 3).await.unwrap(), Refunded::Restored);
    assert_eq!(p.peek_at("k", t0 + 3).await.unwrap().remaining(), 1);
    // Just before the limit the two are still held.
    let before = p.peek_at("k", t0 + limit - 1).await.unwrap();
    assert_eq!(
        before.remaining(),
        1,
        "a hold expired before the hold limit"
    );
    // After it both are settled as kept from their expiry, in order of
    // expiry: tat = t0 + limit + interval, then max(that, t0 + 1 + limit) +
    // interval.
    let after = t0 + limit + 2;
    let peek = p.peek_at("k", after).await.unwrap();
    assert_eq!(peek.remaining(), 1, "an expired hold was returned");
    assert_eq!(
        peek.reset_after(),
        Some(Duration::from_nanos(t0 + limit + 2 * interval - after)),
        "the expired holds were not settled as kept from their expiry"
    );
    // The client that held `dead` died; a late refund (its id replayed by
    // a stale client) returns nothing and mints nothing.
    assert_eq!(dead.refund_at(after).await.unwrap(), Refunded::Expired);
    assert!(
        !stale_keep.keep_at(after).await.unwrap(),
        "an expired hold was kept again"
    );
    let peek = p.peek_at("k", after).await.unwrap();
    assert_eq!(peek.remaining(), 1, "a stale refund minted tokens");
    // They refill at the normal rate: all 3 back two intervals after.
    let full = t0 + limit + 2 * interval;
    assert_eq!(p.peek_at("k", full - 1).await.unwrap().remaining(), 2);
    assert_eq!(p.peek_at("k", full).await.unwrap().remaining(), 3);
    // A hold and a reserve at that time see a full bucket.
    let h = p.hold_n_at("k", 3, None, full).await.unwrap();
    assert_eq!(h.remaining(), Some(0));
    assert_eq!(h.refund_at(full).await.unwrap(), Refunded::Restored);
    assert_eq!(
        p.reserve_n_at("k", 3, full).await.unwrap().remaining(),
        Some(0)
    );
}

#[tokio::test]
async fn a_dead_clients_hold_expires_on_the_servers_clock() {
    let server = common::RedisServer::start();
    let mut admin = server.admin();
    // 1 token per second, capacity 2, holds expire after 700 ms.
    let p = RedisPace::builder(Rate::per_second(1).unwrap())
        .capacity(2)
        .prefix("dead:")
        .deny_cache(false)
        .hold_limit(Duration::from_millis(700))
        .connect(&server.url())
        .await
        .unwrap();
    let key = p.redis_key("k");
    let h = p.hold("k").await.unwrap();
    let t0 = h.server_now_ns().unwrap();
    let expiry = h.expires_at_ns().unwrap();
    assert_eq!(expiry, t0 + 700_000_000);
    // A client that dies holding: nothing resolves the hold.
    std::mem::forget(h);
    // The key outlives the hold: it expires when settling it leaves the
    // bucket full (expiry + 1 s), not when its settled tat does (now).
    let pexpire: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query(&mut admin)
        .unwrap();
    let settled_full_ms = (expiry + 1_000_000_000).div_ceil(1_000_000);
    assert_eq!(
        pexpire, settled_full_ms as i64,
        "the key's expiry does not cover its hold"
    );
    let peek = p.peek("k").await.unwrap();
    assert_eq!(peek.remaining(), 1, "the hold is not counted");
    // After the limit, on the server's clock: settled as kept from its
    // expiry, the token comes back 1 s after it.
    tokio::time::sleep(Duration::from_millis(850)).await;
    let peek = p.peek("k").await.unwrap();
    let now = peek.server_now_ns().unwrap();
    assert!(now > expiry);
    let debt = (expiry + 1_000_000_000).saturating_sub(now);
    if debt > 0 {
        // (unless this peek came a whole interval after the expiry)
        assert_eq!(peek.remaining(), 1, "an expired hold was returned");
    }
    assert_eq!(peek.remaining(), (2_000_000_000 - debt) / 1_000_000_000);
    assert_eq!(peek.reset_after(), Some(Duration::from_nanos(debt)));
    // The key then expires as a full bucket.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let exists: i64 = redis::cmd("EXISTS").arg(&key).query(&mut admin).unwrap();
    assert_eq!(exists, 0, "the key outlived its full bucket");
    assert_eq!(p.peek("k").await.unwrap().remaining(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_resolve_exactly_and_a_dropped_hold_is_kept() {
    let server = common::RedisServer::start();
    let p = RedisPace::builder(Rate::new(1, Duration::from_secs(100)).unwrap())
        .capacity(3)
        .prefix("drop:")
        .connect(&server.url())
        .await
        .unwrap();
    let a = p.hold("k").await.unwrap();
    let b = p.hold("k").await.unwrap();
    let c = p.hold("k").await.unwrap();
    assert_eq!(c.remaining(), Some(0));
    assert!(matches!(p.hold("k").await, Err(Error::Denied(_))));
    assert!(matches!(p.reserve("k").await, Err(Error::Denied(_))));
    // Out of order, with a reserve in between: each refund is exact.
    assert_eq!(b.refund().await.unwrap(), Refunded::Restored);
    let r = p.reserve("k").await.unwrap();
    assert_eq!(r.remaining(), Some(0));
    assert_eq!(a.refund().await.unwrap(), Refunded::Restored);
    // The reserve found the settled part full (holds leave tat alone); its
    // refund restores it, and the key, still holding c, stays (the core's
    // held row answers the same).
    assert_eq!(p.refund(r).await.unwrap(), Refunded::Restored);
    assert_eq!(p.peek("k").await.unwrap().remaining(), 2);
    // A dropped hold is kept by a spawned call: the key then holds no
    // hold, and still counts its token.
    drop(c);
    let mut admin = server.admin();
    for _ in 0..200 {
        let stored: String = redis::cmd("GET")
            .arg(p.redis_key("k"))
            .query(&mut admin)
            .unwrap();
        if !stored.contains('|') {
            assert_eq!(p.peek("k").await.unwrap().remaining(), 2);
            let d = p.hold("k").await.unwrap();
            assert!(d.keep().await.unwrap());
            assert_eq!(p.peek("k").await.unwrap().remaining(), 1);
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the dropped hold was not kept");
}

#[tokio::test]
async fn holds_of_the_local_fallback_are_exact_too() {
    let mut server = common::RedisServer::start();
    let p = RedisPace::builder(Rate::new(1, Duration::from_secs(100)).unwrap())
        .capacity(3)
        .prefix("local:")
        .on_unavailable(OnUnavailable::LocalFallback { replicas: 1 })
        .timeout(Duration::from_millis(300))
        .connect(&server.url())
        .await
        .unwrap();
    server.stop();
    let a = p.hold("k").await.unwrap();
    assert_eq!(a.source(), Source::Local);
    let b = p.hold("k").await.unwrap();
    let c = p.hold("k").await.unwrap();
    assert!(matches!(p.hold("k").await, Err(Error::Denied(_))));
    // Out of order: each refund returns its own token (the core's holds).
    assert!(a.refund().await.unwrap().returned());
    assert!(b.refund().await.unwrap().returned());
    assert_eq!(p.peek("k").await.unwrap().remaining(), 2);
    assert!(c.keep().await.unwrap());
    assert_eq!(p.peek("k").await.unwrap().remaining(), 2);
    // Dropping a local hold keeps it.
    drop(p.hold("k").await.unwrap());
    assert_eq!(p.peek("k").await.unwrap().remaining(), 1);
}

/// A limiter of `rate`, capacity `cap`, on injected time.
async fn injected(server: &common::RedisServer, prefix: &str, rate: Rate, cap: u64) -> RedisPace {
    RedisPace::builder(rate)
        .capacity(cap)
        .prefix(prefix)
        .deny_cache(false)
        .time_injection(true)
        .connect(&server.url())
        .await
        .unwrap()
}

/// A turn goes through at its slot while the key's held tokens may still
/// be held, and held tokens do not drain: it is admitted only when it fits
/// beside them (held + its cost <= capacity), as the core's turns are (10/s,
/// capacity 2: two tokens held at T, a turn at T would get slot T + 100 ms;
/// stored as a plain debit, the hold refunded, two reserves at T + 100 ms
/// would make 3 tokens at one instant).
#[tokio::test]
async fn a_turn_is_admitted_only_where_it_fits_beside_held_tokens() {
    let server = common::RedisServer::start();
    let p = injected(&server, "beside:", Rate::per_second(10).unwrap(), 2).await;
    let ms = 1_000_000u64;
    let t = BASE;
    let h = p.hold_n_at("k", 2, None, t).await.unwrap();
    let turn = p
        .reserve_turn_at("k", 1, None, Duration::from_millis(100), t)
        .await;
    let mut through = u32::from(turn.is_ok());
    assert_eq!(h.refund_at(t).await.unwrap(), Refunded::Restored);
    let slot = t + 100 * ms;
    for _ in 0..2 {
        if p.reserve_n_at("k", 1, slot).await.is_ok() {
            through += 1;
        }
    }
    assert!(
        through <= 2,
        "{through} tokens at one instant, capacity 2: a reserve landed on the turn's slot"
    );
    // Denied while held, the wait being the wait if the held tokens are
    // kept now (the core's `DenyReason::Held`): 2 tokens settled from T,
    // one back at T + 100 ms.
    let Err(Error::Denied(d)) = turn else {
        panic!("a turn admitted beside 2 held tokens at capacity 2");
    };
    assert_eq!(d.reason(), DenyReason::Held);
    assert_eq!(d.retry_after(), Duration::from_millis(100));

    // Within the capacity a turn waits beside held tokens: 1 held and 1
    // reserved at T, a turn of 1 gets slot T + 100 ms and settles as a
    // plain debit; the hold refunded, one more token at T + 100 ms, not two.
    let h = p.hold_n_at("j", 1, None, t).await.unwrap();
    let _kept = p.reserve_n_at("j", 1, t).await.unwrap();
    let turn = p
        .reserve_turn_at("j", 1, None, Duration::from_millis(500), t)
        .await
        .unwrap();
    assert_eq!(turn.wait(), Duration::from_millis(100));
    assert_eq!(turn.tat_ns(), t + 200 * ms);
    assert_eq!(h.refund_at(t).await.unwrap(), Refunded::Restored);
    assert!(p.reserve_n_at("j", 1, slot).await.is_ok());
    assert!(
        p.reserve_n_at("j", 1, slot).await.is_err(),
        "3 tokens at one instant, capacity 2"
    );

    // Turns only: 1 held at T, a turn of 2 does not fit beside it; the hold
    // refunded, a turn of 1 at T goes through at once.
    let h = p.hold_n_at("i", 1, None, t).await.unwrap();
    let Err(Error::Denied(d)) = p
        .reserve_turn_at("i", 2, None, Duration::from_millis(500), t)
        .await
    else {
        panic!("a turn of 2 admitted beside 1 held token at capacity 2");
    };
    assert_eq!(d.reason(), DenyReason::Held);
    assert_eq!(h.refund_at(t).await.unwrap(), Refunded::Restored);
    let turn = p
        .reserve_turn_at("i", 1, None, Duration::from_millis(500), t)
        .await
        .unwrap();
    assert_eq!(turn.wait(), Duration::ZERO);
}

/// A denial's `retry_after` while tokens are held is the wait if they are
/// kept (the core's `DenyReason::Held`), and nothing passes before it while
/// they stay unresolved: 1 per minute, capacity 1, a hold at T with the
/// default 10 s hold limit: the retry is 60 s; the hold, never resolved,
/// expires at T + 10 s and settles as kept from its expiry, so the key
/// passes at T + 70 s.
#[tokio::test]
async fn a_held_denials_retry_after_is_the_wait_if_the_holds_are_kept() {
    let server = common::RedisServer::start();
    let p = injected(
        &server,
        "retry:",
        Rate::new(1, Duration::from_secs(60)).unwrap(),
        1,
    )
    .await;
    let s = 1_000_000_000u64;
    let t = BASE;
    let h = p.hold_n_at("k", 1, None, t).await.unwrap();
    assert_eq!(h.expires_at_ns(), Some(t + 10 * s));
    let Err(Error::Denied(d)) = p.reserve_n_at("k", 1, t).await else {
        panic!("admitted beside a full hold");
    };
    assert_eq!(d.reason(), DenyReason::Held);
    assert_eq!(
        d.retry_after(),
        Duration::from_secs(60),
        "the retry_after leaves the held tokens out"
    );
    // The debt as the denial saw it: the held token (60 s).
    assert_eq!(d.reset_after(), Some(Duration::from_secs(60)));
    assert_eq!(d.remaining(), Some(0));
    // A hold is denied the same way, a second later: kept at that reading,
    // the held token ends a minute after it.
    let Err(Error::Denied(dh)) = p.hold_n_at("k", 1, None, t + s).await else {
        panic!("a hold admitted beside a full hold");
    };
    assert_eq!(dh.retry_after(), Duration::from_secs(60));
    // Nothing passes before the stated wait (the bound), and the expired
    // hold, settled from its expiry, holds the key until T + 70 s.
    assert!(p.reserve_n_at("k", 1, t + 60 * s - 1).await.is_err());
    assert!(p.reserve_n_at("k", 1, t + 70 * s - 1).await.is_err());
    assert!(p.reserve_n_at("k", 1, t + 70 * s).await.is_ok());
    std::mem::forget(h);
}

/// Under `LocalFallback` a turn is the core's `acquire`, which follows the
/// same rule beside held tokens: a turn that does not fit beside them is
/// denied `Held` (a wait, not a permanent denial), and one that fits goes
/// through once they are refunded.
#[tokio::test]
async fn turns_of_the_local_fallback_fit_beside_held_tokens() {
    let mut server = common::RedisServer::start();
    let p = RedisPace::builder(Rate::per_second(10).unwrap())
        .capacity(2)
        .prefix("localturn:")
        .on_unavailable(OnUnavailable::LocalFallback { replicas: 1 })
        .timeout(Duration::from_millis(300))
        .connect(&server.url())
        .await
        .unwrap();
    server.stop();
    let h = p.hold_n("k", 2).await.unwrap();
    assert_eq!(h.source(), Source::Local);
    let Err(Error::Denied(d)) = p.acquire("k", Duration::from_millis(100)).await else {
        panic!("a local turn admitted beside 2 held tokens at capacity 2");
    };
    assert_eq!(d.source(), Source::Local);
    assert_eq!(d.reason(), DenyReason::Held);
    assert!(!d.is_permanent(), "a denial beside held tokens is a wait");
    assert!(d.retry_after() < Duration::MAX);
    assert!(h.refund().await.unwrap().returned());
    let turn = p.acquire("k", Duration::from_millis(100)).await.unwrap();
    assert_eq!(turn.source(), Source::Local);
}
