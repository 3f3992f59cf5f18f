//! The bucket as pure arithmetic: no atomics, no clock.
//!
//! A bucket of capacity `C` tokens refilled one token per `T` ns is stored as
//! one number, its *theoretical arrival time* `tat` (GCRA): the instant at
//! which the bucket will be full again. At time `now` its debt is
//! `max(0, tat - now)` ns and it holds `C - ceil(debt / T)` whole tokens, so
//! `tat` is exactly a fixed-point token counter (`(now + C*T - tat) / T`
//! tokens, in units of 1/T) fused with its refill stamp. DESIGN.md shows the
//! equivalence. A state `tat <= now` is a *full* bucket, which is the same
//! as no bucket at all; the value 0 is therefore the state of a fresh row.
//!
//! The decisions on a bucket are in `crate::rule` (which also gives
//! `Limits` its `reserve` and `refund`); the atomic layers publish their
//! results with one CAS and add no arithmetic of their own.

/// The largest representable `tat`: about 73 years of nanoseconds. (The
/// table reads `tat` fields above it as held rows' records, `held/`.)
pub(crate) const MAX_TIME: u64 = (1 << 61) - 1;
/// The largest refill time of an empty bucket (`capacity x interval`).
pub(crate) const MAX_TAU: u64 = MAX_TIME / 2;

/// A bucket's shape: `capacity` tokens refilled one per `interval` ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Limits {
    interval: u64,
    capacity: u64,
    /// `capacity * interval`: time for an empty bucket to refill.
    tau: u64,
}

/// What a reserve does to a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Admitted: store this `tat`.
    Admit(u64),
    /// Denied now; admitted after this many ns if nothing else happens.
    Wait(u64),
    /// Denied forever: more tokens than the bucket holds.
    Never,
    /// Denied: the answer would leave the representable time space.
    TimeExhausted,
    /// Denied while tokens of the row are held (`table/held/`): admitted
    /// after this many ns if the held tokens are kept.
    Held(u64),
}

/// What a refund does to a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refund {
    /// Nothing of the reservation is left to return.
    Unchanged,
    /// Store this `tat`.
    Set(u64),
    /// The bucket is full again: the row may be removed.
    Full,
}

impl Limits {
    /// `None` if `capacity` is zero or `capacity * interval` does not fit.
    pub(crate) fn new(interval: u64, capacity: u64) -> Option<Limits> {
        if interval == 0 || capacity == 0 {
            return None;
        }
        let tau = interval.checked_mul(capacity)?;
        (tau <= MAX_TAU).then_some(Limits {
            interval,
            capacity,
            tau,
        })
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Nanoseconds one token takes to refill.
    pub(crate) fn interval(&self) -> u64 {
        self.interval
    }

    /// `l` with another horizon (for a known-wrong variant only).
    #[cfg(pace_mutant = "quota_read_twice")]
    pub(crate) fn mixed(l: Limits, tau: u64) -> Limits {
        Limits { tau, ..l }
    }

    /// The same bucket admitting debits that fit it up to `wait` ns after
    /// the decision's reading: a decision at `now` under these limits is the
    /// decision of the original ones at the reading `max(now, new − τ)`, the
    /// instant its debit fits (DESIGN.md §3, "Waiting for a turn").
    pub(crate) fn waiting(&self, wait: u64) -> Limits {
        Limits {
            tau: self.tau.saturating_add(wait),
            ..*self
        }
    }

    /// Time for an empty bucket to become full: the horizon after which every
    /// row that has not exchanged is full, hence removable.
    pub(crate) fn tau(&self) -> u64 {
        self.tau
    }

    /// Whole tokens available in bucket `tat` at `now`.
    #[inline]
    pub(crate) fn tokens(&self, tat: u64, now: u64) -> u64 {
        let debt = tat.saturating_sub(now);
        if debt >= self.tau {
            0
        } else {
            (self.tau - debt) / self.interval
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 100;

    fn lim(cap: u64) -> Limits {
        Limits::new(T, cap).unwrap()
    }

    /// A turn's limits (`waiting`) admit a debit that fits the bucket up
    /// to `wait` ns after the reading, exactly: one ns less and it waits
    /// that ns.
    #[test]
    fn waiting_admits_what_fits_within_the_wait_and_no_more() {
        let l = lim(3);
        // Three tokens ahead at 1_000: the next fits at 1_100.
        let tat = 1_300;
        assert_eq!(l.reserve(tat, 1_000, 1), Decision::Wait(T));
        let w = l.waiting(T);
        assert_eq!(w.tau(), 4 * T);
        assert_eq!((w.capacity(), w.interval()), (3, T));
        assert_eq!(w.reserve(tat, 1_000, 1), Decision::Admit(1_400));
        assert_eq!(w.reserve(tat, 1_000, 2), Decision::Wait(T));
        assert_eq!(l.waiting(T - 1).reserve(tat, 1_000, 1), Decision::Wait(1));
        assert_eq!(l.waiting(0), l);
    }

    #[test]
    fn fresh_bucket_admits_capacity_then_waits_exactly() {
        let l = lim(3);
        let mut tat = 0;
        for i in 1..=3 {
            match l.reserve(tat, 1_000, 1) {
                Decision::Admit(t) => {
                    assert_eq!(t, 1_000 + i * T);
                    tat = t;
                }
                d => panic!("{d:?}"),
            }
        }
        assert_eq!(l.reserve(tat, 1_000, 1), Decision::Wait(T));
        assert_eq!(l.reserve(tat, 1_050, 1), Decision::Wait(50));
        assert_eq!(l.reserve(tat, 1_100, 1), Decision::Admit(1_400));
        assert_eq!(l.reserve(tat, 1_000, 2), Decision::Wait(2 * T));
        assert_eq!(l.reserve(tat, 1_000, 4), Decision::Never);
        assert_eq!(l.tokens(tat, 1_000), 0);
        assert_eq!(l.tokens(tat, 1_150), 1);
        assert_eq!(l.tokens(tat, 1_300), 3);
        assert_eq!(l.tokens(tat, 9_999), 3);
    }

    #[test]
    fn idle_time_does_not_accumulate_beyond_capacity() {
        let l = lim(2);
        assert_eq!(l.tokens(0, u64::MAX / 4), 2);
        assert_eq!(l.reserve(0, 1 << 40, 2), Decision::Admit((1 << 40) + 2 * T));
    }

    #[test]
    fn a_clock_stepping_back_mints_nothing() {
        let l = lim(2);
        let tat = match l.reserve(0, 1_000, 2) {
            Decision::Admit(t) => t,
            d => panic!("{d:?}"),
        };
        // Stepping back makes the debt look larger: fewer tokens, later tat.
        assert_eq!(l.tokens(tat, 500), 0);
        assert_eq!(
            l.reserve(tat, 500, 1),
            Decision::Wait(tat + T - 500 - 2 * T)
        );
        // A bucket that was full at 1_000 and is read at 0 still starts from tat.
        assert_eq!(l.reserve(1_000, 0, 1), Decision::Wait(1_000 + T - 2 * T));
    }

    #[test]
    fn refund_restores_the_newest_debit_only() {
        let l = lim(4);
        // Reserve 2 at now=1_000 from full (prev 0): tat = 1_200.
        let (prev, own) = (0, 1_200);
        assert_eq!(l.refund(own, 1_000, 2, own, prev), Refund::Full);
        assert_eq!(l.refund(own, 1_100, 2, own, prev), Refund::Full);
        // A late refund finds the bucket full either way.
        assert_eq!(l.refund(own, 5_000, 2, own, prev), Refund::Full);
        // Stacked on a debt ending at 1_050: restore it, even read early.
        assert_eq!(l.refund(1_250, 900, 2, 1_250, 1_050), Refund::Set(1_050));
        assert_eq!(l.refund(1_250, 1_050, 2, 1_250, 1_050), Refund::Full);
        // Someone else reserved after us (bucket at 1_400): nothing returns,
        // whatever the refund's clock reads.
        for now in [0, 1_000, 1_150, 1_200, 1_300, 2_000] {
            assert_eq!(l.refund(1_400, now, 2, own, prev), Refund::Unchanged);
        }
        // Someone refunded an earlier debit (bucket below our end): nothing.
        assert_eq!(l.refund(1_000, 900, 2, own, prev), Refund::Unchanged);
    }

    #[test]
    fn time_space_is_bounded() {
        let l = lim(1);
        assert_eq!(l.reserve(0, MAX_TIME, 1), Decision::TimeExhausted);
        assert_eq!(l.reserve(0, u64::MAX, 1), Decision::TimeExhausted);
        assert_eq!(l.reserve(0, MAX_TIME - T, 1), Decision::Admit(MAX_TIME));
        // A debt that would end past the time space but does not fit the
        // bucket anyway is a wait, not the end of time: one token of the
        // longest interval, debited twice at a reading of 1 s.
        let long = Limits::new(MAX_TAU, 1).unwrap();
        let Decision::Admit(first) = long.reserve(0, 1_000_000_000, 1) else {
            panic!("a full bucket admits one token");
        };
        assert_eq!(
            long.reserve(first, 1_000_000_000, 1),
            Decision::Wait(MAX_TAU)
        );
        // Past the time space, an admissible debit is `TimeExhausted`.
        assert_eq!(
            long.reserve(0, MAX_TIME - MAX_TAU + 1, 1),
            Decision::TimeExhausted
        );
        assert_eq!(
            long.reserve(0, MAX_TIME - MAX_TAU, 1),
            Decision::Admit(MAX_TIME)
        );
        assert!(Limits::new(1, MAX_TAU + 1).is_none());
        assert!(Limits::new(u64::MAX, 2).is_none());
        assert!(Limits::new(T, 0).is_none());
    }
}
