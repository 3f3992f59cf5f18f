//! `PaceInternals`: explicit-time entry points and probes (feature `__internals`).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use super::{Debit, Denied, Hold, Pace, Refunded, Reservation, Turned};
use crate::clock::Clock;
use crate::rate::Quota;

/// Explicit-time entry points and state probes of [`Pace`], for models, fuzz
/// targets, benchmarks and tests: `use pace::internals::PaceInternals;`.
/// Feature `__internals`: not a stable API.
#[cfg(feature = "__internals")]
pub trait PaceInternals<K, S, C> {
    /// [`Pace::reserve_n`] deciding with `now` instead of a clock reading.
    fn reserve_n_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        now: u64,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>;
    /// [`Pace::reserve_n_with`] deciding with `now` instead of a clock
    /// reading.
    fn reserve_n_with_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Quota,
        now: u64,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>;
    /// The reservation of [`Pace::acquire_n_with_blocking`] (a slot up to `max_wait_ns`
    /// ahead) decided with `now`, and its slot (ns): the caller is let
    /// through when the clock reaches it. No sleep.
    fn reserve_turn_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        max_wait_ns: u64,
        now: u64,
    ) -> Result<Turned<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>;
    /// [`Pace::hold_n_with`] (the default quota for `None`) deciding with
    /// `now`.
    fn hold_n_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        now: u64,
    ) -> Result<Hold<'a, K, Q, S, C>, Denied>
    where
        K: Hash + Eq + Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        S: BuildHasher,
        C: Clock;
    /// [`Pace::hold_while`] deciding its hold with `now`.
    fn hold_while_at<Q, T, E>(
        &self,
        key: &Q,
        n: u64,
        now: u64,
        decide: impl FnOnce(&Debit) -> Result<T, E>,
    ) -> Result<Result<T, E>, Denied>
    where
        K: Hash + Eq + Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        S: BuildHasher,
        C: Clock;
    /// [`Hold::keep`] (`keep`) or [`Hold::refund`] at `now`: a keep answers
    /// `Nothing` when it settled, `Expired` when the hold had expired.
    fn resolve_at<Q>(hold: Hold<'_, K, Q, S, C>, keep: bool, now: u64) -> Refunded
    where
        K: Hash + Eq + Borrow<Q>,
        Q: ?Sized + Hash + Eq,
        S: BuildHasher,
        C: Clock;
    /// The held tokens (ns of refill) of `key`'s row, if it has one.
    fn row_held<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq;
    /// [`Pace::peek`] at `now`.
    fn peek_at<Q>(&self, key: &Q, now: u64) -> u64
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq;
    /// [`Pace::refund`] at `now`.
    fn refund_at<Q>(&self, key: &Q, debit: Debit, now: u64) -> Refunded
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq;
    /// [`Pace::sweep`] at `now`.
    fn sweep_at(&self, now: u64) -> usize;
    /// A whole automatic sweep pass at `now` (as calls run it a chunk at a
    /// time): full rows go dormant, dormant cells past their retention go.
    fn pass_at(&self, now: u64);
    /// Dormant cells: keys whose full rows a pass put to sleep (not rows).
    fn dormant_cells(&self) -> usize;
    /// From now on, passes put every full row within its retention to sleep
    /// (dormant cells), whether or not the table's clients come back.
    fn force_dormancy(&self);
    /// From now on, passes remove every full row, as if no client ever
    /// came back (for models that predict `len` from the rows full at each
    /// pass: left to itself, a table whose clients come back keeps quiet
    /// full rows as rows).
    fn force_removal(&self);
    /// The raw bucket word (`tat`, ns) of `key`'s row, if it has one.
    fn row_tat<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq;
    /// The stripe of floors `key` shares with other keys (`usize::MAX` for a
    /// word-sized key given as a borrowed form other than its own type).
    fn floor_stripe<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq;
    /// Keys of the rows held now; only when no other operation is in flight.
    fn row_keys(&self) -> Vec<K>
    where
        K: Clone;
    /// Migrations of the table started since it was made.
    fn migrations(&self) -> usize;
    /// Whether a migration is running (callers copy its chunks).
    fn migrating(&self) -> bool;
    /// Cells of the array new rows go to: the current array, or the target
    /// of a running migration.
    fn slots(&self) -> usize;
    /// Cells of the chunks migrations have copied since the limiter was made.
    fn copied_slots(&self) -> usize;
    /// Full rows that calls' shares of migrations have removed instead of
    /// copying them, since the limiter was made (the copies a sweep pass
    /// makes count as the pass's removals, not here).
    fn copy_removed(&self) -> usize;
    /// Whether cells hold the keys' own bits (word-sized keys), not boxed keys.
    fn inline_keys(&self) -> bool;
}

#[cfg(feature = "__internals")]
impl<K, S, C> PaceInternals<K, S, C> for Pace<K, S, C>
where
    K: Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    fn reserve_n_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        now: u64,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.reserve_n_at_inner(key, n, None, now)
    }

    fn reserve_n_with_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Quota,
        now: u64,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.reserve_n_at_inner(key, n, Some(quota), now)
    }

    fn reserve_turn_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        max_wait_ns: u64,
        now: u64,
    ) -> Result<Turned<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.reserve_turn_clocked(key, n, quota, max_wait_ns, || now)
    }

    fn hold_while_at<Q, T, E>(
        &self,
        key: &Q,
        n: u64,
        now: u64,
        decide: impl FnOnce(&Debit) -> Result<T, E>,
    ) -> Result<Result<T, E>, Denied>
    where
        K: Hash + Eq + Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        S: BuildHasher,
        C: Clock,
    {
        self.hold_while_inner(key, n, || now, decide)
    }

    fn hold_n_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        now: u64,
    ) -> Result<Hold<'a, K, Q, S, C>, Denied>
    where
        K: Hash + Eq + Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        S: BuildHasher,
        C: Clock,
    {
        self.hold_n_at_inner(key, n, quota, now)
    }

    fn resolve_at<Q>(hold: Hold<'_, K, Q, S, C>, keep: bool, now: u64) -> Refunded
    where
        K: Hash + Eq + Borrow<Q>,
        Q: ?Sized + Hash + Eq,
        S: BuildHasher,
        C: Clock,
    {
        hold.resolve_at_inner(keep, now)
    }

    fn row_held<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let hash = self.hash_key(key);
        let guard = self.pin();
        let t = &self.rows.table;
        with_probe!(self.rows, key, hash, &guard, |p| t
            .peek(hash, p, None, &guard)
            .map(|s| s.held()))
    }

    fn peek_at<Q>(&self, key: &Q, now: u64) -> u64
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.peek_at_inner(key, None, now)
    }

    fn refund_at<Q>(&self, key: &Q, debit: Debit, now: u64) -> Refunded
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.refund_at_inner(key, debit, now)
    }

    fn migrations(&self) -> usize {
        self.rows.table.migrations()
    }

    fn migrating(&self) -> bool {
        self.rows.table.migrating(&self.pin())
    }

    fn slots(&self) -> usize {
        self.memory().slots
    }

    fn copied_slots(&self) -> usize {
        self.rows.table.copied_cells()
    }

    fn copy_removed(&self) -> usize {
        self.rows.table.copy_removed()
    }

    fn inline_keys(&self) -> bool {
        self.rows.word.is_some()
    }

    fn sweep_at(&self, now: u64) -> usize {
        self.sweep_at_inner(now)
    }

    fn pass_at(&self, now: u64) {
        self.pass_at_inner(now)
    }

    fn dormant_cells(&self) -> usize {
        self.dormant_inner()
    }

    fn force_dormancy(&self) {
        self.force_dormancy_inner()
    }

    fn force_removal(&self) {
        self.rows.table.force_removal()
    }

    fn row_tat<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.row_tat_inner(key)
    }

    fn floor_stripe<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.floor_stripe_inner(key)
    }

    fn row_keys(&self) -> Vec<K>
    where
        K: Clone,
    {
        self.row_keys_inner()
    }
}

/// Explicit-time refund and the debit's end, for models. Feature
/// `__internals`: not a stable API.
#[cfg(feature = "__internals")]
pub trait ReservationInternals {
    /// [`Reservation::refund`] at `now`.
    fn refund_at(self, now: u64) -> Refunded;
    /// Where this debit ends on the bucket's timeline (ns).
    fn debit_end_ns(&self) -> u64;
    /// The bucket's `tat` before this debit (ns): the debit cost
    /// `end − max(prev, reading)`.
    fn debit_prev_ns(&self) -> u64;
}

#[cfg(feature = "__internals")]
impl<K, Q, S, C> ReservationInternals for Reservation<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    fn refund_at(self, now: u64) -> Refunded {
        self.refund_at_inner(now)
    }

    fn debit_end_ns(&self) -> u64 {
        self.debit_end_ns_inner()
    }

    fn debit_prev_ns(&self) -> u64 {
        match self.debit.taken {
            crate::table::Taken::Debit { prev, .. } => prev,
            crate::table::Taken::Hold(t) => t.cost,
        }
    }
}
