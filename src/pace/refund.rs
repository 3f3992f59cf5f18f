//! Refunds and the resolution of holds.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use super::{Debit, Pace, Refunded};
#[cfg(doc)]
use super::{Hold, Reservation};
use crate::clock::Clock;
use crate::sync::epoch::Guard;
use crate::table::held::Ticket;
use crate::table::{Cx, Spent, Spot, Taken, Undone};

impl<K, S, C> Pace<K, S, C>
where
    K: Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    /// Refunds a detached [`Debit`] of `key` (see [`Reservation::refund`] for
    /// what a refund returns). A debit made by another limiter, or for a key
    /// whose hash differs from `key`'s, returns nothing
    /// ([`Refunded::Misdirected`]).
    pub fn refund<Q>(&self, key: &Q, debit: Debit) -> Refunded
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let now = self.clock.now_ns();
        self.refund_at_inner(key, debit, now)
    }

    /// [`refund`](Pace::refund) at an explicit time (for models).
    pub(crate) fn refund_at_inner<Q>(&self, key: &Q, debit: Debit, now: u64) -> Refunded
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        if debit.n == 0 {
            return Refunded::Nothing;
        }
        // A hold's ticket names the row it was made on (`held::Ticket`):
        // handed to another key, it finds nothing there, with no second
        // hash of the key.
        if debit.is_hold() && debit.limiter == self.id {
            return self.refund_hashed(key, debit.hash, debit, now);
        }
        match self.origin(&debit, key) {
            Some(hash) => self.refund_hashed(key, hash, debit, now),
            None => Refunded::Misdirected,
        }
    }

    /// The hash to refund `debit` to `key` with: the debit's own, if this
    /// limiter made it for a key hashed as `key`; `None` otherwise.
    #[cfg(not(pace_mutant = "refund_ignores_origin"))]
    pub(super) fn origin<Q>(&self, debit: &Debit, key: &Q) -> Option<u64>
    where
        Q: ?Sized + Hash,
    {
        (debit.limiter == self.id && debit.hash == self.hash_key(key)).then_some(debit.hash)
    }

    /// Known-wrong variant for mutation tests: a debit is refunded to
    /// whatever limiter and key it is handed to, looked up by that key's
    /// hash.
    #[cfg(pace_mutant = "refund_ignores_origin")]
    pub(super) fn origin<Q>(&self, _debit: &Debit, key: &Q) -> Option<u64>
    where
        Q: ?Sized + Hash,
    {
        Some(self.hash_key(key))
    }

    /// Keeps a detached hold ([`Hold::detach`]) of `key`: its tokens are
    /// settled as a debit from the hold's reading. False when there was
    /// nothing to settle: a plain debit (kept already), a hold that expired
    /// (counted as kept), or a debit of another limiter or key.
    pub fn keep<Q>(&self, key: &Q, debit: Debit) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        // A hold's ticket names the row it was made on (`held::Ticket`):
        // handed to another key, it finds nothing there, so only the
        // limiter is checked here (no second hash of the key).
        if debit.n == 0 || !debit.is_hold() || debit.limiter != self.id {
            return false;
        }
        self.resolve_hashed(key, debit, true, self.clock.now_ns())
    }

    /// Resolves the hold `debit` of `key` (keeps or refunds it): false when
    /// its lot is gone.
    pub(super) fn resolve_hashed<Q>(&self, key: &Q, debit: Debit, keep: bool, now: u64) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let Some(ticket) = debit.ticket() else {
            return false;
        };
        let guard = self.pin();
        self.resolve_ticket(key, debit.hash, ticket, keep, now, &guard)
    }

    /// [`resolve_hashed`](Pace::resolve_hashed) under `guard`, pinned by
    /// the caller: `hold_while`, in the pin its hold was made in, which
    /// left its row at `spot`.
    #[inline(always)]
    pub(super) fn resolve_pinned<Q>(
        &self,
        key: &Q,
        debit: Debit,
        keep: bool,
        now: u64,
        spot: Spot,
        guard: &Guard,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let Some(ticket) = debit.ticket() else {
            return false;
        };
        // Where the hold left its row, if nothing changed it since.
        if let Some(r) = self.rows.table.resolve_spot(spot, ticket, keep, now, guard) {
            return r;
        }
        self.resolve_found(key, debit.hash, ticket, keep, now, guard)
    }

    /// [`resolve_ticket`](Pace::resolve_ticket), out of line.
    #[inline(never)]
    fn resolve_found<Q>(
        &self,
        key: &Q,
        hash: u64,
        ticket: Ticket,
        keep: bool,
        now: u64,
        guard: &Guard,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.resolve_ticket(key, hash, ticket, keep, now, guard)
    }

    /// Resolves `ticket` on `key` (hash `hash`) under `guard`.
    #[inline(always)]
    fn resolve_ticket<Q>(
        &self,
        key: &Q,
        hash: u64,
        ticket: Ticket,
        keep: bool,
        now: u64,
        guard: &Guard,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let t = &self.rows.table;
        // The row among its key's first cells, resolved in one try; the
        // rest (a walk, a migration, a removal) out of line.
        let first = with_probe!(self.rows, key, hash, guard, |p| t
            .resolve_first(hash, p, ticket, keep, now, guard));
        match first {
            Some(r) => r,
            None => self.resolve_rest(key, hash, ticket, keep, now, guard),
        }
    }

    /// [`resolve_hashed`](Pace::resolve_hashed) past the key's first cells.
    #[inline(never)]
    fn resolve_rest<Q>(
        &self,
        key: &Q,
        hash: u64,
        ticket: Ticket,
        keep: bool,
        now: u64,
        guard: &Guard,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let hash_of = |b| self.hash_of(b);
        let cx = &Cx::new(&hash_of, now);
        let t = &self.rows.table;
        with_probe!(self.rows, key, hash, guard, |p| t
            .resolve_rest(hash, p, ticket, keep, cx, guard))
    }

    /// Refunds `debit` to `key`, whose hash is `hash`.
    pub(super) fn refund_hashed<Q>(&self, key: &Q, hash: u64, debit: Debit, now: u64) -> Refunded
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        if debit.n == 0 {
            return Refunded::Nothing;
        }
        if debit.is_hold() {
            return if self.resolve_hashed(key, debit, false, now) {
                Refunded::Restored
            } else {
                Refunded::Expired
            };
        }
        let guard = self.pin();
        // The refund rule looks at no quota; the table takes one for its
        // known-wrong variants.
        let limits = &self.quota.load(&guard).limits();
        let hash_of = |b| self.hash_of(b);
        let cx = &Cx::new(&hash_of, now);
        let Taken::Debit { tat, prev } = debit.taken else {
            unreachable!("a hold's debit was resolved above")
        };
        let spent = Spent {
            n: debit.n,
            tat,
            prev,
        };
        let undone = with_probe!(self.rows, key, hash, &guard, |p| self
            .rows
            .table
            .refund(limits, hash, p, spent, cx, &guard));
        Refunded::from(undone)
    }
}

impl From<Undone> for Refunded {
    /// The table's outcome of a plain refund, as the limiter answers it.
    #[inline]
    fn from(undone: Undone) -> Refunded {
        match undone {
            Undone::Restored => Refunded::Restored,
            Undone::Removed => Refunded::Removed,
            Undone::Superseded => Refunded::Superseded,
            Undone::Refilled => Refunded::Refilled,
        }
    }
}
