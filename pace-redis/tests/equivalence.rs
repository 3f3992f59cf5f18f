//! The script and the core crate are the same rule: one random operation
//! sequence runs through `pace::Pace` on a `ManualClock`, through the script
//! on a real redis-server with the same time injected, and through an
//! integer model of the rule written here; every decision, retry_after, tat,
//! refund outcome, remaining token count, reset time and peek must agree.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use pace::internals::ReservationInternals;
use pace::{DenyReason, ManualClock, Pace, Rate};
use pace_redis::{Error, RedisPace, Refunded, Source};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const KEYS: [&str; 3] = ["a", "b", "c"];
/// A realistic Unix time in ns (not a round number), so the script's
/// (seconds, nanoseconds) split is exercised.
const BASE: u64 = 1_764_000_000_123_456_789;

#[derive(Clone, Debug)]
enum Op {
    Reserve {
        key: usize,
        n: u64,
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
        5 => (0..KEYS.len(), 0..=cap + 1).prop_map(|(key, n)| Op::Reserve { key, n }),
        2 => any::<usize>().prop_map(|pick| Op::Refund { pick }),
        3 => (0u64..6, prop_oneof![Just(0u64), Just(1), 0u64..2_000_000_000])
            .prop_map(|(quarters, ns)| Op::Advance { quarters, ns }),
    ]
}

fn case() -> impl Strategy<Value = (u64, u64, Vec<Op>)> {
    (
        prop_oneof![
            Just(1u64),
            Just(7),
            Just(1_000),
            Just(333_333_334),
            Just(1_000_000_007),
            1u64..5_000_000_000
        ],
        1u64..=8,
    )
        .prop_flat_map(|(interval, cap)| {
            (
                Just(interval),
                Just(cap),
                proptest::collection::vec(op(cap), 1..60),
            )
        })
}

/// The rule, in plain integers: `tat` per key, 0 (or anything <= now) full.
struct Model {
    interval: u64,
    cap: u64,
    tat: HashMap<usize, u64>,
}

impl Model {
    fn reserve(&mut self, key: usize, n: u64, now: u64) -> Result<(u64, u64), (DenyReason, u64)> {
        if n > self.cap {
            return Err((DenyReason::ExceedsCapacity, u64::MAX));
        }
        if n == 0 {
            return Ok((0, 0));
        }
        let t = self.tat.get(&key).copied().unwrap_or(0);
        let new = t.max(now) + n * self.interval;
        let tau = self.cap * self.interval;
        if new - now <= tau {
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
    let result = runner.run(&case(), |(interval, cap, ops)| {
        case_no.set(case_no.get() + 1);
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
        let mut held = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Advance { quarters, ns } => {
                    now += quarters * tau / 4 + ns;
                    clock.set(Duration::from_nanos(now));
                }
                Op::Reserve { key, n } => {
                    let debt_before = model.debt(key, now);
                    let expect = model.reserve(key, n, now);
                    let local = pace.reserve_n(KEYS[key], n);
                    let remote = rt.block_on(limiter.reserve_n_at(KEYS[key], n, now));
                    match (&expect, local, remote) {
                        (Ok((prev, tat)), Ok(l), Ok(r)) => {
                            prop_assert_eq!(l.tokens(), n, "step {}", step);
                            prop_assert_eq!(r.tokens(), n, "step {}", step);
                            if n > 0 {
                                prop_assert_eq!(l.debit_end_ns(), *tat, "pace tat, step {}", step);
                                prop_assert_eq!(r.tat_ns(), *tat, "script tat, step {}", step);
                                prop_assert_eq!(r.prev_ns(), *prev, "script prev, step {}", step);
                                prop_assert_eq!(r.server_now_ns(), Some(now));
                                // Remaining and reset after the debit.
                                let left = model.tokens(tat - now);
                                prop_assert_eq!(
                                    r.remaining(),
                                    Some(left),
                                    "remaining, step {}",
                                    step
                                );
                                prop_assert_eq!(
                                    pace.peek(KEYS[key]),
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
                            l.map(|x| x.tokens()),
                            r
                        ),
                    }
                }
                Op::Refund { pick } => {
                    if held.is_empty() {
                        continue;
                    }
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
            }
            // The stored state: the same debt (stale keys count as full).
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
                prop_assert_eq!(
                    pace.peek(*name),
                    if model_debt >= tau {
                        0
                    } else {
                        (tau - model_debt) / interval
                    },
                    "pace tokens of {}, step {}",
                    name,
                    step
                );
                // The script's peek: the same tokens, the debt as reset.
                let peek = rt.block_on(limiter.peek_at(name, now)).unwrap();
                prop_assert_eq!(
                    peek.remaining(),
                    model.tokens(model_debt),
                    "peek of {}, step {}",
                    name,
                    step
                );
                prop_assert_eq!(peek.remaining(), pace.peek(*name));
                prop_assert_eq!(peek.reset_after(), Some(Duration::from_nanos(model_debt)));
                prop_assert_eq!(peek.server_now_ns(), Some(now));
                prop_assert_eq!(peek.source(), Source::Server);
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
