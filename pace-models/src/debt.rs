//! The exact sequential model of `Pace` (checked by `tests/model.rs` and the
//! `pace_model` and `table_model` fuzz targets): signed 128-bit arithmetic over "debt" — how far
//! a key's bucket is below full — written from the rules in README's
//! semantics table, with none of the implementation's encodings, sentinels or
//! saturations.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::time::Duration;

use pace::internals::PaceInternals;
use pace::{DenyReason, ManualClock, Pace, Quota, Rate};

const MIN_HORIZON: i128 = 1_000_000;
const SWEEP_FLOOR: usize = 64;

/// One step of a run, applied to the real `Pace` and to the model.
#[derive(Clone, Debug)]
pub enum Op {
    /// `reserve_n(key, n)`.
    Reserve {
        /// The key (taken modulo [`Params::keys`]).
        key: u16,
        /// Tokens asked for.
        n: u64,
    },
    /// `check_key_n(key, n)`: a reserve kept at once, without its
    /// reservation.
    Check {
        /// The key (taken modulo [`Params::keys`]).
        key: u16,
        /// Tokens asked for.
        n: u64,
    },
    /// Refund one of the reservations still held (`pick` modulo their number).
    Refund {
        /// Which held reservation.
        pick: usize,
    },
    /// Move the clock forward.
    Advance {
        /// Nanoseconds.
        ns: u64,
    },
    /// Move the clock backward.
    SetBack {
        /// Nanoseconds.
        ns: u64,
    },
    /// `sweep()`.
    Sweep,
    /// `peek(key)`.
    Peek {
        /// The key (taken modulo [`Params::keys`]).
        key: u16,
    },
    /// `reserve_n_with(key, n, quota)`: a quota of the call's own, one of
    /// [`quotas`] (`quota` modulo their number).
    ReserveWith {
        /// The key (taken modulo [`Params::keys`]).
        key: u16,
        /// Tokens asked for.
        n: u64,
        /// Which quota.
        quota: u8,
    },
    /// `set_quota(quota)`: replaces the default quota.
    SetQuota {
        /// Which quota (modulo their number).
        quota: u8,
    },
    /// `hold_n(key, n)` (`Pace::hold`): tokens held apart until resolved.
    Hold {
        /// The key (taken modulo [`Params::keys`]).
        key: u16,
        /// Tokens asked for.
        n: u64,
    },
    /// Keep (`keep`) or refund one of the holds still out (`pick` modulo
    /// their number).
    Resolve {
        /// Which hold.
        pick: usize,
        /// Keep it (settle) rather than refund it.
        keep: bool,
    },
    /// A turn (`acquire_n`'s reservation, no sleep): `n` tokens under the
    /// default quota in a slot up to `wait` ns ahead.
    Turn {
        /// The key (taken modulo [`Params::keys`]).
        key: u16,
        /// Tokens asked for.
        n: u64,
        /// The most it may wait, ns.
        wait: u64,
    },
}

/// The quotas a run's `ReserveWith` and `SetQuota` choose from, as
/// `(interval, capacity)`: the run's own first, then a slower, larger one
/// and a faster one.
pub fn quotas(p: &Params) -> [(u64, u64); 3] {
    [
        (p.interval, p.capacity),
        (p.interval * 3, p.capacity + 1),
        (p.interval / 2 + 1, p.capacity * 2),
    ]
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Admitted,
    Wait(u128),
    /// Denied while tokens are held: the wait if they were kept.
    Held(u128),
    Never,
}

/// Debt model. A key's state is `full_at`: the instant its settled debt
/// reaches zero, and `held`: the cost (ns) of its holds not yet resolved,
/// which counts as debt at every decision. An absent key starts from its
/// stripe's floor: the latest `full_at` of any row removed from the keys
/// that share the stripe (`Pace::floor_stripe`). A row with anything held
/// is never removed.
struct Model {
    /// The default quota.
    interval: i128,
    capacity: i128,
    horizon: i128,
    full_at: HashMap<u16, i128>,
    held: HashMap<u16, i128>,
    /// Stripe of each key, as the limiter reports it.
    stripe: Vec<usize>,
    floor: HashMap<usize, i128>,
    due: i128,
    mark: usize,
}

impl Model {
    fn tau(&self) -> i128 {
        self.interval * self.capacity
    }

    fn floor_of(&self, key: u16) -> i128 {
        self.floor
            .get(&self.stripe[key as usize])
            .copied()
            .unwrap_or(0)
    }

    /// Where the key's debt ends: its row's, or its stripe's floor.
    fn state(&self, key: u16) -> i128 {
        self.full_at
            .get(&key)
            .copied()
            .unwrap_or_else(|| self.floor_of(key))
    }

    fn held_of(&self, key: u16) -> i128 {
        self.held.get(&key).copied().unwrap_or(0)
    }

    fn debt(&self, key: u16, now: i128) -> i128 {
        self.state(key).max(now) + self.held_of(key) - now
    }

    /// The decision on `need` ns of tokens under horizon `tau` (the call's
    /// quota `interval × capacity`) for a call that may wait `wait` ns,
    /// README's rules: held tokens count as debited at the call's reading;
    /// a call is admitted when its debit fits within `wait`, and, beside
    /// held tokens, only when it fits the bucket with them (`held + need ≤
    /// tau`: else it fits at no instant while they are held). A denial
    /// while tokens are held is `Held`, with the wait until the debit fits
    /// if every held token were kept at the call's reading, else `Wait`
    /// with the exact wait.
    fn decide(&self, key: u16, need: i128, tau: i128, now: i128, wait: i128) -> Option<Outcome> {
        let held = self.held_of(key);
        let room = tau - self.debt(key, now);
        if need <= room + wait && held + need <= tau {
            return None;
        }
        if held == 0 {
            return Some(Outcome::Wait((need - room - wait) as u128));
        }
        let kept = self.state(key).max(now) + held;
        Some(Outcome::Held(
            (kept.max(now) + need - now - tau).max(0) as u128
        ))
    }

    fn remove(&mut self, key: u16, last: i128) {
        self.full_at.remove(&key);
        let f = self.floor.entry(self.stripe[key as usize]).or_insert(0);
        *f = (*f).max(last);
    }

    /// Returns the outcome and, when admitted, the end of this debit and the
    /// state it replaced, and whether it created the key's row (`None` when
    /// the call never reaches the table). `quota` is
    /// the call's `(interval, capacity)`, else the default's; a debit is
    /// admitted when it fits within `wait` ns. The sweep policy that follows
    /// the call is [`after_call`](Model::after_call).
    fn reserve(
        &mut self,
        key: u16,
        n: u64,
        now: i128,
        quota: Option<(u64, u64)>,
        wait: u64,
    ) -> (Outcome, i128, i128, Option<bool>) {
        let (interval, capacity) = match quota {
            Some((i, c)) => (i as i128, c as i128),
            None => (self.interval, self.capacity),
        };
        let n = n as i128;
        // Neither reaches the table, nor runs the sweep policy.
        if n == 0 {
            return (Outcome::Admitted, 0, 0, None);
        }
        if n > capacity {
            return (Outcome::Never, 0, 0, None);
        }
        let need = n * interval;
        let created = !self.full_at.contains_key(&key);
        let result = match self.decide(key, need, interval * capacity, now, wait as i128) {
            None => {
                // The debit starts where the previous debt ends (or now) and
                // time stored in the row never moves back.
                let prev = self.state(key);
                let start = prev.max(now);
                self.full_at.insert(key, start + need);
                (Outcome::Admitted, start + need, prev)
            }
            // A turn's denial names its whole wait.
            Some(Outcome::Wait(w)) => (Outcome::Wait(w + u128::from(wait)), 0, 0),
            Some(denied) => (denied, 0, 0),
        };
        let created = created && result.0 == Outcome::Admitted;
        // A call under a quota with a shorter horizon than the default's
        // brings the next pass forward to one such horizon from now.
        let tau = interval * capacity;
        if quota.is_some() && tau < self.horizon {
            self.due = self.due.min(now + tau.max(MIN_HORIZON));
        }
        (result.0, result.1, result.2, Some(created))
    }

    /// After a call that may copy a chunk of a migration: the rows its own
    /// share's copies removed instead of copying (`removed` of them, each
    /// full at `now`), then, for a reserve or a hold, the sweep policy,
    /// which the limiter runs after that copy (`created`: whether it
    /// created the key's row), on the rows left by it. Every row the table
    /// lacks must be full at `now` with nothing held. Without a pass they
    /// are exactly the `removed` rows the copies took; with one, the pass
    /// removes every row full at `now`, theirs included, so the model
    /// sweeps.
    fn after_call(
        &mut self,
        pace: &Pace<u16, RandomState, ManualClock>,
        now: i128,
        removed: usize,
        created: Option<bool>,
    ) -> Result<(), String> {
        // (Nothing removed: the `len()` check after the step finds a row
        // the table lacks.)
        let gone: Vec<(u16, i128)> = if removed > 0 {
            let table: std::collections::HashSet<u16> = pace.row_keys().into_iter().collect();
            self.full_at
                .iter()
                .filter(|(k, _)| !table.contains(k))
                .map(|(&k, &f)| (k, f))
                .collect()
        } else {
            Vec::new()
        };
        for &(key, last) in &gone {
            if last > now || self.held_of(key) > 0 {
                return Err(format!(
                    "key {key}'s row is gone, full only at {last} (now {now}, held {})",
                    self.held_of(key)
                ));
            }
        }
        let pass = match created {
            Some(created) => self.pass_due(now, created, self.full_at.len() - removed),
            None => false,
        };
        if pass {
            self.sweep(now);
            return Ok(());
        }
        if gone.len() != removed {
            return Err(format!(
                "a migration removed {removed} rows, the table lacks {gone:?}"
            ));
        }
        for (key, last) in gone {
            self.remove(key, last);
        }
        Ok(())
    }

    /// The sweep policy of the README, deciding whether a pass runs: when
    /// the horizon has passed (or the clock went back by more than a
    /// horizon; the next one is then due a horizon from now), or when a row
    /// was created and the row count (`rows`) doubled since the last pass.
    fn pass_due(&mut self, now: i128, created: bool, rows: usize) -> bool {
        if now >= self.due || self.due - now > self.horizon {
            self.due = now + self.horizon;
            true
        } else {
            created && rows >= 2 * self.mark.max(SWEEP_FLOOR)
        }
    }

    /// A hold of `n` tokens under the default quota: the outcome and, when
    /// admitted, its cost, and whether it created the key's row (`None`
    /// when the call never reaches the table). The sweep policy that
    /// follows the call is [`after_call`](Model::after_call).
    fn hold(&mut self, key: u16, n: u64, now: i128) -> (Outcome, i128, Option<bool>) {
        let n = n as i128;
        if n == 0 {
            return (Outcome::Admitted, 0, None);
        }
        if n > self.capacity {
            return (Outcome::Never, 0, None);
        }
        let need = n * self.interval;
        let created = !self.full_at.contains_key(&key);
        let result = match self.decide(key, need, self.tau(), now, 0) {
            None => {
                let state = self.state(key);
                self.full_at.insert(key, state);
                *self.held.entry(key).or_insert(0) += need;
                (Outcome::Admitted, need)
            }
            Some(denied) => (denied, 0),
        };
        let created = created && result.0 == Outcome::Admitted;
        (result.0, result.1, Some(created))
    }

    /// Resolves a hold of `cost` read at `at`, acting at `now`: its tokens
    /// leave the held amount, and when kept are settled from its reading. A
    /// row left with nothing held and a full bucket at `now` is removed. (A
    /// `Hold` resolves at its own reading: `now` is `at`.)
    fn resolve(&mut self, key: u16, cost: i128, at: i128, keep: bool, now: i128) {
        if cost == 0 {
            return;
        }
        let h = self.held.get_mut(&key).expect("a held row stays");
        *h -= cost;
        let left = *h;
        if left == 0 {
            self.held.remove(&key);
        }
        let f = self.full_at.get_mut(&key).expect("a held row stays");
        if keep {
            *f = (*f).max(at) + cost;
        }
        let f = *f;
        if left == 0 && f <= now {
            self.remove(key, f);
        }
    }

    fn sweep(&mut self, now: i128) -> usize {
        let full: Vec<(u16, i128)> = self
            .full_at
            .iter()
            .filter(|(k, &f)| f <= now && self.held_of(**k) == 0)
            .map(|(&k, &f)| (k, f))
            .collect();
        for &(key, last) in &full {
            self.remove(key, last);
        }
        self.mark = self.full_at.len();
        full.len()
    }

    /// README's refund rule: a refund restores the state before its debit if
    /// the key's debt still ends where that debit left it, else nothing.
    fn refund(&mut self, key: u16, n: u64, own_end: i128, prev: i128, now: i128) {
        let Some(&full_at) = self.full_at.get(&key) else {
            return; // swept: a refund creates nothing
        };
        if n == 0 || full_at != own_end {
            return;
        }
        if prev <= now && self.held_of(key) == 0 {
            self.remove(key, prev);
        } else {
            self.full_at.insert(key, prev);
        }
    }

    fn peek(&self, key: u16, now: i128) -> u64 {
        let room = self.tau() - self.debt(key, now);
        (room.max(0) / self.interval) as u64
    }

    fn set_quota(&mut self, (interval, capacity): (u64, u64)) {
        self.interval = interval as i128;
        self.capacity = capacity as i128;
        self.horizon = self.tau().max(MIN_HORIZON);
    }
}

/// Whether a decision of `Pace` is the model's: admitted, or denied with
/// the same reason and the exact same wait.
fn agrees<T>(got: &Result<T, pace::Denied>, expect: &Outcome) -> bool {
    match (got, expect) {
        (Ok(_), Outcome::Admitted) => true,
        (Err(d), Outcome::Wait(ns)) => {
            d.reason() == DenyReason::Exhausted && d.retry_after().as_nanos() == *ns
        }
        (Err(d), Outcome::Held(ns)) => {
            d.reason() == DenyReason::Held && d.retry_after().as_nanos() == *ns
        }
        (Err(d), Outcome::Never) => d.reason() == DenyReason::ExceedsCapacity,
        _ => false,
    }
}

/// A limiter's shape and table size for one run.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Nanoseconds per token.
    pub interval: u64,
    /// Bucket capacity in tokens.
    pub capacity: u64,
    /// The table's initial slot count.
    pub min_slots: usize,
    /// Keys are drawn from `0..keys`.
    pub keys: u16,
}

/// Runs `ops` on a real `Pace` (ManualClock) and on the model, step by step:
/// every decision, `retry_after`, peek, sweep count and `len()` must agree,
/// and so must the set of rows at the end.
pub fn check(p: Params, ops: &[Op]) -> Result<(), String> {
    let clock = ManualClock::new();
    let rate = Rate::new(1, Duration::from_nanos(p.interval)).map_err(|e| e.to_string())?;
    let pace: Pace<u16, RandomState, ManualClock> = Pace::builder(rate)
        .capacity(p.capacity)
        .min_slots(p.min_slots)
        .clock(clock.clone())
        // No lot expires within a run: the model has no hold limit.
        .hold_limit(Duration::MAX)
        .build()
        .map_err(|e| e.to_string())?;
    // Passes remove every full row (what this model predicts), or put every
    // one to sleep (the same to a caller; half the runs, by the interval's
    // parity). Left to itself, a table whose clients come back keeps its
    // quiet full rows as rows, which `len()` then counts.
    if p.interval.is_multiple_of(2) {
        pace.force_dormancy();
    } else {
        pace.force_removal();
    }
    let tau = (p.interval * p.capacity) as i128;
    let mut model = Model {
        interval: p.interval as i128,
        capacity: p.capacity as i128,
        horizon: tau.max(MIN_HORIZON),
        full_at: HashMap::new(),
        held: HashMap::new(),
        stripe: (0..p.keys).map(|k| pace.floor_stripe(&k)).collect(),
        floor: HashMap::new(),
        due: tau.max(MIN_HORIZON),
        mark: 0,
    };
    let names: Vec<u16> = (0..p.keys).collect();
    let quota_set = quotas(&p);
    let mut quota_values = Vec::new();
    for (i, c) in quota_set {
        let rate = Rate::new(1, Duration::from_nanos(i)).map_err(|e| e.to_string())?;
        quota_values.push(Quota::new(rate, c).map_err(|e| e.to_string())?);
    }
    let mut held = Vec::new();
    let mut holds = Vec::new();
    let mut now: u64 = 0;
    for (step, op) in ops.iter().enumerate() {
        let fail = |what: String| Err(format!("step {step} ({op:?}): {what}"));
        let removed_before = pace.copy_removed();
        // For a reserve or a hold: whether it created the key's row (the
        // sweep policy runs after the call's own copy, `Model::after_call`).
        let mut created = None;
        // The reading the call's copy removes rows at: the clock's, but a
        // hold's resolution acts at the hold's own reading, which may be
        // later than the clock's now (set back since).
        let mut reading = now as i128;
        match *op {
            Op::Reserve { key, n } | Op::Check { key, n } => {
                let key = key % p.keys;
                let (expect, end, prev, made) = model.reserve(key, n, now as i128, None, 0);
                created = made;
                let name = &names[key as usize];
                // A check keeps its debit at once: nothing to refund later.
                let got = match op {
                    Op::Check { .. } => pace.check_key_n(name, n).map(|()| None),
                    _ => pace.reserve_n(name, n).map(Some),
                };
                if !agrees(&got, &expect) {
                    return fail(format!("got {got:?}, model {expect:?}"));
                }
                if let Ok(Some(r)) = got {
                    held.push((r, key, n, end, prev));
                }
            }
            Op::Refund { pick } => {
                if !held.is_empty() {
                    let (r, key, n, end, prev) = held.swap_remove(pick % held.len());
                    model.refund(key, n, end, prev, now as i128);
                    r.refund();
                }
            }
            Op::Hold { key, n } => {
                let key = key % p.keys;
                let (expect, cost, made) = model.hold(key, n, now as i128);
                created = made;
                let got = pace.hold_n(&names[key as usize], n);
                if !agrees(&got, &expect) {
                    return fail(format!("got {got:?}, model {expect:?}"));
                }
                if let Ok(h) = got {
                    holds.push((h, key, cost, now as i128));
                }
            }
            Op::Resolve { pick, keep } => {
                if !holds.is_empty() {
                    let (h, key, cost, at) = holds.swap_remove(pick % holds.len());
                    model.resolve(key, cost, at, keep, at);
                    reading = at;
                    let tokens = h.tokens();
                    let done = if keep {
                        h.keep()
                    } else {
                        h.refund().returned()
                    };
                    if done != (tokens > 0) {
                        return fail(format!("a resolution of {tokens} tokens answered {done}"));
                    }
                }
            }
            Op::Advance { ns } => {
                now = now.saturating_add(ns);
                clock.set(Duration::from_nanos(now));
            }
            Op::SetBack { ns } => {
                now = now.saturating_sub(ns);
                clock.set(Duration::from_nanos(now));
            }
            Op::Sweep => {
                let (got, expect) = (pace.sweep(), model.sweep(now as i128));
                if got != expect {
                    return fail(format!("swept {got}, model {expect}"));
                }
            }
            Op::ReserveWith { key, n, quota } => {
                let key = key % p.keys;
                let q = usize::from(quota) % quota_set.len();
                let (expect, end, prev, made) =
                    model.reserve(key, n, now as i128, Some(quota_set[q]), 0);
                created = made;
                let got = pace.reserve_n_with(&names[key as usize], n, quota_values[q]);
                if !agrees(&got, &expect) {
                    return fail(format!("got {got:?}, model {expect:?}"));
                }
                if let Ok(r) = got {
                    held.push((r, key, n, end, prev));
                }
            }
            Op::SetQuota { quota } => {
                let q = usize::from(quota) % quota_set.len();
                model.set_quota(quota_set[q]);
                pace.set_quota(quota_values[q]);
            }
            Op::Turn { key, n, wait } => {
                let key = key % p.keys;
                let tau = model.tau();
                // Held tokens count as debited at the decision: the turn's
                // debit fits behind them.
                let held_ns = model.held_of(key);
                let (expect, end, prev, made) = model.reserve(key, n, now as i128, None, wait);
                created = made;
                let got = pace.reserve_turn_at(&names[key as usize], n, None, wait, now);
                if !agrees(&got, &expect) {
                    return fail(format!("got {got:?}, model {expect:?}"));
                }
                if let Ok((_, slot)) = &got {
                    let want = if n == 0 {
                        0
                    } else {
                        (end + held_ns - tau).max(0)
                    };
                    if *slot as i128 != want {
                        return fail(format!("slot {slot}, model {want}"));
                    }
                }
                if let Ok((r, _)) = got {
                    held.push((r, key, n, end, prev));
                }
            }
            Op::Peek { key } => {
                let key = key % p.keys;
                let (got, expect) = (
                    pace.peek(&names[key as usize]),
                    model.peek(key, now as i128),
                );
                if got != expect {
                    return fail(format!("peek {got}, model {expect}"));
                }
            }
        }
        // A sweep counts the rows its migration copies removed (all full,
        // as the model's sweep removes them); after any other call, the
        // rows its copy removed are taken from the model.
        if !matches!(op, Op::Sweep) {
            let removed = pace.copy_removed() - removed_before;
            if let Err(e) = model.after_call(&pace, reading, removed, created) {
                return fail(e);
            }
        }
        if pace.len() != model.full_at.len() {
            return fail(format!("len {}, model {}", pace.len(), model.full_at.len()));
        }
    }
    let mut rows = pace.row_keys();
    rows.sort_unstable();
    let mut expect: Vec<u16> = model.full_at.keys().copied().collect();
    expect.sort_unstable();
    if rows != expect {
        return Err(format!("rows {rows:?}, model {expect:?}"));
    }
    Ok(())
}

/// Decodes fuzzer bytes: 6 bytes of parameters, then 4 bytes per op (every
/// kind of [`Op`]: turns, per-call quotas and quota changes beside holds).
pub fn decode(data: &[u8], big_tables: bool) -> Option<(Params, Vec<Op>)> {
    if data.len() < 6 {
        return None;
    }
    let interval = 1_000 + u64::from(u16::from_le_bytes([data[0], data[1]])) * 30;
    let capacity = if big_tables {
        1
    } else {
        1 + u64::from(data[2] % 6)
    };
    let min_slots = if data[3] & 1 == 0 { 4 } else { 64 };
    let keys = if big_tables {
        1 + u16::from_le_bytes([data[4], data[5]]) % 2_000
    } else {
        [3, 12, 300][usize::from(data[4] % 3)]
    };
    let tau = interval * capacity;
    let ops = data[6..]
        .chunks_exact(4)
        .map(|c| {
            let arg = u16::from_le_bytes([c[1], c[2]]);
            let frac = |range: u64| range * u64::from(arg) / u64::from(u16::MAX);
            match c[0] % 24 {
                20 | 21 => Op::Turn {
                    key: arg,
                    n: u64::from(c[3] & 0x0f) % (capacity + 2),
                    wait: u64::from(c[3] >> 4) * tau / 8,
                },
                22 => Op::ReserveWith {
                    key: arg,
                    n: u64::from(c[3] & 0x0f) % (2 * capacity + 2),
                    quota: c[3] >> 4,
                },
                23 => Op::SetQuota { quota: c[3] },
                16 | 17 => Op::Hold {
                    key: arg,
                    n: u64::from(c[3]) % (capacity + 2),
                },
                18 | 19 => Op::Resolve {
                    pick: usize::from(arg),
                    keep: c[3] & 1 == 1,
                },
                0..=5 => Op::Reserve { key: arg, n: 1 },
                6 | 7 => Op::Reserve {
                    key: arg,
                    n: u64::from(c[3]) % (capacity + 2),
                },
                8..=10 => Op::Refund {
                    pick: usize::from(arg),
                },
                11 | 12 => Op::Advance { ns: frac(2 * tau) },
                13 => Op::SetBack { ns: frac(tau) },
                14 => Op::Sweep,
                _ if c[3] & 1 == 1 => Op::Check {
                    key: arg,
                    n: u64::from(c[3] >> 1) % (capacity + 2),
                },
                _ => Op::Peek { key: arg },
            }
        })
        .collect();
    Some((
        Params {
            interval,
            capacity,
            min_slots,
            keys,
        },
        ops,
    ))
}
