//! The rule: every decision of the limiter on a row, as pure functions of
//! plain values (no atomics, no clock, no allocation). The table and the
//! limiter only read a row, call these, and publish what they answer with
//! one CAS; they add no arithmetic of their own.
//!
//! Each function here is the rule's one Rust encoding. pace-redis's script
//! (`pace-redis/src/pace.lua`) is its port: every function names its
//! counterpart there ("Script:"), and the script tags the step that computes
//! it with `-- rule: <fn>`; `pace-redis/tests/equivalence.rs` checks that
//! the two agree (DESIGN.md, "Where each rule lives").
//!
//! Known-wrong variants of a rule are written beside it, at the top of its
//! function (`wrong!`), so a rule reads in one place.
//!
//! Units: times and costs in ns; a row's state is its settled `tat` and
//! `held`, the ns of refill its unresolved holds take (DESIGN.md, glossary).

use crate::bucket::{Decision, Limits, Refund, MAX_TIME};

/// A known-wrong variant of a rule, at the top of the rule's function, beside
/// the right body it replaces: `wrong!(pace_mutant = "name" => expr)`
/// returns `expr` from the function when the build's `pace_mutant` is
/// `name` (`src/mutants.rs`). The condition is a `cfg!` constant, folded
/// away in every build: no rule branches on a mutant at run time, and the
/// wrong body type-checks in every build. (The right body stays a plain
/// function body, so that `cargo mutants` mutates it; it does not look
/// inside macro calls, where the wrong bodies are.)
macro_rules! wrong {
    (pace_mutant = $m:tt => $wrong:expr) => {
        if cfg!(pace_mutant = $m) {
            return $wrong;
        }
    };
}

impl Limits {
    /// Debit `n` tokens from the bucket `tat` at `now`, or say why not:
    /// the GCRA test, [`gcra`]. (Here, not in `bucket.rs`, so that the
    /// bucket's shape imports no rule.)
    #[inline]
    pub(crate) fn reserve(&self, tat: u64, now: u64, n: u64) -> Decision {
        gcra(self, tat, now, n)
    }

    /// Undoes a reservation whose debit moved the bucket from `prev` to
    /// `own_tat`, onto a bucket now at `tat`: [`refund`].
    #[inline]
    pub(crate) fn refund(&self, tat: u64, now: u64, n: u64, own_tat: u64, prev: u64) -> Refund {
        refund(self, tat, now, n, own_tat, prev)
    }
}

/// The GCRA test: a debit of `n` tokens from a bucket settled at `tat`, at
/// the reading `now`. Admitted iff the debt after it is at most `τ`
/// (`max(tat, now) + n·T ≤ now + τ`); the new `tat` is
/// `max(tat, now) + n·T`, never behind `tat` whatever `now` says. Denied
/// with the exact wait, `Never` above the capacity, `TimeExhausted` only
/// when an admission cannot be stored.
///
/// Script: `gcra` (the fast branch and the general branch's decision).
#[inline(always)]
pub(crate) fn gcra(limits: &Limits, tat: u64, now: u64, n: u64) -> Decision {
    if n > limits.capacity() {
        return Decision::Never;
    }
    let base = tat.max(now);
    // n <= capacity, so n * interval <= tau <= MAX_TAU: no overflow;
    // `base` comes from the clock and may be anything.
    let cost = n * limits.interval();
    let new = match base.checked_add(cost) {
        Some(t) if t <= MAX_TIME => t,
        _ => return gcra_past_time(limits, base, now, cost),
    };
    // Admit iff new - now <= tau; compare without underflow.
    let limit = now.saturating_add(limits.tau());
    if new <= limit {
        Decision::Admit(new)
    } else {
        Decision::Wait(new - limit)
    }
}

/// A debit of `cost` from `base` that would end past the time space: a
/// denial with its wait when it does not fit the bucket anyway (a long
/// interval's debt can reach past `MAX_TIME` at any reading), and
/// `TimeExhausted` only when it would be admitted but its end cannot be
/// stored, which takes a reading past `MAX_TIME − τ` (at least
/// `MAX_TIME − MAX_TAU`, about 36 years of nanoseconds).
///
/// Script: none (its times stay below 2^53 by the client's checks).
#[cold]
fn gcra_past_time(limits: &Limits, base: u64, now: u64, cost: u64) -> Decision {
    let new = u128::from(base) + u128::from(cost);
    let limit = u128::from(now) + u128::from(limits.tau());
    if new > limit {
        Decision::Wait(u64::try_from(new - limit).unwrap_or(u64::MAX))
    } else {
        Decision::TimeExhausted
    }
}

/// A plain refund's bound: undoes a reservation whose debit moved the
/// bucket from `prev` to `own_tat`, onto a bucket now at `tat`.
/// Restores `prev` iff the bucket still ends where the reservation left
/// it (`tat == own_tat`: nothing was debited since), else returns
/// nothing. Restoring `prev` is exactly the state in which the
/// reservation never happened, so it cannot mint a token whatever the
/// refund's clock says. When `prev` is not later than `now` the restored
/// bucket is full: the row may be removed.
///
/// Script: `refund` (op `'f'`).
#[inline]
pub(crate) fn refund(
    limits: &Limits,
    tat: u64,
    now: u64,
    n: u64,
    own_tat: u64,
    prev: u64,
) -> Refund {
    // Subtracts the undrained part of the reservation,
    // `min(n·T, own_tat − now)`, from whatever the bucket holds now, so
    // out-of-order and stale refunds mint tokens.
    wrong!(pace_mutant = "refund_undrained" => {
        if tat <= now {
            return Refund::Unchanged;
        }
        let back = n
            .min(limits.capacity())
            .saturating_mul(limits.interval())
            .min(own_tat.saturating_sub(now));
        if back == 0 {
            return Refund::Unchanged;
        }
        let new = tat - back.min(tat);
        if new <= now {
            Refund::Full
        } else {
            Refund::Set(new)
        }
    });
    if tat != own_tat {
        Refund::Unchanged
    } else if prev <= now {
        Refund::Full
    } else {
        Refund::Set(prev)
    }
}

/// Whether a debit of `n` tokens fits the bucket beside `held` ns of held
/// tokens: `held + n·T ≤ C·T`. A plain decision that admits implies it;
/// a turn (whose horizon is stretched by its wait) needs it, or no
/// instant while the tokens are held is one where its debit fits
/// (`n ≤ C` is checked before).
///
/// Script: `fits_beside`.
#[inline]
pub(crate) fn fits_beside(held: u64, limits: &Limits, n: u64) -> bool {
    // A turn is placed after held tokens that leave no room for it in
    // the bucket.
    wrong!(pace_mutant = "turn_beside_too_many_held" => true);
    held == 0 || held <= (limits.capacity() - n) * limits.interval()
}

/// The held tokens a decision counts, of `held`: all of them.
///
/// Script: `decide` (its `held`).
#[inline]
pub(crate) fn counted(held: u64) -> u64 {
    // A decision counts no held token.
    wrong!(pace_mutant = "decision_ignores_held" => 0);
    held
}

/// The decision on `n` more tokens at `now` beside `held` ns of held
/// tokens, all counted: admitted iff `max(tat, now) + held + n·T ≤ now + τ`
/// and [`fits_beside`]. `Ok` carries the settled `tat` a debit of them
/// leaves, `max(tat, now) + n·T`; `Err` the bucket's own answer.
///
/// Script: `decide` (the test `nd + held > tau + wait`).
#[inline(always)]
pub(crate) fn decide_beside(
    tat: u64,
    held: u64,
    limits: &Limits,
    now: u64,
    n: u64,
) -> Result<u64, Decision> {
    // A reading may be anything: saturate (past MAX_TIME every decision is
    // `TimeExhausted`).
    let base = tat.max(now).saturating_add(held);
    match gcra(limits, base, now, n) {
        Decision::Admit(t) if fits_beside(held, limits, n) => Ok(t - held),
        d => Err(d),
    }
}

/// The decision on `n` more tokens at `now` of a row settled at `tat` with
/// `held` ns held ([`decide_beside`] of the held tokens it counts, all of
/// them): the second condition, [`fits_beside`], follows from the first
/// unless `limits` wait for a turn, whose `τ` is stretched (a turn beside
/// held tokens must be a decision of the bucket at its slot, DESIGN.md §3).
/// A denial while tokens are held is [`Decision::Held`] with [`held_wait`].
///
/// Script: `decide` (its denial `'6 …'`).
#[inline]
pub(crate) fn decide(
    tat: u64,
    held: u64,
    limits: &Limits,
    now: u64,
    n: u64,
) -> Result<u64, Decision> {
    let counted = counted(held);
    match decide_beside(tat, counted, limits, now, n) {
        Ok(t) => Ok(t),
        Err(Decision::Admit(_) | Decision::Wait(_)) if counted > 0 => {
            Err(Decision::Held(held_wait(tat, held, limits, now, n)))
        }
        Err(d) => Err(d),
    }
}

/// A denial's wait while tokens are held: until `n` tokens would fit the
/// bucket (its own horizon `C·T`, not a turn's stretched one) if every held
/// token were kept at this reading. Refunded sooner, the tokens come back
/// sooner; still held then, they are still in the way.
///
/// Script: `held_wait` (reply `'6 wait …'`).
#[cold]
pub(crate) fn held_wait(tat: u64, held: u64, limits: &Limits, now: u64, n: u64) -> u64 {
    let kept = tat.max(now).saturating_add(held);
    let tau = limits.capacity() * limits.interval();
    let end = kept.saturating_add(n * limits.interval());
    end.saturating_sub(now.saturating_add(tau))
}

/// A kept debit of `cost` decided at reading `at`, settled onto `tat`:
/// `max(tat, at) + cost`, how a kept hold and an expired lot settle. At
/// the end of the time space it stays at `MAX_TIME`, where every
/// decision is `TimeExhausted` (so a settled `tat` is never read as a
/// record).
///
/// Script: `settle` (a keep, op `'k'`, and an expired hold).
#[inline(always)]
pub(crate) fn settle(tat: u64, at: u64, cost: u64) -> u64 {
    // A kept hold is added to the settled `tat` without the clamp at its
    // own reading, so a hold kept after its bucket refilled is settled in
    // the past.
    wrong!(pace_mutant = "settle_unclamped" => (tat + cost).min(MAX_TIME));
    tat.max(at).saturating_add(cost).min(MAX_TIME)
}

/// The settled `tat` after a refund of `cost` held: unchanged (a refund
/// only takes its tokens off what is held).
///
/// Script: `refunded` (a release, op `'x'`).
#[inline]
pub(crate) fn refunded(tat: u64, cost: u64) -> u64 {
    // A refund also takes its cost off the settled `tat`, returning tokens
    // that other debits settled.
    wrong!(pace_mutant = "refund_rewinds_tat" => tat.saturating_sub(cost));
    tat
}

/// The turn's slot: when a debit settled at `tat` beside `held` ns of
/// held tokens fits a bucket of horizon `tau`, the instant a turn of
/// `wait` at most is let through (`Pace::acquire`). Held tokens count
/// as debited at every decision, so the slot lies behind them:
/// `tat + held − τ` (DESIGN.md §3, "Turns beside holds").
///
/// Script: `slot_of` (its wait, in the reply).
#[inline]
pub(crate) fn slot_of(tat: u64, held: u64, tau: u64, wait: u64) -> u64 {
    // A turn is let through as soon as it was decided, up to its whole wait
    // before its debit fits.
    wrong!(pace_mutant = "turn_before_its_slot" => {
        tat.saturating_add(held)
            .saturating_sub(tau)
            .saturating_sub(wait)
    });
    // A turn's slot comes from the settled `tat` alone, ahead of the held
    // tokens its decision counted.
    wrong!(pace_mutant = "turn_slot_ignores_held" => tat.saturating_sub(tau));
    tat.saturating_add(held).saturating_sub(tau)
}
