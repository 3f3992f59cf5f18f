//! What a call gets back: reservations, holds, detached debits, denials.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

#[cfg(doc)]
use super::Builder;
use super::{each_in_drop, Pace};
use crate::bucket::Decision;
use crate::clock::{Clock, DefaultClock};
use crate::table::held::Ticket;
use crate::table::Taken;

/// Why a reservation was denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DenyReason {
    /// Not enough tokens now; [`Denied::retry_after`] says when.
    Exhausted,
    /// More tokens were asked than the bucket holds: never admitted.
    ExceedsCapacity,
    /// The debit would be admitted but would end past the limiter's time
    /// space: the clock reads past `2^61 − 1 − τ` ns, at least about 36
    /// years after its origin. (A debit that does not fit the bucket anyway
    /// is [`Exhausted`](DenyReason::Exhausted) with its wait, however long
    /// the interval.)
    TimeExhausted,
    /// Not enough tokens now because tokens of the key are *held* by
    /// presentations still being checked ([`Pace::hold`]). Held tokens
    /// count as debited at every decision and do not refill while held, so
    /// waiting alone does not bring them back: [`Denied::retry_after`] is
    /// the wait if they were kept at the denial's reading; refunded, they
    /// come back at once; still held at the retry,
    /// they are still in the way. A turn ([`Pace::acquire`]) is denied
    /// with this reason also when the held tokens and its own together
    /// exceed the capacity: it fits beside them at no instant.
    Held,
}

/// A denied reservation. Nothing was written and no row was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Denied {
    pub(super) reason: DenyReason,
    pub(super) wait_ns: u64,
}

impl Denied {
    pub(super) fn from_decision(d: Decision) -> Denied {
        match d {
            Decision::Wait(ns) => Denied {
                reason: DenyReason::Exhausted,
                wait_ns: ns,
            },
            Decision::Never | Decision::Admit(_) => Denied {
                reason: DenyReason::ExceedsCapacity,
                wait_ns: u64::MAX,
            },
            Decision::TimeExhausted => Denied {
                reason: DenyReason::TimeExhausted,
                wait_ns: u64::MAX,
            },
            Decision::Held(ns) => Denied {
                reason: DenyReason::Held,
                wait_ns: ns,
            },
        }
    }

    /// The exact wait until this request would be admitted if nothing else
    /// touched the key ([`DenyReason::Exhausted`]); with tokens held, the
    /// wait if they are kept ([`DenyReason::Held`]). [`Duration::MAX`] when
    /// it never will be (see [`is_permanent`](Denied::is_permanent)).
    ///
    /// governor's `NotUntil::wait_time_from(clock.now())` (and
    /// `earliest_possible`) is this wait: no clock to pass.
    #[doc(
        alias = "wait_time_from",
        alias = "earliest_possible",
        alias = "RetryAfter"
    )]
    pub fn retry_after(&self) -> Duration {
        match self.reason {
            DenyReason::Exhausted | DenyReason::Held => Duration::from_nanos(self.wait_ns),
            _ => Duration::MAX,
        }
    }

    /// Why it was denied.
    pub fn reason(&self) -> DenyReason {
        self.reason
    }

    /// True when waiting will not help: the request exceeds the capacity or
    /// the time space is exhausted.
    pub fn is_permanent(&self) -> bool {
        !matches!(self.reason, DenyReason::Exhausted | DenyReason::Held)
    }
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            DenyReason::Exhausted => {
                write!(f, "pace exceeded; retry after {:?}", self.retry_after())
            }
            DenyReason::ExceedsCapacity => f.write_str("request exceeds the bucket's capacity"),
            DenyReason::TimeExhausted => f.write_str("the limiter's time space is exhausted"),
            DenyReason::Held => write!(
                f,
                "pace exceeded while tokens are held by presentations being checked; \
                 retry after {:?} if they are kept",
                self.retry_after()
            ),
        }
    }
}

impl std::error::Error for Denied {}

/// An admitted request's debit. Dropping it keeps the debit; call
/// [`refund`](Reservation::refund) when the exchange did not happen.
///
/// A reservation neither pins an epoch nor keeps its row alive: it is a
/// record of what was debited (`n` tokens, moving the bucket from one `tat`
/// to another). [`detach`](Reservation::detach) turns it into a [`Debit`]
/// that borrows nothing, for refunds decided later (after a response).
///
/// Not `#[must_use]`: dropping it is how a debit is kept, so the common
/// call `pace.reserve(&key)?;` compiles without a warning (the `Result`
/// around it is `#[must_use]`, so a decision is never ignored).
pub struct Reservation<'a, K, Q: ?Sized, S = RandomState, C = DefaultClock> {
    pub(super) pace: &'a Pace<K, S, C>,
    pub(super) key: &'a Q,
    pub(super) debit: Debit,
}

/// What an admitted reservation debited, detached from its borrows (see
/// [`Reservation::detach`]): refund it with [`Pace::refund`] on the same
/// limiter and key, or drop it to keep the debit.
///
/// A `Debit` knows where it came from: the limiter that made it and its
/// key's hash. Refunded to another limiter, or to a key whose hash differs,
/// it returns nothing ([`Refunded::Misdirected`]; a hold's debit handed to
/// another key of its limiter finds no lot there: [`Refunded::Expired`]).
/// (Two keys whose 64-bit
/// hashes are equal are not told apart; with the default hasher, keyed per
/// limiter, nobody outside the process can choose such a pair.)
#[must_use = "dropping a Debit keeps it; refund it with Pace::refund if the exchange did not happen"]
#[derive(Debug, PartialEq, Eq)]
pub struct Debit {
    pub(super) n: u64,
    /// What was taken: a debit's move of the bucket's settled `tat` (what
    /// a refund compares and restores), or a hold's ticket (what it
    /// resolves with).
    pub(super) taken: Taken,
    /// The key's hash, so a refund does not hash again, and so a refund to
    /// another key is recognised.
    pub(super) hash: u64,
    /// The identity of the limiter that made it (`Pace::id`).
    pub(super) limiter: u64,
}

/// What a refund returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refunded {
    /// The reservation is undone: the key's bucket is in the state it had
    /// before the debit, as if the reservation never happened.
    Restored,
    /// The reservation is undone and the state it restored is a full bucket,
    /// so the key's row was removed (a full bucket is the same as none).
    Removed,
    /// The key was debited since: nothing was returned, since those later
    /// debits were decided on this one.
    Superseded,
    /// The key has no row: its bucket is full already (the debit drained and
    /// the row was removed), so there was nothing to return.
    Refilled,
    /// The debit belongs to another limiter or another key: nothing was
    /// returned.
    Misdirected,
    /// The debit was of zero tokens: there was nothing to return.
    Nothing,
    /// The hold outlived its limit ([`Builder::hold_limit`]) and was
    /// settled as kept: nothing was returned.
    Expired,
}

impl Refunded {
    /// True when the refund returned the debit's tokens.
    pub fn returned(self) -> bool {
        matches!(self, Refunded::Restored | Refunded::Removed)
    }
}

impl Debit {
    /// The debit of no tokens by limiter `limiter`: its refund returns
    /// nothing.
    #[inline(always)]
    pub(super) fn none(limiter: u64) -> Debit {
        Debit {
            n: 0,
            taken: Taken::Debit { tat: 0, prev: 0 },
            hash: 0,
            limiter,
        }
    }

    /// Where the debit ends on the bucket's timeline; a hold's reading.
    #[inline(always)]
    pub(super) fn end(&self) -> u64 {
        match self.taken {
            Taken::Debit { tat, .. } => tat,
            Taken::Hold(t) => t.at,
        }
    }

    /// Tokens debited.
    pub fn tokens(&self) -> u64 {
        self.n
    }

    /// A hold's ticket.
    pub(super) fn ticket(&self) -> Option<Ticket> {
        match self.taken {
            Taken::Hold(t) => Some(t),
            Taken::Debit { .. } => None,
        }
    }

    /// True when this is a hold's debit ([`Hold::detach`]): its tokens are
    /// held until [`Pace::keep`] or [`Pace::refund`] resolves it.
    pub fn is_hold(&self) -> bool {
        matches!(self.taken, Taken::Hold(_))
    }
}

/// An admitted presentation whose tokens are *held* while it is checked
/// ([`Pace::hold`]): [`refund`](Hold::refund) returns them exactly whatever
/// else happened on the key (other holds, their refunds in any order,
/// debits), and [`keep`](Hold::keep) — or dropping it — settles them as a
/// debit from the hold's own reading. Keeping costs a second CAS on the
/// key's row; use [`Pace::reserve`] where nothing will be refunded.
///
/// While held, the tokens count against the key as debited at every
/// decision. A hold neither kept nor refunded within
/// [`Builder::hold_limit`] may expire: it then counts as kept, and its
/// refund returns nothing ([`Refunded::Expired`]). A hold dropped while its
/// thread unwinds from a panic is kept.
///
/// Keeping or refunding reads no clock: the resolution acts at the hold's
/// own reading, as a thread that read the clock then would. Expired lots
/// are settled by the key's other calls and by the sweep, so a hold
/// resolved past its limit is still exact while nothing has expired its
/// lot.
#[must_use = "a Hold dropped at once is kept at the cost of a second CAS; use reserve() where nothing will be refunded"]
pub struct Hold<'a, K, Q, S = RandomState, C = DefaultClock>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    pub(super) inner: Option<Reservation<'a, K, Q, S, C>>,
}

impl<K, Q, S, C> fmt::Debug for Hold<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("tokens", &self.tokens())
            .finish()
    }
}

impl<K, Q, S, C> Hold<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    /// Tokens held.
    pub fn tokens(&self) -> u64 {
        self.inner.as_ref().map_or(0, |r| r.debit.n)
    }

    /// Settles the held tokens as a debit from the hold's reading (what
    /// dropping the hold does). False when the hold had expired, already
    /// counted as kept.
    pub fn keep(mut self) -> bool {
        let r = self.inner.take().expect("a hold is resolved once");
        let at = r.debit.end();
        r.pace.resolve_hashed(r.key, r.debit, true, at)
    }

    /// Returns the held tokens: exact in any order, whatever else happened
    /// on the key ([`Refunded::Restored`]), unless the hold expired
    /// ([`Refunded::Expired`]).
    pub fn refund(mut self) -> Refunded {
        let r = self.inner.take().expect("a hold is resolved once");
        if r.debit.n == 0 {
            return Refunded::Nothing;
        }
        let at = r.debit.end();
        if r.pace.resolve_hashed(r.key, r.debit, false, at) {
            Refunded::Restored
        } else {
            Refunded::Expired
        }
    }

    /// Detaches the hold from its borrows: resolve the [`Debit`] later with
    /// [`Pace::keep`] or [`Pace::refund`]. A detached hold dropped without
    /// either stays held until it expires ([`Builder::hold_limit`]), then
    /// counts as kept.
    pub fn detach(mut self) -> Debit {
        self.inner.take().expect("a hold is resolved once").debit
    }

    /// [`refund`](Hold::refund) at an explicit time (for models).
    #[cfg(feature = "__internals")]
    pub(crate) fn resolve_at_inner(mut self, keep: bool, now: u64) -> Refunded {
        let r = self.inner.take().expect("a hold is resolved once");
        if keep {
            if r.pace.resolve_hashed(r.key, r.debit, true, now) {
                Refunded::Nothing
            } else {
                Refunded::Expired
            }
        } else {
            r.pace.refund_hashed(r.key, r.debit.hash, r.debit, now)
        }
    }
}

impl<K, Q, S, C> Drop for Hold<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    fn drop(&mut self) {
        // Kept also while the thread unwinds; a key's `Eq` that panics then
        // is caught (the hold stays held until it expires, then counts as
        // kept). A hold kept, refunded or detached has nothing left here.
        if let Some(r) = self.inner.take() {
            each_in_drop(Some(r), |r| {
                let at = r.debit.end();
                r.pace.resolve_hashed(r.key, r.debit, true, at);
            });
        }
    }
}

impl<K, Q: ?Sized, S, C> fmt::Debug for Reservation<'_, K, Q, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("tokens", &self.debit.n)
            .field("tat_ns", &self.debit.end())
            .finish()
    }
}

impl<K, Q, S, C> Reservation<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    /// Tokens this reservation debited.
    pub fn tokens(&self) -> u64 {
        self.debit.n
    }

    /// Where this debit ends on the bucket's timeline (ns; for models).
    #[cfg(feature = "__internals")]
    pub(crate) fn debit_end_ns_inner(&self) -> u64 {
        self.debit.end()
    }

    /// Undoes this reservation if nothing has been debited from its key
    /// since: the bucket returns to the state it had before, as if the
    /// reservation never happened (so a refund after the debit drained finds
    /// the bucket full either way). If the key was debited since, the refund
    /// returns nothing: those later debits were decided on this one, and
    /// returning it could admit more than the bucket allows. A refund never
    /// creates a row; a refund that fills the bucket removes the row.
    pub fn refund(self) -> Refunded {
        let now = self.pace.clock.now_ns();
        self.refund_at_inner(now)
    }

    /// [`refund`](Reservation::refund) at an explicit time (for models).
    pub(crate) fn refund_at_inner(self, now: u64) -> Refunded {
        let hash = self.debit.hash;
        self.pace.refund_hashed(self.key, hash, self.debit, now)
    }

    /// Detaches the debit from its borrows, to refund it later with
    /// [`Pace::refund`] (for example once a response says whether the
    /// exchange happened) or to drop it and keep the debit.
    pub fn detach(self) -> Debit {
        self.debit
    }
}

/// A reservation and its slot: the instant (ns on the limiter's clock) its
/// debit fits the bucket, when a caller waiting for its turn goes through.
pub type Turned<'a, K, Q, S, C> = (Reservation<'a, K, Q, S, C>, u64);
