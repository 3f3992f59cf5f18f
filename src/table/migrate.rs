//! Incremental migration: moving every row of the current array to a new one
//! (larger, smaller, or the same size without tombstones), chunks at a time.
//!
//! * Starting is O(1): seal the array's `next` (PENDING), size the target
//!   from the row count, allocate it zeroed (no pass over it), publish it.
//!   An array with no rows and no insert in flight (`len == 0` after the
//!   seal) has nothing to copy: the target becomes current at once.
//! * Every reserve, hold, refund and resolution that finds a migration
//!   running copies one chunk of [`CHUNK`] cells after its own row, and
//!   more while they held fewer than [`SPARSE_ROWS`] rows, up to
//!   [`CALL_CELLS`] cells: nobody waits for the copy, and no call copies
//!   more than a constant amount.
//! * While it runs, lookups read through: a key is looked for in the current
//!   array first and followed to the target when its probe sequence there
//!   ends (an empty cell, which an inserting lookup seals, or a sealed one)
//!   or names it moved. New rows go to the target only.
//! * Copying a chunk freezes each of its cells (one CAS sets FROZEN: a
//!   frozen cell takes no debit, claim or removal), then writes each frozen
//!   row live into the target and marks its old cell `Moved`, except a
//!   plain row whose bucket is full at the copier's reading: that one is
//!   removed as a sweep removes it (floor raised to its `tat`, cell closed),
//!   so a migration carries only rows that still owe something. A held row
//!   is never full: it is copied as it is. A debit that
//!   meets a frozen row of its key waits for that one cell, then finds the
//!   row in the target. The key half moves with the row: a key box is
//!   never copied, and the target's row owns it from then on.
//! * The copier of the last chunk makes the target current and retires the
//!   old array. A target cannot start its own migration before that (only
//!   the current array migrates); its `limit` keeps room for every row still
//!   to be copied.

use crossbeam_utils::Backoff;

use super::array::{retire_array, Array};
use super::cell::{self, Cell, CellState};
use super::held::HELD;
use super::sized_rows;
use super::sweep::prefetch;
use super::{
    is_migrating, probe_seq, Cx, Table, CALL_CELLS, CHUNK, CHURN_FACTOR, PENDING, SPARSE_ROWS,
};
use crate::sync::epoch::{Guard, Owned, Shared};
use crate::sync::{fence, snooze, Ordering};

/// The size of a migration's target: rows take at most half of it, a
/// quarter after a shrink ([`shrink_factor`], counting at least
/// [`SWEEP_FLOOR`](super::SWEEP_FLOOR) rows when any is left:
/// [`sized_rows`]). An array that filled with
/// tombstones which cleaning in place could not clear (rows leave from the
/// middle of linear-probing runs) is churning: its target gives rows at
/// most `1 / CHURN_FACTOR` of it, where runs stay short enough for reuse
/// and cleaning to keep up, so churn at a steady number of live rows stops
/// migrating. And room for the copies ([`room_for_copies`]). `used` counts the old
/// array's claimed entries (rows, tombstones, claims), `len` its size,
/// `chunks` its copy chunks.
fn target_size(rows: usize, used: usize, len: usize, chunks: usize, min: usize) -> usize {
    let (rows, factor) = if churning(rows, used, len) {
        (rows, CHURN_FACTOR)
    } else if rows.saturating_mul(16) < len {
        (sized_rows(rows), shrink_factor())
    } else {
        (rows, 2)
    };
    rows.saturating_mul(factor)
        .saturating_add(2)
        .max(room_for_copies(rows, chunks))
        .max(min)
        .next_power_of_two()
}

/// A shrink's target (rows under 1/16 of the array) gives rows at most a
/// quarter of it: rows can double before the next pass (a pass also starts
/// when they double, `Pace::maybe_sweep`) and stay under the array's limit
/// (13/16), so a table whose rows swing between one pass's leftovers and
/// twice as many does not shrink at one pass and grow before the next.
#[cfg(not(pace_mutant = "shrink_to_half"))]
#[inline]
fn shrink_factor() -> usize {
    4
}

/// Known-wrong variant `shrink_to_half`: a shrink's target gives rows half
/// of it, so a doubling of the rows before the next pass grows it again.
#[cfg(pace_mutant = "shrink_to_half")]
fn shrink_factor() -> usize {
    2
}

/// Whether tombstones hold a quarter of an array of `len` cells with `used`
/// claimed and `rows` live.
#[cfg(not(pace_mutant = "no_clean"))]
#[inline]
fn churning(rows: usize, used: usize, len: usize) -> bool {
    used.saturating_sub(rows) >= len / 4
}

/// Known-wrong variant `no_clean` (which also stops cleaning): no array is
/// sized for churn.
#[cfg(pace_mutant = "no_clean")]
fn churning(_: usize, _: usize, _: usize) -> bool {
    false
}

/// The cells a target needs so that, if there is anything to copy, it has
/// room for one new row per chunk beyond the copies (3/4 of an array is
/// claimable at least): a thread copies a chunk in each call, so one thread
/// never finds the target full before the copy ends (which would make its
/// insert copy every chunk left).
#[cfg(not(pace_mutant = "no_room_for_new_rows"))]
fn room_for_copies(rows: usize, chunks: usize) -> usize {
    if rows == 0 {
        return 0;
    }
    rows.saturating_add(chunks + 1)
        .saturating_mul(4)
        .div_ceil(3)
}

/// Known-wrong variant `no_room_for_new_rows`: a target is sized from its
/// rows alone.
#[cfg(pace_mutant = "no_room_for_new_rows")]
fn room_for_copies(_: usize, _: usize) -> usize {
    0
}

impl Table {
    /// Starts a migration of `arr` if it is current and none runs: seal
    /// `next`, size the target from `len`, publish it, copy a chunk.
    /// Returns the full rows its copies removed.
    ///
    /// The target is sized from the rows a caller sees and the dormant
    /// cells of a working set (`working_dormant`: clients who come back
    /// after their buckets refill). Sized for every dormant cell, it keeps
    /// them: its copiers copy them as they are. Otherwise its copiers drop
    /// them (their floors hold their `tat`s), and a revival checks for the
    /// seal first (`enter_revival`), so that no row it did not count lands
    /// in it.
    pub(super) fn start_migration(&self, arr: &Array, cx: &Cx<'_>, guard: &Guard) -> usize {
        self.start_migration_for(arr, self.working_dormant(), cx, guard)
    }

    /// [`start_migration`](Table::start_migration) with a target sized for
    /// `extra` cells beyond the rows.
    pub(super) fn start_migration_for(
        &self,
        arr: &Array,
        extra: usize,
        cx: &Cx<'_>,
        guard: &Guard,
    ) -> usize {
        if !std::ptr::eq(self.array(guard), arr) {
            return self.help(cx, guard); // a target cannot migrate before it is current
        }
        let pending = Shared::null().with_tag(PENDING);
        if arr
            .next
            .compare_exchange(
                Shared::null(),
                pending,
                Ordering::SeqCst,
                Ordering::SeqCst,
                guard,
            )
            .is_err()
        {
            return self.help(cx, guard);
        }
        self.migrations.fetch_add(1, Ordering::Relaxed);
        // The other half of `count_row`'s Dekker: a claim that did not see
        // the seal is counted here.
        fence(Ordering::SeqCst);
        let all = self.len.load(Ordering::SeqCst);
        let dormant = self.dormant.load(Ordering::SeqCst) as isize;
        // Without the dormant cells: a count the sweeps add late, or a
        // revival took off before its CAS, only makes it larger.
        let rows = all.saturating_sub(dormant.max(0) as usize);
        // Sized as slot arrays are (`target_size`).
        // Dormant cells are no sign of churn (cleaning drops them when the
        // array is at its limit): `used` without them.
        let n = target_size(
            rows.saturating_add(extra),
            arr.used
                .load(Ordering::Relaxed)
                .saturating_sub(dormant.max(0) as usize),
            arr.cells.len(),
            arr.chunks(),
            self.min_cells,
        );
        if all == 0 {
            // No row is live, no cell dormant and no claim is in flight
            // (each is counted in `len` before it checks the seal): nothing
            // to copy or drop, so the target becomes current at once.
            let chunks = arr.chunks();
            arr.claim.store(chunks, Ordering::Relaxed);
            arr.copied.store(chunks, Ordering::Relaxed);
            arr.next
                .store(Owned::new(Array::new(n, 0, self.huge)), Ordering::Release);
            let next = self.next_of(arr, guard);
            self.finish(arr, next, guard);
            return 0;
        }
        // A target sized for every cell `len` counts keeps the dormant
        // cells: every copy has room whatever revives after the seal.
        let keep = rows.saturating_add(extra) >= all;
        let mut target = Array::new(n, if keep { all } else { rows }, self.huge);
        target.keeps_dormant = keep;
        arr.next.store(Owned::new(target), Ordering::Release);
        self.help(cx, guard)
    }

    /// Copies one chunk of the running migration, if a chunk is left to
    /// claim; the copier of the last chunk makes the target current.
    /// Returns the full rows its copies removed.
    #[inline]
    pub(super) fn help(&self, cx: &Cx<'_>, guard: &Guard) -> usize {
        let cur = self.array(guard);
        match self.target(cur, guard) {
            Some(next) => self.help_copy(cur, next, cx, guard),
            None => 0,
        }
    }

    /// [`help`](Table::help) on a migrating array `cur` whose target is
    /// `next`.
    #[inline(never)]
    fn help_copy(&self, cur: &Array, next: &Array, cx: &Cx<'_>, guard: &Guard) -> usize {
        // One chunk, and more while the chunks copied so far held fewer
        // than `SPARSE_ROWS` rows, up to `CALL_CELLS` cells: a shrink of a
        // large, nearly empty array ends within cells / CALL_CELLS calls.
        let (mut rows, mut cells, mut removed) = (0, 0, 0);
        loop {
            let c = cur.claim.fetch_add(1, Ordering::Relaxed);
            if c >= cur.chunks() {
                break;
            }
            let (copied, gone) = self.copy_chunk(cur, next, c, cx, guard);
            rows += copied + gone;
            removed += gone;
            cells += CHUNK.min(cur.cells.len() - c * CHUNK);
            if cur.copied.fetch_add(1, Ordering::AcqRel) + 1 == cur.chunks() {
                self.finish(cur, next, guard);
                break;
            }
            if rows >= SPARSE_ROWS || cells + CHUNK > CALL_CELLS {
                break;
            }
        }
        self.copied_cells.fetch_add(cells, Ordering::Relaxed);
        if cells > 0 {
            cx.copied.set(true);
        }
        removed
    }

    /// Copies every chunk left (for whole-table operations and tests).
    /// Returns the full rows its copies removed.
    pub(super) fn finish_migration(&self, cx: &Cx<'_>, guard: &Guard) -> usize {
        let backoff = Backoff::new();
        let mut removed = 0;
        loop {
            let cur = self.array(guard);
            let next = cur.next.load(Ordering::Acquire, guard);
            if !is_migrating(next) {
                return removed;
            }
            if next.is_null() || cur.claim.load(Ordering::Relaxed) >= cur.chunks() {
                // Its starter is allocating the target, or the last chunks
                // are with other copiers.
                snooze(&backoff);
            }
            removed += self.help(cx, guard);
        }
    }

    /// Freezes every cell of chunk `c` of `old` (the current array), places
    /// its rows in `new` and marks them moved, except rows whose bucket is
    /// full at the call's reading (and, while passes leave quiet rows live,
    /// not quiet: `Table::pass_mode`): those it removes, as a sweep does (the
    /// floor raised to the row's own `tat` first, the cell closed), so a
    /// migration copies only the rows still owing something. Returns the
    /// rows it copied and the rows it removed.
    fn copy_chunk(
        &self,
        old: &Array,
        new: &Array,
        c: usize,
        cx: &Cx<'_>,
        guard: &Guard,
    ) -> (usize, usize) {
        let backoff = Backoff::new();
        let start = c * CHUNK;
        let end = ((c + 1) * CHUNK).min(old.cells.len());
        // The frozen rows, placed after the whole chunk is frozen: each row's
        // target cell is prefetched as it is found, so the chunk's (random)
        // target lines are fetched together rather than one after another.
        let mut rows = [(0usize, 0u64, 0u128, 0u64); CHUNK];
        // While passes leave quiet full rows live (`Table::pass_mode`), a
        // copy keeps them too: their clients come back.
        let quiet = self.pass_mode();
        let quiet_row = |last: u64, now: u64| quiet.is_some_and(|q| last.saturating_add(q) > now);
        let mut copies = 0;
        let mut removed = 0;
        let mut gone = Vec::new();
        let mut dropped = 0;
        for (i, cell) in old.cells[start..end].iter().enumerate() {
            let frozen = frozen(cell, &backoff);
            if let CellState::FrozenLive { key, tat } = CellState::decode(frozen) {
                // SAFETY: `key` was read under `guard` from the cell this
                // copier froze (a live row's, which no one removes while
                // frozen).
                let hash = unsafe { self.row_hash(key, cx.hash_of, guard) };
                // A dormant cell is copied as it is into a target sized for
                // it, unless past its retention at a reading that may
                // remove rows (`now` 0 removes nothing); else dropped (its
                // key's floor is at least the `tat` it kept: the pass that
                // put it to sleep raised it first).
                if super::held::dormant(tat).is_some_and(|kept| {
                    !new.keeps_dormant || (cx.now > 0 && self.stale(kept, cx.now))
                }) {
                    cell.store(CellState::Closed.encode());
                    // Its key's next row counts as a return (`returning`).
                    self.floors
                        .remember(self.floors.mark(self.boxed.is_some(), hash, key));
                    dropped += 1;
                    if self.boxed.is_some() {
                        gone.push(super::keys::untagged(key));
                    }
                    continue;
                }
                // A held row (`tat` at least `HELD`: a record or its state
                // inline) is never full: copied as it is, with its record.
                // SAFETY: `tat` is the field of a live cell this copier
                // froze, read under `guard`.
                let last = unsafe { full_from(tat, &self.form, guard) };
                if last < HELD && last <= cx.now && !quiet_row(last, cx.now) {
                    // Full: removed here, not copied. The floor first, then
                    // the cell closed (Release): whoever finds the key gone
                    // reads a floor at least `last`.
                    self.raise_for_copy(self.stripe(hash, key), last);
                    cell.store(CellState::Closed.encode());
                    removed += 1;
                    if self.boxed.is_some() {
                        gone.push(super::keys::untagged(key));
                    }
                    continue;
                }
                prefetch(&new.cells[hash as usize & new.mask()]);
                rows[copies] = (start + i, key, CellState::Live { key, tat }.encode(), hash);
                copies += 1;
            }
        }
        for &(idx, key, live, hash) in &rows[..copies] {
            Self::place(new, hash, live);
            old.cells[idx].store(CellState::Moved { key }.encode());
        }
        // Room for the copies: `used` first, then `limit` (claims read
        // `limit` before they add to `used`); the room kept for the rows
        // removed instead goes to new rows.
        new.used.fetch_add(copies, Ordering::Relaxed);
        // (A dropped dormant cell had room kept only in a target sized for
        // the dormant cells.)
        let kept_for = if new.keeps_dormant { dropped } else { 0 };
        new.limit
            .fetch_add(copies + removed + kept_for, Ordering::Release);
        if dropped > 0 {
            self.dormant.fetch_sub(dropped, Ordering::SeqCst);
            self.dormancy.add(super::Count::Dropped, dropped);
            self.len.fetch_sub(dropped, Ordering::SeqCst);
        }
        if removed > 0 {
            self.len.fetch_sub(removed, Ordering::SeqCst);
            if !cx.pass {
                self.copy_removed.fetch_add(removed, Ordering::Relaxed);
            }
        }
        // SAFETY: each removed row or dropped dormant cell left `old`, the
        // current array (its migration is not finished while this chunk is
        // being copied), whose older arrays were unpublished before it
        // became current; its cell is closed (no key half) and it was never
        // placed in `new`: no cell a reader pinning from now on can reach
        // names its box. Only this copier, which froze the cell, removes it.
        unsafe { self.retire_keys(gone, guard) };
        (copies, removed)
    }

    /// Writes a copied row into the first empty cell of its sequence in
    /// `arr` (the target, which nothing else holds the key in).
    fn place(arr: &Array, hash: u64, v: u128) {
        for idx in probe_seq(hash, arr.mask()) {
            if arr.cells[idx].cas(0, v).is_ok() {
                return;
            }
        }
        unreachable!("a target has room for every copy");
    }

    /// Makes the target current and retires the old array.
    fn finish(&self, o: &Array, n: &Array, guard: &Guard) {
        let old = Shared::from(o as *const Array);
        let new = Shared::from(n as *const Array);
        if self
            .current
            .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire, guard)
            .is_ok()
        {
            // A pass that was running on the old array goes on in the new.
            #[cfg(not(loom))]
            {
                let relaxed = std::sync::atomic::Ordering::Relaxed;
                self.hint.0.store(n.cells.as_ptr() as usize, relaxed);
                self.hint.1.store(n.mask(), relaxed);
            }
            carry_pass(o, n);
            // SAFETY: `old` is unreachable from `current` now; readers that
            // still hold it pinned before this, and the epoch frees it
            // after them. It owns no heap per row; it is retired once (only
            // the copier of the last chunk gets here).
            unsafe { retire_array(guard, old) };
        }
    }
}

/// When a frozen row whose `tat` field is `tat` is full: at `tat` for a
/// plain row; a held row's field (at least `HELD`) is never full.
///
/// # Safety
/// `tat` is the field of a live cell read under `guard`.
#[cfg(not(pace_mutant = "copy_removes_held"))]
#[inline]
unsafe fn full_from(tat: u64, _form: &super::held::Form, _guard: &Guard) -> u64 {
    tat
}

/// Known-wrong variant `copy_removes_held`: a held row is judged by its
/// settled `tat` alone, so a copy removes it, losing the held tokens.
///
/// # Safety
/// As for the right variant.
#[cfg(pace_mutant = "copy_removes_held")]
unsafe fn full_from(tat: u64, form: &super::held::Form, guard: &Guard) -> u64 {
    if tat < HELD {
        return tat;
    }
    // SAFETY: the caller's contract.
    unsafe { super::held::Held::of(tat, form, guard) }.tat
}

impl Table {
    /// A copier removing a full row raises its key's floor to the row's
    /// `tat` first, as a sweep does.
    #[cfg(not(pace_mutant = "copy_drops_without_floor"))]
    #[inline]
    fn raise_for_copy(&self, stripe: usize, tat: u64) {
        self.floors.raise(stripe, tat);
    }

    /// Known-wrong variant `copy_drops_without_floor`: the row is removed
    /// without raising the floor, so a stale reserve of its key starts from
    /// an older one.
    #[cfg(pace_mutant = "copy_drops_without_floor")]
    fn raise_for_copy(&self, _: usize, _: u64) {}
}

/// The value of `cell` once frozen for a copy: frozen by this call, or by
/// another copier, or a state that no copy changes (sealed, closed, moved).
/// A cleaner's fence is waited out.
#[inline]
fn frozen(cell: &Cell, backoff: &Backoff) -> u128 {
    loop {
        let v = cell.load();
        match CellState::decode(v) {
            CellState::Fence => snooze(backoff), // a cleaner's moment
            CellState::Sealed
            | CellState::Closed
            | CellState::FrozenClaimed { .. }
            | CellState::FrozenLive { .. }
            | CellState::Moved { .. } => return v,
            _ => {
                if let Some(f) = freeze_for_copy(cell, v) {
                    return f;
                }
            }
        }
    }
}

/// Freezes a copier's cell, read as `v`: `None` when it changed first.
#[cfg(not(pace_mutant = "copy_unfrozen"))]
#[inline]
fn freeze_for_copy(cell: &Cell, v: u128) -> Option<u128> {
    let f = cell::freeze(v);
    cell.cas(v, f).is_ok().then_some(f)
}

/// Known-wrong variant `copy_unfrozen`: a live row is copied without
/// freezing its cell, so a debit between the read and `Moved` is lost.
#[cfg(pace_mutant = "copy_unfrozen")]
fn freeze_for_copy(cell: &Cell, v: u128) -> Option<u128> {
    let f = cell::freeze(v);
    if matches!(CellState::decode(v), CellState::Live { .. }) {
        return Some(f);
    }
    cell.cas(v, f).is_ok().then_some(f)
}

/// A sweep pass that was running on the old array `o` of a finished
/// migration goes on in the new one `n`.
#[cfg(not(pace_mutant = "passes_die_with_their_array"))]
#[inline]
fn carry_pass(o: &Array, n: &Array) {
    if o.sweep_next.load(Ordering::Relaxed) < o.cells.len() {
        n.sweep_next.store(0, Ordering::Relaxed);
    }
}

/// Known-wrong variant `passes_die_with_their_array`: the pass is not
/// started again on the new array.
#[cfg(pace_mutant = "passes_die_with_their_array")]
fn carry_pass(_: &Array, _: &Array) {}
