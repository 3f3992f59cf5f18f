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
//! for full before it has been used. A held row (`held.rs`) is a live row
//! whose `tat` field names a record of its settled `tat` and held tokens;
//! it is never full, so nothing removes it while anything is held. Removal raises the key's floor to the
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

use crate::bucket::{Limits, Refund};
use crate::pace::Refunded;
use crate::sync::epoch::{Atomic, Guard, Shared};
use crate::sync::{cas_retry, snooze, AtomicBool, AtomicUsize, Ordering};
use held::{Held, Resolution, Ticket, HELD};

mod array;
mod cell;
mod clean;
mod floor;
pub(crate) mod held;
mod insert;
pub(crate) mod keys;
mod migrate;
pub(crate) mod quota;
mod refund;
mod sweep;
pub(crate) mod words;

use array::Array;
#[cfg(all(feature = "__internals", not(any(loom, miri))))]
pub(crate) use array::FREES_IN_FLIGHT;
use cell::{Cell, CellState};
use floor::Floors;
pub(crate) use keys::Probe;
#[cfg(feature = "__internals")]
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
pub(crate) const CALL_CELLS: usize = 256;
#[cfg(loom)]
pub(crate) const CALL_CELLS: usize = CHUNK;

/// Rows after which a call copies no further chunk: a call copies fewer than
/// `SPARSE_ROWS + CHUNK` rows.
const SPARSE_ROWS: usize = 16;

/// `sweep_next` when no pass is running. Far above any array length, and far
/// below `usize::MAX`, so that late `fetch_add`s cannot wrap it.
const SWEEP_IDLE: usize = usize::MAX / 2;

/// Cells of a key's sequence probed by [`near`] (the first reads of a
/// refund, a peek and a walk) before the walk: with rows at up to 13/16 of
/// an array's cells, a key's row is mostly within the first few cells of
/// its sequence. At half load (an array just grown) a quarter of the rows
/// sit past their first cell and a few in a hundred past their fourth. A
/// reserve past its first cell probes to the end of the cluster instead
/// ([`near_after`]). An array of fewer cells (4, the smallest) is probed
/// around more than once: a live row of the key found on a later lap is
/// still its one row in the array. The models probe 4, as many as their
/// arrays have cells.
#[cfg(not(loom))]
const FAST_PROBES: usize = 8;
#[cfg(loom)]
const FAST_PROBES: usize = 4;

/// A live row found by [`near`]: its cell, the cell's value, key half and
/// field.
#[derive(Clone, Copy)]
struct Near {
    idx: usize,
    v: u128,
    bits: u64,
    tat: u64,
}

/// The live row of `key` among the first [`FAST_PROBES`] cells of its
/// sequence in `arr`, probed as [`Table::find_walk`] walks them: past other
/// keys' rows, tombstones and claims. A key has at most one live row in an
/// array (`verify`), so a row found here is the one the walk returns
/// first. `None` at any other cell (empty, fenced, sealed, frozen, moved)
/// or past the last probe: the walk decides.
///
/// # Safety
/// `arr` was loaded under the guard `key` probes with, which is still
/// pinned.
#[inline(always)]
unsafe fn near<P: Probe>(arr: &Array, hash: u64, key: &P) -> Option<Near> {
    // SAFETY: the caller's contract.
    unsafe { near_from(arr, hash as usize & arr.mask(), 0, FAST_PROBES, key) }
}

/// [`near`] past the key's first cell, `first`, which the walk passes
/// over, to the end of the key's cluster (at most once around `arr`)
/// rather than [`FAST_PROBES`] cells: out of line, for a fast path that
/// tried the first cell itself. A row in a long cluster, which a fuller
/// array has more of, is debited where the walk would find it, without the
/// walk: its setup, its second pass over the same cells and its share of
/// the table's work cost about a thousand instructions. `None` where the
/// walk decides, as for [`near`].
///
/// # Safety
/// As [`near`].
#[cfg(not(pace_mutant = "deep_probe_any_row"))]
#[inline]
unsafe fn near_after<P: Probe>(arr: &Array, first: usize, key: &P) -> Option<Near> {
    // SAFETY: the caller's contract.
    unsafe { near_from(arr, first, 1, arr.cells.len(), key) }
}

/// Known-wrong variant `deep_probe_any_row`: past the first
/// [`FAST_PROBES`] cells, any live row is taken for the key's.
///
/// # Safety
/// As [`near`].
#[cfg(pace_mutant = "deep_probe_any_row")]
#[inline(never)]
unsafe fn near_after<P: Probe>(arr: &Array, first: usize, key: &P) -> Option<Near> {
    // SAFETY: the caller's contract.
    let near = unsafe { near_from(arr, first, 1, FAST_PROBES, key) };
    let mask = arr.mask();
    near.or_else(|| {
        (FAST_PROBES..arr.cells.len()).find_map(|i| {
            let idx = (first + i) & mask;
            let v = arr.cells[idx].load();
            cell::live(v).map(|(bits, tat)| Near { idx, v, bits, tat })
        })
    })
}

/// [`near`]'s probe of the cells `first + from .. first + to`.
///
/// # Safety
/// As [`near`].
#[inline(always)]
unsafe fn near_from<P: Probe>(
    arr: &Array,
    first: usize,
    from: usize,
    to: usize,
    key: &P,
) -> Option<Near> {
    let mask = arr.mask();
    for i in from..to {
        let idx = (first + i) & mask;
        let v = arr.cells[idx].load();
        match cell::live(v) {
            // SAFETY: `bits` is the key half of a live cell of `arr`, read
            // while the guard `key` probes with is pinned (the caller's
            // contract).
            Some((bits, tat)) if unsafe { key.matches(bits) } => {
                return Some(Near { idx, v, bits, tat })
            }
            Some(_) => {}
            None if cell::passed_over(v) => {}
            None => return None,
        }
    }
    None
}

/// The one probe sequence: linear from the hash's low bits, every cell once.
#[inline]
fn probe_seq(hash: u64, mask: usize) -> impl Iterator<Item = usize> {
    let start = hash as usize & mask;
    (0..=mask).map(move |i| (start + i) & mask)
}

/// What the table's own work along a call (copies, sweeps, resizes) needs
/// from it: the hash of a key's own bits (boxed keys keep theirs) and the
/// call's clock reading.
pub(crate) struct Cx<'a> {
    hash_of: &'a dyn Fn(u64) -> u64,
    now: u64,
    /// Whether the copies are a sweep pass's (`Cx::pass`), not a call's
    /// share: their removals are the pass's, not counted in
    /// `copy_removed`.
    pass: bool,
    /// Whether the call has copied its share of a migration already.
    copied: std::cell::Cell<bool>,
}

impl<'a> Cx<'a> {
    /// A call's own work: its share of a migration after its own row.
    pub(crate) fn new(hash_of: &'a dyn Fn(u64) -> u64, now: u64) -> Cx<'a> {
        Cx {
            hash_of,
            now,
            pass: false,
            copied: std::cell::Cell::new(false),
        }
    }

    /// A sweep pass at `now` (the rows its copies remove are full at
    /// `now`, as the rows it removes are).
    fn pass(hash_of: &'a dyn Fn(u64) -> u64, now: u64) -> Cx<'a> {
        Cx {
            pass: true,
            ..Cx::new(hash_of, now)
        }
    }

    /// The same call before its own row is done: its copies remove no row
    /// (no row is full at reading 0: a debit ends at least one interval
    /// past 0).
    fn keeping_all(&self) -> Cx<'a> {
        Cx::new(self.hash_of, 0)
    }
}

/// What a call asks of a key's row: `n` tokens under `limits` at the
/// reading `now`.
#[derive(Clone, Copy)]
pub(crate) struct Ask<'l> {
    pub(crate) limits: &'l Limits,
    pub(crate) n: u64,
    pub(crate) now: u64,
}

/// A plain debit as its refund names it: `n` tokens that moved the row's
/// settled `tat` from `prev` to `tat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spent {
    pub(crate) n: u64,
    pub(crate) tat: u64,
    pub(crate) prev: u64,
}

/// What a reserve did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Admitted {
    /// A debit's settled `tat` after the call; a hold's reading.
    pub(crate) tat: u64,
    /// A debit's settled `tat` before the call; a hold's cost.
    pub(crate) prev: u64,
    pub(crate) created: bool,
    /// A hold's lot (`held.rs`); 0 for a debit. (A ticket packed into the
    /// debit's fields keeps a plain reservation as small as it was.)
    pub(crate) lot: u64,
    /// The tokens held beside a debit when it was decided, ns (a turn's
    /// slot lies behind them; 0 for a plain row); a hold's row
    /// ([`Ticket::row`]).
    pub(crate) held: u64,
}

/// The cell a hold worked on its row's word left its row in, and the
/// field it wrote there: the cell's address (0 for none) and the field. A
/// resolution under the pin the hold was made in finds the row there
/// without a probe while the cell is in the current array and still holds
/// the hold's row with that field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spot {
    at: usize,
    field: u64,
}

impl Spot {
    pub(crate) const NONE: Spot = Spot { at: 0, field: 0 };
}

/// Where a hold worked on its row's word reports its [`Spot`]: nowhere
/// (`()`: every call but `Pace::hold_while`, compiled without it), or a
/// cell the caller reads after the reserve.
pub(crate) trait SpotSink: Copy {
    fn put(self, spot: Spot);
}

impl SpotSink for () {
    #[inline(always)]
    fn put(self, _: Spot) {}
}

impl SpotSink for &std::cell::Cell<Spot> {
    #[inline(always)]
    fn put(self, spot: Spot) {
        self.set(spot);
    }
}

impl Admitted {
    /// A hold's ticket (for the table's models).
    #[cfg(feature = "__internals")]
    pub(crate) fn ticket(&self) -> Option<Ticket> {
        Ticket::unpack(self.lot, self.prev, self.tat, self.held)
    }

    /// A hold's admission on the row whose cell's key half is `row`.
    fn of_hold(t: Ticket, created: bool, row: u64) -> Admitted {
        Admitted {
            tat: t.at,
            prev: t.cost,
            created,
            lot: t.lot,
            held: row,
        }
    }
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

/// Below this many rows, growth alone does not start a sweep pass: a pass
/// starts when the rows reach twice `max(mark, SWEEP_FLOOR)`, `mark` being
/// the rows the last pass left (`Pace::maybe_sweep`). So a table gains up to
/// `2 · SWEEP_FLOOR` rows between passes however few a pass leaves, and a
/// shrink leaves room for them ([`sized_rows`]).
pub(crate) const SWEEP_FLOOR: usize = 64;

/// The rows a shrink sizes its target for and judges sparseness by: at
/// least [`SWEEP_FLOOR`] when any row is left. A pass that removes every
/// row but a few (a working set of keys whose buckets refill between their
/// requests: every row is full at each pass) leaves a table that gains
/// `2 · SWEEP_FLOOR` rows before the next pass; sized for the few, it would
/// shrink at every pass and grow back before the next, a migration every
/// few dozen calls. An empty table still shrinks to its minimum.
#[cfg(not(pace_mutant = "shrink_below_sweep_floor"))]
#[inline]
pub(super) fn sized_rows(rows: usize) -> usize {
    if rows == 0 {
        0
    } else {
        rows.max(SWEEP_FLOOR)
    }
}

/// Known-wrong variant `shrink_below_sweep_floor`: a shrink is sized for
/// the rows the pass left alone.
#[cfg(pace_mutant = "shrink_below_sweep_floor")]
pub(super) fn sized_rows(rows: usize) -> usize {
    rows
}

/// Whether an array of `cells` cells with `rows` rows is sparse: its sized
/// rows ([`sized_rows`]) fill less than 1/16 of it, so a shrink's target (4
/// cells a sized row, `shrink_factor`) is at most a quarter of it.
#[inline]
pub(super) fn sparse(rows: usize, cells: usize) -> bool {
    sized_rows(rows).saturating_mul(16) < cells
}

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
    #[cfg(feature = "__internals")]
    key_type: std::any::TypeId,
    /// How held rows are written: the hold limit, the rounding and the
    /// inline form (`held.rs`).
    form: held::Form,
    /// Migrations started (for tests).
    migrations: AtomicUsize,
    /// Cells of the chunks copied (for tests).
    copied_cells: AtomicUsize,
    /// Full rows the copies of calls' shares of migrations removed instead
    /// of copying them (for tests and models; a pass's copies are not
    /// counted).
    copy_removed: AtomicUsize,
    /// A sweep pass ended on a sparse array that still held rows: the next
    /// insert or removal starts the shrink (`shrink_pending`).
    shrink_wanted: AtomicBool,
    /// Whether arrays of `cell::HUGE_FROM` bytes and more ask for huge
    /// pages (`Builder::huge_pages`).
    huge: bool,
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
    /// Holds take new holds into a lot for `hold_limit` ns, and the table's
    /// interval `interval` sets how held rows are written (`held::Form`).
    /// With `huge`, large arrays ask for huge pages (`cell::empty_cells`).
    pub(crate) fn try_new(
        min_cells: usize,
        kind: keys::KeyKind,
        interval: u64,
        hold_limit: u64,
        huge: bool,
    ) -> Option<Table> {
        let n = min_cells.max(MIN_CELLS).checked_next_power_of_two()?;
        let first = Array::try_new(n, 0, huge)?;
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
            #[cfg(feature = "__internals")]
            key_type: kind.key_type,
            form: held::Form::new(interval, hold_limit),
            migrations: AtomicUsize::new(0),
            copied_cells: AtomicUsize::new(0),
            copy_removed: AtomicUsize::new(0),
            shrink_wanted: AtomicBool::new(false),
            huge,
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

    /// The stripe of floors of the key with this hash whose bits in a cell
    /// are `bits` (a word-sized key's own bits; a boxed key's stripe comes
    /// from its hash alone, and `bits` are not read). Removers and creators
    /// of a key's rows compute the same stripe (`floor.rs`).
    #[inline(always)]
    pub(crate) fn stripe(&self, hash: u64, bits: u64) -> usize {
        if self.boxed.is_some() {
            Floors::of_hash(hash)
        } else {
            self.floors.of_word(bits)
        }
    }

    /// Where a fresh row of the key `probe` names, whose hash is `hash`,
    /// would start: its stripe's floor, or, for a word-sized key given as
    /// another borrowed form (whose bits this cannot make), the highest
    /// floor of any stripe, which is at least its own.
    #[inline]
    pub(crate) fn floor<P: Probe>(&self, hash: u64, probe: &P) -> u64 {
        match (self.boxed, probe.word()) {
            (None, None) => self.floors.highest(),
            (_, word) => self.floors.get(self.stripe(hash, word.unwrap_or(0))),
        }
    }

    /// The stripe of floors the key `probe` names, whose hash is `hash`,
    /// shares with other keys (for models; `None` for a word-sized key given
    /// as another borrowed form).
    #[cfg(feature = "__internals")]
    pub(crate) fn floor_stripe<P: Probe>(&self, hash: u64, probe: &P) -> Option<usize> {
        match (self.boxed, probe.word()) {
            (None, None) => None,
            (_, word) => Some(self.stripe(hash, word.unwrap_or(0))),
        }
    }

    /// Bytes held by the floors.
    pub(crate) fn floor_bytes(&self) -> usize {
        self.floors.bytes()
    }

    /// Cells of the chunks migrations have copied since the table was made.
    #[cfg(feature = "__internals")]
    pub(crate) fn copied_cells(&self) -> usize {
        self.copied_cells.load(Ordering::Relaxed)
    }

    /// Full rows the copies of calls' shares of migrations have removed
    /// instead of copying them (a pass's copies are not counted).
    #[cfg(feature = "__internals")]
    pub(crate) fn copy_removed(&self) -> usize {
        self.copy_removed.load(Ordering::Relaxed)
    }

    /// Whether a migration of the current array is running.
    #[cfg(feature = "__internals")]
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

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Migrations started since the table was made.
    #[cfg(feature = "__internals")]
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
            let bits = keys::untagged(bits);
            // SAFETY: the caller's contract; the closure frees the box once,
            // after every guard that could have read `bits` is gone.
            unsafe { guard.defer_unchecked(move || free(bits)) };
        }
    }

    /// Hands a held row's record that a CAS of a cell of `arr` replaced to
    /// the collector, as a removed row's key box (`keys.rs`): retired from
    /// the current array (or an older one), adopted by the source from a
    /// migration's target, whose source may still name it in a frozen cell.
    /// Nothing for a plain `tat`.
    ///
    /// # Safety
    /// A CAS of a cell of `arr` just replaced the `tat` field `field`, which
    /// that cell alone named among the cells a reader pinning from now on
    /// can reach; called once per replacement.
    unsafe fn drop_record(&self, arr: &Array, field: u64, guard: &Guard) {
        let Some(addr) = held::address(field) else {
            return;
        };
        match self.source_of(arr, guard) {
            Some(Some(source)) => source.adopt(addr, held::free_at),
            // SAFETY: the caller's contract; the closure frees it once,
            // after every guard that could have read `field` is gone.
            _ => unsafe { guard.defer_unchecked(move || held::free_at(addr)) },
        }
    }

    /// Replaces the live row that cell `idx` of `arr` held as `v` with the
    /// state `next`, in one CAS: the record `v` named (if any) goes to the
    /// collector ([`drop_record`](Table::drop_record)), and a record made
    /// for `next` that does not land is freed. The cell's value on failure.
    #[inline(always)]
    fn replace_row(
        &self,
        arr: &Array,
        idx: usize,
        v: u128,
        next: Held,
        guard: &Guard,
    ) -> Result<(), u128> {
        debug_assert!(cell::live(v).is_some(), "a live row's value");
        let (bits, old) = cell::live(v).unwrap_or_default();
        let field = next.publish(&self.form);
        let new = CellState::Live {
            key: bits,
            tat: field,
        }
        .encode();
        match arr.cells[idx].cas(v, new) {
            Ok(_) => {
                // SAFETY: our CAS replaced `old`, the field of that cell.
                unsafe { self.drop_record(arr, old, guard) };
                Ok(())
            }
            Err(actual) => {
                // SAFETY: the record (if any) was never published.
                unsafe { held::free(field) };
                Err(actual)
            }
        }
    }

    /// Hands the key boxes of rows that left the table to the collector as
    /// one deferred free (nothing for keys' own bits), and flushes the
    /// thread's garbage so that they come back soon.
    ///
    /// # Safety
    /// As for [`retire_key`](Table::retire_key), for each of `gone`.
    unsafe fn retire_keys(&self, gone: Vec<u64>, guard: &Guard) {
        if let (false, Some(free)) = (gone.is_empty(), self.boxed) {
            // SAFETY: the caller's contract; the closure frees each box
            // once, after every guard that could have read it is gone.
            unsafe {
                guard.defer_unchecked(move || {
                    for bits in gone {
                        free(bits);
                    }
                })
            };
            #[cfg(not(loom))]
            guard.flush();
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
    ///
    /// The key's first cells of the current array are tried here, inline
    /// ([`near`]): a live row of the key there is what the walk would
    /// return first.
    #[inline(always)]
    fn find<'g, P: Probe>(&self, hash: u64, key: &P, seal: bool, guard: &'g Guard) -> Found<'g> {
        let arr = self.array(guard);
        // SAFETY: `arr` was loaded under `guard`, which `key` probes with.
        if let Some(Near { idx, v, bits, tat }) = unsafe { near(arr, hash, key) } {
            return Found::Row {
                arr,
                idx,
                v,
                bits,
                tat,
            };
        }
        self.find_walk(hash, key, seal, guard)
    }

    /// [`find`](Table::find)'s walk.
    #[inline(never)]
    fn find_walk<'g, P: Probe>(
        &self,
        hash: u64,
        key: &P,
        seal: bool,
        guard: &'g Guard,
    ) -> Found<'g> {
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

    /// Keys of the live rows (for tests; nothing in flight): `key` gives
    /// the key of a key's own bits; boxed keys are cloned from their boxes.
    ///
    /// # Panics
    /// If the table's boxes do not hold `K`s.
    #[cfg(feature = "__internals")]
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
                owned.free_orphans();
                for c in owned.cells.iter() {
                    if let CellState::Live { key, tat } = CellState::decode(c.load()) {
                        if let Some(free) = self.boxed {
                            free(key);
                        }
                        held::free(tat);
                    }
                }
                drop(owned);
            }
        }
    }
}

/// Known-wrong variant `refund_gives_up_on_frozen`: such a refund gives up,
/// losing the tokens.
#[cfg(pace_mutant = "refund_gives_up_on_frozen")]
const fn refund_follows_copies() -> bool {
    false
}

// `__internals`: as src/pace/mod.rs's tests.
#[cfg(all(test, not(loom), feature = "__internals"))]
mod tests;
