//! The unsafe core: one lock-free open-addressing table of rows, for every
//! key type (DESIGN.md §2).
//!
//! # Layout
//! A table is a power-of-two array of 16-byte cells, probed linearly from
//! the key's hash ([`probe_seq`], the one sequence every caller walks). A
//! cell is one 128-bit atomic `{key half, word}`: the word is the row's
//! bucket (`tat`) or a row state, and the key half names the key (`keys.rs`):
//! its own bits when it fits in a word and the hasher cannot panic, else a
//! tagged pointer to an immutable boxed copy of the key and its hash. Every
//! change of a row is one CAS of its cell; `cell.rs` encodes and decodes
//! every state. Arrays go through crossbeam-epoch, and so do key boxes.
//!
//! # Row lifecycle
//! ```text
//! empty --claim--> Claimed --first debit--> Live(tat) --debit/refund--> Live
//! Live, tat <= now (full) --sweep / refund to full--> Tomb --clean--> empty
//! ```
//! A row is live only after its first debit, so a live row is never taken
//! for full before it has been used. Removal raises the key's floor to the
//! row's `tat` first (`floor.rs`): a later row of the key starts from it.
//!
//! # One key, one live row
//! Within an array a key's live row is the first match on its probe
//! sequence; every inserter of a key claims a cell, fences, then checks the
//! whole sequence for another row or an earlier claim of the key
//! ([`Table::verify`]). Across a migration (`migrate.rs`) a key lives in the
//! old array until its cell is moved, and new rows go to the target only
//! after the old array's sequence was sealed.

use std::mem::size_of;

use crossbeam_utils::{Backoff, CachePadded};

use crate::bucket::{Decision, Limits, Refund};
use crate::pace::Refunded;
use crate::sync::epoch::{Atomic, Guard, Shared};
use crate::sync::{cas_retry, fence, snooze, AtomicBool, AtomicPtr, AtomicUsize, Ordering};

mod cell;
mod clean;
mod floor;
pub(crate) mod keys;
mod migrate;
pub(crate) mod quota;
mod sweep;
pub(crate) mod words;

use cell::{Cell, CellState};
use floor::Floors;
pub(crate) use keys::{NewRow, Probe};
#[cfg(feature = "internals")]
pub(crate) use sweep::sweep_chunk;
#[cfg(test)]
pub(crate) use sweep::SWEEP_AT_ONCE;

/// Cells of a migration chunk, the unit a copier claims; a call copies one,
/// or more while they are sparse (see [`CALL_CELLS`]). Loom models copy 2
/// cells at a time, so a 4-cell array migrates over calls.
#[cfg(not(loom))]
pub(crate) const CHUNK: usize = 64;
#[cfg(loom)]
pub(crate) const CHUNK: usize = 2;

/// The most cells one call copies: a call copies chunks until it has
/// copied [`SPARSE_ROWS`] rows or scanned this many cells, so a sparse array
/// (a shrink) migrates in `cells / CALL_CELLS` calls while a dense one
/// (growth) copies one chunk per call. Loom models copy one chunk per call.
#[cfg(not(loom))]
pub(crate) const CALL_CELLS: usize = 1024;
#[cfg(loom)]
pub(crate) const CALL_CELLS: usize = CHUNK;

/// Rows after which a call copies no further chunk: a call copies fewer than
/// `SPARSE_ROWS + CHUNK` rows.
const SPARSE_ROWS: usize = 16;

/// `sweep_next` when no pass is running. Far above any array length, and far
/// below `usize::MAX`, so that late `fetch_add`s cannot wrap it.
const SWEEP_IDLE: usize = usize::MAX / 2;

/// The one probe sequence: linear from the hash's low bits, every cell once.
#[inline]
fn probe_seq(hash: u64, mask: usize) -> impl Iterator<Item = usize> {
    let start = hash as usize & mask;
    (0..=mask).map(move |i| (start + i) & mask)
}

/// What a reserve did.
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

/// What [`Table::verify`] decides for a claim.
enum Verdict {
    Keep,
    Withdraw,
    /// Withdraw, wait while this earlier cell holds a claim of the key.
    Await(usize),
}

/// Tag on a null `next`: a migration target is being allocated.
const PENDING: usize = 1;

/// The smallest array.
pub(crate) const MIN_CELLS: usize = 4;

/// A churning array's target gives rows at most 1/8 of its cells. Under a
/// steady flood of new keys, tombstones left in the middle of runs hold
/// about as many cells as the rows do; with rows at a quarter, runs grow
/// long enough that a new key's walk to the empty cell ending its sequence
/// (it must pass every tombstone to know the key has no row) is the slowest
/// part of a call (in one measured flood, 1 call in 1,000 walked over 100
/// cells at 4,000 live rows in 16,384 cells).
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
struct Array {
    cells: Box<[Cell]>,
    /// Cells not empty: rows, claims, tombstones, copies.
    used: CachePadded<AtomicUsize>,
    /// Claims allowed (`grow_at`, less the rows a migration will copy in,
    /// raised as each chunk's copies arrive).
    limit: AtomicUsize,
    /// The migration target: null, null tagged PENDING, or the next array.
    next: Atomic<Array>,
    /// Next chunk to copy.
    claim: AtomicUsize,
    /// Chunks copied.
    copied: AtomicUsize,
    /// Next chunk to clean when the array meets its limit.
    clean_next: AtomicUsize,
    /// Next cell of the running incremental sweep pass, or `SWEEP_IDLE`.
    sweep_next: CachePadded<AtomicUsize>,
    /// Key boxes of rows removed from this array's migration target while
    /// this array was current: freed with this array (`keys.rs`).
    orphans: AtomicPtr<Orphan>,
}

/// A key box waiting for the array it may still be named in to go.
struct Orphan {
    bits: u64,
    next: *mut Orphan,
}

impl Array {
    /// A migration target: an allocation failure aborts, as a `Vec`'s does.
    fn new(n: usize, copies: usize) -> Array {
        Array::try_new(n, copies).unwrap_or_else(|| {
            let layout = std::alloc::Layout::array::<Cell>(n)
                .unwrap_or_else(|_| std::alloc::Layout::new::<Cell>());
            std::alloc::handle_alloc_error(layout)
        })
    }

    fn try_new(n: usize, copies: usize) -> Option<Array> {
        debug_assert!(n.is_power_of_two());
        Some(Array {
            cells: cell::empty_cells(n)?,
            used: CachePadded::new(AtomicUsize::new(0)),
            limit: AtomicUsize::new(grow_at(n).saturating_sub(copies)),
            next: Atomic::null(),
            claim: AtomicUsize::new(0),
            copied: AtomicUsize::new(0),
            clean_next: AtomicUsize::new(0),
            sweep_next: CachePadded::new(AtomicUsize::new(SWEEP_IDLE)),
            orphans: AtomicPtr::new(std::ptr::null_mut()),
        })
    }

    /// Keeps the box named by `bits` until this array is freed.
    fn adopt(&self, bits: u64) {
        let node = Box::into_raw(Box::new(Orphan {
            bits,
            next: std::ptr::null_mut(),
        }));
        let mut head = self.orphans.load(Ordering::Acquire);
        loop {
            // SAFETY: `node` is ours until the CAS below publishes it.
            unsafe { (*node).next = head };
            match self
                .orphans
                .compare_exchange(head, node, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Frees the adopted boxes with `free` (the array is being freed:
    /// nothing else reads the list).
    fn free_orphans(&mut self, free: Option<unsafe fn(u64)>) {
        let mut p = self.orphans.swap(std::ptr::null_mut(), Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: every node was made by `Box::into_raw` in `adopt` and
            // is owned by this list alone, which `&mut self` holds.
            let node = unsafe { Box::from_raw(p) };
            if let Some(free) = free {
                // SAFETY: an orphan's box left every array a reader can
                // reach once this array is gone (`keys.rs`), and is freed
                // once: here.
                unsafe { free(node.bits) };
            }
            p = node.next;
        }
    }

    fn mask(&self) -> usize {
        self.cells.len() - 1
    }

    fn chunks(&self) -> usize {
        self.cells.len().div_ceil(CHUNK)
    }
}

/// Arrays of at least this many bytes are freed on a short-lived thread:
/// returning tens of MB to the kernel (munmap) takes milliseconds, which no
/// caller should pay for.
#[cfg(not(any(loom, miri)))]
const FREE_OFF_CALLER: usize = 1 << 20;

/// Large arrays whose free is running on a thread of its own.
#[cfg(not(any(loom, miri)))]
pub(crate) static FREES_IN_FLIGHT: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Hands an array unpublished from `current` to the collector and flushes
/// the thread's garbage, so that it is freed soon (a growing table retires
/// little else); a large array is freed off the caller's path
/// ([`free_cells`]).
///
/// # Safety
/// `arr` was unpublished from `current` (unreachable for new readers) and
/// is retired exactly once.
unsafe fn retire_array(guard: &Guard, arr: Shared<'_, Array>, free: Option<unsafe fn(u64)>) {
    let ptr = arr.as_raw() as usize;
    // SAFETY: the caller's contract; the closure rebuilds the `Box` (made by
    // `Owned::new`) once, after every guard that could see `arr` is gone.
    // The array owns no key box but its orphans (rows own theirs,
    // `keys.rs`), freed with it.
    unsafe {
        guard.defer_unchecked(move || {
            let mut owned = Box::from_raw(ptr as *mut Array);
            owned.free_orphans(free);
            let cells = std::mem::take(&mut owned.cells);
            drop(owned);
            free_cells(cells);
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

/// Frees a retired array's cells (atomics: nothing to drop): at once if
/// small, else on a new thread (or at once if no thread can be started).
fn free_cells(cells: Box<[Cell]>) {
    #[cfg(not(any(loom, miri)))]
    {
        let layout = std::alloc::Layout::for_value::<[Cell]>(&cells);
        if layout.size() >= FREE_OFF_CALLER {
            let p = Box::into_raw(cells) as *mut u8 as usize;
            FREES_IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
            let free = move || {
                discard_pages(p, layout.size());
                // SAFETY: `p` is the box's allocation, made by the global
                // allocator with `layout` (what `Box<[Cell]>` frees with),
                // and freed exactly once: here, or below if the thread never
                // started. `Cell` has no drop glue, so freeing without
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
    drop(cells);
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
            // ones. A failure leaves the pages as they were, for the free to
            // return.
            unsafe { libc::madvise(at as *mut libc::c_void, n, libc::MADV_DONTNEED) };
            at += n;
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, len);
}

/// Whether an array's `next` says a migration has started.
fn is_migrating(next: Shared<'_, Array>) -> bool {
    !next.is_null() || next.tag() != 0
}

/// Where a key's walk ended.
enum Found<'g> {
    /// The key's row: cell `idx` of `arr` held `v` (live, `tat`), whose key
    /// half is `bits`.
    Row {
        arr: &'g Array,
        idx: usize,
        v: u128,
        bits: u64,
        tat: u64,
    },
    /// No row: the first empty cell of the sequence in `arr` (which was not
    /// migrating), and the first tombstone before it with its value.
    Absent {
        arr: &'g Array,
        empty: usize,
        tomb: Option<(usize, u128)>,
    },
    /// Every cell of `arr` probed, none empty.
    Full {
        arr: &'g Array,
        tomb: Option<(usize, u128)>,
    },
}

/// A claim its inserter has not yet made a row: dropped (also when a key's
/// `Eq` panics in [`Table::verify`]), it is withdrawn and its key box
/// retired. Becoming the row forgets it.
struct Claim<'t, 'g> {
    table: &'t Table,
    arr: &'g Array,
    at: usize,
    bits: u64,
    guard: &'g Guard,
}

impl Drop for Claim<'_, '_> {
    fn drop(&mut self) {
        // Known-wrong variant: a claim whose check panicked stays claimed
        // (its cell is lost to the array, `len` counts it for good).
        if cfg!(pace_mutant = "claimed_left_on_panic") && std::thread::panicking() {
            return;
        }
        self.table
            .withdraw(self.arr, self.at, self.bits, self.guard);
    }
}

/// The bits of a new row that no claim has published yet: a box among them
/// is freed when this drops (nobody else has seen it).
struct Fresh {
    bits: Option<u64>,
    free: Option<unsafe fn(u64)>,
}

impl Drop for Fresh {
    fn drop(&mut self) {
        if let (Some(bits), Some(free)) = (self.bits, self.free) {
            // SAFETY: `bits` were made by the probe's `make` for this table
            // (whose boxes `free` frees) and never published: no claim of
            // them succeeded (a claim that does takes them out first).
            unsafe { free(bits) };
        }
    }
}

/// The table: arrays of cells, migrating chunk by chunk.
pub(crate) struct Table {
    /// The oldest array in use: the one migrating, if a migration runs.
    current: Atomic<Array>,
    /// Rows: live cells plus claims in flight.
    len: CachePadded<AtomicUsize>,
    min_cells: usize,
    floors: Floors,
    /// How rows hold their keys: `None` for a key's own bits, else the free
    /// function of the table's key boxes (`keys.rs`).
    boxed: Option<unsafe fn(u64)>,
    /// The type the boxes hold (for the `internals` key listing).
    #[cfg(feature = "internals")]
    key_type: std::any::TypeId,
    /// Migrations started (for tests).
    migrations: AtomicUsize,
    /// Cells of the chunks copied (for tests).
    copied_cells: AtomicUsize,
    /// A sweep pass ended on a sparse array that still held rows: the next
    /// insert or removal starts the shrink (`shrink_pending`).
    shrink_wanted: AtomicBool,
    /// The current array's first cell and mask, as plain numbers, for
    /// [`prefetch`](Table::prefetch) before a call pins the epoch,
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

impl Table {
    /// A table that never shrinks below `min_cells` (rounded up to a power
    /// of two, at least 4), or `None` if that is more cells than an array
    /// can have or the allocator gives; its cells hold keys as `kind` says.
    pub(crate) fn try_new(min_cells: usize, kind: keys::KeyKind) -> Option<Table> {
        let n = min_cells.max(MIN_CELLS).checked_next_power_of_two()?;
        let first = Array::try_new(n, 0)?;
        #[cfg(not(loom))]
        let hint = (
            std::sync::atomic::AtomicUsize::new(first.cells.as_ptr() as usize),
            std::sync::atomic::AtomicUsize::new(first.mask()),
        );
        Some(Table {
            #[cfg(not(loom))]
            hint,
            current: Atomic::new(first),
            len: CachePadded::new(AtomicUsize::new(0)),
            min_cells: n,
            floors: Floors::new(),
            boxed: kind.free,
            #[cfg(feature = "internals")]
            key_type: kind.key_type,
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
            sweep::prefetch(base.wrapping_add(idx));
        }
        #[cfg(loom)]
        let _ = hash;
    }

    /// Where a fresh row of a key with this hash starts (its stripe's floor).
    #[inline]
    pub(crate) fn floor(&self, hash: u64) -> u64 {
        self.floors.get(hash)
    }

    /// The stripe of floors a key with this hash shares (for models).
    #[cfg(feature = "internals")]
    pub(crate) fn floor_stripe(hash: u64) -> usize {
        Floors::stripe(hash)
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
        let cur = self.array(guard);
        is_migrating(cur.next.load(Ordering::Acquire, guard))
    }

    /// Bytes of the arrays in use: the current one and, while a migration
    /// runs, its target. Rows own nothing else.
    pub(crate) fn array_bytes(&self, guard: &Guard) -> usize {
        let cur = self.array(guard);
        let bytes = |a: &Array| size_of::<Array>() + a.cells.len() * size_of::<Cell>();
        bytes(cur) + self.target(cur, guard).map_or(0, bytes)
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
        let cur = self.array(guard);
        self.target(cur, guard).unwrap_or(cur).cells.len()
    }

    /// The current array. With [`target`](Table::target), the only places
    /// an array pointer is dereferenced: every array a call touches is
    /// reached through them, as a reference tied to its guard.
    #[inline(always)]
    fn array<'g>(&self, guard: &'g Guard) -> &'g Array {
        let p = self.current.load(Ordering::Acquire, guard);
        // SAFETY: `current` is never null, and an array unpublished from it
        // is retired through the epoch, so it outlives `guard`.
        unsafe { p.deref() }
    }

    /// The migration target of `arr` (an array reached under `guard`), once
    /// published.
    #[inline]
    fn target<'g>(&self, arr: &'g Array, guard: &'g Guard) -> Option<&'g Array> {
        let next = arr.next.load(Ordering::Acquire, guard);
        // SAFETY: a published target is retired only after it became
        // current and was unpublished in turn, after its source was: a
        // guard that reached the source pinned before either, so the
        // epoch keeps the target for as long as the source.
        (!next.is_null()).then(|| unsafe { next.deref() })
    }

    /// The target of a migrating array, once allocated.
    fn next_of<'g>(&self, arr: &'g Array, guard: &'g Guard) -> &'g Array {
        let backoff = Backoff::new();
        loop {
            if let Some(next) = self.target(arr, guard) {
                return next;
            }
            snooze(&backoff); // its migration's starter is allocating it
        }
    }

    /// The key hash of a row's key half `bits`: from its box, or, for a
    /// key's own bits, from `hash_of` (the caller's hasher, which cannot
    /// panic for such tables: `words::hasher_cannot_panic`).
    ///
    /// # Safety
    /// For a boxed table, `bits` was read under `guard` from a cell of this
    /// table in a state that names a live key (`keys::box_ref`).
    #[inline]
    unsafe fn row_hash(&self, bits: u64, hash_of: &dyn Fn(u64) -> u64, guard: &Guard) -> u64 {
        if self.boxed.is_some() {
            // SAFETY: the caller's contract.
            unsafe { keys::hash_in_box(bits, guard) }
        } else {
            hash_of(bits)
        }
    }

    /// Hands the key box of a row or claim that left the table to the
    /// collector (nothing for a key's own bits).
    ///
    /// # Safety
    /// `bits` names a box of this table that no cell a reader pinning from
    /// now on can reach names (see `keys.rs`, "A box's lifetime"), retired
    /// once.
    unsafe fn retire_key(&self, bits: u64, guard: &Guard) {
        if let Some(free) = self.boxed {
            // SAFETY: the caller's contract; the closure frees the box once,
            // after every guard that could have read `bits` is gone.
            unsafe { guard.defer_unchecked(move || free(bits)) };
        }
    }

    /// Where `arr` stands: `Some(None)` if it is the current array,
    /// `Some(Some(cur))` if it is the target of the current array `cur`'s
    /// migration, `None` if it is older (every cell frozen). A row's key box
    /// must outlive every array that may still name it (`keys.rs`).
    fn source_of<'g>(&self, arr: &Array, guard: &'g Guard) -> Option<Option<&'g Array>> {
        let cur = self.array(guard);
        if std::ptr::eq(cur, arr) {
            return Some(None);
        }
        self.target(cur, guard)
            .is_some_and(|t| std::ptr::eq(t, arr))
            .then_some(Some(cur))
    }

    /// Walks `key`'s sequence from the current array, following migration
    /// targets. An inserting walk (`seal`) seals the empty cell that ends
    /// the sequence in a migrating array, so nothing can claim it after.
    fn find<'g, P: Probe>(&self, hash: u64, key: &P, seal: bool, guard: &'g Guard) -> Found<'g> {
        let is_key = |k: u64| {
            // SAFETY: called below only with the key half of a cell read
            // under `guard` in a live, frozen live or moved state.
            unsafe { key.matches(k) }
        };
        let backoff = Backoff::new();
        let mut arr = self.array(guard);
        'arrays: loop {
            let mut tomb = None;
            for idx in probe_seq(hash, arr.mask()) {
                loop {
                    let v = arr.cells[idx].load();
                    match CellState::decode(v) {
                        CellState::Empty | CellState::Fence => {
                            if !is_migrating(arr.next.load(Ordering::SeqCst, guard)) {
                                return Found::Absent {
                                    arr,
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
                            arr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        CellState::Sealed => {
                            arr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        CellState::Tomb if tomb.is_none() => tomb = Some((idx, v)),
                        CellState::Live { key: k, tat } if is_key(k) => {
                            return Found::Row {
                                arr,
                                idx,
                                v,
                                bits: k,
                                tat,
                            };
                        }
                        CellState::FrozenLive { key: k, .. } if is_key(k) => {
                            // Its copier is moving it: wait for that one cell.
                            snooze(&backoff);
                            continue;
                        }
                        CellState::Moved { key: k } if is_key(k) => {
                            arr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        _ => {} // other keys, claims, closed tombstones
                    }
                    break;
                }
            }
            if !is_migrating(arr.next.load(Ordering::Acquire, guard)) {
                return Found::Full { arr, tomb };
            }
            arr = self.next_of(arr, guard);
        }
    }

    /// Debits `n` tokens from `key`'s bucket at `now`, creating its row if
    /// absent (from its floor). A denial writes and creates nothing.
    /// `hash_of` gives the hash of a key's own bits (a migration copy needs
    /// it; boxed keys keep theirs).
    ///
    /// The key's first cell of a current array that is not migrating is
    /// probed here, inline: a row found there is debited at once.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn reserve<P: NewRow>(
        &self,
        limits: &Limits,
        hash: u64,
        key: &P,
        n: u64,
        now: u64,
        reread: &dyn Fn() -> u64,
        hash_of: &dyn Fn(u64) -> u64,
        guard: &Guard,
    ) -> Result<Admitted, Decision> {
        let arr = self.array(guard);
        if arr.next.load(Ordering::Relaxed, guard).is_null() {
            let idx = hash as usize & arr.mask();
            let v = arr.cells[idx].load();
            if let Some((bits, tat)) = cell::live(v) {
                // SAFETY: `bits` was read under `guard` from a live cell.
                if unsafe { key.matches(bits) } {
                    if let Some(r) = self.debit(arr, idx, v, bits, tat, limits, n, now) {
                        return r;
                    }
                }
            }
        }
        self.reserve_slow(limits, hash, key, n, now, reread, hash_of, guard)
    }

    /// Everything but a row in the key's first cell: the walk, inserts,
    /// migrations.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn reserve_slow<P: NewRow>(
        &self,
        limits: &Limits,
        hash: u64,
        key: &P,
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
        // The bits of the row this call would create: made once, when the
        // first claim is tried, and again only after a claim published
        // them and lost (its box is then retired). Bits never published
        // are freed when `fresh` drops, also if a key's `Eq` panics.
        let mut fresh = Fresh {
            bits: None,
            free: self.boxed,
        };
        loop {
            let (arr, empty, tomb) = match self.find(hash, key, true, guard) {
                Found::Row {
                    arr,
                    idx,
                    v,
                    bits,
                    tat,
                } => match self.debit(arr, idx, v, bits, tat, limits, n, now) {
                    Some(r) => return r,
                    None => continue, // removed or frozen under us
                },
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
            let mine = *fresh.bits.get_or_insert_with(|| key.make());
            let claim = match self.claim(arr, mine, empty, tomb, guard) {
                Ok(at) => Claim {
                    table: self,
                    arr,
                    at,
                    bits: mine,
                    guard,
                },
                Err(Lost::NoRoom) => {
                    // Mostly tombstones: clean a chunk in place and claim
                    // again; else migrate.
                    if !self.clean_some(arr, guard) {
                        self.start_migration(arr, hash_of, guard);
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
            // From here the bits are published: whatever happens to the
            // claim, `withdraw` (run by dropping `claim`) or the row owns
            // them.
            fresh.bits = None;
            // Dekker with every other inserter of the key: each claims,
            // fences, then reads the whole sequence (see `verify`).
            fence(Ordering::SeqCst);
            match self.verify(hash, key, arr, claim.at, guard) {
                Verdict::Keep => {}
                verdict => {
                    drop(claim);
                    snooze(&backoff);
                    if let Verdict::Await(earlier) = verdict {
                        let claimed_by_key = |v: u128| match CellState::decode(v) {
                            CellState::Claimed { key: k } => {
                                // SAFETY: `k` was read under `guard` from a
                                // claimed cell.
                                unsafe { key.matches(k) }
                            }
                            _ => false,
                        };
                        while claimed_by_key(arr.cells[earlier].load()) {
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
                    let claimed = CellState::Claimed { key: mine }.encode();
                    let live = CellState::Live { key: mine, tat }.encode();
                    if arr.cells[claim.at].cas(claimed, live).is_ok() {
                        std::mem::forget(claim);
                        return Ok(Admitted {
                            tat,
                            prev: floor,
                            created: true,
                        });
                    }
                    // A copier froze the claim: it is not copied; look again.
                    drop(claim);
                }
                denied => {
                    drop(claim);
                    return Err(denied);
                }
            }
        }
    }

    /// Counts one more row unless `arr` is migrating: the handshake with
    /// `start_migration`, which sizes the target from `len` after sealing.
    /// The row is counted before it is linked, and the migration check
    /// comes after the count (both SeqCst): a migration that sizes its
    /// target from `len` after sealing `next` counts every row that can
    /// still be claimed in the array.
    fn count_row(&self, arr: &Array, guard: &Guard) -> bool {
        let migrating = || is_migrating(arr.next.load(Ordering::SeqCst, guard));
        if migrating() {
            return false;
        }
        self.len.fetch_add(1, Ordering::SeqCst);
        // Dekker with `start_migration` (seal `next`, fence, read `len`): at
        // least one side sees the other's write. The fence makes the
        // argument hold in loom too, which models SeqCst accesses as AcqRel.
        fence(Ordering::SeqCst);
        if migrating() {
            self.len.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Claims a cell of `arr` for the key whose bits are `bits`: the
    /// tombstone if there is one, else the empty cell (if the array has
    /// room for one more used cell).
    fn claim(
        &self,
        arr: &Array,
        bits: u64,
        empty: Option<usize>,
        tomb: Option<(usize, u128)>,
        guard: &Guard,
    ) -> Result<usize, Lost> {
        if !self.count_row(arr, guard) {
            return Err(Lost::Taken);
        }
        let claim = CellState::Claimed { key: bits }.encode();
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

    /// Withdraws the claim of `bits` at `at` of `arr`: it becomes a
    /// tombstone (still used), or stays as a copier froze it (never
    /// copied). Either way its key box leaves the table.
    fn withdraw(&self, arr: &Array, at: usize, bits: u64, guard: &Guard) {
        let claim = CellState::Claimed { key: bits }.encode();
        let _ = arr.cells[at].cas(claim, CellState::Tomb.encode());
        self.len.fetch_sub(1, Ordering::SeqCst);
        // SAFETY: the claim's cell no longer names the box (a tombstone's
        // key half is zero), or names it frozen (`FrozenClaimed`, which no
        // reader dereferences); the box was in no other cell, and only its
        // inserter, here, retires it.
        unsafe { self.retire_key(bits, guard) };
    }

    /// Whether our claim in cell `at` of `my_arr` may become `key`'s row: no
    /// live row of the key on its sequence in any array, no claim of it
    /// earlier in ours, and our array still the newest.
    fn verify<P: Probe>(
        &self,
        hash: u64,
        key: &P,
        my_arr: &Array,
        at: usize,
        guard: &Guard,
    ) -> Verdict {
        // Known-wrong variant: keep every claim unchecked.
        if cfg!(pace_mutant = "verify_off") {
            return Verdict::Keep;
        }
        let still_newest = || !is_migrating(my_arr.next.load(Ordering::SeqCst, guard));
        let keep_if = |keep: bool| {
            if keep {
                Verdict::Keep
            } else {
                Verdict::Withdraw
            }
        };
        let is_key = |k: u64| {
            // SAFETY: called below only with the key half of a cell read
            // under `guard` in a live, frozen live or claimed state.
            unsafe { key.matches(k) }
        };
        let backoff = Backoff::new();
        let mut seen_me = false;
        let mut arr = self.array(guard);
        'arrays: loop {
            let mine = std::ptr::eq(arr, my_arr);
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
                            arr = self.next_of(arr, guard);
                            continue 'arrays;
                        }
                        CellState::Live { key: k, .. } | CellState::FrozenLive { key: k, .. }
                            if is_key(k) =>
                        {
                            return Verdict::Withdraw; // the key's row
                        }
                        CellState::Claimed { key: k } if is_key(k) => {
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
            arr = self.next_of(arr, guard);
        }
    }

    /// The CAS loop that debits the row in cell `idx` of `arr`, which held
    /// `v` (live at `tat`, key half `bits`). `None` if the row was removed
    /// or frozen first (look again).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn debit(
        &self,
        arr: &Array,
        idx: usize,
        mut v: u128,
        bits: u64,
        mut tat: u64,
        limits: &Limits,
        n: u64,
        now: u64,
    ) -> Option<Result<Admitted, Decision>> {
        let backoff = Backoff::new();
        loop {
            match limits.reserve(tat, now, n) {
                Decision::Admit(new) => {
                    let next = CellState::Live {
                        key: bits,
                        tat: new,
                    }
                    .encode();
                    // Known-wrong variant: decide on the value read, then
                    // write, so two debits that read one state both land.
                    if cfg!(pace_mutant = "check_then_debit") {
                        arr.cells[idx].store(next);
                        return Some(Ok(Admitted {
                            tat: new,
                            prev: tat,
                            created: false,
                        }));
                    }
                    match arr.cells[idx].cas(v, next) {
                        Ok(_) => {
                            return Some(Ok(Admitted {
                                tat: new,
                                prev: tat,
                                created: false,
                            }))
                        }
                        Err(actual) => match cell::live_tat(actual, bits) {
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
    /// full raises the floor to `prev` and removes the row (from the
    /// current array; in a migration's target the row stays, full).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn refund<P: Probe>(
        &self,
        limits: &Limits,
        hash: u64,
        key: &P,
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
                bits,
                mut tat,
            } = self.find(hash, key, false, guard)
            else {
                return Refunded::Refilled;
            };
            loop {
                let (next, full) = match limits.refund(tat, now, n, own_tat, prev) {
                    Refund::Unchanged => return Refunded::Superseded,
                    Refund::Set(t) => (CellState::Live { key: bits, tat: t }.encode(), false),
                    // Neither current nor the current array's target: an old
                    // array, whose cells are frozen (the CAS fails and the
                    // walk goes on in the target).
                    Refund::Full if self.source_of(arr, guard).is_none() => (
                        CellState::Live {
                            key: bits,
                            tat: prev,
                        }
                        .encode(),
                        false,
                    ),
                    Refund::Full => {
                        if !cfg!(pace_mutant = "refund_keeps_floor") {
                            self.floors.raise(hash, prev);
                        }
                        (CellState::Tomb.encode(), true)
                    }
                };
                match arr.cells[idx].cas(v, next) {
                    Ok(_) => {
                        if full {
                            self.len.fetch_sub(1, Ordering::SeqCst);
                            match self.source_of(arr, guard) {
                                // A migration's target: its source may still
                                // name the box (moved), so the box goes with
                                // the source (`keys.rs`).
                                Some(Some(source)) => {
                                    if self.boxed.is_some() {
                                        source.adopt(bits);
                                    }
                                }
                                // SAFETY: the row left an array that is
                                // current now or was before (the arrays
                                // older than it were unpublished before this
                                // check, so every reader that can still reach
                                // them pinned before it), and its cell no
                                // longer names the box; only the remover of a
                                // row retires its box.
                                _ => unsafe { self.retire_key(bits, guard) },
                            }
                            self.clean_after(arr, idx, guard);
                            self.shrink_pending(hash_of, guard);
                            return Refunded::Removed;
                        }
                        return Refunded::Restored;
                    }
                    Err(actual) => match CellState::decode(actual) {
                        CellState::Live { key: k, tat: t } if k == bits => {
                            v = actual;
                            tat = t;
                            cas_retry(&backoff);
                        }
                        // Frozen by a copier: find it in the target.
                        // (Known-wrong variant: give up, losing the refund.)
                        CellState::FrozenLive { .. } | CellState::Moved { .. }
                            if !cfg!(pace_mutant = "refund_gives_up_on_frozen") =>
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
    pub(crate) fn peek<P: Probe>(&self, hash: u64, key: &P, guard: &Guard) -> Option<u64> {
        match self.find(hash, key, false, guard) {
            Found::Row { tat, .. } => Some(tat),
            _ => None,
        }
    }

    /// Keys of the live rows (for tests; nothing in flight): `key` gives
    /// the key of a key's own bits; boxed keys are cloned from their boxes.
    ///
    /// # Panics
    /// If the table's boxes do not hold `K`s.
    #[cfg(feature = "internals")]
    pub(crate) fn live_keys<K: Clone>(&self, key: &dyn Fn(u64) -> K, guard: &Guard) -> Vec<K> {
        assert!(
            self.boxed.is_none() || self.key_type == typeid::of::<K>(),
            "the table's boxes hold another key type"
        );
        let cur = self.array(guard);
        let mut arrays = vec![cur];
        arrays.extend(self.target(cur, guard));
        arrays
            .iter()
            .flat_map(|a| a.cells.iter())
            .filter_map(|c| match CellState::decode(c.load()) {
                CellState::Live { key: bits, .. } | CellState::FrozenLive { key: bits, .. } => {
                    Some(if self.boxed.is_some() {
                        // SAFETY: read under `guard` from a live or frozen
                        // live cell of this table, whose boxes hold `K`s
                        // (asserted above).
                        unsafe { keys::key_in_box::<K>(bits, guard) }.clone()
                    } else {
                        key(bits)
                    })
                }
                _ => None,
            })
            .collect()
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other thread holds the table; the arrays
        // are owned by `current` and its `next`, and each live row of them
        // owns its key box (a moved cell names a box its target's row owns;
        // a claim or frozen claim is withdrawn by its inserter, also when
        // its check panics).
        unsafe {
            let guard = crate::sync::epoch::unprotected();
            let cur = self.current.load(Ordering::Relaxed, guard);
            let next = cur.deref().next.load(Ordering::Relaxed, guard);
            let mut arrays = vec![cur];
            if !next.is_null() {
                arrays.push(next);
            }
            for arr in arrays {
                let mut owned = arr.into_owned();
                owned.free_orphans(self.boxed);
                if let Some(free) = self.boxed {
                    for c in owned.cells.iter() {
                        if let CellState::Live { key, .. } = CellState::decode(c.load()) {
                            free(key);
                        }
                    }
                }
                drop(owned);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
