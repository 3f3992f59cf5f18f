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

/// Each rule against an integer model written from its contract (the
/// bucket as a level of refill, in `u128`: no saturation, no shortcut of
/// the code's), over every small bucket, reading, `tat`, held amount and
/// cost, and at the end of the time space. `cargo mutants -f src/rule.rs`
/// runs these (docs/testing.md, "Mutation testing").
#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::MAX_TAU;

    /// The model's bucket: `c` tokens of `t` ns, its horizon `tau` (`c·t`,
    /// more for a turn's waiting limits).
    #[derive(Clone, Copy, Debug)]
    struct M {
        t: u128,
        c: u128,
        tau: u128,
    }

    impl M {
        fn of(l: &Limits) -> M {
            M {
                t: l.interval().into(),
                c: l.capacity().into(),
                tau: l.tau().into(),
            }
        }

        /// The refill a bucket settled at `tat` holds at `now`, in ns: `τ`
        /// when full, less its debt `tat − now`; below zero when the debt
        /// is beyond `τ` (a clock read behind the last debit).
        fn level(&self, tat: u64, now: u64) -> i128 {
            let debt = i128::from(tat) - i128::from(now);
            self.tau as i128 - debt.max(0)
        }

        /// A debit of `n` tokens: admitted iff the level covers `n·T`;
        /// then the bucket's debt is `τ − level + n·T` past `now`.
        fn gcra(&self, tat: u64, now: u64, n: u64) -> Decision {
            let n = u128::from(n);
            if n > self.c {
                return Decision::Never;
            }
            let (level, need) = (self.level(tat, now), (n * self.t) as i128);
            if level < need {
                return Decision::Wait((need - level) as u64);
            }
            let new = u128::from(now) + (self.tau as i128 - level + need) as u128;
            if new > u128::from(MAX_TIME) {
                Decision::TimeExhausted
            } else {
                Decision::Admit(new as u64)
            }
        }

        /// A decision beside `held` ns of held tokens, which count as
        /// debited: admitted iff the level less `held` covers `n·T` and
        /// `held + n·T` fits the bucket's own `C·T`; denied while tokens are
        /// held with the wait until `n` tokens fit `C·T` were they all kept.
        fn decide(&self, tat: u64, held: u64, now: u64, n: u64) -> Result<u64, Decision> {
            let (h, nn) = (u128::from(held), u128::from(n));
            if held == 0 {
                return match self.gcra(tat, now, n) {
                    Decision::Admit(t) => Ok(t),
                    d => Err(d),
                };
            }
            if nn > self.c {
                return Err(Decision::Never);
            }
            let need = (nn * self.t) as i128;
            let level = self.level(tat, now) - h as i128;
            let settled = u128::from(tat.max(now)) + nn * self.t;
            if level >= need && settled + h > u128::from(MAX_TIME) {
                return Err(Decision::TimeExhausted);
            }
            if level >= need && h + nn * self.t <= self.c * self.t {
                return Ok(settled as u64);
            }
            let own = u128::from(now) + self.c * self.t;
            Err(Decision::Held((settled + h).saturating_sub(own) as u64))
        }
    }

    /// Every bucket of 1, 2 and 4 tokens of 1, 3 and 7 ns, with the turn
    /// horizons of waits 0, 5 and 30 ns.
    fn buckets() -> impl Iterator<Item = (Limits, u64)> {
        [1u64, 3, 7].into_iter().flat_map(|t| {
            [1u64, 2, 4].into_iter().flat_map(move |c| {
                [0u64, 5, 30].map(move |w| (Limits::new(t, c).unwrap().waiting(w), w))
            })
        })
    }

    /// Readings and `tat`s near `base`, over more than a horizon either
    /// side of it.
    fn near(base: u64) -> impl Iterator<Item = u64> + Clone {
        (0..=70u64).map(move |d| base - 35 + d)
    }

    #[test]
    #[cfg_attr(miri, ignore)] // exhaustive integer loops, no unsafe: far too slow under Miri
    fn gcra_admits_exactly_what_the_level_covers_and_waits_exactly_for_the_rest() {
        let mut checked = 0u64;
        for (l, w) in buckets() {
            if w != 0 {
                continue;
            }
            let m = M::of(&l);
            // Small times, and a reading whose admission ends at or past
            // MAX_TIME (the end of the time space).
            for base in [35, MAX_TIME - 40, MAX_TIME] {
                for now in near(base) {
                    for tat in near(base).chain([0]) {
                        for n in 0..=l.capacity() + 1 {
                            let want = m.gcra(tat, now, n);
                            assert_eq!(
                                gcra(&l, tat, now, n),
                                want,
                                "{l:?} tat {tat} now {now} n {n}"
                            );
                            assert_eq!(l.reserve(tat, now, n), want);
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 100_000, "{checked}");
    }

    #[test]
    #[cfg_attr(miri, ignore)] // exhaustive integer loops, no unsafe: far too slow under Miri
    fn a_debit_past_the_time_space_waits_when_it_does_not_fit_and_is_time_exhausted_when_it_does() {
        // One token of the longest interval: a second debit ends past
        // MAX_TIME and waits the whole horizon (u128 arithmetic).
        let long = Limits::new(MAX_TAU, 1).unwrap();
        let m = M::of(&long);
        for (tat, now) in [
            (MAX_TAU + 5, 5),
            (MAX_TIME, MAX_TIME - 3),
            (MAX_TIME - 1, 0),
            (0, MAX_TIME - MAX_TAU + 1),
            (0, MAX_TIME),
        ] {
            assert_eq!(
                gcra(&long, tat, now, 1),
                m.gcra(tat, now, 1),
                "tat {tat} now {now}"
            );
        }
        assert_eq!(gcra(&long, MAX_TAU + 5, 5, 1), Decision::Wait(MAX_TAU));
        assert_eq!(
            gcra(&long, MAX_TIME - 1, 0, 1),
            Decision::Wait(MAX_TIME - 1)
        );
        // Admissible at a reading past MAX_TIME − τ: cannot be stored.
        assert_eq!(
            gcra(&long, 0, MAX_TIME - MAX_TAU + 1, 1),
            Decision::TimeExhausted
        );
    }

    #[test]
    #[cfg_attr(miri, ignore)] // exhaustive integer loops, no unsafe: far too slow under Miri
    fn decisions_beside_held_tokens_count_them_and_wait_for_the_bucket_s_own_horizon() {
        let mut checked = 0u64;
        for (l, _) in buckets() {
            let m = M::of(&l);
            let own = l.capacity() * l.interval();
            for base in [35, MAX_TIME - 40] {
                for now in near(base).step_by(2) {
                    for tat in near(base).chain([0]) {
                        for held in [0, 1, 2, own - 1, own, own + 3] {
                            for n in 0..=l.capacity() + 1 {
                                let want = m.decide(tat, held, now, n);
                                let got = decide(tat, held, &l, now, n);
                                assert_eq!(
                                    got, want,
                                    "{l:?} tat {tat} held {held} now {now} n {n}"
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 100_000, "{checked}");
    }

    #[test]
    #[cfg_attr(miri, ignore)] // exhaustive integer loops, no unsafe: far too slow under Miri
    fn a_turn_fits_beside_held_tokens_only_within_the_bucket() {
        for (l, _) in buckets() {
            let (t, c) = (l.interval(), l.capacity());
            for n in 0..=c {
                for held in 0..=c * t + 8 {
                    let want = u128::from(held) + u128::from(n * t) <= u128::from(c * t);
                    assert_eq!(fits_beside(held, &l, n), want, "{l:?} held {held} n {n}");
                }
            }
        }
        // With no token held, any cost up to the capacity fits.
        let l = Limits::new(5, 3).unwrap();
        assert!(fits_beside(0, &l, 3));
        assert!(!fits_beside(6, &l, 2));
        assert!(fits_beside(5, &l, 2));
    }

    #[test]
    #[cfg_attr(miri, ignore)] // exhaustive integer loops, no unsafe: far too slow under Miri
    fn a_refund_restores_the_previous_tat_only_onto_its_own_debit() {
        let l = Limits::new(7, 3).unwrap();
        for tat in 0..40 {
            for own_tat in 0..40 {
                for prev in 0..40 {
                    for now in 0..40 {
                        let want = if tat != own_tat {
                            Refund::Unchanged
                        } else if prev <= now {
                            Refund::Full
                        } else {
                            Refund::Set(prev)
                        };
                        assert_eq!(refund(&l, tat, now, 2, own_tat, prev), want);
                        assert_eq!(l.refund(tat, now, 2, own_tat, prev), want);
                    }
                }
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // exhaustive integer loops, no unsafe: far too slow under Miri
    fn held_tokens_count_whole_and_settle_at_their_own_reading() {
        for held in [0, 1, 7, MAX_TAU] {
            assert_eq!(counted(held), held);
        }
        for tat in [0, 3, 10, 1_000, MAX_TIME - 5, MAX_TIME] {
            for at in [0, 3, 10, 1_000, MAX_TIME - 5, MAX_TIME] {
                for cost in [0, 1, 7, 10, MAX_TAU] {
                    let want = (u128::from(tat.max(at)) + u128::from(cost)).min(MAX_TIME.into());
                    assert_eq!(
                        u128::from(settle(tat, at, cost)),
                        want,
                        "tat {tat} at {at} cost {cost}"
                    );
                }
                // A refund of a held cost leaves the settled tat alone.
                assert_eq!(refunded(tat, at), tat);
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // exhaustive integer loops, no unsafe: far too slow under Miri
    fn a_turn_s_slot_lies_behind_the_held_tokens_one_horizon_before_the_end() {
        for tat in (0..60).chain([MAX_TIME - 3, MAX_TIME]) {
            for held in [0, 1, 5, 20] {
                for tau in [0, 1, 10, 45] {
                    for wait in [0, 3, 100] {
                        let want = (i128::from(tat) + i128::from(held) - i128::from(tau)).max(0);
                        let got = slot_of(tat, held, tau, wait);
                        assert_eq!(i128::from(got), want, "tat {tat} held {held} tau {tau}");
                    }
                }
            }
        }
    }
}
