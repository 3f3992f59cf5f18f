//! # pace
//!
//! A lock-free, per-key pace limiter: "requests per second per key" for the
//! surfaces that issue credentials and answer requests; and an admission
//! [`Gate`] (job slots plus a byte budget) for the work behind them.
//!
//! * One token bucket per key, holding one second of the declared rate
//!   (at least one token), refilled continuously ([`Pace`], [`Rate`]).
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
//! * The limit is per process: N replicas give a client up to N x the rate.
//!
//! DESIGN.md (in the repository) explains the encoding, the row lifecycle and
//! why it cannot over-admit.
//!
//! ## Reserve, then refund what did not happen
//!
//! A reservation is a debit already made. Dropping it keeps the debit;
//! [`Reservation::refund`] gives back what has not drained yet. A denial
//! ([`Denied`]) debits nothing and says how long to wait.
//!
//! ```
//! use std::time::Duration;
//! use pace::{Pace, Rate};
//!
//! // 2 per minute, and a client may spend both at once.
//! let pace: Pace<String> = Pace::builder(Rate::new(2, Duration::from_secs(60))?)
//!     .capacity(2)
//!     .build()?;
//!
//! let first = pace.reserve("client-7").expect("a fresh key is full");
//! drop(first); // the exchange happened: the debit stays
//! let second = pace.reserve("client-7").expect("capacity is 2");
//! let denied = pace.reserve("client-7").unwrap_err();
//! assert!(!denied.is_permanent());
//! assert!(denied.retry_after() > Duration::ZERO); // about 30 s: one token
//!
//! second.refund(); // that exchange did not happen after all
//! assert!(pace.reserve("client-7").is_ok());
//! # Ok::<(), pace::ConfigError>(())
//! ```
//!
//! ## Quotas per key, and waiting for a turn
//!
//! A [`Quota`] (a rate and a capacity) can come with each call: a key's
//! plan, a tenant's limit. [`Pace::set_quota`] replaces the default quota of
//! [`Pace::reserve`] while the limiter runs. A row stores only a time, so a
//! key keeps its debt across quotas. [`Pace::acquire_blocking`] (and
//! `Pace::acquire`, feature `tokio`) waits for the key's next turn instead
//! of being refused: one CAS takes a slot, one sleep waits for it.
//!
//! ```
//! use std::time::Duration;
//! use pace::{Pace, Quota, Rate};
//!
//! let pace: Pace<&str> = Pace::new(Rate::per_second(10)?);
//! // A plan of 20 per second in bursts of 2.
//! let plan = Quota::new(Rate::per_second(20)?, 2)?;
//! let _a = pace.reserve_with(&"tenant-a", plan).expect("2 tokens");
//! let _b = pace.reserve_with(&"tenant-a", plan).expect("2 tokens");
//! assert!(pace.reserve_with(&"tenant-a", plan).is_err());
//! // The third waits for its turn (50 ms) instead.
//! let turn = pace.acquire_n_with_blocking(&"tenant-a", 1, plan, Duration::from_secs(1));
//! assert!(turn.is_ok());
//! # Ok::<(), pace::ConfigError>(())
//! ```
//!
//! ## Features
//!
//! * `quanta` (default): [`QuantaClock`], the default clock, and
//!   [`CoarseClock`].
//! * `tokio`: `Pace::acquire`, `acquire_n` and `acquire_n_with`, waiting on
//!   tokio's timer.
//! * `foldhash`: [`Builder::fast_hasher`].
//! * `bytes`: [`Gate`] byte shares attached to `bytes::Bytes` owners.
//! * `journal`: `gate::journal`, the intent journal and its recovery.
//! * `loom`: crossbeam-epoch under loom, for `loom-tests/`.
//!
//! ## The two axes of a token endpoint
//!
//! A token endpoint limits twice. Per *claimed client id*: anyone can name
//! any id, so the reservation is refunded when the presentation turns out
//! invalid, and naming a client without its key costs that client nothing.
//! Per *source address*: every request spends and nothing is refunded, which
//! is what stops a flood of invalid presentations. Checking the source first
//! keeps a flood from touching the per-client table at all.
//!
//! ```
//! use std::net::IpAddr;
//! use std::time::Duration;
//! use pace::{ManualClock, Pace, Rate};
//! # use std::collections::hash_map::RandomState;
//! # type Limiter<K> = Pace<K, RandomState, ManualClock>;
//!
//! struct Endpoint {
//!     per_client: Limiter<String>, // refunded when the presentation is invalid
//!     per_source: Limiter<IpAddr>, // never refunded
//! }
//!
//! /// `Ok(true)`: a token was issued; `Ok(false)`: invalid presentation;
//! /// `Err(wait)`: too many requests.
//! fn exchange(
//!     ep: &Endpoint,
//!     source: IpAddr,
//!     claimed_id: &str,
//!     valid: impl FnOnce() -> bool,
//! ) -> Result<bool, Duration> {
//!     let _spent = ep.per_source.reserve(&source).map_err(|d| d.retry_after())?;
//!     let reservation = ep.per_client.reserve(claimed_id).map_err(|d| d.retry_after())?;
//!     if !valid() {
//!         reservation.refund(); // the exchange did not happen
//!         return Ok(false);
//!     }
//!     Ok(true) // dropping the reservation keeps the debit
//! }
//!
//! let clock = ManualClock::new(); // frozen time keeps the example exact
//! let ep = Endpoint {
//!     per_client: Pace::builder(Rate::per_second(2)?).clock(clock.clone()).build()?,
//!     per_source: Pace::builder(Rate::per_second(5)?).clock(clock.clone()).build()?,
//! };
//! let (client, attacker): (IpAddr, IpAddr) = ("192.0.2.1".parse()?, "198.51.100.9".parse()?);
//!
//! // An attacker names "alice" without her key: five invalid presentations,
//! // then its address is out of pace.
//! for _ in 0..5 {
//!     assert_eq!(exchange(&ep, attacker, "alice", || false), Ok(false));
//! }
//! assert!(exchange(&ep, attacker, "alice", || false).is_err());
//!
//! // Alice's own pace is untouched: her two tokens a second are hers.
//! assert_eq!(exchange(&ep, client, "alice", || true), Ok(true));
//! assert_eq!(exchange(&ep, client, "alice", || true), Ok(true));
//! assert_eq!(
//!     exchange(&ep, client, "alice", || true),
//!     Err(Duration::from_millis(500))
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Testing with [`ManualClock`]
//!
//! A limiter built with a [`ManualClock`] only sees the time the test sets,
//! so decisions and waits are exact. Clones of the clock share it.
//!
//! ```
//! use std::time::Duration;
//! use pace::{ManualClock, Pace, Rate};
//!
//! let clock = ManualClock::new();
//! let pace = Pace::<u64, _, _>::builder(Rate::per_second(10)?) // one token per 100 ms
//!     .clock(clock.clone())
//!     .build()?;
//!
//! for _ in 0..10 {
//!     drop(pace.reserve(&1).expect("one second of the rate is 10 tokens"));
//! }
//! let denied = pace.reserve(&1).unwrap_err();
//! assert_eq!(denied.retry_after(), Duration::from_millis(100));
//! assert_eq!(pace.peek(&1), 0);
//!
//! clock.advance(Duration::from_millis(99));
//! assert_eq!(pace.reserve(&1).unwrap_err().retry_after(), Duration::from_millis(1));
//! clock.advance(Duration::from_millis(1));
//! assert!(pace.reserve(&1).is_ok());
//!
//! // A second later the bucket is full again, and a full bucket is no row.
//! clock.advance(Duration::from_secs(1));
//! pace.sweep();
//! assert!(pace.is_empty());
//! # Ok::<(), pace::ConfigError>(())
//! ```
//!
//! ## The gate: job slots and a byte budget
//!
//! "4 running + 8 queued" bounds a count, not memory. A [`Gate`] reserves a
//! job slot and a byte share together *before* a body is read, and RAII
//! permits give them back when the job and its buffer are really gone. See
//! [`gate`] for waiting admissions ([`Gate::admit`]) and cancellation.
//!
//! ```
//! use pace::gate::{AdmitError, Gate};
//!
//! let gate = Gate::builder().slots(4).bytes(64 * 1024).body_cap(16 * 1024).build()?;
//! let request: &[u8] = b"grant_type=client_credentials";
//!
//! // Admission before reading: the declared length (or the cap if unknown).
//! let ticket = gate.try_admit(Some(request.len() as u64))?;
//! let (slot, bytes) = ticket.split();
//! let body = bytes.read_body(request)?; // never reads past the share
//! assert_eq!(&body[..], request);
//! assert_eq!(gate.stats().bytes_held, request.len() as u64);
//!
//! // A body over the cap is refused at once, holding nothing.
//! assert_eq!(
//!     gate.try_admit(Some(1 << 20)).unwrap_err(),
//!     AdmitError::TooLarge { declared: 1 << 20, body_cap: 16 * 1024 }
//! );
//!
//! drop(body); // the buffer is gone: its bytes return
//! drop(slot); // the job is done: its slot returns
//! assert_eq!((gate.stats().slots_held, gate.stats().bytes_held), (0, 0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## What the crate root holds
//!
//! The root re-exports what a limiter's user names ([`Pace`], [`Rate`],
//! [`Reservation`], [`Denied`], the clocks) and the gate's most used types;
//! everything of the gate is in [`gate`], and clocks also in [`clock`].
#![warn(missing_docs)]
// Unsafe code lives in `table` only, and every block there says why it is
// sound (`// SAFETY:`); CI denies warnings.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod all;
mod bucket;
pub mod clock;
pub mod gate;
mod pace;
mod rate;
mod sync;
#[allow(unsafe_code)]
mod table;

// What the root re-exports: every public type of the keyed limiter (`Pace`
// and its builder, reservations, debits, denials, memory stats, and the
// all-or-nothing combinator of `pace::all`) and the clocks, plus the gate's entry point and the
// types its common path names (`Gate`, `Ticket`, `AdmitError`, `Resource`,
// `GateStats`). Everything else of the gate (its builder and config error,
// permits, bodies, the journal) is reached through `pace::gate`.
pub use crate::all::{all, All, AllDenied, AllReservation, Axis, BoxAxis};
pub use crate::clock::{Clock, DefaultClock, ManualClock, StdClock};
#[cfg(feature = "quanta")]
pub use crate::clock::{CoarseClock, QuantaClock};
pub use crate::gate::{AdmitError, Gate, GateStats, Resource, Ticket};
#[cfg(feature = "foldhash")]
pub use crate::pace::FastHasher;
pub use crate::pace::{
    Builder, Debit, Denied, DenyReason, MemoryStats, Pace, Refunded, Reservation,
};
pub use crate::rate::{ConfigError, Quota, Rate};

/// Internals exposed for benchmarks, fuzz targets and models only. Not a
/// stable API: anything here may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::pace::{PaceInternals, ReservationInternals};

    /// Slots per chunk of an incremental sweep pass over a table of `n`
    /// slots: the pass takes `n.div_ceil(sweep_chunk(n))` calls
    /// (tests/memory.rs).
    pub fn sweep_chunk(n: usize) -> usize {
        crate::table::sweep_chunk(n)
    }

    /// The same for a table of `n` cells (rows of word-sized keys).
    pub fn cell_sweep_chunk(n: usize) -> usize {
        crate::table::cells::cell_sweep_chunk(n)
    }

    /// Slots per chunk of a migration: a migration from an array of `n`
    /// slots takes at most `n.div_ceil(MIGRATION_CHUNK)` calls.
    pub const MIGRATION_CHUNK: usize = crate::table::MIGRATION_CHUNK;

    /// The most slots of a migration one call copies (whole chunks).
    pub const MIGRATION_CALL_SLOTS: usize = crate::table::MIGRATION_CALL_SLOTS;

    /// Sleeps taken by callers waiting for a turn (`Pace::acquire`,
    /// `Pace::acquire_blocking`) in this process so far.
    pub fn turn_sleeps() -> u64 {
        crate::pace::turn_sleeps()
    }

    /// Pins and flushes the current thread's epoch handle until deferred
    /// frees have run, so memory tests can measure what is really held.
    #[cfg(not(loom))]
    pub fn collect_garbage() {
        // Each flush frees a bounded number of garbage bags; a million
        // retired rows fill tens of thousands of them.
        for _ in 0..(1 << 17) {
            crossbeam_epoch::pin().flush();
        }
        // Large slot arrays are freed on threads of their own: wait for them.
        while frees_in_flight() > 0 {
            std::thread::yield_now();
        }
    }

    /// Large retired slot arrays whose free is running on a thread of its
    /// own (always 0 under Miri and loom, which free at once).
    pub fn frees_in_flight() -> usize {
        #[cfg(not(any(loom, miri)))]
        {
            crate::table::FREES_IN_FLIGHT.load(std::sync::atomic::Ordering::Acquire)
        }
        #[cfg(any(loom, miri))]
        {
            0
        }
    }

    /// The cell table of word-sized keys (DESIGN.md §2, "Rows in cells"),
    /// with the hash of key `k` equal to `k`, for loom models.
    pub struct CellsModel {
        table: crate::table::cells::CellTable,
        limits: crate::bucket::Limits,
        epochs: crate::sync::Epochs,
    }

    impl CellsModel {
        /// At least `cells` cells; buckets of `capacity` tokens, one per
        /// `interval`.
        pub fn new(cells: usize, interval: u64, capacity: u64) -> CellsModel {
            CellsModel {
                table: crate::table::cells::CellTable::try_new(cells).expect("cells fit an array"),
                limits: crate::bucket::Limits::new(interval, capacity).expect("valid bucket"),
                epochs: crate::sync::Epochs::new(),
            }
        }

        /// Debits one token of `key` at `now`: the new `tat`, or `None`.
        pub fn reserve(&self, key: u64, now: u64) -> Option<u64> {
            let guard = self.epochs.pin();
            self.table
                .reserve(&self.limits, key, key, 1, now, &|| now, &|k| k, &guard)
                .ok()
                .map(|a| a.tat)
        }

        /// Debits `n` tokens of `key` (whose hash is `hash`; `hash_of` gives
        /// any key's) at `now`: the new `tat`, or `None` (for benchmarks).
        #[inline]
        pub fn reserve_hashed(
            &self,
            key: u64,
            hash: u64,
            n: u64,
            now: u64,
            hash_of: &dyn Fn(u64) -> u64,
        ) -> Option<u64> {
            let guard = self.epochs.pin();
            self.table
                .reserve(&self.limits, hash, key, n, now, &|| now, hash_of, &guard)
                .ok()
                .map(|a| a.tat)
        }

        /// Refunds one token of `key` that moved it from `prev` to `tat`.
        pub fn refund(&self, key: u64, tat: u64, prev: u64, now: u64) -> crate::Refunded {
            let guard = self.epochs.pin();
            self.table
                .refund(&self.limits, key, key, 1, tat, prev, now, &|k| k, &guard)
        }

        /// Removes the rows full at `now`; how many.
        pub fn sweep(&self, now: u64) -> usize {
            self.table.sweep(now, &|k| k, &self.epochs.pin())
        }

        /// The `tat` of `key`'s row.
        pub fn peek(&self, key: u64) -> Option<u64> {
            self.table.peek(key, key, &self.epochs.pin())
        }

        /// Keys of the live rows, sorted.
        pub fn live_keys(&self) -> Vec<u64> {
            let mut k = self.table.live_keys(&self.epochs.pin());
            k.sort_unstable();
            k
        }

        /// Cells of the array new rows go to.
        pub fn cells(&self) -> usize {
            self.table.cells(&self.epochs.pin())
        }

        /// Rows counted.
        pub fn len(&self) -> usize {
            self.table.len()
        }

        /// Whether no row is counted.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
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
