//! The keyed limiter: the table, the bucket rule and the sweep policy.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::bucket::{Decision, Limits};
use crate::clock::{Clock, DefaultClock};
use crate::hasher::{self, Sip};
use crate::rate::{Quota, Rate};
use crate::sync::epoch::Guard;
use crate::sync::{AtomicU64, AtomicUsize, Epochs, Ordering};
use crate::table::keys;
use crate::table::quota::QuotaCell;
use crate::table::words::WordKey;
use crate::table::{Admitted, Ask, Reserve, Spot, Table, Taken, SWEEP_FLOOR};

/// Runs `f` on each item, the work of a `Drop` (or of a way out) that calls
/// keys' `Hash` or `Eq`: each runs whatever an earlier one did, a panic of
/// one is caught, and the first is resumed once all ran, unless the thread
/// is unwinding already (a panic escaping a destructor during unwinding
/// aborts the process). What a panicking key leaves undone stays as it
/// leaves it: counts exact (`tests/seams.rs`).
pub(crate) fn each_in_drop<T>(items: impl IntoIterator<Item = T>, mut f: impl FnMut(T)) {
    let mut first = None;
    for item in items {
        if let Err(p) = catch_in_drop(|| f(item)) {
            first.get_or_insert(p);
        }
    }
    if let Some(p) = first {
        if !std::thread::panicking() {
            std::panic::resume_unwind(p);
        }
    }
}

/// `f` with its panic caught (`each_in_drop`).
#[cfg(not(pace_mutant = "drop_panics_while_unwinding"))]
fn catch_in_drop(f: impl FnOnce()) -> std::thread::Result<()> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
}

/// Known-wrong variant `drop_panics_while_unwinding`: a key's panic in a
/// `Drop` escapes it, also while the thread unwinds (the process aborts).
#[cfg(pace_mutant = "drop_panics_while_unwinding")]
fn catch_in_drop(f: impl FnOnce()) -> std::thread::Result<()> {
    f();
    Ok(())
}

/// Default smallest slot array: the table shrinks back to this.
const DEFAULT_MIN_SLOTS: usize = 64;
/// The shortest time between two time-driven sweeps.
const MIN_HORIZON_NS: u64 = 1_000_000;

/// Horizons a dormant cell is kept after its bucket filled (DESIGN.md §4,
/// "Dormant cells"), and at least [`RETAIN_MIN_NS`]: a client that comes
/// back within them is revived with one CAS, its key not made or hashed
/// into a new row again. (Kept only while clients come back to dormant
/// cells: otherwise the next shrink drops them, and new keys take them
/// over.)
const RETAIN_HORIZONS: u64 = 4;

/// The shortest retention of a dormant cell: 1 s.
const RETAIN_MIN_NS: u64 = 1_000_000_000;

/// How long a dormant cell is kept under a default quota of `horizon` ns.
pub(crate) fn retention(horizon: u64) -> u64 {
    horizon.saturating_mul(RETAIN_HORIZONS).max(RETAIN_MIN_NS)
}

/// A lock-free keyed pace limiter: one token bucket per key.
///
/// Each key gets a bucket holding (by default) one second of the declared
/// rate, refilled continuously. [`reserve`](Pace::reserve) debits and decides
/// in one atomic step; the caller [`refund`](Reservation::refund)s a
/// reservation when the exchange did not happen. A full bucket is the same as
/// no bucket, so rows that refilled are removed and memory follows the keys
/// that exchanged within the last horizon (while clients come back after
/// their buckets refill, within a few: DESIGN.md §4), not the keys anyone
/// named.
///
/// The limit is per process: N replicas behind a balancer give a client up
/// to N times the rate.
///
/// ```
/// use pace::{Pace, Rate};
///
/// let pace: Pace<String> = Pace::new(Rate::per_second(2)?);
/// let _first = pace.reserve("client-7").expect("a fresh key is full");
/// let second = pace.reserve("client-7").expect("capacity is 2");
/// let denied = pace.reserve("client-7").unwrap_err();
/// assert!(denied.retry_after() > std::time::Duration::ZERO);
/// second.refund(); // that exchange did not happen after all: undone
/// assert!(pace.reserve("client-7").is_ok());
/// # Ok::<(), pace::ConfigError>(())
/// ```
#[doc(
    alias = "RateLimiter",
    alias = "DefaultKeyedRateLimiter",
    alias = "KeyedRateLimiter",
    alias = "governor"
)]
pub struct Pace<K, S = RandomState, C = DefaultClock> {
    rows: Rows<K>,
    /// The default quota: what `reserve` decides with.
    quota: QuotaCell,
    hasher: S,
    /// The SipHash-1-3 key keys are hashed under when `hasher` is std's
    /// `RandomState` (`hasher.rs`).
    sip: Sip,
    clock: C,
    /// The time between time-driven sweep passes: the default quota's
    /// horizon (at least `MIN_HORIZON_NS`).
    horizon: AtomicU64,
    /// How far ahead `next_sweep` was set when it was set last: the
    /// horizon, or longer while passes leave quiet rows live
    /// (`Table::pass_period`). A due time further ahead than this means the
    /// clock stepped back.
    sweep_span: AtomicU64,
    /// When the next time-driven sweep is due (ns on the clock).
    next_sweep: CachePadded<AtomicU64>,
    /// Rows at the start of the last pass, or left by it if fewer; a sweep
    /// also runs when `len` doubles it.
    sweep_mark: AtomicUsize,
    epochs: Epochs,
    /// This limiter's identity, carried by every [`Debit`] it hands out so
    /// that a debit refunded to another limiter returns nothing.
    id: u64,
}

/// The identities of limiters: each `build` takes the next one. (A plain std
/// atomic: it orders nothing, so loom need not model it.)
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A limiter's rows: one table of 16-byte cells for every key type
/// (DESIGN.md §2). A cell's key half holds a word-sized key's (`u64`, `i32`,
/// `char`, `Ipv4Addr`, …) own bits when the hasher is std's `RandomState`
/// (the default), `BuildHasherDefault<DefaultHasher>` or `FastHasher`; any
/// other key, or any other hasher, is boxed with its hash.
struct Rows<K> {
    table: Table,
    /// `Some` when cells hold the keys' own bits, `None` when keys are
    /// boxed.
    word: Option<WordKey<K>>,
    _owns: keys::Owns<K>,
}

/// How a builder stores word-sized keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Only `ByType` is built without the `__internals` feature.
#[cfg_attr(not(feature = "__internals"), allow(dead_code))]
enum RowsPick {
    /// Their own bits when the hasher is one whose hash of an integer
    /// cannot panic (`builder::hasher_cannot_panic`), else boxed.
    ByType,
    /// Boxed (`Builder::boxed_keys`).
    Boxed,
    /// Their own bits whatever the hasher (`Builder::inline_keys_any_hasher`).
    InlineAnyHasher,
}

/// Runs `$body` with `$p` bound to the probe of `$key` (hash `$hash`) in
/// `$rows` under `$guard`: its own bits, a borrowed form of a word key, or
/// a boxed key. (A macro: each arm's probe is a different type.)
macro_rules! with_probe {
    ($rows:expr, $key:expr, $hash:expr, $guard:expr, |$p:ident| $body:expr) => {
        match $rows.word {
            Some(word) => match word.bits_of($key) {
                Some(bits) => {
                    let $p = &$crate::table::keys::Bits(bits);
                    $body
                }
                None => {
                    let $p = &$crate::table::words::Borrowed { word, key: $key };
                    $body
                }
            },
            None => {
                let $p = &$crate::table::keys::Boxed::<K, _>::new($key, $hash, $guard);
                $body
            }
        }
    };
}

/// What a limiter's table holds, from [`Pace::memory`]. Bytes are those
/// requested from the allocator (its own per-allocation overhead excluded),
/// not counting what keys own on the heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Cells (16 bytes each) of the array new rows go to.
    pub slots: usize,
    /// Bytes of the cell arrays in use: the current one and, while a
    /// migration runs, its target.
    pub array_bytes: usize,
    /// Bytes of the rows' key boxes: `rows` x the bytes of one box when
    /// keys are boxed, 0 when cells hold the keys' own bits (DESIGN.md §2).
    pub entry_bytes: usize,
    /// Bytes of the floors (a fixed array per limiter).
    pub floor_bytes: usize,
    /// Rows held.
    pub rows: usize,
}

impl<K, S, C> Pace<K, S, C> {
    /// The default quota: what [`reserve`](Pace::reserve) decides with.
    pub fn quota(&self) -> Quota {
        *self.quota.load(&self.pin())
    }

    /// Replaces the default quota while the limiter runs, without a lock:
    /// each reserve decides with the quota it loaded, the old or the new one,
    /// never a mix. No key's debt is lost or reset: a row stores only the
    /// time its bucket is full again, whichever quota debited it. Sweep
    /// passes follow the new quota's horizon.
    pub fn set_quota(&self, quota: Quota) {
        let horizon = quota.limits().tau().max(MIN_HORIZON_NS);
        self.horizon.store(horizon, Ordering::Relaxed);
        // A pass due further ahead than the new horizon comes at once.
        self.sweep_span.store(horizon, Ordering::Relaxed);
        self.rows.table.set_retain(retention(horizon));
        self.quota.store(quota, &self.pin());
    }

    /// The default quota's rate.
    pub fn rate(&self) -> Rate {
        self.quota().rate()
    }

    /// Tokens a bucket holds when full, under the default quota.
    pub fn capacity(&self) -> u64 {
        self.quota().capacity()
    }

    /// The time an empty bucket takes to refill under the default quota
    /// (`capacity x interval`): after this long without exchanges every row
    /// debited under it is full, hence removable.
    pub fn horizon(&self) -> Duration {
        self.quota().horizon()
    }

    /// Rows held now: keys whose bucket is not known to be full, and,
    /// while the limiter's clients come back after their buckets refill,
    /// full rows kept for them within their quiet time, `max(2 horizons,
    /// 500 ms)` after they filled (DESIGN.md §4, "Quiet rows").
    #[inline]
    pub fn len(&self) -> usize {
        self.rows.table.rows()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The hasher this limiter was built with. With std's `RandomState`,
    /// keys are hashed with the same function (SipHash-1-3) under a key
    /// drawn for the limiter at `build()` ([`Builder::hasher`]), so this
    /// hasher's own hashes of keys are not the limiter's.
    pub fn hasher(&self) -> &S {
        &self.hasher
    }

    /// What the table holds now (see [`MemoryStats`]).
    pub fn memory(&self) -> MemoryStats {
        let guard = self.pin();
        let rows = self.len();
        let t = &self.rows.table;
        MemoryStats {
            slots: t.cells(&guard),
            array_bytes: t.array_bytes(&guard),
            entry_bytes: rows * self.entry_bytes_of(),
            floor_bytes: t.floor_bytes(),
            rows,
        }
    }

    /// Slots of the array new rows go to: [`MemoryStats::slots`]. Feature
    /// `__internals`: not a stable API, for models, fuzz targets and
    /// benchmarks.
    #[cfg(feature = "__internals")]
    pub fn table_slots(&self) -> usize {
        self.memory().slots
    }

    /// Bytes of the table's slot arrays (both while a migration runs) and
    /// floors. Each row adds one entry allocation of
    /// [`entry_bytes`](Pace::entry_bytes) plus what its key owns. Feature
    /// `__internals`: not a stable API, for models, fuzz targets and
    /// benchmarks.
    #[cfg(feature = "__internals")]
    pub fn table_bytes(&self) -> usize {
        let m = self.memory();
        m.array_bytes + m.floor_bytes
    }

    /// Bytes of one row's key box (hash and key, not what the key owns on
    /// the heap) when keys are boxed; 0 when cells hold the keys' own bits.
    /// Feature `__internals`: not a stable API, for models, fuzz targets and
    /// benchmarks.
    #[cfg(feature = "__internals")]
    pub fn entry_bytes(&self) -> usize {
        self.entry_bytes_of()
    }

    fn entry_bytes_of(&self) -> usize {
        if self.rows.word.is_some() {
            0
        } else {
            keys::box_bytes::<K>()
        }
    }

    /// The hash of a word-sized key's own bits, for the table's copies and
    /// sweeps (boxed keys keep theirs: never called for them).
    #[cfg(not(pace_mutant = "std_hash_for_bits"))]
    #[inline]
    fn hash_of(&self, bits: u64) -> u64
    where
        S: BuildHasher,
        K: Hash,
    {
        match self.rows.word {
            Some(word) => self.hash_key(&word.key(bits)),
            None => 0,
        }
    }

    /// Known-wrong variant `std_hash_for_bits`: copies and sweeps hash a
    /// cell's key with the hasher itself, which is not how callers hash
    /// it when that is std's `RandomState` (`hash_key`).
    #[cfg(pace_mutant = "std_hash_for_bits")]
    fn hash_of(&self, bits: u64) -> u64
    where
        S: BuildHasher,
        K: Hash,
    {
        match self.rows.word {
            Some(word) => self.hasher.hash_one(word.key(bits)),
            None => 0,
        }
    }

    /// The hash of `key`, for every use: SipHash-1-3 under `sip` when the
    /// hasher is std's `RandomState` (the same function, taking integers
    /// whole: `hasher.rs`), the hasher's own otherwise.
    #[inline(always)]
    pub(crate) fn hash_key<Q: ?Sized + Hash>(&self, key: &Q) -> u64
    where
        S: BuildHasher,
    {
        if hasher::sip_for::<S>() {
            self.sip.hash_one(key)
        } else {
            self.hasher.hash_one(key)
        }
    }

    #[inline]
    fn pin(&self) -> Guard {
        self.epochs.pin()
    }
}

impl<K, S, C> Pace<K, S, C>
where
    K: Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    /// Debits one token from `key`'s bucket, or says when it could succeed.
    ///
    /// # Errors
    /// [`Denied`] when the bucket lacks the tokens; nothing is written then.
    #[inline]
    pub fn reserve<'a, Q>(&'a self, key: &'a Q) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.reserve_n(key, 1)
    }

    /// Debits one token from `key`'s bucket and keeps it: [`reserve`](Pace::reserve)
    /// without the [`Reservation`], for a limit nothing refunds (governor's
    /// `check_key`). The same decision and the same write; no debit to
    /// carry back, so the call is the cheapest of the limiter's.
    ///
    /// ```
    /// use pace::{Pace, Rate};
    ///
    /// let limiter: Pace<u64> = Pace::builder(Rate::per_second(10).unwrap())
    ///     .capacity(2)
    ///     .build()
    ///     .unwrap();
    /// assert!(limiter.check_key(&7).is_ok());
    /// assert!(limiter.check_key_n(&7, 1).is_ok());
    /// let denied = limiter.check_key(&7).unwrap_err();
    /// assert!(denied.retry_after() > std::time::Duration::ZERO);
    /// ```
    ///
    /// # Errors
    /// [`Denied`] as for [`reserve`](Pace::reserve).
    #[inline]
    #[doc(alias = "check")]
    pub fn check_key<Q>(&self, key: &Q) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.check_key_n(key, 1)
    }

    /// Debits `n` tokens at once, or none, and keeps them:
    /// [`reserve_n`](Pace::reserve_n) without the [`Reservation`] (see
    /// [`check_key`](Pace::check_key)).
    ///
    /// Unlike governor's `check_key_n(&k, NonZeroU32)`, `n` is a `u64` (0
    /// always passes) and the outcome one `Result`: a request above the
    /// capacity is a [`Denied`] whose [`is_permanent`](Denied::is_permanent)
    /// is true, not an `InsufficientCapacity` outside it.
    ///
    /// # Errors
    /// [`Denied`] as for [`reserve`](Pace::reserve).
    #[inline]
    #[doc(alias = "check_n")]
    pub fn check_key_n<Q>(&self, key: &Q, n: u64) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let req = call::Request {
            key,
            n: check_cost(n),
            quota: None,
            clock: || self.clock.now_ns(),
        };
        self.reserve_slot(req, call::Debit, |_, _, _, ()| ())
    }

    /// Debits `n` tokens at once, or none. `n == 0` is always admitted and
    /// touches nothing; `n > capacity` is denied permanently.
    ///
    /// # Errors
    /// [`Denied`] as for [`reserve`](Pace::reserve).
    #[inline]
    pub fn reserve_n<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.reservation_of(key, n, None, || self.clock.now_ns(), call::Debit)
    }

    /// Debits one token from `key`'s bucket under `quota` instead of the
    /// limiter's default: a key's plan or tenant limit, chosen per call.
    ///
    /// A row stores only the time its bucket is full again, so a key may be
    /// debited under different quotas: each decision admits when the key's
    /// debt after it is at most `quota`'s horizon, and each token costs
    /// `quota`'s interval. The kept admissions of a key read in any window
    /// `[t1, t2]` then cost at most `(t2 − t1) +` the largest horizon among
    /// the quotas they were decided with (DESIGN.md §3); with one quota that
    /// is `capacity + span / interval` tokens.
    ///
    /// # Errors
    /// [`Denied`] as for [`reserve`](Pace::reserve).
    #[inline]
    pub fn reserve_with<'a, Q>(
        &'a self,
        key: &'a Q,
        quota: Quota,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.reserve_n_with(key, 1, quota)
    }

    /// Debits `n` tokens at once, or none, under `quota` (see
    /// [`reserve_with`](Pace::reserve_with)). `n > quota.capacity()` is
    /// denied permanently.
    ///
    /// # Errors
    /// [`Denied`] as for [`reserve`](Pace::reserve).
    #[inline]
    pub fn reserve_n_with<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Quota,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let limits = Some(quota.limits_ref());
        self.reservation_of(key, n, limits, || self.clock.now_ns(), call::Debit)
    }

    /// Holds a token of `key` while a presentation is checked: admitted or
    /// denied as [`reserve`](Pace::reserve) decides, but the token is kept
    /// apart from the key's settled debt, so that [`Hold::refund`] returns
    /// it exactly in any order, however many other presentations of the key
    /// overlap it. Someone who names a key without its credential then
    /// holds that key's pace only while being checked, also under a flood.
    /// Keep the hold ([`Hold::keep`], or drop it) when the exchange
    /// happened. Never admits more than `reserve` would: held tokens count
    /// as debited at every decision (DESIGN.md §3, "Holds").
    #[inline]
    pub fn hold<'a, Q>(&'a self, key: &'a Q) -> Result<Hold<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.hold_n(key, 1)
    }

    /// Holds `n` tokens of `key` (see [`hold`](Pace::hold)).
    #[inline]
    pub fn hold_n<'a, Q>(&'a self, key: &'a Q, n: u64) -> Result<Hold<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let r = self.reservation_of(key, n, None, || self.clock.now_ns(), call::Hold)?;
        Ok(Hold { inner: Some(r) })
    }

    /// Holds `n` tokens of `key` under the call's own quota (see
    /// [`hold`](Pace::hold) and [`reserve_n_with`](Pace::reserve_n_with)).
    #[inline]
    pub fn hold_n_with<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Quota,
    ) -> Result<Hold<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let limits = Some(quota.limits_ref());
        let r = self.reservation_of(key, n, limits, || self.clock.now_ns(), call::Hold)?;
        Ok(Hold { inner: Some(r) })
    }

    /// Holds `n` tokens of `key` while `decide` runs, then keeps them if it
    /// returns `Ok` and refunds them exactly if it returns `Err`: a
    /// [`hold_n`](Pace::hold_n) resolved with [`Hold::keep`] or
    /// [`Hold::refund`] by what `decide` says, in one pin of the epoch for
    /// the hold, `decide` and the resolution. The resolution reads no clock
    /// (it settles from the hold's reading, as `Hold::keep` does) and looks
    /// the row up in the pin the hold found it in, so a hold cycle costs
    /// less than with [`hold_n`](Pace::hold_n). `decide` gets the hold's
    /// [`Debit`] (to look at, not to resolve: this call resolves it).
    ///
    /// For short decisions: another limit's reserve, a check of a request's
    /// fields. While `decide` runs, the thread keeps the epoch pinned, which
    /// delays the reclamation of removed rows and old arrays of every
    /// limiter; wait for nothing in it. A hold whose `decide` panics stays
    /// held until it expires, then counts as kept, as a detached hold
    /// dropped unresolved does ([`Hold::detach`]).
    ///
    /// ```
    /// use pace::{Pace, Rate};
    ///
    /// let pace: Pace<String> = Pace::builder(Rate::per_second(1).unwrap())
    ///     .capacity(2)
    ///     .build()
    ///     .unwrap();
    /// // A presentation whose credential fails gives its token back.
    /// let checked: Result<(), &str> = pace.hold_while("client-7", 1, |_| Err("bad secret")).unwrap();
    /// assert!(checked.is_err());
    /// assert_eq!(pace.peek("client-7"), 2);
    /// // One that passes keeps it.
    /// pace.hold_while("client-7", 1, |_| Ok::<(), ()>(())).unwrap().unwrap();
    /// assert_eq!(pace.peek("client-7"), 1);
    /// ```
    ///
    /// # Errors
    /// [`Denied`] as for [`hold_n`](Pace::hold_n): `decide` does not run.
    #[inline]
    pub fn hold_while<Q, T, E>(
        &self,
        key: &Q,
        n: u64,
        decide: impl FnOnce(&Debit) -> Result<T, E>,
    ) -> Result<Result<T, E>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.hold_while_inner(key, n, || self.clock.now_ns(), decide)
    }

    /// [`hold_while`](Pace::hold_while) at the reading `clock` gives.
    #[inline(always)]
    pub(crate) fn hold_while_inner<Q, T, E>(
        &self,
        key: &Q,
        n: u64,
        clock: impl Fn() -> u64,
        decide: impl FnOnce(&Debit) -> Result<T, E>,
    ) -> Result<Result<T, E>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let guard = self.pin();
        let spot = std::cell::Cell::new(Spot::NONE);
        let req = call::Request {
            key,
            n,
            quota: None,
            clock,
        };
        let kind = call::HoldPinned {
            guard: &guard,
            spot: &spot,
        };
        let debit = self.reserve_slot(req, kind, |_, _, debit, ()| debit)?;
        let out = decide(&debit);
        if debit.n > 0 {
            // Settled from the hold's reading, as `Hold::keep` does.
            let at = debit.end();
            self.resolve_pinned(key, debit, out.is_ok(), at, spot.get(), &guard);
        }
        Ok(out)
    }

    /// A hold at `now` (for models).
    #[cfg(feature = "__internals")]
    pub(crate) fn hold_n_at_inner<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        now: u64,
    ) -> Result<Hold<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let limits = quota.as_ref().map(Quota::limits_ref);
        let r = self.reservation_of(key, n, limits, || now, call::Hold)?;
        Ok(Hold { inner: Some(r) })
    }

    /// [`reserve_n`](Pace::reserve_n) (or, with a quota,
    /// [`reserve_n_with`](Pace::reserve_n_with)) at an explicit time (for
    /// models).
    #[cfg(feature = "__internals")]
    pub(crate) fn reserve_n_at_inner<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        now: u64,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let limits = quota.as_ref().map(Quota::limits_ref);
        self.reservation_of(key, n, limits, || now, call::Debit)
    }

    /// The reserve of `req`, as a call of `kind` ([`call`]): a plain debit,
    /// a hold, or a turn, which admits a debit that fits the bucket up to its
    /// wait after the reading and learns its slot (the instant its debit
    /// fits the bucket beside what is held, [`rule::slot_of`](crate::rule)).
    /// `finish` makes the answer of the debit and the slot.
    #[inline(always)]
    fn reserve_slot<'a, Q, F, R, Kd: call::Kind>(
        &'a self,
        req: call::Request<'a, '_, Q, F>,
        kind: Kd,
        finish: impl FnOnce(&'a Self, &'a Q, Debit, Kd::Slot) -> R,
    ) -> Result<R, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        F: Fn() -> u64,
    {
        let call::Request {
            key,
            n,
            quota,
            clock,
        } = req;
        if n == 0 {
            return Ok(finish(self, key, Debit::none(self.id), kind.slot(0, 0, 0)));
        }
        let hash = self.hash_key(key);
        // The key's cell is fetched while the epoch is pinned and the clock
        // read, which is why the clock is read only now.
        self.rows.table.prefetch(hash);
        let now = clock();
        let reread: &dyn Fn() -> u64 = &clock;
        let own;
        let guard = match kind.pinned() {
            Some(g) => g,
            None => {
                own = self.pin();
                &own
            }
        };
        let call_quota = quota.is_some();
        let limits = self.call_limits(quota, guard);
        if n > limits.capacity() {
            return Err(Denied::from_decision(Decision::Never));
        }
        let tau = limits.tau();
        let waiting;
        let limits = match kind.wait() {
            Some(wait) => {
                waiting = limits.waiting(wait);
                &waiting
            }
            None => limits,
        };
        let hash_of = |b| self.hash_of(b);
        let spot = kind.spot();
        let result = with_probe!(self.rows, key, hash, guard, |p| {
            let ask = Ask { limits, n, now };
            let t = &self.rows.table;
            t.reserve::<_, Kd::Take, _>(Reserve {
                ask,
                hash,
                key: p,
                reread,
                hash_of: &hash_of,
                guard,
                spot,
            })
        });
        let created = matches!(result, Ok(Admitted { created: true, .. }));
        if call_quota && tau < self.horizon.load(Ordering::Relaxed) {
            self.sooner_sweep(now, tau);
        }
        self.maybe_sweep(now, created, guard);
        match result {
            Ok(a) => {
                let end = match a.taken {
                    Taken::Debit { tat, .. } => tat,
                    Taken::Hold(t) => t.at,
                };
                let slot = kind.slot(end, a.beside, tau);
                let debit = Debit {
                    n,
                    taken: a.taken,
                    hash,
                    limiter: self.id,
                };
                Ok(finish(self, key, debit, slot))
            }
            // The wait beyond the turn's, plus the turn's: the whole wait.
            Err(Decision::Wait(ns)) => Err(Denied::from_decision(Decision::Wait(
                ns.saturating_add(kind.wait().unwrap_or(0)),
            ))),
            Err(d) => Err(Denied::from_decision(d)),
        }
    }

    /// A reserve or a hold (`kind`) of `n` tokens of `key` under `limits`
    /// (the default quota when `None`) at the clock's reading `clock`, as a
    /// [`Reservation`].
    #[inline(always)]
    fn reservation_of<'a, Q, F, Kd>(
        &'a self,
        key: &'a Q,
        n: u64,
        limits: Option<&Limits>,
        clock: F,
        kind: Kd,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        F: Fn() -> u64,
        Kd: call::Kind<Slot = ()>,
    {
        let req = call::Request {
            key,
            n,
            quota: limits,
            clock,
        };
        self.reserve_slot(req, kind, Self::reservation)
    }

    /// The reservation of `debit` on `key`.
    #[inline(always)]
    fn reservation<'a, Q: ?Sized>(
        &'a self,
        key: &'a Q,
        debit: Debit,
        (): (),
    ) -> Reservation<'a, K, Q, S, C> {
        Reservation {
            pace: self,
            key,
            debit,
        }
    }

    /// The quota a call decides with: its own, or the default in force
    /// (loaded once: one whole quota).
    #[cfg(not(any(
        pace_mutant = "quota_cost_of_default",
        pace_mutant = "quota_read_twice"
    )))]
    #[inline]
    fn call_limits<'r>(&'r self, call: Option<&'r Limits>, guard: &'r Guard) -> &'r Limits {
        match call {
            Some(l) => l,
            None => self.quota.load(guard).limits_ref(),
        }
    }

    /// Known-wrong variant for mutation tests: a call's quota gives the
    /// horizon, but its tokens cost the default quota's interval.
    #[cfg(pace_mutant = "quota_cost_of_default")]
    fn call_limits<'r>(&'r self, call: Option<&'r Limits>, guard: &'r Guard) -> &'r Limits {
        let default = self.quota.load(guard).limits_ref();
        match call {
            // Leaked: a test-only variant, built only for its test.
            Some(l) => Box::leak(Box::new(
                Limits::new(default.interval(), (l.tau() / default.interval()).max(1))
                    .unwrap_or(*l),
            )),
            None => default,
        }
    }

    /// Known-wrong variant for mutation tests: the default quota is read
    /// twice, its horizon from the first read and its capacity and cost
    /// from the second, so a swap in between mixes two quotas.
    #[cfg(pace_mutant = "quota_read_twice")]
    fn call_limits<'r>(&'r self, call: Option<&'r Limits>, guard: &'r Guard) -> &'r Limits {
        if let Some(l) = call {
            return l;
        }
        let first = self.quota.load(guard).limits();
        let second = self.quota.load(guard).limits();
        // Leaked: a test-only variant, built only for its models.
        Box::leak(Box::new(Limits::mixed(second, first.tau())))
    }

    /// Whole tokens `key` could reserve now. A pure load: it writes nothing
    /// and creates no row. For observability only: deciding on it and then
    /// reserving is exactly the check-then-act race `reserve` exists to avoid.
    pub fn peek<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let now = self.clock.now_ns();
        self.peek_at_inner(key, None, now)
    }

    /// Whole tokens `key` could reserve now under `quota` (see
    /// [`peek`](Pace::peek) and [`reserve_with`](Pace::reserve_with)).
    pub fn peek_with<Q>(&self, key: &Q, quota: Quota) -> u64
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let now = self.clock.now_ns();
        self.peek_at_inner(key, Some(quota), now)
    }

    /// [`peek`](Pace::peek) or [`peek_with`](Pace::peek_with) at an explicit
    /// time (for models).
    pub(crate) fn peek_at_inner<Q>(&self, key: &Q, quota: Option<Quota>, now: u64) -> u64
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let hash = self.hash_key(key);
        let guard = self.pin();
        let limits = quota.unwrap_or_else(|| *self.quota.load(&guard)).limits();
        // A row is never live before its first debit; an absent one starts
        // from its floor.
        let t = &self.rows.table;
        let tat = with_probe!(self.rows, key, hash, &guard, |p| t
            .peek(hash, p, Some(now), &guard)
            .map_or_else(|| t.floor(hash, p), |s| s.effective(now)));
        limits.tokens(tat, now)
    }

    /// The stripe of floors `key` shares with other keys (for models: a fresh
    /// row starts from its stripe's floor, the largest `tat` removed there).
    #[cfg(feature = "__internals")]
    pub(crate) fn floor_stripe_inner<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let hash = self.hash_key(key);
        let guard = self.pin();
        let t = &self.rows.table;
        with_probe!(self.rows, key, hash, &guard, |p| t.floor_stripe(hash, p)).unwrap_or(usize::MAX)
    }

    /// The settled `tat` (ns) of `key`'s row, if any (for models).
    #[cfg(feature = "__internals")]
    pub(crate) fn row_tat_inner<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let hash = self.hash_key(key);
        let guard = self.pin();
        with_probe!(self.rows, key, hash, &guard, |p| self
            .rows
            .table
            .peek(hash, p, None, &guard)
            .map(|s| s.tat))
    }

    /// Runs a whole sweep pass at `now`, as calls run one chunk by chunk
    /// (for models): full rows go dormant, dormant cells past their
    /// retention go.
    #[cfg(feature = "__internals")]
    pub(crate) fn pass_at_inner(&self, now: u64) {
        let guard = self.pin();
        self.start_pass(now, &guard);
        while self.rows.table.pass_running(&guard) {
            if self
                .rows
                .table
                .sweep_step(now, &|b| self.hash_of(b), &guard)
            {
                self.pass_ended();
            }
        }
    }

    /// Dormant cells (for models).
    #[cfg(feature = "__internals")]
    pub(crate) fn dormant_inner(&self) -> usize {
        self.rows.table.dormant_cells()
    }

    /// Passes put every full row to sleep from now on (for models).
    #[cfg(feature = "__internals")]
    pub(crate) fn force_dormancy_inner(&self) {
        self.rows.table.force_dormancy()
    }

    /// Removes every row whose bucket has refilled, drops every dormant
    /// cell (the keys of full rows an automatic pass put to sleep for
    /// clients that come back: DESIGN.md §4), and shrinks the table if it
    /// became sparse. Runs automatically (see DESIGN.md, "Sweeps"); call it
    /// to reclaim memory at a moment of your choosing. Returns rows removed
    /// (a dormant cell is no row).
    ///
    /// governor's `retain_recent()` and `shrink_to_fit()` have no counterpart
    /// to call: full buckets leave the table as the limiter runs; this is the
    /// sweep it runs by itself, on demand.
    #[doc(alias = "retain_recent", alias = "shrink_to_fit")]
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_ns();
        self.sweep_at_inner(now)
    }

    /// [`sweep`](Pace::sweep) at an explicit time (for models).
    pub(crate) fn sweep_at_inner(&self, now: u64) -> usize {
        let guard = self.pin();
        self.sweep_with(now, &guard)
    }

    fn sweep_with(&self, now: u64, guard: &Guard) -> usize {
        let removed = self.rows.table.sweep(now, &|b| self.hash_of(b), guard);
        self.sweep_mark.store(self.len(), Ordering::Relaxed);
        removed
    }

    /// The sweep policy: a pass starts when the horizon has passed since the
    /// last time-driven pass, or when the table has doubled since the last
    /// pass. A pass over a large table runs a chunk per call (see
    /// `Table::start_sweep`), so every call also advances a running pass.
    /// (A call under a quota whose horizon is shorter than the default's
    /// first brings the next pass forward: `sooner_sweep`.)
    #[inline(always)]
    fn maybe_sweep(&self, now: u64, created: bool, guard: &Guard) {
        let due = self.next_sweep.load(Ordering::Relaxed);
        // A due time further ahead than it was set means the clock stepped
        // back: treat it as due, so sweeps do not stall until the clock
        // catches up.
        if now >= due || due - now > self.sweep_span.load(Ordering::Relaxed) {
            // While clients come back, no row goes before it is quiet for
            // the table's `quiet`: passes come no more often.
            let span = (self.rows.table).pass_period(self.horizon.load(Ordering::Relaxed));
            self.sweep_span.store(span, Ordering::Relaxed);
            let next = now.saturating_add(span);
            if self
                .next_sweep
                .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                self.start_pass(now, guard);
                return;
            }
        } else if created {
            let mark = self.sweep_mark.load(Ordering::Relaxed);
            let len = self.len();
            // (Or an eighth of the array, when that is more: an array kept
            // large for dormant cells is not swept whole for every few rows
            // its returning clients make.)
            let doubled = mark.max(SWEEP_FLOOR).saturating_mul(2);
            if len >= doubled.max(self.rows.table.cells_hint() / 8)
                && self
                    .sweep_mark
                    .compare_exchange(mark, len, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                self.start_pass(now, guard);
                return;
            }
        }
        if self.rows.table.sweep_step(now, &|b| self.hash_of(b), guard) {
            self.pass_ended();
        }
    }

    /// Known-wrong variant for mutation tests: passes keep the default
    /// cadence whatever quotas the calls bring.
    #[cfg(pace_mutant = "sweep_at_default_cadence")]
    fn sooner_sweep(&self, _now: u64, _tau: u64) {}

    /// A call under a quota whose horizon `tau` is shorter than the
    /// default's brings the next time-driven pass forward to one such
    /// horizon from now (at least the shortest horizon), so rows of short
    /// quotas go soon after they refill; the pass after it is due a default
    /// horizon later again.
    #[cfg(not(pace_mutant = "sweep_at_default_cadence"))]
    #[cold]
    fn sooner_sweep(&self, now: u64, tau: u64) {
        let soon = now.saturating_add(tau.max(MIN_HORIZON_NS));
        if self.next_sweep.load(Ordering::Relaxed) > soon {
            self.next_sweep.fetch_min(soon, Ordering::Relaxed);
        }
    }

    /// A chunked pass ended: the next doubling counts from the rows it
    /// left, when fewer than at its start. Under a flood of new keys that
    /// refill long before the horizon, a pass removes most rows: counted
    /// from its start, the next pass would come only once the rows had
    /// doubled the count before those removals, and meanwhile the array
    /// would grow for rows that are full.
    #[cfg(not(pace_mutant = "mark_kept_after_pass"))]
    #[cold]
    #[inline(never)]
    fn pass_ended(&self) {
        self.sweep_mark.fetch_min(self.len(), Ordering::Relaxed);
    }

    /// Known-wrong variant `mark_kept_after_pass`: the next doubling counts
    /// from the rows at the pass's start.
    #[cfg(pace_mutant = "mark_kept_after_pass")]
    fn pass_ended(&self) {}

    #[cold]
    #[inline(never)]
    fn start_pass(&self, now: u64, guard: &Guard) {
        self.rows
            .table
            .start_sweep(now, &|b| self.hash_of(b), guard);
        self.sweep_mark.store(self.len(), Ordering::Relaxed);
    }
}

impl<K: Clone, S, C> Pace<K, S, C> {
    /// Keys of the rows held now, for invariant checks in tests: call it only
    /// when no other operation is in flight.
    #[cfg(feature = "__internals")]
    pub(crate) fn row_keys_inner(&self) -> Vec<K> {
        let guard = self.pin();
        let word = self.rows.word;
        self.rows.table.live_keys(
            &|b| word.expect("keys' own bits only in an inline table").key(b),
            &guard,
        )
    }
}

impl<K, S, C: fmt::Debug> fmt::Debug for Pace<K, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pace")
            .field("quota", &self.quota())
            .field("rows", &self.len())
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// The tokens [`Pace::check_key_n`] debits for `n` asked: `n`.
#[cfg(not(pace_mutant = "check_costs_one"))]
#[inline(always)]
fn check_cost(n: u64) -> u64 {
    n
}

/// Known-wrong variant `check_costs_one`: a check debits one token, however
/// many it asked for.
#[cfg(pace_mutant = "check_costs_one")]
#[inline(always)]
fn check_cost(_n: u64) -> u64 {
    1
}

mod builder;
mod call;
#[cfg(feature = "__internals")]
mod internals;
mod refund;
mod reservation;
// `__internals`: on in every test build of the repository (the dev-dependency
// on itself); a test of the published package without it leaves these out.
#[cfg(all(test, feature = "__internals"))]
mod tests;
mod turn;

pub use builder::Builder;
#[cfg(feature = "foldhash")]
pub use builder::FastHasher;
#[cfg(feature = "__internals")]
pub use internals::{PaceInternals, ReservationInternals};
pub(crate) use reservation::Turned;
pub use reservation::{Debit, Denied, DenyReason, Hold, Refunded, Reservation};
#[cfg(feature = "__internals")]
pub(crate) use turn::{turn_sleeps, turn_sleeps_here};
