//! Declared rates and their validation.

use std::fmt;
use std::time::Duration;

use crate::bucket::{Limits, MAX_TAU};

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A declared pace: `count` tokens per `per`.
///
/// Internally a rate is one integer *interval*: the nanoseconds one token
/// takes to refill, rounded **up** so that rounding always admits fewer, never
/// more. `Rate::per_second(3)` refills a token every 333,333,334 ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    count: u64,
    per_ns: u64,
    interval_ns: u64,
}

impl Rate {
    /// `n` tokens per second.
    ///
    /// # Errors
    /// [`ConfigError::ZeroRate`] for `n == 0`; [`ConfigError::IntervalTooShort`]
    /// above one token per nanosecond.
    pub fn per_second(n: u64) -> Result<Rate, ConfigError> {
        Rate::new(n, Duration::from_secs(1))
    }

    /// `n` tokens per minute.
    ///
    /// As with every rate, [`Pace::new`](crate::Pace::new) gives it a
    /// capacity of one second of the rate (at least one token): 100 per
    /// minute refills a token every 600 ms and holds 1. For governor's
    /// `Quota::per_minute(n)` (a burst of `n`), set the capacity as well:
    /// `Pace::builder(Rate::per_minute(n)?).capacity(n)` or
    /// `Quota::new(Rate::per_minute(n)?, n)`.
    ///
    /// # Errors
    /// [`ConfigError::ZeroRate`] for `n == 0`; [`ConfigError::IntervalTooShort`]
    /// above one token per nanosecond.
    pub fn per_minute(n: u64) -> Result<Rate, ConfigError> {
        Rate::new(n, Duration::from_secs(60))
    }

    /// `n` tokens per hour (capacity: as for [`Rate::per_minute`]).
    ///
    /// # Errors
    /// [`ConfigError::ZeroRate`] for `n == 0`; [`ConfigError::IntervalTooShort`]
    /// above one token per nanosecond.
    pub fn per_hour(n: u64) -> Result<Rate, ConfigError> {
        Rate::new(n, Duration::from_secs(3600))
    }

    /// `count` tokens per `per`.
    ///
    /// # Errors
    /// [`ConfigError::ZeroRate`] for `count == 0`, [`ConfigError::ZeroPeriod`]
    /// for a zero `per`, [`ConfigError::IntervalTooShort`] when one token would
    /// refill in less than 1 ns, [`ConfigError::IntervalTooLong`] when one
    /// token would take longer than the longest refill time (about 36 years).
    pub fn new(count: u64, per: Duration) -> Result<Rate, ConfigError> {
        if count == 0 {
            return Err(ConfigError::ZeroRate);
        }
        let per_ns = per.as_nanos();
        if per_ns == 0 {
            return Err(ConfigError::ZeroPeriod);
        }
        if (count as u128) > per_ns {
            return Err(ConfigError::IntervalTooShort);
        }
        let interval = per_ns.div_ceil(count as u128);
        if interval > MAX_TAU as u128 || per_ns > u64::MAX as u128 {
            return Err(ConfigError::IntervalTooLong);
        }
        Ok(Rate {
            count,
            per_ns: per_ns as u64,
            interval_ns: interval as u64,
        })
    }

    /// Tokens per period, as declared.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The period, as declared.
    pub fn per(&self) -> Duration {
        Duration::from_nanos(self.per_ns)
    }

    /// Nanoseconds for one token to refill (rounded up).
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval_ns)
    }

    pub(crate) fn interval_ns(&self) -> u64 {
        self.interval_ns
    }

    /// One second of this rate in whole tokens, rounded down, at least one:
    /// the default capacity of a bucket.
    pub fn one_second(&self) -> u64 {
        let per_sec = (self.count as u128 * NANOS_PER_SEC) / self.per_ns as u128;
        per_sec.clamp(1, u64::MAX as u128) as u64
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {:?}", self.count, self.per())
    }
}

/// A bucket's shape: a [`Rate`] and a capacity, validated once.
///
/// What a limiter decides with: [`Pace::new`](crate::Pace::new) and
/// [`Builder::capacity`](crate::Builder::capacity) make its default quota,
/// [`Pace::set_quota`](crate::Pace::set_quota) replaces that default while
/// the limiter runs, and [`Pace::reserve_with`](crate::Pace::reserve_with)
/// decides one call with a quota of its own (a key's plan, a tenant's
/// limit). A row stores only a time, so a key debited under one quota and
/// then another keeps its debt across the change.
///
/// ```
/// use pace::{Quota, Rate};
///
/// let free = Quota::per_second(10)?; // capacity: one second of the rate
/// let paid = Quota::new(Rate::per_second(1000)?, 50)?;
/// assert_eq!((free.capacity(), paid.capacity()), (10, 50));
/// assert_eq!(paid.horizon(), std::time::Duration::from_millis(50));
/// # Ok::<(), pace::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[doc(alias = "Limit")]
pub struct Quota {
    rate: Rate,
    limits: Limits,
}

impl Quota {
    /// `capacity` tokens refilled at `rate`.
    ///
    /// # Errors
    /// [`ConfigError::ZeroCapacity`] for a capacity of 0;
    /// [`ConfigError::CapacityTooLarge`] when refilling an empty bucket would
    /// take longer than the time space allows.
    pub fn new(rate: Rate, capacity: u64) -> Result<Quota, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        let limits =
            Limits::new(rate.interval_ns(), capacity).ok_or(ConfigError::CapacityTooLarge)?;
        Ok(Quota { rate, limits })
    }

    /// `rate` with one second of it as capacity (at least one token), as
    /// [`Pace::new`](crate::Pace::new) does.
    ///
    /// # Errors
    /// As [`Quota::new`].
    pub fn of(rate: Rate) -> Result<Quota, ConfigError> {
        Quota::new(rate, rate.one_second())
    }

    /// `n` tokens per second with a capacity of one second (`n` tokens).
    ///
    /// # Errors
    /// As [`Rate::per_second`] and [`Quota::new`].
    pub fn per_second(n: u64) -> Result<Quota, ConfigError> {
        Quota::of(Rate::per_second(n)?)
    }

    /// The rate tokens refill at.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Tokens a full bucket holds.
    pub fn capacity(&self) -> u64 {
        self.limits.capacity()
    }

    /// The time one token takes to refill (the rate's interval, rounded up
    /// to whole nanoseconds).
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.limits.interval())
    }

    /// The time an empty bucket takes to refill: `capacity × interval`.
    pub fn horizon(&self) -> Duration {
        Duration::from_nanos(self.limits.tau())
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    pub(crate) fn limits_ref(&self) -> &Limits {
        &self.limits
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, capacity {}", self.rate, self.capacity())
    }
}

/// Why a rate or a limiter could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The rate's count is zero: nothing would ever be admitted.
    ZeroRate,
    /// The rate's period is zero.
    ZeroPeriod,
    /// One token would refill in less than one nanosecond.
    IntervalTooShort,
    /// One token would take longer to refill than the time space holds.
    IntervalTooLong,
    /// A capacity of zero tokens admits nothing.
    ZeroCapacity,
    /// `capacity x interval` (the time to refill an empty bucket) does not fit
    /// the time space.
    CapacityTooLarge,
    /// [`min_slots`](crate::Builder::min_slots), rounded up to a power of
    /// two, is more slots than an array can have, or than the allocator
    /// gives.
    MinSlotsTooLarge,
    /// [`hold_limit`](crate::Builder::hold_limit) is zero: every hold would
    /// expire at once and no refund of one could return anything.
    ZeroHoldLimit,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigError::ZeroRate => "rate count must be at least 1",
            ConfigError::ZeroPeriod => "rate period must be longer than zero",
            ConfigError::IntervalTooShort => {
                "rate is faster than one token per nanosecond, the clock's resolution"
            }
            ConfigError::IntervalTooLong => {
                "one token would take longer than ~36 years (the longest refill time)"
            }
            ConfigError::ZeroCapacity => "capacity must be at least 1 token",
            ConfigError::CapacityTooLarge => {
                "capacity x interval (time to refill an empty bucket) exceeds ~36 years"
            }
            ConfigError::MinSlotsTooLarge => {
                "min_slots is more slots than an array can have or the allocator gives"
            }
            ConfigError::ZeroHoldLimit => {
                "hold_limit must be longer than zero (a hold would expire at once)"
            }
        })
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_round_up() {
        let r = Rate::per_second(3).unwrap();
        assert_eq!(r.interval_ns(), 333_333_334);
        assert_eq!(r.one_second(), 3);
        let r = Rate::new(100, Duration::from_secs(60)).unwrap();
        assert_eq!(r.interval_ns(), 600_000_000);
        assert_eq!(r.one_second(), 1, "at least one token");
        let r = Rate::per_second(1_000_000_000).unwrap();
        assert_eq!(r.interval_ns(), 1);
        assert_eq!(r.one_second(), 1_000_000_000);
    }

    #[test]
    fn per_minute_and_per_hour() {
        let r = Rate::per_minute(100).unwrap();
        assert_eq!(r, Rate::new(100, Duration::from_secs(60)).unwrap());
        assert_eq!((r.count(), r.per()), (100, Duration::from_secs(60)));
        assert_eq!(r.interval_ns(), 600_000_000);
        assert_eq!(r.one_second(), 1);
        // 7 per minute: 8,571,428,571.43 ns, rounded up.
        assert_eq!(Rate::per_minute(7).unwrap().interval_ns(), 8_571_428_572);
        assert_eq!(Rate::per_minute(60_000).unwrap().one_second(), 1_000);
        let r = Rate::per_hour(3).unwrap();
        assert_eq!((r.count(), r.per()), (3, Duration::from_secs(3600)));
        assert_eq!(r.interval_ns(), 1_200_000_000_000);
        assert_eq!(Rate::per_hour(7).unwrap().interval_ns(), 514_285_714_286);
        assert_eq!(Rate::per_minute(0), Err(ConfigError::ZeroRate));
        assert_eq!(Rate::per_hour(0), Err(ConfigError::ZeroRate));
        // The fastest: one token per nanosecond.
        assert_eq!(Rate::per_hour(3_600_000_000_000).unwrap().interval_ns(), 1);
        assert_eq!(
            Rate::per_hour(3_600_000_000_001),
            Err(ConfigError::IntervalTooShort)
        );
        assert_eq!(
            Rate::per_minute(60_000_000_001),
            Err(ConfigError::IntervalTooShort)
        );
    }

    #[test]
    fn bad_rates_are_typed_errors() {
        assert_eq!(Rate::per_second(0), Err(ConfigError::ZeroRate));
        assert_eq!(Rate::new(1, Duration::ZERO), Err(ConfigError::ZeroPeriod));
        assert_eq!(
            Rate::per_second(1_000_000_001),
            Err(ConfigError::IntervalTooShort)
        );
        assert_eq!(
            Rate::new(1, Duration::from_secs(200 * 365 * 86_400)),
            Err(ConfigError::IntervalTooLong)
        );
        assert_eq!(
            Rate::new(1, Duration::MAX),
            Err(ConfigError::IntervalTooLong)
        );
        assert!(!ConfigError::ZeroRate.to_string().is_empty());
    }
}
