//! Cleaning in place: turning tombstones back into empty cells, so that a
//! flood of new keys at a steady number of live rows keeps the array at its
//! size instead of migrating it.
//!
//! A tombstone whose next cell is empty ends no sequence that reaches a
//! row: every sequence through it ends at the next cell anyway. Emptying it
//! is safe if nothing is claimed in that next cell meanwhile, so the
//! cleaner first fences the next cell (empty to `Fence`), then empties the
//! tombstone, then lifts the fence. While the fence stands, lookups treat
//! the cell as empty (no row lies beyond it) and inserts cannot claim it.
//! Walking a range backwards cascades: an emptied cell lets the tombstone
//! before it go too.
//!
//! Only the current array is cleaned, while it is not migrating; a copier
//! that meets a fence waits the cleaner's moment, and closes tombstones, so
//! a cleaner cannot empty a cell behind a copier. An inserter that chose a
//! tombstone finds it gone (its claim fails) or checks, after claiming,
//! that its claim still lies on its key's sequence (`Table::verify`).

use super::array::Array;
use super::cell::{Cell, CellState};
use super::{is_migrating, Table};
use crate::sync::epoch::Guard;
use crate::sync::Ordering;

/// Chunks a claim at the limit cleans before it gives up and migrates.
const CLEAN_TRIES: usize = 4;

/// Cells per cleaning chunk, and the most a tombstone's cleaning walks back.
/// Loom models clean 2 cells at a time, like their migration chunks.
#[cfg(not(loom))]
const CLEAN_CHUNK: usize = 256;
#[cfg(loom)]
const CLEAN_CHUNK: usize = 2;

impl Table {
    /// Empties the tombstones among cells `start..end` of `arr` that end a
    /// run, walking backwards so that runs clear whole. Returns how many.
    pub(super) fn clean_range(&self, arr: &Array, start: usize, end: usize) -> usize {
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
            if empty_behind_fence(cell, v, next, fence) {
                emptied += 1;
            }
        }
        if emptied > 0 {
            arr.used.fetch_sub(emptied, Ordering::Relaxed);
        }
        emptied
    }

    /// Cell `idx` of `arr` just became a tombstone: if `arr` is current and
    /// not migrating, empty it and the tombstones before it while each ends
    /// a run (at most [`CLEAN_CHUNK`] cells).
    pub(super) fn clean_after(&self, arr: &Array, idx: usize, guard: &Guard) {
        let emptied = self.clean_back(arr, idx, guard);
        if emptied > 0 {
            arr.used.fetch_sub(emptied, Ordering::Relaxed);
        }
    }

    /// [`clean_after`](Table::clean_after) without taking the cells it
    /// emptied off `arr.used`: it returns how many, and the caller takes
    /// them off (a sweep chunk, once for all its removals; until then the
    /// array only looks fuller than it is).
    #[cfg(not(pace_mutant = "no_clean"))]
    pub(super) fn clean_back(&self, arr: &Array, idx: usize, guard: &Guard) -> usize {
        let cur = self.array(guard);
        if !std::ptr::eq(cur, arr) || is_migrating(arr.next.load(Ordering::Acquire, guard)) {
            return 0;
        }
        let (mask, fence) = (arr.mask(), CellState::Fence.encode());
        let mut emptied = 0;
        for back in 0..CLEAN_CHUNK.min(arr.cells.len() - 1) {
            let i = idx.wrapping_sub(back) & mask;
            let cell = &arr.cells[i];
            let v = cell.load();
            if !matches!(CellState::decode(v), CellState::Tomb)
                || !empty_behind_fence(cell, v, &arr.cells[(i + 1) & mask], fence)
            {
                break;
            }
            emptied += 1;
        }
        emptied
    }

    /// The current array is at its limit: if tombstones (and, unless the
    /// table's clients come back to them, dormant cells) hold a quarter of
    /// its cells, clean chunks of it until one frees a cell, dropping the
    /// chunk's dormant cells first (floor raised, key retired: DESIGN.md
    /// §4, "Dormant cells"). False: migrate.
    #[cfg(not(pace_mutant = "no_clean"))]
    pub(super) fn clean_some(&self, arr: &Array, guard: &Guard) -> bool {
        let n = arr.cells.len();
        let returning = self.returning();
        let cleanable = if returning { self.len() } else { self.rows() };
        let tombs = arr.used.load(Ordering::Relaxed).saturating_sub(cleanable);
        if tombs < n / 4
            || !std::ptr::eq(self.array(guard), arr)
            || is_migrating(arr.next.load(Ordering::Acquire, guard))
        {
            return false;
        }
        for _ in 0..CLEAN_TRIES {
            let chunk = arr.clean_next.fetch_add(1, Ordering::Relaxed) % n.div_ceil(CLEAN_CHUNK);
            let start = chunk * CLEAN_CHUNK;
            let end = (start + CLEAN_CHUNK).min(n);
            // (Not while clients come back to their dormant cells: the array
            // grows for them instead, `start_migration`.)
            let dropped = if returning {
                0
            } else {
                self.drop_dormant_range(arr, start, end, guard)
            };
            if self.clean_range(arr, start, end) > 0 || dropped > 0 {
                return true;
            }
        }
        false
    }

    /// Known-wrong variant `no_clean`: tombstones are never cleaned (only
    /// reused), here and when a target is sized (`migrate.rs`).
    #[cfg(pace_mutant = "no_clean")]
    pub(super) fn clean_back(&self, _: &Array, _: usize, _: &Guard) -> usize {
        0
    }

    /// Known-wrong variant `no_clean`, as above.
    #[cfg(pace_mutant = "no_clean")]
    pub(super) fn clean_some(&self, _: &Array, _: &Guard) -> bool {
        false
    }
}

/// Empties tombstone `cell` (read as `v`) when the cell after it, `next`,
/// is empty: a fence in `next` for the moment, so that no row is claimed
/// there behind an emptied cell. True if it emptied the cell. The fence is
/// lifted with a store, not a CAS: no one but its cleaner writes a fenced
/// cell (claims, debits and removals expect other values; a copier waits
/// until the fence is gone before it freezes the cell).
#[cfg(not(pace_mutant = "clean_without_fence"))]
#[inline]
fn empty_behind_fence(cell: &Cell, v: u128, next: &Cell, fence: u128) -> bool {
    // A read first: most tombstones a sweep leaves are followed by a row,
    // and a failed CAS costs a locked instruction.
    if next.load() != 0 || next.cas(0, fence).is_err() {
        return false;
    }
    let emptied = cell.cas(v, 0).is_ok();
    debug_assert_eq!(next.load(), fence, "only its cleaner changes a fence");
    next.store(0);
    emptied
}

/// Known-wrong variant `clean_without_fence`: empties on a read of the next
/// cell, so a row claimed there meanwhile ends up behind an empty cell.
#[cfg(pace_mutant = "clean_without_fence")]
fn empty_behind_fence(cell: &Cell, v: u128, next: &Cell, _: u128) -> bool {
    next.load() == 0 && cell.cas(v, 0).is_ok()
}
