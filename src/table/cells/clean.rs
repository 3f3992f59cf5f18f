//! Cleaning in place, as `src/table/clean.rs` does for slots: a tombstone
//! whose next cell is empty ends no sequence that reaches a row, so it may
//! become empty, once the next cell is fenced against claims for that
//! moment. Only the current array, while it is not migrating, is cleaned.

use super::cell::CellState;
use super::{is_migrating, CellArray, CellTable};
use crate::sync::epoch::{Guard, Shared};
use crate::sync::Ordering;

// Cells per cleaning chunk (and the most a tombstone's cleaning walks
// back) and chunks a claim at the limit cleans before it migrates: the slot
// table's.
use crate::table::clean::{CLEAN_CHUNK, CLEAN_TRIES};

impl CellTable {
    /// Empties the tombstones among cells `start..end` of `arr` that end a
    /// run, walking backwards so that runs clear whole. Returns how many.
    pub(super) fn clean_range(&self, arr: &CellArray, start: usize, end: usize) -> usize {
        let mask = arr.mask();
        let fence = CellState::Fence.encode();
        let mut emptied = 0;
        for i in (start..end).rev() {
            let cell = &arr.cells[i];
            let v = cell.load();
            if !matches!(CellState::decode(v), CellState::Tomb) {
                continue;
            }
            let next = &arr.cells[(i + 1) & mask];
            // Known-wrong variant: empty on a read of the next cell, so a
            // row claimed there meanwhile ends up behind an empty cell.
            if cfg!(pace_mutant = "cells_clean_without_fence") {
                if next.load() == 0 && cell.cas(v, 0).is_ok() {
                    emptied += 1;
                }
                continue;
            }
            if next.cas(0, fence).is_err() {
                continue;
            }
            if cell.cas(v, 0).is_ok() {
                emptied += 1;
            }
            let lifted = next.cas(fence, 0);
            debug_assert!(lifted.is_ok(), "only its cleaner changes a fence");
        }
        if emptied > 0 {
            arr.used.fetch_sub(emptied, Ordering::Relaxed);
        }
        emptied
    }

    /// Cell `idx` of `arr` just became a tombstone: if `arr` is current and
    /// not migrating, empty it and the tombstones before it while each ends
    /// a run (at most [`CLEAN_CHUNK`] cells).
    pub(super) fn clean_after(&self, arr: &CellArray, idx: usize, guard: &Guard) {
        // Known-wrong variant: never clean (tombstones only reused).
        if cfg!(pace_mutant = "cells_no_clean") {
            return;
        }
        let (_, cur) = self.array(guard);
        if !std::ptr::eq(cur, arr) || is_migrating(arr.next.load(Ordering::Acquire, guard)) {
            return;
        }
        let mask = arr.mask();
        for back in 0..CLEAN_CHUNK.min(arr.cells.len() - 1) {
            let i = idx.wrapping_sub(back) & mask;
            if self.clean_range(arr, i, i + 1) == 0 {
                return;
            }
        }
    }

    /// The current array is at its limit: if tombstones hold a quarter of
    /// its cells, clean chunks of it until one frees a cell. False: migrate.
    pub(super) fn clean_some(
        &self,
        arr_ptr: Shared<'_, CellArray>,
        arr: &CellArray,
        guard: &Guard,
    ) -> bool {
        if cfg!(pace_mutant = "cells_no_clean") {
            return false;
        }
        let n = arr.cells.len();
        let tombs = arr.used.load(Ordering::Relaxed).saturating_sub(self.len());
        if tombs < n / 4
            || self.array(guard).0 != arr_ptr
            || is_migrating(arr.next.load(Ordering::Acquire, guard))
        {
            return false;
        }
        for _ in 0..CLEAN_TRIES {
            let chunk = arr.clean_next.fetch_add(1, Ordering::Relaxed) % n.div_ceil(CLEAN_CHUNK);
            let start = chunk * CLEAN_CHUNK;
            if self.clean_range(arr, start, (start + CLEAN_CHUNK).min(n)) > 0 {
                return true;
            }
        }
        false
    }
}
