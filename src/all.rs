//! All-or-nothing reservations over several limits.
//!
//! A request often spends on several limits at once: the source address it
//! comes from and the client id it claims, each with its own [`Pace`] and its
//! own key type. [`all`] reserves every `(limiter, key)` pair in the order
//! they were added; when one of them denies, the pairs already reserved are
//! refunded at once, newest first, and the first denial is returned. Pairs
//! after the denying one are not touched.
//!
//! Each pair is *held* ([`Pace::hold_n`]), so the refund of the earlier pairs
//! is exact whatever else happens on their keys meanwhile
//! ([`Hold::refund`](crate::Hold::refund)): a denied request leaves no debit
//! behind, also when other requests of the same keys overlap it. No limit
//! ever admits more than it would alone: held tokens count as debited at
//! every decision.
//!
//! Once every pair is reserved, [`AllReservation`] decides per pair what to
//! keep: [`refund`](AllReservation::refund) one pair (for example the
//! claimed client id after the presentation turned out invalid) and keep the
//! others (the source address, never refunded), or
//! [`refund_all`](AllReservation::refund_all). Dropping it keeps every debit
//! (each held pair is settled: a second CAS on its row).
//!
//! ```
//! use pace::{Pace, Rate};
//!
//! let per_source: Pace<std::net::IpAddr> = Pace::new(Rate::per_second(10)?);
//! let per_client: Pace<String> = Pace::new(Rate::per_second(2)?);
//! let source: std::net::IpAddr = [192, 0, 2, 7].into();
//!
//! let mut held = pace::all()
//!     .with(&per_source, &source)
//!     .with(&per_client, "client-7")
//!     .reserve()
//!     .expect("both buckets are full");
//! // The client id was not valid: that presentation does not spend it.
//! held.refund(1);
//! drop(held); // keeps the per-source debit
//! assert_eq!(per_source.peek(&source), 9);
//! assert_eq!(per_client.peek("client-7"), 2);
//! # Ok::<(), pace::ConfigError>(())
//! ```

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use crate::clock::Clock;
use crate::pace::{each_in_drop, Debit, Denied, Pace, Refunded};

/// One `(limiter, key)` pair, with the key's type erased so that pairs of
/// different key types can be reserved together.
///
/// Implemented for `(&Pace<K, S, C>, &Q)` (borrowed key) and for
/// `(Arc<Pace<K, S, C>>, K)` (owned, for refunds decided later, for example
/// after a response).
pub trait Axis {
    /// Debits `n` tokens from the key's bucket ([`Pace::reserve_n`]).
    ///
    /// # Errors
    /// [`Denied`] when the bucket lacks the tokens; nothing is written then.
    fn reserve_n(&self, n: u64) -> Result<Debit, Denied>;

    /// Refunds a debit this pair made ([`Pace::refund`]).
    fn refund(&self, debit: Debit) -> Refunded;

    /// Whole tokens the key could reserve now ([`Pace::peek`]).
    fn peek(&self) -> u64;

    /// Holds `n` tokens of the key ([`Pace::hold_n`]), as a detached
    /// [`Debit`] for [`keep`](Axis::keep) or [`refund`](Axis::refund).
    /// Defaults to [`reserve_n`](Axis::reserve_n).
    ///
    /// # Errors
    /// [`Denied`] when the bucket lacks the tokens; nothing is written then.
    fn hold_n(&self, n: u64) -> Result<Debit, Denied> {
        self.reserve_n(n)
    }

    /// Keeps a debit of [`hold_n`](Axis::hold_n) ([`Pace::keep`]); a plain
    /// debit is kept already (the default does nothing).
    fn keep(&self, debit: Debit) -> bool {
        let _kept = debit;
        false
    }
}

impl<K, Q, S, C> Axis for (&Pace<K, S, C>, &Q)
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    S: BuildHasher,
    C: Clock,
{
    fn reserve_n(&self, n: u64) -> Result<Debit, Denied> {
        self.0.reserve_n(self.1, n).map(|r| r.detach())
    }

    fn refund(&self, debit: Debit) -> Refunded {
        self.0.refund(self.1, debit)
    }

    fn peek(&self) -> u64 {
        self.0.peek(self.1)
    }

    fn hold_n(&self, n: u64) -> Result<Debit, Denied> {
        self.0.hold_n(self.1, n).map(|h| h.detach())
    }

    fn keep(&self, debit: Debit) -> bool {
        self.0.keep(self.1, debit)
    }
}

impl<K, S, C> Axis for (Arc<Pace<K, S, C>>, K)
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
    C: Clock,
{
    fn reserve_n(&self, n: u64) -> Result<Debit, Denied> {
        self.0.reserve_n(&self.1, n).map(|r| r.detach())
    }

    fn refund(&self, debit: Debit) -> Refunded {
        self.0.refund(&self.1, debit)
    }

    fn peek(&self) -> u64 {
        self.0.peek(&self.1)
    }

    fn hold_n(&self, n: u64) -> Result<Debit, Denied> {
        self.0.hold_n(&self.1, n).map(|h| h.detach())
    }

    fn keep(&self, debit: Debit) -> bool {
        self.0.keep(&self.1, debit)
    }
}

/// A boxed [`Axis`] as [`All`] holds it.
pub type BoxAxis<'a> = Box<dyn Axis + Send + 'a>;

/// Starts an all-or-nothing reservation over several limits (see the
/// [module documentation](mod@crate::all)).
pub fn all<'a>() -> All<'a> {
    All { axes: Vec::new() }
}

/// The pairs to reserve, in order (built by [`all`]).
#[must_use = "All does nothing until reserve() is called"]
pub struct All<'a> {
    axes: Vec<(BoxAxis<'a>, u64)>,
}

impl<'a> All<'a> {
    /// Adds `key` on `pace`, one token.
    pub fn with<K, Q, S, C>(self, pace: &'a Pace<K, S, C>, key: &'a Q) -> Self
    where
        K: Hash + Eq + Borrow<Q> + Send + Sync,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K> + Sync,
        S: BuildHasher + Sync,
        C: Clock,
    {
        self.with_n(pace, key, 1)
    }

    /// Adds `key` on `pace`, `n` tokens.
    pub fn with_n<K, Q, S, C>(self, pace: &'a Pace<K, S, C>, key: &'a Q, n: u64) -> Self
    where
        K: Hash + Eq + Borrow<Q> + Send + Sync,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K> + Sync,
        S: BuildHasher + Sync,
        C: Clock,
    {
        self.axis(Box::new((pace, key)), n)
    }

    /// Adds any [`Axis`], `n` tokens (for example an owned
    /// `(Arc<Pace<K>>, K)` pair).
    pub fn axis(mut self, axis: BoxAxis<'a>, n: u64) -> Self {
        self.axes.push((axis, n));
        self
    }

    /// Number of pairs added.
    pub fn len(&self) -> usize {
        self.axes.len()
    }

    /// True when no pair was added (reserving then always succeeds).
    pub fn is_empty(&self) -> bool {
        self.axes.is_empty()
    }

    /// Reserves every pair in the order added, or none.
    ///
    /// # Errors
    /// The FIRST denial, with the index of the pair that denied; the pairs
    /// before it are refunded (newest first) before this returns, the pairs
    /// after it are not touched. When several limits are exhausted,
    /// [`Denied::retry_after`] is therefore the wait of the first of them in
    /// order: a lower bound of the wait until all of them would admit.
    ///
    /// A pair whose key's `Hash` or `Eq` panics fails the call with that
    /// panic; the pairs held before it are refunded on the way out.
    pub fn reserve(self) -> Result<AllReservation<'a>, AllDenied> {
        let mut held = Pending(Vec::with_capacity(self.axes.len()));
        for (index, (axis, n)) in self.axes.into_iter().enumerate() {
            match axis.hold_n(n) {
                Ok(debit) => held.0.push((axis, Some(debit))),
                Err(_) if denial_ignored(index) => held.0.push((axis, None)),
                Err(denied) => {
                    drop(held);
                    return Err(AllDenied { index, denied });
                }
            }
        }
        Ok(AllReservation {
            held: std::mem::take(&mut held.0),
        })
    }
}

/// The pairs an [`All::reserve`] has held so far: given back when it ends
/// without reserving them all, by a denial or by a key's panic.
struct Pending<'a>(Vec<(BoxAxis<'a>, Option<Debit>)>);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.0));
    }
}

/// Whether a denial by pair `index` is passed over: never.
#[cfg(not(pace_mutant = "all_first_only"))]
#[inline]
fn denial_ignored(_index: usize) -> bool {
    false
}

/// Known-wrong variant `all_first_only`: only the first pair's denial
/// counts.
#[cfg(pace_mutant = "all_first_only")]
fn denial_ignored(index: usize) -> bool {
    index > 0
}

/// Refunds the pairs held before a denial, newest first (each whatever
/// the others did: a key's panic is resumed after all, `each_in_drop`).
#[cfg(not(any(pace_mutant = "all_no_refund", pace_mutant = "all_refund_oldest_first")))]
fn give_back(held: Vec<(BoxAxis<'_>, Option<Debit>)>) {
    each_in_drop(held.into_iter().rev(), |(axis, debit)| {
        if let Some(debit) = debit {
            axis.refund(debit);
        }
    });
}

/// Known-wrong variant `all_refund_oldest_first`: the pairs are refunded
/// oldest first.
#[cfg(pace_mutant = "all_refund_oldest_first")]
fn give_back(held: Vec<(BoxAxis<'_>, Option<Debit>)>) {
    for (axis, debit) in held {
        if let Some(debit) = debit {
            axis.refund(debit);
        }
    }
}

/// Known-wrong variant `all_no_refund`: the pairs before a denial keep
/// their debits.
#[cfg(pace_mutant = "all_no_refund")]
fn give_back(held: Vec<(BoxAxis<'_>, Option<Debit>)>) {
    drop(held);
}

impl fmt::Debug for All<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("All")
            .field("pairs", &self.axes.len())
            .finish()
    }
}

/// A denied [`All::reserve`]: which pair denied and why. Nothing it reserved
/// before the denial is kept beyond what the refund rule keeps (see the
/// [module documentation](mod@crate::all)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllDenied {
    /// Index (in the order added) of the pair that denied.
    pub index: usize,
    /// Its denial.
    pub denied: Denied,
}

impl fmt::Display for AllDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "limit {} denied: {}", self.index, self.denied)
    }
}

impl std::error::Error for AllDenied {}

/// Every pair of an [`All`] reserved (held). Dropping it keeps every debit
/// that was not refunded. It owns (or borrows, for `'a`) its pairs, so refunds can be
/// decided later, pair by pair. Not `#[must_use]`, as
/// [`Reservation`](crate::Reservation): dropping it is how its debits are
/// kept.
pub struct AllReservation<'a> {
    held: Vec<(BoxAxis<'a>, Option<Debit>)>,
}

impl AllReservation<'_> {
    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// True when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Tokens pair `index` holds: what it debited, 0 once refunded (or when
    /// `index` is out of range).
    pub fn tokens(&self, index: usize) -> u64 {
        self.held
            .get(index)
            .and_then(|(_, d)| d.as_ref())
            .map_or(0, Debit::tokens)
    }

    /// Whole tokens pair `index`'s key could reserve now (`None` when
    /// `index` is out of range).
    pub fn peek(&self, index: usize) -> Option<u64> {
        self.held.get(index).map(|(axis, _)| axis.peek())
    }

    /// Refunds pair `index` (see [`Reservation::refund`](crate::Reservation::refund)
    /// for what a refund returns). Returns false when `index` is out of
    /// range or the pair was already refunded; nothing happens then.
    pub fn refund(&mut self, index: usize) -> bool {
        match self.held.get_mut(index) {
            Some((axis, debit)) => match debit.take() {
                Some(d) => {
                    axis.refund(d);
                    true
                }
                None => false,
            },
            None => false,
        }
    }

    /// Refunds every pair for which `f(index)` is true, newest first, and
    /// keeps the others.
    pub fn refund_where(mut self, mut f: impl FnMut(usize) -> bool) {
        for index in (0..self.held.len()).rev() {
            if f(index) {
                self.refund(index);
            }
        }
    }

    /// Refunds every pair, newest first.
    pub fn refund_all(self) {
        self.refund_where(|_| true)
    }
}

impl Drop for AllReservation<'_> {
    fn drop(&mut self) {
        // Each pair is kept whatever the others' keys do, also while the
        // thread unwinds (`each_in_drop`).
        each_in_drop(self.held.drain(..), |(axis, debit)| {
            if let Some(d) = debit {
                axis.keep(d);
            }
        });
    }
}

impl fmt::Debug for AllReservation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tokens: Vec<u64> = (0..self.held.len()).map(|i| self.tokens(i)).collect();
        f.debug_struct("AllReservation")
            .field("tokens", &tokens)
            .finish()
    }
}
