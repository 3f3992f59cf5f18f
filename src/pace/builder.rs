//! Building a `Pace`: capacity, clock, hasher, key kind and limits.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::marker::PhantomData;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::{Pace, Rows, RowsPick, DEFAULT_MIN_SLOTS, MIN_HORIZON_NS, NEXT_ID};
use crate::clock::{Clock, DefaultClock};
use crate::hasher::Sip;
use crate::rate::{ConfigError, Quota, Rate};
use crate::sync::{AtomicU64, AtomicUsize, Epochs};
use crate::table::quota::QuotaCell;
use crate::table::words::WordKey;
use crate::table::{keys, Table};

/// Builds a [`Pace`] with a non-default capacity, clock or hasher.
#[must_use = "a builder does nothing until build() is called"]
pub struct Builder<K, S = RandomState, C = DefaultClock> {
    rate: Rate,
    capacity: Option<u64>,
    hasher: S,
    clock: C,
    min_slots: usize,
    rows: RowsPick,
    hold_limit: Duration,
    huge_pages: bool,
    _keys: PhantomData<fn() -> K>,
}

/// The hasher of [`Builder::fast_hasher`]: foldhash's fast variant, seeded
/// per limiter (feature `foldhash`).
#[cfg(feature = "foldhash")]
#[cfg_attr(docsrs, doc(cfg(feature = "foldhash")))]
pub type FastHasher = foldhash::fast::SeedableRandomState;

/// A [`FastHasher`] with a per-instance seed taken from a fresh std
/// `RandomState` (SipHash keys from the OS entropy, so the seed is not a
/// function of addresses or time) and foldhash's process-wide shared seed.
#[cfg(feature = "foldhash")]
pub(super) fn fast_hasher() -> FastHasher {
    let seed = RandomState::new().hash_one(0x7061_6365_u64);
    foldhash::fast::SeedableRandomState::with_seed(seed, foldhash::SharedSeed::global_random())
}

impl<K> Pace<K> {
    /// A limiter at `rate` with one second of it as capacity, the default
    /// clock and a randomly seeded SipHash.
    ///
    /// governor's `RateLimiter::keyed(quota)` is `Pace::<K>::new(rate)` (or
    /// [`Pace::builder`] for a capacity of its own); `RateLimiter::direct` is
    /// a `Pace<()>` keyed by `&()`.
    #[doc(alias = "keyed", alias = "direct", alias = "RateLimiter::keyed")]
    pub fn new(rate: Rate) -> Pace<K> {
        // `Rate::new` bounds the interval by the largest refill time, and one
        // second of a rate is at least 1 token and refills within about a
        // second plus one interval: every `Rate` builds (tests/rules.rs).
        Pace::builder(rate)
            .build()
            .expect("one second of any Rate fits the time space")
    }

    /// A builder starting from `rate`.
    #[doc(alias = "keyed", alias = "direct")]
    pub fn builder(rate: Rate) -> Builder<K> {
        Builder {
            rate,
            capacity: None,
            hasher: RandomState::new(),
            clock: DefaultClock::new(),
            min_slots: DEFAULT_MIN_SLOTS,
            rows: RowsPick::ByType,
            hold_limit: DEFAULT_HOLD_LIMIT,
            huge_pages: false,
            _keys: PhantomData,
        }
    }
}

/// The default [`Builder::hold_limit`].
const DEFAULT_HOLD_LIMIT: Duration = Duration::from_secs(10);

/// A hold limit in ns, within the time space (so twice it cannot overflow).
pub(super) fn hold_limit_ns(limit: Duration) -> u64 {
    u64::try_from(limit.as_nanos())
        .unwrap_or(u64::MAX)
        .min(crate::bucket::MAX_TIME)
}

impl<K, S, C> Builder<K, S, C> {
    /// Bucket capacity in tokens (default: one second of the rate, at least 1).
    ///
    /// governor's `Quota::allow_burst(b)` and tower_governor's `burst_size(b)`
    /// are `capacity(b)`.
    #[doc(alias = "allow_burst", alias = "burst_size", alias = "burst")]
    pub fn capacity(mut self, tokens: u64) -> Self {
        self.capacity = Some(tokens);
        self
    }

    /// The default quota: its rate and capacity (the same as
    /// `Pace::builder(quota.rate()).capacity(quota.capacity())`).
    pub fn quota(mut self, quota: Quota) -> Self {
        self.rate = quota.rate();
        self.capacity = Some(quota.capacity());
        self
    }

    /// The clock (default [`DefaultClock`]: quanta with the default feature).
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<K, S, C2> {
        Builder {
            rate: self.rate,
            capacity: self.capacity,
            hasher: self.hasher,
            clock,
            min_slots: self.min_slots,
            rows: self.rows,
            hold_limit: self.hold_limit,
            huge_pages: self.huge_pages,
            _keys: PhantomData,
        }
    }

    /// The hasher (default: `RandomState`, randomly seeded SipHash). Keys are
    /// chosen by clients, so a predictable hasher invites collision floods.
    /// With std's `RandomState` a limiter hashes with SipHash-1-3, the
    /// function `RandomState`'s hashers compute, under a random key of its
    /// own drawn at `build()`, through the `siphasher` crate, which takes an
    /// integer whole where std's hasher buffers its bytes (DESIGN.md §6);
    /// any other hasher is called as it is.
    ///
    /// Word-sized keys (`u64`, `i32`, `char`, `Ipv4Addr`, …) are held in
    /// their rows' cells as their own bits only with std's `RandomState`,
    /// `BuildHasherDefault<DefaultHasher>` or `fast_hasher()` (feature
    /// `foldhash`) (hashers that cannot panic on an integer: such a cell
    /// keeps no hash, so moving or removing a row hashes its key again);
    /// with any other hasher they are boxed with their hash, as other keys
    /// are (one more allocation per row, one more cache line per lookup;
    /// DESIGN.md §2).
    pub fn hasher<S2: BuildHasher>(self, hasher: S2) -> Builder<K, S2, C> {
        Builder {
            rate: self.rate,
            capacity: self.capacity,
            hasher,
            clock: self.clock,
            min_slots: self.min_slots,
            rows: self.rows,
            hold_limit: self.hold_limit,
            huge_pages: self.huge_pages,
            _keys: PhantomData,
        }
    }

    /// foldhash's fast hasher instead of SipHash, with a seed of its own:
    /// [`FastHasher`], whose per-limiter seed is drawn from std's
    /// `RandomState` (keyed from the operating system's entropy). About
    /// 80 fewer instructions per reserve (docs/bench/README.md); it does not
    /// resist an attacker who can observe the limiter's timing, which
    /// SipHash does (DESIGN.md §6). Feature `foldhash`.
    #[cfg(feature = "foldhash")]
    #[cfg_attr(docsrs, doc(cfg(feature = "foldhash")))]
    pub fn fast_hasher(self) -> Builder<K, FastHasher, C> {
        self.hasher(fast_hasher())
    }

    /// The smallest slot array the table keeps (rounded up to a power of two,
    /// at least 4; default 64). It grows past this with live rows and shrinks
    /// back to it when they leave.
    pub fn min_slots(mut self, slots: usize) -> Self {
        self.min_slots = slots;
        self
    }

    /// How long a hold stays exact (default 10 s; see [`Pace::hold`]): a
    /// hold kept or refunded before any call on its key reads a time this
    /// long after the hold's own reading is resolved exactly, in any order
    /// of readings (DESIGN.md §3, "Lots and the hold limit"); holds are
    /// grouped in lots by epochs of this time, and a hold never resolved
    /// counts as held until a call reads a time two epochs past its lot's
    /// (at most twice this time past the lot's epoch), then as kept. Zero is refused by
    /// [`build`](Builder::build) ([`ConfigError::ZeroHoldLimit`]); a limit
    /// past the time space (`Duration::MAX`) means holds never expire.
    pub fn hold_limit(mut self, limit: Duration) -> Self {
        self.hold_limit = limit;
        self
    }

    /// Whether the table's large slot arrays (4 MiB and more: from about
    /// 100,000 live keys) ask the kernel for transparent huge pages (Linux
    /// `madvise(MADV_HUGEPAGE)`; default false; elsewhere it changes
    /// nothing). A lookup in such an array then misses the TLB far less:
    /// over 1M live keys, one reserve at a time takes about a tenth less
    /// time (docs/bench/warm.md). The price is the slowest calls: the
    /// copies of a growth fault the new array 2 MiB at a time, and with
    /// THP `defrag` at `always` or `madvise` (the kernel's default) a fault
    /// when no huge page is free first compacts memory, which the copying
    /// call waits for. Growing to 4M rows, the slowest call took 17–29 ms
    /// this way, against 0.3–0.6 ms without (and governor's 12–13 ms):
    /// turn it on for a table sized ahead
    /// ([`min_slots`](Builder::min_slots)) or where lookups matter more
    /// than a growth's slowest call. With THP `never` no page changes.
    pub fn huge_pages(mut self, on: bool) -> Self {
        self.huge_pages = on;
        self
    }

    /// Word-sized keys boxed with their hash, as other keys are (for
    /// models and benchmarks of boxed keys). Feature `__internals`: not a
    /// stable API, for models, fuzz targets and benchmarks.
    #[cfg(feature = "__internals")]
    pub fn boxed_keys(mut self) -> Self {
        self.rows = RowsPick::Boxed;
        self
    }

    /// Word-sized keys held as their own bits whatever the hasher, for
    /// models and benchmarks whose own hasher cannot panic (such a cell
    /// keeps no hash, so a migration and a sweep hash the keys they move or
    /// remove; see [`Builder::hasher`]). Feature `__internals`: not a stable
    /// API, for models, fuzz targets and benchmarks.
    #[cfg(feature = "__internals")]
    pub fn inline_keys_any_hasher(mut self) -> Self {
        self.rows = RowsPick::InlineAnyHasher;
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    /// [`ConfigError::ZeroCapacity`] for a capacity of 0;
    /// [`ConfigError::CapacityTooLarge`] when refilling an empty bucket would
    /// take longer than the time space allows;
    /// [`ConfigError::MinSlotsTooLarge`] when [`min_slots`](Builder::min_slots)
    /// is more slots than an array can have or the allocator gives;
    /// [`ConfigError::ZeroHoldLimit`] for a [`hold_limit`](Builder::hold_limit)
    /// of zero.
    pub fn build(self) -> Result<Pace<K, S, C>, ConfigError> {
        if self.hold_limit.is_zero() {
            return Err(ConfigError::ZeroHoldLimit);
        }
        let capacity = self.capacity.unwrap_or_else(|| self.rate.one_second());
        let quota = Quota::new(self.rate, capacity)?;
        let horizon = quota.limits().tau().max(MIN_HORIZON_NS);
        let inline = match self.rows {
            RowsPick::ByType => hasher_cannot_panic::<S>(),
            RowsPick::Boxed => false,
            RowsPick::InlineAnyHasher => true,
        };
        let word = WordKey::<K>::new().filter(|_| inline);
        let kind = match word {
            Some(_) => keys::inline(),
            None => keys::boxed::<K>(),
        };
        let rows = Rows {
            table: Table::try_new(
                self.min_slots,
                kind,
                quota.limits().interval(),
                hold_limit_ns(self.hold_limit),
                self.huge_pages,
            )
            .ok_or(ConfigError::MinSlotsTooLarge)?,
            word,
            _owns: std::marker::PhantomData,
        };
        rows.table.set_retain(super::retention(horizon));
        Ok(Pace {
            rows,
            quota: QuotaCell::new(quota),
            sip: Sip::for_hasher::<S>(),
            hasher: self.hasher,
            clock: self.clock,
            horizon: AtomicU64::new(horizon),
            sweep_span: AtomicU64::new(horizon),
            next_sweep: CachePadded::new(AtomicU64::new(horizon)),
            sweep_mark: AtomicUsize::new(0),
            epochs: Epochs::new(),
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }
}

/// Whether every hasher of type `S` hashes an integer without panicking:
/// std's `RandomState` and `BuildHasherDefault<DefaultHasher>` (SipHash)
/// and, with the `foldhash` feature, the crate's `FastHasher`. A cell that
/// holds a key's own bits keeps no hash, so a migration's copier and a
/// sweep hash the keys of the cells they hold; a hasher that panicked there
/// would leave a chunk frozen (its keys' callers, and every insert once the
/// target fills, would wait for good) or a sweep's removals uncounted. A
/// limiter with any other hasher boxes its keys with their hash
/// (`src/table/keys.rs`), so its hasher runs only before anything changes.
#[cfg(not(pace_mutant = "inline_any_hasher"))]
pub(crate) fn hasher_cannot_panic<S: ?Sized>() -> bool {
    let id = typeid::of::<S>();
    #[cfg(feature = "foldhash")]
    if id == std::any::TypeId::of::<FastHasher>() {
        return true;
    }
    id == std::any::TypeId::of::<std::collections::hash_map::RandomState>()
        || id
            == std::any::TypeId::of::<
                std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>,
            >()
}

/// Known-wrong variant `inline_any_hasher`: every hasher is trusted.
#[cfg(pace_mutant = "inline_any_hasher")]
pub(crate) fn hasher_cannot_panic<S: ?Sized>() -> bool {
    true
}
