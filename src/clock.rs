//! Clocks: where `now` comes from.
//!
//! A [`Clock`] answers nanoseconds since an origin of its own choosing. The
//! limiter reads it once per operation, inside the operation, and never trusts
//! it to be monotonic: a reading that goes backwards only makes a bucket look
//! emptier (fewer admissions), never fuller (see DESIGN.md, "Time").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A source of time in nanoseconds since an arbitrary, fixed origin.
///
/// Implementations should be cheap: the limiter calls `now_ns` once per
/// `reserve`, `refund` and `peek`. They need not be monotonic.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's origin.
    fn now_ns(&self) -> u64;
}

/// The clock a [`Pace`](crate::Pace) uses unless told otherwise:
/// [`QuantaClock`] with the default `quanta` feature, else [`StdClock`].
#[cfg(feature = "quanta")]
pub type DefaultClock = QuantaClock;
/// The clock a [`Pace`](crate::Pace) uses unless told otherwise:
/// [`QuantaClock`] with the default `quanta` feature, else [`StdClock`].
#[cfg(not(feature = "quanta"))]
pub type DefaultClock = StdClock;

/// The default clock: [`quanta`]'s TSC-calibrated counter, read relative to
/// the moment the clock was created.
///
/// Some CPUs give quanta readings that are not monotonic across cores; the
/// limiter tolerates that by construction (a step back never mints tokens).
#[cfg(feature = "quanta")]
#[derive(Clone, Debug)]
pub struct QuantaClock {
    clock: quanta::Clock,
    origin: u64,
}

#[cfg(feature = "quanta")]
impl QuantaClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        QuantaClock { clock, origin }
    }
}

#[cfg(feature = "quanta")]
impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "quanta")]
impl Clock for QuantaClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// `std::time::Instant`, relative to the moment the clock was created.
#[derive(Clone, Copy, Debug)]
pub struct StdClock {
    origin: Instant,
}

impl StdClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        StdClock {
            origin: Instant::now(),
        }
    }
}

impl Default for StdClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for StdClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock moved by hand, for tests, simulations and the lab.
///
/// Clones share one reading. It starts at zero; [`set`](ManualClock::set) may
/// move it backwards, which the limiter must (and does) tolerate.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    ns: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `d` (saturating at `u64::MAX` nanoseconds).
    pub fn advance(&self, d: Duration) {
        let d = duration_ns(d);
        let _ = self
            .ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(d))
            });
    }

    /// Sets the reading to `t` since the origin; may move backwards.
    pub fn set(&self, t: Duration) {
        self.ns.store(duration_ns(t), Ordering::Release);
    }

    /// The current reading.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.ns.load(Ordering::Acquire))
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.ns.load(Ordering::Acquire)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

/// A duration in whole nanoseconds, saturating at `u64::MAX`.
pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_both_ways_and_is_shared() {
        let c = ManualClock::new();
        let d = c.clone();
        assert_eq!(c.now_ns(), 0);
        c.advance(Duration::from_millis(5));
        assert_eq!(d.now_ns(), 5_000_000);
        d.set(Duration::from_millis(2));
        assert_eq!(c.now(), Duration::from_millis(2));
        c.set(Duration::MAX);
        assert_eq!(c.now_ns(), u64::MAX);
        c.advance(Duration::from_secs(1));
        assert_eq!(c.now_ns(), u64::MAX, "advance saturates");
    }

    #[cfg(feature = "quanta")]
    #[test]
    fn real_clocks_start_near_zero_and_move_forward() {
        let q = QuantaClock::new();
        let s = StdClock::new();
        let (a, b) = (q.now_ns(), s.now_ns());
        std::thread::sleep(Duration::from_millis(2));
        assert!(q.now_ns() > a);
        assert!(s.now_ns() >= b + 2_000_000);
    }
}
