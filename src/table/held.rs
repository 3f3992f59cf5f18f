//! Holds: tokens a row keeps apart while a presentation is being checked
//! (DESIGN.md §3, "Holds"), so that refunding them is exact in any order.
//!
//! A row is *plain* (its word is its settled `tat`) or *held*: its word's
//! `tat` field is [`HELD`] plus the address of an immutable [`Held`]
//! record (settled `tat` and up to two lots of held tokens). Every `tat`
//! the bucket arithmetic produces is at most `MAX_TIME < HELD`, so a held
//! row reads, to everything that only moves rows (probes, checks, copies,
//! cleans, sweeps), as a live row that is not full: nothing removes it and
//! a copy moves its address. Only the decisions look inside
//! ([`Held::of`]), and every change of a held row replaces its record with
//! one CAS of the cell; the replaced record goes through the epoch as a key
//! box does (`keys.rs`: retired from the current array, adopted by the
//! source from a migration's target).
//!
//! # Lots and the hold limit
//! Holds are grouped in lots, each with an identity no other lot of the
//! table ever has. A hold joins the current lot while that lot is younger
//! than the hold limit `P` (by the readings of the calls that see it),
//! else opens a new one; the older lot waits beside it. A lot whose
//! opening is `2P` behind a call's reading expires: its tokens are settled
//! as if kept, from the latest reading among its holds, which is never
//! below any of theirs. A hold resolved within `P` of its reading is
//! therefore found in its lot and resolved exactly; a hold never resolved
//! counts as held for at most `2P`, then as kept; and a resolution whose
//! lot is gone does nothing ([`Resolution::Expired`]).

use crate::bucket::{Decision, Limits, MAX_TIME};
use crate::sync::epoch::Guard;

/// A `tat` field at or above this names a [`Held`] record: `HELD | address`.
pub(crate) const HELD: u64 = MAX_TIME + 1;

/// Lot identity of an empty lot.
const NONE: u64 = 0;

/// A lot of holds: `cost` ns of tokens held by the unresolved holds that
/// joined it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Lot {
    /// Its identity, unique in the table (`NONE` when empty).
    pub(crate) id: u64,
    /// Σ n·T of its unresolved holds (positive unless empty).
    pub(crate) cost: u64,
    /// The reading that opened it.
    pub(crate) since: u64,
    /// The latest reading among the holds that joined it.
    pub(crate) latest: u64,
}

impl Lot {
    pub(crate) const EMPTY: Lot = Lot {
        id: NONE,
        cost: 0,
        since: 0,
        latest: 0,
    };

    fn is_empty(&self) -> bool {
        self.id == NONE
    }

    /// Settles this lot into `tat` as kept, from its latest reading.
    fn settle(&self, tat: u64) -> u64 {
        settle(tat, self.latest, self.cost)
    }
}

/// A kept debit of `cost` decided at reading `at`, applied to `tat`. At
/// the end of the time space it stays at `MAX_TIME`, where every decision
/// is `TimeExhausted` (so a settled `tat` is never read as a record).
#[cfg(not(pace_mutant = "settle_unclamped"))]
fn settle(tat: u64, at: u64, cost: u64) -> u64 {
    tat.max(at).saturating_add(cost).min(MAX_TIME)
}

/// Known-wrong variant `settle_unclamped`: a kept hold is added to the
/// settled `tat` without the clamp at its own reading, so a hold kept
/// after its bucket refilled is settled in the past.
#[cfg(pace_mutant = "settle_unclamped")]
fn settle(tat: u64, _at: u64, cost: u64) -> u64 {
    (tat + cost).min(MAX_TIME)
}

/// Whether a debit of `n` tokens fits the bucket beside `held` ns of held
/// tokens: `held + n·T ≤ C·T`. A plain decision that admits implies it; a
/// turn (whose horizon is stretched by its wait) needs it, or no instant
/// while the tokens are held is one where its debit fits (`n ≤ C` is
/// checked before).
#[cfg(not(pace_mutant = "turn_beside_too_many_held"))]
#[inline]
fn fits_beside(held: u64, limits: &Limits, n: u64) -> bool {
    held == 0 || held <= (limits.capacity() - n) * limits.interval()
}

/// Known-wrong variant `turn_beside_too_many_held`: a turn is placed after
/// held tokens that leave no room for it in the bucket.
#[cfg(pace_mutant = "turn_beside_too_many_held")]
#[inline]
fn fits_beside(_held: u64, _limits: &Limits, _n: u64) -> bool {
    true
}

/// The settled `tat` after a refund of `cost` held: unchanged (a refund
/// only takes its tokens off their lot).
#[cfg(not(pace_mutant = "refund_rewinds_tat"))]
#[inline]
fn refunded(tat: u64, _cost: u64) -> u64 {
    tat
}

/// Known-wrong variant `refund_rewinds_tat`: a refund also takes its cost
/// off the settled `tat`, returning tokens that other debits settled.
#[cfg(pace_mutant = "refund_rewinds_tat")]
fn refunded(tat: u64, cost: u64) -> u64 {
    tat.saturating_sub(cost)
}

/// Where a fresh lot opened at reading `now` starts, beside the previous
/// lot `prev`: at `now`, but never less than `limit` after `prev` opened.
/// The fresh lot turns previous, settling `prev`, only at a reading `limit`
/// after its own start, so never before `prev` expires by itself (`2·limit`
/// after it opened). A reading older than the previous lot's opening plus
/// `limit` (a thread pre-empted after its reading) would otherwise open a
/// lot in the past, whose turn would settle `prev` early: a hold of `prev`
/// resolved within `limit` of its reading would find its lot gone.
#[cfg(not(pace_mutant = "stale_lot_opens_in_the_past"))]
#[inline]
fn opening(now: u64, prev: &Lot, limit: u64) -> u64 {
    if prev.is_empty() {
        now
    } else {
        now.max(prev.since.saturating_add(limit))
    }
}

/// Known-wrong variant `stale_lot_opens_in_the_past`: a fresh lot starts at
/// its reading, however stale, and its turn settles the previous lot early.
#[cfg(pace_mutant = "stale_lot_opens_in_the_past")]
#[inline]
fn opening(now: u64, _prev: &Lot, _limit: u64) -> u64 {
    now
}

/// What a hold took: its lot, its cost and its reading. A resolution
/// carries it back to the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) lot: u64,
    pub(crate) cost: u64,
    pub(crate) at: u64,
}

impl Ticket {
    /// The ticket of lot `lot` (none for 0: a plain debit).
    pub(crate) fn unpack(lot: u64, cost: u64, at: u64) -> Option<Ticket> {
        (lot != NONE).then_some(Ticket { lot, cost, at })
    }
}

/// A row's state: settled `tat` and its lots. Plain when both are empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) tat: u64,
    pub(crate) cur: Lot,
    pub(crate) prev: Lot,
}

/// How a resolution went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// Its lot was found: this is the new state.
    Done(Held),
    /// Its lot expired (settled as kept) or the row went: nothing to do.
    Expired,
}

impl Held {
    /// A plain row at `tat`.
    pub(crate) fn plain(tat: u64) -> Held {
        Held {
            tat,
            cur: Lot::EMPTY,
            prev: Lot::EMPTY,
        }
    }

    /// Tokens held, in ns of refill.
    pub(crate) fn held(&self) -> u64 {
        self.cur.cost + self.prev.cost
    }

    /// The held tokens a decision counts: all of them.
    #[cfg(not(pace_mutant = "decision_ignores_held"))]
    #[inline]
    fn held_in_decision(&self) -> u64 {
        self.held()
    }

    /// Known-wrong variant `decision_ignores_held`: a decision counts no
    /// held token.
    #[cfg(pace_mutant = "decision_ignores_held")]
    fn held_in_decision(&self) -> u64 {
        0
    }

    pub(crate) fn is_plain(&self) -> bool {
        self.cur.is_empty() && self.prev.is_empty()
    }

    /// The state of a row whose `tat` field is `field`.
    ///
    /// # Safety
    /// `field` was read under `guard` from a live (or frozen live) cell of
    /// a table, whose records outlive the guards that can read them.
    #[inline]
    pub(crate) unsafe fn of(field: u64, _guard: &Guard) -> Held {
        if field < HELD {
            return Held::plain(field);
        }
        let p = std::ptr::with_exposed_provenance::<Held>((field - HELD) as usize);
        // SAFETY: a field at or above `HELD` is `HELD` plus the address of
        // a record made by `publish` and published by a CAS; the caller's
        // contract keeps it alive while `guard` is pinned, and records are
        // never written after publication.
        unsafe { *p }
    }

    /// This state as a `tat` field: its `tat` when plain, else a new
    /// record's address (owned by the caller until a CAS publishes it;
    /// [`free`] it otherwise).
    pub(crate) fn publish(self) -> u64 {
        if self.is_plain() {
            return self.tat;
        }
        let addr = Box::into_raw(pool::take(self)).expose_provenance() as u64;
        debug_assert!(addr < HELD, "a record's address fits below the held tag");
        HELD + addr
    }

    /// The state at reading `now` with the hold limit `limit`: lots whose
    /// opening is `2·limit` behind `now` are settled as kept, and a current
    /// lot older than `limit` becomes the previous one (a previous lot that
    /// is still there is settled first: it can only be younger than `2·limit`
    /// when readings went backwards).
    #[cfg(not(pace_mutant = "holds_never_expire"))]
    pub(crate) fn at(mut self, now: u64, limit: u64) -> Held {
        let expired = |l: &Lot| !l.is_empty() && now >= l.since.saturating_add(2 * limit);
        if expired(&self.prev) {
            self.tat = self.prev.settle(self.tat);
            self.prev = Lot::EMPTY;
        }
        if expired(&self.cur) {
            self.tat = self.cur.settle(self.tat);
            self.cur = Lot::EMPTY;
        }
        if !self.cur.is_empty() && now >= self.cur.since.saturating_add(limit) {
            if !self.prev.is_empty() {
                self.tat = self.prev.settle(self.tat);
            }
            self.prev = self.cur;
            self.cur = Lot::EMPTY;
        }
        self
    }

    /// Known-wrong variant `holds_never_expire`: no lot ever expires, so a
    /// leaked hold keeps its tokens and its row for good.
    #[cfg(pace_mutant = "holds_never_expire")]
    pub(crate) fn at(self, _: u64, _: u64) -> Held {
        self
    }

    /// The decision on `n` more tokens at `now`: admitted iff
    /// `max(tat, now) + held + n·T ≤ now + τ` and `held + n·T ≤ C·T` (the
    /// second follows from the first unless `limits` wait for a turn, whose
    /// `τ` is stretched: a turn beside held tokens must be a decision of
    /// the bucket at its slot, DESIGN.md §3). `Ok` carries the `tat` a debit
    /// of them would settle at. A denial while tokens are held is
    /// [`Decision::Held`], with the wait if they are kept.
    pub(crate) fn decide(&self, limits: &Limits, now: u64, n: u64) -> Result<u64, Decision> {
        let held = self.held_in_decision();
        // A reading may be anything: saturate (past MAX_TIME every decision
        // is `TimeExhausted`).
        let base = self.tat.max(now).saturating_add(held);
        match limits.reserve(base, now, n) {
            Decision::Admit(t) if fits_beside(held, limits, n) => Ok(t - held),
            Decision::Admit(_) | Decision::Wait(_) if held > 0 => {
                Err(self.held_denial(limits, now, n))
            }
            d => Err(d),
        }
    }

    /// A denial while tokens are held: the whole wait until `n` tokens
    /// would fit the bucket (its own horizon `C·T`, not a turn's stretched
    /// one) if every held token were kept, that is settled as its lot
    /// settles when it expires (from the latest reading among the lot's
    /// holds). Refunded sooner, the tokens come back sooner; still held
    /// then, they are still in the way.
    #[cold]
    fn held_denial(&self, limits: &Limits, now: u64, n: u64) -> Decision {
        let kept = self.cur.settle(self.prev.settle(self.tat));
        let tau = limits.capacity() * limits.interval();
        let end = kept.max(now).saturating_add(n * limits.interval());
        Decision::Held(end.saturating_sub(now.saturating_add(tau)))
    }

    /// A plain debit of `n` tokens at `now`: the new state.
    pub(crate) fn debit(self, limits: &Limits, now: u64, n: u64) -> Result<Held, Decision> {
        let tat = self.decide(limits, now, n)?;
        Ok(Held { tat, ..self })
    }

    /// A hold of `n` tokens at `now` (after [`at`](Held::at) with the hold
    /// limit `limit`): the new state and its ticket. `new_lot` gives a fresh
    /// lot identity.
    #[inline]
    pub(crate) fn hold(
        self,
        limits: &Limits,
        now: u64,
        n: u64,
        limit: u64,
        new_lot: &dyn Fn() -> u64,
    ) -> Result<(Held, Ticket), Decision> {
        self.decide(limits, now, n)?;
        let cost = n * limits.interval();
        let mut next = self;
        if next.cur.is_empty() {
            next.cur = Lot {
                id: new_lot(),
                cost: 0,
                since: opening(now, &self.prev, limit),
                latest: now,
            };
        }
        next.cur.cost += cost;
        next.cur.latest = next.cur.latest.max(now);
        let ticket = Ticket {
            lot: next.cur.id,
            cost,
            at: now,
        };
        Ok((next, ticket))
    }

    /// Resolves `ticket`: its tokens leave its lot, and if `keep`, they are
    /// settled as a debit from the hold's own reading.
    pub(crate) fn resolve(self, ticket: Ticket, keep: bool) -> Resolution {
        let mut next = self;
        let lot = if self.cur.id == ticket.lot && ticket.lot != NONE {
            &mut next.cur
        } else if self.prev.id == ticket.lot && ticket.lot != NONE {
            &mut next.prev
        } else {
            return Resolution::Expired;
        };
        debug_assert!(lot.cost >= ticket.cost);
        lot.cost = lot.cost.saturating_sub(ticket.cost);
        if lot.cost == 0 {
            *lot = Lot::EMPTY;
        }
        next.tat = if keep {
            settle(next.tat, ticket.at, ticket.cost)
        } else {
            refunded(next.tat, ticket.cost)
        };
        Resolution::Done(next)
    }

    /// The `tat` a reader of tokens sees at `now`: held tokens count as
    /// debited at `now`.
    pub(crate) fn effective(&self, now: u64) -> u64 {
        if self.is_plain() {
            self.tat
        } else {
            self.tat.max(now).saturating_add(self.held())
        }
    }
}

/// Frees the record named by the `tat` field `field`, if it names one.
///
/// # Safety
/// `field` came from [`Held::publish`], and the record is in no cell a
/// reader can reach (never published, or replaced and past every guard
/// that could read it), freed once.
pub(crate) unsafe fn free(field: u64) {
    if let Some(addr) = address(field) {
        // SAFETY: the caller's contract.
        unsafe { free_at(addr) };
    }
}

/// The address of the record a `tat` field names, if it names one: what a
/// retirement keeps (a plain address, which a conservative leak checker
/// scanning the collector's garbage recognises).
pub(crate) fn address(field: u64) -> Option<u64> {
    (field >= HELD).then(|| field - HELD)
}

/// Frees the record at `addr` ([`address`] of a published field).
///
/// # Safety
/// As for [`free`].
pub(crate) unsafe fn free_at(addr: u64) {
    let p = std::ptr::with_exposed_provenance_mut::<Held>(addr as usize);
    // SAFETY: the caller's contract; `publish` made it with `Box::into_raw`.
    pool::give(unsafe { Box::from_raw(p) });
}

/// Records a thread keeps for its next holds, so that a hold whose record
/// is freed by the time the next one comes allocates nothing: a freed
/// record goes to the pool of the thread that frees it (the one whose pin
/// runs the epoch's deferred frees), up to [`pool::KEPT`] of them, and
/// [`publish`](Held::publish) takes one from its thread's pool before it
/// allocates. A pooled record is reused only after it was freed, that is
/// after every guard that could read it; that is when the allocator could
/// hand its memory out again too. Records in a pool are freed when their
/// thread exits. (Under loom every record comes from the allocator.)
#[cfg(not(loom))]
mod pool {
    use super::Held;
    use std::cell::RefCell;

    /// Records kept per thread (72 bytes each): more than the collector
    /// frees in one batch, so that a steady stream of holds never runs dry.
    pub(super) const KEPT: usize = 128;
    const _: () = assert!(std::mem::size_of::<Held>() == 72);

    std::thread_local! {
        // The boxes are the records: their addresses are what rows name.
        #[allow(clippy::vec_box)]
        static FREE: RefCell<Vec<Box<Held>>> = const { RefCell::new(Vec::new()) };
    }

    /// A box holding `h`: a pooled one if the thread has one.
    #[inline]
    pub(super) fn take(h: Held) -> Box<Held> {
        let pooled = FREE
            .try_with(|f| f.try_borrow_mut().ok().and_then(|mut f| f.pop()))
            .ok()
            .flatten();
        match pooled {
            Some(mut b) => {
                *b = h;
                b
            }
            None => Box::new(h),
        }
    }

    /// Pools `b`, or frees it when the pool is full (or the thread's
    /// storage is gone: a deferred free run while the thread exits).
    #[inline]
    pub(super) fn give(b: Box<Held>) {
        let mut b = Some(b);
        let _ = FREE.try_with(|f| {
            if let Ok(mut f) = f.try_borrow_mut() {
                if f.len() < KEPT {
                    if f.capacity() == 0 {
                        f.reserve_exact(KEPT);
                    }
                    f.extend(b.take());
                }
            }
        });
    }
}

#[cfg(loom)]
mod pool {
    use super::Held;

    pub(super) fn take(h: Held) -> Box<Held> {
        Box::new(h)
    }

    pub(super) fn give(b: Box<Held>) {
        drop(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 10;

    fn lim(cap: u64) -> Limits {
        Limits::new(T, cap).unwrap()
    }

    #[test]
    fn a_refund_in_any_order_returns_the_tokens() {
        let l = lim(3);
        let ids = std::cell::Cell::new(0);
        let next = || {
            ids.set(ids.get() + 1);
            ids.get()
        };
        let s = Held::plain(0);
        let (s, a) = s.hold(&l, 100, 1, u64::MAX, &next).unwrap();
        let (s, b) = s.hold(&l, 100, 1, u64::MAX, &next).unwrap();
        let (s, c) = s.hold(&l, 100, 1, u64::MAX, &next).unwrap();
        assert_eq!(s.decide(&l, 100, 1), Err(Decision::Held(T)));
        let Resolution::Done(s) = s.resolve(a, false) else {
            panic!()
        };
        let Resolution::Done(s) = s.resolve(c, false) else {
            panic!()
        };
        let Resolution::Done(s) = s.resolve(b, false) else {
            panic!()
        };
        assert_eq!(s, Held::plain(0));
        assert_eq!(s.publish(), 0);
    }

    #[test]
    fn keeping_settles_from_the_holds_reading() {
        let l = lim(3);
        let s = Held::plain(0);
        let (s, a) = s.hold(&l, 100, 2, u64::MAX, &|| 7).unwrap();
        let Resolution::Done(s) = s.resolve(a, true) else {
            panic!()
        };
        assert_eq!(s, Held::plain(100 + 2 * T));
    }

    #[test]
    fn a_settled_tat_stays_in_the_time_space() {
        let l = lim(3);
        let s = Held::plain(MAX_TIME - 1);
        let (s, a) = s
            .hold(&l, MAX_TIME - 3 * T, 1, u64::MAX, &|| 1)
            .unwrap_or_else(|_| {
                // Denied at the edge: hold at an earlier state instead.
                Held::plain(0).hold(&l, 0, 1, u64::MAX, &|| 1).unwrap()
            });
        let late = Held { tat: MAX_TIME, ..s };
        let Resolution::Done(k) = late.resolve(a, true) else {
            panic!()
        };
        assert_eq!(k.tat, MAX_TIME);
        assert!(
            k.publish() < HELD,
            "a settled tat is never read as a record"
        );
        assert_eq!(
            Held::plain(0).decide(&l, u64::MAX, 1),
            Err(Decision::TimeExhausted)
        );
    }

    #[test]
    fn lots_expire_as_kept_and_stale_tickets_do_nothing() {
        let l = lim(3);
        let p = 1_000;
        let s = Held::plain(0);
        let (s, a) = s.hold(&l, 100, 1, p, &|| 1).unwrap();
        // Within the limit: still the current lot.
        assert_eq!(s.at(100 + p - 1, p), s);
        // Older than the limit: the previous lot, still exact.
        let s1 = s.at(100 + p, p);
        assert_eq!(s1.prev.id, 1);
        assert!(matches!(s1.resolve(a, false), Resolution::Done(x) if x.is_plain()));
        // Twice the limit: settled as kept from its reading; the ticket is stale.
        let s2 = s.at(100 + 2 * p, p);
        assert_eq!(s2, Held::plain(100 + T));
        assert_eq!(s2.resolve(a, false), Resolution::Expired);
    }
}
