//! The table for word-sized keys: rows live in 16-byte cells of the array
//! (DESIGN.md §2, "Rows in cells").

mod cell;
pub(crate) use cell::lock_free;
#[cfg(feature = "internals")]
pub(crate) use sweep::cell_sweep_chunk;
mod clean;
mod sweep;

use std::mem::size_of;

use crossbeam_utils::{Backoff, CachePadded};

use super::floor::Floors;
use super::migrate::target_size;
// Cells per migration chunk, rows that make a chunk dense, and the most a
// call copies: the slot table's (64, 16, 1,024; loom: 2, 16, 2).
use super::slot::{probe_seq, CALL_SLOTS, CHUNK, SPARSE_ROWS};
use crate::bucket::{Decision, Limits, Refund};
use crate::pace::Refunded;
use crate::sync::epoch::{Atomic, Guard, Owned, Shared};
use crate::sync::{cas_retry, fence, snooze, AtomicBool, AtomicUsize, Ordering};
use cell::{Cell, CellState};

/// What a reserve did (as `Table::reserve`'s `Admitted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Admitted {
    pub(crate) tat: u64,
    pub(crate) prev: u64,
    pub(crate) created: bool,
}

/// Why a claim failed.
enum Lost {
    /// The cell changed first: look again.
    Taken,
    /// The array is at its limit: migrate.
    NoRoom,
}

/// What [`CellTable::verify`] decides for a claim.
enum Verdict {
    Keep,
    Withdraw,
    /// Withdraw, wait while this earlier cell holds a claim of the key.
    Await(usize),
}

/// Tag on a null `next`: a migration target is being allocated.
const PENDING: usize = 1;

/// The smallest array.
const MIN_CELLS: usize = 4;

/// A churning array's target gives rows at most 1/8 of its cells (the slot
/// table: 1/4). Under a steady flood of new keys, tombstones left in the
/// middle of runs hold about as many cells as the rows do; with rows at a
/// quarter, runs grow long enough that a new key's walk to the empty cell
/// ending its sequence (it must pass every tombstone to know the key has no
/// row) is the slowest part of a call (in one measured flood, 1 call in
/// 1,000 walked over 100 cells at 4,000 live rows in 16,384 cells).
const CHURN_FACTOR: usize = 8;

/// Arrays this small are never resized for churn (`resize_if_churning`).
const CHURN_RESIZE_MIN: usize = 64;

/// Claims allowed in an array of `n` cells, so every sequence ends: 13/16
/// from 64 cells on (so that, say, 100k rows fit 2^17 cells: 16 bytes a
/// cell, 21 bytes a row), 3/4 below (the models' 4-cell arrays keep a
/// quarter empty). Linear probing at 13/16 walks about 3 cells to find a
/// row and 15 to find none, against 2.5 and 8.5 at 3/4; arrays sit that
/// full only between 3/4 of one size and the growth to the next.
fn grow_at(n: usize) -> usize {
    if n >= 64 {
        n - 3 * (n / 16)
    } else {
        n - n / 4
    }
}

/// One power-of-two array of cells and its migration state.
struct CellArray {
    cells: Box<[Cell]>,
    /// Cells not empty: rows, claims, tombstones, copies.
    used: CachePadded<AtomicUsize>,
    /// Claims allowed (`grow_at`, less the rows a migration will copy in,
    /// raised as each chunk's copies arrive).
    limit: AtomicUsize,
    /// The migration target: null, null tagged PENDING, or the next array.
    next: Atomic<CellArray>,
    /// Next chunk to copy.
    claim: AtomicUsize,
    /// Chunks copied.
    copied: AtomicUsize,
    /// Next chunk to clean when the array meets its limit.
    clean_next: AtomicUsize,
    /// Next cell of the running incremental sweep pass, or `SWEEP_IDLE`.
    sweep_next: CachePadded<AtomicUsize>,
}

impl CellArray {
    /// A migration target: an allocation failure aborts, as a `Vec`'s does.
    fn new(n: usize, copies: usize) -> CellArray {
        CellArray::try_new(n, copies).unwrap_or_else(|| {
            let layout = std::alloc::Layout::array::<Cell>(n)
                .unwrap_or_else(|_| std::alloc::Layout::new::<Cell>());
            std::alloc::handle_alloc_error(layout)
        })
    }

    fn try_new(n: usize, copies: usize) -> Option<CellArray> {
        debug_assert!(n.is_power_of_two());
        Some(CellArray {
            cells: cell::empty_cells(n)?,
            used: CachePadded::new(AtomicUsize::new(0)),
            limit: AtomicUsize::new(grow_at(n).saturating_sub(copies)),
            next: Atomic::null(),
            claim: AtomicUsize::new(0),
            copied: AtomicUsize::new(0),
            clean_next: AtomicUsize::new(0),
            sweep_next: CachePadded::new(AtomicUsize::new(crate::table::slot::SWEEP_IDLE)),
        })
    }

    fn mask(&self) -> usize {
        self.cells.len() - 1
    }

    fn chunks(&self) -> usize {
        self.cells.len().div_ceil(CHUNK)
    }
}

/// Hands an array unpublished from `current` to the collector and flushes
/// the thread's garbage, so that it is freed soon (a growing table retires
/// little else); a large array is freed off the caller's path
/// (`free_array`).
///
/// # Safety
/// `arr` was unpublished from `current` (unreachable for new readers) and
/// is retired exactly once.
unsafe fn retire_array(guard: &Guard, arr: Shared<'_, CellArray>) {
    let ptr = arr.as_raw() as usize;
    // SAFETY: the caller's contract; the closure rebuilds the `Box` (made by
    // `Owned::new`) once, after every guard that could see `arr` is gone.
    unsafe {
        guard.defer_unchecked(move || {
            let mut owned = Box::from_raw(ptr as *mut CellArray);
            let cells = std::mem::take(&mut owned.cells);
            drop(owned);
            super::free_array(cells);
        })
    };
    // Not under loom, as for slot arrays. (Known-wrong variant
    // `arrays_wait_for_a_full_bag`: no flush.)
    #[cfg(not(loom))]
    if !cfg!(pace_mutant = "arrays_wait_for_a_full_bag") {
        guard.flush();
    }
}

/// Whether an array's `next` says a migration has started.
fn is_migrating(next: Shared<'_, CellArray>) -> bool {
    !next.is_null() || next.tag() != 0
}

/// Where a key's walk ended.
enum Found<'g> {
    /// The key's row: cell `idx` of `arr` held `v` (live, `tat`).
    Row {
        arr: &'g CellArray,
        idx: usize,
        v: u128,
        tat: u64,
    },
    /// No row: the first empty cell of the sequence in `arr` (which was not
    /// migrating), and the first tombstone before it with its value.
    Absent {
        arr: Shared<'g, CellArray>,
        empty: usize,
        tomb: Option<(usize, u128)>,
    },
    /// Every cell of `arr` probed, none empty.
    Full {
        arr: Shared<'g, CellArray>,
        tomb: Option<(usize, u128)>,
    },
}

/// The table of word-sized keys: arrays of cells, migrating chunk by chunk.
pub(crate) struct CellTable {
    /// The oldest array in use: the one migrating, if a migration runs.
    current: Atomic<CellArray>,
    /// Rows: live cells plus claims in flight.
    len: CachePadded<AtomicUsize>,
    min_cells: usize,
    floors: Floors,
    /// Migrations started (for tests).
    migrations: AtomicUsize,
    /// Cells of the chunks copied (for tests).
    copied_cells: AtomicUsize,
    /// A sweep pass ended on a sparse array that still held rows: the next
    /// insert or removal starts the shrink (`shrink_pending`).
    shrink_wanted: AtomicBool,
    /// The current array's first cell and mask, as plain numbers, for
    /// [`prefetch`](CellTable::prefetch) before a call pins the epoch,
    /// stored by `finish` after it makes an array current. Never read
    /// through: the array may be gone, the two may belong to different
    /// arrays for a moment, and a finisher pre-empted before its stores
    /// while a later migration also ends leaves an older array's address
    /// until the next migration ends. Each is only a wasted prefetch.
    #[cfg(not(loom))]
    hint: (
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicUsize,
    ),
}

impl CellTable {
    /// A table that never shrinks below `min_cells` (a power of two, at
    /// least 4).
    #[cfg(test)]
    pub(crate) fn new(min_cells: usize) -> CellTable {
        CellTable::try_new(min_cells).expect("min_cells fits an array")
    }

    /// A table that never shrinks below `min_cells` (rounded up to a power
    /// of two, at least 4), or `None` if that is more cells than an array
    /// can have or the allocator gives.
    pub(crate) fn try_new(min_cells: usize) -> Option<CellTable> {
        let n = min_cells.max(MIN_CELLS).checked_next_power_of_two()?;
        let first = CellArray::try_new(n, 0)?;
        #[cfg(not(loom))]
        let hint = (
            std::sync::atomic::AtomicUsize::new(first.cells.as_ptr() as usize),
            std::sync::atomic::AtomicUsize::new(first.mask()),
        );
        Some(CellTable {
            #[cfg(not(loom))]
            hint,
            current: Atomic::new(first),
            len: CachePadded::new(AtomicUsize::new(0)),
            min_cells: n,
            floors: Floors::new(),
            migrations: AtomicUsize::new(0),
            copied_cells: AtomicUsize::new(0),
            shrink_wanted: AtomicBool::new(false),
        })
    }

    /// Asks the CPU to fetch the cell where a key with this hash starts in
    /// the current array, before the caller pins the epoch and reads the
    /// clock: the lookup's one cache miss then overlaps them. An address
    /// from a stale hint is only a wasted prefetch; nothing reads through
    /// it.
    #[inline(always)]
    pub(crate) fn prefetch(&self, hash: u64) {
        #[cfg(not(loom))]
        {
            let relaxed = std::sync::atomic::Ordering::Relaxed;
            let base = self.hint.0.load(relaxed) as *const Cell;
            let idx = hash as usize & self.hint.1.load(relaxed);
            crate::table::sweep::prefetch(base.wrapping_add(idx));
        }
        #[cfg(loom)]
        let _ = hash;
    }

    /// Where a fresh row of a key with this hash starts (its stripe's floor).
    #[inline]
    pub(crate) fn floor(&self, hash: u64) -> u64 {
        self.floors.get(hash)
    }

    /// Bytes held by the floors.
    pub(crate) fn floor_bytes(&self) -> usize {
        self.floors.bytes()
    }

    /// Cells of the chunks migrations have copied since the table was made.
    #[cfg(feature = "internals")]
    pub(crate) fn copied_cells(&self) -> usize {
        self.copied_cells.load(Ordering::Relaxed)
    }

    /// Whether a migration of the current array is running.
    #[cfg(feature = "internals")]
    pub(crate) fn migrating(&self, guard: &Guard) -> bool {
        let (_, cur) = self.array(guard);
        is_migrating(cur.next.load(Ordering::Acquire, guard))
    }

    /// Bytes of the arrays in use: the current one and, while a migration
    /// runs, its target. Rows own nothing else.
    pub(crate) fn array_bytes(&self, guard: &Guard) -> usize {
        let (_, cur) = self.array(guard);
        let next = cur.next.load(Ordering::Acquire, guard);
        let bytes = |a: &CellArray| size_of::<CellArray>() + a.cells.len() * size_of::<Cell>();
        if next.is_null() {
            return bytes(cur);
        }
        // SAFETY: as in `next_of`: a published target lives as long as its
        // source, which `guard` keeps.
        let target = unsafe { next.deref() };
        bytes(cur) + bytes(target)
    }

    /// The bits of the row whose key `matches` (at most one key does), if
    /// the key's sequence holds one: for callers whose borrowed form of a
    /// key has no bits of its own. Reads only; waits for nothing.
    pub(crate) fn key_matching(
        &self,
        hash: u64,
        matches: &dyn Fn(u64) -> bool,
        guard: &Guard,
    ) -> Option<u64> {
        let (mut arr_ptr, _) = self.array(guard);
        loop {
            // SAFETY: `current` or a target reached from it under `guard`.
            let arr = unsafe { arr_ptr.deref() };
            for idx in probe_seq(hash, arr.mask()) {
                match CellState::decode(arr.cells[idx].load()) {
                    CellState::Empty | CellState::Fence | CellState::Sealed => break,
                    CellState::Claimed { key }
                    | CellState::Live { key, .. }
                    | CellState::FrozenClaimed { key }
                    | CellState::FrozenLive { key, .. }
                    | CellState::Moved { key }
                        if matches(key) =>
                    {
                        return Some(key)
                    }
                    _ => {}
                }
            }
            let next = arr.next.load(Ordering::Acquire, guard);
            if next.is_null() {
                return None;
            }
            arr_ptr = next;
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Migrations started since the table was made.
    #[cfg(feature = "internals")]
    pub(crate) fn migrations(&self) -> usize {
        self.migrations.load(Ordering::Relaxed)
    }

    /// Cells of the array new rows go to (the target while migrating).
    pub(crate) fn cells(&self, guard: &Guard) -> usize {
        let (_, cur) = self.array(guard);
        let next = cur.next.load(Ordering::Acquire, guard);
        if next.is_null() {
            cur.cells.len()
        } else {
            // SAFETY: see `next_of`.
            unsafe { next.deref() }.cells.len()
        }
    }

    #[inline(always)]
    fn array<'g>(&self, guard: &'g Guard) -> (Shared<'g, CellArray>, &'g CellArray) {
        let p = self.current.load(Ordering::Acquire, guard);
        // SAFETY: `current` is never null, and an array unpublished from it
        // is retired through the epoch, so it outlives `guard`.
        (p, unsafe { p.deref() })
    }

    /// The target of a migrating array, once allocated.
    fn next_of<'g>(&self, arr: &'g CellArray, guard: &'g Guard) -> Shared<'g, CellArray> {
        let backoff = Backoff::new();
        loop {
            let next = arr.next.load(Ordering::Acquire, guard);
            if !next.is_null() {
                return next;
            }
            snooze(&backoff); // its migration's starter is allocating it
        }
    }

    /// Walks `key`'s sequence from the current array, following migration
    /// targets. An inserting walk (`seal`) seals the empty cell that ends
    /// the sequence in a migrating array, so nothing can claim it after.
    fn find<'g>(&self, hash: u64, key: u64, seal: bool, guard: &'g Guard) -> Found<'g> {
        let backoff = Backoff::new();
        let (mut arr_ptr, _) = self.array(guard);
        'arrays: loop {
            // SAFETY: `current` or a target reached from it under `guard`.
            let arr = unsafe { arr_ptr.deref() };
            let mut tomb = None;
            for idx in probe_seq(hash, arr.mask()) {
                loop {
                    let v = arr.cells[idx].load();
                    match CellState::decode(v) {
                        CellState::Empty | CellState::Fence => {
                            if !is_migrating(arr.next.load(Ordering::SeqCst, guard)) {
                                return Found::Absent {
                                    arr: arr_ptr,
                                    empty: idx,
                                    tomb,
                                };
                            }
                            if seal {
                                let sealed = CellState::Sealed.encode();
                                if v != 0 || arr.cells[idx].cas(0, sealed).is_err() {
                                    snooze(&backoff);
                                    continue; // claimed, or a fence: read it again
                                }
                            }
                            arr_ptr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        CellState::Sealed => {
                            arr_ptr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        CellState::Tomb if tomb.is_none() => tomb = Some((idx, v)),
                        CellState::Live { key: k, tat } if k == key => {
                            return Found::Row { arr, idx, v, tat };
                        }
                        CellState::FrozenLive { key: k, .. } if k == key => {
                            // Its copier is moving it: wait for that one cell.
                            snooze(&backoff);
                            continue;
                        }
                        CellState::Moved { key: k } if k == key => {
                            arr_ptr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        _ => {} // other keys, claims, closed tombstones
                    }
                    break;
                }
            }
            if !is_migrating(arr.next.load(Ordering::Acquire, guard)) {
                return Found::Full { arr: arr_ptr, tomb };
            }
            arr_ptr = self.next_of(arr, guard);
        }
    }

    /// Debits `n` tokens from `key`'s bucket at `now`, creating its row if
    /// absent (from its floor). A denial writes and creates nothing.
    /// `hash_of` gives any key's hash (a migration copy needs it).
    ///
    /// The key's first cell of a current array that is not migrating is
    /// probed here, inline: a row found there is debited at once.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn reserve(
        &self,
        limits: &Limits,
        hash: u64,
        key: u64,
        n: u64,
        now: u64,
        reread: &dyn Fn() -> u64,
        hash_of: &dyn Fn(u64) -> u64,
        guard: &Guard,
    ) -> Result<Admitted, Decision> {
        let (_, arr) = self.array(guard);
        if arr.next.load(Ordering::Relaxed, guard).is_null() {
            let idx = hash as usize & arr.mask();
            let v = arr.cells[idx].load();
            if let Some(tat) = cell::live_tat(v, key) {
                if let Some(r) = self.debit(arr, idx, v, tat, key, limits, n, now) {
                    return r;
                }
            }
        }
        self.reserve_slow(limits, hash, key, n, now, reread, hash_of, guard)
    }

    /// Everything but a row in the key's first cell: the walk, inserts,
    /// migrations.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn reserve_slow(
        &self,
        limits: &Limits,
        hash: u64,
        key: u64,
        n: u64,
        mut now: u64,
        reread: &dyn Fn() -> u64,
        hash_of: &dyn Fn(u64) -> u64,
        guard: &Guard,
    ) -> Result<Admitted, Decision> {
        let backoff = Backoff::new();
        // One chunk of a running migration per call: a call that starts one
        // or finds its target full copies again only through
        // `start_migration`, so no call copies more than a constant.
        self.shrink_pending(hash_of, guard);
        self.help(hash_of, guard);
        loop {
            let (arr_ptr, empty, tomb) = match self.find(hash, key, true, guard) {
                Found::Row { arr, idx, v, tat } => {
                    match self.debit(arr, idx, v, tat, key, limits, n, now) {
                        Some(r) => return r,
                        None => continue, // removed or frozen under us
                    }
                }
                Found::Absent { arr, empty, tomb } => (arr, Some(empty), tomb),
                Found::Full { arr, tomb } => (arr, None, tomb),
            };
            // An absent row starts from its floor: decide before creating.
            let floor = self.floors.get(hash);
            if floor > now {
                now = now.max(reread());
            }
            if let d @ (Decision::Wait(_) | Decision::Never | Decision::TimeExhausted) =
                limits.reserve(floor, now, n)
            {
                return Err(d);
            }
            // SAFETY: reached under `guard` (see `find`).
            let arr = unsafe { arr_ptr.deref() };
            let at = match self.claim(arr, key, empty, tomb, guard) {
                Ok(at) => at,
                Err(Lost::NoRoom) => {
                    // Mostly tombstones: clean a chunk in place and claim
                    // again; else migrate.
                    if !self.clean_some(arr_ptr, arr, guard) {
                        self.start_migration(arr_ptr, hash_of, guard);
                        // The full array may be a target whose copy other
                        // callers are finishing: let them.
                        snooze(&backoff);
                    }
                    continue;
                }
                Err(Lost::Taken) => {
                    // Taken first, a cleaner's fence, or a migration began.
                    snooze(&backoff);
                    continue;
                }
            };
            // Dekker with every other inserter of the key: each claims,
            // fences, then reads the whole sequence (see `verify`).
            fence(Ordering::SeqCst);
            match self.verify(hash, key, arr_ptr, at, guard) {
                Verdict::Keep => {}
                verdict => {
                    self.withdraw(arr, at, key);
                    snooze(&backoff);
                    if let Verdict::Await(earlier) = verdict {
                        let claim = CellState::Claimed { key }.encode();
                        while arr.cells[earlier].load() == claim {
                            snooze(&backoff);
                        }
                    }
                    continue;
                }
            }
            // The floor again, after the check: a row of the key removed
            // while we checked raised it before its cell became a tombstone.
            // The claim becomes the row with this debit in one CAS, so no
            // row is ever live before its first debit (a sweep would take
            // it for full); a denial now withdraws the claim.
            let floor = self.floors.get(hash);
            if floor > now {
                now = now.max(reread());
            }
            match limits.reserve(floor, now, n) {
                Decision::Admit(tat) => {
                    let claim = CellState::Claimed { key }.encode();
                    let live = CellState::Live { key, tat }.encode();
                    if arr.cells[at].cas(claim, live).is_ok() {
                        return Ok(Admitted {
                            tat,
                            prev: floor,
                            created: true,
                        });
                    }
                    // A copier froze the claim: it is not copied; look again.
                    self.len.fetch_sub(1, Ordering::SeqCst);
                }
                denied => {
                    self.withdraw(arr, at, key);
                    return Err(denied);
                }
            }
        }
    }

    /// Counts one more row unless `arr` is migrating: the handshake with
    /// `start_migration`, which sizes the target from `len` after sealing.
    fn count_row(&self, arr: &CellArray, guard: &Guard) -> bool {
        super::count_unless_migrating(&self.len, || {
            is_migrating(arr.next.load(Ordering::SeqCst, guard))
        })
    }

    /// Claims a cell of `arr` for `key`: the tombstone if there is one, else
    /// the empty cell (if the array has room for one more used cell).
    fn claim(
        &self,
        arr: &CellArray,
        key: u64,
        empty: Option<usize>,
        tomb: Option<(usize, u128)>,
        guard: &Guard,
    ) -> Result<usize, Lost> {
        if !self.count_row(arr, guard) {
            return Err(Lost::Taken);
        }
        let claim = CellState::Claimed { key }.encode();
        let lost = if let Some((at, v)) = tomb {
            // A tombstone is already counted in `used`; a copier that froze
            // it first makes this CAS fail.
            if arr.cells[at].cas(v, claim).is_ok() {
                return Ok(at);
            }
            Lost::Taken
        } else if let Some(at) = empty {
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
        self.len.fetch_sub(1, Ordering::SeqCst);
        Err(lost)
    }

    /// Withdraws our claim at `at` of `arr`: it becomes a tombstone (still
    /// used), or stays as a copier froze it (never copied).
    fn withdraw(&self, arr: &CellArray, at: usize, key: u64) {
        let claim = CellState::Claimed { key }.encode();
        let _ = arr.cells[at].cas(claim, CellState::Tomb.encode());
        self.len.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether our claim in cell `at` of `my_arr` may become `key`'s row: no
    /// live row of the key on its sequence in any array, no claim of it
    /// earlier in ours, and our array still the newest.
    fn verify(
        &self,
        hash: u64,
        key: u64,
        my_arr: Shared<'_, CellArray>,
        at: usize,
        guard: &Guard,
    ) -> Verdict {
        // Known-wrong variant: keep every claim unchecked.
        if cfg!(pace_mutant = "cells_verify_off") {
            return Verdict::Keep;
        }
        // SAFETY: reached under `guard`.
        let mine_arr = unsafe { my_arr.deref() };
        let still_newest = || !is_migrating(mine_arr.next.load(Ordering::SeqCst, guard));
        let keep_if = |keep: bool| {
            if keep {
                Verdict::Keep
            } else {
                Verdict::Withdraw
            }
        };
        let backoff = Backoff::new();
        let mut seen_me = false;
        let (mut arr_ptr, _) = self.array(guard);
        'arrays: loop {
            // SAFETY: as in `find`.
            let arr = unsafe { arr_ptr.deref() };
            let mine = arr_ptr == my_arr;
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
                            arr_ptr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        CellState::Live { key: k, .. } | CellState::FrozenLive { key: k, .. }
                            if k == key =>
                        {
                            return Verdict::Withdraw; // the key's row
                        }
                        CellState::Claimed { key: k } if k == key => {
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
            arr_ptr = self.next_of(arr, guard);
        }
    }

    /// The CAS loop that debits the row of `key` in cell `idx` of `arr`,
    /// which held `v` (live at `tat`). `None` if the row was removed or
    /// frozen first (look again).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn debit(
        &self,
        arr: &CellArray,
        idx: usize,
        mut v: u128,
        mut tat: u64,
        key: u64,
        limits: &Limits,
        n: u64,
        now: u64,
    ) -> Option<Result<Admitted, Decision>> {
        let backoff = Backoff::new();
        loop {
            match limits.reserve(tat, now, n) {
                Decision::Admit(new) => {
                    let next = CellState::Live { key, tat: new }.encode();
                    match arr.cells[idx].cas(v, next) {
                        Ok(_) => {
                            return Some(Ok(Admitted {
                                tat: new,
                                prev: tat,
                                created: false,
                            }))
                        }
                        Err(actual) => match cell::live_tat(actual, key) {
                            Some(t) => {
                                v = actual;
                                tat = t;
                                cas_retry(&backoff);
                            }
                            None => return None,
                        },
                    }
                }
                denied => return Some(Err(denied)),
            }
        }
    }

    /// Undoes a reservation that moved `key`'s row from `prev` to `own_tat`,
    /// if the row still ends at `own_tat`. A refund that makes the bucket
    /// full raises the floor to `prev` and removes the row.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn refund(
        &self,
        limits: &Limits,
        hash: u64,
        key: u64,
        n: u64,
        own_tat: u64,
        prev: u64,
        now: u64,
        hash_of: &dyn Fn(u64) -> u64,
        guard: &Guard,
    ) -> Refunded {
        self.help(hash_of, guard);
        let backoff = Backoff::new();
        'find: loop {
            let Found::Row {
                arr,
                idx,
                mut v,
                mut tat,
            } = self.find(hash, key, false, guard)
            else {
                return Refunded::Refilled;
            };
            loop {
                let (next, full) = match limits.refund(tat, now, n, own_tat, prev) {
                    Refund::Unchanged => return Refunded::Superseded,
                    Refund::Set(t) => (CellState::Live { key, tat: t }.encode(), false),
                    Refund::Full => {
                        if !cfg!(pace_mutant = "cells_refund_keeps_floor") {
                            self.floors.raise(hash, prev);
                        }
                        (CellState::Tomb.encode(), true)
                    }
                };
                match arr.cells[idx].cas(v, next) {
                    Ok(_) => {
                        if full {
                            self.len.fetch_sub(1, Ordering::SeqCst);
                            self.clean_after(arr, idx, guard);
                            self.shrink_pending(hash_of, guard);
                            return Refunded::Removed;
                        }
                        return Refunded::Restored;
                    }
                    Err(actual) => match CellState::decode(actual) {
                        CellState::Live { key: k, tat: t } if k == key => {
                            v = actual;
                            tat = t;
                            cas_retry(&backoff);
                        }
                        // Frozen by a copier: find it in the target.
                        // (Known-wrong variant: give up, losing the refund.)
                        CellState::FrozenLive { .. } | CellState::Moved { .. }
                            if !cfg!(pace_mutant = "cells_refund_gives_up_on_frozen") =>
                        {
                            continue 'find
                        }
                        // Removed (full) or reused since: nothing to return.
                        _ => return Refunded::Refilled,
                    },
                }
            }
        }
    }

    /// The `tat` of `key`'s row, if it has one.
    pub(crate) fn peek(&self, hash: u64, key: u64, guard: &Guard) -> Option<u64> {
        match self.find(hash, key, false, guard) {
            Found::Row { tat, .. } => Some(tat),
            _ => None,
        }
    }

    /// Removes every row whose bucket is full at `now` (floor raised to its
    /// own `tat` first), after finishing any migration, then shrinks a
    /// sparse array (whole: an explicit call). `hash_of` gives a key's hash:
    /// cells do not keep it.
    pub(crate) fn sweep(&self, now: u64, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) -> usize {
        let mut removed = 0;
        loop {
            self.finish_migration(hash_of, guard);
            let (arr_ptr, arr) = self.array(guard);
            removed += self.sweep_range(arr, 0, arr.cells.len(), now, hash_of, guard);
            if is_migrating(arr.next.load(Ordering::Acquire, guard)) {
                continue; // a migration started under the pass: sweep its target
            }
            if arr.cells.len() > self.min_cells && self.len().saturating_mul(16) < arr.cells.len() {
                self.start_migration(arr_ptr, hash_of, guard);
            }
            self.finish_migration(hash_of, guard);
            return removed;
        }
    }

    /// Starts a migration of `arr_ptr` if it is current and none runs: seal
    /// `next`, size the target from `len`, publish it, copy a chunk.
    fn start_migration(
        &self,
        arr_ptr: Shared<'_, CellArray>,
        hash_of: &dyn Fn(u64) -> u64,
        guard: &Guard,
    ) {
        let (cur_ptr, _) = self.array(guard);
        if cur_ptr != arr_ptr {
            self.help(hash_of, guard);
            return; // a target cannot migrate before it is current
        }
        // SAFETY: loaded from `current` under `guard`.
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
            self.help(hash_of, guard);
            return;
        }
        self.migrations.fetch_add(1, Ordering::Relaxed);
        // The other half of `count_row`'s Dekker: a claim that did not see
        // the seal is counted here.
        fence(Ordering::SeqCst);
        let rows = self.len.load(Ordering::SeqCst);
        // Sized as slot arrays are (`target_size`).
        let n = target_size(
            rows,
            arr.used.load(Ordering::Relaxed),
            arr.cells.len(),
            arr.chunks(),
            self.min_cells,
            !cfg!(pace_mutant = "cells_no_clean"),
            CHURN_FACTOR,
        );
        if rows == 0 {
            // No row is live and no claim is in flight (each is counted in
            // `len` before it checks the seal): nothing to copy, so the
            // target becomes current at once.
            let chunks = arr.chunks();
            arr.claim.store(chunks, Ordering::Relaxed);
            arr.copied.store(chunks, Ordering::Relaxed);
            let next = Owned::new(CellArray::new(n, 0)).into_shared(guard);
            arr.next.store(next, Ordering::Release);
            self.finish(arr_ptr, next, guard);
            return;
        }
        arr.next
            .store(Owned::new(CellArray::new(n, rows)), Ordering::Release);
        self.help(hash_of, guard);
    }

    /// Copies one chunk of the running migration, if a chunk is left to
    /// claim; the copier of the last chunk makes the target current.
    fn help(&self, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) {
        let (cur_ptr, cur) = self.array(guard);
        let next_ptr = cur.next.load(Ordering::Acquire, guard);
        if next_ptr.is_null() {
            return;
        }
        // SAFETY: a published target lives as long as its source.
        let next = unsafe { next_ptr.deref() };
        // One chunk, and more while the chunks copied so far held fewer
        // than `SPARSE_ROWS` rows, up to `CALL_SLOTS` cells (as slot arrays
        // are copied): a shrink of a large, nearly empty array ends within
        // cells / CALL_SLOTS calls.
        let (mut rows, mut cells) = (0, 0);
        loop {
            let c = cur.claim.fetch_add(1, Ordering::Relaxed);
            if c >= cur.chunks() {
                break;
            }
            rows += self.copy_chunk(cur, next, c, hash_of);
            cells += CHUNK.min(cur.cells.len() - c * CHUNK);
            if cur.copied.fetch_add(1, Ordering::AcqRel) + 1 == cur.chunks() {
                self.finish(cur_ptr, next_ptr, guard);
                break;
            }
            if rows >= SPARSE_ROWS || cells + CHUNK > CALL_SLOTS {
                break;
            }
        }
        self.copied_cells.fetch_add(cells, Ordering::Relaxed);
    }

    /// Copies every chunk left (for whole-table operations and tests).
    fn finish_migration(&self, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) {
        let backoff = Backoff::new();
        loop {
            let (_, cur) = self.array(guard);
            let next = cur.next.load(Ordering::Acquire, guard);
            if !is_migrating(next) {
                return;
            }
            if next.is_null() || cur.claim.load(Ordering::Relaxed) >= cur.chunks() {
                // Its starter is allocating the target, or the last chunks
                // are with other copiers.
                snooze(&backoff);
            }
            self.help(hash_of, guard);
        }
    }

    /// Freezes every cell of chunk `c` of `old`, places its rows in `new`,
    /// marks them moved.
    /// Returns the rows it copied.
    fn copy_chunk(
        &self,
        old: &CellArray,
        new: &CellArray,
        c: usize,
        hash_of: &dyn Fn(u64) -> u64,
    ) -> usize {
        let backoff = Backoff::new();
        let start = c * CHUNK;
        let end = ((c + 1) * CHUNK).min(old.cells.len());
        // The frozen rows, placed after the whole chunk is frozen: each row's
        // target cell is prefetched as it is found, so the chunk's (random)
        // target lines are fetched together rather than one after another.
        let mut rows = [(0usize, 0u64, 0u128, 0u64); CHUNK];
        let mut copies = 0;
        for (i, cell) in old.cells[start..end].iter().enumerate() {
            let frozen = loop {
                let v = cell.load();
                match CellState::decode(v) {
                    CellState::Fence => snooze(&backoff), // a cleaner's moment
                    CellState::Sealed
                    | CellState::Closed
                    | CellState::FrozenClaimed { .. }
                    | CellState::FrozenLive { .. }
                    | CellState::Moved { .. } => break v,
                    // Known-wrong variant: copy a row without freezing it,
                    // so a debit between the read and `Moved` is lost.
                    CellState::Live { .. } if cfg!(pace_mutant = "cells_copy_unfrozen") => {
                        break cell::freeze(v);
                    }
                    _ => {
                        let f = cell::freeze(v);
                        if cell.cas(v, f).is_ok() {
                            break f;
                        }
                    }
                }
            };
            if let CellState::FrozenLive { key, tat } = CellState::decode(frozen) {
                let hash = hash_of(key);
                super::sweep::prefetch(&new.cells[hash as usize & new.mask()]);
                rows[copies] = (start + i, key, CellState::Live { key, tat }.encode(), hash);
                copies += 1;
            }
        }
        for &(idx, key, live, hash) in &rows[..copies] {
            Self::place(new, hash, live);
            old.cells[idx].store(CellState::Moved { key }.encode());
        }
        // Room for the copies: `used` first, then `limit` (claims read
        // `limit` before they add to `used`).
        new.used.fetch_add(copies, Ordering::Relaxed);
        new.limit.fetch_add(copies, Ordering::Release);
        copies
    }

    /// Writes a copied row into the first empty cell of its sequence in
    /// `arr` (the target, which nothing else holds the key in).
    fn place(arr: &CellArray, hash: u64, v: u128) {
        for idx in probe_seq(hash, arr.mask()) {
            if arr.cells[idx].cas(0, v).is_ok() {
                return;
            }
        }
        unreachable!("a target has room for every copy");
    }

    /// Makes the target current and retires the old array.
    fn finish(&self, old: Shared<'_, CellArray>, new: Shared<'_, CellArray>, guard: &Guard) {
        if self
            .current
            .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire, guard)
            .is_ok()
        {
            // A pass that was running on the old array goes on in the new.
            // SAFETY: both reached under `guard`.
            let (o, n) = unsafe { (old.deref(), new.deref()) };
            #[cfg(not(loom))]
            {
                let relaxed = std::sync::atomic::Ordering::Relaxed;
                self.hint.0.store(n.cells.as_ptr() as usize, relaxed);
                self.hint.1.store(n.mask(), relaxed);
            }
            if o.sweep_next.load(Ordering::Relaxed) < o.cells.len() {
                n.sweep_next.store(0, Ordering::Relaxed);
            }
            // SAFETY: `old` is unreachable from `current` now; readers that
            // still hold it pinned before this, and the epoch frees it
            // after them. It owns no heap per row; it is retired once (only
            // the copier of the last chunk gets here).
            unsafe { retire_array(guard, old) };
        }
    }

    /// Keys of the live rows (for tests; nothing in flight).
    #[cfg(feature = "internals")]
    pub(crate) fn live_keys(&self, guard: &Guard) -> Vec<u64> {
        let (_, cur) = self.array(guard);
        let next = cur.next.load(Ordering::Acquire, guard);
        let mut arrays = vec![cur];
        if !next.is_null() {
            // SAFETY: as in `next_of`.
            arrays.push(unsafe { next.deref() });
        }
        arrays
            .iter()
            .flat_map(|a| a.cells.iter())
            .filter_map(|c| match CellState::decode(c.load()) {
                CellState::Live { key, .. } | CellState::FrozenLive { key, .. } => Some(key),
                _ => None,
            })
            .collect()
    }
}

impl Drop for CellTable {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other thread holds the table; the arrays
        // are owned by `current` and its `next`.
        unsafe {
            let guard = crate::sync::epoch::unprotected();
            let cur = self.current.load(Ordering::Relaxed, guard);
            let next = cur.deref().next.load(Ordering::Relaxed, guard);
            if !next.is_null() {
                drop(next.into_owned());
            }
            drop(cur.into_owned());
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
