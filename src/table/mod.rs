//! The unsafe core: a lock-free open-addressing table of bucket words.
//!
//! # Layout
//! A table is a power-of-two array of [`Slot`]s, probed linearly from the
//! key's hash. A slot holds the bucket word *inline* (so a reserve never
//! allocates) and an atomic pointer to a heap [`Entry`] with the key and its
//! hash. Only entries and whole arrays go through crossbeam-epoch.
//!
//! # Slot lifecycle (one array)
//! The key pointer of a slot moves only forward:
//!
//! ```text
//! VACANT (null) --insert--> ENTRY --unlink--> TOMBSTONE
//!       \--migration--> SEALED
//! ```
//!
//! A slot is never reused within one array, so a key lives in at most one
//! slot of an array: every inserter of a key probes the same sequence and
//! claims its first vacant slot, and slots before it stay non-vacant forever.
//! Tombstones are cleared by migrating to a fresh array (same, larger or
//! smaller), which is also how the table shrinks.
//!
//! The bucket word of a slot with an entry:
//!
//! ```text
//! tat (live) --reserve/refund--> tat' (live)
//! tat <= now (full) --sweep / refund--> DEAD --> key unlinked
//! tat (live) --migration--> tat | FROZEN (copied to the next array)
//! ```
//!
//! DEAD is entered only from a full bucket and never left; FROZEN is never
//! left either. Anyone who meets DEAD helps unlink and looks the key up again;
//! anyone who meets FROZEN or SEALED helps the migration and retries in the
//! next array. Because the CAS that debits a row expects a live word, no debit
//! can land on a dead or frozen row.

use std::borrow::Borrow;
use std::mem::size_of;

use crossbeam_utils::{Backoff, CachePadded};

use crate::bucket::{is_live, Decision, Limits, Refund, DEAD, FROZEN};
use crate::sync::epoch::{self, Atomic, Guard, Owned, Shared};
use crate::sync::{cas_retry, snooze, AtomicU64, AtomicUsize, Ordering};

mod floor;
use floor::Floors;

/// Tag on a null key pointer: the slot held an entry that was unlinked.
const TOMBSTONE: usize = 1;
/// Tag on a null key pointer: the slot was vacant when a migration closed it.
const SEALED: usize = 2;
/// Tag on a null `next` pointer: a migration target is being allocated.
const PENDING: usize = 1;
/// Slots copied per migration chunk (the unit of cooperative copying).
const CHUNK: usize = 256;
/// The smallest array the table uses.
pub(crate) const MIN_SLOTS: usize = 4;
/// Sweep passes over larger arrays run in chunks of this many slots, one
/// chunk per caller; smaller arrays are swept in one go.
pub(crate) const SWEEP_CHUNK: usize = 4096;
/// `sweep_next` when no pass is running. Far above any array length, and far
/// below `usize::MAX`, so that late `fetch_add`s cannot wrap it.
const SWEEP_IDLE: usize = usize::MAX / 2;

/// A key and its hash, published by pointer.
pub(crate) struct Entry<K> {
    hash: u64,
    key: K,
}

struct Slot<K> {
    key: Atomic<Entry<K>>,
    state: AtomicU64,
}

struct Array<K> {
    slots: Box<[Slot<K>]>,
    /// Key slots claimed in this array (entries and tombstones) plus claims
    /// in flight. Bounded by `grow_at` so that vacant slots always remain.
    used: CachePadded<AtomicUsize>,
    /// The migration target: null, null tagged PENDING, or the next array.
    next: Atomic<Array<K>>,
    /// Next chunk to copy.
    claim: AtomicUsize,
    /// Chunks copied.
    copied: AtomicUsize,
    /// Next slot of the running incremental sweep pass, or `SWEEP_IDLE`.
    sweep_next: CachePadded<AtomicUsize>,
}

impl<K> Array<K> {
    fn new(slots: usize) -> Array<K> {
        debug_assert!(slots.is_power_of_two() && slots >= MIN_SLOTS);
        // Loom atomics cannot be made by zeroing memory: build each slot.
        let slots = (0..slots)
            .map(|_| Slot {
                key: Atomic::null(),
                state: AtomicU64::new(0),
            })
            .collect();
        Array {
            slots,
            used: CachePadded::new(AtomicUsize::new(0)),
            next: Atomic::null(),
            claim: AtomicUsize::new(0),
            copied: AtomicUsize::new(0),
            sweep_next: CachePadded::new(AtomicUsize::new(SWEEP_IDLE)),
        }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Claims allowed before the array must migrate (3/4 of its slots).
    #[inline]
    fn grow_at(&self) -> usize {
        self.slots.len() - self.slots.len() / 4
    }

    #[inline]
    fn chunks(&self) -> usize {
        self.slots.len().div_ceil(CHUNK)
    }

    /// Places a frozen row's entry and word into this (unpublished) array.
    ///
    /// Only migration copiers write here before publication, each with a
    /// distinct entry, and the array is sized to keep a vacant slot for each.
    fn insert_copy(&self, entry: Shared<'_, Entry<K>>, hash: u64, word: u64, guard: &Guard) {
        let mask = self.mask();
        let mut idx = hash as usize & mask;
        loop {
            let slot = &self.slots[idx];
            if slot
                .key
                .compare_exchange(
                    Shared::null(),
                    entry,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                    guard,
                )
                .is_ok()
            {
                // Published to readers by `copied` (Release) and then the
                // table's `current` (Release): nobody reads it before.
                slot.state.store(word, Ordering::Relaxed);
                self.used.fetch_add(1, Ordering::Relaxed);
                return;
            }
            idx = (idx + 1) & mask;
        }
    }
}

/// Hands an unlinked entry to the collector. Dropping the key runs user code:
/// a panicking `Drop` is caught so that it cannot unwind through the
/// collector (and into whichever thread happens to run the deferred free).
///
/// # Safety
/// As for `Guard::defer_destroy`: `entry` is unreachable for new readers and
/// is retired exactly once.
unsafe fn retire_entry<K>(guard: &Guard, entry: Shared<'_, Entry<K>>) {
    let ptr = entry.as_raw() as usize;
    // SAFETY: the caller's contract; the closure rebuilds the `Owned` once,
    // after every guard that could see `entry` is gone.
    unsafe {
        guard.defer_unchecked(move || {
            let owned = Owned::from_raw(ptr as *mut Entry<K>);
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(owned)));
        })
    };
}

/// Whether an array's `next` says a migration has started.
#[inline]
fn is_migrating<K>(next: Shared<'_, Array<K>>) -> bool {
    !next.is_null() || next.tag() != 0
}

/// The outcome of a probe for a key.
enum Probe<'g, K> {
    Found(&'g Slot<K>),
    /// The key is absent; this is the first vacant slot of its sequence.
    Vacant(usize),
    /// A migration has closed part of the sequence: help it, then retry.
    Migrating,
    /// Every slot was probed without a vacancy (cannot happen while `used`
    /// respects `grow_at`; handled by migrating anyway).
    Full,
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
    current: Atomic<Array<K>>,
    /// Rows: entries linked into the current array (live or DEAD-not-yet-
    /// unlinked) plus insertions in flight.
    len: CachePadded<AtomicUsize>,
    min_slots: usize,
    /// The largest `tat` removed per stripe of keys: where fresh rows start.
    floors: Floors,
}

impl<K> Table<K> {
    /// A table that never shrinks below `min_slots` (rounded up to a power of
    /// two, at least [`MIN_SLOTS`]).
    pub(crate) fn new(min_slots: usize) -> Table<K> {
        let min_slots = min_slots.max(MIN_SLOTS).next_power_of_two();
        Table {
            current: Atomic::new(Array::new(min_slots)),
            len: CachePadded::new(AtomicUsize::new(0)),
            min_slots,
            floors: Floors::new(),
        }
    }

    /// Where a fresh row of a key with this hash starts: the largest `tat`
    /// removed from its stripe (see `floor.rs`).
    #[inline]
    pub(crate) fn floor(&self, hash: u64) -> u64 {
        self.floors.get(hash)
    }

    /// The stripe whose floor a key with this hash shares (for models).
    pub(crate) fn floor_stripe(hash: u64) -> usize {
        Floors::stripe(hash)
    }

    /// Bytes held by the floors.
    pub(crate) fn floor_bytes(&self) -> usize {
        self.floors.bytes()
    }

    /// Rows in the table (exact when no operation is in flight).
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Slots in the current array.
    pub(crate) fn slots(&self, guard: &Guard) -> usize {
        self.array(guard).1.slots.len()
    }

    /// Bytes held by the current array (not counting entries).
    pub(crate) fn array_bytes(&self, guard: &Guard) -> usize {
        size_of::<Array<K>>() + self.slots(guard) * size_of::<Slot<K>>()
    }

    /// Bytes of one entry allocation (key and hash), not counting what the
    /// key itself owns.
    pub(crate) fn entry_bytes() -> usize {
        size_of::<Entry<K>>()
    }

    #[inline]
    fn array<'g>(&self, guard: &'g Guard) -> (Shared<'g, Array<K>>, &'g Array<K>) {
        let ptr = self.current.load(Ordering::Acquire, guard);
        // SAFETY: `current` is never null (set in `new`, replaced only by a
        // non-null array in `help_migrate`), and an array unpublished from
        // `current` is retired with `defer_destroy`, so it stays allocated
        // while `guard`, pinned before this load, is alive.
        (ptr, unsafe { ptr.deref() })
    }

    fn probe<'g, Q>(&self, arr: &'g Array<K>, hash: u64, key: &Q, guard: &'g Guard) -> Probe<'g, K>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let mask = arr.mask();
        let mut idx = hash as usize & mask;
        for _ in 0..arr.slots.len() {
            let slot = &arr.slots[idx];
            let k = slot.key.load(Ordering::Acquire, guard);
            if k.is_null() {
                match k.tag() {
                    TOMBSTONE => {}
                    SEALED => return Probe::Migrating,
                    _ => return Probe::Vacant(idx),
                }
            } else {
                // SAFETY: a non-null key pointer read under `guard` points to
                // an entry that is retired (with `defer_destroy`) only after
                // being unlinked from this slot, or after this array was
                // unpublished; both happen after `guard` was pinned, since we
                // reached this array through `current` under `guard`.
                let e = unsafe { k.deref() };
                if e.hash == hash && e.key.borrow() == key {
                    return Probe::Found(slot);
                }
            }
            idx = (idx + 1) & mask;
        }
        Probe::Full
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
        let mut fresh: Option<Owned<Entry<K>>> = None;
        loop {
            let (arr_ptr, arr) = self.array(guard);
            match self.probe(arr, hash, key, guard) {
                Probe::Found(slot) => {
                    match self.debit(arr, slot, limits, hash, n, &mut now, reread, guard) {
                        Step::Done(r) => {
                            return r.map(|(tat, prev)| Admitted {
                                tat,
                                prev,
                                created: false,
                            })
                        }
                        Step::Retry => continue,
                    }
                }
                Probe::Migrating => self.help_migrate(arr, guard),
                Probe::Full => self.start_migration(arr_ptr, guard),
                Probe::Vacant(idx) => {
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
                        None => Owned::new(Entry {
                            hash,
                            key: key.to_owned(),
                        }),
                    };
                    if !self.claim_slot(arr_ptr, arr, guard) {
                        fresh = Some(entry);
                        continue;
                    }
                    let slot = &arr.slots[idx];
                    match slot.key.compare_exchange(
                        Shared::null(),
                        entry,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                        guard,
                    ) {
                        Ok(_) => {
                            match self.debit(arr, slot, limits, hash, n, &mut now, reread, guard) {
                                Step::Done(r) => {
                                    return r.map(|(tat, prev)| Admitted {
                                        tat,
                                        prev,
                                        created: true,
                                    })
                                }
                                Step::Retry => continue,
                            }
                        }
                        Err(e) => {
                            // Someone else took the slot (maybe with our key):
                            // give the claim back and look again.
                            fresh = Some(e.new);
                            arr.used.fetch_sub(1, Ordering::Relaxed);
                            self.len.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                }
            }
        }
    }

    /// Counts one more row and one more used slot in `arr`, unless `arr` is
    /// migrating or full (then helps or starts the migration and says no).
    fn claim_slot(&self, arr_ptr: Shared<'_, Array<K>>, arr: &Array<K>, guard: &Guard) -> bool {
        if is_migrating(arr.next.load(Ordering::SeqCst, guard)) {
            self.help_migrate(arr, guard);
            return false;
        }
        // The row is counted before it is linked, and the migration check
        // comes after the count (both SeqCst): a migration that sizes its
        // target from `len` after sealing `next` counts every row that can
        // still be linked into `arr`. See `start_migration`.
        self.len.fetch_add(1, Ordering::SeqCst);
        if is_migrating(arr.next.load(Ordering::SeqCst, guard)) {
            self.len.fetch_sub(1, Ordering::SeqCst);
            self.help_migrate(arr, guard);
            return false;
        }
        if arr.used.fetch_add(1, Ordering::Relaxed) >= arr.grow_at() {
            arr.used.fetch_sub(1, Ordering::Relaxed);
            self.len.fetch_sub(1, Ordering::SeqCst);
            self.start_migration(arr_ptr, guard);
            return false;
        }
        true
    }

    /// The single CAS loop that debits a row. A row never debited (word 0)
    /// starts from its floor. Returns the new `tat` and the one it replaced.
    #[inline]
    #[allow(clippy::too_many_arguments)] // the rule's inputs, each used once
    fn debit(
        &self,
        arr: &Array<K>,
        slot: &Slot<K>,
        limits: &Limits,
        hash: u64,
        n: u64,
        now: &mut u64,
        reread: &dyn Fn() -> u64,
        guard: &Guard,
    ) -> Step<Result<(u64, u64), Decision>> {
        let backoff = Backoff::new();
        let mut word = slot.state.load(Ordering::Acquire);
        loop {
            if !is_live(word) {
                if word == DEAD {
                    self.unlink(slot, guard);
                } else {
                    self.help_migrate(arr, guard);
                }
                return Step::Retry;
            }
            // The floor is read after the row was found linked (its word was
            // loaded after the key pointer), hence after any removal of an
            // earlier row of this key raised it.
            let prev = if word == 0 {
                let floor = self.floors.get(hash);
                if floor > *now {
                    *now = (*now).max(reread());
                }
                floor
            } else {
                word
            };
            match limits.reserve(prev, *now, n) {
                Decision::Admit(tat) => {
                    #[cfg(pace_mutant = "check_then_debit")]
                    {
                        // Known-wrong: decide on a load, then write blindly.
                        slot.state.store(tat, Ordering::Release);
                        return Step::Done(Ok((tat, prev)));
                    }
                    #[allow(unreachable_code)]
                    match slot.state.compare_exchange_weak(
                        word,
                        tat,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return Step::Done(Ok((tat, prev))),
                        Err(actual) => {
                            word = actual;
                            cas_retry(&backoff);
                        }
                    }
                }
                denied => return Step::Done(Err(denied)),
            }
        }
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
    ) where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let backoff = Backoff::new();
        'outer: loop {
            let (_, arr) = self.array(guard);
            let slot = match self.probe(arr, hash, key, guard) {
                Probe::Found(slot) => slot,
                Probe::Migrating => {
                    self.help_migrate(arr, guard);
                    continue;
                }
                Probe::Vacant(_) | Probe::Full => return,
            };
            let mut word = slot.state.load(Ordering::Acquire);
            loop {
                if word == DEAD {
                    return;
                }
                if !is_live(word) {
                    self.help_migrate(arr, guard);
                    continue 'outer;
                }
                let (target, full) = match limits.refund(word, now, n, own_tat, prev) {
                    Refund::Unchanged => return,
                    Refund::Set(tat) => (tat, false),
                    Refund::Full => {
                        // The row's last state is `prev`: whoever creates the
                        // key again starts from at least that.
                        self.floors.raise(hash, prev);
                        (DEAD, true)
                    }
                };
                match slot.state.compare_exchange_weak(
                    word,
                    target,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        if full {
                            self.unlink(slot, guard);
                        }
                        return;
                    }
                    Err(actual) => {
                        word = actual;
                        cas_retry(&backoff);
                    }
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
        let backoff = Backoff::new();
        loop {
            let (_, arr) = self.array(guard);
            match self.probe(arr, hash, key, guard) {
                Probe::Found(slot) => {
                    let word = slot.state.load(Ordering::Acquire);
                    if word == DEAD {
                        return None;
                    }
                    if is_live(word) {
                        return Some(word);
                    }
                    // Frozen: the row's word is final here; read it as is.
                    return Some(word & !FROZEN);
                }
                Probe::Vacant(_) | Probe::Full => return None,
                // Do not write while peeking: wait for the migration instead.
                Probe::Migrating => snooze(&backoff),
            }
        }
    }

    /// Removes every row whose bucket is full at `now`, then shrinks the
    /// array if it has become sparse. Returns the rows this pass removed.
    pub(crate) fn sweep(&self, now: u64, guard: &Guard) -> usize {
        let (arr_ptr, arr) = self.array(guard);
        let removed = self.sweep_range(arr, 0, arr.slots.len(), now, guard);
        if removed.is_some() {
            self.shrink_if_sparse(arr_ptr, arr, guard);
        }
        removed.unwrap_or(0)
    }

    /// Starts a sweep pass: arrays of at most [`SWEEP_CHUNK`] slots are swept
    /// at once; larger ones are handed out a chunk at a time to the callers
    /// of [`sweep_step`](Table::sweep_step), so no caller scans more than one
    /// chunk. A pass already running continues.
    pub(crate) fn start_sweep(&self, now: u64, guard: &Guard) {
        let (_, arr) = self.array(guard);
        if arr.slots.len() <= SWEEP_CHUNK {
            self.sweep(now, guard);
            return;
        }
        let _ =
            arr.sweep_next
                .compare_exchange(SWEEP_IDLE, 0, Ordering::Relaxed, Ordering::Relaxed);
        self.sweep_step(now, guard);
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

    #[cold]
    #[inline(never)]
    fn sweep_chunk(&self, arr_ptr: Shared<'_, Array<K>>, arr: &Array<K>, now: u64, guard: &Guard) {
        let len = arr.slots.len();
        let start = arr.sweep_next.fetch_add(SWEEP_CHUNK, Ordering::Relaxed);
        if start >= len {
            return;
        }
        let end = (start + SWEEP_CHUNK).min(len);
        // A migration met on the way abandons the pass (the array is going).
        if self.sweep_range(arr, start, end, now, guard).is_some() && end == len {
            arr.sweep_next.store(SWEEP_IDLE, Ordering::Relaxed);
            self.shrink_if_sparse(arr_ptr, arr, guard);
        }
    }

    /// Removes the full rows among slots `start..end`; `None` if it met a
    /// migration (then it helped it and stopped).
    fn sweep_range(
        &self,
        arr: &Array<K>,
        start: usize,
        end: usize,
        now: u64,
        guard: &Guard,
    ) -> Option<usize> {
        let mut removed = 0;
        for slot in &arr.slots[start..end] {
            if slot.key.load(Ordering::Acquire, guard).is_null() {
                continue;
            }
            let word = slot.state.load(Ordering::Acquire);
            if word == DEAD {
                self.unlink(slot, guard);
            } else if !is_live(word) {
                // This array is being copied: its rows are swept in the next.
                self.help_migrate(arr, guard);
                return None;
            } else if word <= now && self.kill(slot, word, guard) {
                removed += 1;
            }
        }
        Some(removed)
    }

    /// Migrates to a smaller array when rows fill less than 1/8 of the slots.
    fn shrink_if_sparse(&self, arr_ptr: Shared<'_, Array<K>>, arr: &Array<K>, guard: &Guard) {
        if arr.slots.len() > self.min_slots && self.len().saturating_mul(8) < arr.slots.len() {
            self.start_migration(arr_ptr, guard);
        }
    }

    /// Moves a full row (`word <= now`) to DEAD and unlinks it, after raising
    /// its key's floor to `word`. False if the word changed first.
    fn kill(&self, slot: &Slot<K>, word: u64, guard: &Guard) -> bool {
        let k = slot.key.load(Ordering::Acquire, guard);
        if k.is_null() {
            return false;
        }
        // SAFETY: as in `probe`: a non-null key pointer loaded under `guard`
        // from an array reached through `current` under `guard`.
        let hash = unsafe { k.deref() }.hash;
        self.floors.raise(hash, word);
        #[cfg(pace_mutant = "unlink_without_dead")]
        {
            // Known-wrong: unlink a full row without closing its word, so a
            // racing debit can land on a row that is no longer reachable.
            let _ = word;
            return self.unlink(slot, guard);
        }
        #[allow(unreachable_code)]
        if slot
            .state
            .compare_exchange(word, DEAD, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.unlink(slot, guard)
        } else {
            false
        }
    }

    /// Unlinks the entry of a DEAD slot and retires it. True for the one
    /// caller that did it.
    fn unlink(&self, slot: &Slot<K>, guard: &Guard) -> bool {
        let k = slot.key.load(Ordering::Acquire, guard);
        if k.is_null() {
            return false;
        }
        let tomb = Shared::null().with_tag(TOMBSTONE);
        if slot
            .key
            .compare_exchange(k, tomb, Ordering::AcqRel, Ordering::Acquire, guard)
            .is_ok()
        {
            self.len.fetch_sub(1, Ordering::SeqCst);
            // SAFETY: the entry was just unlinked from its only live slot (an
            // entry is linked live in exactly one array; older arrays keep it
            // only in FROZEN slots, which are never unlinked, and those arrays
            // were unpublished before this entry could die here). No new
            // reader can reach it, and readers that already did are pinned,
            // so destruction is deferred past them. We won the CAS, so it is
            // retired exactly once.
            unsafe { retire_entry(guard, k) };
            true
        } else {
            false
        }
    }

    /// Seals `arr` for migration (if nobody has), sizes and allocates the
    /// target, and helps copy.
    fn start_migration(&self, arr_ptr: Shared<'_, Array<K>>, guard: &Guard) {
        // SAFETY: as in `array`: `arr_ptr` was loaded from `current` under
        // `guard` and arrays are retired with `defer_destroy`.
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
            .is_ok()
        {
            // Every row that can still be linked into `arr` is counted in
            // `len` by now (see `claim_slot`), and rows are only copied from
            // `arr`, so the target keeps at least half its slots vacant.
            let rows = self.len.load(Ordering::SeqCst);
            let slots = rows
                .saturating_mul(2)
                .saturating_add(2)
                .max(self.min_slots)
                .next_power_of_two();
            let target = Owned::new(Array::new(slots));
            arr.next.store(target, Ordering::Release);
        }
        self.help_migrate(arr, guard);
    }

    /// Copies chunks of `arr` into its target until none are left, waits for
    /// the other copiers, and makes sure the target is published.
    fn help_migrate(&self, arr: &Array<K>, guard: &Guard) {
        let backoff = Backoff::new();
        let next = loop {
            let next = arr.next.load(Ordering::Acquire, guard);
            if !next.is_null() {
                break next;
            }
            if next.tag() == 0 {
                return; // no migration (any more): the caller retries
            }
            snooze(&backoff); // the sealer is allocating the target
        };
        // SAFETY: `next` is retired only after it was published and then
        // unpublished by a later migration, all while `arr` (reached under
        // `guard`) was unpublished earlier; so it is alive under `guard`.
        let target = unsafe { next.deref() };
        let chunks = arr.chunks();
        loop {
            let chunk = arr.claim.fetch_add(1, Ordering::AcqRel);
            if chunk >= chunks {
                break;
            }
            self.copy_chunk(arr, target, chunk, guard);
            arr.copied.fetch_add(1, Ordering::AcqRel);
        }
        while arr.copied.load(Ordering::Acquire) < chunks {
            snooze(&backoff);
        }
        let old = Shared::from(arr as *const Array<K>);
        if self
            .current
            .compare_exchange(old, next, Ordering::AcqRel, Ordering::Acquire, guard)
            .is_ok()
        {
            // SAFETY: `arr` is no longer reachable from `current`; readers
            // that reached it are pinned. Its Drop frees only its slot array
            // (entries are owned by the table's live slots), and only the
            // thread that won this CAS retires it.
            unsafe { guard.defer_destroy(old) };
        }
    }

    fn copy_chunk(&self, arr: &Array<K>, target: &Array<K>, chunk: usize, guard: &Guard) {
        let end = ((chunk + 1) * CHUNK).min(arr.slots.len());
        for slot in &arr.slots[chunk * CHUNK..end] {
            loop {
                let k = slot.key.load(Ordering::Acquire, guard);
                if k.is_null() {
                    if k.tag() != 0 {
                        break; // tombstone
                    }
                    let sealed = Shared::null().with_tag(SEALED);
                    if slot
                        .key
                        .compare_exchange(k, sealed, Ordering::AcqRel, Ordering::Acquire, guard)
                        .is_ok()
                    {
                        break;
                    }
                    continue; // an insert won the slot: copy it
                }
                let word = slot.state.load(Ordering::Acquire);
                if word == DEAD {
                    self.unlink(slot, guard);
                    break;
                }
                debug_assert!(is_live(word), "a chunk is copied once");
                if slot
                    .state
                    .compare_exchange(word, word | FROZEN, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    // SAFETY: as in `probe`.
                    let hash = unsafe { k.deref() }.hash;
                    target.insert_copy(k, hash, word, guard);
                    break;
                }
            }
        }
    }
}

impl<K: Clone> Table<K> {
    /// Keys of the rows linked in the current array and not DEAD, for
    /// invariant checks when no operation is in flight.
    pub(crate) fn live_keys(&self, guard: &Guard) -> Vec<K> {
        let (_, arr) = self.array(guard);
        arr.slots
            .iter()
            .filter_map(|slot| {
                let k = slot.key.load(Ordering::Acquire, guard);
                if k.is_null() || slot.state.load(Ordering::Acquire) == DEAD {
                    return None;
                }
                // SAFETY: as in `probe`.
                Some(unsafe { k.deref() }.key.clone())
            })
            .collect()
    }
}

impl<K> Drop for Table<K> {
    fn drop(&mut self) {
        // SAFETY: `&mut self` means no other thread holds a reference into
        // the table, so no guard protects anything we free here. Entries
        // linked in the current array are owned by it and freed once; a
        // target array left by an unfinished migration holds only copies of
        // those pointers, so only its slot array is freed. Unlinked entries
        // and unpublished arrays were handed to the collector already.
        unsafe {
            let guard = epoch::unprotected();
            let cur = self.current.load(Ordering::Relaxed, guard);
            let arr = cur.deref();
            for slot in arr.slots.iter() {
                let k = slot.key.load(Ordering::Relaxed, guard);
                if !k.is_null() {
                    // A panicking key `Drop` must not leak the other rows.
                    let owned = k.into_owned();
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(owned)));
                }
            }
            let next = arr.next.load(Ordering::Relaxed, guard);
            if !next.is_null() {
                drop(next.into_owned());
            }
            drop(cur.into_owned());
        }
    }
}
