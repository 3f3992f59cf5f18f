//! The keyed limiter: the table, the bucket rule and the sweep policy.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::bucket::{Decision, Limits};
use crate::clock::{Clock, DefaultClock};
use crate::rate::{ConfigError, Quota, Rate};
use crate::sync::epoch::Guard;
use crate::sync::{AtomicU64, AtomicUsize, Epochs, Ordering};
use crate::table::held::Ticket;
use crate::table::keys::{self, Bits, Boxed};
use crate::table::quota::QuotaCell;
use crate::table::words::{self, Borrowed, WordKey};
use crate::table::Table;

/// Default smallest slot array: the table shrinks back to this.
const DEFAULT_MIN_SLOTS: usize = 64;
/// Below this many rows, growth alone does not trigger a sweep.
const SWEEP_FLOOR: usize = 64;
/// The shortest time between two time-driven sweeps.
const MIN_HORIZON_NS: u64 = 1_000_000;

/// A lock-free keyed pace limiter: one token bucket per key.
///
/// Each key gets a bucket holding (by default) one second of the declared
/// rate, refilled continuously. [`reserve`](Pace::reserve) debits and decides
/// in one atomic step; the caller [`refund`](Reservation::refund)s a
/// reservation when the exchange did not happen. A full bucket is the same as
/// no bucket, so rows that refilled are removed and memory follows the keys
/// that exchanged within the last horizon, not the keys anyone named.
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
pub struct Pace<K, S = RandomState, C = DefaultClock> {
    rows: Rows<K>,
    /// The default quota: what `reserve` decides with.
    quota: QuotaCell,
    hasher: S,
    clock: C,
    /// The time between time-driven sweep passes: the default quota's
    /// horizon (at least `MIN_HORIZON_NS`).
    horizon: AtomicU64,
    /// When the next time-driven sweep is due (ns on the clock).
    next_sweep: CachePadded<AtomicU64>,
    /// Rows left by the last sweep; a sweep also runs when `len` doubles it.
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
// Only `ByType` is built without the `internals` feature.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
enum RowsPick {
    /// Their own bits when the hasher is one whose hash of an integer
    /// cannot panic (`words::hasher_cannot_panic`), else boxed.
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
                    let $p = &Bits(bits);
                    $body
                }
                None => {
                    let $p = &Borrowed { word, key: $key };
                    $body
                }
            },
            None => {
                let $p = &Boxed::<K, _>::new($key, $hash, $guard);
                $body
            }
        }
    };
}

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
    _keys: PhantomData<fn() -> K>,
}

/// The hasher of [`Builder::fast_hasher`]: foldhash's fast variant, seeded
/// per limiter (feature `foldhash`).
#[cfg(feature = "foldhash")]
pub type FastHasher = foldhash::fast::SeedableRandomState;

/// A [`FastHasher`] with a per-instance seed taken from a fresh std
/// `RandomState` (SipHash keys from the OS entropy, so the seed is not a
/// function of addresses or time) and foldhash's process-wide shared seed.
#[cfg(feature = "foldhash")]
fn fast_hasher() -> FastHasher {
    let seed = RandomState::new().hash_one(0x7061_6365_u64);
    foldhash::fast::SeedableRandomState::with_seed(seed, foldhash::SharedSeed::global_random())
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

/// Why a reservation was denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DenyReason {
    /// Not enough tokens now; [`Denied::retry_after`] says when.
    Exhausted,
    /// More tokens were asked than the bucket holds: never admitted.
    ExceedsCapacity,
    /// The clock reads past the limiter's time space (about 73 years after
    /// the clock's origin): nothing is admitted any more.
    TimeExhausted,
}

/// A denied reservation. Nothing was written and no row was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Denied {
    reason: DenyReason,
    wait_ns: u64,
}

impl Denied {
    fn from_decision(d: Decision) -> Denied {
        match d {
            Decision::Wait(ns) => Denied {
                reason: DenyReason::Exhausted,
                wait_ns: ns,
            },
            Decision::Never | Decision::Admit(_) => Denied {
                reason: DenyReason::ExceedsCapacity,
                wait_ns: u64::MAX,
            },
            Decision::TimeExhausted => Denied {
                reason: DenyReason::TimeExhausted,
                wait_ns: u64::MAX,
            },
        }
    }

    /// The exact wait until this request would be admitted if nothing else
    /// touched the key. [`Duration::MAX`] when it never will be (see
    /// [`is_permanent`](Denied::is_permanent)).
    pub fn retry_after(&self) -> Duration {
        match self.reason {
            DenyReason::Exhausted => Duration::from_nanos(self.wait_ns),
            _ => Duration::MAX,
        }
    }

    /// Why it was denied.
    pub fn reason(&self) -> DenyReason {
        self.reason
    }

    /// True when waiting will not help: the request exceeds the capacity or
    /// the time space is exhausted.
    pub fn is_permanent(&self) -> bool {
        self.reason != DenyReason::Exhausted
    }
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            DenyReason::Exhausted => {
                write!(f, "pace exceeded; retry after {:?}", self.retry_after())
            }
            DenyReason::ExceedsCapacity => f.write_str("request exceeds the bucket's capacity"),
            DenyReason::TimeExhausted => f.write_str("the limiter's time space is exhausted"),
        }
    }
}

impl std::error::Error for Denied {}

/// An admitted request's debit. Dropping it keeps the debit; call
/// [`refund`](Reservation::refund) when the exchange did not happen.
///
/// A reservation neither pins an epoch nor keeps its row alive: it is a
/// record of what was debited (`n` tokens, moving the bucket from one `tat`
/// to another). [`detach`](Reservation::detach) turns it into a [`Debit`]
/// that borrows nothing, for refunds decided later (after a response).
#[must_use = "dropping a Reservation keeps the debit; refund() it if the exchange did not happen"]
pub struct Reservation<'a, K, Q: ?Sized, S = RandomState, C = DefaultClock> {
    pace: &'a Pace<K, S, C>,
    key: &'a Q,
    debit: Debit,
}

/// What an admitted reservation debited, detached from its borrows (see
/// [`Reservation::detach`]): refund it with [`Pace::refund`] on the same
/// limiter and key, or drop it to keep the debit.
///
/// A `Debit` knows where it came from: the limiter that made it and its
/// key's hash. Refunded to another limiter, or to a key whose hash differs,
/// it returns nothing ([`Refunded::Misdirected`]; a hold's debit handed to
/// another key of its limiter finds no lot there: [`Refunded::Expired`]).
/// (Two keys whose 64-bit
/// hashes are equal are not told apart; with the default hasher, keyed per
/// limiter, nobody outside the process can choose such a pair.)
#[must_use = "dropping a Debit keeps it; refund it with Pace::refund if the exchange did not happen"]
#[derive(Debug, PartialEq, Eq)]
pub struct Debit {
    n: u64,
    /// Where the debit ends on the bucket's timeline.
    tat: u64,
    /// The bucket's `tat` before the debit: what a refund restores.
    prev: u64,
    /// The key's hash, so a refund does not hash again, and so a refund to
    /// another key is recognised.
    hash: u64,
    /// The identity of the limiter that made it (`Pace::id`).
    limiter: u64,
    /// A hold's lot (`held.rs`), 0 for a debit. A hold's `tat` is its
    /// reading and its `prev` its cost: the ticket it resolves with.
    lot: u64,
}

/// What a refund returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refunded {
    /// The reservation is undone: the key's bucket is in the state it had
    /// before the debit, as if the reservation never happened.
    Restored,
    /// The reservation is undone and the state it restored is a full bucket,
    /// so the key's row was removed (a full bucket is the same as none).
    Removed,
    /// The key was debited since: nothing was returned, since those later
    /// debits were decided on this one.
    Superseded,
    /// The key has no row: its bucket is full already (the debit drained and
    /// the row was removed), so there was nothing to return.
    Refilled,
    /// The debit belongs to another limiter or another key: nothing was
    /// returned.
    Misdirected,
    /// The debit was of zero tokens: there was nothing to return.
    Nothing,
    /// The hold outlived its limit ([`Builder::hold_limit`]) and was
    /// settled as kept: nothing was returned.
    Expired,
}

impl Refunded {
    /// True when the refund returned the debit's tokens.
    pub fn returned(self) -> bool {
        matches!(self, Refunded::Restored | Refunded::Removed)
    }
}

impl Debit {
    /// Tokens debited.
    pub fn tokens(&self) -> u64 {
        self.n
    }

    /// A hold's ticket.
    fn ticket(&self) -> Option<Ticket> {
        Ticket::unpack(self.lot, self.prev, self.tat)
    }

    /// True when this is a hold's debit ([`Hold::detach`]): its tokens are
    /// held until [`Pace::keep`] or [`Pace::refund`] resolves it.
    pub fn is_hold(&self) -> bool {
        self.lot != 0
    }
}

/// An admitted presentation whose tokens are *held* while it is checked
/// ([`Pace::hold`]): [`refund`](Hold::refund) returns them exactly whatever
/// else happened on the key (other holds, their refunds in any order,
/// debits), and [`keep`](Hold::keep) — or dropping it — settles them as a
/// debit from the hold's own reading. Keeping costs a second CAS on the
/// key's row; use [`Pace::reserve`] where nothing will be refunded.
///
/// While held, the tokens count against the key as debited at every
/// decision. A hold neither kept nor refunded within
/// [`Builder::hold_limit`] may expire: it then counts as kept, and its
/// refund returns nothing ([`Refunded::Expired`]). A hold dropped while its
/// thread unwinds from a panic is left to expire so.
#[must_use = "dropping a Hold keeps it; refund() it if the exchange did not happen"]
pub struct Hold<'a, K, Q, S = RandomState, C = DefaultClock>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    inner: Option<Reservation<'a, K, Q, S, C>>,
}

impl<K, Q, S, C> fmt::Debug for Hold<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("tokens", &self.tokens())
            .finish()
    }
}

impl<K, Q, S, C> Hold<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    /// Tokens held.
    pub fn tokens(&self) -> u64 {
        self.inner.as_ref().map_or(0, |r| r.debit.n)
    }

    /// Settles the held tokens as a debit from the hold's reading (what
    /// dropping the hold does). False when the hold had expired, already
    /// counted as kept.
    pub fn keep(mut self) -> bool {
        let r = self.inner.take().expect("a hold is resolved once");
        let now = r.pace.clock.now_ns();
        r.pace.resolve_hashed(r.key, r.debit, true, now)
    }

    /// Returns the held tokens: exact in any order, whatever else happened
    /// on the key ([`Refunded::Restored`]), unless the hold expired
    /// ([`Refunded::Expired`]).
    pub fn refund(mut self) -> Refunded {
        let r = self.inner.take().expect("a hold is resolved once");
        let now = r.pace.clock.now_ns();
        r.pace.refund_hashed(r.key, r.debit.hash, r.debit, now)
    }

    /// Detaches the hold from its borrows: resolve the [`Debit`] later with
    /// [`Pace::keep`] or [`Pace::refund`]. A detached hold dropped without
    /// either stays held until it expires ([`Builder::hold_limit`]), then
    /// counts as kept.
    pub fn detach(mut self) -> Debit {
        self.inner.take().expect("a hold is resolved once").debit
    }

    /// [`refund`](Hold::refund) at an explicit time (for models).
    #[cfg(feature = "internals")]
    pub(crate) fn resolve_at_inner(mut self, keep: bool, now: u64) -> Refunded {
        let r = self.inner.take().expect("a hold is resolved once");
        if keep {
            if r.pace.resolve_hashed(r.key, r.debit, true, now) {
                Refunded::Nothing
            } else {
                Refunded::Expired
            }
        } else {
            r.pace.refund_hashed(r.key, r.debit.hash, r.debit, now)
        }
    }
}

impl<K, Q, S, C> Drop for Hold<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    fn drop(&mut self) {
        if let Some(r) = self.inner.take() {
            // While unwinding, a key's `Eq` that panics again would abort:
            // the hold is left to expire, and then counts as kept.
            if std::thread::panicking() {
                return;
            }
            let now = r.pace.clock.now_ns();
            r.pace.resolve_hashed(r.key, r.debit, true, now);
        }
    }
}

impl<K, Q: ?Sized, S, C> fmt::Debug for Reservation<'_, K, Q, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("tokens", &self.debit.n)
            .field("tat_ns", &self.debit.tat)
            .finish()
    }
}

impl<K, Q, S, C> Reservation<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    /// Tokens this reservation debited.
    pub fn tokens(&self) -> u64 {
        self.debit.n
    }

    /// Where this debit ends on the bucket's timeline (ns; for models).
    #[cfg(feature = "internals")]
    pub(crate) fn debit_end_ns_inner(&self) -> u64 {
        self.debit.tat
    }

    /// Undoes this reservation if nothing has been debited from its key
    /// since: the bucket returns to the state it had before, as if the
    /// reservation never happened (so a refund after the debit drained finds
    /// the bucket full either way). If the key was debited since, the refund
    /// returns nothing: those later debits were decided on this one, and
    /// returning it could admit more than the bucket allows. A refund never
    /// creates a row; a refund that fills the bucket removes the row.
    pub fn refund(self) -> Refunded {
        let now = self.pace.clock.now_ns();
        self.refund_at_inner(now)
    }

    /// [`refund`](Reservation::refund) at an explicit time (for models).
    pub(crate) fn refund_at_inner(self, now: u64) -> Refunded {
        let hash = self.debit.hash;
        self.pace.refund_hashed(self.key, hash, self.debit, now)
    }

    /// Detaches the debit from its borrows, to refund it later with
    /// [`Pace::refund`] (for example once a response says whether the
    /// exchange happened) or to drop it and keep the debit.
    pub fn detach(self) -> Debit {
        self.debit
    }
}

/// A reservation and its slot: the instant (ns on the limiter's clock) its
/// debit fits the bucket, when a caller waiting for its turn goes through.
pub type Turned<'a, K, Q, S, C> = (Reservation<'a, K, Q, S, C>, u64);

/// When a debit ending at `tat` fits a bucket of horizon `tau`: the instant
/// a turn is let through (`Pace::acquire`).
#[cfg(not(pace_mutant = "turn_before_its_slot"))]
#[inline]
fn slot_of(tat: u64, tau: u64, _wait: u64) -> u64 {
    tat.saturating_sub(tau)
}

/// Known-wrong variant for mutation tests: a turn is let through as soon as
/// it was decided, up to its whole wait before its debit fits.
#[cfg(pace_mutant = "turn_before_its_slot")]
#[inline]
fn slot_of(tat: u64, tau: u64, wait: u64) -> u64 {
    tat.saturating_sub(tau).saturating_sub(wait)
}

/// A turn being waited for (`Pace::acquire`): refunded if dropped before
/// the turn comes.
#[cfg(feature = "timer")]
struct Turn<'a, K, Q, S, C>(Option<Reservation<'a, K, Q, S, C>>)
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock;

#[cfg(feature = "timer")]
impl<K, Q, S, C> Drop for Turn<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.refund();
        }
    }
}

/// Sleeps taken by callers waiting for a turn, in this process (for the
/// fairness benchmark: one per waiter means no wasted wake-up).
static TURN_SLEEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

std::thread_local! {
    /// Sleeps taken by callers waiting for a turn on this thread (counted
    /// where the sleep starts: in an async turn, the poll that starts it).
    static TURN_SLEEPS_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn note_turn_sleep() {
    TURN_SLEEPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    TURN_SLEEPS_HERE.with(|c| c.set(c.get() + 1));
}

/// Sleeps taken by callers waiting for a turn in this process so far.
#[cfg(feature = "internals")]
pub(crate) fn turn_sleeps() -> u64 {
    TURN_SLEEPS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sleeps taken by callers waiting for a turn on this thread so far.
#[cfg(feature = "internals")]
pub(crate) fn turn_sleeps_here() -> u64 {
    TURN_SLEEPS_HERE.with(std::cell::Cell::get)
}

impl<K> Pace<K> {
    /// A limiter at `rate` with one second of it as capacity, the default
    /// clock and a randomly seeded SipHash.
    pub fn new(rate: Rate) -> Pace<K> {
        // `Rate::new` bounds the interval by the largest refill time, and one
        // second of a rate is at least 1 token and refills within about a
        // second plus one interval: every `Rate` builds (tests/rules.rs).
        Pace::builder(rate)
            .build()
            .expect("one second of any Rate fits the time space")
    }

    /// A builder starting from `rate`.
    pub fn builder(rate: Rate) -> Builder<K> {
        Builder {
            rate,
            capacity: None,
            hasher: RandomState::new(),
            clock: DefaultClock::new(),
            min_slots: DEFAULT_MIN_SLOTS,
            rows: RowsPick::ByType,
            hold_limit: DEFAULT_HOLD_LIMIT,
            _keys: PhantomData,
        }
    }
}

/// The default [`Builder::hold_limit`].
const DEFAULT_HOLD_LIMIT: Duration = Duration::from_secs(10);

/// A hold limit in ns, within the time space (so twice it cannot overflow).
fn hold_limit_ns(limit: Duration) -> u64 {
    u64::try_from(limit.as_nanos())
        .unwrap_or(u64::MAX)
        .min(crate::bucket::MAX_TIME)
}

impl<K, S, C> Builder<K, S, C> {
    /// Bucket capacity in tokens (default: one second of the rate, at least 1).
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
            _keys: PhantomData,
        }
    }

    /// The hasher (default: `RandomState`, randomly seeded SipHash). Keys are
    /// chosen by clients, so a predictable hasher invites collision floods.
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
            _keys: PhantomData,
        }
    }

    /// foldhash's fast hasher instead of SipHash, with a seed of its own:
    /// [`FastHasher`], whose per-limiter seed is drawn from std's
    /// `RandomState` (keyed from the operating system's entropy). About
    /// 70 fewer instructions per reserve (docs/bench/README.md); it does not
    /// resist an attacker who can observe the limiter's timing, which
    /// SipHash does (DESIGN.md §6). Feature `foldhash`.
    #[cfg(feature = "foldhash")]
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
    /// hold kept or refunded within this time of being made is resolved
    /// exactly; a hold never resolved counts as held for at most twice this
    /// time, then as kept.
    pub fn hold_limit(mut self, limit: Duration) -> Self {
        self.hold_limit = limit;
        self
    }

    /// Word-sized keys boxed with their hash, as other keys are (for
    /// models and benchmarks of boxed keys). Feature `internals`: not a
    /// stable API, for models, fuzz targets and benchmarks.
    #[cfg(feature = "internals")]
    pub fn boxed_keys(mut self) -> Self {
        self.rows = RowsPick::Boxed;
        self
    }

    /// Word-sized keys held as their own bits whatever the hasher, for
    /// models and benchmarks whose own hasher cannot panic (such a cell
    /// keeps no hash, so a migration and a sweep hash the keys they move or
    /// remove; see [`Builder::hasher`]). Feature `internals`: not a stable
    /// API, for models, fuzz targets and benchmarks.
    #[cfg(feature = "internals")]
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
    /// is more slots than an array can have or the allocator gives.
    pub fn build(self) -> Result<Pace<K, S, C>, ConfigError> {
        let capacity = self.capacity.unwrap_or_else(|| self.rate.one_second());
        let quota = Quota::new(self.rate, capacity)?;
        let horizon = quota.limits().tau().max(MIN_HORIZON_NS);
        let inline = match self.rows {
            RowsPick::ByType => words::hasher_cannot_panic::<S>(),
            RowsPick::Boxed => false,
            RowsPick::InlineAnyHasher => true,
        };
        let word = WordKey::<K>::new().filter(|_| inline);
        let kind = match word {
            Some(_) => keys::inline(),
            None => keys::boxed::<K>(),
        };
        let rows = Rows {
            table: Table::try_new(self.min_slots, kind, hold_limit_ns(self.hold_limit))
                .ok_or(ConfigError::MinSlotsTooLarge)?,
            word,
            _owns: std::marker::PhantomData,
        };
        Ok(Pace {
            rows,
            quota: QuotaCell::new(quota),
            hasher: self.hasher,
            clock: self.clock,
            horizon: AtomicU64::new(horizon),
            next_sweep: CachePadded::new(AtomicU64::new(horizon)),
            sweep_mark: AtomicUsize::new(0),
            epochs: Epochs::new(),
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }
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
        self.horizon
            .store(quota.limits().tau().max(MIN_HORIZON_NS), Ordering::Relaxed);
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

    /// Rows held now: keys whose bucket is not known to be full.
    pub fn len(&self) -> usize {
        self.rows.table.len()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The hasher this limiter hashes keys with.
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
    /// `internals`: not a stable API, for models, fuzz targets and
    /// benchmarks.
    #[cfg(feature = "internals")]
    pub fn table_slots(&self) -> usize {
        self.memory().slots
    }

    /// Bytes of the table's slot arrays (both while a migration runs) and
    /// floors. Each row adds one entry allocation of
    /// [`entry_bytes`](Pace::entry_bytes) plus what its key owns. Feature
    /// `internals`: not a stable API, for models, fuzz targets and
    /// benchmarks.
    #[cfg(feature = "internals")]
    pub fn table_bytes(&self) -> usize {
        let m = self.memory();
        m.array_bytes + m.floor_bytes
    }

    /// Bytes of one row's key box (hash and key, not what the key owns on
    /// the heap) when keys are boxed; 0 when cells hold the keys' own bits.
    /// Feature `internals`: not a stable API, for models, fuzz targets and
    /// benchmarks.
    #[cfg(feature = "internals")]
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
    #[inline]
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
        self.reserve_slot::<Q, _, false, false>(key, n, None, 0, &mut 0, || self.clock.now_ns())
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
        self.reserve_slot::<Q, _, false, false>(key, n, limits, 0, &mut 0, || self.clock.now_ns())
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
    pub fn hold<'a, Q>(&'a self, key: &'a Q) -> Result<Hold<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.hold_n_with_inner(key, 1, None, None)
    }

    /// Holds `n` tokens of `key` (see [`hold`](Pace::hold)).
    pub fn hold_n<'a, Q>(&'a self, key: &'a Q, n: u64) -> Result<Hold<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.hold_n_with_inner(key, n, None, None)
    }

    /// Holds `n` tokens of `key` under the call's own quota (see
    /// [`hold`](Pace::hold) and [`reserve_n_with`](Pace::reserve_n_with)).
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
        self.hold_n_with_inner(key, n, Some(quota), None)
    }

    /// A hold, at the clock's time or at `now` (for models).
    pub(crate) fn hold_n_with_inner<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        now: Option<u64>,
    ) -> Result<Hold<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let limits = quota.as_ref().map(Quota::limits_ref);
        let clock = || now.unwrap_or_else(|| self.clock.now_ns());
        let r = self.reserve_slot::<Q, _, false, true>(key, n, limits, 0, &mut 0, clock)?;
        Ok(Hold { inner: Some(r) })
    }

    /// [`reserve_n`](Pace::reserve_n) (or, with a quota,
    /// [`reserve_n_with`](Pace::reserve_n_with)) at an explicit time (for
    /// models).
    #[cfg(feature = "internals")]
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
        self.reserve_slot::<Q, _, false, false>(key, n, limits, 0, &mut 0, || now)
    }

    /// The reserve: `limits` is the call's quota, `None` for the default.
    /// With `TURN` it admits a debit that fits the bucket up to `wait_ns`
    /// after `now` and writes to `slot` the instant its debit fits the
    /// bucket (`tat − τ`, or earlier when it fits at once); a plain reserve
    /// (`TURN` false) does neither, and the compiler drops both.
    #[inline]
    #[allow(clippy::too_many_arguments)] // a plain reserve passes five
    fn reserve_slot<'a, Q, F, const TURN: bool, const HOLD: bool>(
        &'a self,
        key: &'a Q,
        n: u64,
        limits: Option<&Limits>,
        wait_ns: u64,
        slot: &mut u64,
        clock: F,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        F: Fn() -> u64,
    {
        if n == 0 {
            let r = Reservation {
                pace: self,
                key,
                debit: Debit {
                    n: 0,
                    tat: 0,
                    prev: 0,
                    hash: 0,
                    limiter: self.id,
                    lot: 0,
                },
            };
            return Ok(r);
        }
        let hash = self.hasher.hash_one(key);
        // The key's cell is fetched while the epoch is pinned and the clock
        // read, which is why the clock is read only now.
        self.rows.table.prefetch(hash);
        let now = clock();
        let reread: &dyn Fn() -> u64 = &clock;
        let guard = self.pin();
        let call_quota = limits.is_some();
        let limits = self.call_limits(limits, &guard);
        if n > limits.capacity() {
            return Err(Denied::from_decision(Decision::Never));
        }
        let tau = limits.tau();
        let waiting;
        let limits = if TURN {
            waiting = limits.waiting(wait_ns);
            &waiting
        } else {
            limits
        };
        let hash_of = |b| self.hash_of(b);
        let result = with_probe!(self.rows, key, hash, &guard, |p| {
            self.rows
                .table
                .reserve::<_, HOLD>(limits, hash, p, n, now, reread, &hash_of, &guard)
        })
        .map(|a| (a.tat, a.prev, a.created, a.lot));
        let created = matches!(result, Ok((_, _, true, _)));
        if call_quota && tau < self.horizon.load(Ordering::Relaxed) {
            self.sooner_sweep(now, tau);
        }
        self.maybe_sweep(now, created, &guard);
        match result {
            Ok((tat, prev, _, lot)) => {
                if TURN {
                    *slot = slot_of(tat, tau, wait_ns);
                }
                Ok(Reservation {
                    pace: self,
                    key,
                    debit: Debit {
                        n,
                        tat,
                        prev,
                        hash,
                        limiter: self.id,
                        lot,
                    },
                })
            }
            // The wait beyond `wait_ns`, plus `wait_ns`: the whole wait.
            Err(Decision::Wait(ns)) if TURN => Err(Denied::from_decision(Decision::Wait(
                ns.saturating_add(wait_ns),
            ))),
            Err(d) => Err(Denied::from_decision(d)),
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

    /// Waits for a turn instead of being refused: reserves a token of
    /// `key` in a slot that may lie up to `max_wait` in the future (one CAS,
    /// as [`reserve_n`](Pace::reserve_n)), then sleeps the thread until the
    /// limiter's clock reaches the slot. Callers of one key are let through
    /// in the order of their debits (first come, first served), each after
    /// one exact sleep (re-checking the clock, since a sleep and the clock
    /// may disagree), with no retries. `quota` is the call's quota, `None`
    /// for the default.
    ///
    /// Over the instants callers are let through, the kept admissions of a
    /// key obey the same bound as reserves (DESIGN.md §3, "Waiting for a
    /// turn"). With a [`ManualClock`](crate::ManualClock) the thread sleeps
    /// until another thread advances the clock past the slot.
    ///
    /// # Errors
    /// [`Denied`] at once, having written nothing, when the turn lies more
    /// than `max_wait` ahead (its [`retry_after`](Denied::retry_after) is the
    /// whole wait the request would need now), or when the request can never
    /// pass ([`Denied::is_permanent`]).
    pub fn acquire_blocking<'a, Q>(
        &'a self,
        key: &'a Q,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_blocking_inner(key, 1, None, max_wait)
    }

    /// [`acquire_blocking`](Pace::acquire_blocking) of `n` tokens at once.
    ///
    /// # Errors
    /// As [`acquire_blocking`](Pace::acquire_blocking).
    pub fn acquire_n_blocking<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_blocking_inner(key, n, None, max_wait)
    }

    /// [`acquire_n_blocking`](Pace::acquire_n_blocking) under the call's own
    /// `quota` (see [`reserve_with`](Pace::reserve_with)).
    ///
    /// # Errors
    /// As [`acquire_blocking`](Pace::acquire_blocking).
    pub fn acquire_n_with_blocking<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Quota,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_blocking_inner(key, n, Some(quota), max_wait)
    }

    fn acquire_blocking_inner<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let (r, slot) = self.reserve_turn(key, n, quota, max_wait)?;
        while let Some(wait) = self.until(slot) {
            note_turn_sleep();
            std::thread::sleep(wait);
        }
        Ok(r)
    }

    /// [`acquire_blocking`](Pace::acquire_blocking) for async code on any
    /// executor (feature `timer`): the task sleeps until its turn on
    /// `futures-timer`'s timer thread, whose deadlines are exact to the
    /// nanosecond (a runtime's own timer may round up to its tick: tokio's
    /// makes a turn 0 to 2 ms late). Never before its slot; after it by the
    /// timer thread's wake-up and the scheduler's delay.
    ///
    /// Dropping the future before its turn refunds the reservation by the
    /// refund rule: the slot comes back when nothing was debited from the key
    /// since, and is otherwise lost (later callers keep their slots: fewer
    /// admissions, never more).
    ///
    /// # Errors
    /// As [`acquire_blocking`](Pace::acquire_blocking).
    #[cfg(feature = "timer")]
    pub async fn acquire<'a, Q>(
        &'a self,
        key: &'a Q,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_inner(key, 1, None, max_wait).await
    }

    /// [`acquire`](Pace::acquire) of `n` tokens at once.
    ///
    /// # Errors
    /// As [`acquire_blocking`](Pace::acquire_blocking).
    #[cfg(feature = "timer")]
    pub async fn acquire_n<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_inner(key, n, None, max_wait).await
    }

    /// [`acquire_n`](Pace::acquire_n) under the call's own `quota` (see
    /// [`reserve_with`](Pace::reserve_with)).
    ///
    /// # Errors
    /// As [`acquire_blocking`](Pace::acquire_blocking).
    #[cfg(feature = "timer")]
    pub async fn acquire_n_with<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Quota,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_inner(key, n, Some(quota), max_wait).await
    }

    #[cfg(feature = "timer")]
    async fn acquire_inner<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let (r, slot) = self.reserve_turn(key, n, quota, max_wait)?;
        let mut turn = Turn(Some(r));
        while let Some(wait) = self.until(slot) {
            note_turn_sleep();
            futures_timer::Delay::new(wait).await;
        }
        Ok(turn.0.take().expect("taken only here"))
    }

    /// The reservation of a turn and its slot (ns on the limiter's clock).
    fn reserve_turn<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        max_wait: Duration,
    ) -> Result<Turned<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let wait_ns = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
        self.reserve_turn_clocked(key, n, quota, wait_ns, || self.clock.now_ns())
    }

    /// A turn's reservation (a slot up to `wait_ns` ahead) and its slot, on
    /// `clock`.
    fn reserve_turn_clocked<'a, Q, F>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        wait_ns: u64,
        clock: F,
    ) -> Result<Turned<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        F: Fn() -> u64,
    {
        let mut slot = 0;
        let limits = quota.as_ref().map(Quota::limits_ref);
        let r =
            self.reserve_slot::<Q, _, true, false>(key, n, limits, wait_ns, &mut slot, clock)?;
        Ok((r, slot))
    }

    /// How long until the limiter's clock reaches `slot`, if it has not.
    fn until(&self, slot: u64) -> Option<Duration> {
        let now = self.clock.now_ns();
        (now < slot).then(|| Duration::from_nanos(slot - now))
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
        let hash = self.hasher.hash_one(key);
        let guard = self.pin();
        let limits = quota.unwrap_or_else(|| *self.quota.load(&guard)).limits();
        // A row is never live before its first debit; an absent one starts
        // from its floor.
        let t = &self.rows.table;
        let tat = with_probe!(self.rows, key, hash, &guard, |p| t.peek(
            hash,
            p,
            Some(now),
            &guard
        ))
        .map_or_else(|| t.floor(hash), |s| s.effective(now));
        limits.tokens(tat, now)
    }

    /// Refunds a detached [`Debit`] of `key` (see [`Reservation::refund`] for
    /// what a refund returns). A debit made by another limiter, or for a key
    /// whose hash differs from `key`'s, returns nothing
    /// ([`Refunded::Misdirected`]).
    pub fn refund<Q>(&self, key: &Q, debit: Debit) -> Refunded
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let now = self.clock.now_ns();
        self.refund_at_inner(key, debit, now)
    }

    /// [`refund`](Pace::refund) at an explicit time (for models).
    pub(crate) fn refund_at_inner<Q>(&self, key: &Q, debit: Debit, now: u64) -> Refunded
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        if debit.n == 0 {
            return Refunded::Nothing;
        }
        // A hold's lot is in one row of this limiter's table only (see
        // `keep`): handed to another key, it finds nothing.
        if debit.is_hold() && debit.limiter == self.id {
            return self.refund_hashed(key, debit.hash, debit, now);
        }
        match self.origin(&debit, key) {
            Some(hash) => self.refund_hashed(key, hash, debit, now),
            None => Refunded::Misdirected,
        }
    }

    /// The hash to refund `debit` to `key` with: the debit's own, if this
    /// limiter made it for a key hashed as `key`; `None` otherwise.
    #[cfg(not(pace_mutant = "refund_ignores_origin"))]
    fn origin<Q>(&self, debit: &Debit, key: &Q) -> Option<u64>
    where
        Q: ?Sized + Hash,
    {
        (debit.limiter == self.id && debit.hash == self.hasher.hash_one(key)).then_some(debit.hash)
    }

    /// Known-wrong variant for mutation tests: a debit is refunded to
    /// whatever limiter and key it is handed to, looked up by that key's
    /// hash.
    #[cfg(pace_mutant = "refund_ignores_origin")]
    fn origin<Q>(&self, _debit: &Debit, key: &Q) -> Option<u64>
    where
        Q: ?Sized + Hash,
    {
        Some(self.hasher.hash_one(key))
    }

    /// Keeps a detached hold ([`Hold::detach`]) of `key`: its tokens are
    /// settled as a debit from the hold's reading. False when there was
    /// nothing to settle: a plain debit (kept already), a hold that expired
    /// (counted as kept), or a debit of another limiter or key.
    pub fn keep<Q>(&self, key: &Q, debit: Debit) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        // A hold's lot is in one row of this limiter's table only: handed to
        // another key it finds no lot, so only the limiter is checked here
        // (no second hash of the key).
        if debit.n == 0 || !debit.is_hold() || debit.limiter != self.id {
            return false;
        }
        self.resolve_hashed(key, debit, true, self.clock.now_ns())
    }

    /// Resolves the hold `debit` of `key` (keeps or refunds it): false when
    /// its lot is gone.
    fn resolve_hashed<Q>(&self, key: &Q, debit: Debit, keep: bool, now: u64) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let Some(ticket) = debit.ticket() else {
            return false;
        };
        let hash = debit.hash;
        let guard = self.pin();
        let hash_of = |b| self.hash_of(b);
        let t = &self.rows.table;
        with_probe!(self.rows, key, hash, &guard, |p| t
            .resolve(hash, p, ticket, keep, now, &hash_of, &guard))
    }

    /// Refunds `debit` to `key`, whose hash is `hash`.
    fn refund_hashed<Q>(&self, key: &Q, hash: u64, debit: Debit, now: u64) -> Refunded
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        if debit.n == 0 {
            return Refunded::Nothing;
        }
        if debit.is_hold() {
            return if self.resolve_hashed(key, debit, false, now) {
                Refunded::Restored
            } else {
                Refunded::Expired
            };
        }
        let guard = self.pin();
        // The refund rule looks at no quota; the table takes one for its
        // known-wrong variants.
        let limits = &self.quota.load(&guard).limits();
        let hash_of = |b| self.hash_of(b);
        with_probe!(self.rows, key, hash, &guard, |p| self.rows.table.refund(
            limits, hash, p, debit.n, debit.tat, debit.prev, now, &hash_of, &guard,
        ))
    }

    /// The stripe of floors `key` shares with other keys (for models: a fresh
    /// row starts from its stripe's floor, the largest `tat` removed there).
    #[cfg(feature = "internals")]
    pub(crate) fn floor_stripe_inner<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        Table::floor_stripe(self.hasher.hash_one(key))
    }

    /// The settled `tat` (ns) of `key`'s row, if any (for models).
    #[cfg(feature = "internals")]
    pub(crate) fn row_tat_inner<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let hash = self.hasher.hash_one(key);
        let guard = self.pin();
        with_probe!(self.rows, key, hash, &guard, |p| self
            .rows
            .table
            .peek(hash, p, None, &guard)
            .map(|s| s.tat))
    }

    /// Removes every row whose bucket has refilled, and shrinks the table if
    /// it became sparse. Runs automatically (see DESIGN.md, "Sweeps"); call it
    /// to reclaim memory at a moment of your choosing. Returns rows removed.
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
        // A due time more than a horizon ahead means the clock stepped back:
        // treat it as due, so sweeps do not stall until the clock catches up.
        let horizon = self.horizon.load(Ordering::Relaxed);
        if now >= due || due - now > horizon {
            let next = now.saturating_add(horizon);
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
            if len >= mark.max(SWEEP_FLOOR).saturating_mul(2)
                && self
                    .sweep_mark
                    .compare_exchange(mark, len, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                self.start_pass(now, guard);
                return;
            }
        }
        self.rows.table.sweep_step(now, &|b| self.hash_of(b), guard);
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
    #[cfg(feature = "internals")]
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

/// Explicit-time entry points and state probes of [`Pace`], for models, fuzz
/// targets, benchmarks and tests: `use pace::internals::PaceInternals;`.
/// Feature `internals`: not a stable API.
#[cfg(feature = "internals")]
pub trait PaceInternals<K, S, C> {
    /// [`Pace::reserve_n`] deciding with `now` instead of a clock reading.
    fn reserve_n_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        now: u64,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>;
    /// [`Pace::reserve_n_with`] deciding with `now` instead of a clock
    /// reading.
    fn reserve_n_with_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Quota,
        now: u64,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>;
    /// The reservation of [`Pace::acquire_n_with_blocking`] (a slot up to `max_wait_ns`
    /// ahead) decided with `now`, and its slot (ns): the caller is let
    /// through when the clock reaches it. No sleep.
    fn reserve_turn_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        max_wait_ns: u64,
        now: u64,
    ) -> Result<Turned<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>;
    /// [`Pace::hold_n_with`] (the default quota for `None`) deciding with
    /// `now`.
    fn hold_n_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        now: u64,
    ) -> Result<Hold<'a, K, Q, S, C>, Denied>
    where
        K: Hash + Eq + Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        S: BuildHasher,
        C: Clock;
    /// [`Hold::keep`] (`keep`) or [`Hold::refund`] at `now`: a keep answers
    /// `Nothing` when it settled, `Expired` when the hold had expired.
    fn resolve_at<Q>(hold: Hold<'_, K, Q, S, C>, keep: bool, now: u64) -> Refunded
    where
        K: Hash + Eq + Borrow<Q>,
        Q: ?Sized + Hash + Eq,
        S: BuildHasher,
        C: Clock;
    /// The held tokens (ns of refill) of `key`'s row, if it has one.
    fn row_held<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq;
    /// [`Pace::peek`] at `now`.
    fn peek_at<Q>(&self, key: &Q, now: u64) -> u64
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq;
    /// [`Pace::refund`] at `now`.
    fn refund_at<Q>(&self, key: &Q, debit: Debit, now: u64) -> Refunded
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq;
    /// [`Pace::sweep`] at `now`.
    fn sweep_at(&self, now: u64) -> usize;
    /// The raw bucket word (`tat`, ns) of `key`'s row, if it has one.
    fn row_tat<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq;
    /// The stripe of floors `key` shares with other keys.
    fn floor_stripe<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq;
    /// Keys of the rows held now; only when no other operation is in flight.
    fn row_keys(&self) -> Vec<K>
    where
        K: Clone;
    /// Migrations of the table started since it was made.
    fn migrations(&self) -> usize;
    /// Whether a migration is running (callers copy its chunks).
    fn migrating(&self) -> bool;
    /// Cells of the array new rows go to: the current array, or the target
    /// of a running migration.
    fn slots(&self) -> usize;
    /// Cells of the chunks migrations have copied since the limiter was made.
    fn copied_slots(&self) -> usize;
    /// Full rows that calls' shares of migrations have removed instead of
    /// copying them, since the limiter was made (the copies a sweep pass
    /// makes count as the pass's removals, not here).
    fn copy_removed(&self) -> usize;
    /// Whether cells hold the keys' own bits (word-sized keys), not boxed keys.
    fn inline_keys(&self) -> bool;
}

#[cfg(feature = "internals")]
impl<K, S, C> PaceInternals<K, S, C> for Pace<K, S, C>
where
    K: Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    fn reserve_n_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        now: u64,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.reserve_n_at_inner(key, n, None, now)
    }

    fn reserve_n_with_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Quota,
        now: u64,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.reserve_n_at_inner(key, n, Some(quota), now)
    }

    fn reserve_turn_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        max_wait_ns: u64,
        now: u64,
    ) -> Result<Turned<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.reserve_turn_clocked(key, n, quota, max_wait_ns, || now)
    }

    fn hold_n_at<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        now: u64,
    ) -> Result<Hold<'a, K, Q, S, C>, Denied>
    where
        K: Hash + Eq + Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        S: BuildHasher,
        C: Clock,
    {
        self.hold_n_with_inner(key, n, quota, Some(now))
    }

    fn resolve_at<Q>(hold: Hold<'_, K, Q, S, C>, keep: bool, now: u64) -> Refunded
    where
        K: Hash + Eq + Borrow<Q>,
        Q: ?Sized + Hash + Eq,
        S: BuildHasher,
        C: Clock,
    {
        hold.resolve_at_inner(keep, now)
    }

    fn row_held<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let hash = self.hasher.hash_one(key);
        let guard = self.pin();
        let t = &self.rows.table;
        with_probe!(self.rows, key, hash, &guard, |p| t
            .peek(hash, p, None, &guard)
            .map(|s| s.held()))
    }

    fn peek_at<Q>(&self, key: &Q, now: u64) -> u64
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.peek_at_inner(key, None, now)
    }

    fn refund_at<Q>(&self, key: &Q, debit: Debit, now: u64) -> Refunded
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.refund_at_inner(key, debit, now)
    }

    fn migrations(&self) -> usize {
        self.rows.table.migrations()
    }

    fn migrating(&self) -> bool {
        self.rows.table.migrating(&self.pin())
    }

    fn slots(&self) -> usize {
        self.memory().slots
    }

    fn copied_slots(&self) -> usize {
        self.rows.table.copied_cells()
    }

    fn copy_removed(&self) -> usize {
        self.rows.table.copy_removed()
    }

    fn inline_keys(&self) -> bool {
        self.rows.word.is_some()
    }

    fn sweep_at(&self, now: u64) -> usize {
        self.sweep_at_inner(now)
    }

    fn row_tat<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.row_tat_inner(key)
    }

    fn floor_stripe<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.floor_stripe_inner(key)
    }

    fn row_keys(&self) -> Vec<K>
    where
        K: Clone,
    {
        self.row_keys_inner()
    }
}

/// Explicit-time refund and the debit's end, for models. Feature
/// `internals`: not a stable API.
#[cfg(feature = "internals")]
pub trait ReservationInternals {
    /// [`Reservation::refund`] at `now`.
    fn refund_at(self, now: u64) -> Refunded;
    /// Where this debit ends on the bucket's timeline (ns).
    fn debit_end_ns(&self) -> u64;
    /// The bucket's `tat` before this debit (ns): the debit cost
    /// `end − max(prev, reading)`.
    fn debit_prev_ns(&self) -> u64;
}

#[cfg(feature = "internals")]
impl<K, Q, S, C> ReservationInternals for Reservation<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    fn refund_at(self, now: u64) -> Refunded {
        self.refund_at_inner(now)
    }

    fn debit_end_ns(&self) -> u64 {
        self.debit_end_ns_inner()
    }

    fn debit_prev_ns(&self) -> u64 {
        self.debit.prev
    }
}

#[cfg(test)]
mod memory_stats {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn memory_reports_rows_slots_and_bytes() {
        let p: Pace<u64, RandomState, ManualClock> = Pace::builder(Rate::per_second(10).unwrap())
            .clock(ManualClock::new())
            .min_slots(4)
            .boxed_keys()
            .build()
            .unwrap();
        let empty = p.memory();
        assert_eq!((empty.rows, empty.slots, empty.entry_bytes), (0, 4, 0));
        for k in 0..100u64 {
            let _kept = p.reserve(&k).unwrap();
        }
        let m = p.memory();
        assert_eq!(m.rows, 100);
        assert_eq!(m.entry_bytes, 100 * p.entry_bytes());
        assert_eq!(p.entry_bytes(), 16, "hash and a u64 key");
        assert_eq!(m.slots, p.table_slots());
        assert!(m.slots >= 124, "13/16 load at most: {}", m.slots);
        assert!(m.array_bytes >= m.slots * 16);
        let mut keys = p.row_keys_inner();
        keys.sort_unstable();
        assert_eq!(keys, (0..100).collect::<Vec<u64>>());
        assert_eq!(p.table_bytes(), m.array_bytes + m.floor_bytes);
    }

    /// Rows of word-sized keys live in the array's 16-byte cells: no entry
    /// bytes, and the array is all the table holds per row.
    #[test]
    fn word_keys_have_rows_in_cells() {
        let p: Pace<u32, RandomState, ManualClock> = Pace::builder(Rate::per_second(10).unwrap())
            .clock(ManualClock::new())
            .min_slots(4)
            .build()
            .unwrap();
        assert!(PaceInternals::inline_keys(&p), "u32 keys fit in a cell");
        let empty = p.memory();
        assert_eq!((empty.rows, empty.slots, empty.entry_bytes), (0, 4, 0));
        for k in 0..100u32 {
            let _kept = p.reserve(&k).unwrap();
        }
        let m = p.memory();
        assert_eq!((m.rows, m.entry_bytes), (100, 0));
        assert!(m.slots >= 124, "13/16 load at most: {}", m.slots);
        assert!(m.array_bytes >= m.slots * 16);
        let mut keys = p.row_keys_inner();
        keys.sort_unstable();
        assert_eq!(keys, (0..100).collect::<Vec<u32>>());
        let s: Pace<String> = Pace::new(Rate::per_second(10).unwrap());
        assert!(!PaceInternals::inline_keys(&s), "a String has no bits");
    }

    /// A borrowed form of a word key that is not the key type itself (a
    /// caller's own `Borrow` impl) finds the row through its owned key.
    #[test]
    fn a_foreign_borrowed_form_finds_the_row() {
        #[derive(Hash, PartialEq, Eq)]
        struct Id(u64);
        static IDS: [Id; 10] = [
            Id(0),
            Id(1),
            Id(2),
            Id(3),
            Id(4),
            Id(5),
            Id(6),
            Id(7),
            Id(8),
            Id(9),
        ];
        impl Borrow<Id> for u64 {
            fn borrow(&self) -> &Id {
                &IDS[*self as usize % IDS.len()]
            }
        }
        impl ToOwned for Id {
            type Owned = u64;
            fn to_owned(&self) -> u64 {
                self.0
            }
        }
        let p: Pace<u64, RandomState, ManualClock> = Pace::builder(Rate::per_second(2).unwrap())
            .clock(ManualClock::new())
            .build()
            .unwrap();
        assert!(PaceInternals::inline_keys(&p));
        let _first = p.reserve(&7u64).expect("full");
        assert_eq!(p.peek(&Id(7)), 1);
        let second = p.reserve(&Id(7)).expect("capacity 2");
        assert_eq!(p.peek(&7u64), 0);
        assert!(p.reserve(&Id(7)).is_err());
        second.refund();
        assert_eq!(p.peek(&Id(7)), 1, "refunded through the foreign form");
        assert_eq!(p.peek(&Id(8)), 2, "no row");
    }
}

#[cfg(all(test, not(loom)))]
mod sweep_cursor {
    use super::*;
    use crate::clock::ManualClock;

    /// A caller that saw a pass running and claims its chunk only after the
    /// pass ended moves the idle cursor past `SWEEP_IDLE`. The next pass
    /// still starts from there: the due pass below removes every refilled
    /// row within `slots / sweep_chunk(slots)` calls. Known-wrong variant
    /// `sweep_cursor_stuck` starts a pass only from exactly `SWEEP_IDLE`,
    /// so no pass runs on that array again.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "10,000 inserts: too slow interpreted (rules and stress cover the table under Miri)"
    )]
    fn a_late_chunk_claim_does_not_stop_later_passes() {
        const T: u64 = 1_000_000;
        let p: Pace<u64, RandomState, ManualClock> =
            Pace::builder(Rate::new(1, std::time::Duration::from_nanos(T)).unwrap())
                .capacity(1)
                .clock(ManualClock::new())
                .build()
                .unwrap();
        let table = &p.rows.table;
        let hash_of = |b| p.hash_of(b);
        for k in 0..10_000u64 {
            let _kept = p.reserve_n_at_inner(&k, 1, None, 0).expect("a fresh key");
        }
        // Let the passes and the migration that growth started end (every
        // row is empty at 0: they remove nothing).
        while table.migrating(&p.pin()) || table.sweep_running(&p.pin()) {
            assert!(
                p.reserve_n_at_inner(&0, 1, None, 0).is_err(),
                "key 0 is empty"
            );
        }
        table.sweep_chunk_late(0, &hash_of, &p.pin());
        let rows = p.len();
        assert_eq!(rows, 10_000);
        let slots = p.table_slots();
        assert!(slots > crate::table::SWEEP_AT_ONCE, "a chunked pass");
        let now = 10 * p.horizon.load(Ordering::Relaxed);
        let mut k = 1_000_000u64;
        for _ in 0..slots.div_ceil(crate::table::sweep_chunk(slots)) {
            k += 1;
            p.reserve_n_at_inner(&k, 1, None, now)
                .expect("a fresh key")
                .refund_at_inner(now);
        }
        assert_eq!(
            p.len(),
            0,
            "{rows} refilled rows in {slots} slots: no pass ran after a late claim"
        );
    }
}
