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
//! [`Pace::acquire`] in async code) waits for the key's next turn instead
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
//! * `timer` (default): [`Pace::acquire`], [`Pace::acquire_n`] and
//!   [`Pace::acquire_n_with`] for async code on any executor, waiting on
//!   `futures-timer` (one timer thread per process, started by the first
//!   wait, with nanosecond deadlines; no dependencies of its own).
//! * `foldhash`: `Builder::fast_hasher`, a seeded foldhash instead of SipHash.
//! * `bytes`: [`Gate`] byte shares attached to `bytes::Bytes` owners.
//! * `journal`: `gate::journal`, the intent journal and its recovery.
//! * `__internals`: `pace::internals` and a few `Builder` and `Pace` methods
//!   (explicit times, state probes, table internals) for models, fuzz
//!   targets and benchmarks. Not a stable API.
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
//!     // Held while checked: the refund is exact, however many overlap it.
//!     let hold = ep.per_client.hold(claimed_id).map_err(|d| d.retry_after())?;
//!     if !valid() {
//!         hold.refund(); // the exchange did not happen
//!         return Ok(false);
//!     }
//!     Ok(true) // dropping the hold keeps the debit
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
//! Waits follow the clock too: a turn that waits
//! ([`Pace::acquire_blocking`], [`Pace::acquire`]) never sleeps in real time
//! on a [`ManualClock`]. It is let through by the
//! [`advance`](ManualClock::advance) or [`set`](ManualClock::set) that
//! reaches its slot, from another thread or task:
//!
//! ```
//! use std::time::Duration;
//! use pace::{ManualClock, Pace, Rate};
//!
//! let clock = ManualClock::new();
//! let pace = Pace::<u64, _, _>::builder(Rate::per_minute(1)?)
//!     .clock(clock.clone())
//!     .build()?;
//! drop(pace.reserve(&1).unwrap()); // the next turn is a minute away
//!
//! std::thread::scope(|s| {
//!     let turn = s.spawn(|| pace.acquire_blocking(&1, Duration::from_secs(60)).is_ok());
//!     while clock.waiting() == 0 {
//!         std::thread::yield_now(); // until the turn waits on the clock
//!     }
//!     clock.advance(Duration::from_secs(60)); // wakes it: no real minute passes
//!     assert!(turn.join().unwrap());
//! });
//! # Ok::<(), pace::ConfigError>(())
//! ```
//!
//! An [auto-advancing](ManualClock::auto_advancing) clock moves itself, as a
//! paused tokio clock does: while turns wait, it jumps to the earliest slot
//! waited for, so code that waits runs in no real time, blocking or async
//! (here on a tokio runtime; any executor does):
//!
//! ```
//! use std::time::Duration;
//! use pace::{ManualClock, Pace, Rate};
//!
//! let clock = ManualClock::auto_advancing();
//! let pace = Pace::<u64, _, _>::builder(Rate::per_minute(1)?)
//!     .clock(clock.clone())
//!     .build()?;
//! drop(pace.reserve(&1).unwrap());
//!
//! drop(pace.acquire_blocking(&1, Duration::from_secs(60)).unwrap());
//! assert_eq!(clock.now(), Duration::from_secs(60));
//!
//! # #[cfg(feature = "timer")]
//! tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//!     drop(pace.acquire(&1, Duration::from_secs(60)).await.unwrap());
//!     assert_eq!(clock.now(), Duration::from_secs(120));
//! });
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
// docs.rs (`--cfg docsrs`, Cargo.toml's `package.metadata.docs.rs`) marks
// the items of each feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Unsafe code lives in `table` only, and every block there says why it is
// sound (`// SAFETY:`); CI denies warnings.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod all;
mod bucket;
pub mod clock;
pub mod gate;
mod hasher;
#[cfg(feature = "__internals")]
pub mod internals;
mod pace;
mod prefix;
mod rate;
mod rule;
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
    Builder, Debit, Denied, DenyReason, Hold, MemoryStats, Pace, Refunded, Reservation,
};
pub use crate::prefix::IpPrefix;
pub use crate::rate::{ConfigError, Quota, Rate};

/// The README's Rust blocks, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The Rust blocks of docs/reference.md, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/reference.md")]
struct ReferenceDoctests;

/// The commonest calls compile without a warning: dropping a
/// [`Reservation`] is how a debit is kept, so it is not `#[must_use]` (the
/// `Result` around it is).
///
/// ```
/// #![deny(unused_must_use)]
/// use std::time::Duration;
/// use pace::{Denied, Pace};
///
/// fn handler(pace: &Pace<String>, key: &str) -> Result<(), Denied> {
///     pace.reserve(key)?;
///     Ok(())
/// }
///
/// async fn worker(pace: &Pace<String>, key: &str) -> Result<(), Denied> {
///     pace.acquire(key, Duration::from_secs(1)).await?;
///     pace.acquire_blocking(key, Duration::from_secs(1))?;
///     Ok(())
/// }
/// ```
#[cfg(doctest)]
struct CommonCallsCompileClean;
