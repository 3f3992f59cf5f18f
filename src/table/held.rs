//! Holds: tokens a row keeps apart while a presentation is being checked
//! (DESIGN.md §3, "Holds"), so that refunding them is exact in any order.
//!
//! A row is *plain* (its word is its settled `tat`) or *held*: its word's
//! `tat` field holds the whole state inline (at or above [`INLINE`]:
//! settled `tat` and up to two lots of a few tokens, [`Form`]) or, when
//! the state does not fit, [`HELD`] plus the address of an immutable
//! [`Held`] record. Every `tat` the bucket arithmetic produces is at most
//! `MAX_TIME < HELD`, so a held row reads, to everything that only moves
//! rows (probes, checks, copies, cleans, sweeps), as a live row that is not
//! full: nothing removes it and a copy moves its field. Only the decisions
//! look inside ([`Held::of`]), and every change of a held row replaces its
//! field with one CAS of the cell; a replaced record goes through the
//! epoch as a key box does (`keys.rs`: retired from the current array,
//! adopted by the source from a migration's target).
//!
//! # Lots and the hold limit
//! Holds are grouped in lots by epochs of the hold limit `P`: a lot's
//! identity is its epoch, and no two lots of a row ever share one. A call
//! at a reading of epoch `E` settles the lots of epochs up to `E − 2` as
//! kept, at the last instant of their lives, and turns a current lot of an
//! earlier epoch into the previous one; a hold joins the current lot or
//! opens one. A hold is therefore found in its lot and resolved exactly
//! unless a call read a time two epochs past its own; a hold never
//! resolved counts as held until then, and then as kept; and a resolution
//! whose lot is gone does nothing ([`Resolution::Expired`]).

use crate::bucket::{Decision, Limits, MAX_TIME};
use crate::rule;
use crate::sync::epoch::Guard;

/// A `tat` field at or above this names a held row: a [`Held`] record's
/// address plus `HELD` below [`INLINE`], the row's state itself from there.
pub(crate) const HELD: u64 = MAX_TIME + 1;

/// A `tat` field at or above this is a held row's state in the field
/// itself (`INLINE | payload`, [`Form`]), not a record's address.
pub(crate) const INLINE: u64 = 1 << 62;

/// A `tat` field in `[DORMANT, INLINE)` is a *dormant* cell's: the key of a
/// row a sweep pass found full, kept with its settled `tat` (the field minus
/// `DORMANT`) so that the key's next call revives it with one CAS (DESIGN.md
/// §4, "Dormant cells"). Record addresses stay below it (`2^60` bytes).
pub(crate) const DORMANT: u64 = HELD + (1 << 60);

/// The largest settled `tat` a dormant cell keeps (`2^60 − 1` ns, about 36
/// years of the limiter's clock): a full row past it is removed instead.
pub(crate) const DORMANT_MAX_TAT: u64 = INLINE - DORMANT - 1;

const _: () = assert!(DORMANT_MAX_TAT == (1 << 60) - 1);

/// The settled `tat` a dormant cell's field keeps, if `field` is one.
#[inline(always)]
pub(crate) fn dormant(field: u64) -> Option<u64> {
    (DORMANT..INLINE).contains(&field).then(|| field - DORMANT)
}

/// The field of a dormant cell keeping `tat`, if it fits
/// ([`DORMANT_MAX_TAT`]).
#[inline]
#[cfg_attr(pace_mutant = "no_dormancy", allow(dead_code))]
pub(crate) fn dormant_field(tat: u64) -> Option<u64> {
    (tat <= DORMANT_MAX_TAT).then(|| DORMANT + tat)
}

/// The largest inline payload: the words above `INLINE + MAX_PAYLOAD` are
/// the row states that are not live (`cell.rs`).
const MAX_PAYLOAD: u64 = super::cell::FIELD_MAX - INLINE;

/// Lot identity of an empty lot.
const NONE: u64 = 0;

/// Bits of the inline form's settled `tat`: a settled `tat` at or past
/// `2^56` ns (about 2.3 years of the limiter's clock) is kept in a record.
const S_BITS: u32 = 56;

/// Bits of one inline lot's count.
const COUNT_BITS: u32 = 2;

/// The largest payload the form writes (a settled `tat` of `2^56 − 2`, the
/// largest it keeps inline, every other bit set) is below the row states.
const _: () = assert!(
    (((1u64 << S_BITS) - 2) << (2 + 2 * COUNT_BITS)) | ((1 << (2 + 2 * COUNT_BITS)) - 1)
        <= MAX_PAYLOAD
);

/// How a table writes its held rows: the hold limit and the inline form
/// (DESIGN.md §3, "Held rows inline").
///
/// The inline payload is `[S: 56 bits][cur offset: 2][cur count: 2][prev
/// count: 2]`: the settled `tat` `S` exactly, the current lot's epoch as
/// `⌊S/P⌋ − 2 + offset`, the previous lot's as the one before it, and each
/// lot's cost as `count · T` for the interval `T` the table was built with.
/// A state that does not fit (`S ≥ 2^56`, an offset outside `0..=3`, a
/// previous lot not right before the current one, a count above 3, a cost
/// that is not a whole number of `T`: a quota of another interval) is
/// written to a record instead; so is every held row of a table built with
/// `--cfg pace_hold_record` (the build switch the suites use to keep both
/// forms proven).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Form {
    /// The hold limit `P` (ns, at least 1).
    pub(crate) limit: u64,
    /// `⌊(2^64 − 1)/P⌋`: [`epoch`](Form::epoch) multiplies by it instead of
    /// dividing.
    recip: u64,
    /// The interval `T` counts are in (at least 1).
    interval: u64,
}

impl Form {
    /// The form of a table of interval `interval` and hold limit `limit`
    /// (ns).
    pub(crate) fn new(interval: u64, limit: u64) -> Form {
        let limit = limit.max(1);
        Form {
            limit,
            recip: u64::MAX / limit,
            interval: interval.max(1),
        }
    }

    /// The epoch of a reading: `⌊t/P⌋`, by a multiplication. With
    /// `m = ⌊(2^64 − 1)/P⌋ ≥ (2^64 − P)/P`, `q = ⌊t·m / 2^64⌋` is above
    /// `t/P − 2` and at most `t/P`: the quotient or one less, which one
    /// remainder check settles.
    #[inline]
    pub(crate) fn epoch(&self, t: u64) -> u64 {
        let q = ((u128::from(t) * u128::from(self.recip)) >> 64) as u64;
        q + u64::from(t - q * self.limit >= self.limit)
    }

    /// A lot's count: its cost in whole intervals, if it is 1, 2 or 3 of
    /// them.
    #[inline]
    fn count(&self, cost: u64) -> Option<u64> {
        let t = self.interval;
        if cost == t {
            Some(1)
        } else if cost == 2 * t {
            Some(2)
        } else if cost == 3 * t {
            Some(3)
        } else {
            None
        }
    }

    /// The inline field of `s`, if it fits.
    #[cfg(not(pace_hold_record))]
    #[inline]
    fn encode(&self, s: &Held) -> Option<u64> {
        if s.tat >= (1 << S_BITS) - 1 {
            return None;
        }
        let count = |l: &Lot| self.count(l.cost);
        let (oc, cc) = if s.cur.is_empty() {
            (0, 0)
        } else {
            (offset(s.cur.epoch(), self.epoch(s.tat))?, count(&s.cur)?)
        };
        let cp = if s.prev.is_empty() {
            0
        } else if !s.cur.is_empty() && s.prev.id + 1 == s.cur.id {
            count(&s.prev)?
        } else {
            return None;
        };
        let c = COUNT_BITS;
        let payload = (s.tat << (2 + 2 * c)) | (oc << (2 * c)) | (cc << c) | cp;
        debug_assert!(payload <= MAX_PAYLOAD);
        Some(INLINE | payload)
    }

    /// A hold of `n` tokens at `now` (of epoch `e`) on a row whose `tat`
    /// field is `field`, worked on the word itself: the new field and the
    /// ticket, exactly what [`Held::of`], [`Held::at_epoch`],
    /// [`Held::hold_at_epoch`] and [`Held::publish`] give (the test
    /// `word_paths_agree_with_the_states` compares them), for the common
    /// case only: a plain row, or an inline one without a previous lot whose
    /// current lot is of `e` or later, admitted, and inline after. `None`
    /// for everything else, which the state path decides.
    #[inline(always)]
    pub(crate) fn hold_word(
        &self,
        field: u64,
        limits: &Limits,
        now: u64,
        e: u64,
        n: u64,
    ) -> Option<(u64, Ticket)> {
        let (tat, cc, ec) = self.word_parts(field)?;
        if cc != 0 && e > ec {
            return None;
        }
        let cost = n * limits.interval();
        rule::decide_beside(tat, rule::counted(cc * self.interval), limits, now, n).ok()?;
        let tat = raised(tat, e, self);
        let base = self.epoch(tat);
        let ec = if cc == 0 {
            opening(e, &Lot::EMPTY, base)
        } else {
            ec
        };
        let count = cc + self.count(cost)?;
        let field = self.word(tat, base, ec, count)?;
        let ticket = Ticket {
            lot: ec + 1,
            cost,
            at: now,
            row: 0,
        };
        Some((field, ticket))
    }

    /// A resolution of `ticket` at `now` on a row whose `tat` field is
    /// `field`, worked on the word itself, as [`hold_word`](Form::hold_word)
    /// is: the new field, or `None` where the state path decides (its lot
    /// is not the current one of an inline row without a previous lot, the
    /// reading's epoch is past it, or the row would be left plain and full,
    /// which the table removes).
    #[inline(always)]
    pub(crate) fn resolve_word(
        &self,
        field: u64,
        ticket: Ticket,
        keep: bool,
        now: u64,
    ) -> Option<u64> {
        if field < INLINE {
            return None;
        }
        let (tat, cc, ec) = self.word_parts(field)?;
        // `⌊now/P⌋ > ec`, without the division: the state path would turn
        // the lot previous (or settle it).
        if cc == 0 || ticket.lot != ec + 1 || now >= (ec + 1).saturating_mul(self.limit) {
            return None;
        }
        let left = cc.checked_sub(self.count(ticket.cost)?)?;
        let tat = if keep {
            rule::settle(tat, ticket.at, ticket.cost)
        } else {
            rule::refunded(tat, ticket.cost)
        };
        if left == 0 {
            return (tat > now).then_some(tat);
        }
        self.word(tat, self.epoch(tat), ec, left)
    }

    /// The settled `tat`, current count and current epoch of a plain or
    /// inline field without a previous lot (`None` otherwise).
    #[inline(always)]
    fn word_parts(&self, field: u64) -> Option<(u64, u64, u64)> {
        if field < HELD {
            return Some((field, 0, 0));
        }
        if cfg!(pace_hold_record) || field < INLINE {
            return None;
        }
        let x = field - INLINE;
        let c = COUNT_BITS;
        let mask = (1u64 << c) - 1;
        if x & mask != 0 {
            return None;
        }
        let tat = x >> (2 + 2 * c);
        let ec = (self.epoch(tat) + ((x >> (2 * c)) & 3)).wrapping_sub(2);
        Some((tat, (x >> c) & mask, ec))
    }

    /// The inline field of a row settled at `tat` (of epoch `base`) with one
    /// lot, of epoch `e` and `count` tokens (positive), if it fits.
    #[inline(always)]
    fn word(&self, tat: u64, base: u64, e: u64, count: u64) -> Option<u64> {
        if cfg!(pace_hold_record) || tat >= (1 << S_BITS) - 1 || count >= 1 << COUNT_BITS {
            return None;
        }
        let oc = offset(e, base)?;
        let c = COUNT_BITS;
        Some(INLINE | (tat << (2 + 2 * c)) | (oc << (2 * c)) | (count << c))
    }

    /// The build switch `pace_hold_record`: nothing is inline.
    #[cfg(pace_hold_record)]
    #[inline]
    fn encode(&self, _: &Held) -> Option<u64> {
        None
    }

    /// The state an inline field holds.
    #[inline]
    fn decode(&self, field: u64) -> Held {
        let x = field - INLINE;
        let c = COUNT_BITS;
        let mask = (1u64 << c) - 1;
        let tat = x >> (2 + 2 * c);
        let cc = (x >> c) & mask;
        let cp = x & mask;
        // The current lot's identity (its epoch plus one).
        let id = (self.epoch(tat) + ((x >> (2 * c)) & 3)).saturating_sub(1);
        let lot = |id: u64, count: u64| {
            if count == 0 {
                Lot::EMPTY
            } else {
                Lot {
                    id,
                    cost: count * self.interval,
                }
            }
        };
        Held {
            tat,
            cur: lot(id, cc),
            prev: lot(id.saturating_sub(1), cp),
        }
    }
}

/// The inline offset of a lot of epoch `e` on a row whose settled `tat` is in
/// epoch `base`: `e − base + 2`, if it is in `0..=3`.
#[cfg(not(pace_mutant = "inline_offset_wraps"))]
#[inline]
fn offset(e: u64, base: u64) -> Option<u64> {
    (e + 2).checked_sub(base).filter(|o| *o <= 3)
}

/// Known-wrong variant `inline_offset_wraps`: a lot too far from its row's
/// settled `tat` is written with its offset wrapped (modulo 4), so it comes
/// back as another epoch's lot.
#[cfg(pace_mutant = "inline_offset_wraps")]
#[inline]
fn offset(e: u64, base: u64) -> Option<u64> {
    Some((e + 2).wrapping_sub(base) & 3)
}

/// A lot of holds: `cost` ns of tokens held by the unresolved holds that
/// joined it. Its identity is its epoch plus one: lots open in epochs of
/// the hold limit, and no two lots of a row ever share one (DESIGN.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Lot {
    /// Its epoch plus one (`NONE` when empty).
    pub(crate) id: u64,
    /// Σ n·T of its unresolved holds (positive unless empty).
    pub(crate) cost: u64,
}

impl Lot {
    pub(crate) const EMPTY: Lot = Lot { id: NONE, cost: 0 };

    fn is_empty(&self) -> bool {
        self.id == NONE
    }

    /// Its epoch (of a lot that is not empty).
    fn epoch(&self) -> u64 {
        self.id - 1
    }

    /// Settles this expired lot into `tat` as kept: as a debit at the last
    /// instant of its lifetime, `(e + 2)·P − 1`, which no reading of a hold
    /// that joined it passes. The settled `tat` is then at least
    /// `(e + 2)·P`, so no later lot of the row opens in epoch `e` again.
    fn settle(&self, tat: u64, form: &Form) -> u64 {
        let end = (self.epoch() + 2).saturating_mul(form.limit) - 1;
        rule::settle(tat, end, self.cost)
    }
}

/// The epoch a fresh lot opens in at a reading of epoch `now_e`, beside the
/// previous lot `prev`, on a row settled at `tat` (of epoch `base`): the
/// reading's epoch, but never before the one after `prev`'s, and never
/// before `⌊tat/P⌋ − 1`.
/// The second keeps the lots of a row in order: the fresh lot turns
/// previous, settling `prev`, only in an epoch after its own, so never
/// before `prev` expires by itself (a reading pre-empted since an older
/// epoch would otherwise open a lot in the past, whose turn would settle
/// `prev` early: a hold of `prev` resolved within the limit of its reading
/// would find its lot gone). The third keeps identities unique: an expired
/// lot of epoch `e` settled the row at or past `(e + 2)·P`, and nothing
/// lowers a settled `tat` below a settlement, so the fresh lot's epoch is
/// past `e`.
#[cfg(not(pace_mutant = "stale_lot_opens_in_the_past"))]
#[inline(always)]
fn opening(now_e: u64, prev: &Lot, base: u64) -> u64 {
    let after = if prev.is_empty() { 0 } else { prev.epoch() + 1 };
    now_e.max(after).max(base.saturating_sub(1))
}

/// Known-wrong variant `stale_lot_opens_in_the_past`: a fresh lot opens in
/// its reading's epoch, however stale, and its turn settles the previous
/// lot early.
#[cfg(pace_mutant = "stale_lot_opens_in_the_past")]
#[inline(always)]
fn opening(now_e: u64, _prev: &Lot, base: u64) -> u64 {
    now_e.max(base.saturating_sub(1))
}

/// The settled `tat` a hold at a reading of epoch `now_e` leaves: raised to
/// the start of the epoch before, `(now_e − 1)·P`, where it is behind. Only
/// a reading older than that (at least a hold limit older than the hold's)
/// decides differently on the raised `tat`, and only with fewer tokens; the
/// raise keeps a held row's lots within the inline form's offsets of
/// `⌊S/P⌋`, however long its key was idle.
#[inline]
fn raised(tat: u64, now_e: u64, form: &Form) -> u64 {
    tat.max(now_e.saturating_sub(1).saturating_mul(form.limit))
        .min(MAX_TIME)
}

/// What a hold took: its lot, its cost and its reading. A resolution
/// carries it back to the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) lot: u64,
    pub(crate) cost: u64,
    pub(crate) at: u64,
    /// The key half of the held row's cell (the key's own bits, or its
    /// box's address), set by the table: lots are named by epochs, which
    /// another key's row may hold too, so a resolution acts only on the
    /// row its hold was made on.
    pub(crate) row: u64,
}

/// Whether a resolution of `ticket` found the row its hold was made on
/// (its cell's key half is `bits`): lots are named by epochs, so another
/// key's row, or the key's row made again since, may have a lot of the
/// same name.
#[cfg(not(pace_mutant = "resolve_ignores_row"))]
#[inline(always)]
pub(crate) fn on_its_row(bits: u64, ticket: &Ticket) -> bool {
    bits == ticket.row
}

/// Known-wrong variant `resolve_ignores_row`: a resolution acts on any row
/// it is handed to, and takes another key's held tokens whose lot has the
/// same epoch.
#[cfg(pace_mutant = "resolve_ignores_row")]
#[inline(always)]
pub(crate) fn on_its_row(_bits: u64, _ticket: &Ticket) -> bool {
    true
}

impl Ticket {
    /// The ticket of lot `lot` (none for 0: a plain debit).
    pub(crate) fn unpack(lot: u64, cost: u64, at: u64, row: u64) -> Option<Ticket> {
        (lot != NONE).then_some(Ticket { lot, cost, at, row })
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

    pub(crate) fn is_plain(&self) -> bool {
        self.cur.is_empty() && self.prev.is_empty()
    }

    /// The state of a row whose `tat` field is `field`.
    ///
    /// # Safety
    /// `field` was read under `guard` from a live (or frozen live) cell of
    /// a table of form `form`, whose records outlive the guards that can
    /// read them.
    #[inline]
    pub(crate) unsafe fn of(field: u64, form: &Form, _guard: &Guard) -> Held {
        if field < HELD {
            return Held::plain(field);
        }
        if field >= INLINE {
            return form.decode(field);
        }
        if let Some(tat) = dormant(field) {
            return Held::plain(tat);
        }
        let p = std::ptr::with_exposed_provenance::<Held>((field - HELD) as usize);
        // SAFETY: a field in `[HELD, DORMANT)` (the dormant fields were decoded
        // above) is `HELD` plus the address of
        // a record made by `publish` and published by a CAS; the caller's
        // contract keeps it alive while `guard` is pinned, and records are
        // never written after publication.
        unsafe { *p }
    }

    /// This state as a `tat` field: its `tat` when plain, its inline form
    /// when it fits, else a new record's address (owned by the caller
    /// until a CAS publishes it; [`free`] it otherwise).
    #[inline]
    pub(crate) fn publish(self, form: &Form) -> u64 {
        if self.is_plain() {
            return self.tat;
        }
        if let Some(field) = form.encode(&self) {
            return field;
        }
        self.publish_record()
    }

    /// A record of this state (the form's fallback).
    #[cold]
    #[inline(never)]
    fn publish_record(self) -> u64 {
        let addr = Box::into_raw(pool::take(self)).expose_provenance() as u64;
        debug_assert!(
            addr < DORMANT - HELD,
            "a record's address fits below the dormant fields"
        );
        HELD + addr
    }

    /// The state at reading `now`: lots two epochs behind the reading's are
    /// settled as kept, and a current lot an epoch behind becomes the
    /// previous one (a previous lot that is still there is settled first:
    /// it is two epochs behind by then).
    #[cfg(not(pace_mutant = "holds_never_expire"))]
    #[inline]
    pub(crate) fn at(self, now: u64, form: &Form) -> Held {
        if self.is_plain() {
            return self;
        }
        self.at_epoch(form.epoch(now), form)
    }

    /// [`at`](Held::at) a reading of epoch `e`.
    #[cfg(not(pace_mutant = "holds_never_expire"))]
    #[inline]
    pub(crate) fn at_epoch(mut self, e: u64, form: &Form) -> Held {
        let expired = |l: &Lot| !l.is_empty() && e >= l.epoch().saturating_add(2);
        if expired(&self.prev) {
            self.tat = self.prev.settle(self.tat, form);
            self.prev = Lot::EMPTY;
        }
        if expired(&self.cur) {
            self.tat = self.cur.settle(self.tat, form);
            self.cur = Lot::EMPTY;
        }
        if !self.cur.is_empty() && e > self.cur.epoch() {
            if !self.prev.is_empty() {
                self.tat = self.prev.settle(self.tat, form);
            }
            self.prev = self.cur;
            self.cur = Lot::EMPTY;
        }
        self
    }

    /// Known-wrong variant `holds_never_expire`: no lot ever expires, so a
    /// leaked hold keeps its tokens and its row for good.
    #[cfg(pace_mutant = "holds_never_expire")]
    pub(crate) fn at(self, _: u64, _: &Form) -> Held {
        self
    }

    /// Known-wrong variant `holds_never_expire`, at an epoch.
    #[cfg(pace_mutant = "holds_never_expire")]
    pub(crate) fn at_epoch(self, _: u64, _: &Form) -> Held {
        self
    }

    /// The decision on `n` more tokens at `now` beside what this state
    /// holds ([`rule::decide`]): `Ok` carries the `tat` a debit of them
    /// would settle at.
    #[inline]
    pub(crate) fn decide(&self, limits: &Limits, now: u64, n: u64) -> Result<u64, Decision> {
        rule::decide(self.tat, self.held(), limits, now, n)
    }

    /// A plain debit of `n` tokens at `now`: the new state.
    #[inline]
    pub(crate) fn debit(self, limits: &Limits, now: u64, n: u64) -> Result<Held, Decision> {
        let tat = self.decide(limits, now, n)?;
        Ok(Held { tat, ..self })
    }

    /// A hold of `n` tokens at `now` (after [`at`](Held::at)): the new
    /// state and its ticket.
    #[inline]
    pub(crate) fn hold(
        self,
        limits: &Limits,
        now: u64,
        n: u64,
        form: &Form,
    ) -> Result<(Held, Ticket), Decision> {
        self.hold_at_epoch(limits, now, form.epoch(now), n, form)
    }

    /// [`hold`](Held::hold) at `now`, whose epoch is `e`.
    #[inline]
    pub(crate) fn hold_at_epoch(
        self,
        limits: &Limits,
        now: u64,
        e: u64,
        n: u64,
        form: &Form,
    ) -> Result<(Held, Ticket), Decision> {
        self.decide(limits, now, n)?;
        let cost = n * limits.interval();
        let mut next = self;
        next.tat = raised(self.tat, e, form);
        if next.cur.is_empty() {
            next.cur = Lot {
                id: opening(e, &self.prev, form.epoch(next.tat)) + 1,
                cost: 0,
            };
        }
        next.cur.cost += cost;
        let ticket = Ticket {
            lot: next.cur.id,
            cost,
            at: now,
            row: 0,
        };
        Ok((next, ticket))
    }

    /// Resolves `ticket`: its tokens leave its lot, and if `keep`, they are
    /// settled as a debit from the hold's own reading.
    #[inline]
    pub(crate) fn resolve(self, ticket: Ticket, keep: bool, _form: &Form) -> Resolution {
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
            rule::settle(next.tat, ticket.at, ticket.cost)
        } else {
            rule::refunded(next.tat, ticket.cost)
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
    (HELD..DORMANT).contains(&field).then(|| field - HELD)
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

    /// Records kept per thread (40 bytes each): more than the collector
    /// frees in one batch, so that a steady stream of holds never runs dry.
    pub(super) const KEPT: usize = 128;
    const _: () = assert!(std::mem::size_of::<Held>() == 40);

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

    /// The form of a table of interval `T`.
    fn form(limit: u64) -> Form {
        Form::new(T, limit)
    }

    #[test]
    fn a_refund_in_any_order_returns_the_tokens() {
        let l = lim(3);
        let f = form(MAX_TIME);
        let s = Held::plain(0);
        let (s, a) = s.hold(&l, 100, 1, &f).unwrap();
        let (s, b) = s.hold(&l, 100, 1, &f).unwrap();
        let (s, c) = s.hold(&l, 100, 1, &f).unwrap();
        assert_eq!(s.decide(&l, 100, 1), Err(Decision::Held(T)));
        let Resolution::Done(s) = s.resolve(a, false, &f) else {
            panic!()
        };
        let Resolution::Done(s) = s.resolve(c, false, &f) else {
            panic!()
        };
        let Resolution::Done(s) = s.resolve(b, false, &f) else {
            panic!()
        };
        assert_eq!(s, Held::plain(0));
        assert_eq!(s.publish(&f), 0);
    }

    #[test]
    fn keeping_settles_from_the_holds_reading() {
        let l = lim(3);
        let f = form(MAX_TIME);
        let s = Held::plain(0);
        let (s, a) = s.hold(&l, 100, 2, &f).unwrap();
        let Resolution::Done(s) = s.resolve(a, true, &f) else {
            panic!()
        };
        assert_eq!(s, Held::plain(100 + 2 * T));
    }

    #[test]
    fn a_settled_tat_stays_in_the_time_space() {
        let l = lim(3);
        let f = form(MAX_TIME);
        let (s, a) = Held::plain(0).hold(&l, 0, 1, &f).unwrap();
        let late = Held { tat: MAX_TIME, ..s };
        let Resolution::Done(k) = late.resolve(a, true, &f) else {
            panic!()
        };
        assert_eq!(k.tat, MAX_TIME);
        assert!(
            k.publish(&f) < HELD,
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
        let f = form(p);
        let s = Held::plain(0);
        // Read at 100: epoch 0.
        let (s, a) = s.hold(&l, 100, 1, &f).unwrap();
        assert_eq!(s.cur.id, 1);
        // Within its epoch: still the current lot.
        assert_eq!(s.at(p - 1, &f), s);
        // An epoch later: the previous lot, still exact.
        let s1 = s.at(p, &f);
        assert_eq!(s1.prev.id, 1);
        assert!(matches!(s1.resolve(a, false, &f), Resolution::Done(x) if x.is_plain()));
        // Two epochs later: settled as kept at the lot's last instant,
        // 2P − 1; the ticket is stale.
        let s2 = s.at(2 * p, &f);
        assert_eq!(s2, Held::plain(2 * p - 1 + T));
        assert_eq!(s2.resolve(a, false, &f), Resolution::Expired);
        // A fresh lot of the row never opens in epoch 0 again, however
        // stale its reading.
        let (s3, b) = s2.hold(&l, 2 * p - 10, 1, &f).unwrap();
        assert!(s3.cur.id > 1, "{s3:?}");
        assert_eq!(s3.resolve(a, false, &f), Resolution::Expired);
        assert!(matches!(s3.resolve(b, false, &f), Resolution::Done(_)));
    }

    /// A stale hold opens no lot before the epoch after the previous one's.
    #[test]
    fn a_stale_lot_opens_after_the_previous_one() {
        let l = lim(9);
        let p = 1_000;
        let f = form(p);
        let (s, a) = Held::plain(0).hold(&l, 1_500, 1, &f).unwrap();
        let s = s.at(2_100, &f);
        assert_eq!(s.prev.id, 2);
        let (s, _) = s.at(900, &f).hold(&l, 900, 1, &f).unwrap();
        assert_eq!(s.cur.id, 3, "{s:?}");
        // Epoch 2 turns the stale lot previous without settling the first.
        let s = s.at(2_999, &f);
        assert!(
            matches!(s.resolve(a, false, &f), Resolution::Done(_)),
            "{s:?}"
        );
    }

    /// `Form::epoch` (a multiplication and one correction) is the quotient
    /// `⌊t/P⌋` for every limit and reading tried, the edges included.
    #[test]
    fn epochs_are_quotients() {
        let mut x: u64 = 0x1234_5678_9ABC_DEF1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut limits = vec![
            1,
            2,
            3,
            7,
            1_000,
            10_000_000_000,
            MAX_TIME,
            u64::MAX - 1,
            u64::MAX,
        ];
        limits.extend((0..200).map(|_| next() >> (next() % 64)));
        for p in limits {
            let f = Form::new(1, p);
            let p = p.max(1);
            let mut ts = vec![0, 1, p - 1, p, p.saturating_add(1), u64::MAX - 1, u64::MAX];
            ts.extend((0..500).map(|_| next() >> (next() % 64)));
            for t in ts {
                assert_eq!(f.epoch(t), t / p, "t {t}, P {p}");
            }
        }
    }

    /// Every held state the inline form can hold comes back from its field
    /// as it went in, and the ones it cannot hold are written to records.
    #[test]
    fn inline_states_round_trip() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut inline = 0;
        for interval in [1, 1_000, 1_000_000, 60_000_000_000] {
            for limit in [1, 1_000, 10_000_000_000, MAX_TIME] {
                let f = Form::new(interval, limit);
                for _ in 0..5_000 {
                    let tat = next() % (1 << (next() % 62));
                    let base = f.epoch(tat);
                    let cur_e = (base + next() % 6).saturating_sub(3);
                    let lot = |e: u64, r: u64| {
                        if r.is_multiple_of(5) {
                            Lot::EMPTY
                        } else {
                            Lot {
                                id: e + 1,
                                cost: (1 + r % 5) * interval + u64::from(r.is_multiple_of(23)),
                            }
                        }
                    };
                    let mut s = Held {
                        tat,
                        cur: lot(cur_e, next()),
                        prev: lot(cur_e.saturating_sub(1 + next() % 2), next()),
                    };
                    if s.prev.id >= s.cur.id && !s.cur.is_empty() {
                        s.prev = Lot::EMPTY;
                    }
                    if s.is_plain() {
                        continue;
                    }
                    let fits = tat < (1 << S_BITS) - 1
                        && (s.cur.is_empty()
                            || (cur_e + 2 >= base
                                && cur_e + 2 <= base + 3
                                && s.cur.cost.is_multiple_of(interval)
                                && s.cur.cost / interval <= 3))
                        && (s.prev.is_empty()
                            || (!s.cur.is_empty()
                                && s.prev.id + 1 == s.cur.id
                                && s.prev.cost.is_multiple_of(interval)
                                && s.prev.cost / interval <= 3));
                    match f.encode(&s) {
                        Some(field) => {
                            inline += 1;
                            assert!(fits, "inline, but outside the form: {s:?} {f:?}");
                            assert!((INLINE..=super::super::cell::FIELD_MAX).contains(&field));
                            assert_eq!(f.decode(field), s, "{f:?}");
                        }
                        None => assert!(cfg!(pace_hold_record) || !fits, "{s:?} fits {f:?}"),
                    }
                }
            }
        }
        if !cfg!(pace_hold_record) {
            assert!(inline > 1_000, "{inline}");
        }
    }

    /// The word paths (`Form::hold_word`, `Form::resolve_word`) decide every
    /// case they take exactly as the state path does, on the states of
    /// random single-row histories (stale readings, overlapping holds, keeps
    /// and refunds, debits, expiries), and take the common ones.
    #[test]
    fn word_paths_agree_with_the_states() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n.max(1)
        };
        let (mut holds, mut resolutions) = (0, 0);
        for case in 0..400u64 {
            let interval = [1, 10, 1_000, 1_000_000][(case % 4) as usize];
            let limit = [1, 50, 1_000, 1_000_000, MAX_TIME][(case / 4 % 5) as usize];
            let cap = 1 + rnd(8);
            let f = Form::new(interval, limit);
            let l = Limits::new(interval, cap).unwrap();
            let field_of = |s: &Held| {
                if s.is_plain() {
                    Some(s.tat)
                } else {
                    f.encode(s)
                }
            };
            let mut state = Held::plain(rnd(1_000));
            let mut now = rnd(10 * limit.min(1 << 40));
            let mut tickets: Vec<Ticket> = Vec::new();
            for _ in 0..200 {
                now += rnd(3 * interval.max(limit.min(1 << 40) / 4));
                let t = if rnd(4) == 0 {
                    now.saturating_sub(rnd(limit.min(1 << 40) + 1))
                } else {
                    now
                };
                // A record stands for states the word cannot hold.
                let field = field_of(&state).unwrap_or(HELD + 64);
                match rnd(3) {
                    0 | 1 if tickets.is_empty() || rnd(2) == 0 => {
                        let n = 1 + rnd(3);
                        let word = f.hold_word(field, &l, t, f.epoch(t), n);
                        let gen = state.at(t, &f).hold(&l, t, n, &f);
                        if let Some((wf, wt)) = word {
                            let (g, gt) = gen.expect("the word path admitted");
                            assert_eq!((field_of(&g), gt), (Some(wf), wt), "{state:?} at {t}");
                            holds += 1;
                        }
                        if let Ok((g, gt)) = gen {
                            state = g;
                            tickets.push(gt);
                        }
                    }
                    0 | 1 => {
                        let tk = tickets.swap_remove(rnd(tickets.len() as u64) as usize);
                        let keep = rnd(2) == 0;
                        let word = f.resolve_word(field, tk, keep, t);
                        let gen = state.at(t, &f).resolve(tk, keep, &f);
                        if let Some(wf) = word {
                            let Resolution::Done(g) = gen else {
                                panic!("{state:?}: the word path resolved an expired ticket")
                            };
                            assert_eq!(field_of(&g), Some(wf), "{state:?} {tk:?} at {t}");
                            assert!(!g.is_plain() || g.tat > t);
                            resolutions += 1;
                        }
                        if let Resolution::Done(g) = gen {
                            state = g;
                        } else {
                            state = state.at(t, &f);
                        }
                    }
                    _ => {
                        if let Ok(g) = state.at(t, &f).debit(&l, t, 1) {
                            state = g;
                        }
                    }
                }
            }
        }
        if !cfg!(pace_hold_record) {
            assert!(
                holds > 5_000 && resolutions > 1_000,
                "{holds} {resolutions}"
            );
        }
    }
}
