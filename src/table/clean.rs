//! Cleaning in place: turning tombstones back into vacant slots, so that a
//! flood of new keys at a steady number of live rows keeps the array at its
//! size instead of migrating it.
//!
//! A tombstone whose next slot is vacant ends no sequence that reaches a row:
//! every sequence through it ends at the next slot anyway. Vacating it is
//! safe if nothing is linked into that next slot meanwhile, so the cleaner
//! first fences the next slot (vacant to [`Fence`](super::slot::State)),
//! then vacates the tombstone, then lifts the fence. While the fence stands,
//! lookups treat the slot as vacant (no row lies beyond it) and inserts
//! cannot link there. Walking a range backwards cascades: a vacated slot
//! lets the tombstone before it go too.
//!
//! Only the current array is cleaned, while it is not migrating; a copier
//! that meets a fence waits the cleaner's moment, and closes tombstones, so
//! a cleaner cannot vacate a slot behind a copier. An inserter that chose a
//! tombstone finds it gone (its reuse fails) or checks, after linking, that
//! its row still lies on its key's sequence (`Table::verify`).

use super::slot::{Array, State};
use super::{is_migrating, Table};
use crate::sync::epoch::{Guard, Shared};
use crate::sync::Ordering;

/// Chunks an insert at the limit cleans before it gives up and migrates.
pub(super) const CLEAN_TRIES: usize = 4;

/// Slots per cleaning chunk, and the most a tombstone's cleaning walks back.
/// Loom models clean 2 slots at a time, like their migration chunks.
#[cfg(not(loom))]
pub(super) const CLEAN_CHUNK: usize = 256;
#[cfg(loom)]
pub(super) const CLEAN_CHUNK: usize = 2;

impl<K> Table<K> {
    /// Vacates the tombstones among slots `start..end` of `arr` that end a
    /// run (their next slot is vacant), walking backwards so that runs clear
    /// whole. Returns the slots vacated.
    pub(super) fn clean_range(&self, arr: &Array<K>, start: usize, end: usize) -> usize {
        let mask = arr.mask();
        let mut vacated = 0;
        for i in (start..end).rev() {
            let slot = &arr.slots[i];
            if !matches!(slot.load(), State::Tombstone) {
                continue;
            }
            let next = &arr.slots[(i + 1) & mask];
            #[cfg(pace_mutant = "clean_without_fence")]
            {
                // Known-wrong: vacate on a read of the next slot, so a row
                // linked there meanwhile ends up behind a vacant slot.
                if matches!(next.load(), State::Vacant) && slot.vacate() {
                    vacated += 1;
                }
                continue;
            }
            #[cfg(not(pace_mutant = "clean_without_fence"))]
            {
                if !matches!(next.load(), State::Vacant) || !next.fence() {
                    continue;
                }
                if slot.vacate() {
                    vacated += 1;
                }
                next.unfence();
            }
        }
        // One subtraction for the range: until it lands, `used` overstates
        // the claimed slots, which only delays a claim's room.
        if vacated > 0 {
            arr.used.fetch_sub(vacated, Ordering::Relaxed);
        }
        vacated
    }

    /// Slot `idx` of `arr` just became a tombstone: if `arr` is the current
    /// array and not migrating, vacate it and the tombstones before it while
    /// each ends a run (at most [`CLEAN_CHUNK`] slots).
    pub(super) fn clean_after(&self, arr_ptr: Shared<'_, Array<K>>, idx: usize, guard: &Guard) {
        if cfg!(pace_mutant = "no_tombstone_reuse") || self.array(guard).0 != arr_ptr {
            return;
        }
        // SAFETY: `arr_ptr` is the current array, loaded under `guard`.
        let arr = unsafe { arr_ptr.deref() };
        if is_migrating(arr.next.load(Ordering::Acquire, guard)) {
            return;
        }
        let mask = arr.mask();
        for back in 0..CLEAN_CHUNK.min(arr.slots.len() - 1) {
            let i = idx.wrapping_sub(back) & mask;
            if self.clean_range(arr, i, i + 1) == 0 {
                return;
            }
        }
    }

    /// The current array is at its limit: if tombstones hold at least a
    /// quarter of its slots, clean chunks of it (at most [`CLEAN_TRIES`] of
    /// [`CLEAN_CHUNK`] slots) until one frees a slot, and say whether one did.
    /// False means: migrate.
    pub(super) fn clean_some(
        &self,
        arr_ptr: Shared<'_, Array<K>>,
        arr: &Array<K>,
        guard: &Guard,
    ) -> bool {
        if cfg!(pace_mutant = "no_tombstone_reuse") {
            return false;
        }
        let slots = arr.slots.len();
        let tombstones = arr.used.load(Ordering::Relaxed).saturating_sub(self.len());
        if tombstones < slots / 4
            || self.array(guard).0 != arr_ptr
            || is_migrating(arr.next.load(Ordering::Acquire, guard))
        {
            return false;
        }
        for _ in 0..CLEAN_TRIES {
            let chunk =
                arr.clean_next.fetch_add(1, Ordering::Relaxed) % slots.div_ceil(CLEAN_CHUNK);
            let start = chunk * CLEAN_CHUNK;
            if self.clean_range(arr, start, (start + CLEAN_CHUNK).min(slots)) > 0 {
                return true;
            }
        }
        false
    }
}
