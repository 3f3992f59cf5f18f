//! Internals for models, fuzz targets and benchmarks (feature `__internals`,
//! off by default). Not a stable API: anything here may change in any
//! release.
//!
//! What is here: explicit-time entry points and state probes of [`Pace`]
//! ([`PaceInternals`], [`ReservationInternals`]); the table's chunk sizes
//! and its deferred frees, so tests can measure what is really held; the
//! table on its own, holding `u64` keys as their own bits ([`CellsModel`],
//! for loom models); and the bucket rule on plain integers ([`BucketMath`],
//! for baseline limiters in benchmarks and exact models). With the feature
//! on, [`Builder`] and [`Pace`] also have a few methods of the same kind
//! (`Builder::boxed_keys`, `Builder::inline_keys_any_hasher`,
//! `Pace::table_slots`, `Pace::table_bytes`, `Pace::entry_bytes`).
//!
//! [`Pace`]: crate::Pace
//! [`Builder`]: crate::Builder

pub use crate::pace::{PaceInternals, ReservationInternals};
use crate::table::keys::Bits;

/// Cells per chunk of an incremental sweep pass over a table of `n`
/// cells: the pass takes `n.div_ceil(sweep_chunk(n))` calls
/// (tests/memory.rs).
pub fn sweep_chunk(n: usize) -> usize {
    crate::table::sweep_chunk(n)
}

/// Cells per chunk of a migration: a migration from an array of `n`
/// cells takes at most `n.div_ceil(MIGRATION_CHUNK)` calls.
pub const MIGRATION_CHUNK: usize = crate::table::CHUNK;

/// The most cells of a migration one call copies (whole chunks).
pub const MIGRATION_CALL_CELLS: usize = crate::table::CALL_CELLS;

/// Sleeps taken by callers waiting for a turn (`Pace::acquire`,
/// `Pace::acquire_blocking`) in this process so far.
pub fn turn_sleeps() -> u64 {
    crate::pace::turn_sleeps()
}

/// Sleeps taken by callers waiting for a turn on this thread so far: read
/// around each poll of a turn's future, the sleeps of that one turn.
pub fn turn_sleeps_here() -> u64 {
    crate::pace::turn_sleeps_here()
}

/// Pins and flushes the current thread's epoch handle until deferred
/// frees have run, so memory tests can measure what is really held.
#[cfg(not(loom))]
pub fn collect_garbage() {
    // Each flush frees a bounded number of garbage bags; a million
    // retired rows fill tens of thousands of them.
    for _ in 0..(1 << 17) {
        crossbeam_epoch::pin().flush();
    }
    // Large slot arrays are freed on threads of their own: wait for them.
    while frees_in_flight() > 0 {
        std::thread::yield_now();
    }
}

/// Large retired slot arrays whose free is running on a thread of its
/// own (always 0 under Miri and loom, which free at once).
pub fn frees_in_flight() -> usize {
    #[cfg(not(any(loom, miri)))]
    {
        crate::table::FREES_IN_FLIGHT.load(std::sync::atomic::Ordering::Acquire)
    }
    #[cfg(any(loom, miri))]
    {
        0
    }
}

/// The table holding `u64` keys as their own bits (DESIGN.md §2), with the
/// hash of key `k` equal to `k`, for loom models.
pub struct CellsModel {
    table: crate::table::Table,
    limits: crate::bucket::Limits,
    epochs: crate::sync::Epochs,
}

/// A hold's ticket in a [`CellsModel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelTicket(crate::table::held::Ticket);

impl CellsModel {
    /// At least `cells` cells; buckets of `capacity` tokens, one per
    /// `interval`.
    pub fn new(cells: usize, interval: u64, capacity: u64) -> CellsModel {
        CellsModel::with_hold_limit(cells, interval, capacity, crate::bucket::MAX_TIME)
    }

    /// [`new`](CellsModel::new) with holds whose lots take new holds for
    /// `hold_limit` ns (expiring after twice that).
    pub fn with_hold_limit(
        cells: usize,
        interval: u64,
        capacity: u64,
        hold_limit: u64,
    ) -> CellsModel {
        CellsModel {
            table: crate::table::Table::try_new(
                cells,
                crate::table::keys::inline(),
                interval,
                hold_limit,
                false,
            )
            .expect("cells fit an array"),
            limits: crate::bucket::Limits::new(interval, capacity).expect("valid bucket"),
            epochs: crate::sync::Epochs::new(),
        }
    }

    fn ask(&self, n: u64, now: u64) -> crate::table::Ask<'_> {
        crate::table::Ask {
            limits: &self.limits,
            n,
            now,
        }
    }

    /// Debits one token of `key` at `now`: the new `tat`, or `None`.
    pub fn reserve(&self, key: u64, now: u64) -> Option<u64> {
        let guard = self.epochs.pin();
        self.table
            .reserve::<_, crate::table::TakeDebit, _>(crate::table::Reserve {
                ask: self.ask(1, now),
                hash: key,
                key: &Bits(key),
                reread: &|| now,
                hash_of: &|k| k,
                guard: &guard,
                spot: (),
            })
            .ok()
            .map(|a| a.end())
    }

    /// Debits `n` tokens of `key` (whose hash is `hash`; `hash_of` gives
    /// any key's) at `now`: the new `tat`, or `None` (for benchmarks).
    #[inline]
    pub fn reserve_hashed(
        &self,
        key: u64,
        hash: u64,
        n: u64,
        now: u64,
        hash_of: &dyn Fn(u64) -> u64,
    ) -> Option<u64> {
        let guard = self.epochs.pin();
        self.table
            .reserve::<_, crate::table::TakeDebit, _>(crate::table::Reserve {
                ask: self.ask(n, now),
                hash,
                key: &Bits(key),
                reread: &|| now,
                hash_of,
                guard: &guard,
                spot: (),
            })
            .ok()
            .map(|a| a.end())
    }

    /// Refunds one token of `key` that moved it from `prev` to `tat`.
    pub fn refund(&self, key: u64, tat: u64, prev: u64, now: u64) -> crate::Refunded {
        let guard = self.epochs.pin();
        let spent = crate::table::Spent { n: 1, tat, prev };
        let cx = &crate::table::Cx::new(&|k| k, now);
        self.table
            .refund(&self.limits, key, &Bits(key), spent, cx, &guard)
            .into()
    }

    /// Removes the rows full at `now`; how many.
    pub fn sweep(&self, now: u64) -> usize {
        self.table.sweep(now, &|k| k, &self.epochs.pin())
    }

    /// From now on, passes put full rows to sleep (dormant cells) whether
    /// or not the keys come back (`Pace`'s passes do so once they do), and
    /// keep them however long ago they filled.
    pub fn put_to_sleep(&self) {
        self.table.force_dormancy();
        self.table.set_retain(u64::MAX); // (no dormant cell goes stale)
    }

    /// A whole automatic sweep pass at `now`, as calls run it: full rows go
    /// dormant (after [`put_to_sleep`](CellsModel::put_to_sleep)).
    pub fn pass(&self, now: u64) {
        let guard = self.epochs.pin();
        self.table.start_sweep(now, &|k| k, &guard);
        while self.table.pass_running(&guard) {
            self.table.sweep_step(now, &|k| k, &guard);
        }
    }

    /// Dormant cells.
    pub fn dormant(&self) -> usize {
        self.table.dormant_cells()
    }

    /// The settled `tat` of `key`'s row.
    pub fn peek(&self, key: u64) -> Option<u64> {
        self.held(key).map(|(tat, _)| tat)
    }

    /// The settled `tat` of `key`'s row and the tokens it holds (ns).
    pub fn held(&self, key: u64) -> Option<(u64, u64)> {
        self.table
            .peek(key, &Bits(key), None, &self.epochs.pin())
            .map(|s| (s.tat, s.held()))
    }

    /// Holds one token of `key` at `now` (`Pace::hold`): its ticket, or
    /// `None` if denied.
    pub fn hold(&self, key: u64, now: u64) -> Option<ModelTicket> {
        self.hold_n(key, 1, now)
    }

    /// Holds `n` tokens of `key` at `now` (`Pace::hold_n`).
    pub fn hold_n(&self, key: u64, n: u64, now: u64) -> Option<ModelTicket> {
        self.hold_in(key, n, now, &self.epochs.pin(), ())
            .map(ModelTicket)
    }

    /// `Pace::hold_while` on the table: holds `n` tokens of `key` at `now`,
    /// runs `between` with the epoch still pinned, then keeps (`keep`) or
    /// refunds the hold at the hold's reading in the same pin: at the cell
    /// the hold left its row in when nothing changed it
    /// (`Table::resolve_spot`), else as [`resolve`](Self::resolve) does.
    /// `None` when the hold is denied (`between` does not run); else
    /// whether the resolution found its lot.
    pub fn hold_while(
        &self,
        key: u64,
        n: u64,
        now: u64,
        keep: bool,
        between: impl FnOnce(),
    ) -> Option<bool> {
        let guard = self.epochs.pin();
        let spot = std::cell::Cell::new(crate::table::Spot::NONE);
        let ticket = self.hold_in(key, n, now, &guard, &spot)?;
        between();
        let spotted = self
            .table
            .resolve_spot(spot.get(), ticket, keep, ticket.at, &guard);
        Some(spotted.unwrap_or_else(|| self.resolve_in(key, ticket, keep, ticket.at, &guard)))
    }

    /// Keeps (`keep`) or refunds a hold of `key` at `now`: false if its lot
    /// had expired.
    pub fn resolve(&self, key: u64, ticket: ModelTicket, keep: bool, now: u64) -> bool {
        self.resolve_in(key, ticket.0, keep, now, &self.epochs.pin())
    }

    /// A hold of `n` tokens of `key` at `now` under `guard`, its cell
    /// reported to `spot`: its ticket, or `None` if denied.
    fn hold_in<W: crate::table::SpotSink>(
        &self,
        key: u64,
        n: u64,
        now: u64,
        guard: &crate::sync::epoch::Guard,
        spot: W,
    ) -> Option<crate::table::held::Ticket> {
        self.table
            .reserve::<_, crate::table::TakeHold, W>(crate::table::Reserve {
                ask: self.ask(n, now),
                hash: key,
                key: &Bits(key),
                reread: &|| now,
                hash_of: &|k| k,
                guard,
                spot,
            })
            .ok()
            .and_then(|a| a.ticket())
    }

    /// [`resolve`](Self::resolve) under `guard`, by the lookup.
    fn resolve_in(
        &self,
        key: u64,
        ticket: crate::table::held::Ticket,
        keep: bool,
        now: u64,
        guard: &crate::sync::epoch::Guard,
    ) -> bool {
        let cx = &crate::table::Cx::new(&|k| k, now);
        self.table.resolve(key, &Bits(key), ticket, keep, cx, guard)
    }

    /// Keys of the live rows, sorted.
    pub fn live_keys(&self) -> Vec<u64> {
        let mut k = self.table.live_keys(&|k| k, &self.epochs.pin());
        k.sort_unstable();
        k
    }

    /// Cells of the array new rows go to.
    pub fn cells(&self) -> usize {
        self.table.cells(&self.epochs.pin())
    }

    /// Rows counted.
    pub fn len(&self) -> usize {
        self.table.rows()
    }

    /// Whether no row is counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The bucket rule (`src/bucket.rs`) on plain integers, so that baseline
/// limiters in benchmarks and exact models can share the crate's math.
#[derive(Clone, Copy, Debug)]
pub struct BucketMath(crate::bucket::Limits);

impl BucketMath {
    /// `capacity` tokens refilled one per `interval_ns`; `None` when
    /// either is zero or their product does not fit the time space.
    pub fn new(interval_ns: u64, capacity: u64) -> Option<BucketMath> {
        crate::bucket::Limits::new(interval_ns, capacity).map(BucketMath)
    }

    /// Debits `n` tokens from bucket state `tat` at `now`: `Ok(new_tat)`,
    /// or `Err(wait_ns)` (`u64::MAX` when never admissible).
    #[inline]
    pub fn reserve(&self, tat: u64, now: u64, n: u64) -> Result<u64, u64> {
        use crate::bucket::Decision;
        match self.0.reserve(tat, now, n) {
            Decision::Admit(t) => Ok(t),
            Decision::Wait(w) | Decision::Held(w) => Err(w),
            Decision::Never | Decision::TimeExhausted => Err(u64::MAX),
        }
    }

    /// Whole tokens in bucket `tat` at `now`.
    pub fn tokens(&self, tat: u64, now: u64) -> u64 {
        self.0.tokens(tat, now)
    }
}
