//! Admission gate: job slots plus a byte budget, held until the resources
//! are really free.
//!
//! "4 running + 8 queued = 12 jobs" bounds a count, not memory. A [`Gate`]
//! has `N` job slots, a budget of `B` bytes and a hard cap on one body's
//! size. Admission reserves ONE slot and a byte share (the declared length,
//! or the cap when the length is unknown) together, *before* the body is
//! read. If either is short, whatever was taken is given back and the caller
//! hears [`AdmitError::Saturated`] with the [`Resource`] that ran out.
//!
//! The [`Ticket`] splits into a [`SlotPermit`] (released at the end of the
//! job) and a [`BytePermit`] (released after the last use of the buffer; it
//! can shrink to the real size first). Both are RAII and release exactly
//! once. A caller that times out releases nothing: the permits belong to
//! whoever holds the resource they stand for.
//!
//! * [`Gate::try_admit`] answers at once and is lock-free (two CAS loops).
//! * [`Gate::admit`] waits, first come first served, until the caller's
//!   deadline ([`Gate::admit_cancellable`]: or until another thread calls
//!   it off); a waiter that gives up leaves no permit behind.
//! * [`Gate::admit_async`] is the same wait as a future, in the same first
//!   come first served queue as the blocking waiters; dropping it leaves the
//!   queue and passes the turn.
//! * With the `bytes` feature, `Body::into_bytes` attaches the byte share
//!   to a `bytes::Bytes` owner; with `journal`, `gate::journal` records what
//!   each job already did, for recovery after a crash.
//!
//! Held slots never exceed `N` and held bytes never exceed `B`, at any
//! instant: both are changed only by a CAS that checks the bound, or by a
//! release of what a permit took. DESIGN.md, section 10, gives the argument.

use std::fmt;
use std::sync::Arc;

use crate::sync::Ordering;

mod admit_async;
mod body;
mod builder;
mod error;
#[cfg(feature = "journal")]
#[cfg_attr(docsrs, doc(cfg(feature = "journal")))]
pub mod journal;
mod permit;
mod queue;
mod state;
mod waiters;

pub use self::admit_async::Admit;
pub use self::body::Body;
pub use self::builder::Builder;
pub use self::error::{AdmitError, BodyError, ConfigError, Resource, ShrinkError};
pub use self::permit::{BytePermit, SlotPermit, Ticket};
pub use self::queue::Cancel;
use self::state::Inner;

/// A snapshot of a gate's counters. Fields are read one by one, so under
/// concurrent use they are each exact but not one instant's picture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateStats {
    /// Slots held now (by tickets, slot permits, and transiently by an
    /// admission that is about to roll back).
    pub slots_held: usize,
    /// Bytes held now.
    pub bytes_held: u64,
    /// Highest `slots_held` reached by a successful admission (a refused
    /// admission's transient slot is not counted).
    pub peak_slots: usize,
    /// Highest `bytes_held` reached by a successful admission.
    pub peak_bytes: u64,
    /// Refusals ([`AdmitError::Saturated`] or [`AdmitError::TimedOut`])
    /// because of slots.
    pub saturated_slots: u64,
    /// Refusals because of the byte budget.
    pub saturated_bytes: u64,
    /// How many of those refusals were [`Gate::admit`] deadlines passing.
    pub timed_out: u64,
    /// How many of those refusals were cancellations
    /// ([`Gate::admit_cancellable`]), plus [`Gate::admit_async`] futures
    /// dropped while queued (those are not counted as saturation).
    pub cancelled: u64,
    /// [`AdmitError::TooLarge`] refusals.
    pub too_large: u64,
    /// Callers waiting in [`Gate::admit`] now.
    pub waiting: usize,
}

/// The admission gate. Cheap to clone (one `Arc`); clones share the counters.
///
/// ```
/// use pace::gate::{AdmitError, Gate, Resource};
///
/// let gate = Gate::builder().slots(2).bytes(1000).body_cap(600).build()?;
/// let a = gate.try_admit(Some(600))?;           // declared length
/// assert_eq!(
///     gate.try_admit(None).unwrap_err(),          // unknown length: reserve the cap
///     AdmitError::Saturated { resource: Resource::Bytes }
/// );
/// let (slot, mut bytes) = a.split();
/// bytes.shrink_to(100)?;                          // the body was smaller
/// assert_eq!(gate.stats().bytes_held, 100);
/// drop(bytes);                                    // last use of the buffer
/// drop(slot);                                     // end of the job
/// assert_eq!(gate.stats().slots_held, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
#[doc(alias = "Semaphore")]
pub struct Gate {
    inner: Arc<Inner>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("slots", &self.inner.slots_cap)
            .field("bytes", &self.inner.bytes_cap)
            .field("body_cap", &self.inner.body_cap)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Gate {
    /// Starts a [`Builder`].
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Number of job slots `N`.
    pub fn slots(&self) -> usize {
        self.inner.slots_cap
    }

    /// Byte budget `B`.
    pub fn bytes(&self) -> u64 {
        self.inner.bytes_cap
    }

    /// Cap on one body.
    pub fn body_cap(&self) -> u64 {
        self.inner.body_cap
    }

    /// The counters now.
    pub fn stats(&self) -> GateStats {
        let i = &*self.inner;
        let c = &i.counters;
        GateStats {
            slots_held: i.held.slots.load(Ordering::SeqCst),
            bytes_held: i.held.bytes.load(Ordering::SeqCst),
            peak_slots: c.peak_slots.load(Ordering::Relaxed),
            peak_bytes: c.peak_bytes.load(Ordering::Relaxed),
            saturated_slots: c.saturated_slots.load(Ordering::Relaxed),
            saturated_bytes: c.saturated_bytes.load(Ordering::Relaxed),
            timed_out: c.timed_out.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            too_large: c.too_large.load(Ordering::Relaxed),
            waiting: i.queued.load(Ordering::SeqCst),
        }
    }
}
