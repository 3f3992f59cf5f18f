//! # pace
//!
//! A lock-free, per-key pace limiter: "requests per second per key" for the
//! surfaces that issue credentials and answer requests.
//!
//! * One token bucket per key, holding one second of the declared rate,
//!   refilled continuously ([`Pace`], [`Rate`]).
//! * [`Pace::reserve`] debits and decides in ONE atomic operation: a single
//!   CAS loop on one `u64` per key. Asking and debiting separately would let
//!   parallel requests through and turn the ceiling into rate x parallelism.
//! * The caller [`refund`](Reservation::refund)s a reservation when the
//!   exchange did not happen, so only accepted presentations spend a
//!   client's pace.
//! * A full bucket is the same as no bucket: full rows are removed, so memory
//!   is bounded by who exchanged within the last horizon, not by who was
//!   named. Removed rows and outgrown arrays are reclaimed with
//!   crossbeam-epoch.
//!
//! [`Gate`] is the other half of surviving load: N job slots plus a byte
//! budget, reserved together at admission and held by RAII permits until
//! the job and its buffer are really gone (see [`gate`]).
//!
//! The limit is per process: N replicas give a client up to N x the rate.
//! DESIGN.md explains the encoding, the row lifecycle and why it cannot
//! over-admit.
#![warn(missing_docs)]

mod bucket;
pub mod clock;
pub mod gate;
#[cfg(feature = "lab")]
pub mod lab;
mod pace;
mod rate;
mod sync;
mod table;

#[cfg(feature = "quanta")]
pub use crate::clock::QuantaClock;
pub use crate::clock::{Clock, DefaultClock, ManualClock, StdClock};
pub use crate::gate::{AdmitError, Gate, GateStats, Resource, Ticket};
pub use crate::pace::{Builder, Debit, Denied, DenyReason, MemoryStats, Pace, Reservation};
pub use crate::rate::{ConfigError, Rate};

/// Internals exposed for benchmarks, fuzz targets and models only. Not a
/// stable API: anything here may change in any release.
#[doc(hidden)]
pub mod __private {
    /// Pins and flushes the current thread's epoch handle until deferred
    /// frees have run, so memory tests can measure what is really held.
    #[cfg(not(loom))]
    pub fn collect_garbage() {
        // Each flush frees a bounded number of garbage bags; a million
        // retired rows fill tens of thousands of them.
        for _ in 0..(1 << 17) {
            crossbeam_epoch::pin().flush();
        }
    }

    /// The bucket rule (`src/bucket.rs`) on plain integers, so that baseline
    /// limiters in benchmarks and exact models can share the crate's math.
    #[derive(Clone, Copy, Debug)]
    pub struct BucketMath(crate::bucket::Limits);

    impl BucketMath {
        /// `capacity` tokens refilled one per `interval_ns`; `None` when
        /// either is zero or their product does not fit the time space.
        pub fn new(interval_ns: u64, capacity: u64) -> Option<BucketMath> {
            crate::bucket::Limits::new(interval_ns, capacity).map(BucketMath)
        }

        /// Debits `n` tokens from bucket state `tat` at `now`: `Ok(new_tat)`,
        /// or `Err(wait_ns)` (`u64::MAX` when never admissible).
        #[inline]
        pub fn reserve(&self, tat: u64, now: u64, n: u64) -> Result<u64, u64> {
            use crate::bucket::Decision;
            match self.0.reserve(tat, now, n) {
                Decision::Admit(t) => Ok(t),
                Decision::Wait(w) => Err(w),
                Decision::Never | Decision::TimeExhausted => Err(u64::MAX),
            }
        }

        /// Whole tokens in bucket `tat` at `now`.
        pub fn tokens(&self, tat: u64, now: u64) -> u64 {
            self.0.tokens(tat, now)
        }
    }
}
