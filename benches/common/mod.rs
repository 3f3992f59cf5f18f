//! Shared by the bench binaries: the contenders, key sets, the two rate
//! regimes and a scoped-thread runner.
//!
//! Every contender answers the same two questions on the same keys:
//! `reserve` (debit one token, keep it) and `churn` (debit one token of a key
//! nobody used before and give it back, the claimed-id flood).
#![allow(dead_code)] // each bench binary uses a different part of this module

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use pace::internals::BucketMath;
use pace::{Clock, Pace, QuantaClock, Rate};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A rate and burst given identically to every contender.
#[derive(Clone, Copy, Debug)]
pub struct Regime {
    /// Short name used in benchmark ids.
    pub name: &'static str,
    /// Nanoseconds per token.
    pub interval_ns: u64,
    /// Bucket capacity (governor's burst).
    pub capacity: u32,
    /// Tokens debited from every key at setup, so that each measured
    /// reserve meets a live (not full) row.
    pub prime: u32,
}

/// Admissions almost always: 1,000,000 tokens/s per key, burst 2^32-1
/// (a 71.6 min bucket), every key primed with 2^31 tokens of debt. Each
/// measured reserve is an admission (one CAS) on a live row, and no row can
/// refill (so none is swept) while the benchmark runs.
pub const ADMIT: Regime = Regime {
    name: "admit",
    interval_ns: 1_000,
    capacity: u32::MAX,
    prime: 1 << 31,
};

/// A realistic per-client limit: 10 requests/s, burst 10 (one second). Hot
/// keys are denied almost always; with 1M keys most reserves are admitted
/// and rows refill and are swept (by Pace) while the benchmark runs.
pub const REAL: Regime = Regime {
    name: "real",
    interval_ns: 100_000_000,
    capacity: 10,
    prime: 0,
};

impl Regime {
    pub fn rate(&self) -> Rate {
        Rate::new(1, Duration::from_nanos(self.interval_ns)).expect("valid rate")
    }

    pub fn quota(&self) -> Quota {
        Quota::with_period(Duration::from_nanos(self.interval_ns))
            .expect("non-zero period")
            .allow_burst(NonZeroU32::new(self.capacity).expect("non-zero burst"))
    }

    pub fn math(&self) -> BucketMath {
        BucketMath::new(self.interval_ns, u64::from(self.capacity)).expect("valid bucket")
    }
}

/// A key type as the benchmarks use it: owned `K`, borrowed `K::Q`.
pub trait Key: Hash + Eq + Clone + Send + Sync + 'static + Borrow<Self::Q> {
    type Q: ?Sized + Hash + Eq + ToOwned<Owned = Self> + Sync;
    const NAME: &'static str;
    fn q(&self) -> &Self::Q;
    /// The `i`-th key of a set (distinct for distinct `i`).
    fn make(i: u64) -> Self;
    /// Writes the `i`-th churn key into `buf` (reused, so that making the
    /// key costs the same for every contender).
    fn churn_key(buf: &mut Self, i: u64);
    fn empty() -> Self;
}

impl Key for u64 {
    type Q = u64;
    const NAME: &'static str = "u64";
    #[inline]
    fn q(&self) -> &u64 {
        self
    }
    #[inline]
    fn make(i: u64) -> u64 {
        // Spread, not sequential; distinct because the multiplier is odd.
        i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    #[inline]
    fn churn_key(buf: &mut u64, i: u64) {
        *buf = u64::make(i);
    }
    fn empty() -> u64 {
        0
    }
}

impl Key for String {
    type Q = str;
    const NAME: &'static str = "str";
    #[inline]
    fn q(&self) -> &str {
        self.as_str()
    }
    /// Short client ids: "u" and 6 to 16 hex digits ("u0001a2b3").
    fn make(i: u64) -> String {
        let mut s = String::new();
        String::churn_key(&mut s, i);
        s
    }
    #[inline]
    fn churn_key(buf: &mut String, i: u64) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        buf.clear();
        buf.push('u');
        let digits = ((64 - i.leading_zeros()).div_ceil(4)).max(6);
        for d in (0..digits).rev() {
            buf.push(HEX[((i >> (4 * d)) & 0xf) as usize] as char);
        }
    }
    fn empty() -> String {
        String::with_capacity(24)
    }
}

/// What every contender does.
pub trait Contender<K: Key>: Sync {
    /// Debits one token from `key` and keeps it. True when admitted.
    fn reserve(&self, key: &K) -> bool;
    /// Debits one token from a new `key` and gives it back (governor, which
    /// has no refund, only debits).
    fn churn(&self, key: &K);
    /// Setup: debit `n` tokens from `key` (creates its row).
    fn prime(&self, key: &K, n: u32);
    /// Rows held.
    fn rows(&self) -> usize;
}

/// `Pace` with clock `C` and hasher `S` (default: randomly seeded SipHash).
pub struct PaceC<K, C, S = RandomState>(pub Pace<K, S, C>);

impl<K: Key, C: Clock> PaceC<K, C> {
    pub fn new(r: &Regime, clock: C) -> Self {
        PaceC::with_hasher(r, clock, RandomState::new())
    }
}

impl<K: Key, C: Clock, S: BuildHasher> PaceC<K, C, S> {
    pub fn with_hasher(r: &Regime, clock: C, hasher: S) -> Self {
        PaceC(
            Pace::builder(r.rate())
                .capacity(u64::from(r.capacity))
                .clock(clock)
                .hasher(hasher)
                .build()
                .expect("valid limiter"),
        )
    }
}

/// `pace-entries`: `Pace` whose rows are separately allocated entries even
/// for word-sized keys (`Builder::boxed_keys`, not a stable API): the table
/// every other key type uses, measured on the same keys.
pub fn pace_entries<K: Key, C: Clock>(r: &Regime, clock: C) -> PaceC<K, C> {
    PaceC(
        Pace::builder(r.rate())
            .capacity(u64::from(r.capacity))
            .clock(clock)
            .boxed_keys()
            .build()
            .expect("valid limiter"),
    )
}

/// `pace-huge`: `Pace` at defaults but for `Builder::huge_pages(true)`:
/// its slot arrays of 4 MiB and more ask for transparent huge pages.
pub fn pace_huge<K: Key, C: Clock>(r: &Regime, clock: C) -> PaceC<K, C> {
    PaceC(
        Pace::builder(r.rate())
            .capacity(u64::from(r.capacity))
            .clock(clock)
            .hasher(RandomState::new())
            .huge_pages(true)
            .build()
            .expect("valid limiter"),
    )
}

/// `pace-with`: `Pace` at defaults whose every reserve brings its own quota
/// (`reserve_with`, the same rate and capacity as the limiter's).
pub struct PaceWith<K, C>(pub Pace<K, RandomState, C>, pub pace::Quota);

impl<K: Key, C: Clock> PaceWith<K, C> {
    pub fn new(r: &Regime, clock: C) -> Self {
        let p = PaceC::new(r, clock).0;
        let q = pace::Quota::new(r.rate(), u64::from(r.capacity)).expect("valid quota");
        PaceWith(p, q)
    }
}

impl<K: Key, C: Clock> Contender<K> for PaceWith<K, C> {
    #[inline]
    fn reserve(&self, key: &K) -> bool {
        self.0.reserve_with(key.q(), self.1).is_ok()
    }
    #[inline]
    fn churn(&self, key: &K) {
        if let Ok(r) = self.0.reserve_with(key.q(), self.1) {
            r.refund();
        }
    }
    fn prime(&self, key: &K, n: u32) {
        let n = u64::from(n.max(1));
        let _kept = self.0.reserve_n_with(key.q(), n, self.1).expect("admitted");
    }
    fn rows(&self) -> usize {
        self.0.len()
    }
}

/// `pace-hold-keep` / `pace-hold-refund`: `Pace` at defaults where every
/// call is a hold (`Pace::hold`) then kept (`true`: a debit settled by a
/// second CAS) or refunded (`false`: nothing spent).
pub struct PaceHold<K, C>(pub Pace<K, RandomState, C>, pub bool);

impl<K: Key, C: Clock> PaceHold<K, C> {
    pub fn new(r: &Regime, clock: C, keep: bool) -> Self {
        PaceHold(PaceC::new(r, clock).0, keep)
    }
}

impl<K: Key, C: Clock> Contender<K> for PaceHold<K, C> {
    #[inline]
    fn reserve(&self, key: &K) -> bool {
        match self.0.hold(key.q()) {
            Ok(h) if self.1 => h.keep(),
            Ok(h) => h.refund().returned(),
            Err(_) => false,
        }
    }
    #[inline]
    fn churn(&self, key: &K) {
        if let Ok(h) = self.0.hold(key.q()) {
            h.refund();
        }
    }
    fn prime(&self, key: &K, n: u32) {
        let n = u64::from(n.max(1));
        let _kept = self.0.reserve_n(key.q(), n).expect("admitted");
    }
    fn rows(&self) -> usize {
        self.0.len()
    }
}

/// `pace-fast`: `Pace` with [`Builder::fast_hasher`](pace::Builder::fast_hasher)
/// (feature `foldhash`) instead of SipHash.
#[cfg(feature = "foldhash")]
pub fn pace_fast<K: Key, C: Clock>(r: &Regime, clock: C) -> PaceC<K, C, pace::FastHasher> {
    PaceC(
        Pace::builder(r.rate())
            .capacity(u64::from(r.capacity))
            .clock(clock)
            .fast_hasher()
            .build()
            .expect("valid limiter"),
    )
}

impl<K: Key, C: Clock, S: BuildHasher + Sync> Contender<K> for PaceC<K, C, S> {
    #[inline]
    fn reserve(&self, key: &K) -> bool {
        self.0.reserve(key.q()).is_ok()
    }
    #[inline]
    fn churn(&self, key: &K) {
        if let Ok(r) = self.0.reserve(key.q()) {
            r.refund();
        }
    }
    fn prime(&self, key: &K, n: u32) {
        if n > 0 {
            let _kept = self.0.reserve_n(key.q(), u64::from(n)).expect("admitted");
        } else {
            let _kept = self.0.reserve(key.q());
        }
    }
    fn rows(&self) -> usize {
        self.0.len()
    }
}

/// governor's keyed limiter with its default store (DashMap) and clock
/// (quanta).
pub struct Governor<K: Key>(pub DefaultKeyedRateLimiter<K>);

impl<K: Key> Governor<K> {
    pub fn new(r: &Regime) -> Self {
        Governor(RateLimiter::keyed(r.quota()))
    }
}

impl<K: Key> Contender<K> for Governor<K> {
    #[inline]
    fn reserve(&self, key: &K) -> bool {
        self.0.check_key(key).is_ok()
    }
    #[inline]
    fn churn(&self, key: &K) {
        let _ = self.0.check_key(key);
    }
    fn prime(&self, key: &K, n: u32) {
        match NonZeroU32::new(n) {
            Some(n) => {
                let ok = self.0.check_key_n(key, n);
                assert!(matches!(ok, Ok(Ok(_))), "priming admitted");
            }
            None => {
                let _ = self.0.check_key(key);
            }
        }
    }
    fn rows(&self) -> usize {
        self.0.len()
    }
}

/// The undrained part of a one-`n` reservation ending at `own`, returned to
/// bucket `tat` at `now` (pace's refund rule; `BucketMath` exposes no refund).
/// `None` when the bucket is full afterwards (remove the row).
#[inline]
fn refund_tat(interval_ns: u64, tat: u64, now: u64, own: u64) -> Option<u64> {
    let back = interval_ns.min(own.saturating_sub(now));
    let new = tat.saturating_sub(back);
    (new > now).then_some(new)
}

/// The obvious baseline: one lock around a `HashMap` of bucket words, with
/// the crate's bucket math. The clock is read under the lock.
pub struct MutexMap<K> {
    map: Mutex<HashMap<K, u64>>,
    math: BucketMath,
    interval_ns: u64,
    clock: QuantaClock,
}

impl<K: Key> MutexMap<K> {
    pub fn new(r: &Regime) -> Self {
        MutexMap {
            map: Mutex::new(HashMap::new()),
            math: r.math(),
            interval_ns: r.interval_ns,
            clock: QuantaClock::new(),
        }
    }

    #[inline]
    fn reserve_n(&self, key: &K, n: u64) -> Option<u64> {
        let mut map = self.map.lock().unwrap();
        let now = self.clock.now_ns();
        if let Some(tat) = map.get_mut(key.q()) {
            let new = self.math.reserve(*tat, now, n).ok()?;
            *tat = new;
            return Some(new);
        }
        let new = self.math.reserve(0, now, n).ok()?;
        map.insert(key.clone(), new);
        Some(new)
    }
}

impl<K: Key> Contender<K> for MutexMap<K> {
    #[inline]
    fn reserve(&self, key: &K) -> bool {
        self.reserve_n(key, 1).is_some()
    }
    #[inline]
    fn churn(&self, key: &K) {
        if let Some(own) = self.reserve_n(key, 1) {
            let mut map = self.map.lock().unwrap();
            let now = self.clock.now_ns();
            if let Some(tat) = map.get_mut(key.q()) {
                match refund_tat(self.interval_ns, *tat, now, own) {
                    Some(t) => *tat = t,
                    None => {
                        map.remove(key.q());
                    }
                }
            }
        }
    }
    fn prime(&self, key: &K, n: u32) {
        let _ = self.reserve_n(key, u64::from(n.max(1)));
    }
    fn rows(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

/// A sharded-lock map of atomic bucket words (what governor does, without
/// governor), with the crate's bucket math and one CAS per admission.
pub struct DashAtomic<K: Key> {
    map: DashMap<K, AtomicU64>,
    math: BucketMath,
    interval_ns: u64,
    clock: QuantaClock,
}

impl<K: Key> DashAtomic<K> {
    pub fn new(r: &Regime) -> Self {
        DashAtomic {
            map: DashMap::new(),
            math: r.math(),
            interval_ns: r.interval_ns,
            clock: QuantaClock::new(),
        }
    }

    #[inline]
    fn debit(&self, word: &AtomicU64, now: u64, n: u64) -> Option<u64> {
        let mut tat = word.load(Ordering::Acquire);
        loop {
            let new = self.math.reserve(tat, now, n).ok()?;
            match word.compare_exchange_weak(tat, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(new),
                Err(t) => tat = t,
            }
        }
    }

    #[inline]
    fn reserve_n(&self, key: &K, n: u64) -> Option<u64> {
        let now = self.clock.now_ns();
        if let Some(w) = self.map.get(key.q()) {
            return self.debit(&w, now, n);
        }
        // Absent is full: decide before creating anything.
        self.math.reserve(0, now, n).ok()?;
        let w = self.map.entry(key.clone()).or_insert(AtomicU64::new(0));
        self.debit(&w, now, n)
    }
}

impl<K: Key> Contender<K> for DashAtomic<K> {
    #[inline]
    fn reserve(&self, key: &K) -> bool {
        self.reserve_n(key, 1).is_some()
    }
    #[inline]
    fn churn(&self, key: &K) {
        if let Some(own) = self.reserve_n(key, 1) {
            let now = self.clock.now_ns();
            let mut full = false;
            if let Some(w) = self.map.get(key.q()) {
                let mut tat = w.load(Ordering::Acquire);
                loop {
                    let (new, f) = match refund_tat(self.interval_ns, tat, now, own) {
                        Some(t) => (t, false),
                        None => (now, true),
                    };
                    match w.compare_exchange_weak(tat, new, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => {
                            full = f;
                            break;
                        }
                        Err(t) => tat = t,
                    }
                }
            }
            if full {
                self.map
                    .remove_if(key.q(), |_, w| w.load(Ordering::Acquire) <= now);
            }
        }
    }
    fn prime(&self, key: &K, n: u32) {
        let _ = self.reserve_n(key, u64::from(n.max(1)));
    }
    fn rows(&self) -> usize {
        self.map.len()
    }
}

/// `n` distinct keys.
pub fn keys<K: Key>(n: usize) -> Vec<K> {
    (0..n as u64).map(K::make).collect()
}

/// A fixed random access sequence over `n` keys (same for every contender).
pub fn access_pattern(n: usize, len: usize, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen_range(0..n as u32)).collect()
}

/// Ops thread `t` of `threads` does out of `total`.
pub fn share(total: u64, threads: usize, t: usize) -> u64 {
    let threads = threads as u64;
    total / threads + u64::from((t as u64) < total % threads)
}

/// Runs `f(thread_index, ops)` on `threads` threads released together;
/// returns the wall time from the release until the last one finished.
pub fn run_threads<F>(threads: usize, total: u64, f: &F) -> Duration
where
    F: Fn(usize, u64) + Sync,
{
    if threads == 1 {
        let start = Instant::now();
        f(0, total);
        return start.elapsed();
    }
    let barrier = Barrier::new(threads);
    let start = std::thread::scope(|s| {
        for t in 1..threads {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                f(t, share(total, threads, t));
            });
        }
        barrier.wait();
        let start = Instant::now();
        f(0, share(total, threads, 0));
        start
    });
    start.elapsed()
}

/// The machine's load average, for the record.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}
