//! Incremental migration: moving every row of the current array to a new one
//! (larger, smaller, or the same size without tombstones), chunks at a time.
//!
//! * Starting is O(1): seal the array's `next` (PENDING), size the target
//!   from the row count, allocate it zeroed (no pass over it), publish it.
//!   An array with no rows and no insert in flight (`len == 0` after the
//!   seal) has nothing to copy: the target becomes current at once.
//! * Every reserve and refund that finds a migration running copies one
//!   chunk of [`CHUNK`] slots, and more while they held fewer than
//!   [`SPARSE_ROWS`] rows, up to [`CALL_SLOTS`] slots, then proceeds: nobody
//!   waits for the copy, and no call copies more than a constant amount.
//! * While it runs, lookups read through: a key is looked for in the current
//!   array first and followed to the target when its probe sequence there
//!   ends (a vacant slot, which an inserting lookup seals, or a sealed one).
//!   New rows go to the target only.
//! * Copying a row moves its entry pointer (the word lives in the entry):
//!   mark the slot `Copying(e)`, link `e` into the target marked `Copying`
//!   too, close the old slot, unmark `e` in the target. A copier closes
//!   every vacant slot (sealed) and tombstone (closed) of its chunk, so no
//!   insert links a row behind it into the old array. Until the old slot is
//!   closed, `e` is reachable in the old array and nobody can unlink it
//!   anywhere (both links are marked): an entry is unlinked only from its
//!   last link, so its retirement never leaves a link for a later reader.
//!   A debit lands on `e` wherever it is found. A row found DEAD when
//!   marked is not copied: the copier unlinks it.
//! * The copier of the last chunk makes the target current and retires the
//!   old array. A target cannot start its own migration before that (only
//!   the current array migrates); its `limit` keeps room for every row still
//!   to be copied.

use crossbeam_utils::Backoff;

use super::slot::{
    probe_seq, Array, Entry, Slot, State, CALL_SLOTS, CHUNK, DEAD, SPARSE_ROWS, SWEEP_IDLE,
};
use super::sweep::prefetch;
use super::{is_migrating, retire_array, retire_entry, Table, PENDING};
use crate::sync::epoch::{Guard, Owned, Shared};
use crate::sync::{fence, snooze, Ordering};

/// The size of a migration's target (slots or cells, both tables): rows
/// take at most half of it. An array that filled with tombstones which
/// cleaning in place could not clear (rows leave from the middle of
/// linear-probing runs) is churning: its target gives rows at most
/// `1 / churn_factor` of it (the slot table 4, the cell table 8), where
/// runs stay short enough for reuse and cleaning to keep up, so churn at a
/// steady number of live rows stops migrating (only when `churn_aware`:
/// each table's known-wrong variant that stops cleaning turns it off).
/// And, if there is anything to copy, room for one new row per
/// chunk beyond the copies (3/4 of an array is claimable at least): a
/// thread copies a chunk in each call, so one thread never finds the target
/// full before the copy ends (which would make its insert copy every chunk
/// left). (Known-wrong variant `no_room_for_new_rows`: size from the rows
/// alone.) `used` counts the old array's claimed entries (rows, tombstones,
/// claims), `len` its size, `chunks` its copy chunks.
pub(super) fn target_size(
    rows: usize,
    used: usize,
    len: usize,
    chunks: usize,
    min: usize,
    churn_aware: bool,
    churn_factor: usize,
) -> usize {
    let churning = churn_aware && used.saturating_sub(rows) >= len / 4;
    let room = if rows == 0 || cfg!(pace_mutant = "no_room_for_new_rows") {
        0
    } else {
        rows.saturating_add(chunks + 1)
            .saturating_mul(4)
            .div_ceil(3)
    };
    rows.saturating_mul(if churning { churn_factor } else { 2 })
        .saturating_add(2)
        .max(room)
        .max(min)
        .next_power_of_two()
}

impl<K> Table<K> {
    /// Copies chunks of the running migration, if there is one with a chunk
    /// left to claim: one, and more while the chunks copied so far held
    /// fewer than [`SPARSE_ROWS`] rows, up to [`CALL_SLOTS`] slots. True if
    /// it copied one.
    pub(super) fn help(&self, guard: &Guard) -> bool {
        let (cur_ptr, cur) = self.array(guard);
        let next = cur.next.load(Ordering::Acquire, guard);
        if next.is_null() {
            return false; // no migration, or its target is being allocated
        }
        let (mut rows, mut slots) = (0, 0);
        while let Some(n) = self.copy_one(cur_ptr, cur, next, guard) {
            rows += n;
            slots += CHUNK;
            if rows >= SPARSE_ROWS || slots + CHUNK > CALL_SLOTS {
                break;
            }
        }
        if slots == 0 {
            return false;
        }
        self.copied_slots
            .fetch_add(slots, std::sync::atomic::Ordering::Relaxed);
        true
    }

    /// Helps until no migration runs (for explicit whole-table calls only).
    pub(super) fn finish_migration(&self, guard: &Guard) {
        let backoff = Backoff::new();
        loop {
            let (_, cur) = self.array(guard);
            if !is_migrating(cur.next.load(Ordering::Acquire, guard)) {
                return;
            }
            if !self.help(guard) {
                snooze(&backoff); // the last chunks are with other copiers
            }
        }
    }

    fn copy_one(
        &self,
        arr_ptr: Shared<'_, Array<K>>,
        arr: &Array<K>,
        next: Shared<'_, Array<K>>,
        guard: &Guard,
    ) -> Option<usize> {
        let chunks = arr.chunks();
        if arr.claim.load(Ordering::Relaxed) >= chunks {
            return None;
        }
        let chunk = arr.claim.fetch_add(1, Ordering::AcqRel);
        if chunk >= chunks {
            return None;
        }
        // SAFETY: `next` was published by `start_migration` before any chunk
        // could be claimed; it is retired only after it became current and
        // was then replaced, which needs this migration to finish first, and
        // it has not (this chunk is not counted yet).
        let target = unsafe { next.deref() };
        let rows = self.copy_chunk(arr, target, chunk, guard);
        if arr.copied.fetch_add(1, Ordering::AcqRel) + 1 == chunks {
            self.finish(arr_ptr, arr, next, guard);
        }
        Some(rows)
    }

    /// Makes the target current and retires the old array: called once, by
    /// the copier of the last chunk (or by the starter of an empty copy).
    fn finish(
        &self,
        arr_ptr: Shared<'_, Array<K>>,
        arr: &Array<K>,
        next: Shared<'_, Array<K>>,
        guard: &Guard,
    ) {
        // SAFETY: as in `copy_one`.
        let target = unsafe { next.deref() };
        target.limit.store(target.grow_at(), Ordering::Relaxed);
        // A sweep pass that started on `arr` and did not end (it met this
        // migration) runs again on the target, from its start: the rows it
        // would have removed were copied there. Nobody else touches the
        // target's cursor before the swing below publishes it.
        if arr.sweep_next.load(Ordering::Relaxed) < SWEEP_IDLE
            && !cfg!(pace_mutant = "passes_die_with_their_array")
        {
            target.sweep_next.store(0, Ordering::Relaxed);
        }
        let swung = self
            .current
            .compare_exchange(arr_ptr, next, Ordering::AcqRel, Ordering::Acquire, guard)
            .is_ok();
        debug_assert!(swung, "only the current array migrates");
        if swung {
            // SAFETY: `arr` is no longer reachable from `current`; readers
            // that reached it are pinned. Every slot of it is now a tombstone
            // or sealed (all chunks are copied), so it owns no entry, only
            // its slot array. Only the finisher retires it.
            unsafe { retire_array(guard, arr_ptr) };
        }
    }

    /// Copies chunk `chunk` of `arr` into `target`: the rows it met (copied,
    /// or dropped as DEAD).
    fn copy_chunk(&self, arr: &Array<K>, target: &Array<K>, chunk: usize, guard: &Guard) -> usize {
        let end = ((chunk + 1) * CHUNK).min(arr.slots.len());
        let slots = &arr.slots[chunk * CHUNK..end];
        // Start the chunk's cache misses together: its entries, then the
        // target slots their probes start at. (Not under loom: hints only,
        // and extra loads would only multiply the models' interleavings.)
        for slot in slots.iter().filter(|_| !cfg!(loom)) {
            if let State::Row(p) = slot.load() {
                prefetch(p);
            }
        }
        for slot in slots.iter().filter(|_| !cfg!(loom)) {
            if let State::Row(p) = slot.load() {
                // SAFETY: as in the copy loop below: `p` was linked in `arr`
                // under `guard` and is retired only after an unlink deferred
                // past `guard`.
                let hash = unsafe { &*p }.hash;
                prefetch(&target.slots[hash as usize & target.mask()]);
            }
        }
        let mut moved: Vec<(*mut Entry<K>, &Slot<K>)> = Vec::new();
        let mut dropped = 0;
        for slot in slots {
            loop {
                match slot.load() {
                    State::Fence => snooze(&Backoff::new()), // a cleaner's moment
                    State::Vacant => {
                        if slot.seal() {
                            break;
                        }
                        // An insert won the slot: copy its row.
                    }
                    State::Tombstone => {
                        if slot.close() {
                            break;
                        }
                        // An insert reused the slot: copy its row.
                    }
                    State::Closed | State::Sealed => break,
                    State::Copying(_) | State::Other => {
                        debug_assert!(false, "a chunk has one copier");
                        break;
                    }
                    State::Row(p) => {
                        // SAFETY: `p` was linked in `arr` (reached through
                        // `current` under `guard`); an entry is retired only
                        // after an unlink, deferred past `guard`.
                        let e = unsafe { &*p };
                        if !slot.mark_copying(p, e.hash) {
                            continue; // unlinked meanwhile
                        }
                        if e.word.load(Ordering::Acquire) == DEAD {
                            // Removed already (its floor is raised): drop it
                            // here instead of copying it (we hold it marked,
                            // so nobody else unlinks it).
                            slot.moved(p);
                            self.len.fetch_sub(1, Ordering::SeqCst);
                            dropped += 1;
                            // SAFETY: `p` is no longer linked anywhere (it was
                            // linked only in `arr`, and only this copier moves
                            // a marked slot on); retired once, by us.
                            unsafe { retire_entry(guard, p) };
                        } else {
                            let copy = insert_copy(target, p, e.hash);
                            #[cfg(all(test, not(loom)))]
                            tests::copy_paused(e.hash);
                            slot.moved(p);
                            // Unmarked only now that the old slot is closed:
                            // an unlink from the target removes its last link
                            // (see `slot.rs`). Known-wrong variant: linked
                            // unmarked, so a walker that passed the old slot
                            // can unlink and retire it from the target while
                            // the old slot still links it, and a reader that
                            // pins after that retirement can still reach it.
                            if !cfg!(pace_mutant = "copies_land_unmarked") {
                                copy.arrived(p, e.hash);
                            }
                            moved.push((p, copy));
                        }
                        break;
                    }
                }
            }
        }
        // The copies now occupy room the target's `limit` kept for them:
        // hand it over, so that ordinary inserts keep the room they had.
        // After the copies' `used` increments (Release; `claim_slot` reads
        // `limit` with Acquire before it adds to `used`), so an insert that
        // sees the larger limit also counts these copies in `used`.
        // Known-wrong variant (a performance defect, not an unsound one):
        // keep the copies counted against the room, so that the target fills
        // up before the copy ends and one insert copies every chunk left.
        if !moved.is_empty() && !cfg!(pace_mutant = "copies_keep_their_room") {
            target.limit.fetch_add(moved.len(), Ordering::Release);
        }
        // Dekker with `remove_dead` (one fence for the chunk): a row made
        // DEAD while we held it marked is unlinked by us from the target.
        if !moved.is_empty() {
            fence(Ordering::SeqCst);
        }
        let rows = dropped + moved.len();
        for (p, copy) in moved {
            // SAFETY: `p` was linked under our `guard`; it is retired only
            // after an unlink, so its destruction is deferred past `guard`.
            let dead = unsafe { &*p }.word.load(Ordering::Acquire) == DEAD;
            if dead && !cfg!(pace_mutant = "copier_skips_dead") {
                self.unlink(copy, p, guard);
            }
        }
        rows
    }

    /// Seals `arr` for migration (if it is current and nobody has), sizes,
    /// allocates and publishes the target, and copies a share (see `help`).
    pub(super) fn start_migration(&self, arr_ptr: Shared<'_, Array<K>>, guard: &Guard) {
        let (cur_ptr, _) = self.array(guard);
        if cur_ptr != arr_ptr && !cfg!(pace_mutant = "target_migrates_early") {
            return; // a target cannot migrate before it is current
        }
        // SAFETY: as in `Table::array`: loaded from `current` under `guard`.
        let arr = unsafe { arr_ptr.deref() };
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
            self.help(guard);
            return;
        }
        self.migrations.fetch_add(1, Ordering::Relaxed);
        // Every row that can still be linked into `arr` is counted in `len`
        // by now (see `Table::claim_slot`), and only `arr` holds rows (a
        // migration starts only once the previous one finished).
        // The other half of `claim_slot`'s Dekker: an insert that did not
        // see the seal is counted here.
        fence(Ordering::SeqCst);
        let rows = self.len.load(Ordering::SeqCst);
        let slots = target_size(
            rows,
            arr.used.load(Ordering::Relaxed),
            arr.slots.len(),
            arr.chunks(),
            self.min_slots,
            !cfg!(pace_mutant = "no_tombstone_reuse"),
            4,
        );
        if rows == 0 {
            // No row is linked and no insert is in flight: nothing to copy.
            let chunks = arr.chunks();
            arr.claim.store(chunks, Ordering::Relaxed);
            arr.copied.store(chunks, Ordering::Relaxed);
            let next = Owned::new(Array::new(slots, 0)).into_shared(guard);
            arr.next.store(next, Ordering::Release);
            self.finish(arr_ptr, arr, next, guard);
            return;
        }
        arr.next
            .store(Owned::new(Array::new(slots, rows)), Ordering::Release);
        self.help(guard);
    }
}

/// Links a live row's entry into the target, marked `Copying` (the copier
/// unmarks it once the old slot is closed). Only copiers write there
/// besides ordinary inserts, and the target's `limit` keeps a vacant slot
/// for every row still to be copied; no other entry of the same key can be
/// in the target (its lookups find this entry in the old array first).
fn insert_copy<K>(target: &Array<K>, p: *mut Entry<K>, hash: u64) -> &Slot<K> {
    target.used.fetch_add(1, Ordering::Relaxed);
    for idx in probe_seq(hash, target.mask()) {
        let slot = &target.slots[idx];
        loop {
            match slot.load() {
                State::Vacant => {
                    let linked = if cfg!(pace_mutant = "copies_land_unmarked") {
                        slot.link(p, hash)
                    } else {
                        slot.link_copying(p, hash)
                    };
                    if linked {
                        return slot;
                    }
                }
                State::Fence => snooze(&Backoff::new()),
                _ => break,
            }
        }
    }
    unreachable!("a migration target keeps room for every copied row");
}

#[cfg(all(test, not(loom)))]
pub(super) mod tests {
    use std::cell::RefCell;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::mpsc;

    use super::super::{Table, MIN_SLOTS};
    use crate::bucket::Limits;
    use crate::sync::epoch;

    /// What a paused copier runs, given the hash of the row it holds.
    type Pause = Box<dyn FnOnce(u64)>;

    thread_local! {
        /// Run (once) by this thread's next copier between linking a row
        /// into the target and closing its old slot.
        static PAUSE: RefCell<Option<Pause>> = RefCell::new(None);
    }

    /// The copier's hook: runs this thread's pause, if one is set.
    pub(in crate::table) fn copy_paused(hash: u64) {
        if let Some(pause) = PAUSE.with(|p| p.borrow_mut().take()) {
            pause(hash);
        }
    }

    /// A copier has linked key 0's row into the target and not yet closed
    /// its old slot. The row is made full (DEAD) through the old slot, then
    /// a reserve of the key walks past the old slot (marked: it cannot
    /// unlink it there) into the target. It must not unlink the row there
    /// while the old slot still links it: a reader that pins after that
    /// retirement could reach the entry through the old slot after it is
    /// freed. `unlink_into` checks that an entry it unlinks is linked
    /// nowhere else in the current arrays. Known-wrong variant
    /// `copies_land_unmarked` links copies unmarked, and the reserve
    /// unlinks and retires the row from the target.
    #[test]
    fn an_entry_is_retired_only_from_its_last_link() {
        let limits = Limits::new(1_000, 1).unwrap();
        let table: Table<u64> = Table::new(MIN_SLOTS);
        let now = || 0;
        // Key k has hash k: key 0 sits in slot 0, the first one copied.
        let a = {
            let guard = epoch::pin();
            table.reserve(&limits, 0, &0, 1, 0, &now, &guard).unwrap()
        };
        let (paused_tx, paused_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let copier = s.spawn(|| {
                PAUSE.with(|p| {
                    *p.borrow_mut() = Some(Box::new(move |hash| {
                        paused_tx.send(hash).unwrap();
                        let _ = go_rx.recv();
                    }))
                });
                // New keys until one starts the migration and copies.
                for k in 1..MIN_SLOTS as u64 {
                    let guard = epoch::pin();
                    let _ = table.reserve(&limits, k, &k, 1, 0, &|| 0, &guard);
                }
            });
            let hash = paused_rx.recv().expect("a migration copied key 0's row");
            assert_eq!(hash, 0);
            let walked = catch_unwind(AssertUnwindSafe(|| {
                let guard = epoch::pin();
                // Full again: the row becomes DEAD (found in its old slot,
                // marked, so its copier unlinks it).
                table.refund(&limits, 0, &0, 1, a.tat, a.prev, 0, &guard);
                // A new reserve of key 0 passes the DEAD row in the old array
                // and meets it in the target.
                table.reserve(&limits, 0, &0, 1, 0, &now, &guard).is_ok()
            }));
            go_tx.send(()).unwrap();
            copier.join().unwrap();
            let admitted = walked.unwrap_or_else(|e| {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| "a panic".into());
                panic!("the reserve that met the copied row: {msg}")
            });
            assert!(admitted, "key 0 is full again: a fresh row admits");
        });
        let guard = epoch::pin();
        let mut keys = table.live_keys(&guard);
        keys.sort_unstable();
        assert_eq!(keys, (0..MIN_SLOTS as u64).collect::<Vec<_>>());
        assert_eq!(table.len(), MIN_SLOTS);
    }
}
