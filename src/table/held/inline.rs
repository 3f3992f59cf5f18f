//! The inline form of a held row: its whole state in the word's `tat`
//! field, when it fits ([`Form`]).

use std::num::NonZeroU64;

use super::lot::{opening, raised};
use super::{Held, Lot, Ticket, HELD, INLINE};
use crate::bucket::Limits;
use crate::rule;

/// The largest inline payload: the words above `INLINE + MAX_PAYLOAD` are
/// the row states that are not live (`cell.rs`).
const MAX_PAYLOAD: u64 = crate::table::cell::FIELD_MAX - INLINE;

/// Bits of the inline form's settled `tat`: a settled `tat` at or past
/// `2^56` ns (about 2.3 years of the limiter's clock) is kept in a record.
pub(super) const S_BITS: u32 = 56;

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
    pub(super) fn encode(&self, s: &Held) -> Option<u64> {
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
            lot: NonZeroU64::new(ec + 1)?,
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
        if cc == 0 || ticket.lot.get() != ec + 1 || now >= (ec + 1).saturating_mul(self.limit) {
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
    pub(super) fn encode(&self, _: &Held) -> Option<u64> {
        None
    }

    /// The state an inline field holds.
    #[inline]
    pub(super) fn decode(&self, field: u64) -> Held {
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
