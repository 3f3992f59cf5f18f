//! The script and the core crate are the same rule: one random operation
//! sequence runs through `pace::Pace` on a `ManualClock`, through the script
//! on a real redis-server with the same time injected, and through an
//! integer model of the rule written here; every decision, retry_after, tat,
//! refund outcome, remaining token count, reset time and peek must agree.
//! Calls use the configuration's quota or one of two quotas of their own
//! (`reserve_n_with`), and turns (`acquire`'s reservation, a slot up to a
//! wait ahead) are decided with the same injected time.

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
        3 => (0u64..6, prop_oneof![Just(0u64), Just(1), 0u64..2_000_000_000])
            .prop_map(|(quarters, ns)| Op::Advance { quarters, ns }),
    ]
}

fn interval() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(1u64),
        Just(7),
        Just(1_000),
        Just(333_333_334),
        Just(1_000_000_007),
        1u64..5_000_000_000
    ]
}

/// The configuration's quota and two of the calls' own, as (interval,
/// capacity), and the operations.
type Case = ([(u64, u64); 3], Vec<Op>);

fn case() -> impl Strategy<Value = Case> {
    proptest::array::uniform3((interval(), 1u64..=8)).prop_flat_map(|quotas| {
        let cap = quotas.iter().map(|q| q.1).max().unwrap_or(1);
        (Just(quotas), proptest::collection::vec(op(cap), 1..60))
    })
}

fn quota((interval, cap): (u64, u64)) -> Quota {
    Quota::new(Rate::new(1, Duration::from_nanos(interval)).unwrap(), cap).unwrap()
}

/// The rule, in plain integers: `tat` per key, 0 (or anything <= now) full.
/// `interval` and `cap` are the quota of the call being modelled.
struct Model {
    interval: u64,
    cap: u64,
    tat: HashMap<usize, u64>,
}

impl Model {
    /// A reserve (`wait` 0) or a turn: admitted when the debit fits the
    /// bucket within `wait` ns; a denial's wait is the whole wait.
    fn reserve(
        &mut self,
        key: usize,
        n: u64,
        wait: u64,
        now: u64,
    ) -> Result<(u64, u64), (DenyReason, u64)> {
        if n > self.cap {
            return Err((DenyReason::ExceedsCapacity, u64::MAX));
        }
        if n == 0 {
            return Ok((0, 0));
        }
        let t = self.tat.get(&key).copied().unwrap_or(0);
        let new = t.max(now) + n * self.interval;
        let tau = self.cap * self.interval;
        if new - now <= tau + wait {
            self.tat.insert(key, new);
            Ok((if t > now { t } else { 0 }, new))
        } else {
            Err((DenyReason::Exhausted, new - now - tau))
        }
    }

    /// ns until `key`'s bucket is full.
    fn debt(&self, key: usize, now: u64) -> u64 {
        self.tat.get(&key).map_or(0, |t| t.saturating_sub(now))
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

    fn refund(&mut self, key: usize, prev: u64, mine: u64, now: u64) -> Refunded {
        match self.tat.get(&key) {
            None => return Refunded::Refilled,
            Some(&t) if t != mine => return Refunded::Superseded,
            Some(_) => {}
        }
        if prev > now {
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
                .build()
                .unwrap();
        let mut model = Model {
            interval,
            cap,
            tat: HashMap::new(),
        };
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
        let mut held: Vec<(usize, Local<'_>, pace_redis::Reservation)> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            // Reserve and turn: (key, n, quota index, Some(wait) for a turn).
            let (key, n, q, turn) = match *op {
                Op::Advance { quarters, ns } => {
                    now += quarters * tau / 4 + ns;
                    clock.set(Duration::from_nanos(now));
                    (0, 0, 0, None)
                }
                Op::Reserve { key, n, quota } => (key, n, quota, None),
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
                let (qi, qc) = quotas[q];
                let own = quota(quotas[q]);
                model.interval = qi;
                model.cap = qc;
                let debt_before = model.debt(key, now);
                let expect = model.reserve(key, n, turn.unwrap_or(0), now);
                let (local, remote) = match (turn, q) {
                    (None, 0) => (
                        pace.reserve_n(KEYS[key], n).map(|l| (l, 0)),
                        rt.block_on(limiter.reserve_n_at(KEYS[key], n, now)),
                    ),
                    (None, _) => (
                        pace.reserve_n_with(KEYS[key], n, own).map(|l| (l, 0)),
                        rt.block_on(limiter.reserve_n_with_at(KEYS[key], n, own, now)),
                    ),
                    (Some(wait), _) => {
                        let with = (q != 0).then_some(own);
                        (
                            pace.reserve_turn_at(KEYS[key], n, with, wait, now),
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
                    (Ok((prev, tat)), Ok((l, slot)), Ok(r)) => {
                        prop_assert_eq!(l.tokens(), n, "step {}", step);
                        prop_assert_eq!(r.tokens(), n, "step {}", step);
                        if n > 0 {
                            prop_assert_eq!(l.debit_end_ns(), *tat, "pace tat, step {}", step);
                            prop_assert_eq!(r.tat_ns(), *tat, "script tat, step {}", step);
                            prop_assert_eq!(r.prev_ns(), *prev, "script prev, step {}", step);
                            prop_assert_eq!(r.server_now_ns(), Some(now));
                            // A turn's wait: until its debit fits the bucket.
                            let wait = (tat - now).saturating_sub(tau);
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
                            let left = model.tokens(tat - now);
                            prop_assert_eq!(r.remaining(), Some(left), "remaining, step {}", step);
                            prop_assert_eq!(
                                pace.peek_with(KEYS[key], own),
                                left,
                                "pace peek, step {}",
                                step
                            );
                            prop_assert_eq!(
                                r.reset_after(),
                                Some(Duration::from_nanos(tat - now)),
                                "reset, step {}",
                                step
                            );
                        }
                        held.push((key, l, r));
                    }
                    (Err((reason, wait)), Err(l), Err(Error::Denied(r))) => {
                        prop_assert_eq!(l.reason(), *reason, "pace reason, step {}", step);
                        prop_assert_eq!(r.reason(), *reason, "script reason, step {}", step);
                        if *reason == DenyReason::Exhausted {
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
                let model_debt = model.tat.get(&k).map_or(0, |t| t.saturating_sub(now));
                let stored: Option<u64> = redis::cmd("GET")
                    .arg(limiter.redis_key(name))
                    .query(&mut *admin.borrow_mut())
                    .unwrap();
                prop_assert_eq!(
                    stored.map_or(0, |t| t.saturating_sub(now)),
                    model_debt,
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
                    let peek = if qn == 0 {
                        prop_assert_eq!(pace.peek(*name), tokens, "pace tokens, step {}", step);
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
