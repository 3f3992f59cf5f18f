//! Returning clients: the usual server workload, clients below their limits
//! whose buckets refill between their requests. ns per call over 20,000
//! clients asked in turn (round-robin), `Pace` with its defaults against
//! governor's default keyed limiter, in one process, in alternating rounds
//! (a harness, not criterion).
//!
//! ```text
//! cargo bench -p pace-benches --bench returning            # PACE_RETURNING_ROUNDS=6
//! PACE_RETURNING_ONLY=fake-2s cargo bench -p pace-benches --bench returning
//! ```
//!
//! Workloads (`PACE_RETURNING_ONLY` picks one by name):
//!
//! * `u64-1ms`, `string-1ms`: real clocks (pace's `QuantaClock`, governor's
//!   default clock), 1,000 per second, capacity 1: a token is back within
//!   1 ms and a client comes back every few ms, its bucket full again.
//!   `String` keys are `client-000000000042`; a call borrows the key as
//!   `&str` (pace) or clones it (governor's `check_key` takes `&K`, so it
//!   borrows too: the keys are built once).
//! * `u64-live`, `string-live`: the same clients and clocks with one token a
//!   second and a burst of 1,000,000: a client back every few ms finds its
//!   bucket below full, its row live, and is admitted (the live-row price on
//!   real clocks, beside which the returning clients are judged).
//! * `fake-2s`: `u64` keys, 10 per second, capacity 10, pace's `ManualClock`
//!   and governor's `FakeRelativeClock` advanced 100 µs per call: each client
//!   comes back every 2 s (two horizons), its bucket full.
//! * `fake-20ms`: the same clients advanced 1 µs per call: each comes back
//!   every 20 ms and its row stays live (the live-row price).
//! * `flood`: 1,000,000 never-seen `String` ids, one call each, real clocks,
//!   1,000 per second, capacity 1.
//!
//! A round runs each contender for `PACE_RETURNING_CALLS` calls (default
//! 2,000,000, a hundred turns of the clients; the flood's 1M ids once) after
//! a warm-up turn, the order of the contenders alternating between rounds.
//! Each round prints both figures and governor's time over pace's (above 1:
//! pace is faster); the summary gives the median of those ratios over the
//! rounds, every round's ratio, and says when the ratio flips.
//!
//! With `PACE_RETURNING_ALLOCS=1` (default on) it also counts, with a
//! counting global allocator, the allocations per call of pace's `String`
//! workload over one turn of the clients after the warm-up rounds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use pace::internals::PaceInternals;
use pace::{ManualClock, Pace, Rate};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const CLIENTS: usize = 20_000;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("client-{i:012}")).collect()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// One contender of a workload: `run(calls)` makes `calls` calls and returns
/// the time they took and how many were admitted.
type Run<'a> = Box<dyn FnMut(u64) -> (Duration, u64) + 'a>;

/// Prints pace's table after a round: rows, slots and migrations so far.
fn state<K: std::hash::Hash + Eq, S: std::hash::BuildHasher, C: pace::Clock>(p: &Pace<K, S, C>) {
    eprintln!(
        "  pace: {} rows, {} slots, {} migrations so far",
        p.len(),
        p.table_slots(),
        p.migrations()
    );
}

fn per_call(d: Duration, calls: u64) -> f64 {
    d.as_nanos() as f64 / calls as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Alternating rounds of the two contenders; prints every round and the
/// summary row.
fn rounds(name: &str, rounds: u64, calls: u64, mut pace: Run<'_>, mut gov: Run<'_>) {
    println!("\n### {name}\n");
    println!("| round | load (1/5/15 min) | first | pace ns/call | governor ns/call | governor / pace | pace admitted | governor admitted |");
    println!("|---:|---|---|---:|---:|---:|---:|---:|");
    let mut ratios = Vec::new();
    let mut pace_ns = Vec::new();
    let mut gov_ns = Vec::new();
    for r in 0..rounds {
        let load = loadavg();
        let (p, g, first) = if r % 2 == 0 {
            let p = pace(calls);
            let g = gov(calls);
            (p, g, "pace")
        } else {
            let g = gov(calls);
            let p = pace(calls);
            (p, g, "governor")
        };
        let (pn, gn) = (per_call(p.0, calls), per_call(g.0, calls));
        ratios.push(gn / pn);
        pace_ns.push(pn);
        gov_ns.push(gn);
        println!(
            "| {r} | {load} | {first} | {pn:.1} | {gn:.1} | {:.2} | {} | {} |",
            gn / pn,
            p.1,
            g.1
        );
    }
    let all: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    let flips = ratios.iter().any(|r| *r >= 1.0) && ratios.iter().any(|r| *r < 1.0);
    let (pmin, pmax) = range(&pace_ns);
    let (gmin, gmax) = range(&gov_ns);
    println!(
        "\nsummary {name}: pace {pmin:.1}–{pmax:.1} ns, governor {gmin:.1}–{gmax:.1} ns, governor / pace median {:.2} (rounds: {}){}",
        median(&mut ratios.clone()),
        all.join(", "),
        if flips { "; the ratio flips between rounds" } else { "" }
    );
}

fn range(v: &[f64]) -> (f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    (min, max)
}

/// The real-clock limits: `(name, per second, capacity)`.
type Limit = (&'static str, u32, u32);

/// Returning clients: a token back within 1 ms, each client back every few
/// ms with its bucket full again.
const RETURNING: (u32, u32) = (1000, 1);
/// Live rows: one token a second and a burst of 1,000,000, so a client back
/// every few ms finds its bucket below full (its row live) and is admitted.
const LIVE: (u32, u32) = (1, 1_000_000);

fn limits(per_s: u32, cap: u32) -> (Pace<u64>, DefaultKeyed<u64>) {
    let p = Pace::builder(Rate::per_second(u64::from(per_s)).unwrap())
        .capacity(u64::from(cap))
        .build()
        .unwrap();
    let g = RateLimiter::keyed(
        Quota::per_second(NonZeroU32::new(per_s).unwrap())
            .allow_burst(NonZeroU32::new(cap).unwrap()),
    );
    (p, g)
}

type DefaultKeyed<K> = governor::DefaultKeyedRateLimiter<K>;

fn real_u64((name, per_s, cap): Limit, n_rounds: u64, calls: u64) {
    let (p, g) = limits(per_s, cap);
    let keys: Vec<u64> = (0..CLIENTS as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let mut pi = 0usize;
    let mut gi = 0usize;
    let pace_run: Run<'_> = Box::new(move |calls| {
        let mut ok = 0;
        let t = Instant::now();
        for _ in 0..calls {
            ok += u64::from(p.reserve(black_box(&keys[pi])).is_ok());
            pi = if pi + 1 == CLIENTS { 0 } else { pi + 1 };
        }
        let took = t.elapsed();
        state(&p);
        (took, ok)
    });
    let keys2: Vec<u64> = (0..CLIENTS as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let gov_run: Run<'_> = Box::new(move |calls| {
        let mut ok = 0;
        let t = Instant::now();
        for _ in 0..calls {
            ok += u64::from(g.check_key(black_box(&keys2[gi])).is_ok());
            gi = if gi + 1 == CLIENTS { 0 } else { gi + 1 };
        }
        (t.elapsed(), ok)
    });
    warm_then_rounds(name, n_rounds, calls, pace_run, gov_run);
}

fn warm_then_rounds(name: &str, n: u64, calls: u64, mut p: Run<'_>, mut g: Run<'_>) {
    p(CLIENTS as u64 * 4);
    g(CLIENTS as u64 * 4);
    rounds(name, n, calls, p, g);
}

fn real_string((name, per_s, cap): Limit, n_rounds: u64, calls: u64, allocs: bool) {
    let p: Pace<String> = Pace::builder(Rate::per_second(u64::from(per_s)).unwrap())
        .capacity(u64::from(cap))
        .build()
        .unwrap();
    let g: DefaultKeyed<String> = RateLimiter::keyed(
        Quota::per_second(NonZeroU32::new(per_s).unwrap())
            .allow_burst(NonZeroU32::new(cap).unwrap()),
    );
    let keys = names(CLIENTS);
    let keys2 = names(CLIENTS);
    let p = &p;
    let keys = &keys;
    let mut pi = 0usize;
    let mut gi = 0usize;
    let pace_run: Run<'_> = Box::new(move |calls| {
        let mut ok = 0;
        let t = Instant::now();
        for _ in 0..calls {
            ok += u64::from(p.reserve(black_box(keys[pi].as_str())).is_ok());
            pi = if pi + 1 == CLIENTS { 0 } else { pi + 1 };
        }
        let took = t.elapsed();
        state(p);
        (took, ok)
    });
    let gov_run: Run<'_> = Box::new(move |calls| {
        let mut ok = 0;
        let t = Instant::now();
        for _ in 0..calls {
            ok += u64::from(g.check_key(black_box(&keys2[gi])).is_ok());
            gi = if gi + 1 == CLIENTS { 0 } else { gi + 1 };
        }
        (t.elapsed(), ok)
    });
    warm_then_rounds(name, n_rounds, calls, pace_run, gov_run);
    if allocs {
        // One more turn of the clients, counted: allocations per call.
        let calls = CLIENTS as u64 * 10;
        let before = ALLOCS.load(Ordering::Relaxed);
        let mut i = 0;
        for _ in 0..calls {
            black_box(p.reserve(keys[i].as_str()).is_ok());
            i = if i + 1 == CLIENTS { 0 } else { i + 1 };
        }
        let n = ALLOCS.load(Ordering::Relaxed) - before;
        println!(
            "\nallocations {name}: pace {n} in {calls} calls ({:.3} per call), rows {}",
            n as f64 / calls as f64,
            p.len()
        );
    }
}

/// Fake clocks advanced `step_ns` per call: 10 per second, capacity 10.
fn fake(name: &str, step_ns: u64, n_rounds: u64, calls: u64) {
    let clock = ManualClock::new();
    let p: Pace<u64, std::collections::hash_map::RandomState, ManualClock> =
        Pace::builder(Rate::per_second(10).unwrap())
            .capacity(10)
            .clock(clock.clone())
            .build()
            .unwrap();
    let fclock = FakeRelativeClock::default();
    let g = RateLimiter::dashmap_with_clock(
        Quota::per_second(NonZeroU32::new(10).unwrap()).allow_burst(NonZeroU32::new(10).unwrap()),
        fclock.clone(),
    );
    let keys: Vec<u64> = (0..CLIENTS as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let keys2 = keys.clone();
    let step = Duration::from_nanos(step_ns);
    let mut pi = 0usize;
    let mut gi = 0usize;
    let pace_run: Run<'_> = Box::new(move |calls| {
        let mut ok = 0;
        let t = Instant::now();
        for _ in 0..calls {
            clock.advance(step);
            ok += u64::from(p.reserve(black_box(&keys[pi])).is_ok());
            pi = if pi + 1 == CLIENTS { 0 } else { pi + 1 };
        }
        let took = t.elapsed();
        state(&p);
        (took, ok)
    });
    let gov_run: Run<'_> = Box::new(move |calls| {
        let mut ok = 0;
        let t = Instant::now();
        for _ in 0..calls {
            fclock.advance(step);
            ok += u64::from(g.check_key(black_box(&keys2[gi])).is_ok());
            gi = if gi + 1 == CLIENTS { 0 } else { gi + 1 };
        }
        (t.elapsed(), ok)
    });
    warm_then_rounds(name, n_rounds, calls, pace_run, gov_run);
}

/// 1M never-seen `String` ids per round, one call each.
fn flood(n_rounds: u64) {
    const IDS: usize = 1_000_000;
    let rate = Rate::per_second(1000).unwrap();
    let p: Pace<String> = Pace::builder(rate).capacity(1).build().unwrap();
    let g = RateLimiter::keyed(
        Quota::per_second(NonZeroU32::new(1000).unwrap()).allow_burst(NonZeroU32::MIN),
    );
    let mut pr = 0u64;
    let mut gr = 0u64;
    let pace_run: Run<'_> = Box::new(move |calls| {
        let ids: Vec<String> = (0..calls)
            .map(|i| format!("p{pr:03}-client-{i:09}"))
            .collect();
        pr += 1;
        let mut ok = 0;
        let t = Instant::now();
        for id in &ids {
            ok += u64::from(p.reserve(black_box(id.as_str())).is_ok());
        }
        (t.elapsed(), ok)
    });
    let gov_run: Run<'_> = Box::new(move |calls| {
        let ids: Vec<String> = (0..calls)
            .map(|i| format!("g{gr:03}-client-{i:09}"))
            .collect();
        gr += 1;
        let mut ok = 0;
        let t = Instant::now();
        for id in &ids {
            ok += u64::from(g.check_key(black_box(id)).is_ok());
        }
        (t.elapsed(), ok)
    });
    rounds("flood", n_rounds, IDS as u64, pace_run, gov_run);
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the
    // command line.
    let n = env("PACE_RETURNING_ROUNDS", 6);
    let calls = env("PACE_RETURNING_CALLS", 2_000_000);
    let allocs = env("PACE_RETURNING_ALLOCS", 1) != 0;
    let only = std::env::var("PACE_RETURNING_ONLY").ok();
    let want = |name: &str| only.as_deref().is_none_or(|o| o == name);
    println!(
        "returning clients: {CLIENTS} clients round-robin, {n} rounds of {calls} calls; cpu: {}",
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| s
                .lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.to_owned()))
            .unwrap_or_default()
    );
    let (r, c) = RETURNING;
    if want("u64-1ms") {
        real_u64(("u64-1ms", r, c), n, calls);
    }
    if want("string-1ms") {
        real_string(("string-1ms", r, c), n, calls, allocs);
    }
    let (r, c) = LIVE;
    if want("u64-live") {
        real_u64(("u64-live", r, c), n, calls);
    }
    if want("string-live") {
        real_string(("string-live", r, c), n, calls, false);
    }
    if want("fake-2s") {
        fake("fake-2s", 100_000, n, calls);
    }
    if want("fake-20ms") {
        fake("fake-20ms", 1_000, n, calls);
    }
    if want("flood") {
        flood(n);
    }
}
