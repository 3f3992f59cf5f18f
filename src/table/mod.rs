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
//! for full before it has been used. A held row (`held/`) is a live row
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

use crate::bucket::Limits;
use crate::sync::epoch::{Atomic, Guard, Shared};
use crate::sync::{fence, snooze, AtomicBool, AtomicUsize, Ordering};
use held::{Held, Ticket};

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
pub(crate) use refund::Undone;
mod sweep;
mod take;
pub(crate) use take::Take;
pub(crate) use take::{Debit as TakeDebit, Hold as TakeHold};
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

/// A reserve's request to the table ([`Table::reserve`]): `ask` of the
/// row of `key`, whose hash is `hash`. `reread` reads the clock again (for
/// a fresh row whose floor is ahead of the reading), `hash_of` hashes a
/// key's own bits (a migration's copies need it; boxed keys keep theirs),
/// and a hold reports the cell it left its row in to `spot`.
pub(crate) struct Reserve<'a, P, W> {
    pub(crate) ask: Ask<'a>,
    pub(crate) hash: u64,
    pub(crate) key: &'a P,
    pub(crate) reread: &'a dyn Fn() -> u64,
    pub(crate) hash_of: &'a dyn Fn(u64) -> u64,
    pub(crate) guard: &'a Guard,
    pub(crate) spot: W,
}

/// A plain debit as its refund names it: `n` tokens that moved the row's
/// settled `tat` from `prev` to `tat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spent {
    pub(crate) n: u64,
    pub(crate) tat: u64,
    pub(crate) prev: u64,
}

/// What an admitted reserve took from its key's row: each field means one
/// thing whatever the kind of call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// A debit (a reserve, a turn) that moved the row's settled `tat` from
    /// `prev` to `tat`: what its refund compares and restores.
    Debit { tat: u64, prev: u64 },
    /// A hold: its tokens held in a lot until the ticket resolves them.
    Hold(Ticket),
}

/// What a reserve did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Admitted {
    pub(crate) taken: Taken,
    /// The call made the key's row (an insert or a revival).
    pub(crate) created: bool,
    /// The tokens held beside a debit when it was decided, ns: a turn's
    /// slot lies behind them. 0 for a plain row and for a hold.
    pub(crate) beside: u64,
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
    /// A debit of a row that moved its settled `tat` from `prev` to `tat`,
    /// decided beside `beside` ns of held tokens.
    fn debit(tat: u64, prev: u64, created: bool, beside: u64) -> Admitted {
        Admitted {
            taken: Taken::Debit { tat, prev },
            created,
            beside,
        }
    }

    /// A hold's admission: its ticket.
    fn hold(t: Ticket, created: bool) -> Admitted {
        Admitted {
            taken: Taken::Hold(t),
            created,
            beside: 0,
        }
    }

    /// A hold's ticket (for the table's models).
    #[cfg(feature = "__internals")]
    pub(crate) fn ticket(&self) -> Option<Ticket> {
        match self.taken {
            Taken::Hold(t) => Some(t),
            Taken::Debit { .. } => None,
        }
    }

    /// A debit's settled `tat` after the call; a hold's reading (for the
    /// table's models and tests).
    #[cfg(any(test, feature = "__internals"))]
    pub(crate) fn end(&self) -> u64 {
        match self.taken {
            Taken::Debit { tat, .. } => tat,
            Taken::Hold(t) => t.at,
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

/// The share of the rows passes put to sleep or removed that must come
/// back for the table to keep dormant cells (`Table::returning`): one in 8.
const RETURNING_SHARE: usize = 8;

/// Or this many came back, whatever their share (`Table::returning`): the
/// marks of removed keys are few (`Floors::returned`), so a working set of
/// many thousand clients is seen by a few of its returns; a flood of new
/// keys shows none.
const RETURNING_FEW: usize = 16;

/// A pass's end grows the array for the dormant cells of returning clients
/// when, since the pass before the last began, new keys took dormant cells
/// over and at least one in this many as many cells were revived
/// (`Table::grow_for_returns`): a working set larger than the array's room
/// for its cells. A flood of keys nobody names again revives none.
const GROW_IF_REVIVED: usize = 64;

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

/// The counts behind [`Table::revived_lately`]: cells made dormant and
/// dropped (monotonic, wrapping), and `(dormant, made, dropped)` at the
/// start of the last pass and of the one before it.
///
/// These steer only policy (sizing, and whether passes put rows to sleep),
/// never a decision, so they are plain `std` atomics even under loom, whose
/// models then explore the protocol's own atomics only.
struct Dormancy {
    /// Monotonic (wrapping) counts, in the order of [`Count`]'s indices.
    counts: [std::sync::atomic::AtomicUsize; COUNTS],
    /// The dormant cells and `counts` at the start of the last pass, and
    /// of the one before it.
    last: [std::sync::atomic::AtomicUsize; COUNTS + 1],
    base: [std::sync::atomic::AtomicUsize; COUNTS + 1],
    /// Set by models and tests: [`FORCED_SLEEP`], passes always put full
    /// rows to sleep; [`FORCED_REMOVAL`], never (`Table::puts_to_sleep`);
    /// 0, the returns seen decide.
    forced: std::sync::atomic::AtomicU8,
}

/// What [`Dormancy::counts`] counts.
#[derive(Clone, Copy)]
enum Count {
    /// Cells made dormant.
    Made = 0,
    /// Dormant cells dropped or taken over.
    Dropped = 1,
    /// Dormant cells new keys took over.
    Taken = 2,
    /// Rows a pass removed (not put to sleep).
    Removed = 3,
    /// New rows of keys a pass had removed lately (`Floors::returned`).
    Returns = 4,
    /// New rows, of any key (a row about to be made; a return too).
    Created = 5,
    /// Full rows a pass left live: quiet for less than the table's
    /// `quiet` while its clients come back.
    Kept = 6,
}

const COUNTS: usize = 7;

/// The most times in a row an idle pass doubles the period of time-driven
/// passes while quiet rows stay live (`Table::pass_period`): four times
/// the retention.
const IDLE_PASSES: u32 = 2;

/// While passes leave quiet rows live, whether the new keys (`fresh`)
/// made at most one in [`RETURNING_SHARE`] as many rows as passes kept
/// (`Table::returning`).
#[cfg(not(pace_mutant = "quiet_rows_in_floods"))]
#[inline]
fn few_fresh(fresh: usize, kept: usize) -> bool {
    fresh.saturating_mul(RETURNING_SHARE) <= kept
}

/// Known-wrong variant `quiet_rows_in_floods`: while passes leave quiet
/// rows live, the table counts its clients as coming back whatever new
/// keys come.
#[cfg(pace_mutant = "quiet_rows_in_floods")]
fn few_fresh(_: usize, _: usize) -> bool {
    true
}

/// [`Dormancy::forced`]: passes always put full rows to sleep.
const FORCED_SLEEP: u8 = 1;
/// [`Dormancy::forced`]: passes never put full rows to sleep.
const FORCED_REMOVAL: u8 = 2;

impl Dormancy {
    fn new() -> Dormancy {
        Dormancy {
            counts: std::array::from_fn(|_| std::sync::atomic::AtomicUsize::new(0)),
            last: std::array::from_fn(|_| std::sync::atomic::AtomicUsize::new(0)),
            base: std::array::from_fn(|_| std::sync::atomic::AtomicUsize::new(0)),
            forced: std::sync::atomic::AtomicU8::new(0),
        }
    }

    #[inline]
    fn add(&self, c: Count, n: usize) {
        self.counts[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// How much `c` grew since the pass before the last began.
    fn lately(&self, c: Count) -> usize {
        self.grown(c, &self.base)
    }

    /// How much `c` grew since the last pass began.
    fn since_last(&self, c: Count) -> usize {
        self.grown(c, &self.last)
    }

    /// How much `c` grew since the snapshot `at` (`base` or `last`).
    fn grown(&self, c: Count, at: &[std::sync::atomic::AtomicUsize; COUNTS + 1]) -> usize {
        let i = c as usize;
        self.counts[i]
            .load(Ordering::Relaxed)
            .wrapping_sub(at[i + 1].load(Ordering::Relaxed))
    }
}

/// The table: arrays of cells, migrating chunk by chunk.
pub(crate) struct Table {
    /// The oldest array in use: the one migrating, if a migration runs.
    current: Atomic<Array>,
    /// Rows: live cells (dormant ones among them) plus claims in flight.
    len: CachePadded<AtomicUsize>,
    /// Dormant cells (DESIGN.md §4, "Dormant cells"), counted in `len` too:
    /// the rows a caller sees are `len − dormant`. Wrapping: a sweep adds
    /// the cells it made dormant after their CASes, so a revival may take
    /// one off first.
    dormant: CachePadded<AtomicUsize>,
    /// Cells made dormant and dormant cells dropped since the table was
    /// made, and the three counts at the start of the last two passes:
    /// how many dormant cells were revived since the pass before the last
    /// began (`revived_lately`).
    dormancy: Dormancy,
    /// How long a dormant cell is kept after its bucket filled (ns): a
    /// pass or a copy drops one whose kept `tat` is at least this far
    /// behind its reading (`Pace` sets it from its horizon). Policy only, as
    /// [`Dormancy`]: a `std` atomic under loom too.
    retain: std::sync::atomic::AtomicU64,
    /// While the table's clients come back, how long a full row stays a
    /// row before a pass puts it to sleep (ns; half the retention): a
    /// client that comes back within it finds its row live. Policy only,
    /// as `retain`.
    quiet: std::sync::atomic::AtomicU64,
    /// What the running pass does with full rows, set as it begins
    /// (`mark_pass_start`): 0, removes them; `quiet + 1`, leaves those that
    /// filled within `quiet` live and puts the others to sleep. Policy
    /// only, as `retain`.
    pass_mode: std::sync::atomic::AtomicU64,
    /// Passes in a row, up to the last one begun, that left quiet rows
    /// live and put nothing to sleep, removed nothing and dropped nothing
    /// ([`pass_period`](Table::pass_period)). Policy only, as `retain`.
    idle_passes: std::sync::atomic::AtomicU32,
    min_cells: usize,
    floors: Floors,
    /// How rows hold their keys: `None` for a key's own bits, else the free
    /// function of the table's key boxes (`keys.rs`).
    boxed: Option<unsafe fn(u64)>,
    /// The type the boxes hold (for the `internals` key listing).
    #[cfg(feature = "__internals")]
    key_type: std::any::TypeId,
    /// How held rows are written: the hold limit, the rounding and the
    /// inline form (`held/`).
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
            dormant: CachePadded::new(AtomicUsize::new(0)),
            dormancy: Dormancy::new(),
            retain: std::sync::atomic::AtomicU64::new(0),
            quiet: std::sync::atomic::AtomicU64::new(0),
            pass_mode: std::sync::atomic::AtomicU64::new(0),
            idle_passes: std::sync::atomic::AtomicU32::new(0),
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

    /// Cells of the current array, from the prefetch hint (a moment stale
    /// around a migration's end: only a sweep policy reads it).
    #[inline]
    pub(crate) fn cells_hint(&self) -> usize {
        #[cfg(not(loom))]
        {
            self.hint.1.load(std::sync::atomic::Ordering::Relaxed) + 1
        }
        #[cfg(loom)]
        {
            self.min_cells
        }
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

    /// Rows, dormant cells and claims in flight: what sizes arrays.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The rows a caller sees: live cells and claims in flight, not the
    /// dormant cells.
    #[inline]
    pub(crate) fn rows(&self) -> usize {
        let dormant = self.dormant.load(Ordering::Relaxed) as isize;
        self.len().saturating_sub(dormant.max(0) as usize)
    }

    /// Dormant cells (for tests and models).
    #[cfg(any(test, feature = "__internals"))]
    pub(crate) fn dormant_cells(&self) -> usize {
        self.dormant_count()
    }

    /// What the running pass does with full rows: `None`, removes them;
    /// `Some(quiet)`, leaves those that filled within `quiet` live and puts
    /// the others to sleep.
    #[inline]
    pub(super) fn pass_mode(&self) -> Option<u64> {
        self.pass_mode.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Dormant cells (the count may lag a sweep's CASes by a chunk).
    #[inline]
    fn dormant_count(&self) -> usize {
        (self.dormant.load(Ordering::Relaxed) as isize).max(0) as usize
    }

    /// Sets how long a dormant cell is kept after its bucket filled (ns),
    /// and how long a full row stays a row while clients come back (half
    /// of it: [`quiet`](Table::quiet)).
    pub(crate) fn set_retain(&self, ns: u64) {
        self.retain.store(ns, Ordering::Relaxed);
        if self.dormancy.forced.load(Ordering::Relaxed) != FORCED_SLEEP {
            self.quiet.store(ns / 2, Ordering::Relaxed);
        }
    }

    /// While the table's clients come back, how long a full row stays a
    /// row before a pass puts it to sleep (ns): a pass leaves a full row
    /// live while `tat + quiet > now`, and time-driven passes come at most
    /// once per twice `quiet` ([`pass_period`](Table::pass_period)). So a client
    /// that comes back within it pays one CAS on a live row; one that comes
    /// back later revives a dormant cell.
    #[cfg(not(pace_mutant = "no_quiet_rows"))]
    #[inline]
    pub(super) fn quiet(&self) -> u64 {
        self.quiet.load(Ordering::Relaxed)
    }

    /// Known-wrong variant `no_quiet_rows`: passes put every full row to
    /// sleep, so a working set lives in dormant cells and each visit
    /// revives one.
    #[cfg(pace_mutant = "no_quiet_rows")]
    pub(super) fn quiet(&self) -> u64 {
        0
    }

    /// The time between time-driven passes for a limiter whose horizon is
    /// `horizon`: the horizon, or, while passes put rows to sleep, at
    /// least twice [`quiet`](Table::quiet) (the retention): a pass then
    /// only puts to sleep the rows quiet for that long and drops the
    /// dormant cells past their retention, and a pass over a working set's
    /// live rows is a scan of the whole array that no row needs sooner.
    ///
    /// Each pass of that kind in a row that put nothing to sleep and
    /// removed nothing doubles the period, up to [`IDLE_PASSES`] times: a
    /// working set that all comes back is scanned once per four retentions
    /// (a scan of the whole array, spread over calls as chunks), and a
    /// client that leaves has its row put to sleep within that time, then
    /// dropped after the retention.
    pub(crate) fn pass_period(&self, horizon: u64) -> u64 {
        if self.puts_to_sleep() {
            let idle = self.idle_passes.load(Ordering::Relaxed).min(IDLE_PASSES);
            horizon
                .max(self.quiet().saturating_mul(2))
                .saturating_mul(1 << idle)
        } else {
            horizon
        }
    }

    /// Whether a dormant cell that kept `tat` is past its retention at
    /// `now`: a pass or a copy at that reading drops it.
    #[inline]
    fn stale(&self, tat: u64, now: u64) -> bool {
        tat.saturating_add(self.retain.load(Ordering::Relaxed)) <= now
    }

    /// The rows a pass's shrink judges by: the rows a caller sees plus the
    /// dormant cells of the working set (clients that come back between
    /// their buckets' refills are rows of the table's working set, not a
    /// flood's leftovers).
    pub(super) fn pass_rows(&self) -> usize {
        self.rows().saturating_add(self.working_dormant())
    }

    /// The dormant cells a table's working set holds: all of them while
    /// its clients come back ([`returning`](Table::returning)), none
    /// otherwise (a flood's leftovers, which a shrink drops).
    pub(super) fn working_dormant(&self) -> usize {
        if self.returning() {
            self.dormant_count()
        } else {
            0
        }
    }

    /// Dormant cells revived since the pass before the last began.
    pub(super) fn revived_lately(&self) -> usize {
        let d = &self.dormancy;
        let base = d.base[0].load(Ordering::Relaxed);
        let made = d.lately(Count::Made);
        let dropped = d.lately(Count::Dropped);
        let now = self.dormant.load(Ordering::Relaxed);
        (base
            .wrapping_add(made)
            .wrapping_sub(dropped)
            .wrapping_sub(now) as isize)
            .max(0) as usize
    }

    /// A pass begins: it decides what it does with full rows (`pass_mode`,
    /// the same for all its chunks), and the counts at the start of the
    /// previous one become the base of the `lately` counts.
    pub(super) fn mark_pass_start(&self) {
        let d = &self.dormancy;
        // Whether the pass that began last, if it left quiet rows live,
        // changed nothing (read before `last` moves on).
        let idle = self.pass_mode.load(Ordering::Relaxed) > 1
            && d.since_last(Count::Made) == 0
            && d.since_last(Count::Removed) == 0
            && d.since_last(Count::Dropped) == 0;
        if idle {
            self.idle_passes.fetch_add(1, Ordering::Relaxed);
        } else {
            self.idle_passes.store(0, Ordering::Relaxed);
        }
        let mode = if self.puts_to_sleep() {
            self.quiet().saturating_add(1)
        } else {
            0
        };
        self.pass_mode.store(mode, Ordering::Relaxed);
        for i in 0..=COUNTS {
            d.base[i].store(d.last[i].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        d.last[0].store(self.dormant.load(Ordering::Relaxed), Ordering::Relaxed);
        for i in 0..COUNTS {
            d.last[i + 1].store(d.counts[i].load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Dormant cells new keys took over since the pass before the last
    /// began.
    pub(super) fn taken_lately(&self) -> usize {
        self.dormancy.lately(Count::Taken)
    }

    /// Rows whose clients came back since the pass before the last began:
    /// revived, or made anew by a key whose row or dormant cell went lately.
    pub(super) fn back_lately(&self) -> usize {
        self.revived_lately()
            .saturating_add(self.dormancy.lately(Count::Returns))
    }

    /// Whether the table's clients come back after their buckets refill, so
    /// that a pass puts full rows to sleep rather than removing them: since
    /// the pass before the last began, at least one in [`RETURNING_SHARE`]
    /// of the rows passes put to sleep or removed came back, or at least
    /// [`RETURNING_FEW`] (revived, or made anew by a key a pass had removed:
    /// `Floors::returned`). A flood of keys nobody names again comes back
    /// to none: its rows are removed as full rows always were.
    ///
    /// Either way, new keys (rows made by keys not found among the marks)
    /// must be at most [`RETURNING_SHARE`] times as many: a flood beside
    /// returning clients makes more. While passes leave quiet full rows
    /// live, a returning client's call finds its row and shows nothing: the
    /// table stays returning while passes kept full rows lately and new
    /// keys made at most one in [`RETURNING_SHARE`] as many rows (a flood
    /// of new keys makes more, and its rows double the count, which starts
    /// a pass that removes them).
    pub(super) fn returning(&self) -> bool {
        let d = &self.dormancy;
        let back = self.back_lately();
        let gone = d
            .lately(Count::Made)
            .saturating_add(d.lately(Count::Removed));
        let kept = d.lately(Count::Kept);
        let fresh = d
            .lately(Count::Created)
            .saturating_sub(d.lately(Count::Returns));
        let came_back =
            back >= RETURNING_FEW || (back > 0 && back.saturating_mul(RETURNING_SHARE) >= gone);
        (came_back && fresh <= back.saturating_mul(RETURNING_SHARE))
            || (kept > 0 && few_fresh(fresh, kept))
    }

    /// Whether passes put full rows to sleep: while the table's clients
    /// come back ([`returning`](Table::returning)), or always once a model
    /// or test forced it (which changes nothing else: sizing still follows
    /// the returns seen).
    #[inline]
    pub(super) fn puts_to_sleep(&self) -> bool {
        match self.dormancy.forced.load(Ordering::Relaxed) {
            FORCED_SLEEP => true,
            FORCED_REMOVAL => false,
            _ => self.returning(),
        }
    }

    /// Passes put every full row to sleep, however lately it filled (for
    /// models and tests: `quiet` becomes 0).
    #[cfg(any(test, feature = "__internals"))]
    pub(crate) fn force_dormancy(&self) {
        self.dormancy.forced.store(FORCED_SLEEP, Ordering::Relaxed);
        self.quiet.store(0, Ordering::Relaxed);
    }

    /// Passes remove every full row, as if no client ever came back (for
    /// models that predict `len` from the rows full at each pass).
    #[cfg(any(test, feature = "__internals"))]
    pub(crate) fn force_removal(&self) {
        self.dormancy
            .forced
            .store(FORCED_REMOVAL, Ordering::Relaxed);
    }

    /// A new row of the key whose hash is `hash` and whose bits are `bits`
    /// (a word key's; unread for a boxed key) is about to be made: counted
    /// as a return if a pass removed the key's row lately.
    #[inline]
    pub(super) fn note_new_row(&self, hash: u64, bits: u64) {
        self.dormancy.add(Count::Created, 1);
        if self
            .floors
            .returned(self.floors.mark(self.boxed.is_some(), hash, bits))
        {
            self.dormancy.add(Count::Returns, floor::SAMPLE);
        }
    }

    /// A new key took a dormant cell over.
    #[inline]
    fn count_take_over(&self) {
        self.dormancy.add(Count::Taken, 1);
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
    /// panic for such tables: the builder's `hasher_cannot_panic`).
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
        let revival = held::dormant(old);
        if revival.is_some() && !self.enter_revival(arr, guard) {
            // The array is migrating: the dormant cell is dropped instead
            // (its floor holds its `tat`), and the caller looks again.
            // SAFETY: `v` is the value of cell `idx` of `arr`, read under
            // `guard` (this function's callers read it so).
            unsafe { self.drop_dormant(arr, idx, v, bits, guard) };
            return Err(arr.cells[idx].load());
        }
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
                if revival.is_some() {
                    self.leave_revival();
                }
                // SAFETY: the record (if any) was never published.
                unsafe { held::free(field) };
                Err(actual)
            }
        }
    }

    /// A revival of a dormant cell of `arr` is about to be tried: it leaves
    /// the dormant count first, then checks that `arr` is not migrating
    /// (the other half of `start_migration`'s Dekker: a migration sealed
    /// before this check sees the row counted; one sealed after it is seen
    /// here). False (the count restored): `arr` is migrating, and a
    /// migration that drops dormant cells has no room for a revived row.
    #[cfg(not(pace_mutant = "revive_unsealed"))]
    #[inline]
    fn enter_revival(&self, arr: &Array, guard: &Guard) -> bool {
        self.dormant.fetch_sub(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if arr.next.load(Ordering::SeqCst, guard).is_null() {
            return true;
        }
        self.dormant.fetch_add(1, Ordering::SeqCst);
        false
    }

    /// A revival [entered](Table::enter_revival) lost its CAS: the cell is
    /// counted dormant again (or as whatever took it, which counts itself).
    #[inline]
    fn leave_revival(&self) {
        self.dormant.fetch_add(1, Ordering::SeqCst);
    }

    /// Known-wrong variant `revive_unsealed`: a revival does not look for a
    /// migration, so a row revived in an array whose migration drops
    /// dormant cells is copied into a target sized without it.
    #[cfg(pace_mutant = "revive_unsealed")]
    fn enter_revival(&self, _: &Array, _: &Guard) -> bool {
        self.dormant.fetch_sub(1, Ordering::SeqCst);
        true
    }

    /// Drops the dormant cell `idx` of `arr` (value `v`, key half `bits`):
    /// the cell a tombstone. Its key's floor is at least `tat`
    /// already (the pass that put it to sleep raised it first, and floors
    /// never fall), so the key's next row starts where a revival would
    /// have. True if this call dropped it (false: the cell changed first).
    ///
    /// # Safety
    /// `v` was read under `guard` from cell `idx` of `arr`, an array of
    /// this table reached under `guard`, and is a dormant cell's value.
    unsafe fn drop_dormant(
        &self,
        arr: &Array,
        idx: usize,
        v: u128,
        bits: u64,
        guard: &Guard,
    ) -> bool {
        if arr.cells[idx].cas(v, CellState::Tomb.encode()).is_err() {
            return false;
        }
        // SAFETY: our CAS made the dormant cell a tombstone.
        unsafe { self.dormant_taken(arr, bits, guard) };
        self.clean_after(arr, idx, guard);
        true
    }

    /// Drops the dormant cells among cells `start..end` of `arr` (the
    /// current array, not migrating): each a tombstone, its key's floor
    /// raised first. Returns how many.
    fn drop_dormant_range(&self, arr: &Array, start: usize, end: usize, guard: &Guard) -> usize {
        let mut dropped = 0;
        for idx in start..end {
            let v = arr.cells[idx].load();
            if let Some((bits, field)) = cell::live(v) {
                if held::dormant(field).is_some() {
                    // SAFETY: `v` was read under `guard` from cell `idx` of
                    // `arr`, and is a dormant cell's.
                    dropped += usize::from(unsafe { self.drop_dormant(arr, idx, v, bits, guard) });
                }
            }
        }
        dropped
    }

    /// What follows a CAS that took a dormant cell of `arr` (key half
    /// `bits`) away, by a drop or an insert's take-over: the counts, and the
    /// key box retired (adopted by the source when `arr` is a migration's
    /// target).
    ///
    /// # Safety
    /// The caller's CAS just replaced that dormant cell, of an array of
    /// this table reached under `guard`, with a state that does not name
    /// its box.
    unsafe fn dormant_taken(&self, arr: &Array, bits: u64, guard: &Guard) {
        // Its key's next row counts as a return (`returning`).
        let hash = if self.boxed.is_some() {
            // SAFETY: the caller's contract: `bits` named a live box of
            // this table when read under `guard`, which is still pinned.
            unsafe { keys::hash_in_box(bits, guard) }
        } else {
            0
        };
        self.floors
            .remember(self.floors.mark(self.boxed.is_some(), hash, bits));
        self.dormant.fetch_sub(1, Ordering::SeqCst);
        self.dormancy.add(Count::Dropped, 1);
        self.len.fetch_sub(1, Ordering::SeqCst);
        // SAFETY: the caller's contract.
        unsafe { self.release_key(arr, bits, guard) };
    }

    /// Hands the key box of a row or dormant cell that a CAS of the caller
    /// took out of `arr` (key half `bits`) to its one owner: the source of
    /// a migration whose target `arr` is (the source may still name it as
    /// moved: `keys.rs`), else the collector.
    ///
    /// # Safety
    /// The caller's CAS just replaced that cell of `arr` (the current array
    /// or its migration's target, reached under `guard`) with a state that
    /// does not name the box; called once per such CAS.
    unsafe fn release_key(&self, arr: &Array, bits: u64, guard: &Guard) {
        match self.source_of(arr, guard) {
            Some(Some(source)) => {
                if let Some(free) = self.boxed {
                    source.adopt(keys::untagged(bits), free);
                }
            }
            // SAFETY: the cell left an array that is current now or was
            // before (the arrays older than it were unpublished before this
            // check, so every reader that can still reach them pinned before
            // it), and no longer names the box; only the one whose CAS took
            // the cell out retires it.
            _ => unsafe { self.retire_key(bits, guard) },
        }
    }

    /// The floors' stripe of the key of a cell (key half `bits`): from the
    /// hash its box keeps, or from a word key's own bits (`floor.rs`).
    ///
    /// # Safety
    /// `bits` is the key half of a live cell read under `guard`.
    #[inline]
    unsafe fn stripe_of_row(&self, bits: u64, guard: &Guard) -> usize {
        if self.boxed.is_some() {
            // SAFETY: this function's contract.
            Floors::of_hash(unsafe { keys::hash_in_box(bits, guard) })
        } else {
            self.floors.of_word(bits)
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
            // The first tombstone the walk passes, else the first dormant
            // cell of another key: where an insert claims (a dormant cell
            // is taken over only where no tombstone is).
            let mut tomb = None;
            let mut asleep = None;
            for idx in probe_seq(hash, arr.mask()) {
                loop {
                    let v = arr.cells[idx].load();
                    match CellState::decode(v) {
                        CellState::Empty | CellState::Fence => {
                            if !is_migrating(arr.next.load(Ordering::SeqCst, guard)) {
                                return Found::Absent {
                                    arr,
                                    empty: idx,
                                    tomb: tomb.or(asleep),
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
                        CellState::Live { tat, .. }
                            if asleep.is_none() && held::dormant(tat).is_some() =>
                        {
                            asleep = Some((idx, v)); // another key's dormant cell
                        }
                        _ => {} // other keys, claims, closed tombstones
                    }
                    break;
                }
            }
            if !is_migrating(arr.next.load(Ordering::Acquire, guard)) {
                return Found::Full {
                    arr,
                    tomb: tomb.or(asleep),
                };
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
                CellState::Live { tat, .. } | CellState::FrozenLive { tat, .. }
                    if held::dormant(tat).is_some() =>
                {
                    None
                }
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

// `__internals`: as src/pace/mod.rs's tests.
#[cfg(all(test, not(loom), feature = "__internals"))]
mod tests;
