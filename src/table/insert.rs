//! Reserving: the debit of a live row (one CAS), and the insert of a new
//! one: claim a cell, check the key's whole sequence, promote the claim with
//! the first debit (DESIGN.md §2, "Inserting: claim, then check").

use crossbeam_utils::Backoff;

use super::array::Array;
use super::cell::{self, Cell, CellState};
use super::held::{self, Held, HELD};
use super::keys::{NewRow, Probe};
use super::take::Take;
use super::{
    is_migrating, near_after, probe_seq, Admitted, Ask, Cx, Found, Near, Reserve, Spot, SpotSink,
    Table, Taken,
};
use crate::bucket::Decision;
use crate::sync::epoch::Guard;
use crate::sync::{cas_retry, fence, snooze, Ordering};

/// Why a claim failed.
enum Lost {
    /// The cell changed first: look again.
    Taken,
    /// The array is at its limit: migrate.
    NoRoom,
}

/// What [`Table::verify`] decides for a claim.
enum Verdict {
    Keep,
    Withdraw,
    /// Withdraw, wait while this earlier cell holds a claim of the key.
    Await(usize),
}

/// A claim its inserter has not yet made a row: dropped (also when a key's
/// `Eq` panics in [`Table::verify`]), it is withdrawn and its key box
/// retired. Becoming the row forgets it.
struct Claim<'t, 'g> {
    table: &'t Table,
    arr: &'g Array,
    at: usize,
    bits: u64,
    guard: &'g Guard,
}

impl Drop for Claim<'_, '_> {
    #[cfg(not(pace_mutant = "claimed_left_on_panic"))]
    fn drop(&mut self) {
        self.table
            .withdraw(self.arr, self.at, self.bits, self.guard);
    }

    /// Known-wrong variant `claimed_left_on_panic`: a claim whose check
    /// panicked stays claimed (its cell is lost to the array, `len` counts
    /// it for good).
    #[cfg(pace_mutant = "claimed_left_on_panic")]
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.table
                .withdraw(self.arr, self.at, self.bits, self.guard);
        }
    }
}

/// The bits of a new row that no claim has published yet: a box among them
/// is freed when this drops (nobody else has seen it).
struct Fresh {
    bits: Option<u64>,
    free: Option<unsafe fn(u64)>,
}

impl Drop for Fresh {
    fn drop(&mut self) {
        if let (Some(bits), Some(free)) = (self.bits, self.free) {
            // SAFETY: `bits` were made by the probe's `make` for this table
            // (whose boxes `free` frees) and never published: no claim of
            // them succeeded (a claim that does takes them out first).
            unsafe { free(bits) };
        }
    }
}

impl Table {
    /// Takes (`T`: a debit or a hold) the request's tokens from its key's
    /// bucket, creating its row if absent (from its floor). A denial
    /// writes and creates nothing.
    ///
    /// The key's first cell of a current array that is not migrating is
    /// probed here, inline, and the next few cells out of line
    /// ([`reserve_near`](Table::reserve_near)) when the walk would pass over
    /// the first: a row found there is debited at once.
    #[inline(always)]
    pub(crate) fn reserve<P: NewRow, T: Take, W: SpotSink>(
        &self,
        req: Reserve<'_, P, W>,
    ) -> Result<Admitted, Decision> {
        let Reserve {
            ask,
            hash,
            key,
            reread,
            hash_of,
            guard,
            spot,
        } = req;
        let arr = self.array(guard);
        if arr.next.load(Ordering::Relaxed, guard).is_null() {
            let idx = hash as usize & arr.mask();
            let v = arr.cells[idx].load();
            let passed = match cell::live(v) {
                // SAFETY: `bits` was read under `guard` from a live cell.
                Some((bits, tat)) if unsafe { key.matches(bits) } => {
                    // (A plain reserve of a held row takes the slow path:
                    // the plain one stays as small as it was.)
                    if T::HOLD || tat < HELD {
                        let r = if T::HOLD {
                            if let Some(r) = self.hold_in_word(arr, idx, v, bits, tat, ask, spot) {
                                return r;
                            }
                            self.change_held::<T>(arr, idx, v, ask, guard)
                        } else {
                            self.debit(arr, idx, v, ask)
                        };
                        if let Some(r) = r {
                            return r;
                        }
                    } else if let Some(kept) = held::dormant(tat) {
                        // A dormant cell of the key: revived with one CAS.
                        if let Some(r) = self.revive(arr, idx, v, kept, ask, guard) {
                            return r;
                        }
                    }
                    false
                }
                Some(_) => true,
                None => cell::passed_over(v),
            };
            if passed {
                if let Some(r) = self.reserve_near::<P, T, W>(arr, idx, key, ask, guard, spot) {
                    return r;
                }
            }
        }
        self.reserve_slow::<P, T>(ask, hash, key, reread, hash_of, guard)
    }

    /// [`reserve`](Table::reserve) of a row a few cells on: the cells after
    /// the key's first cell `first` of `arr` (not migrating), which the walk
    /// passes over, probed as the walk does ([`near_after`]), and the key's
    /// row found there debited or held. `None` when the walk must decide.
    #[inline(never)]
    fn reserve_near<P: Probe, T: Take, W: SpotSink>(
        &self,
        arr: &Array,
        first: usize,
        key: &P,
        ask: Ask<'_>,
        guard: &Guard,
        spot: W,
    ) -> Option<Result<Admitted, Decision>> {
        // SAFETY: `arr` was loaded under `guard`, which `key` probes with.
        let Near { idx, v, bits, tat } = unsafe { near_after(arr, first, key) }?;
        if T::HOLD {
            if let Some(r) = self.hold_in_word(arr, idx, v, bits, tat, ask, spot) {
                return Some(r);
            }
            self.change_held::<T>(arr, idx, v, ask, guard)
        } else if tat < HELD {
            self.debit(arr, idx, v, ask)
        } else if let Some(kept) = held::dormant(tat) {
            self.revive(arr, idx, v, kept, ask, guard)
        } else {
            None
        }
    }

    /// Everything but a row in the key's first cells: the walk, inserts,
    /// migrations. After its own row, a call that walked starts a pending
    /// shrink and copies one chunk of a running migration (a call that starts one or
    /// finds its target full copies again only through `start_migration`,
    /// so no call copies more than a constant). The copy comes after the
    /// call's own debit, so a row of its key that is full is debited, not
    /// removed under it first.
    #[inline(never)]
    fn reserve_slow<P: NewRow, T: Take>(
        &self,
        ask: Ask<'_>,
        hash: u64,
        key: &P,
        reread: &dyn Fn() -> u64,
        hash_of: &dyn Fn(u64) -> u64,
        guard: &Guard,
    ) -> Result<Admitted, Decision> {
        let cx = &Cx::new(hash_of, ask.now);
        let r = self.reserve_walk::<P, T>(ask, hash, key, reread, cx, guard);
        self.shrink_pending(cx, guard);
        if !cx.copied.get() {
            self.help(cx, guard);
        }
        r
    }

    /// [`reserve_slow`](Table::reserve_slow)'s walk, insert and retries.
    fn reserve_walk<P: NewRow, T: Take>(
        &self,
        ask: Ask<'_>,
        hash: u64,
        key: &P,
        reread: &dyn Fn() -> u64,
        cx: &Cx<'_>,
        guard: &Guard,
    ) -> Result<Admitted, Decision> {
        let Ask { limits, n, mut now } = ask;
        let backoff = Backoff::new();
        // The bits of the row this call would create: made once, when the
        // first claim is tried, and again only after a claim published
        // them and lost (its box is then retired). Bits never published
        // are freed when `fresh` drops, also if a key's `Eq` panics.
        let mut fresh = Fresh {
            bits: None,
            free: self.boxed,
        };
        loop {
            let (arr, empty, tomb) = match self.find(hash, key, true, guard) {
                Found::Row {
                    arr, idx, v, tat, ..
                } => {
                    let ask = Ask { limits, n, now };
                    let r = if T::HOLD || tat >= HELD {
                        self.change_held::<T>(arr, idx, v, ask, guard)
                    } else {
                        self.debit(arr, idx, v, ask)
                    };
                    match r {
                        Some(r) => return r,
                        None => continue, // changed kind, removed or frozen under us
                    }
                }
                Found::Absent { arr, empty, tomb } => (arr, Some(empty), tomb),
                Found::Full { arr, tomb } => (arr, None, tomb),
            };
            // An absent row starts from its floor: decide before creating.
            // A word-sized key's stripe comes from its bits (made now when
            // the probe lacks them: a borrowed form, whose bits cost no
            // allocation); a boxed key's from its hash.
            let bits = match (self.boxed, key.word()) {
                (None, None) => *fresh.bits.get_or_insert_with(|| key.make()),
                (_, word) => word.unwrap_or(0),
            };
            let stripe = self.stripe(hash, bits);
            self.note_new_row(hash, bits);
            let floor = self.floors.get(stripe);
            if floor > now {
                now = now.max(reread());
            }
            if let d @ (Decision::Wait(_) | Decision::Never | Decision::TimeExhausted) =
                limits.reserve(floor, now, n)
            {
                return Err(d);
            }
            let mine = *fresh.bits.get_or_insert_with(|| key.make());
            let claim = match self.claim(arr, mine, empty, tomb, guard) {
                Ok(at) => Claim {
                    table: self,
                    arr,
                    at,
                    bits: mine,
                    guard,
                },
                Err(Lost::NoRoom) => {
                    self.make_room(arr, cx, &backoff, guard);
                    continue;
                }
                Err(Lost::Taken) => {
                    // Taken first, a cleaner's fence, or a migration began.
                    snooze(&backoff);
                    continue;
                }
            };
            // From here the bits are published: whatever happens to the
            // claim, `withdraw` (run by dropping `claim`) or the row owns
            // them.
            fresh.bits = None;
            let mut ask = Ask { limits, n, now };
            let made = self.make_row::<P, T>(claim, hash, key, &mut ask, reread);
            now = ask.now;
            if let Some(r) = made {
                return r;
            }
        }
    }

    /// Room for a claim that found none in `arr`: mostly tombstones, a
    /// chunk cleaned in place (claim again); else a migration started.
    #[cold]
    fn make_room(&self, arr: &Array, cx: &Cx<'_>, backoff: &Backoff, guard: &Guard) {
        if !self.clean_some(arr, guard) {
            // Before the call's own row: its copies remove nothing (a
            // removal would raise the floor this insert starts from, after
            // its decision).
            self.start_migration(arr, &cx.keeping_all(), guard);
            cx.copied.set(true);
            // The full array may be a target whose copy other callers are
            // finishing: let them.
            snooze(backoff);
        }
    }

    /// After a claim withdrawn on `verdict` (not `Keep`): a pause, and with
    /// `Await`, a wait until the earlier claim of the key in `arr` is no
    /// longer a claim (it became the row or was withdrawn). `_guard` is the
    /// guard `key` probes with and `arr` was loaded under.
    #[cold]
    fn after_withdrawal<P: NewRow>(verdict: Verdict, arr: &Array, key: &P, _guard: &Guard) {
        let backoff = Backoff::new();
        snooze(&backoff);
        if let Verdict::Await(earlier) = verdict {
            let claimed_by_key = |v: u128| match CellState::decode(v) {
                CellState::Claimed { key: k } => {
                    // SAFETY: `k` was read from a claimed cell of `arr`
                    // while `_guard`, the probe's guard, pins the epoch.
                    unsafe { key.matches(k) }
                }
                _ => false,
            };
            while claimed_by_key(arr.cells[earlier].load()) {
                snooze(&backoff);
            }
        }
    }

    /// A published claim's way to becoming its key's row (after
    /// [`reserve_walk`](Table::reserve_walk) claimed a cell): the check
    /// against the key's other inserters, then the floor, the decision and
    /// the claim's CAS to the row with its first debit. `None` when the
    /// claim was withdrawn (look again); `ask.now` is the latest reading.
    #[inline(always)]
    fn make_row<'g, P: NewRow, T: Take>(
        &self,
        claim: Claim<'_, 'g>,
        hash: u64,
        key: &P,
        ask: &mut Ask<'_>,
        reread: &dyn Fn() -> u64,
    ) -> Option<Result<Admitted, Decision>> {
        let (arr, mine, guard) = (claim.arr, claim.bits, claim.guard);
        let Ask { limits, n, mut now } = *ask;
        // Dekker with every other inserter of the key: each claims,
        // fences, then reads the whole sequence (see `verify`).
        fence(Ordering::SeqCst);
        match self.verify(hash, key, arr, claim.at, guard) {
            Verdict::Keep => {}
            verdict => {
                drop(claim);
                Self::after_withdrawal(verdict, arr, key, guard);
                return None;
            }
        }
        // The floor again, after the check: a row of the key removed
        // while we checked raised it before its cell became a tombstone.
        // The claim becomes the row with this debit in one CAS, so no
        // row is ever live before its first debit (a sweep would take
        // it for full); a denial now withdraws the claim.
        let floor = self.floors.get(self.stripe(hash, mine));
        if floor > now {
            now = now.max(reread());
            ask.now = now;
        }
        match T::on_fresh(floor, limits, now, n, &self.form) {
            Ok((field, taken)) => {
                let admitted = match taken {
                    Taken::Hold(t) => Admitted::hold(t.on_row(mine), true),
                    Taken::Debit { tat, prev } => Admitted::debit(tat, prev, true, 0),
                };
                let claimed = CellState::Claimed { key: mine }.encode();
                let live = CellState::Live {
                    key: mine,
                    tat: field,
                }
                .encode();
                if arr.cells[claim.at].cas(claimed, live).is_ok() {
                    std::mem::forget(claim);
                    return Some(Ok(admitted));
                }
                // SAFETY: the record (if any) was never published.
                unsafe { held::free(field) };
                // A copier froze the claim: it is not copied; look again.
                drop(claim);
                None
            }
            Err(denied) => {
                drop(claim);
                Some(Err(denied))
            }
        }
    }

    /// Counts one more row unless `arr` is migrating: the handshake with
    /// `start_migration`, which sizes the target from `len` after sealing.
    /// The row is counted before it is linked, and the migration check
    /// comes after the count (both SeqCst): a migration that sizes its
    /// target from `len` after sealing `next` counts every row that can
    /// still be claimed in the array.
    fn count_row(&self, arr: &Array, guard: &Guard) -> bool {
        let migrating = || is_migrating(arr.next.load(Ordering::SeqCst, guard));
        if migrating() {
            return false;
        }
        self.len.fetch_add(1, Ordering::SeqCst);
        // Dekker with `start_migration` (seal `next`, fence, read `len`): at
        // least one side sees the other's write. The fence makes the
        // argument hold in loom too, which models SeqCst accesses as AcqRel.
        fence(Ordering::SeqCst);
        if migrating() {
            self.len.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Claims a cell of `arr` for the key whose bits are `bits`: the
    /// tombstone if there is one, else the empty cell (if the array has
    /// room for one more used cell).
    fn claim(
        &self,
        arr: &Array,
        bits: u64,
        empty: Option<usize>,
        tomb: Option<(usize, u128)>,
        guard: &Guard,
    ) -> Result<usize, Lost> {
        if !self.count_row(arr, guard) {
            return Err(Lost::Taken);
        }
        let claim = CellState::Claimed { key: bits }.encode();
        // A dormant cell of another key (the walk passed no tombstone) is
        // taken over only when the array has no room for the empty cell.
        let asleep = tomb.and_then(|(at, v)| {
            let (other, field) = cell::live(v)?;
            held::dormant(field).map(|_| (at, v, other))
        });
        let tomb = tomb.filter(|_| asleep.is_none());
        let lost = if let Some((at, v)) = tomb {
            // A tombstone is already counted in `used`; a copier that froze
            // it first makes this CAS fail.
            if arr.cells[at].cas(v, claim).is_ok() {
                return Ok(at);
            }
            Lost::Taken
        } else {
            let lost = if let Some(at) = empty {
                let limit = arr.limit.load(Ordering::Acquire);
                if arr.used.fetch_add(1, Ordering::Relaxed) < limit {
                    if arr.cells[at].cas(0, claim).is_ok() {
                        return Ok(at);
                    }
                    arr.used.fetch_sub(1, Ordering::Relaxed);
                    Lost::Taken
                } else {
                    arr.used.fetch_sub(1, Ordering::Relaxed);
                    Lost::NoRoom
                }
            } else {
                Lost::NoRoom
            };
            match (lost, asleep) {
                (Lost::NoRoom, Some((at, v, other))) => {
                    // Taken over as a sweep drops a dormant cell (its key's
                    // floor holds the `tat` it kept). It is already counted
                    // in `used`; a copier that froze it first makes the CAS
                    // fail.
                    if arr.cells[at].cas(v, claim).is_ok() {
                        // SAFETY: our CAS took the dormant cell of `other`
                        // over in `arr`; no other cell names its box.
                        unsafe { self.dormant_taken(arr, other, guard) };
                        self.count_take_over();
                        return Ok(at);
                    }
                    Lost::Taken
                }
                (lost, _) => lost,
            }
        };
        self.len.fetch_sub(1, Ordering::SeqCst);
        Err(lost)
    }

    /// Withdraws the claim of `bits` at `at` of `arr`: it becomes a
    /// tombstone (still used), or stays as a copier froze it (never
    /// copied). Either way its key box leaves the table.
    fn withdraw(&self, arr: &Array, at: usize, bits: u64, guard: &Guard) {
        let claim = CellState::Claimed { key: bits }.encode();
        let _ = arr.cells[at].cas(claim, CellState::Tomb.encode());
        self.len.fetch_sub(1, Ordering::SeqCst);
        // SAFETY: the claim's cell no longer names the box (a tombstone's
        // key half is zero), or names it frozen (`FrozenClaimed`, which no
        // reader dereferences); the box was in no other cell, and only its
        // inserter, here, retires it.
        unsafe { self.retire_key(bits, guard) };
    }

    /// Whether our claim in cell `at` of `my_arr` may become `key`'s row: no
    /// live row of the key on its sequence in any array, no claim of it
    /// earlier in ours, and our array still the newest.
    #[cfg(not(pace_mutant = "verify_off"))]
    fn verify<P: Probe>(
        &self,
        hash: u64,
        key: &P,
        my_arr: &Array,
        at: usize,
        guard: &Guard,
    ) -> Verdict {
        let still_newest = || !is_migrating(my_arr.next.load(Ordering::SeqCst, guard));
        let keep_if = |keep: bool| {
            if keep {
                Verdict::Keep
            } else {
                Verdict::Withdraw
            }
        };
        let is_key = |k: u64| {
            // SAFETY: called below only with the key half of a cell read
            // under `guard` in a live, frozen live or claimed state.
            unsafe { key.matches(k) }
        };
        let backoff = Backoff::new();
        let mut seen_me = false;
        let mut arr = self.array(guard);
        'arrays: loop {
            let mine = std::ptr::eq(arr, my_arr);
            for idx in probe_seq(hash, arr.mask()) {
                loop {
                    if mine && idx == at {
                        match CellState::decode(arr.cells[idx].load()) {
                            CellState::Claimed { .. } => seen_me = true,
                            _ => return Verdict::Withdraw, // frozen by a copier
                        }
                        break;
                    }
                    match CellState::decode(arr.cells[idx].load()) {
                        CellState::Empty | CellState::Fence | CellState::Sealed if mine => {
                            // A cleaner may have emptied a cell before ours
                            // since the walk that chose it.
                            return keep_if(seen_me && still_newest());
                        }
                        CellState::Empty | CellState::Fence | CellState::Sealed => {
                            if !is_migrating(arr.next.load(Ordering::SeqCst, guard)) {
                                return Verdict::Withdraw; // our array migrated away
                            }
                            arr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        CellState::Live { key: k, .. } | CellState::FrozenLive { key: k, .. }
                            if is_key(k) =>
                        {
                            return Verdict::Withdraw; // the key's row
                        }
                        CellState::Claimed { key: k } if is_key(k) => {
                            if mine && !seen_me {
                                return Verdict::Await(idx);
                            }
                            if !still_newest() {
                                return Verdict::Withdraw;
                            }
                            // A later claim, or one in an older array: its
                            // inserter withdraws or is promoted (then we
                            // withdraw).
                            snooze(&backoff);
                            continue;
                        }
                        _ => {} // other keys, tombstones, moved rows, dead claims
                    }
                    break;
                }
            }
            if mine {
                return keep_if(seen_me && still_newest());
            }
            if !is_migrating(arr.next.load(Ordering::SeqCst, guard)) {
                return Verdict::Withdraw;
            }
            arr = self.next_of(arr, guard);
        }
    }

    /// Known-wrong variant `verify_off`: every claim is kept unchecked.
    #[cfg(pace_mutant = "verify_off")]
    fn verify<P: Probe>(&self, _: u64, _: &P, _: &Array, _: usize, _: &Guard) -> Verdict {
        Verdict::Keep
    }

    /// The CAS loop that debits the plain row in cell `idx` of `arr`, which
    /// held the live value `v`. `None` if the row was removed, frozen or
    /// held first (look again).
    #[inline(always)]
    fn debit(
        &self,
        arr: &Array,
        idx: usize,
        mut v: u128,
        ask: Ask<'_>,
    ) -> Option<Result<Admitted, Decision>> {
        let Ask { limits, n, now } = ask;
        let (bits, mut tat) = cell::live_parts(v);
        let backoff = Backoff::new();
        loop {
            match limits.reserve(tat, now, n) {
                Decision::Admit(new) => {
                    let next = CellState::Live {
                        key: bits,
                        tat: new,
                    }
                    .encode();
                    match write_debit(&arr.cells[idx], v, next) {
                        Ok(_) => return Some(Ok(Admitted::debit(new, tat, false, 0))),
                        Err(actual) => match cell::live_tat(actual, bits) {
                            Some(t) if t < HELD => {
                                v = actual;
                                tat = t;
                                cas_retry(&backoff);
                            }
                            _ => return None,
                        },
                    }
                }
                denied => return Some(Err(denied)),
            }
        }
    }

    /// A plain debit of the dormant cell `idx` of `arr` (value `v`, which
    /// kept `kept`): decided from the revived state
    /// ([`revived`](Table::revived)), then one CAS after the revival's
    /// check for a migration ([`enter_revival`](Table::enter_revival)).
    /// `None` when the cell changed first or the array is migrating (the
    /// cell is then dropped: look again).
    #[inline(never)]
    fn revive(
        &self,
        arr: &Array,
        idx: usize,
        v: u128,
        kept: u64,
        ask: Ask<'_>,
        guard: &Guard,
    ) -> Option<Result<Admitted, Decision>> {
        let Ask { limits, n, now } = ask;
        let bits = cell::live_parts(v).0;
        // SAFETY: `bits` is the key half of the live cell `v`, read under
        // `guard`.
        let from = unsafe { self.revived(kept, bits, guard) }.tat;
        let new = match limits.reserve(from, now, n) {
            Decision::Admit(new) => new,
            denied => return Some(Err(denied)),
        };
        if !self.enter_revival(arr, guard) {
            // SAFETY: `v` was read under `guard` from cell `idx` of `arr`,
            // and is a dormant cell's.
            unsafe { self.drop_dormant(arr, idx, v, bits, guard) };
            return None;
        }
        let next = cell::live_value(bits, new);
        if arr.cells[idx].cas(v, next).is_err() {
            self.leave_revival();
            return None;
        }
        Some(Ok(Admitted::debit(new, from, true, 0)))
    }

    /// A hold on the row in cell `idx` of `arr` (value `v`, key half `bits`,
    /// field `tat`) worked on its word (`held::Form::hold_word`): one CAS,
    /// no record. `None` when the word path does not decide it or the CAS
    /// lost: [`change_held`](Table::change_held) takes over.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn hold_in_word<W: SpotSink>(
        &self,
        arr: &Array,
        idx: usize,
        v: u128,
        bits: u64,
        tat: u64,
        ask: Ask<'_>,
        spot: W,
    ) -> Option<Result<Admitted, Decision>> {
        let Ask { limits, n, now } = ask;
        let e = self.form.epoch(now);
        let (field, ticket) = self.form.hold_word(tat, limits, now, e, n)?;
        let new = cell::live_value(bits, field);
        arr.cells[idx].cas(v, new).ok()?;
        spot.put(Spot {
            at: &arr.cells[idx] as *const Cell as usize,
            field,
        });
        Some(Ok(Admitted::hold(ticket.on_row(bits), false)))
    }

    /// [`debit`](Table::debit) of a held row, or a hold: each try reads the
    /// row's state (`tat` field `tat`), settles what expired, decides, and
    /// replaces the state with one CAS. A plain debit reports the settled
    /// `tat` before and after it (what its refund compares and restores).
    #[inline(never)]
    fn change_held<T: Take>(
        &self,
        arr: &Array,
        idx: usize,
        mut v: u128,
        ask: Ask<'_>,
        guard: &Guard,
    ) -> Option<Result<Admitted, Decision>> {
        let Ask { limits, n, now } = ask;
        let (bits, mut tat) = cell::live_parts(v);
        let backoff = Backoff::new();
        let form = &self.form;
        let e = form.epoch(now);
        loop {
            // SAFETY: `tat` is the field of a live cell read under `guard`.
            let mut was = unsafe { Held::of(tat, form, guard) }.at_epoch(e, form);
            // A revival makes the key's row, as an insert would (the sweep
            // policy counts it so: `Pace::maybe_sweep`).
            let revival = held::dormant(tat).is_some();
            if revival {
                // SAFETY: `bits` is the key half of that live cell.
                was = unsafe { self.revived(was.tat, bits, guard) };
            }
            let (next, taken) = match T::on_state(was, limits, now, e, n, form) {
                Ok(c) => c,
                Err(denied) => return Some(Err(denied)),
            };
            match self.replace_row(arr, idx, v, next, guard) {
                Ok(()) => {
                    return Some(Ok(match taken {
                        Taken::Hold(t) => Admitted::hold(t.on_row(bits), revival),
                        Taken::Debit { tat, prev } => {
                            Admitted::debit(tat, prev, revival, was.held())
                        }
                    }));
                }
                Err(actual) => match cell::live_tat(actual, bits) {
                    Some(t) => {
                        v = actual;
                        tat = t;
                        cas_retry(&backoff);
                    }
                    None => return None,
                },
            }
        }
    }
}

impl Table {
    /// The state a dormant cell that kept `tat` (key half `bits`) is revived
    /// in: a plain row from its key's floor, which the pass that made it
    /// dormant raised to `tat` first. A revival thus decides as the key's
    /// row made anew would (never below any earlier row of the key, whatever
    /// the reviver's reading), without a claim, a check or a key box.
    ///
    /// # Safety
    /// `bits` is the key half of a live cell read under `guard`.
    #[cfg(not(pace_mutant = "revive_from_now"))]
    #[inline]
    unsafe fn revived(&self, tat: u64, bits: u64, guard: &Guard) -> Held {
        // SAFETY: this function's contract.
        let stripe = unsafe { self.stripe_of_row(bits, guard) };
        Held::plain(tat.max(self.floors.get(stripe)))
    }

    /// Known-wrong variant `revive_from_now`: a revival forgets the `tat`
    /// its cell kept and its floor, and starts from the reviver's reading
    /// as a bucket that was never debited, so a reading older than the
    /// kept `tat` mints tokens.
    ///
    /// # Safety
    /// As for the right variant.
    #[cfg(pace_mutant = "revive_from_now")]
    unsafe fn revived(&self, _: u64, _: u64, _: &Guard) -> Held {
        Held::plain(0)
    }
}

/// Writes a debit decided on the cell's value `v`: a CAS from `v`, so a
/// debit lands only on the state it was decided on (`Err`: the value found).
#[cfg(not(pace_mutant = "check_then_debit"))]
#[inline(always)]
fn write_debit(cell: &Cell, v: u128, next: u128) -> Result<u128, u128> {
    cell.cas(v, next)
}

/// Known-wrong variant `check_then_debit`: decide on the value read, then
/// store, so two debits that read one state both land.
#[cfg(pace_mutant = "check_then_debit")]
fn write_debit(cell: &Cell, v: u128, next: u128) -> Result<u128, u128> {
    cell.store(next);
    Ok(v)
}
