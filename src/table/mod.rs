//! The unsafe core: a lock-free open-addressing table of rows.
//!
//! # Layout
//! A table is a power-of-two array of slots, probed linearly from the key's
//! hash ([`slot::probe_seq`], the one sequence every caller walks). A slot is
//! one tagged pointer to a heap [`Entry`] holding the key, its hash and the
//! row's bucket word; entries and whole arrays go through crossbeam-epoch.
//! `slot.rs` encodes and decodes every slot and row state.
//!
//! # Row lifecycle
//! ```text
//! word 0 (fresh: starts from its floor) --reserve/refund--> tat (live)
//! tat <= now (full) --sweep kill / refund to full--> DEAD --> unlinked
//! ```
//! DEAD is entered only from a full bucket, after the key's floor was raised
//! to the row's own `tat`, and never left; a debit CAS expects a live word,
//! so no debit lands on a dead row. Lookups pass over DEAD rows as if they
//! were tombstones; whoever meets one on its key's walk unlinks it (the slot
//! becomes a tombstone) and retires it. An entry marked `Copying` cannot be
//! unlinked (the CAS expects it unmarked); a copier links a row into the
//! target marked too and unmarks it there only after closing its old slot,
//! so an unlink always removes an entry's last link. The copier unlinks a
//! row from the target if it finds it DEAD after moving it (`remove_dead`
//! and the copier each fence before they look, so one of them sees the
//! other).
//!
//! # One key, one live row
//! Within an array a key's live row is the first match on its probe
//! sequence, and slots before the first vacant one never become vacant
//! again, so every inserter of a key probes the same slots and claims its
//! first vacant one by CAS. Across a migration (`migrate.rs`) a key lives in
//! the old array until its entry is moved, and new rows go to the target
//! only after the old array's sequence was sealed.

use std::borrow::Borrow;
use std::mem::size_of;

use crossbeam_utils::{Backoff, CachePadded};

use crate::bucket::{Decision, Limits, Refund};
use crate::pace::Refunded;
use crate::sync::epoch::{self, Atomic, Guard, Shared};
use crate::sync::{cas_retry, fence, snooze, AtomicBool, AtomicUsize, Ordering};

pub(crate) mod cells;
mod clean;
mod floor;
mod migrate;
pub(crate) mod quota;
mod slot;
pub(crate) mod sweep;
pub(crate) mod words;

use floor::Floors;
#[cfg(feature = "internals")]
pub(crate) use slot::CALL_SLOTS as MIGRATION_CALL_SLOTS;
#[cfg(feature = "internals")]
pub(crate) use slot::CHUNK as MIGRATION_CHUNK;
use slot::{probe_seq, probe_seq_from, Array, Entry, Slot, State, CLAIMED, DEAD};
#[cfg(feature = "internals")]
pub(crate) use sweep::sweep_chunk;
#[cfg(test)]
pub(crate) use sweep::SWEEP_AT_ONCE;
pub(crate) use sweep::SWEEP_CHUNK;

/// Tag on a null `next` pointer: a migration target is being allocated.
const PENDING: usize = 1;
/// The smallest array the table uses.
pub(crate) const MIN_SLOTS: usize = 4;

/// Counts one more row in `len` unless `migrating()` (a SeqCst load of the
/// array's `next`) says the array the row goes to has begun migrating: the
/// handshake of both tables' inserts with `start_migration`. The row is
/// counted before it is linked, and the migration check comes after the
/// count (both SeqCst): a migration that sizes its target from `len` after
/// sealing `next` counts every row that can still be linked into the array.
pub(crate) fn count_unless_migrating(len: &AtomicUsize, migrating: impl Fn() -> bool) -> bool {
    if migrating() {
        return false;
    }
    len.fetch_add(1, Ordering::SeqCst);
    // Dekker with `start_migration` (seal `next`, fence, read `len`): at
    // least one side sees the other's write. The fence makes the argument
    // hold in loom too, which models SeqCst accesses as AcqRel.
    fence(Ordering::SeqCst);
    if migrating() {
        len.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    true
}

/// Hands an unlinked entry to the collector. Dropping the key runs user code:
/// a panicking `Drop` is caught so that it cannot unwind through the
/// collector (and into whichever thread happens to run the deferred free).
///
/// # Safety
/// `entry` came from `Box::into_raw`, is unreachable for new readers and is
/// retired exactly once.
unsafe fn retire_entry<K>(guard: &Guard, entry: *mut Entry<K>) {
    let ptr = entry as usize;
    // SAFETY: the caller's contract; the closure rebuilds the `Box` once,
    // after every guard that could see `entry` is gone.
    unsafe {
        guard.defer_unchecked(move || {
            let owned = Box::from_raw(ptr as *mut Entry<K>);
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(owned)));
        })
    };
}

/// Slot arrays of at least this many bytes are freed on a short-lived
/// thread: returning tens of MB to the kernel (munmap) takes milliseconds,
/// which no caller should pay for.
#[cfg(not(any(loom, miri)))]
const FREE_OFF_CALLER: usize = 1 << 20;

/// Large slot arrays whose free is running on a thread of its own.
#[cfg(not(any(loom, miri)))]
pub(crate) static FREES_IN_FLIGHT: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Hands an array unpublished from `current` to the collector, and flushes
/// the thread's garbage so that it is collected soon (a growing table retires
/// few things: its bag would otherwise hold every old array until it fills).
/// A large slot array is freed off the caller's path.
///
/// # Safety
/// `arr` was unpublished from `current` (unreachable for new readers), owns
/// no entry (every slot sealed or closed), and is retired exactly once.
unsafe fn retire_array<K>(guard: &Guard, arr: Shared<'_, Array<K>>) {
    let ptr = arr.as_raw() as usize;
    // SAFETY: the caller's contract; the closure rebuilds the `Box` (made by
    // `Owned::new`) once, after every guard that could see `arr` is gone.
    unsafe {
        guard.defer_unchecked(move || {
            let mut owned = Box::from_raw(ptr as *mut Array<K>);
            let slots = std::mem::take(&mut owned.slots);
            drop(owned);
            free_array(slots);
        })
    };
    // Not under loom: when garbage is collected is not what the models
    // check, and the extra collector steps would multiply their executions.
    // (Known-wrong variant `arrays_wait_for_a_full_bag`: no flush, so a
    // growing table, which retires little else, holds its old arrays until
    // its thread's bag fills.)
    #[cfg(not(loom))]
    if !cfg!(pace_mutant = "arrays_wait_for_a_full_bag") {
        guard.flush();
    }
}

/// Frees a retired array of slots or cells (atomics: nothing to drop): at
/// once if small, else on a new thread (or at once if no thread can be
/// started).
pub(crate) fn free_array<T>(slots: Box<[T]>) {
    debug_assert!(!std::mem::needs_drop::<T>());
    #[cfg(not(any(loom, miri)))]
    {
        let layout = std::alloc::Layout::for_value::<[T]>(&slots);
        if layout.size() >= FREE_OFF_CALLER {
            let p = Box::into_raw(slots) as *mut u8 as usize;
            FREES_IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
            let free = move || {
                discard_pages(p, layout.size());
                // SAFETY: `p` is the box's allocation, made by the global
                // allocator with `layout` (what `Box<[T]>` frees with), and
                // freed exactly once: here, or below if the thread never
                // started. `T` has no drop glue, so freeing without
                // dropping the elements loses nothing.
                unsafe { std::alloc::dealloc(p as *mut u8, layout) };
                FREES_IN_FLIGHT.fetch_sub(1, Ordering::Release);
            };
            // Deferred frees can run anywhere a guard collects, even in a
            // thread-local destructor at thread exit: a spawn that panics
            // there (or fails) falls back to freeing here.
            let spawned = std::panic::catch_unwind(move || {
                std::thread::Builder::new()
                    .name("pace-free".into())
                    .stack_size(64 * 1024)
                    .spawn(free)
                    .is_ok()
            });
            if !matches!(spawned, Ok(true)) {
                // The thread did not start and dropped `free` unrun (it
                // owns only integers): free here.
                // SAFETY: as above.
                unsafe { std::alloc::dealloc(p as *mut u8, layout) };
                FREES_IN_FLIGHT.fetch_sub(1, Ordering::Release);
            }
            return;
        }
    }
    drop(slots);
}

/// Gives the whole pages of the allocation `p..p + len`, which is about to
/// be freed and is read by nobody, back to the kernel 1 MiB at a time
/// (madvise DONTNEED). Each call holds the address space's lock only for
/// reading and only for its piece, so the free that follows has no pages
/// left to return and never holds it (for writing) for long; a munmap of
/// tens of MB holds it for milliseconds, stalling the page faults of every
/// other thread of the process.
#[cfg(not(any(loom, miri)))]
fn discard_pages(p: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const PIECE: usize = 1 << 20;
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(0);
        if !page.is_power_of_two() {
            return;
        }
        let mut at = p.next_multiple_of(page);
        let end = (p + len) & !(page - 1);
        while at < end {
            let n = PIECE.min(end - at);
            // SAFETY: `at..at + n` is whole pages inside the allocation,
            // which nobody reads or writes again before it is freed; DONTNEED
            // only replaces private anonymous pages with zero-fill-on-demand
            // ones (or, for file pages, never ours here). A failure leaves
            // the pages as they were, for the free to return.
            unsafe { libc::madvise(at as *mut libc::c_void, n, libc::MADV_DONTNEED) };
            at += n;
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, len);
}

/// Hands the entries a sweep chunk unlinked to the collector as one deferred
/// free (after taking them off `len`, which still counted them), and flushes
/// the thread's garbage so that it is collected soon: crossbeam-epoch frees
/// a bounded number of deferred items per collection, so one item per chunk
/// comes back far sooner than one per row.
///
/// # Safety
/// As for [`retire_entry`], for every pointer in `batch`.
unsafe fn retire_batch<K>(guard: &Guard, len: &AtomicUsize, batch: Vec<usize>) {
    if batch.is_empty() {
        return;
    }
    len.fetch_sub(batch.len(), Ordering::SeqCst);
    // SAFETY: the caller's contract, for each entry.
    unsafe {
        guard.defer_unchecked(move || {
            for ptr in batch {
                let owned = Box::from_raw(ptr as *mut Entry<K>);
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(owned)));
            }
        })
    };
    guard.flush();
}

/// A row its inserter linked with the word [`CLAIMED`] and has not yet
/// confirmed: dropping it withdraws the row (word DEAD, unlinked), also
/// when the key's `Eq` panics in [`Table::verify`]. Confirming forgets it.
struct Claimed<'a, K> {
    table: &'a Table<K>,
    slot: &'a Slot<K>,
    p: *mut Entry<K>,
    guard: &'a Guard,
}

impl<K> Drop for Claimed<'_, K> {
    fn drop(&mut self) {
        // Known-wrong variant: leave the row claimed when the key's `Eq`
        // panicked in the check.
        if cfg!(pace_mutant = "claimed_left_on_panic") && std::thread::panicking() {
            return;
        }
        // SAFETY: the inserter linked `p` under `guard`, which is still
        // pinned; the row never left the claimed state, so nobody else
        // unlinked or retired it.
        unsafe { &*self.p }.word.store(DEAD, Ordering::Release);
        self.table.remove_dead(self.slot, self.p, self.guard, None);
    }
}

/// What [`Table::verify`] decides for a just-linked (claimed) row.
enum Verdict<K> {
    /// The row becomes the key's row.
    Keep,
    /// Withdraw it and look again.
    Withdraw,
    /// Withdraw it, wait until this claimed row earlier in the key's
    /// sequence is confirmed or withdrawn, then look again.
    Await(*mut Entry<K>),
}

impl<K> Verdict<K> {
    fn keep_if(keep: bool) -> Self {
        if keep {
            Verdict::Keep
        } else {
            Verdict::Withdraw
        }
    }
}

/// Publishes a debit decided on `word`: one CAS from `word` to `tat`; the
/// word found instead if it changed.
#[cfg(not(pace_mutant = "check_then_debit"))]
#[inline]
fn publish<K>(e: &Entry<K>, word: u64, tat: u64) -> Result<(), u64> {
    e.word
        .compare_exchange_weak(word, tat, Ordering::AcqRel, Ordering::Acquire)
        .map(|_| ())
}

/// Known-wrong: decide on a load, then write blindly.
#[cfg(pace_mutant = "check_then_debit")]
#[inline]
fn publish<K>(e: &Entry<K>, _word: u64, tat: u64) -> Result<(), u64> {
    e.word.store(tat, Ordering::Release);
    Ok(())
}

/// Closes a full row (word `word`) before it is unlinked: one CAS to DEAD,
/// so no debit can land on it afterwards. False if the word changed first.
#[cfg(not(pace_mutant = "unlink_without_dead"))]
#[inline]
fn close_full<K>(e: &Entry<K>, word: u64) -> bool {
    e.word
        .compare_exchange(word, DEAD, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
}

/// Known-wrong: unlink a full row without closing its word, so a racing
/// debit can land on a row that is no longer reachable.
#[cfg(pace_mutant = "unlink_without_dead")]
#[inline]
fn close_full<K>(_e: &Entry<K>, _word: u64) -> bool {
    true
}

/// Whether an array's `next` says a migration has started.
#[inline]
fn is_migrating<K>(next: Shared<'_, Array<K>>) -> bool {
    !next.is_null() || next.tag() != 0
}

/// What a lookup may write on its way.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing (peek).
    Read,
    /// Unlink dead rows it meets in the current array (refund).
    Write,
    /// Also seal the vacant slot that ends the key's sequence in a migrating
    /// array, so no insert can link the key there afterwards (reserve).
    Insert,
}

/// Where a lookup ended.
enum Lookup<'g, K> {
    /// The key's row (not DEAD when found), in slot `idx` of `arr`.
    Row {
        e: &'g Entry<K>,
        arr: Shared<'g, Array<K>>,
        idx: usize,
    },
    /// No row: `idx` is the first vacant slot of the key's sequence in `arr`,
    /// an array that was not migrating when the slot was read, and `tomb` the
    /// first reusable tombstone before it (inserting lookups only).
    Vacant {
        arr: Shared<'g, Array<K>>,
        idx: usize,
        tomb: Option<usize>,
    },
    /// Every slot of `arr` was probed without a vacancy (cannot happen while
    /// claims respect `limit`; handled by migrating anyway).
    Full(Shared<'g, Array<K>>),
}

/// What [`Table::find`] read in the key's first slot of the current array
/// before handing the walk to [`Table::find_from`].
enum First<K> {
    /// The slot was probed and passed over; a reusable tombstone there
    /// (inserting lookups only).
    Passed(Option<usize>),
    /// The slot's state, read once and not yet acted on (it ends the key's
    /// sequence or seals the array).
    Loaded(State<K>),
}

/// What [`Table::reserve`] did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Admitted {
    /// The bucket's new `tat`: the end of this reservation's debit.
    pub(crate) tat: u64,
    /// The bucket's `tat` just before this debit (a fresh row's floor): what
    /// a refund restores.
    pub(crate) prev: u64,
    /// Whether this call created the row.
    pub(crate) created: bool,
}

enum Step<T> {
    Done(T),
    Retry,
}

/// A concurrent map from keys to bucket words.
pub(crate) struct Table<K> {
    /// The oldest array in use: the one migrating, if a migration runs.
    current: Atomic<Array<K>>,
    /// Rows: entries linked in the table's arrays (live or DEAD-not-yet-
    /// unlinked) plus insertions in flight.
    len: CachePadded<AtomicUsize>,
    min_slots: usize,
    /// The largest `tat` removed per stripe of keys: where fresh rows start.
    floors: Floors,
    /// A sweep pass found the table sparse while rows remained.
    shrink_wanted: AtomicBool,
    /// Migrations started (for tests and benchmarks).
    migrations: AtomicUsize,
    /// Slots of the chunks migrations have copied (for tests). A plain std
    /// atomic even under loom: a statistic, not part of the protocol. Padded:
    /// copiers add to it, and it must not share a line with `current`, which
    /// every call reads.
    copied_slots: CachePadded<std::sync::atomic::AtomicUsize>,
}

impl<K> Table<K> {
    /// [`try_new`](Table::try_new) for tests, whose `min_slots` always fits.
    #[cfg(test)]
    pub(crate) fn new(min_slots: usize) -> Table<K> {
        Table::try_new(min_slots).expect("min_slots fits an array")
    }

    /// A table that never shrinks below `min_slots` (rounded up to a power of
    /// two, at least [`MIN_SLOTS`]), or `None` if that is more slots than an
    /// array can have or the allocator gives.
    pub(crate) fn try_new(min_slots: usize) -> Option<Table<K>> {
        let min_slots = min_slots.max(MIN_SLOTS).checked_next_power_of_two()?;
        Some(Table {
            current: Atomic::new(Array::try_new(min_slots)?),
            len: CachePadded::new(AtomicUsize::new(0)),
            min_slots,
            floors: Floors::new(),
            shrink_wanted: AtomicBool::new(false),
            migrations: AtomicUsize::new(0),
            copied_slots: CachePadded::new(std::sync::atomic::AtomicUsize::new(0)),
        })
    }

    /// Where a fresh row of a key with this hash starts: the largest `tat`
    /// removed from its stripe (see `floor.rs`).
    #[inline]
    pub(crate) fn floor(&self, hash: u64) -> u64 {
        self.floors.get(hash)
    }

    /// The stripe whose floor a key with this hash shares (for models).
    #[cfg(feature = "internals")]
    pub(crate) fn floor_stripe(hash: u64) -> usize {
        Floors::stripe(hash)
    }

    /// Bytes held by the floors.
    pub(crate) fn floor_bytes(&self) -> usize {
        self.floors.bytes()
    }

    /// Migrations started since the table was made.
    #[cfg(feature = "internals")]
    pub(crate) fn migrations(&self) -> usize {
        self.migrations.load(Ordering::Relaxed)
    }

    /// Slots of the chunks migrations have copied since the table was made.
    #[cfg(feature = "internals")]
    pub(crate) fn copied_slots(&self) -> usize {
        self.copied_slots.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a migration of the current array is running.
    #[cfg(feature = "internals")]
    pub(crate) fn migrating(&self, guard: &Guard) -> bool {
        let (_, cur) = self.array(guard);
        is_migrating(cur.next.load(Ordering::Acquire, guard))
    }

    /// Rows in the table (exact when no operation is in flight).
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The current array and, while a migration runs, its target.
    fn arrays<'g>(&self, guard: &'g Guard) -> (&'g Array<K>, Option<&'g Array<K>>) {
        let (_, cur) = self.array(guard);
        let next = cur.next.load(Ordering::Acquire, guard);
        // SAFETY: a published target stays alive while the array that points
        // at it is reachable under `guard` (see `migrate.rs`).
        (cur, (!next.is_null()).then(|| unsafe { next.deref() }))
    }

    /// Slots of the array new rows go to (the target while migrating).
    pub(crate) fn slots(&self, guard: &Guard) -> usize {
        let (cur, next) = self.arrays(guard);
        next.unwrap_or(cur).slots.len()
    }

    /// Bytes held by the slot arrays in use (both while migrating), not
    /// counting entries.
    pub(crate) fn array_bytes(&self, guard: &Guard) -> usize {
        let (cur, next) = self.arrays(guard);
        let bytes = |a: &Array<K>| size_of::<Array<K>>() + a.slots.len() * size_of::<Slot<K>>();
        bytes(cur) + next.map_or(0, bytes)
    }

    /// Bytes of one entry allocation (key, hash and word), not counting what
    /// the key itself owns.
    pub(crate) fn entry_bytes() -> usize {
        size_of::<Entry<K>>()
    }

    #[inline]
    fn array<'g>(&self, guard: &'g Guard) -> (Shared<'g, Array<K>>, &'g Array<K>) {
        let ptr = self.current.load(Ordering::Acquire, guard);
        // SAFETY: `current` is never null (set in `new`, replaced only by a
        // published target in `finish`), and an array unpublished from
        // `current` is retired with `defer_destroy`, so it stays allocated
        // while `guard`, pinned before this load, is alive.
        (ptr, unsafe { ptr.deref() })
    }

    /// The target of a migrating array, once allocated.
    fn next_of<'g>(&self, arr: &'g Array<K>, guard: &'g Guard) -> Shared<'g, Array<K>> {
        let backoff = Backoff::new();
        loop {
            let next = arr.next.load(Ordering::Acquire, guard);
            if !next.is_null() {
                return next;
            }
            snooze(&backoff); // the sealer is allocating the target (O(1))
        }
    }

    /// Looks `key` up from the current array, following migration targets.
    ///
    /// The key's first slot in the current array is probed here, inline: a
    /// row found there returns at once. Anything else goes on in
    /// [`find_from`](Table::find_from) with what this probe read, so the
    /// walk reads every slot and word exactly as one loop would.
    #[inline(always)]
    fn find<'g, Q>(&self, hash: u64, key: &Q, mode: Mode, guard: &'g Guard) -> Lookup<'g, K>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        match self.find_first(hash, key, mode, guard) {
            Ok((e, arr, idx)) => Lookup::Row { e, arr, idx },
            Err((arr_ptr, rest)) => self.find_from(hash, key, mode, guard, arr_ptr, rest),
        }
    }

    /// [`find`](Table::find)'s probe of the key's first slot in the current
    /// array: the key's row found there (with its array and slot), or the
    /// array and what became of the slot, for [`find_from`](Table::find_from).
    #[allow(clippy::type_complexity)] // find's two halves, private
    #[inline(always)]
    fn find_first<'g, Q>(
        &self,
        hash: u64,
        key: &Q,
        mode: Mode,
        guard: &'g Guard,
    ) -> Result<(&'g Entry<K>, Shared<'g, Array<K>>, usize), (Shared<'g, Array<K>>, First<K>)>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let (arr_ptr, arr) = self.array(guard);
        let idx = hash as usize & arr.mask();
        let slot = &arr.slots[idx];
        let rest = match slot.load_for(hash) {
            State::Row(p) | State::Copying(p) => {
                if let Some(e) = self.key_row(slot, p, hash, key, mode, guard) {
                    return Ok((e, arr_ptr, idx));
                }
                First::Passed(None)
            }
            State::Tombstone => First::Passed((mode == Mode::Insert).then_some(idx)),
            State::Closed | State::Other => First::Passed(None),
            s @ (State::Vacant | State::Fence | State::Sealed) => First::Loaded(s),
        };
        Err((arr_ptr, rest))
    }

    /// Whether the row `p`, read from `slot` on the walk of the key with
    /// `hash`, is that key's row: `Some` if it is and it is neither claimed
    /// (its inserter checks the sequence, see `verify`: look past it) nor
    /// DEAD (unlinked on the way unless `mode` is `Read`).
    #[inline(always)]
    fn key_row<'g, Q>(
        &self,
        slot: &Slot<K>,
        p: *mut Entry<K>,
        hash: u64,
        key: &Q,
        mode: Mode,
        guard: &'g Guard,
    ) -> Option<&'g Entry<K>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        // SAFETY: a row pointer read under `guard` from an array reached
        // under `guard` is retired only after its unlink from the current
        // array, which happens after `guard` was pinned.
        let e = unsafe { &*p };
        if e.hash == hash && e.key.borrow() == key {
            match e.word.load(Ordering::Acquire) {
                CLAIMED => {}
                DEAD => {
                    if mode != Mode::Read {
                        self.unlink(slot, p, guard);
                    }
                }
                _ => return Some(e),
            }
        }
        None
    }

    /// The walk of [`find`](Table::find) from `arr_ptr`, after `first` says
    /// what became of the key's first slot there.
    #[inline(never)]
    fn find_from<'g, Q>(
        &self,
        hash: u64,
        key: &Q,
        mode: Mode,
        guard: &'g Guard,
        mut arr_ptr: Shared<'g, Array<K>>,
        first: First<K>,
    ) -> Lookup<'g, K>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        // Only for the first array walked: its slots already probed, the
        // first reusable tombstone among them, and the state read from the
        // next slot (then not read again).
        let (mut skip, mut first_tomb, mut loaded) = match first {
            First::Passed(tomb) => (1, tomb, None),
            First::Loaded(s) => (0, None, Some(s)),
        };
        'arrays: loop {
            // SAFETY: `arr_ptr` is `current` or a target reached from it
            // under `guard` (see `array` and `arrays`).
            let arr = unsafe { arr_ptr.deref() };
            let mut tomb = first_tomb.take();
            for idx in probe_seq_from(hash, arr.mask(), std::mem::take(&mut skip)) {
                let slot = &arr.slots[idx];
                loop {
                    let state = match loaded.take() {
                        Some(s) => s,
                        None => slot.load_for(hash),
                    };
                    match state {
                        State::Tombstone => {
                            if mode == Mode::Insert && tomb.is_none() {
                                tomb = Some(idx);
                            }
                            break;
                        }
                        State::Closed | State::Other => break,
                        State::Sealed => {
                            arr_ptr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        s @ (State::Vacant | State::Fence) => {
                            if !is_migrating(arr.next.load(Ordering::SeqCst, guard)) {
                                return Lookup::Vacant {
                                    arr: arr_ptr,
                                    idx,
                                    tomb,
                                };
                            }
                            // Known-wrong variant (with `verify` off, the
                            // two guards of an insert racing a migration):
                            // go on without sealing, so an insert in flight
                            // can still link the key here.
                            let seal = mode == Mode::Insert
                                && !cfg!(pace_mutant = "insert_into_migrating");
                            if seal && !slot.seal() {
                                if matches!(s, State::Fence) {
                                    snooze(&Backoff::new()); // a cleaner's moment
                                }
                                continue; // a row was linked here: read it
                            }
                            arr_ptr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        State::Row(p) | State::Copying(p) => {
                            if let Some(e) = self.key_row(slot, p, hash, key, mode, guard) {
                                return Lookup::Row {
                                    e,
                                    arr: arr_ptr,
                                    idx,
                                };
                            }
                            break;
                        }
                    }
                }
            }
            if !is_migrating(arr.next.load(Ordering::Acquire, guard)) {
                return Lookup::Full(arr_ptr);
            }
            arr_ptr = self.next_of(arr, guard);
        }
    }

    /// Debits `n` tokens from `key`'s bucket at `now`, creating the row if the
    /// key is absent (an absent row starts from its floor). A denial writes
    /// nothing and creates nothing.
    ///
    /// `reread` reads the clock again. It is called only when a row starts
    /// from a floor later than `now`: the caller's reading is older than the
    /// removal that raised the floor (the thread was pre-empted between its
    /// reading and here), so the decision is taken on a fresh reading rather
    /// than charging the delay to a fresh key. Models pass `|| now`.
    #[allow(clippy::too_many_arguments)] // the rule's inputs, each used once
    #[inline(always)]
    pub(crate) fn reserve<Q>(
        &self,
        limits: &Limits,
        hash: u64,
        key: &Q,
        n: u64,
        mut now: u64,
        reread: &dyn Fn() -> u64,
        guard: &Guard,
    ) -> Result<Admitted, Decision>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq + ToOwned<Owned = K>,
    {
        self.shrink_pending(guard);
        self.help_if_migrating(guard);
        // `find`, with only the row carried out of its two halves.
        let row = match self.find_first(hash, key, Mode::Insert, guard) {
            Ok((e, ..)) => Some(e),
            Err((arr_ptr, rest)) => {
                match self.find_from(hash, key, Mode::Insert, guard, arr_ptr, rest) {
                    Lookup::Row { e, .. } => Some(e),
                    Lookup::Vacant { .. } | Lookup::Full(_) => None,
                }
            }
        };
        if let Some(e) = row {
            if let Step::Done(r) = self.debit(e, limits, hash, n, &mut now, reread) {
                return r.map(|(tat, prev)| Admitted {
                    tat,
                    prev,
                    created: false,
                });
            }
        }
        self.reserve_slow(limits, hash, key, n, now, reread, guard)
    }

    /// A migration is running: copy a share of it (see `help`).
    #[inline]
    fn help_if_migrating(&self, guard: &Guard) {
        let (_, cur) = self.array(guard);
        if !cur.next.load(Ordering::Relaxed, guard).is_null() {
            self.help(guard);
        }
    }

    /// Insert, or a retry after a row died under the debit.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn reserve_slow<Q>(
        &self,
        limits: &Limits,
        hash: u64,
        key: &Q,
        n: u64,
        mut now: u64,
        reread: &dyn Fn() -> u64,
        guard: &Guard,
    ) -> Result<Admitted, Decision>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq + ToOwned<Owned = K>,
    {
        let mut fresh: Option<Box<Entry<K>>> = None;
        let backoff = Backoff::new();
        loop {
            match self.find(hash, key, Mode::Insert, guard) {
                Lookup::Row { e, .. } => {
                    if let Step::Done(r) = self.debit(e, limits, hash, n, &mut now, reread) {
                        return r.map(|(tat, prev)| Admitted {
                            tat,
                            prev,
                            created: false,
                        });
                    }
                }
                Lookup::Full(arr_ptr) => {
                    if !self.help(guard) {
                        self.start_migration(arr_ptr, guard);
                    }
                }
                Lookup::Vacant {
                    arr: arr_ptr,
                    idx,
                    tomb,
                } => {
                    // An absent row starts from its floor: decide before
                    // creating anything.
                    let floor = self.floors.get(hash);
                    if floor > now {
                        now = now.max(reread());
                    }
                    if let d @ (Decision::Wait(_) | Decision::Never | Decision::TimeExhausted) =
                        limits.reserve(floor, now, n)
                    {
                        return Err(d);
                    }
                    // Copy the key before counting the row: a panicking
                    // `Clone` must leave `len` and `used` as they were.
                    let entry = match fresh.take() {
                        Some(e) => e,
                        None => Box::new(Entry {
                            word: crate::sync::AtomicU64::new(CLAIMED),
                            hash,
                            key: key.to_owned(),
                        }),
                    };
                    // SAFETY: as in `find`: `arr_ptr` was reached under `guard`.
                    let arr = unsafe { arr_ptr.deref() };
                    let p = Box::into_raw(entry);
                    let Some(at) = self.link_new(arr_ptr, idx, tomb, p, hash, guard) else {
                        // SAFETY: the link failed, so `p` is still ours alone.
                        fresh = Some(unsafe { Box::from_raw(p) });
                        // The slot was taken, fenced by a cleaner, or the
                        // array began migrating: look again.
                        snooze(&backoff);
                        continue;
                    };
                    // SAFETY: we just linked `p`; it is retired only after
                    // an unlink, which happens after our `guard` pinned.
                    let e = unsafe { &*p };
                    // Dekker with every other inserter of the key: each links
                    // its row, fences, then reads the whole sequence, so of
                    // two rows linked concurrently at least one inserter sees
                    // the other's (see `verify`).
                    fence(Ordering::SeqCst);
                    // `verify` runs the key's `Eq`: if it panics, the claimed
                    // row is withdrawn, or every later inserter of the key
                    // would wait for it.
                    let claimed = Claimed {
                        table: self,
                        slot: &arr.slots[at],
                        p,
                        guard,
                    };
                    let verdict = self.verify(hash, key, p, arr_ptr, at, guard);
                    if !matches!(verdict, Verdict::Keep) {
                        // Another row of the key exists or may win: withdraw
                        // ours (it never held debt) and look again.
                        drop(claimed);
                        // Let the row that won be confirmed before looking
                        // again (it is skipped while it is claimed): a row
                        // linked again at once could keep its inserter
                        // waiting for ever newer claimed rows.
                        snooze(&backoff);
                        if let Verdict::Await(earlier) = verdict {
                            // SAFETY: `earlier` was read from a slot under
                            // `guard`, which is still pinned: it is retired
                            // only after an unlink that follows our pin.
                            let earlier = unsafe { &*earlier };
                            while earlier.word.load(Ordering::Acquire) == CLAIMED {
                                snooze(&backoff);
                            }
                        }
                        continue;
                    }
                    std::mem::forget(claimed);
                    e.word.store(0, Ordering::Release);
                    if let Step::Done(r) = self.debit(e, limits, hash, n, &mut now, reread) {
                        return r.map(|(tat, prev)| Admitted {
                            tat,
                            prev,
                            created: true,
                        });
                    }
                }
            }
        }
    }

    /// Links the new row `p` (word [`CLAIMED`]) into `arr`: into the first
    /// reusable tombstone `tomb` of its key's sequence if there is one, else
    /// into the first vacant slot `idx`. The slot it took, or `None` (counts
    /// restored) if the slot was taken first or `arr` began migrating.
    fn link_new(
        &self,
        arr_ptr: Shared<'_, Array<K>>,
        idx: usize,
        tomb: Option<usize>,
        p: *mut Entry<K>,
        hash: u64,
        guard: &Guard,
    ) -> Option<usize> {
        // SAFETY: as in `find`.
        let arr = unsafe { arr_ptr.deref() };
        match tomb {
            Some(at) if !cfg!(pace_mutant = "no_tombstone_reuse") => {
                // A reused tombstone is already counted in `used`.
                if !self.count_row(arr, guard) {
                    return None;
                }
                if arr.slots[at].reuse(p, hash) {
                    return Some(at);
                }
                self.len.fetch_sub(1, Ordering::SeqCst);
                None
            }
            _ => {
                if !self.claim_slot(arr_ptr, guard) {
                    return None;
                }
                if arr.slots[idx].link(p, hash) {
                    return Some(idx);
                }
                arr.used.fetch_sub(1, Ordering::Relaxed);
                self.len.fetch_sub(1, Ordering::SeqCst);
                None
            }
        }
    }

    /// Checks, after linking the new row `me` into slot `at` of `my_arr`,
    /// that no other row of its key can be live beside it: true if `me` may
    /// become the key's row, false if its inserter must withdraw it.
    ///
    /// The walk reads the key's whole sequence from the current array to the
    /// end of `me`'s sequence in `my_arr`. A live row of the key wins. Of two
    /// claimed rows in one array, the one earlier in the sequence wins (the
    /// later one waits for it, and withdraws if the earlier is confirmed);
    /// a claimed row in an older array is waited for (its inserter withdraws
    /// it: its array is migrating). `me` is withdrawn if its own array begins
    /// migrating, so an inserter waits only while its array is the newest,
    /// and every wait is for a row earlier in the same array's sequence or
    /// in an older array: no inserters wait for each other in a cycle.
    fn verify<Q>(
        &self,
        hash: u64,
        key: &Q,
        me: *mut Entry<K>,
        my_arr: Shared<'_, Array<K>>,
        at: usize,
        guard: &Guard,
    ) -> Verdict<K>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        // Known-wrong variants: trust the lookup that chose the slot (with
        // `insert_into_migrating`, the lookup does not seal either).
        if cfg!(any(
            pace_mutant = "reuse_unverified",
            pace_mutant = "insert_into_migrating"
        )) {
            return Verdict::Keep;
        }
        // SAFETY: as in `find`.
        let mine_arr = unsafe { my_arr.deref() };
        let my_pos = at.wrapping_sub(hash as usize) & mine_arr.mask();
        let still_newest = || !is_migrating(mine_arr.next.load(Ordering::SeqCst, guard));
        let backoff = Backoff::new();
        let mut seen_me = false;
        let (mut arr_ptr, _) = self.array(guard);
        'arrays: loop {
            // SAFETY: as in `find`.
            let arr = unsafe { arr_ptr.deref() };
            let mine = arr_ptr == my_arr;
            for idx in probe_seq(hash, arr.mask()) {
                let slot = &arr.slots[idx];
                loop {
                    let p = match slot.load_for(hash) {
                        State::Tombstone | State::Closed | State::Other => break,
                        // The sequence ends: `me` must lie on it (a cleaner
                        // may have vacated a slot before it since the
                        // lookup that chose the slot), and the array must
                        // still be the newest.
                        State::Vacant | State::Fence | State::Sealed if mine => {
                            return Verdict::keep_if(seen_me && still_newest())
                        }
                        State::Vacant | State::Fence | State::Sealed => {
                            if !is_migrating(arr.next.load(Ordering::SeqCst, guard)) {
                                return Verdict::Withdraw; // `my_arr` is gone: it migrated
                            }
                            arr_ptr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        State::Copying(p) if p == me => return Verdict::Withdraw,
                        State::Row(p) | State::Copying(p) => p,
                    };
                    if p == me {
                        seen_me = mine;
                        break;
                    }
                    // SAFETY: as in `find`.
                    let e = unsafe { &*p };
                    if e.hash != hash || e.key.borrow() != key {
                        break;
                    }
                    match e.word.load(Ordering::Acquire) {
                        DEAD => break,
                        CLAIMED => {
                            let pos = idx.wrapping_sub(hash as usize) & arr.mask();
                            if mine && pos < my_pos {
                                return Verdict::Await(p);
                            }
                            if !still_newest() {
                                return Verdict::Withdraw;
                            }
                            snooze(&backoff); // its inserter is deciding
                        }
                        _ => return Verdict::Withdraw, // the key's live row
                    }
                }
            }
            // Every slot probed without a vacancy.
            if mine {
                return Verdict::keep_if(seen_me && still_newest());
            }
            if !is_migrating(arr.next.load(Ordering::SeqCst, guard)) {
                return Verdict::Withdraw;
            }
            arr_ptr = self.next_of(arr, guard);
        }
    }

    /// Counts one more row in `len` unless `arr` is migrating: the
    /// handshake with `start_migration` for every link. For a reused
    /// tombstone (already in `used`) it is the whole claim: the copier
    /// closes every tombstone it passes, so a reuse either lands before the
    /// copier reads the slot (and the row is copied) or fails.
    fn count_row(&self, arr: &Array<K>, guard: &Guard) -> bool {
        count_unless_migrating(&self.len, || {
            is_migrating(arr.next.load(Ordering::SeqCst, guard))
        })
    }

    /// Counts one more row and one more used slot in `arr`, unless `arr` is
    /// migrating or at its limit (then helps or starts the migration, and
    /// says no).
    fn claim_slot(&self, arr_ptr: Shared<'_, Array<K>>, guard: &Guard) -> bool {
        // SAFETY: as in `find`.
        let arr = unsafe { arr_ptr.deref() };
        if !self.count_row(arr, guard) {
            return false;
        }
        // `limit` before `used`: a copier raises `limit` only after adding
        // its copies to `used` (see `copy_chunk`), so the room seen here
        // never counts a copy that `used` does not.
        let limit = arr.limit.load(Ordering::Acquire);
        if arr.used.fetch_add(1, Ordering::Relaxed) >= limit {
            arr.used.fetch_sub(1, Ordering::Relaxed);
            self.len.fetch_sub(1, Ordering::SeqCst);
            // Known-wrong variant: a target starts its own migration while
            // its source is still being copied into it.
            if self.array(guard).0 == arr_ptr || cfg!(pace_mutant = "target_migrates_early") {
                // Mostly tombstones: clean a chunk in place and claim again.
                if !self.clean_some(arr_ptr, arr, guard) {
                    self.start_migration(arr_ptr, guard);
                }
            } else if !self.help(guard) {
                // A target at its limit before its source is copied: the
                // remaining chunks are with other copiers.
                snooze(&Backoff::new());
            }
            return false;
        }
        true
    }

    /// The single CAS loop that debits a row. A row never debited (word 0)
    /// starts from its floor. Returns the new `tat` and the one it replaced.
    #[inline]
    fn debit(
        &self,
        e: &Entry<K>,
        limits: &Limits,
        hash: u64,
        n: u64,
        now: &mut u64,
        reread: &dyn Fn() -> u64,
    ) -> Step<Result<(u64, u64), Decision>> {
        let backoff = Backoff::new();
        let mut word = e.word.load(Ordering::Acquire);
        loop {
            debug_assert_ne!(word, CLAIMED, "lookups never return a claimed row");
            if word == DEAD {
                return Step::Retry;
            }
            // The floor is read after the row was found linked (its word was
            // loaded after the slot), hence after any removal of an earlier
            // row of this key raised it.
            let prev = if word == 0 {
                let (floor, at) = self.fresh_start(hash, *now, reread);
                *now = at;
                floor
            } else {
                word
            };
            match limits.reserve(prev, *now, n) {
                Decision::Admit(tat) => match publish(e, word, tat) {
                    Ok(()) => return Step::Done(Ok((tat, prev))),
                    Err(actual) => {
                        word = actual;
                        cas_retry(&backoff);
                    }
                },
                denied => return Step::Done(Err(denied)),
            }
        }
    }

    /// Where a row never debited starts, and when: its floor, and `now`
    /// read again if the floor is later (see [`reserve`](Table::reserve)).
    /// Out of line: only a just-created row's first debit gets here.
    #[cold]
    #[inline(never)]
    fn fresh_start(&self, hash: u64, now: u64, reread: &dyn Fn() -> u64) -> (u64, u64) {
        let floor = self.floors.get(hash);
        if floor > now {
            return (floor, now.max(reread()));
        }
        (floor, now)
    }

    /// Undoes a reservation (`n` tokens that moved `key`'s row from `prev` to
    /// `own_tat`) if the row still ends at `own_tat` (see `Limits::refund`).
    /// An absent or dead row is full already: nothing is created or
    /// resurrected. A refund that makes the row full raises its floor to
    /// `prev` and removes it.
    #[allow(clippy::too_many_arguments)] // the rule's inputs, each used once
    pub(crate) fn refund<Q>(
        &self,
        limits: &Limits,
        hash: u64,
        key: &Q,
        n: u64,
        own_tat: u64,
        prev: u64,
        now: u64,
        guard: &Guard,
    ) -> Refunded
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        self.help_if_migrating(guard);
        let (e, arr_ptr, idx) = match self.find(hash, key, Mode::Write, guard) {
            Lookup::Row { e, arr, idx } => (e, arr, idx),
            Lookup::Vacant { .. } | Lookup::Full(_) => return Refunded::Refilled,
        };
        let backoff = Backoff::new();
        let mut word = e.word.load(Ordering::Acquire);
        loop {
            if word == DEAD {
                return Refunded::Refilled;
            }
            let (target, full) = match limits.refund(word, now, n, own_tat, prev) {
                Refund::Unchanged => return Refunded::Superseded,
                Refund::Set(tat) => (tat, false),
                Refund::Full => {
                    // The row's last state is `prev`: whoever creates the key
                    // again starts from at least that.
                    self.floors.raise(hash, prev);
                    (DEAD, true)
                }
            };
            match e
                .word
                .compare_exchange_weak(word, target, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if full {
                        // SAFETY: as in `find`.
                        let arr = unsafe { arr_ptr.deref() };
                        let p = e as *const Entry<K> as *mut Entry<K>;
                        self.remove_dead(&arr.slots[idx], p, guard, None);
                        self.clean_after(arr_ptr, idx, guard);
                        self.shrink_pending(guard);
                        return Refunded::Removed;
                    }
                    return Refunded::Restored;
                }
                Err(actual) => {
                    word = actual;
                    cas_retry(&backoff);
                }
            }
        }
    }

    /// The `tat` of `key`'s row, if it has one. A pure load.
    pub(crate) fn peek<Q>(&self, hash: u64, key: &Q, guard: &Guard) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        match self.find(hash, key, Mode::Read, guard) {
            Lookup::Row { e, .. } => {
                let word = e.word.load(Ordering::Acquire);
                (word != DEAD).then_some(word)
            }
            Lookup::Vacant { .. } | Lookup::Full(_) => None,
        }
    }

    /// Moves a full row (`word <= now`) to DEAD and unlinks it, after raising
    /// its key's floor to `word`. False if the word changed first.
    fn kill(
        &self,
        slot: &Slot<K>,
        p: *mut Entry<K>,
        word: u64,
        guard: &Guard,
        batch: &mut Vec<usize>,
    ) -> bool {
        // SAFETY: the caller read `p` from `slot` under `guard` (see `find`).
        let e = unsafe { &*p };
        self.floors.raise(e.hash, word);
        if close_full(e, word) {
            self.remove_dead(slot, p, guard, Some(batch));
            true
        } else {
            false
        }
    }

    /// Unlinks the row `p`, which this caller made DEAD and found in `slot`,
    /// wherever it is now: in `slot`, or in a migration target it was moved
    /// to. If a copier holds it marked, the copier unlinks it.
    fn remove_dead(
        &self,
        slot: &Slot<K>,
        p: *mut Entry<K>,
        guard: &Guard,
        mut batch: Option<&mut Vec<usize>>,
    ) -> bool {
        if self.unlink_into(slot, p, guard, batch.as_deref_mut()) {
            return true;
        }
        // Dekker with the copier (`moved`, fence, read the word): if the
        // copier did not see our DEAD, we see its move.
        fence(Ordering::SeqCst);
        if let State::Copying(q) = slot.load() {
            if q == p {
                return false; // its copier sees DEAD after moving it
            }
        }
        // Known-wrong variant: trust that nobody moved the row.
        if cfg!(pace_mutant = "no_unlink_walk") {
            return false;
        }
        // SAFETY: the caller holds `p` under `guard` (see `find`).
        let hash = unsafe { &*p }.hash;
        self.unlink_moved(hash, p, guard, batch)
    }

    /// Follows `p` (by its hash) through the arrays and unlinks it where it
    /// is linked unmarked.
    fn unlink_moved(
        &self,
        hash: u64,
        p: *mut Entry<K>,
        guard: &Guard,
        batch: Option<&mut Vec<usize>>,
    ) -> bool {
        let (mut arr_ptr, _) = self.array(guard);
        loop {
            // SAFETY: as in `find`.
            let arr = unsafe { arr_ptr.deref() };
            for idx in probe_seq(hash, arr.mask()) {
                let slot = &arr.slots[idx];
                match slot.load() {
                    State::Row(q) if q == p => return self.unlink_into(slot, p, guard, batch),
                    State::Copying(q) if q == p => return false,
                    State::Vacant | State::Fence | State::Sealed => break,
                    _ => {}
                }
            }
            if !is_migrating(arr.next.load(Ordering::Acquire, guard)) {
                return false;
            }
            arr_ptr = self.next_of(arr, guard);
        }
    }

    /// Unlinks the DEAD row `p` from `slot` and retires it, if the slot still
    /// holds `p` unmarked. True for the one caller that did it.
    ///
    /// Callers found `p` in `slot` on its key's walk, or by sweeping the
    /// current array, or (the copier) linked it there after moving it out
    /// of the old array. An entry is linked unmarked only where no other
    /// slot links it (a copy is unmarked after its old slot is closed), so
    /// the unlink removes its last link.
    pub(super) fn unlink(&self, slot: &Slot<K>, p: *mut Entry<K>, guard: &Guard) -> bool {
        self.unlink_into(slot, p, guard, None)
    }

    /// [`unlink`](Table::unlink), handing the entry to `batch` (retired as
    /// one deferred free by [`retire_batch`]) instead of one deferred free.
    pub(super) fn unlink_into(
        &self,
        slot: &Slot<K>,
        p: *mut Entry<K>,
        guard: &Guard,
        batch: Option<&mut Vec<usize>>,
    ) -> bool {
        // SAFETY: every caller read `p` from a slot under `guard`; it is
        // retired only after an unlink, deferred past `guard`.
        let hash = unsafe { &*p }.hash;
        if slot.unlink(p, hash) {
            #[cfg(all(test, not(loom)))]
            self.assert_linked_nowhere(hash, p, guard);
            if let Some(batch) = batch {
                // `len` drops by the batch's length when it is retired: until
                // then it counts this row too, which only overstates the rows
                // a migration sizes its target for. One allocation holds a
                // window's rows.
                if batch.capacity() == 0 {
                    batch.reserve_exact(SWEEP_CHUNK);
                }
                batch.push(p as usize);
                return true;
            }
            self.len.fetch_sub(1, Ordering::SeqCst);
            // SAFETY: `p` was linked only in this slot (the CAS expected it
            // unmarked, and a copier unmarks a copy only after closing its
            // old slot). No new reader can reach it; readers that already did
            // are pinned, so destruction is deferred past them. We won the
            // CAS: retired exactly once.
            unsafe { retire_entry(guard, p) };
            true
        } else {
            false
        }
    }
}

#[cfg(all(test, not(loom)))]
impl<K> Table<K> {
    /// Panics if `p`, just unlinked (and about to be retired), is still
    /// linked on its sequence in the current array or its target: a reader
    /// that pins after the retirement could reach it there.
    fn assert_linked_nowhere(&self, hash: u64, p: *mut Entry<K>, guard: &Guard) {
        let (cur, next) = self.arrays(guard);
        for arr in std::iter::once(cur).chain(next) {
            for idx in probe_seq(hash, arr.mask()) {
                match arr.slots[idx].load() {
                    State::Row(q) | State::Copying(q) if q == p => panic!(
                        "an entry unlinked for retirement is still linked in slot {idx} of a {}-slot array",
                        arr.slots.len()
                    ),
                    State::Vacant | State::Sealed => break,
                    _ => {}
                }
            }
        }
    }
}

impl<K: Clone> Table<K> {
    /// Keys of the rows linked in the table and not DEAD, for invariant
    /// checks when no operation is in flight.
    #[cfg(feature = "internals")]
    pub(crate) fn live_keys(&self, guard: &Guard) -> Vec<K> {
        let (cur, next) = self.arrays(guard);
        std::iter::once(cur)
            .chain(next)
            .flat_map(|arr| arr.slots.iter())
            .filter_map(|slot| match slot.load() {
                State::Row(p) | State::Copying(p) => {
                    // SAFETY: as in `find`.
                    let e = unsafe { &*p };
                    let word = e.word.load(Ordering::Acquire);
                    (word != DEAD && word != CLAIMED).then(|| e.key.clone())
                }
                _ => None,
            })
            .collect()
    }
}

impl<K> Drop for Table<K> {
    fn drop(&mut self) {
        // SAFETY: `&mut self` means no other thread holds a reference into
        // the table, so no guard protects anything we free here. Every entry
        // is linked in exactly one slot of the current array or of its
        // target (a copy in progress cannot be: copiers finish their row
        // before returning), and owned by it; unlinked entries and
        // unpublished arrays were handed to the collector already.
        unsafe {
            let guard = epoch::unprotected();
            let cur = self.current.load(Ordering::Relaxed, guard);
            let next = cur.deref().next.load(Ordering::Relaxed, guard);
            for arr in [cur, next] {
                if arr.is_null() {
                    continue;
                }
                for slot in arr.deref().slots.iter() {
                    if let Some(p) = slot.entry_unsync() {
                        // A panicking key `Drop` must not leak the other rows.
                        let owned = Box::from_raw(p);
                        let _ =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(owned)));
                    }
                }
                drop(arr.into_owned());
            }
        }
    }
}
