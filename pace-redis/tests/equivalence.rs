//! The script and the core crate are the same rule: one random operation
//! sequence runs through `pace::Pace` on a `ManualClock`, through the script
//! on a real redis-server with the same time injected, and through an
//! integer model of the rule written here; every decision, retry_after, tat,
//! refund outcome, remaining token count, reset time and peek must agree.
//! Calls use the configuration's quota or one of two quotas of their own
//! (`reserve_n_with`), and turns (`acquire`'s reservation, a slot up to a
//! wait ahead) are decided with the same injected time. Holds are kept or
//! refunded (within their limit: the core's lots and the script's
//! per-hold expiries differ only in when an unresolved hold expires,
//! DESIGN.md §3, which `tests/holds.rs` covers), and the default quota
//! changes (`Pace::set_quota`; on the script's side the same quota sent with
//! each call).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use pace::internals::{PaceInternals, ReservationInternals};
use pace::{DenyReason, ManualClock, Pace, Quota, Rate};
use pace_redis::{Error, RedisPace, Refunded, Source};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const KEYS: [&str; 3] = ["a", "b", "c"];
/// A realistic Unix time in ns (not a round number), so the script's
/// (seconds, nanoseconds) split is exercised.
const BASE: u64 = 1_764_000_000_123_456_789;

#[derive(Clone, Debug)]
enum Op {
    /// `quota` 0: the configuration's; 1 and 2: the case's own quotas.
    Reserve {
        key: usize,
        n: u64,
        quota: usize,
    },
    /// A turn under `quota` with a wait of `quarters / 4` of its horizon
    /// plus `ns`.
    Turn {
        key: usize,
        n: u64,
        quota: usize,
        quarters: u64,
        ns: u64,
    },
    Refund {
        pick: usize,
    },
    /// A hold of `n` under the default quota in force.
    Hold {
        key: usize,
        n: u64,
    },
    /// Keep (`keep`) or refund a hold.
    Resolve {
        pick: usize,
        keep: bool,
    },
    /// The default quota becomes quota `q`.
    SetQuota {
        q: usize,
    },
    /// Advance by `num / 4` of tau plus `ns`.
    Advance {
        quarters: u64,
        ns: u64,
    },
}

fn op(cap: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..KEYS.len(), 0..=cap + 1, prop_oneof![2 => Just(0usize), 1 => 1usize..3])
            .prop_map(|(key, n, quota)| Op::Reserve { key, n, quota }),
        2 => (0..KEYS.len(), 0..=cap + 1, 0usize..3, 0u64..9, prop_oneof![Just(0u64), 0u64..1_000_000])
            .prop_map(|(key, n, quota, quarters, ns)| Op::Turn { key, n, quota, quarters, ns }),
        2 => any::<usize>().prop_map(|pick| Op::Refund { pick }),
        3 => (0..KEYS.len(), 1..=cap + 1).prop_map(|(key, n)| Op::Hold { key, n }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, keep)| Op::Resolve { pick, keep }),
        1 => (0usize..3).prop_map(|q| Op::SetQuota { q }),
        3 => (0u64..6, prop_oneof![Just(0u64), Just(1), 0u64..2_000_000_000])
            .prop_map(|(quarters, ns)| Op::Advance { quarters, ns }),
    ]
}

/// The configuration's quota and two of the calls' own, as (interval,
/// capacity), and the operations.
type Case = ([(u64, u64); 3], Vec<Op>);

fn case() -> impl Strategy<Value = Case> {
    proptest::array::uniform3((common::interval(), 1u64..=8)).prop_flat_map(|quotas| {
        let cap = quotas.iter().map(|q| q.1).max().unwrap_or(1);
        (Just(quotas), proptest::collection::vec(op(cap), 1..60))
    })
}

fn quota((interval, cap): (u64, u64)) -> Quota {
    Quota::new(Rate::new(1, Duration::from_nanos(interval)).unwrap(), cap).unwrap()
}

/// The rule, in plain integers: the settled `tat` per key (0, or anything
/// <= now, full) and what each key holds (ns). `interval` and `cap` are the
/// quota of the call being modelled.
struct Model {
    interval: u64,
    cap: u64,
    tat: HashMap<usize, u64>,
    held: HashMap<usize, u64>,
}

impl Model {
    fn held(&self, key: usize) -> u64 {
        self.held.get(&key).copied().unwrap_or(0)
    }

    /// A reserve (`wait` 0), a turn, or a hold (`hold`): admitted when
    /// `debt + held + n·T <= τ + wait` and `held + n·T <= τ`; a denial's
    /// wait is `debt + held + n·T − τ` (the whole wait; beside holds, the
    /// wait if they are kept, reason `Held`). Ok: (prev, settled tat after,
    /// held after).
    fn decide(
        &mut self,
        key: usize,
        n: u64,
        wait: u64,
        hold: bool,
        now: u64,
    ) -> Result<(u64, u64, u64), (DenyReason, u64)> {
        if n > self.cap {
            return Err((DenyReason::ExceedsCapacity, u64::MAX));
        }
        if n == 0 {
            return Ok((0, 0, 0));
        }
        let t = self.tat.get(&key).copied().unwrap_or(0);
        let h = self.held(key);
        let c = n * self.interval;
        let tau = self.cap * self.interval;
        let d = t.saturating_sub(now);
        if d + h + c > tau + wait || h + c > tau {
            let reason = if h > 0 {
                DenyReason::Held
            } else {
                DenyReason::Exhausted
            };
            return Err((reason, d + h + c - tau));
        }
        if hold {
            self.held.insert(key, h + c);
            return Ok((0, t, h + c));
        }
        let new = t.max(now) + c;
        self.tat.insert(key, new);
        Ok((if t > now { t } else { 0 }, new, h))
    }

    /// A hold of `cost` decided at `at` kept (settled from `at`) or
    /// refunded; a key left full without holds is gone.
    fn resolve(&mut self, key: usize, cost: u64, at: u64, keep: bool, now: u64) {
        let h = self.held(key) - cost;
        self.held.insert(key, h);
        if keep {
            let t = self.tat.get(&key).copied().unwrap_or(0);
            self.tat.insert(key, t.max(at) + cost);
        }
        self.forget_if_full(key, now);
    }

    fn forget_if_full(&mut self, key: usize, now: u64) {
        if self.held(key) == 0 && self.tat.get(&key).is_none_or(|&t| t <= now) {
            self.tat.remove(&key);
            self.held.remove(&key);
        }
    }

    /// ns until `key`'s bucket is full if what it holds is kept.
    fn debt(&self, key: usize, now: u64) -> u64 {
        self.tat.get(&key).map_or(0, |t| t.saturating_sub(now)) + self.held(key)
    }

    /// Whole tokens of a bucket `debt` ns from full.
    fn tokens(&self, debt: u64) -> u64 {
        let tau = self.cap * self.interval;
        if debt >= tau {
            0
        } else {
            (tau - debt) / self.interval
        }
    }

    /// A reserve's refund: `prev` back if the settled `tat` is still its
    /// own; a key with holds stays (`Restored`), one without goes when full.
    fn refund(&mut self, key: usize, prev: u64, mine: u64, now: u64) -> Refunded {
        let t = match self.tat.get(&key) {
            None if self.held(key) == 0 => return Refunded::Refilled,
            t => t.copied().unwrap_or(0),
        };
        if t != mine {
            return Refunded::Superseded;
        }
        if prev > now || self.held(key) > 0 {
            self.tat.insert(key, prev);
            Refunded::Restored
        } else {
            self.tat.remove(&key);
            Refunded::Removed
        }
    }
}

#[test]
fn script_pace_and_model_agree_on_every_decision() {
    let server = common::RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 160,
        ..Config::default()
    });
    let admin = std::cell::RefCell::new(server.admin());
    let case_no = std::cell::Cell::new(0u64);
    let result = runner.run(&case(), |(quotas, ops)| {
        case_no.set(case_no.get() + 1);
        let (interval, cap) = quotas[0];
        let limiter = rt
            .block_on(
                RedisPace::builder(Rate::new(1, Duration::from_nanos(interval)).unwrap())
                    .capacity(cap)
                    .prefix(format!("eq{}:", case_no.get()))
                    .deny_cache(false)
                    .time_injection(true)
                    .hold_limit(Duration::from_nanos(pace_redis::MAX_TAU_NS))
                    .timeout(Duration::from_secs(5))
                    .connect(&server.url()),
            )
            .unwrap();
        assert_eq!(limiter.interval_ns(), interval);
        let clock = ManualClock::new();
        let pace: Pace<String, _, ManualClock> =
            Pace::builder(Rate::new(1, Duration::from_nanos(interval)).unwrap())
                .capacity(cap)
                .clock(clock.clone())
                .hold_limit(Duration::MAX)
                .build()
                .unwrap();
        let mut model = Model {
            interval,
            cap,
            tat: HashMap::new(),
            held: HashMap::new(),
        };
        // The default quota in force (an index into `quotas`): the core's
        // `set_quota`; the script is sent it with each call.
        let mut default_q = 0usize;
        let tau = interval * cap;
        let mut now = BASE;
        clock.set(Duration::from_nanos(now));
        // (key, pace reservation, redis reservation)
        type Local<'a> = pace::Reservation<
            'a,
            String,
            str,
            std::collections::hash_map::RandomState,
            ManualClock,
        >;
        type LocalHold<'a> =
            pace::Hold<'a, String, str, std::collections::hash_map::RandomState, ManualClock>;
        let mut held: Vec<(usize, Local<'_>, pace_redis::Reservation)> = Vec::new();
        // (key, cost, reading, pace hold, redis hold)
        let mut holds: Vec<(usize, u64, u64, LocalHold<'_>, pace_redis::Hold)> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            // Reserve and turn: (key, n, quota index, Some(wait) for a turn).
            let (key, n, q, turn) = match *op {
                Op::Advance { quarters, ns } => {
                    now += quarters * tau / 4 + ns;
                    clock.set(Duration::from_nanos(now));
                    (0, 0, 0, None)
                }
                Op::Reserve { key, n, quota } => (key, n, quota, None),
                Op::SetQuota { q } => {
                    default_q = q;
                    pace.set_quota(quota(quotas[q]));
                    (0, 0, 0, None)
                }
                Op::Hold { key, n } => {
                    let (qi, qc) = quotas[default_q];
                    model.interval = qi;
                    model.cap = qc;
                    let debt_before = model.debt(key, now);
                    let expect = model.decide(key, n, 0, true, now);
                    let with = (default_q != 0).then(|| quota(quotas[default_q]));
                    let local = pace.hold_n(KEYS[key], n);
                    let remote = rt.block_on(limiter.hold_n_at(KEYS[key], n, with, now));
                    match (&expect, local, remote) {
                        (Ok(_), Ok(l), Ok(r)) => {
                            prop_assert_eq!(l.tokens(), n, "step {}", step);
                            prop_assert_eq!(r.tokens(), n, "step {}", step);
                            holds.push((key, n * qi, now, l, r));
                        }
                        (Err((reason, wait)), Err(l), Err(Error::Denied(r))) => {
                            prop_assert_eq!(l.reason(), *reason, "pace hold, step {}", step);
                            prop_assert_eq!(r.reason(), *reason, "script hold, step {}", step);
                            if *reason != DenyReason::ExceedsCapacity {
                                let wait = Duration::from_nanos(*wait);
                                prop_assert_eq!(
                                    l.retry_after(),
                                    wait,
                                    "pace hold wait, step {}",
                                    step
                                );
                                prop_assert_eq!(
                                    r.retry_after(),
                                    wait,
                                    "script hold wait, step {}",
                                    step
                                );
                                prop_assert_eq!(
                                    r.reset_after(),
                                    Some(Duration::from_nanos(debt_before)),
                                    "denied hold reset, step {}",
                                    step
                                );
                            }
                        }
                        (e, l, r) => prop_assert!(
                            false,
                            "hold, step {}: model {:?}, pace {:?}, script {:?}",
                            step,
                            e,
                            l.map(|x| x.tokens()),
                            r.map(|x| x.tokens())
                        ),
                    }
                    (0, 0, 0, None)
                }
                Op::Resolve { pick, keep } => {
                    if !holds.is_empty() {
                        let (key, cost, at, l, r) = holds.swap_remove(pick % holds.len());
                        model.resolve(key, cost, at, keep, now);
                        if keep {
                            prop_assert!(l.keep(), "pace keep, step {}", step);
                            let kept = rt.block_on(r.keep_at(now)).unwrap();
                            prop_assert!(kept, "script keep, step {}", step);
                        } else {
                            prop_assert_eq!(l.refund(), Refunded::Restored, "step {}", step);
                            let got = rt.block_on(r.refund_at(now)).unwrap();
                            prop_assert_eq!(
                                got,
                                Refunded::Restored,
                                "script hold refund, step {}",
                                step
                            );
                        }
                    }
                    (0, 0, 0, None)
                }
                Op::Turn {
                    key,
                    n,
                    quota,
                    quarters,
                    ns,
                } => {
                    let (i, c) = quotas[quota];
                    (key, n, quota, Some(quarters * i * c / 4 + ns))
                }
                Op::Refund { pick } => {
                    if !held.is_empty() {
                        let (key, l, r) = held.swap_remove(pick % held.len());
                        let expect = if r.tokens() == 0 {
                            Refunded::Nothing
                        } else {
                            model.refund(key, r.prev_ns(), r.tat_ns(), now)
                        };
                        l.refund();
                        let got = rt.block_on(limiter.refund_at(r, now)).unwrap();
                        prop_assert_eq!(got, expect, "refund, step {}", step);
                    }
                    (0, 0, 0, None)
                }
            };
            if matches!(op, Op::Reserve { .. } | Op::Turn { .. }) {
                // Quota 0: the default in force, the configuration's unless
                // changed.
                let q = if q == 0 { default_q } else { q };
                let (qi, qc) = quotas[q];
                let own = quota(quotas[q]);
                model.interval = qi;
                model.cap = qc;
                let debt_before = model.debt(key, now);
                let expect = model.decide(key, n, turn.unwrap_or(0), false, now);
                let (local, remote) = match (turn, q) {
                    (None, 0) => (
                        pace.reserve_n(KEYS[key], n).map(|l| (l, 0)),
                        rt.block_on(limiter.reserve_n_at(KEYS[key], n, now)),
                    ),
                    (None, _) if q == default_q => (
                        pace.reserve_n(KEYS[key], n).map(|l| (l, 0)),
                        rt.block_on(limiter.reserve_n_with_at(KEYS[key], n, own, now)),
                    ),
                    (None, _) => (
                        pace.reserve_n_with(KEYS[key], n, own).map(|l| (l, 0)),
                        rt.block_on(limiter.reserve_n_with_at(KEYS[key], n, own, now)),
                    ),
                    (Some(wait), _) => {
                        let with = (q != 0).then_some(own);
                        let local_with = (q != default_q).then_some(own);
                        (
                            pace.reserve_turn_at(KEYS[key], n, local_with, wait, now),
                            rt.block_on(limiter.reserve_turn_at(
                                KEYS[key],
                                n,
                                with,
                                Duration::from_nanos(wait),
                                now,
                            )),
                        )
                    }
                };
                let tau = qi * qc;
                match (&expect, local, remote) {
                    (Ok((prev, tat, held_ns)), Ok((l, slot)), Ok(r)) => {
                        prop_assert_eq!(l.tokens(), n, "step {}", step);
                        prop_assert_eq!(r.tokens(), n, "step {}", step);
                        if n > 0 {
                            prop_assert_eq!(l.debit_end_ns(), *tat, "pace tat, step {}", step);
                            prop_assert_eq!(r.tat_ns(), *tat, "script tat, step {}", step);
                            prop_assert_eq!(r.prev_ns(), *prev, "script prev, step {}", step);
                            prop_assert_eq!(r.server_now_ns(), Some(now));
                            // A turn's wait: until its debit fits the bucket
                            // beside what is held (`slot_of`).
                            let debt_after = tat - now + held_ns;
                            let wait = debt_after.saturating_sub(tau);
                            prop_assert_eq!(
                                r.wait(),
                                Duration::from_nanos(wait),
                                "script wait, step {}",
                                step
                            );
                            if turn.is_some() {
                                prop_assert_eq!(slot.max(now), now + wait, "slot, step {}", step);
                            }
                            // Remaining and reset after the debit.
                            let left = model.tokens(debt_after);
                            prop_assert_eq!(r.remaining(), Some(left), "remaining, step {}", step);
                            prop_assert_eq!(
                                pace.peek_with(KEYS[key], own),
                                left,
                                "pace peek, step {}",
                                step
                            );
                            prop_assert_eq!(
                                r.reset_after(),
                                Some(Duration::from_nanos(debt_after)),
                                "reset, step {}",
                                step
                            );
                        }
                        held.push((key, l, r));
                    }
                    (Err((reason, wait)), Err(l), Err(Error::Denied(r))) => {
                        prop_assert_eq!(l.reason(), *reason, "pace reason, step {}", step);
                        prop_assert_eq!(r.reason(), *reason, "script reason, step {}", step);
                        if *reason != DenyReason::ExceedsCapacity {
                            prop_assert_eq!(
                                l.retry_after(),
                                Duration::from_nanos(*wait),
                                "pace wait, step {}",
                                step
                            );
                            prop_assert_eq!(
                                r.retry_after(),
                                Duration::from_nanos(*wait),
                                "script wait, step {}",
                                step
                            );
                            prop_assert_eq!(r.source(), Source::Server);
                            prop_assert_eq!(
                                r.remaining(),
                                Some(model.tokens(debt_before)),
                                "denied remaining, step {}",
                                step
                            );
                            prop_assert_eq!(
                                r.reset_after(),
                                Some(Duration::from_nanos(debt_before)),
                                "denied reset, step {}",
                                step
                            );
                        }
                    }
                    (e, l, r) => prop_assert!(
                        false,
                        "step {}: model {:?}, pace {:?}, script {:?}",
                        step,
                        e,
                        l.map(|x| (x.0.tokens(), x.1)),
                        r
                    ),
                }
            }
            // The stored state: the same debt (stale keys count as full),
            // and the tokens each quota reads from it.
            for (k, name) in KEYS.iter().enumerate() {
                let settled = model.tat.get(&k).map_or(0, |t| t.saturating_sub(now));
                let model_debt = model.debt(k, now);
                // A key with holds stores `tat|held|…`: its settled tat first.
                let stored: Option<String> = redis::cmd("GET")
                    .arg(limiter.redis_key(name))
                    .query(&mut *admin.borrow_mut())
                    .unwrap();
                let stored =
                    stored.map(|v| v.split('|').next().unwrap_or("").parse::<u64>().unwrap());
                prop_assert_eq!(
                    stored.map_or(0, |t| t.saturating_sub(now)),
                    settled,
                    "stored debt of {}, step {}",
                    name,
                    step
                );
                for (qn, &(qi, qc)) in quotas.iter().enumerate() {
                    let qtau = qi * qc;
                    let tokens = if model_debt >= qtau {
                        0
                    } else {
                        (qtau - model_debt) / qi
                    };
                    if qn == default_q {
                        prop_assert_eq!(pace.peek(*name), tokens, "pace tokens, step {}", step);
                    }
                    let peek = if qn == 0 {
                        rt.block_on(limiter.peek_at(name, now)).unwrap()
                    } else {
                        let own = quota((qi, qc));
                        prop_assert_eq!(
                            pace.peek_with(*name, own),
                            tokens,
                            "pace tokens of {} under quota {}, step {}",
                            name,
                            qn,
                            step
                        );
                        rt.block_on(limiter.peek_with_at(name, own, now)).unwrap()
                    };
                    prop_assert_eq!(
                        peek.remaining(),
                        tokens,
                        "peek of {} under quota {}, step {}",
                        name,
                        qn,
                        step
                    );
                    prop_assert_eq!(peek.reset_after(), Some(Duration::from_nanos(model_debt)));
                    prop_assert_eq!(peek.server_now_ns(), Some(now));
                    prop_assert_eq!(peek.source(), Source::Server);
                }
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
