//! Sweeps: removing full rows and shrinking the table when it has become
//! sparse. Small arrays are swept whole by the call that starts a pass;
//! larger ones a chunk per call ([`sweep_chunk`] cells), so no caller scans
//! the table. A pass that meets a migration goes on in the target once the
//! migration finishes (`Table::finish`).

use super::array::Array;
use super::cell::CellState;
use super::cell::{self as cells, Cell};
use super::floor::Floors;
use super::held::{self, Held, HELD};
use super::{is_migrating, sparse, Cx, Table, CHURN_FACTOR, CHURN_RESIZE_MIN, SWEEP_IDLE};
use crate::sync::epoch::Guard;
use crate::sync::Ordering;

/// Arrays of at most this many cells are swept in one go by the call that
/// starts a pass (tests/rules.rs and the sequential models count on it).
pub(crate) const SWEEP_AT_ONCE: usize = 4096;

/// The most cells a chunk of a sweep pass scans.
pub(crate) const SWEEP_CHUNK: usize = 128;

/// The smallest sweep chunk.
const SWEEP_CHUNK_MIN: usize = 16;

/// Cells per chunk of a pass over an array of `cells` cells: as few as keep
/// the pass within 2^15 calls, between 16 and [`SWEEP_CHUNK`]. Cells
/// are scanned in order (128 cells are 2 KiB, read ahead by the CPU) and a
/// removal touches nothing else but its floor, so a chunk may hold twice a
/// slot chunk's rows for the same cost, and a pass over 4M cells (2M rows),
/// with the memory it gives back, ends within 32,768 calls.
#[inline]
pub(crate) fn sweep_chunk(cells: usize) -> usize {
    (cells >> 15).clamp(SWEEP_CHUNK_MIN, SWEEP_CHUNK)
}

/// Asks the CPU to start loading the cache line at `p`. A hint: it never
/// faults and reads nothing, whatever `p` points at.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: `_mm_prefetch` needs SSE, which this cfg guarantees is
        // enabled; a prefetch is a hint that never faults or reads memory
        // into the program, so any address is sound.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
    let _ = p;
}

impl Table {
    /// Removes every row whose bucket is full at `now` (floor raised to its
    /// own `tat` first), after finishing any migration (whose copies remove
    /// the full rows they meet: counted too), then shrinks a sparse array
    /// (whole: an explicit call). `hash_of` gives a key's hash:
    /// cells do not keep it.
    pub(crate) fn sweep(&self, now: u64, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) -> usize {
        let cx = &Cx::pass(hash_of, now);
        let mut removed = 0;
        loop {
            removed += self.finish_migration(cx, guard);
            let arr = self.array(guard);
            removed += self.sweep_range(arr, 0, arr.cells.len(), now, false, hash_of, guard);
            if is_migrating(arr.next.load(Ordering::Acquire, guard)) {
                continue; // a migration started under the pass: sweep its target
            }
            if arr.cells.len() > self.min_cells && sparse(self.len(), arr.cells.len()) {
                removed += self.start_migration_for(arr, 0, cx, guard);
            }
            removed += self.finish_migration(cx, guard);
            return removed;
        }
    }

    /// Removes the rows of cells `start..end` of `arr` whose bucket is full
    /// at `now`: the floor of each row's key raised to the row's own `tat`,
    /// then the cell a tombstone (cleaned when it ends a run). A `pass`
    /// (not an explicit sweep) makes a full plain row *dormant* instead
    /// (DESIGN.md §4, "Dormant cells": its key and `tat` stay in the cell,
    /// which is no row, for the key's next call to revive), unless its
    /// `tat` is already past the table's retention, and drops the dormant
    /// cells past it; an explicit sweep drops every dormant cell. Returns
    /// how many rows it removed or made dormant (a caller sees neither as
    /// a row). `arr` was loaded from `current` (rows leave only
    /// the current array, `keys.rs`); their key boxes go to the collector
    /// as one deferred free, so that a chunk's memory comes back soon
    /// (crossbeam-epoch frees a bounded number of deferred items per
    /// collection).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sweep_range(
        &self,
        arr: &Array,
        start: usize,
        end: usize,
        now: u64,
        pass: bool,
        hash_of: &dyn Fn(u64) -> u64,
        guard: &Guard,
    ) -> usize {
        let (mut removed, mut emptied, mut made, mut dropped) = (0, 0, 0, 0);
        // A pass of a table whose clients come back puts full rows to sleep
        // and keeps its dormant cells within their retention; any other
        // pass removes full rows and drops dormant cells.
        // (Decided once for the whole pass, as it began: `pass_mode`.) It
        // also leaves live the full rows that filled within `quiet`: a
        // client that comes back soon finds its row.
        let mode = if pass { self.pass_mode() } else { None };
        let (asleep, quiet) = (mode.is_some(), mode.unwrap_or(0));
        let mut kept = 0;
        let mut gone = Vec::new();
        for idx in start..end {
            let cell = &arr.cells[idx];
            let v = cell.load();
            if let CellState::Live { key, tat } = CellState::decode(v) {
                if let Some(kept) = held::dormant(tat) {
                    if (!asleep || self.stale(kept, now)) && self.drop_swept(cell, v) {
                        dropped += 1;
                        if self.boxed.is_some() {
                            gone.push(super::keys::untagged(key));
                        }
                        emptied += self.clean_back(arr, idx, guard);
                    }
                    continue;
                }
                // A held row is not full, whatever its settled `tat`.
                let tat = if tat < HELD {
                    tat
                } else {
                    // SAFETY: `tat` is the field of a live cell read
                    // under `guard`.
                    let Some(tat) = (unsafe { self.sweep_held(arr, idx, v, tat, now, guard) })
                    else {
                        continue;
                    };
                    tat
                };
                if tat <= now {
                    if tat.saturating_add(quiet) > now {
                        kept += 1;
                        continue;
                    }
                    // SAFETY: `key` was read under `guard` from a live cell.
                    unsafe { self.raise_swept_floor(key, tat, hash_of, guard) };
                    if asleep && !self.stale(tat, now) {
                        if let Some(field) = self.dormant_field(tat) {
                            // Dormant: the floor raised first, as for a
                            // removal, so the key's next call (a revival
                            // from the floor) decides as a row made anew.
                            let asleep = cells::live_value(key, field);
                            if cell.cas(v, asleep).is_ok() {
                                made += 1;
                            }
                            continue;
                        }
                    }
                    if cell.cas(v, CellState::Tomb.encode()).is_ok() {
                        removed += 1;
                        if pass {
                            // SAFETY: as above.
                            self.remember_removed(key, guard);
                        }
                        if self.boxed.is_some() {
                            gone.push(super::keys::untagged(key));
                        }
                        emptied += self.clean_back(arr, idx, guard);
                    }
                }
            }
        }
        if made > 0 {
            self.dormant.fetch_add(made, Ordering::SeqCst);
            self.dormancy.add(super::Count::Made, made);
        }
        if dropped > 0 {
            self.dormant.fetch_sub(dropped, Ordering::SeqCst);
            self.dormancy.add(super::Count::Dropped, dropped);
        }
        if pass && removed > 0 {
            self.dormancy.add(super::Count::Removed, removed);
        }
        if kept > 0 {
            self.dormancy.add(super::Count::Kept, kept);
        }
        if removed + dropped > 0 {
            self.len.fetch_sub(removed + dropped, Ordering::SeqCst);
        }
        if emptied > 0 {
            arr.used.fetch_sub(emptied, Ordering::Relaxed);
        }
        // SAFETY: each row or dormant cell left `arr`, which was current
        // when loaded (the arrays before it were unpublished first), by this
        // call's CAS, and its cell no longer names its box: only a row's
        // remover retires its box.
        unsafe { self.retire_keys(gone, guard) };
        removed + made
    }

    /// The dormant field of a full row at `tat`, if the row may go dormant.
    #[cfg(not(pace_mutant = "no_dormancy"))]
    #[inline]
    fn dormant_field(&self, tat: u64) -> Option<u64> {
        held::dormant_field(tat)
    }

    /// Known-wrong variant `no_dormancy`: passes remove every full row, so
    /// a returning client's row is made again at each visit.
    #[cfg(pace_mutant = "no_dormancy")]
    fn dormant_field(&self, _: u64) -> Option<u64> {
        None
    }

    /// A pass removed the row of `key` (a key half read under `guard` from
    /// a live cell): its mark is remembered, so that its key's next row
    /// counts as a return (`Table::returning`).
    fn remember_removed(&self, key: u64, guard: &Guard) {
        let hash = if self.boxed.is_some() {
            // SAFETY: `key` is the key half of a live cell read under
            // `guard`.
            unsafe { super::keys::hash_in_box(key, guard) }
        } else {
            0
        };
        self.floors
            .remember(self.floors.mark(self.boxed.is_some(), hash, key));
    }

    /// A sweep drops the dormant cell `cell` (value `v`): a tombstone (its
    /// key's floor holds the `tat` it kept). True if its CAS did.
    fn drop_swept(&self, cell: &Cell, v: u128) -> bool {
        cell.cas(v, CellState::Tomb.encode()).is_ok()
    }

    /// A sweep meets the held row in cell `idx` of `arr` (value `v`, record
    /// field `field`, read under `guard` from a live cell): it settles the
    /// lots that expired by `now`, so that a hold nobody resolves does not
    /// keep its row for good, and keeps the row (held tokens are not full).
    /// `Some(tat)` would judge the row by that settled `tat`. A row that
    /// changed first is left to the next pass.
    ///
    /// # Safety
    /// `field` is the `tat` field of a live cell read under `guard`.
    #[cfg(not(pace_mutant = "sweep_removes_held"))]
    unsafe fn sweep_held(
        &self,
        arr: &Array,
        idx: usize,
        v: u128,
        field: u64,
        now: u64,
        guard: &Guard,
    ) -> Option<u64> {
        // SAFETY: `field` is the field of a live cell read under `guard`
        // (this function's contract).
        let was = unsafe { Held::of(field, &self.form, guard) };
        let next = was.at(now, &self.form);
        if next != was {
            // A row that changed first is left to the next pass.
            let _ = self.replace_row(arr, idx, v, next, guard);
        }
        None
    }

    /// Known-wrong variant `sweep_removes_held`: a held row is judged by its
    /// settled `tat` alone, so a sweep removes it with its held tokens.
    #[cfg(pace_mutant = "sweep_removes_held")]
    unsafe fn sweep_held(
        &self,
        _: &Array,
        _: usize,
        _: u128,
        field: u64,
        _: u64,
        guard: &Guard,
    ) -> Option<u64> {
        // SAFETY: this function's contract.
        Some(unsafe { Held::of(field, &self.form, guard) }.tat)
    }

    /// Raises the floor of the row of `key` (read under `guard` from a live
    /// cell) to its `tat` before a sweep removes it.
    ///
    /// # Safety
    /// `key` is the key half of a live cell read under `guard`.
    #[cfg(not(pace_mutant = "sweep_keeps_floor"))]
    unsafe fn raise_swept_floor(
        &self,
        key: u64,
        tat: u64,
        hash_of: &dyn Fn(u64) -> u64,
        guard: &Guard,
    ) {
        // SAFETY: this function's contract.
        let stripe = unsafe { self.swept_stripe(key, hash_of, guard) };
        self.floors.raise(stripe, tat);
    }

    /// The stripe of floors of the key of a row a sweep removes: from the
    /// hash its box keeps, or from a word-sized key's own bits, without
    /// hashing it (`floor.rs`).
    ///
    /// # Safety
    /// `key` is the key half of a live cell read under `guard`.
    #[cfg(not(pace_mutant = "sweep_floor_by_hash"))]
    #[inline]
    unsafe fn swept_stripe(&self, key: u64, _: &dyn Fn(u64) -> u64, guard: &Guard) -> usize {
        if self.boxed.is_some() {
            // SAFETY: this function's contract.
            Floors::of_hash(unsafe { super::keys::hash_in_box(key, guard) })
        } else {
            self.floors.of_word(key)
        }
    }

    /// Known-wrong variant `sweep_floor_by_hash`: a sweep raises the stripe
    /// of a word-sized key's hash, not the one of its bits that its
    /// creators read.
    #[cfg(pace_mutant = "sweep_floor_by_hash")]
    unsafe fn swept_stripe(&self, key: u64, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) -> usize {
        // SAFETY: this function's contract.
        Floors::of_hash(unsafe { self.row_hash(key, hash_of, guard) })
    }

    /// Known-wrong variant `sweep_keeps_floor`: a swept row's debt is
    /// forgotten (its key's floor is not raised).
    #[cfg(pace_mutant = "sweep_keeps_floor")]
    unsafe fn raise_swept_floor(&self, _: u64, _: u64, _: &dyn Fn(u64) -> u64, _: &Guard) {}

    /// Starts a sweep pass on the current array: at once if it has at most
    /// [`SWEEP_AT_ONCE`] cells and is not migrating, else a chunk per call
    /// of [`sweep_step`](Table::sweep_step). A pass already running
    /// goes on.
    pub(crate) fn start_sweep(&self, now: u64, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) {
        self.mark_pass_start();
        let mut arr = self.array(guard);
        let mut migrating = is_migrating(arr.next.load(Ordering::Acquire, guard));
        if migrating && arr.cells.len() <= SWEEP_AT_ONCE {
            // A small array's pass does not wait for its migration: it
            // copies what is left of it (at most `SWEEP_AT_ONCE` cells, the
            // rows full at `now` removed, not copied), and sweeps the
            // target at once if that made it current (every chunk left was
            // this call's to copy, as it is for a lone caller).
            self.copy_rest(arr, &Cx::pass(hash_of, now), guard);
            arr = self.array(guard);
            migrating = is_migrating(arr.next.load(Ordering::Acquire, guard));
        }
        if arr.cells.len() <= SWEEP_AT_ONCE && !migrating {
            self.sweep_range(arr, 0, arr.cells.len(), now, true, hash_of, guard);
            self.resize_after_pass(&Cx::pass(hash_of, now), guard);
            return;
        }
        // Any cursor at or past the end means no pass runs (`SWEEP_IDLE`,
        // plus the chunks callers claimed late).
        let at = arr.sweep_next.load(Ordering::Relaxed);
        let idle = restart_from(at);
        if at >= arr.cells.len() {
            let _ = arr
                .sweep_next
                .compare_exchange(idle, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        if !migrating {
            self.sweep_step(now, hash_of, guard);
        }
    }

    /// Sweeps one chunk of the running pass, if there is one: two loads
    /// otherwise. True if it swept the pass's last chunk.
    #[inline]
    pub(crate) fn sweep_step(&self, now: u64, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) -> bool {
        let arr = self.array(guard);
        arr.sweep_next.load(Ordering::Relaxed) < arr.cells.len()
            && self.sweep_chunk_of(arr, now, hash_of, guard)
    }

    /// Claims and sweeps one chunk whether or not a pass runs: a caller
    /// that saw a running pass and claims its chunk late, after the pass
    /// ended (for tests).
    #[cfg(test)]
    pub(crate) fn sweep_chunk_late(&self, now: u64, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) {
        let arr = self.array(guard);
        let _ = self.sweep_chunk_of(arr, now, hash_of, guard);
    }

    #[cold]
    #[inline(never)]
    fn sweep_chunk_of(
        &self,
        arr: &Array,
        now: u64,
        hash_of: &dyn Fn(u64) -> u64,
        guard: &Guard,
    ) -> bool {
        let len = arr.cells.len();
        let chunk = sweep_chunk(len);
        let start = arr.sweep_next.fetch_add(chunk, Ordering::Relaxed);
        if start >= len {
            return false; // the pass ended under us
        }
        let end = (start + chunk).min(len);
        self.sweep_range(arr, start, end, now, true, hash_of, guard);
        if end < len {
            return false;
        }
        arr.sweep_next.store(SWEEP_IDLE, Ordering::Relaxed);
        self.resize_after_pass(&Cx::pass(hash_of, now), guard);
        true
    }

    /// Copies the chunks of `arr`'s migration that are left to claim, while
    /// `arr` is current and its target allocated: never waits for another
    /// caller.
    #[cfg(not(pace_mutant = "pass_waits_for_migration"))]
    fn copy_rest(&self, arr: &Array, cx: &Cx<'_>, guard: &Guard) {
        while std::ptr::eq(self.array(guard), arr)
            && self.target(arr, guard).is_some()
            && arr.claim.load(Ordering::Relaxed) < arr.chunks()
        {
            self.help(cx, guard);
        }
    }

    /// Known-wrong variant `pass_waits_for_migration`: a pass due on a
    /// small migrating array copies nothing, and is left to later calls,
    /// chunk by chunk in the target.
    #[cfg(pace_mutant = "pass_waits_for_migration")]
    fn copy_rest(&self, _: &Array, _: &Cx<'_>, _: &Guard) {}

    /// After a sweep pass: shrinks a sparse array, or resizes a churning
    /// one, or grows one crowded by a working set of dormant cells.
    fn resize_after_pass(&self, cx: &Cx<'_>, guard: &Guard) {
        self.shrink_if_sparse(cx, guard);
        self.resize_if_churning(cx, guard);
        self.grow_for_returns(cx, guard);
    }

    /// Grows the current array when new keys take over dormant cells whose
    /// clients come back: since the pass before the last began, some
    /// dormant cells were taken over and at least one in
    /// [`GROW_IF_REVIVED`](super::GROW_IF_REVIVED) as many clients came
    /// back (`back_lately`: a working set of returning clients larger than
    /// the array's room for their cells; a flood of new keys brings none
    /// back and grows nothing).
    /// The target is sized for the rows, the dormant cells and those taken
    /// over (`start_migration_for`, which drops the dormant cells: their
    /// clients come back to rows made anew, once).
    fn grow_for_returns(&self, cx: &Cx<'_>, guard: &Guard) {
        let arr = self.array(guard);
        let taken = self.taken_lately();
        let revived = self.back_lately();
        let extra = self.dormant_count().saturating_add(taken);
        // Only a target twice as large at least: one of the same size would
        // drop the dormant cells and gain no room.
        let wanted = self.rows().saturating_add(extra).saturating_mul(2);
        if taken > 0
            && revived.saturating_mul(super::GROW_IF_REVIVED) >= taken
            && wanted >= arr.cells.len()
            && !is_migrating(arr.next.load(Ordering::Acquire, guard))
        {
            self.start_migration_for(arr, extra, cx, guard);
        }
    }

    /// Migrates the current array to one sized for churn (rows at most
    /// 1/[`CHURN_FACTOR`] of it, `target_size`) when, after a whole pass and
    /// the cleaning its removals did, tombstones still hold a quarter of its
    /// cells and rows more than 1/8: a flood of new keys at a steady number
    /// of rows that would otherwise run at that load for good (its arrays
    /// grew before any row was swept, for rows alone). Once the rows take at
    /// most 1/8 the condition no longer holds, so a steady flood resizes at
    /// most once; a shrink (rows under 1/16) sizes its target for churn too.
    #[cfg(not(pace_mutant = "no_churn_resize"))]
    fn resize_if_churning(&self, cx: &Cx<'_>, guard: &Guard) {
        let arr = self.array(guard);
        let n = arr.cells.len();
        // Tombstones: not the dormant cells (cleaning drops them when the
        // array is at its limit), which are no rows either.
        let rows = self.rows();
        let tombs = arr.used.load(Ordering::Relaxed).saturating_sub(self.len());
        if n >= CHURN_RESIZE_MIN
            && tombs >= n / 4
            && rows.saturating_mul(CHURN_FACTOR) > n
            && !is_migrating(arr.next.load(Ordering::Acquire, guard))
        {
            self.start_migration(arr, cx, guard);
        }
    }

    /// Known-wrong variant `no_churn_resize`: a churning array is never
    /// resized for churn.
    #[cfg(pace_mutant = "no_churn_resize")]
    fn resize_if_churning(&self, _: &Cx<'_>, _: &Guard) {}

    /// Migrates the current array to a smaller one when rows fill less than
    /// 1/16 of its cells (and it is above the table's minimum). An empty
    /// table swaps in O(1); otherwise the shrink is left for the next insert
    /// or removal ([`shrink_pending`](Table::shrink_pending)), so that a
    /// pass ending under a reserve's own short-lived row does not start a
    /// copy (sized for the new rows of the whole copy) that the row's refund
    /// a moment later makes unnecessary.
    pub(super) fn shrink_if_sparse(&self, cx: &Cx<'_>, guard: &Guard) {
        let arr = self.array(guard);
        if arr.cells.len() > self.min_cells && sparse(self.pass_rows(), arr.cells.len()) {
            if self.rows() == 0 {
                self.start_migration(arr, cx, guard);
            } else {
                self.shrink_wanted.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Starts a shrink left pending by the last sweep pass, if the table is
    /// still sparse.
    #[inline]
    pub(super) fn shrink_pending(&self, cx: &Cx<'_>, guard: &Guard) {
        if self.shrink_wanted.load(Ordering::Relaxed) {
            self.start_pending_shrink(cx, guard);
        }
    }

    #[cold]
    #[inline(never)]
    fn start_pending_shrink(&self, cx: &Cx<'_>, guard: &Guard) {
        if !self.shrink_wanted.swap(false, Ordering::Relaxed) {
            return;
        }
        let arr = self.array(guard);
        if arr.cells.len() > self.min_cells && sparse(self.pass_rows(), arr.cells.len()) {
            self.start_migration(arr, cx, guard);
        }
    }

    /// Whether a chunked pass is running on the current array (for tests
    /// and models).
    #[cfg(any(test, feature = "__internals"))]
    pub(crate) fn pass_running(&self, guard: &Guard) -> bool {
        self.sweep_running(guard)
    }

    /// Whether a chunked pass is running on the current array (for tests).
    #[cfg(any(test, feature = "__internals"))]
    pub(crate) fn sweep_running(&self, guard: &Guard) -> bool {
        let arr = self.array(guard);
        arr.sweep_next.load(Ordering::Relaxed) < arr.cells.len()
    }
}

/// The cursor value a new pass may start from: any at or past the end of
/// the array (`SWEEP_IDLE`, plus the chunks callers claimed late).
#[cfg(not(pace_mutant = "sweep_cursor_stuck"))]
#[inline]
fn restart_from(at: usize) -> usize {
    at
}

/// Known-wrong variant `sweep_cursor_stuck`: a pass restarts only from
/// exactly `SWEEP_IDLE`, so a late chunk claim stops every later pass.
#[cfg(pace_mutant = "sweep_cursor_stuck")]
fn restart_from(_: usize) -> usize {
    SWEEP_IDLE
}
