//! Sweeps of the cell table, as `src/table/sweep.rs` does for slots: small
//! arrays are swept whole by the call that starts a pass; larger ones a
//! chunk per call ([`cell_sweep_chunk`] cells), so no caller scans the table.
//! A pass that meets a migration goes on in the target once the migration
//! finishes (`CellTable::finish`).

use super::cell::CellState;
use super::{CellArray, CellTable, CHURN_FACTOR, CHURN_RESIZE_MIN};
use crate::sync::epoch::Guard;
use crate::sync::Ordering;
use crate::table::slot::SWEEP_IDLE;
use crate::table::sweep::SWEEP_AT_ONCE;
use crate::table::sweep::SWEEP_CHUNK_MIN;

/// The most cells a chunk of a sweep pass scans.
pub(crate) const CELL_SWEEP_CHUNK: usize = 128;

/// Cells per chunk of a pass over an array of `cells` cells: as few as keep
/// the pass within 2^15 calls, between 16 and [`CELL_SWEEP_CHUNK`]. Cells
/// are scanned in order (128 cells are 2 KiB, read ahead by the CPU) and a
/// removal touches nothing else but its floor, so a chunk may hold twice a
/// slot chunk's rows for the same cost, and a pass over 4M cells (2M rows),
/// with the memory it gives back, ends within 32,768 calls.
#[inline]
pub(crate) fn cell_sweep_chunk(cells: usize) -> usize {
    (cells >> 15).clamp(SWEEP_CHUNK_MIN, CELL_SWEEP_CHUNK)
}

impl CellTable {
    /// Removes the rows of cells `start..end` of `arr` whose bucket is full
    /// at `now`: the floor of each row's key raised to the row's own `tat`,
    /// then the cell a tombstone (cleaned when it ends a run). Returns how
    /// many it removed.
    pub(super) fn sweep_range(
        &self,
        arr: &CellArray,
        start: usize,
        end: usize,
        now: u64,
        hash_of: &dyn Fn(u64) -> u64,
        guard: &Guard,
    ) -> usize {
        let mut removed = 0;
        for idx in start..end {
            let cell = &arr.cells[idx];
            let v = cell.load();
            if let CellState::Live { key, tat } = CellState::decode(v) {
                if tat <= now {
                    if !cfg!(pace_mutant = "cells_sweep_keeps_floor") {
                        self.floors.raise(hash_of(key), tat);
                    }
                    if cell.cas(v, CellState::Tomb.encode()).is_ok() {
                        removed += 1;
                        self.clean_after(arr, idx, guard);
                    }
                }
            }
        }
        if removed > 0 {
            self.len.fetch_sub(removed, Ordering::SeqCst);
        }
        removed
    }

    /// Starts a sweep pass on the current array: at once if it has at most
    /// [`SWEEP_AT_ONCE`] cells and is not migrating, else a chunk per call
    /// of [`sweep_step`](CellTable::sweep_step). A pass already running
    /// goes on.
    pub(crate) fn start_sweep(&self, now: u64, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) {
        let (_, arr) = self.array(guard);
        let migrating = super::is_migrating(arr.next.load(Ordering::Acquire, guard));
        if arr.cells.len() <= SWEEP_AT_ONCE && !migrating {
            self.sweep_range(arr, 0, arr.cells.len(), now, hash_of, guard);
            self.resize_after_pass(hash_of, guard);
            return;
        }
        // Any cursor at or past the end means no pass runs (`SWEEP_IDLE`,
        // plus the chunks callers claimed late).
        let at = arr.sweep_next.load(Ordering::Relaxed);
        if at >= arr.cells.len() {
            let _ = arr
                .sweep_next
                .compare_exchange(at, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        if !migrating {
            self.sweep_step(now, hash_of, guard);
        }
    }

    /// Sweeps one chunk of the running pass, if there is one: two loads
    /// otherwise.
    #[inline]
    pub(crate) fn sweep_step(&self, now: u64, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) {
        let (_, arr) = self.array(guard);
        if arr.sweep_next.load(Ordering::Relaxed) < arr.cells.len() {
            self.sweep_chunk_of(arr, now, hash_of, guard);
        }
    }

    #[cold]
    #[inline(never)]
    fn sweep_chunk_of(
        &self,
        arr: &CellArray,
        now: u64,
        hash_of: &dyn Fn(u64) -> u64,
        guard: &Guard,
    ) {
        let len = arr.cells.len();
        let chunk = cell_sweep_chunk(len);
        let start = arr.sweep_next.fetch_add(chunk, Ordering::Relaxed);
        if start >= len {
            return; // the pass ended under us
        }
        let end = (start + chunk).min(len);
        self.sweep_range(arr, start, end, now, hash_of, guard);
        if end == len {
            arr.sweep_next.store(SWEEP_IDLE, Ordering::Relaxed);
            self.resize_after_pass(hash_of, guard);
        }
    }

    /// After a sweep pass: shrinks a sparse array, or resizes a churning
    /// one.
    fn resize_after_pass(&self, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) {
        self.shrink_if_sparse(hash_of, guard);
        self.resize_if_churning(hash_of, guard);
    }

    /// Migrates the current array to one sized for churn (rows at most
    /// 1/[`CHURN_FACTOR`] of it, `target_size`) when, after a whole pass and
    /// the cleaning its removals did, tombstones still hold a quarter of its
    /// cells and rows more than 1/8: a flood of new keys at a steady number
    /// of rows that would otherwise run at that load for good (its arrays
    /// grew before any row was swept, for rows alone). Once the rows take at
    /// most 1/8 the condition no longer holds, so a steady flood resizes at
    /// most once; a shrink (rows under 1/16) sizes its target for churn too.
    /// (Known-wrong variant `cells_no_churn_resize`: never.)
    fn resize_if_churning(&self, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) {
        if cfg!(pace_mutant = "cells_no_churn_resize") {
            return;
        }
        let (arr_ptr, arr) = self.array(guard);
        let n = arr.cells.len();
        let rows = self.len();
        let tombs = arr.used.load(Ordering::Relaxed).saturating_sub(rows);
        if n >= CHURN_RESIZE_MIN
            && tombs >= n / 4
            && rows.saturating_mul(CHURN_FACTOR) > n
            && !super::is_migrating(arr.next.load(Ordering::Acquire, guard))
        {
            self.start_migration(arr_ptr, hash_of, guard);
        }
    }

    /// Migrates the current array to a smaller one when rows fill less than
    /// 1/16 of its cells (and it is above the table's minimum). An empty
    /// table swaps in O(1); otherwise the shrink is left for the next insert
    /// or removal ([`shrink_pending`](CellTable::shrink_pending)), so that a
    /// pass ending under a reserve's own short-lived row does not start a
    /// copy (sized for the new rows of the whole copy) that the row's refund
    /// a moment later makes unnecessary.
    pub(super) fn shrink_if_sparse(&self, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) {
        let (arr_ptr, arr) = self.array(guard);
        if arr.cells.len() > self.min_cells && self.len().saturating_mul(16) < arr.cells.len() {
            if self.len() == 0 {
                self.start_migration(arr_ptr, hash_of, guard);
            } else {
                self.shrink_wanted.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Starts a shrink left pending by the last sweep pass, if the table is
    /// still sparse.
    #[inline]
    pub(super) fn shrink_pending(&self, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) {
        if self.shrink_wanted.load(Ordering::Relaxed) {
            self.start_pending_shrink(hash_of, guard);
        }
    }

    #[cold]
    #[inline(never)]
    fn start_pending_shrink(&self, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) {
        if !self.shrink_wanted.swap(false, Ordering::Relaxed) {
            return;
        }
        let (arr_ptr, arr) = self.array(guard);
        if arr.cells.len() > self.min_cells && self.len().saturating_mul(16) < arr.cells.len() {
            self.start_migration(arr_ptr, hash_of, guard);
        }
    }

    /// Whether a chunked pass is running on the current array (for tests).
    #[cfg(test)]
    pub(crate) fn sweep_running(&self, guard: &Guard) -> bool {
        let (_, arr) = self.array(guard);
        arr.sweep_next.load(Ordering::Relaxed) < arr.cells.len()
    }
}
