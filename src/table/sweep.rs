//! Sweeps: removing full rows, a chunk of slots per call on large arrays,
//! and shrinking the table when it has become sparse.

use super::slot::{Array, State, DEAD, SWEEP_IDLE};
use super::{is_migrating, retire_batch, Table};
use crate::sync::epoch::{Guard, Shared};
use crate::sync::Ordering;

/// Arrays of at most this many slots are swept in one go by the call that
/// starts a pass (tests/rules.rs and the sequential models count on it).
pub(crate) const SWEEP_AT_ONCE: usize = 4096;

/// Sweep passes over arrays larger than [`SWEEP_AT_ONCE`] run in chunks,
/// one chunk per caller, of [`sweep_chunk`] slots: at most this many. A
/// chunk's rows are prefetched together and retired as one deferred free,
/// so what one call pays for a chunk (scan, kills, the deferred free, its
/// flush and the collection that runs) is bounded by this constant,
/// whatever the table's size.
pub(crate) const SWEEP_CHUNK: usize = 64;

/// The smallest sweep chunk.
pub(crate) const SWEEP_CHUNK_MIN: usize = 16;

/// Slots per chunk of a pass over an array of `slots` slots: as few as keep
/// the pass within 2^16 calls, between [`SWEEP_CHUNK_MIN`] and
/// [`SWEEP_CHUNK`]. Small chunks spread a churning table's kills thinly over
/// its callers; large arrays take large chunks so that a pass, and the
/// memory it gives back, ends within 65,536 calls up to 4M slots. A power of
/// two, as `slots` is.
#[inline]
pub(crate) fn sweep_chunk(slots: usize) -> usize {
    (slots >> 16).clamp(SWEEP_CHUNK_MIN, SWEEP_CHUNK)
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

impl<K> Table<K> {
    /// Removes every row whose bucket is full at `now`, then shrinks the
    /// array if it has become sparse. Returns the rows this pass removed.
    /// An explicit whole-table call: it finishes any migration it meets or
    /// starts.
    pub(crate) fn sweep(&self, now: u64, guard: &Guard) -> usize {
        let mut removed = 0;
        loop {
            self.finish_migration(guard);
            let (arr_ptr, arr) = self.array(guard);
            let (n, done) = self.sweep_range(arr, 0, arr.slots.len(), now, guard);
            removed += n;
            if done {
                if arr.slots.len() > self.min_slots && self.sparse(arr) {
                    self.start_migration(arr_ptr, guard);
                }
                self.finish_migration(guard);
                return removed;
            }
            // A migration started under the pass: sweep its target.
        }
    }

    /// Starts a sweep pass: arrays of at most [`SWEEP_AT_ONCE`] slots are
    /// swept at once; larger ones are handed out a chunk at a time to the callers
    /// of [`sweep_step`](Table::sweep_step), so no caller scans more than one
    /// chunk. A pass already running continues.
    ///
    /// A pass that starts on a migrating array, or meets a migration on its
    /// way, is not lost: the migration's finisher starts it again on the
    /// target (see `finish` in `migrate.rs`).
    pub(crate) fn start_sweep(&self, now: u64, guard: &Guard) {
        let (arr_ptr, arr) = self.array(guard);
        let migrating = is_migrating(arr.next.load(Ordering::Acquire, guard));
        if arr.slots.len() <= SWEEP_AT_ONCE && !migrating {
            if self.sweep_range(arr, 0, arr.slots.len(), now, guard).1 {
                self.shrink_if_sparse(arr_ptr, arr, guard);
            }
            return;
        }
        // Any cursor at or past the end means no pass runs: `SWEEP_IDLE`,
        // but also `SWEEP_IDLE` plus the chunks that callers claimed late,
        // after the last chunk's sweeper set it idle.
        let at = arr.sweep_next.load(Ordering::Relaxed);
        let idle = if cfg!(pace_mutant = "sweep_cursor_stuck") {
            SWEEP_IDLE
        } else {
            at
        };
        if at >= arr.slots.len() {
            let _ = arr
                .sweep_next
                .compare_exchange(idle, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        if !migrating {
            self.sweep_step(now, guard);
        }
    }

    /// Sweeps one chunk of the running pass, if there is one: two loads
    /// otherwise.
    #[inline]
    pub(crate) fn sweep_step(&self, now: u64, guard: &Guard) {
        let (arr_ptr, arr) = self.array(guard);
        if arr.sweep_next.load(Ordering::Relaxed) < arr.slots.len() {
            self.sweep_chunk(arr_ptr, arr, now, guard);
        }
    }

    /// Whether a chunked pass is running on the current array (for tests).
    #[cfg(test)]
    pub(crate) fn sweep_running(&self, guard: &Guard) -> bool {
        let (_, arr) = self.array(guard);
        arr.sweep_next.load(Ordering::Relaxed) < arr.slots.len()
    }

    /// The second half of [`sweep_step`](Table::sweep_step) alone: a caller
    /// that saw a running pass and claims its chunk late, after the pass
    /// ended (for tests).
    #[cfg(test)]
    pub(crate) fn sweep_chunk_late(&self, now: u64, guard: &Guard) {
        let (arr_ptr, arr) = self.array(guard);
        self.sweep_chunk(arr_ptr, arr, now, guard);
    }

    #[cold]
    #[inline(never)]
    fn sweep_chunk(&self, arr_ptr: Shared<'_, Array<K>>, arr: &Array<K>, now: u64, guard: &Guard) {
        let len = arr.slots.len();
        let chunk = sweep_chunk(len);
        let start = arr.sweep_next.fetch_add(chunk, Ordering::Relaxed);
        if start >= len {
            return;
        }
        let end = (start + chunk).min(len);
        // A migration met on the way abandons the pass (the array is going).
        if self.sweep_range(arr, start, end, now, guard).1 && end == len {
            arr.sweep_next.store(SWEEP_IDLE, Ordering::Relaxed);
            self.shrink_if_sparse(arr_ptr, arr, guard);
        }
    }

    /// Removes the full rows among slots `start..end` of the current array:
    /// the rows removed, and false if it stopped at a migration (the rows
    /// are swept in the target).
    fn sweep_range(
        &self,
        arr: &Array<K>,
        start: usize,
        end: usize,
        now: u64,
        guard: &Guard,
    ) -> (usize, bool) {
        if is_migrating(arr.next.load(Ordering::Acquire, guard)) {
            return (0, false);
        }
        let mut removed = 0;
        let mut batch = Vec::new();
        for window in arr.slots[start..end].chunks(SWEEP_CHUNK) {
            // Each row's word lives in its own entry, allocated wherever:
            // start the window's cache misses together, not one at a time
            // (not under loom: hints only, and extra loads would only
            // multiply the models' interleavings).
            for slot in window.iter().filter(|_| !cfg!(loom)) {
                if let State::Row(p) = slot.load() {
                    prefetch(p);
                }
            }
            for slot in window {
                let p = match slot.load() {
                    State::Row(p) => p,
                    State::Copying(_) => {
                        // SAFETY: as below.
                        unsafe { retire_batch::<K>(guard, &self.len, batch) };
                        return (removed, false);
                    }
                    _ => continue,
                };
                // SAFETY: `p` was linked in `arr`, reached through `current`
                // under `guard`: it is retired only after an unlink that
                // happens after `guard` was pinned.
                let e = unsafe { &*p };
                let word = e.word.load(Ordering::Acquire);
                if word == DEAD {
                    self.unlink_into(slot, p, guard, Some(&mut batch));
                } else if word <= now && self.kill(slot, p, word, guard, &mut batch) {
                    removed += 1;
                }
            }
            // One deferred free per window, flushed at once: no deferred
            // closure frees more than a window's rows, so the collection
            // that runs it (in whichever caller pins then) stays bounded.
            // SAFETY: every entry in `batch` was unlinked by us (the CAS
            // winner) and is reachable by no new reader; retired once, here.
            unsafe { retire_batch::<K>(guard, &self.len, std::mem::take(&mut batch)) };
        }
        // The rows it removed left tombstones: clean them in place.
        if removed > 0 && !is_migrating(arr.next.load(Ordering::Acquire, guard)) {
            self.clean_range(arr, start, end);
        }
        // A migration that started under the scan may have moved rows out
        // of slots before we read them (we saw their tombstones, after the
        // target was published): those rows are swept in the target.
        (
            removed,
            !is_migrating(arr.next.load(Ordering::Acquire, guard)),
        )
    }

    /// Whether rows fill less than 1/16 of `arr`: a churning table gives its
    /// rows a quarter of the slots (see `start_migration`), so the threshold
    /// sits well below that and a table whose rows swing between one and two
    /// horizons of keys does not shrink and grow every pass.
    fn sparse(&self, arr: &Array<K>) -> bool {
        self.len().saturating_mul(16) < arr.slots.len()
    }

    /// Migrates to a smaller array when rows fill less than 1/16 of the slots.
    /// An empty table swaps in O(1); otherwise the shrink is left pending
    /// for the next call (see [`shrink_pending`](Table::shrink_pending)), so
    /// that a pass ending under a reserve's own short-lived row does not
    /// start a copy that the row's refund a moment later would make
    /// unnecessary.
    fn shrink_if_sparse(&self, arr_ptr: Shared<'_, Array<K>>, arr: &Array<K>, guard: &Guard) {
        if arr.slots.len() > self.min_slots && self.sparse(arr) {
            if self.len() == 0 {
                self.start_migration(arr_ptr, guard);
            } else {
                self.shrink_wanted.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Starts a shrink left pending by the last sweep pass, if the table is
    /// still sparse: O(1) when it is empty, else an incremental migration.
    #[inline]
    pub(crate) fn shrink_pending(&self, guard: &Guard) {
        if self.shrink_wanted.load(Ordering::Relaxed) {
            self.start_pending_shrink(guard);
        }
    }

    #[cold]
    #[inline(never)]
    fn start_pending_shrink(&self, guard: &Guard) {
        if !self.shrink_wanted.swap(false, Ordering::Relaxed) {
            return;
        }
        let (arr_ptr, arr) = self.array(guard);
        if arr.slots.len() > self.min_slots && self.sparse(arr) {
            self.start_migration(arr_ptr, guard);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{sweep_chunk, SWEEP_CHUNK, SWEEP_CHUNK_MIN};

    /// Small arrays take the smallest chunks; a pass over up to 4M slots
    /// ends within 65,536 calls; no chunk exceeds `SWEEP_CHUNK`.
    #[test]
    fn chunks_follow_the_array() {
        assert_eq!(sweep_chunk(8192), SWEEP_CHUNK_MIN);
        assert_eq!(sweep_chunk(1 << 20), 16);
        assert_eq!(sweep_chunk(1 << 21), 32);
        assert_eq!(sweep_chunk(1 << 22), 64);
        assert_eq!(sweep_chunk(1 << 30), SWEEP_CHUNK);
        for shift in 13..=22 {
            let slots = 1usize << shift;
            assert!(slots / sweep_chunk(slots) <= 1 << 16, "{slots} slots");
        }
    }
}
