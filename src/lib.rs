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
mod pace;
mod rate;
mod sync;
mod table;

#[cfg(feature = "quanta")]
pub use crate::clock::QuantaClock;
pub use crate::clock::{Clock, DefaultClock, ManualClock, StdClock};
pub use crate::gate::{AdmitError, Gate, GateStats, Resource, Ticket};
pub use crate::pace::{Builder, Denied, DenyReason, Pace, Reservation};
pub use crate::rate::{ConfigError, Rate};
