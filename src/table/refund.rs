//! Refunds, the resolution of holds and peeks: a key's row found, then
//! restored, settled or read.

use crossbeam_utils::Backoff;

use super::array::Array;
use super::cell::{self, Cell, CellState};
use super::held::{self, Held, Resolution, Ticket, HELD};
use super::keys::Probe;
use super::{near, Cx, Found, Near, Spent, Spot, Table};
use crate::bucket::{Limits, Refund};
use crate::sync::epoch::Guard;
use crate::sync::{cas_retry, Ordering};

/// What a refund did to its row (the limiter answers it as
/// [`Refunded`](crate::Refunded), whose variants of the same names mean
/// the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Undone {
    /// Back to the debit's `prev`.
    Restored,
    /// Back to a full bucket: the row was removed.
    Removed,
    /// Debited since: nothing returned.
    Superseded,
    /// No row (full already): nothing to return.
    Refilled,
}

impl Table {
    /// Undoes `spent`, a reservation that moved `key`'s row from its `prev`
    /// to its `tat`, if the row still ends at that `tat`. A refund that makes the bucket
    /// full raises the floor to `prev` and removes the row (from the
    /// current array; in a migration's target the row stays, full).
    /// After its own row, the call copies one chunk of a running migration.
    pub(crate) fn refund<P: Probe>(
        &self,
        limits: &Limits,
        hash: u64,
        key: &P,
        spent: Spent,
        cx: &Cx<'_>,
        guard: &Guard,
    ) -> Undone {
        let r = self.refund_row(limits, hash, key, spent, cx, guard);
        if !cx.copied.get() {
            self.help(cx, guard);
        }
        r
    }

    /// [`refund`](Table::refund)'s own row.
    fn refund_row<P: Probe>(
        &self,
        limits: &Limits,
        hash: u64,
        key: &P,
        spent: Spent,
        cx: &Cx<'_>,
        guard: &Guard,
    ) -> Undone {
        let backoff = Backoff::new();
        'find: loop {
            let Found::Row {
                arr,
                idx,
                mut v,
                bits,
                mut tat,
            } = self.find(hash, key, false, guard)
            else {
                return Undone::Refilled;
            };
            loop {
                if held::dormant(tat).is_some() {
                    // Not a row: the key's bucket refilled and a pass put
                    // it to sleep, as if it had been removed.
                    return Undone::Refilled;
                }
                let row = Seen {
                    arr,
                    idx,
                    v,
                    bits,
                    tat,
                };
                let step = if tat >= HELD {
                    // SAFETY: `tat` is the field of a live cell read under
                    // `guard`.
                    let was = unsafe { Held::of(tat, &self.form, guard) };
                    self.refund_held(row, was, spent, guard)
                } else {
                    self.refund_live(row, limits, hash, spent, cx, guard)
                };
                match step {
                    Step::Done(r) => return r,
                    Step::Find => continue 'find,
                    Step::Retry { actual, tat: t } => {
                        v = actual;
                        tat = t;
                        cas_retry(&backoff);
                    }
                }
            }
        }
    }

    /// A refund to a row whose tokens are held (`was`): the record's `tat`
    /// goes back to the reservation's `prev` if it still ends at its `tat`.
    #[inline(always)]
    fn refund_held(&self, row: Seen<'_>, was: Held, spent: Spent, guard: &Guard) -> Step {
        if was.tat != spent.tat {
            return Step::Done(Undone::Superseded);
        }
        let Seen {
            arr, idx, v, bits, ..
        } = row;
        match self.replace_row(
            arr,
            idx,
            v,
            Held {
                tat: spent.prev,
                ..was
            },
            guard,
        ) {
            Ok(()) => Step::Done(Undone::Restored),
            Err(actual) => Step::after_lost_cas(actual, bits, true),
        }
    }

    /// A refund to a row without holds: its `tat` goes back, or the row
    /// goes (full) with the floor raised to the reservation's `prev`.
    #[inline(always)]
    fn refund_live(
        &self,
        row: Seen<'_>,
        limits: &Limits,
        hash: u64,
        spent: Spent,
        cx: &Cx<'_>,
        guard: &Guard,
    ) -> Step {
        let Seen {
            arr,
            idx,
            v,
            bits,
            tat,
        } = row;
        let Spent {
            n,
            tat: own_tat,
            prev,
        } = spent;
        let (next, full) = match limits.refund(tat, cx.now, n, own_tat, prev) {
            Refund::Unchanged => return Step::Done(Undone::Superseded),
            Refund::Set(t) => (CellState::Live { key: bits, tat: t }.encode(), false),
            // Neither current nor the current array's target: an old
            // array, whose cells are frozen (the CAS fails and the
            // walk goes on in the target).
            Refund::Full if self.source_of(arr, guard).is_none() => (
                CellState::Live {
                    key: bits,
                    tat: prev,
                }
                .encode(),
                false,
            ),
            Refund::Full => {
                self.floors.raise_refunded(self.stripe(hash, bits), prev);
                (CellState::Tomb.encode(), true)
            }
        };
        match arr.cells[idx].cas(v, next) {
            Ok(_) if full => {
                // SAFETY: our CAS made the row's cell a tombstone.
                unsafe { self.row_removed(arr, idx, bits, cx, guard) };
                Step::Done(Undone::Removed)
            }
            Ok(_) => Step::Done(Undone::Restored),
            Err(actual) => Step::after_lost_cas(actual, bits, refund_follows_copies()),
        }
    }

    /// What follows a refund's or a resolution's removal of the row in cell
    /// `idx` of `arr` (key half `bits`): the count, the key box, the
    /// cleaning of the tombstone, a pending shrink.
    ///
    /// # Safety
    /// The caller's CAS just turned that live cell into a tombstone, in the
    /// current array or its migration's target.
    unsafe fn row_removed(&self, arr: &Array, idx: usize, bits: u64, cx: &Cx<'_>, guard: &Guard) {
        self.len.fetch_sub(1, Ordering::SeqCst);
        // SAFETY: the caller's contract.
        unsafe { self.release_key(arr, bits, guard) };
        self.clean_after(arr, idx, guard);
        self.shrink_pending(cx, guard);
    }

    /// The state of `key`'s row, if it has one; at `now`, the lots expired
    /// by then settled.
    pub(crate) fn peek<P: Probe>(
        &self,
        hash: u64,
        key: &P,
        now: Option<u64>,
        guard: &Guard,
    ) -> Option<Held> {
        match self.find(hash, key, false, guard) {
            // A dormant cell is no row (its key's floor holds its `tat`).
            Found::Row { tat, .. } if held::dormant(tat).is_some() => None,
            Found::Row { tat, .. } => {
                // SAFETY: `tat` is the field of a live cell read under
                // `guard`.
                let s = unsafe { Held::of(tat, &self.form, guard) };
                Some(now.map_or(s, |now| s.at(now, &self.form)))
            }
            _ => None,
        }
    }

    /// Resolves a hold of `key` (`held/`): its tokens leave its lot, and
    /// with `keep` are settled as a debit from the hold's reading. False
    /// when its lot is gone (it expired and counted as kept).
    #[cfg(any(test, feature = "__internals"))]
    pub(crate) fn resolve<P: Probe>(
        &self,
        hash: u64,
        key: &P,
        ticket: Ticket,
        keep: bool,
        cx: &Cx<'_>,
        guard: &Guard,
    ) -> bool {
        match self.resolve_first(hash, key, ticket, keep, cx.now, guard) {
            Some(r) => r,
            None => self.resolve_rest(hash, key, ticket, keep, cx, guard),
        }
    }

    /// [`resolve`](Table::resolve) after
    /// [`resolve_first`](Table::resolve_first) left it: the walk, then this
    /// call's share of a running migration.
    pub(crate) fn resolve_rest<P: Probe>(
        &self,
        hash: u64,
        key: &P,
        ticket: Ticket,
        keep: bool,
        cx: &Cx<'_>,
        guard: &Guard,
    ) -> bool {
        let r = self.resolve_row(hash, key, ticket, keep, cx, guard);
        if !cx.copied.get() {
            self.help(cx, guard);
        }
        r
    }

    /// [`resolve`](Table::resolve) of a held row among its key's first
    /// cells ([`near`]) of a current array that is not migrating, in one
    /// try: `None` when the row is elsewhere, its resolution would remove
    /// it (full, nothing held left), or the CAS lost;
    /// [`resolve_row`](Table::resolve_row) takes over then.
    #[inline(always)]
    pub(crate) fn resolve_first<P: Probe>(
        &self,
        hash: u64,
        key: &P,
        ticket: Ticket,
        keep: bool,
        now: u64,
        guard: &Guard,
    ) -> Option<bool> {
        let arr = self.array(guard);
        if !arr.next.load(Ordering::Relaxed, guard).is_null() {
            return None;
        }
        // SAFETY: `arr` was loaded under `guard`, which `key` probes with.
        let Near { idx, v, bits, tat } = unsafe { near(arr, hash, key) }?;
        if tat < HELD {
            return None;
        }
        if !held::on_its_row(bits, &ticket) {
            return Some(false); // another key's row, or a row made since
        }
        if let Some(field) = self.form.resolve_word(tat, ticket, keep, now) {
            let new = cell::live_value(bits, field);
            return arr.cells[idx].cas(v, new).ok().map(|_| true);
        }
        // SAFETY: `tat` is the field of a live cell read under `guard`.
        let was = unsafe { Held::of(tat, &self.form, guard) }.at(now, &self.form);
        let Resolution::Done(next) = was.resolve(ticket, keep, &self.form) else {
            return Some(false);
        };
        if next.is_plain() && next.tat <= now {
            return None;
        }
        self.replace_row(arr, idx, v, next, guard)
            .ok()
            .map(|()| true)
    }

    /// A resolution of `ticket` at the cell a hold made in this pin left
    /// (`spot`), with no probe: `None` unless that cell is in the current
    /// array, which is not migrating, still holds the hold's row with the
    /// field the hold wrote, and the word path decides
    /// ([`held::Form::resolve_word`]); [`resolve_first`](Table::resolve_first)
    /// decides then. Where it decides, it writes what `resolve_first` would
    /// on reading that cell.
    #[inline(always)]
    pub(crate) fn resolve_spot(
        &self,
        spot: Spot,
        ticket: Ticket,
        keep: bool,
        now: u64,
        guard: &Guard,
    ) -> Option<bool> {
        let arr = self.array(guard);
        if !arr.next.load(Ordering::Relaxed, guard).is_null() {
            return None;
        }
        // The cell's index in the current array, if it is one of its cells.
        let off = spot.at.wrapping_sub(arr.cells.as_ptr() as usize);
        if !off.is_multiple_of(std::mem::size_of::<Cell>()) {
            return None;
        }
        let cell = arr.cells.get(off / std::mem::size_of::<Cell>())?;
        let v = cell::live_value(ticket.row, spot.field);
        let field = self.form.resolve_word(spot.field, ticket, keep, now)?;
        spot_write(cell, v, cell::live_value(ticket.row, field)).then_some(true)
    }

    /// [`resolve`](Table::resolve)'s own row.
    fn resolve_row<P: Probe>(
        &self,
        hash: u64,
        key: &P,
        ticket: Ticket,
        keep: bool,
        cx: &Cx<'_>,
        guard: &Guard,
    ) -> bool {
        let now = cx.now;
        let backoff = Backoff::new();
        'find: loop {
            let Found::Row {
                arr,
                idx,
                mut v,
                bits,
                mut tat,
            } = self.find(hash, key, false, guard)
            else {
                return false;
            };
            if !held::on_its_row(bits, &ticket) {
                return false; // another key's row, or a row made since
            }
            loop {
                if tat < HELD {
                    return false; // a plain row holds no lot
                }
                // SAFETY: `tat` is the field of a live cell read under
                // `guard`.
                let was = unsafe { Held::of(tat, &self.form, guard) }.at(now, &self.form);
                let Resolution::Done(next) = was.resolve(ticket, keep, &self.form) else {
                    return false;
                };
                // A resolution that leaves a full bucket and nothing held
                // removes the row, as a refund to full does (floor raised
                // first; never from an array older than the current one's
                // target, whose cells are frozen anyway).
                let full =
                    next.is_plain() && next.tat <= now && self.source_of(arr, guard).is_some();
                let replaced = if full {
                    self.floors.raise(self.stripe(hash, bits), next.tat);
                    arr.cells[idx].cas(v, CellState::Tomb.encode()).map(|_| {
                        // SAFETY: our CAS replaced `tat` in a cell of
                        // `arr` and made that cell a tombstone.
                        unsafe {
                            self.drop_record(arr, tat, guard);
                            self.row_removed(arr, idx, bits, cx, guard);
                        }
                    })
                } else {
                    self.replace_row(arr, idx, v, next, guard)
                };
                match replaced {
                    Ok(()) => return true,
                    Err(actual) => match CellState::decode(actual) {
                        CellState::Live { key: k, tat: t } if k == bits => {
                            v = actual;
                            tat = t;
                            cas_retry(&backoff);
                        }
                        CellState::FrozenLive { .. } | CellState::Moved { .. } => continue 'find,
                        _ => return false,
                    },
                }
            }
        }
    }
}

/// The cell a refund read its key's row in: cell `idx` of `arr` held `v`,
/// whose key half is `bits` and whose field is `tat`.
#[derive(Clone, Copy)]
struct Seen<'g> {
    arr: &'g Array,
    idx: usize,
    v: u128,
    bits: u64,
    tat: u64,
}

/// What a refund does after one attempt on its row.
enum Step {
    /// The answer.
    Done(Undone),
    /// The row changed and is still the key's, live: try again on `actual`.
    Retry { actual: u128, tat: u64 },
    /// The row was frozen by a copier: find it again (in the target).
    Find,
}

impl Step {
    /// The step after a CAS on the row whose key half is `bits` found
    /// `actual` instead; `follow`: whether a frozen row is looked for again
    /// (otherwise nothing is returned).
    #[inline(always)]
    fn after_lost_cas(actual: u128, bits: u64, follow: bool) -> Step {
        match CellState::decode(actual) {
            CellState::Live { key: k, tat } if k == bits => Step::Retry { actual, tat },
            CellState::FrozenLive { .. } | CellState::Moved { .. } if follow => Step::Find,
            // Removed (full) or reused since: nothing to return.
            _ => Step::Done(Undone::Refilled),
        }
    }
}

/// Whether a refund that finds its row frozen or moved by a copier looks
/// for it in the target: always.
#[cfg(not(pace_mutant = "refund_gives_up_on_frozen"))]
#[inline]
const fn refund_follows_copies() -> bool {
    true
}

/// Known-wrong variant `refund_gives_up_on_frozen`: such a refund gives up,
/// losing the tokens.
#[cfg(pace_mutant = "refund_gives_up_on_frozen")]
const fn refund_follows_copies() -> bool {
    false
}

/// [`Table::resolve_spot`]'s write: one CAS from the value the hold wrote.
#[cfg(not(pace_mutant = "spot_written_blind"))]
#[inline(always)]
fn spot_write(cell: &Cell, v: u128, new: u128) -> bool {
    cell.cas(v, new).is_ok()
}

/// Known-wrong variant `spot_written_blind`: the resolution is stored over
/// whatever the cell holds, as if nothing had changed the row since the
/// hold.
#[cfg(pace_mutant = "spot_written_blind")]
#[inline(always)]
fn spot_write(cell: &Cell, _v: u128, new: u128) -> bool {
    cell.store(new);
    true
}
