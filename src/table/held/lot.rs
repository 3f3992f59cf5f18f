//! Lots: the unresolved holds of a row opened in one epoch of the hold
//! limit, settled as kept two epochs on.

use super::{Form, NONE};
use crate::bucket::MAX_TIME;
use crate::rule;

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

    pub(super) fn is_empty(&self) -> bool {
        self.id == NONE
    }

    /// Its epoch (of a lot that is not empty).
    pub(super) fn epoch(&self) -> u64 {
        self.id - 1
    }

    /// Settles this expired lot into `tat` as kept: as a debit at the last
    /// instant of its lifetime, `(e + 2)·P − 1`, which no reading of a hold
    /// that joined it passes. The settled `tat` is then at least
    /// `(e + 2)·P`, so no later lot of the row opens in epoch `e` again.
    pub(super) fn settle(&self, tat: u64, form: &Form) -> u64 {
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
pub(super) fn opening(now_e: u64, prev: &Lot, base: u64) -> u64 {
    let after = if prev.is_empty() { 0 } else { prev.epoch() + 1 };
    now_e.max(after).max(base.saturating_sub(1))
}

/// Known-wrong variant `stale_lot_opens_in_the_past`: a fresh lot opens in
/// its reading's epoch, however stale, and its turn settles the previous
/// lot early.
#[cfg(pace_mutant = "stale_lot_opens_in_the_past")]
#[inline(always)]
pub(super) fn opening(now_e: u64, _prev: &Lot, base: u64) -> u64 {
    now_e.max(base.saturating_sub(1))
}

/// The settled `tat` a hold at a reading of epoch `now_e` leaves: raised to
/// the start of the epoch before, `(now_e − 1)·P`, where it is behind. Only
/// a reading older than that (at least a hold limit older than the hold's)
/// decides differently on the raised `tat`, and only with fewer tokens; the
/// raise keeps a held row's lots within the inline form's offsets of
/// `⌊S/P⌋`, however long its key was idle.
#[inline]
pub(super) fn raised(tat: u64, now_e: u64, form: &Form) -> u64 {
    tat.max(now_e.saturating_sub(1).saturating_mul(form.limit))
        .min(MAX_TIME)
}
