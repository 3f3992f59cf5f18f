//! Memory: bytes per live row, and a flood of distinct keys followed by one
//! horizon of time, `Pace` against governor. A counting global allocator
//! (this binary only) counts the bytes requested from the allocator; a glibc
//! chunk estimate (`max(32, round16(size + 8))`) shows what small separate
//! allocations really occupy.
//!
//! ```text
//! cargo bench -p pace-benches --bench memory                       # rows + 10M flood
//! PACE_FLOOD=1000000 cargo bench -p pace-benches --bench memory    # a smaller flood
//! ```

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{loadavg, Key, REAL};
use governor::clock::FakeRelativeClock;
use governor::RateLimiter;
use pace::{ManualClock, Pace};

struct Counting;

static BYTES: AtomicUsize = AtomicUsize::new(0);
static CHUNKS: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// What glibc's malloc occupies for a request of `size` bytes (small and
/// medium chunks: 8 bytes of header, 16-byte alignment, 32 bytes at least).
fn chunk(size: usize) -> usize {
    ((size + 8 + 15) & !15).max(32)
}

// SAFETY: every method forwards to `System` with the same arguments and only
// adds relaxed counter updates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let now = BYTES.fetch_add(l.size(), Ordering::Relaxed) + l.size();
        CHUNKS.fetch_add(chunk(l.size()), Ordering::Relaxed);
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let now = BYTES.fetch_add(l.size(), Ordering::Relaxed) + l.size();
        CHUNKS.fetch_add(chunk(l.size()), Ordering::Relaxed);
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        BYTES.fetch_sub(l.size(), Ordering::Relaxed);
        CHUNKS.fetch_sub(chunk(l.size()), Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        BYTES.fetch_sub(l.size(), Ordering::Relaxed);
        CHUNKS.fetch_sub(chunk(l.size()), Ordering::Relaxed);
        let now = BYTES.fetch_add(new, Ordering::Relaxed) + new;
        CHUNKS.fetch_add(chunk(new), Ordering::Relaxed);
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[derive(Clone, Copy)]
struct Mem {
    bytes: usize,
    chunks: usize,
}

fn mem() -> Mem {
    Mem {
        bytes: BYTES.load(Ordering::Relaxed),
        chunks: CHUNKS.load(Ordering::Relaxed),
    }
}

fn since(a: Mem) -> Mem {
    let b = mem();
    Mem {
        bytes: b.bytes.saturating_sub(a.bytes),
        chunks: b.chunks.saturating_sub(a.chunks),
    }
}

/// Frees what crossbeam-epoch holds back for readers that are gone: pins
/// and flushes until the deferred garbage of every bag has run. (A thread
/// that exited hands its bag over in a TLS destructor that can run after
/// `join` returns: wait for it first. One collect frees at most 8 bags of
/// 64 items, so keep going until nothing more is freed.)
fn flush_epoch() {
    std::thread::sleep(Duration::from_millis(50));
    // Until 64 rounds in a row free nothing more. (Not "until the count stops
    // changing": the collector's own queue nodes are allocated and retired by
    // the flushes themselves, so the count can alternate for ever.)
    let mut least = usize::MAX;
    let mut idle = 0;
    while idle < 64 {
        for _ in 0..64 {
            crossbeam_epoch::pin().flush();
        }
        let now = BYTES.load(Ordering::Relaxed);
        if now < least {
            least = now;
            idle = 0;
        } else {
            idle += 1;
        }
    }
    while pace::internals::frees_in_flight() > 0 {
        std::thread::yield_now();
    }
}

fn mib(b: usize) -> String {
    if b < 1 << 20 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
    }
}

/// Bytes per live row for `n` keys of type `K`. Keys are built before the
/// measurement; what the limiter clones (String heap bytes) is counted.
fn per_row<K: Key>(n: usize) {
    let keys: Vec<K> = common::keys(n);
    let r = REAL;

    // Ours: all rows live (the manual clock stays at 0, every bucket owes
    // 100 ms). First as a server would hold it, with no forced collection:
    // the inserts, then 1,024 ordinary calls on a live key (reserve and
    // refund; they finish a running migration and run the collector as
    // calls do), then the wait for any large array being freed on a thread
    // of its own. Then flushed: what remains is live.
    let before = mem();
    let clock = ManualClock::new();
    let pace: Pace<K, _, ManualClock> = Pace::builder(r.rate())
        .capacity(u64::from(r.capacity))
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in &keys {
        let _kept = pace.reserve(k.q()).expect("fresh key");
    }
    for _ in 0..1_024 {
        pace.reserve(keys[0].q()).expect("a live key").refund();
    }
    while pace::internals::frees_in_flight() > 0 {
        std::thread::yield_now();
    }
    let uncollected = since(before);
    flush_epoch();
    let ours = since(before);
    assert_eq!(pace.len(), n);
    let structural = pace.table_bytes() + pace.memory().entry_bytes;
    let slots = pace.table_slots();
    drop(pace);
    flush_epoch();

    let before = mem();
    let gov = RateLimiter::dashmap_with_clock(r.quota(), FakeRelativeClock::default());
    for k in &keys {
        let _ = gov.check_key(k);
    }
    let theirs = since(before);
    assert_eq!(gov.len(), n);
    drop(gov);

    println!(
        "| {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} | {} slots, {:.1} B/row structural |",
        K::NAME,
        n,
        uncollected.bytes as f64 / n as f64,
        ours.bytes as f64 / n as f64,
        theirs.bytes as f64 / n as f64,
        ours.bytes as f64 / theirs.bytes as f64,
        ours.chunks as f64 / n as f64,
        theirs.chunks as f64 / n as f64,
        ours.chunks as f64 / theirs.chunks as f64,
        slots,
        structural as f64 / n as f64,
    );
}

/// `n` distinct keys each reserve once (kept) within one instant, then one
/// horizon passes.
fn flood<K: Key>(n: usize) {
    let r = REAL;
    println!(
        "\n### Flood of {n} distinct {} keys, then one horizon\n",
        K::NAME
    );
    println!("| limiter | step | rows | heap (requested) | heap (glibc est.) | time |");
    println!("|---|---|---:|---:|---:|---:|");
    let row = |who: &str, step: &str, rows: usize, m: Mem, t: Duration| {
        println!(
            "| {who} | {step} | {rows} | {} | {} | {:.2?} |",
            mib(m.bytes),
            mib(m.chunks),
            t
        );
    };

    // Ours, with no user code beyond ordinary reserves.
    flush_epoch(); // earlier garbage must not be freed inside this count
    let base = mem();
    PEAK.store(base.bytes, Ordering::Relaxed);
    let clock = ManualClock::new();
    let pace: Pace<K, _, ManualClock> = Pace::builder(r.rate())
        .capacity(u64::from(r.capacity))
        .clock(clock.clone())
        .build()
        .unwrap();
    row("pace", "empty", pace.len(), since(base), Duration::ZERO);
    let empty = since(base);
    let t = Instant::now();
    let mut key = K::empty();
    for i in 0..n as u64 {
        K::churn_key(&mut key, i);
        let _kept = pace.reserve(key.q()).expect("fresh key");
    }
    row("pace", "after flood", pace.len(), since(base), t.elapsed());
    println!(
        "| pace | peak during flood | | {} | | |",
        mib(PEAK.load(Ordering::Relaxed) - base.bytes)
    );
    clock.advance(pace.horizon() + Duration::from_nanos(1));
    row(
        "pace",
        "one horizon later, untouched",
        pace.len(),
        since(base),
        Duration::ZERO,
    );
    // The next ordinary caller finds the sweep due and runs it.
    let t = Instant::now();
    K::churn_key(&mut key, u64::MAX);
    let _kept = pace.reserve(key.q()).expect("fresh key");
    row(
        "pace",
        "1 reserve after the horizon (runs the sweep)",
        pace.len(),
        since(base),
        t.elapsed(),
    );
    // Ordinary traffic afterwards: reserve/refund of new keys (no row stays),
    // counted until 95% of the peak heap is back (checked every 1,000 calls).
    let peak = PEAK.load(Ordering::Relaxed) - base.bytes;
    let t = Instant::now();
    let mut calls = 1u64; // the reserve that ran the first sweep chunk
    while since(base).bytes > peak / 20 && calls < 10_000_000 {
        for i in 0..1_000u64 {
            K::churn_key(&mut key, (1 << 49) + calls + i);
            if let Ok(res) = pace.reserve(key.q()) {
                res.refund();
            }
        }
        calls += 1_000;
    }
    println!(
        "| pace | ordinary calls after the horizon until 95% of the peak heap is back | {} | {} calls | | {:.2?} |",
        pace.len(),
        calls,
        t.elapsed()
    );
    let mut done = 0u64;
    for upto in [10_000u64, 100_000, 1_000_000, 10_000_000] {
        let t = Instant::now();
        for i in done..upto {
            K::churn_key(&mut key, (1 << 50) + i);
            if let Ok(res) = pace.reserve(key.q()) {
                res.refund();
            }
        }
        done = upto;
        let m = since(base);
        let step = format!("+{upto} reserve/refund of new keys in all");
        row("pace", &step, pace.len(), m, t.elapsed());
        if m.bytes < 2 * empty.bytes.max(64 << 10) {
            break;
        }
    }
    flush_epoch();
    row(
        "pace",
        "+ epoch flushed (test-only call)",
        pace.len(),
        since(base),
        Duration::ZERO,
    );
    println!(
        "| pace | (empty table for reference) | 0 | {} | {} | |",
        mib(empty.bytes),
        mib(empty.chunks)
    );
    drop(pace);
    flush_epoch();

    // governor, whose user must call retain_recent (and shrink_to_fit).
    let base = mem();
    PEAK.store(base.bytes, Ordering::Relaxed);
    let fake = FakeRelativeClock::default();
    let gov = RateLimiter::dashmap_with_clock(r.quota(), fake.clone());
    let t = Instant::now();
    for i in 0..n as u64 {
        K::churn_key(&mut key, i);
        let _ = gov.check_key(&key);
    }
    row(
        "governor",
        "after flood",
        gov.len(),
        since(base),
        t.elapsed(),
    );
    println!(
        "| governor | peak during flood | | {} | | |",
        mib(PEAK.load(Ordering::Relaxed) - base.bytes)
    );
    fake.advance(Duration::from_secs(1) + Duration::from_nanos(1));
    for i in 0..10_000u64 {
        K::churn_key(&mut key, (1 << 50) + i);
        let _ = gov.check_key(&key);
    }
    row(
        "governor",
        "one horizon later +10k new keys, no cleanup",
        gov.len(),
        since(base),
        Duration::ZERO,
    );
    let t = Instant::now();
    gov.retain_recent();
    row(
        "governor",
        "retain_recent()",
        gov.len(),
        since(base),
        t.elapsed(),
    );
    let t = Instant::now();
    gov.shrink_to_fit();
    row(
        "governor",
        "+ shrink_to_fit()",
        gov.len(),
        since(base),
        t.elapsed(),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument that names neither
    // part skips it (so `cargo bench -p pace-benches -- admit` runs only
    // throughput groups).
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if !args.is_empty() && !args.iter().any(|a| "memory".contains(a.as_str())) {
        return;
    }
    println!("## Memory (load {})\n", loadavg());
    println!("### Bytes per live row\n");
    println!("| key | rows | pace B/row, no forced collection | pace B/row | governor B/row | ratio | pace glibc-est B/row | governor glibc-est B/row | ratio | pace table |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for n in [10_000, 100_000, 1_000_000, 2_000_000, 4_000_000] {
        per_row::<u64>(n);
    }
    for n in [10_000, 100_000, 1_000_000] {
        per_row::<String>(n);
    }
    let n = std::env::var("PACE_FLOOD")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    flood::<u64>(n);
    flood::<String>(n);
}
