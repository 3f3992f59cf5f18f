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

use std::num::NonZeroU64;

use crate::bucket::{Decision, Limits, MAX_TIME};
use crate::rule;
use crate::sync::epoch::Guard;

mod inline;
mod lot;
mod record;

pub(crate) use inline::Form;
use lot::{opening, raised, Lot};
pub(crate) use record::{address, free, free_at};

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

/// Lot identity of an empty lot.
const NONE: u64 = 0;

/// What a hold took: its lot, its cost and its reading. A resolution
/// carries it back to the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    /// Its lot's id (never [`NONE`], an empty lot's).
    pub(crate) lot: NonZeroU64,
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
    /// This ticket, of the row whose cell's key half is `row`.
    #[inline(always)]
    pub(crate) fn on_row(self, row: u64) -> Ticket {
        Ticket { row, ..self }
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
        record::publish(self)
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
            // (An open lot's id is at least 1.)
            lot: NonZeroU64::new(next.cur.id).unwrap_or(NonZeroU64::MAX),
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
        let lot = if self.cur.id == ticket.lot.get() {
            &mut next.cur
        } else if self.prev.id == ticket.lot.get() {
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

#[cfg(test)]
mod tests {
    use super::inline::S_BITS;
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
