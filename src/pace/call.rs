//! The kinds of reserve ([`Pace::reserve_slot`](super::Pace)): a request
//! names what it asks for with a value of one of these types, and the
//! compiler builds one reserve per kind (each zero-sized but a turn's wait,
//! so nothing of the others' is left in a plain debit).

use crate::sync::epoch::Guard;
use crate::table::{Spot, SpotSink, Take, TakeDebit, TakeHold};

/// A reserve's request: `n` tokens of `key` under `quota` (the default
/// quota when `None`), at the reading `clock` gives (read once, after the
/// key's cell is fetched; again only when a fresh row's floor is ahead).
pub(crate) struct Request<'a, 'q, Q: ?Sized, F> {
    pub(crate) key: &'a Q,
    pub(crate) n: u64,
    pub(crate) quota: Option<&'q crate::bucket::Limits>,
    pub(crate) clock: F,
}

/// What a kind of reserve does beside its decision.
pub(crate) trait Kind: Copy {
    /// What the table takes of the key's row: a plain debit or a hold.
    type Take: Take;
    /// What the call learns beside its debit: nothing, or a turn's slot.
    type Slot;
    /// Where a hold notes the cell its row was left in.
    type Spot: SpotSink;
    /// A turn's wait: the debit may fit the bucket up to this many ns
    /// after the reading.
    #[inline(always)]
    fn wait(&self) -> Option<u64> {
        None
    }
    /// The guard the call is made under, when its caller pinned one.
    #[inline(always)]
    fn pinned(&self) -> Option<&Guard> {
        None
    }
    /// Where the table notes a hold's cell.
    fn spot(&self) -> Self::Spot;
    /// The call's slot, from the settled `tat` its debit left, the tokens
    /// held beside it and the bucket's own horizon `tau`.
    fn slot(&self, tat: u64, held: u64, tau: u64) -> Self::Slot;
}

/// A plain debit (`reserve`, `check_key`).
#[derive(Clone, Copy)]
pub(crate) struct Debit;

/// A hold (`hold`): its tokens held in a lot until resolved.
#[derive(Clone, Copy)]
pub(crate) struct Hold;

/// A hold under the caller's pin, noting its cell in `spot`, so that its
/// resolution under the same pin finds the row without a probe
/// (`hold_while`).
#[derive(Clone, Copy)]
pub(crate) struct HoldPinned<'g> {
    pub(crate) guard: &'g Guard,
    pub(crate) spot: &'g std::cell::Cell<Spot>,
}

/// A turn (`acquire`): a debit that may fit the bucket up to `wait` ns
/// after the reading; it learns its slot.
#[derive(Clone, Copy)]
pub(crate) struct Turn {
    pub(crate) wait: u64,
}

impl Kind for Debit {
    type Take = TakeDebit;
    type Slot = ();
    type Spot = ();
    #[inline(always)]
    fn spot(&self) {}
    #[inline(always)]
    fn slot(&self, _: u64, _: u64, _: u64) {}
}

impl Kind for Hold {
    type Take = TakeHold;
    type Slot = ();
    type Spot = ();
    #[inline(always)]
    fn spot(&self) {}
    #[inline(always)]
    fn slot(&self, _: u64, _: u64, _: u64) {}
}

impl<'g> Kind for HoldPinned<'g> {
    type Take = TakeHold;
    type Slot = ();
    type Spot = &'g std::cell::Cell<Spot>;
    #[inline(always)]
    fn pinned(&self) -> Option<&Guard> {
        Some(self.guard)
    }
    #[inline(always)]
    fn spot(&self) -> Self::Spot {
        self.spot
    }
    #[inline(always)]
    fn slot(&self, _: u64, _: u64, _: u64) {}
}

impl Kind for Turn {
    type Take = TakeDebit;
    /// The instant the turn is let through (ns on the limiter's clock).
    type Slot = u64;
    type Spot = ();
    #[inline(always)]
    fn wait(&self) -> Option<u64> {
        Some(self.wait)
    }
    #[inline(always)]
    fn spot(&self) {}
    #[inline(always)]
    fn slot(&self, tat: u64, held: u64, tau: u64) -> u64 {
        crate::rule::slot_of(tat, held, tau, self.wait)
    }
}
