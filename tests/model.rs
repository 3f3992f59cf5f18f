//! `Pace` against an exact sequential model over random sequences of reserve,
//! reserve_n, refund, advance, set-backwards, sweep and peek: every decision,
//! every `retry_after`, every `len()` and every peek must agree.
//!
//! The model is written from the rules (README's semantics table) in signed
//! 128-bit arithmetic over "debt" — how far a key's bucket is below full — with
//! none of the implementation's encodings, sentinels or saturations.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::time::Duration;

use pace::{DenyReason, ManualClock, Pace, Rate};
use proptest::prelude::*;

const MIN_HORIZON: i128 = 1_000_000;
const SWEEP_FLOOR: usize = 64;

#[derive(Clone, Debug)]
enum Op {
    Reserve { key: u16, n: u64 },
    Refund { pick: usize },
    Advance { ns: u64 },
    SetBack { ns: u64 },
    Sweep,
    Peek { key: u16 },
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Admitted,
    Wait(u128),
    Never,
}

/// Debt model. A key's state is `full_at`: the instant its debt reaches zero.
/// Absent keys have no debt.
struct Model {
    interval: i128,
    capacity: i128,
    horizon: i128,
    full_at: HashMap<u16, i128>,
    due: i128,
    mark: usize,
}

impl Model {
    fn tau(&self) -> i128 {
        self.interval * self.capacity
    }

    fn debt(&self, key: u16, now: i128) -> i128 {
        self.full_at.get(&key).map_or(0, |&f| (f - now).max(0))
    }

    /// Returns the outcome and, when admitted, the end of this debit.
    fn reserve(&mut self, key: u16, n: u64, now: i128) -> (Outcome, i128) {
        let n = n as i128;
        if n == 0 {
            return (Outcome::Admitted, 0);
        }
        if n > self.capacity {
            return (Outcome::Never, 0);
        }
        let room = self.tau() - self.debt(key, now);
        let need = n * self.interval;
        let created = !self.full_at.contains_key(&key);
        let result = if need <= room {
            // The debit starts where the previous debt ends (or now) and time
            // stored in the row never moves back.
            let start = self.full_at.get(&key).map_or(now, |&f| f.max(now));
            self.full_at.insert(key, start + need);
            (Outcome::Admitted, start + need)
        } else {
            (Outcome::Wait((need - room) as u128), 0)
        };
        let created = created && result.0 == Outcome::Admitted;
        self.policy(now, created);
        result
    }

    /// The sweep policy of the README: a pass when the horizon has passed (or
    /// the clock went back by more than a horizon), or the row count doubled.
    fn policy(&mut self, now: i128, created: bool) {
        if now >= self.due || self.due - now > self.horizon {
            self.due = now + self.horizon;
            self.sweep(now);
        } else if created && self.full_at.len() >= 2 * self.mark.max(SWEEP_FLOOR) {
            self.sweep(now);
        }
    }

    fn sweep(&mut self, now: i128) -> usize {
        let before = self.full_at.len();
        self.full_at.retain(|_, f| *f > now);
        self.mark = self.full_at.len();
        before - self.full_at.len()
    }

    fn refund(&mut self, key: u16, n: u64, own_end: i128, now: i128) {
        let Some(&full_at) = self.full_at.get(&key) else {
            return; // swept: a refund creates nothing
        };
        if full_at <= now || n == 0 {
            return;
        }
        let undrained = (n as i128 * self.interval).min((own_end - now).max(0));
        let new = full_at - undrained;
        if new <= now {
            self.full_at.remove(&key);
        } else {
            self.full_at.insert(key, new);
        }
    }

    fn peek(&self, key: u16, now: i128) -> u64 {
        let room = self.tau() - self.debt(key, now);
        (room.max(0) / self.interval) as u64
    }
}

fn op(keys: u16, capacity: u64, tau: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..keys).prop_map(|key| Op::Reserve { key, n: 1 }),
        2 => (0..keys, 0..=capacity + 1).prop_map(|(key, n)| Op::Reserve { key, n }),
        3 => any::<usize>().prop_map(|pick| Op::Refund { pick }),
        3 => (0..=tau * 2).prop_map(|ns| Op::Advance { ns }),
        1 => (0..=tau).prop_map(|ns| Op::SetBack { ns }),
        1 => Just(Op::Sweep),
        2 => (0..keys).prop_map(|key| Op::Peek { key }),
    ]
}

fn case() -> impl Strategy<Value = (u64, u64, usize, u16, Vec<Op>)> {
    (
        1_000u64..2_000_000,
        1u64..=6,
        prop_oneof![Just(4usize), Just(64)],
        prop_oneof![Just(3u16), Just(12), Just(300)],
    )
        .prop_flat_map(|(interval, capacity, min_slots, keys)| {
            let ops = proptest::collection::vec(op(keys, capacity, interval * capacity), 1..400);
            (
                Just(interval),
                Just(capacity),
                Just(min_slots),
                Just(keys),
                ops,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn pace_agrees_with_the_debt_model((interval, capacity, min_slots, keys, ops) in case()) {
        let clock = ManualClock::new();
        let rate = Rate::new(1, Duration::from_nanos(interval)).unwrap();
        let pace: Pace<u16, RandomState, ManualClock> = Pace::builder(rate)
            .capacity(capacity)
            .min_slots(min_slots)
            .clock(clock.clone())
            .build()
            .unwrap();
        let tau = (interval * capacity) as i128;
        let mut model = Model {
            interval: interval as i128,
            capacity: capacity as i128,
            horizon: tau.max(MIN_HORIZON),
            full_at: HashMap::new(),
            due: tau.max(MIN_HORIZON),
            mark: 0,
        };
        let names: Vec<u16> = (0..keys).collect();
        let mut held = Vec::new();
        let mut now: u64 = 0;
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Reserve { key, n } => {
                    let (expect, end) = model.reserve(key, n, now as i128);
                    let got = pace.reserve_n(&names[key as usize], n);
                    match (&got, &expect) {
                        (Ok(_), Outcome::Admitted) => {}
                        (Err(d), Outcome::Wait(ns)) => {
                            prop_assert_eq!(d.reason(), DenyReason::Exhausted);
                            prop_assert_eq!(d.retry_after().as_nanos(), *ns, "step {}", step);
                        }
                        (Err(d), Outcome::Never) => {
                            prop_assert_eq!(d.reason(), DenyReason::ExceedsCapacity);
                        }
                        _ => prop_assert!(false, "step {step}: {op:?} got {got:?}, model {expect:?}"),
                    }
                    if let Ok(r) = got {
                        held.push((r, key, n, end));
                    }
                }
                Op::Refund { pick } => {
                    if !held.is_empty() {
                        let (r, key, n, end) = held.swap_remove(pick % held.len());
                        model.refund(key, n, end, now as i128);
                        r.refund();
                    }
                }
                Op::Advance { ns } => {
                    now += ns;
                    clock.set(Duration::from_nanos(now));
                }
                Op::SetBack { ns } => {
                    now = now.saturating_sub(ns);
                    clock.set(Duration::from_nanos(now));
                }
                Op::Sweep => {
                    let expect = model.sweep(now as i128);
                    prop_assert_eq!(pace.sweep(), expect, "step {}", step);
                }
                Op::Peek { key } => {
                    prop_assert_eq!(
                        pace.peek(&names[key as usize]),
                        model.peek(key, now as i128),
                        "step {}", step
                    );
                }
            }
            prop_assert_eq!(pace.len(), model.full_at.len(), "step {}: {:?}", step, op);
        }
        let mut rows = pace.row_keys();
        rows.sort_unstable();
        let mut expect: Vec<u16> = model.full_at.keys().copied().collect();
        expect.sort_unstable();
        prop_assert_eq!(rows, expect);
    }
}
