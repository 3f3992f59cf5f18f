//! Latency distribution of single reserves with 1M live keys while sweeps
//! happen: a sweep runs inside the reserve that finds it due, so whoever
//! calls then pays for it. Each reserve is timed on its own (TSC via quanta)
//! into an HDR histogram.
//!
//! Regime TAIL: 10/s per key, burst 20, so the horizon (and the period of
//! time-driven sweeps) is 2 s; every key is primed with 20 tokens (2 s of
//! debt). The first time-driven sweep finds ~1M live rows (a full scan that
//! removes little), the next finds them refilled and removes them (and
//! shrinks the table); random reserves go on throughout, so whoever calls
//! `reserve` when a sweep is due pays for it.
//!
//! Then growth and churn, each call timed, pace (`u64` rows in cells),
//! governor and pace with its rows in entries (`pace-entries`, the table of
//! every other key type) in this one process on the same keys:
//!
//! * growth: `PACE_GROW` (default 4M) distinct u64 keys reserved once and
//!   kept (1/100 s, capacity 100: nothing refills during the run); the slowest
//!   call up to 400k rows and from 400k to the end, so a cost that grows with
//!   the table shows up as the second against the first;
//! * churn: as many distinct keys at 1000/s with capacity 1 (each row is
//!   full again 1 ms after its reserve and is swept): the tail per call,
//!   and the bytes of pace's tables at the end.
//!
//! ```text
//! cargo bench -p pace-benches --bench tails                 # ~60 s
//! PACE_TAIL_SECS=10 cargo bench -p pace-benches --bench tails
//! cargo bench -p pace-benches --bench tails -- growth       # growth and churn only
//! PACE_CHURN_CAPACITY=1000 cargo bench -p pace-benches --bench tails -- growth
//!                                                 # churn at the default capacity
//! PACE_TAIL_HUGE=1 cargo bench -p pace-benches --bench tails -- growth    # + growth of `pace-huge` (`Builder::huge_pages(true)`)
//! PACE_TAIL_SLOW_US=300 cargo bench -p pace-benches --bench tails -- growth   # + where the slow calls fall
//! PACE_TAIL_SLOW_US=200 cargo bench -p pace-benches --bench tails -- growth-control
//! cargo bench -p pace-benches --bench tails -- growth-cpu   # growth's slowest calls: wall and CPU time
//! ```
//!
//! `growth-cpu` runs growth again with each call also timed by the
//! thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`, which counts the call's
//! page faults but not the time the thread was not running). A call whose
//! wall time is far above its CPU time spent the difference off the CPU
//! (preempted, or blocked in the kernel, on a lock another thread holds);
//! the slowest call by CPU time is what the table's own work and its
//! memory cost the caller.
//!
//! `growth` and `growth-cpu` first touch and free `PACE_TAIL_PREFAULT_MB`
//! MiB (default 2048; 0 for none). On a virtual machine a page the guest
//! never used costs a fault in the hypervisor too on its first touch
//! (calls of 0.35–0.5 ms of CPU time here, during migrations), whatever the
//! limiter, and only the limiter that runs first in a process meets such
//! pages; the others reuse the pages it freed. After the prefault every
//! limiter reuses pages the guest has used.
//!
//! `growth-control` runs growth's keys through no limiter at all: one kept
//! 24-byte allocation per call, alone in a fresh process. Its slow calls are
//! what first touches of memory the process never used cost on this
//! machine, whatever the limiter.
//!
//! With `PACE_TAIL_SLOW_US`, growth and churn also list each call slower
//! than that many µs with its index (the rows the table had reserved
//! before it; at most 1,000 per run), so a slow call can be matched with
//! what the table did then (a migration starts when the rows reach 3/4 of
//! a power-of-two array).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use hdrhistogram::Histogram;
use pace::{Clock, ManualClock, QuantaClock};

const KEYS: usize = 1_000_000;

const TAIL: Regime = Regime {
    name: "tail",
    interval_ns: 100_000_000,
    capacity: 20,
    prime: 20,
};

struct Outcome {
    hist: Histogram<u64>,
    over_5ms: u64,
    rows_min: usize,
    rows_max: usize,
}

/// `threads` threads reserve random keys for `secs`, timing each reserve.
fn measure<L: Contender<u64>>(
    lim: &L,
    threads: usize,
    secs: f64,
    side: Option<&(dyn Fn() + Sync)>,
) -> Outcome {
    let keys: Vec<u64> = keys(KEYS);
    for k in &keys {
        lim.prime(k, TAIL.prime);
    }
    let pattern = access_pattern(KEYS, 1 << 22, 0x7a11);
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let results: Vec<(Histogram<u64>, u64, usize, usize)> = std::thread::scope(|s| {
        if let Some(side) = side {
            let stop = &stop;
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_secs(1));
                    side();
                }
            });
        }
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (keys, pattern) = (&keys, &pattern);
                s.spawn(move || {
                    let clock = QuantaClock::new();
                    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
                    let mask = pattern.len() - 1;
                    let mut i = t * 1_000_003;
                    let (mut over, mut lo, mut hi) = (0u64, usize::MAX, 0usize);
                    'run: loop {
                        for _ in 0..4096 {
                            let k = &keys[pattern[i & mask] as usize];
                            i = i.wrapping_add(1);
                            let a = clock.now_ns();
                            std::hint::black_box(lim.reserve(k));
                            let d = clock.now_ns().saturating_sub(a).max(1);
                            h.record(d).unwrap();
                            over += u64::from(d > 5_000_000);
                        }
                        let rows = lim.rows();
                        lo = lo.min(rows);
                        hi = hi.max(rows);
                        if Instant::now() >= deadline {
                            break 'run;
                        }
                    }
                    (h, over, lo, hi)
                })
            })
            .collect();
        let r = handles.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        r
    });
    let mut out = Outcome {
        hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap(),
        over_5ms: 0,
        rows_min: usize::MAX,
        rows_max: 0,
    };
    for (h, over, lo, hi) in results {
        out.hist.add(&h).unwrap();
        out.over_5ms += over;
        out.rows_min = out.rows_min.min(lo);
        out.rows_max = out.rows_max.max(hi);
    }
    out
}

fn row(name: &str, threads: usize, secs: f64, o: &Outcome) {
    let h = &o.hist;
    let us = |v: u64| format!("{:.2}", v as f64 / 1000.0);
    println!(
        "| {name} | {threads} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {}..{} |",
        h.len() as f64 / secs / 1e6,
        us(h.value_at_quantile(0.5)),
        us(h.value_at_quantile(0.99)),
        us(h.value_at_quantile(0.999)),
        us(h.value_at_quantile(0.9999)),
        us(h.max()),
        o.over_5ms,
        h.len(),
        o.rows_min,
        o.rows_max,
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if !args.is_empty()
        && !args
            .iter()
            .any(|a| "tails".contains(a.as_str()) || a.starts_with("growth"))
    {
        return;
    }
    if args.iter().any(|a| a == "growth-cpu") {
        growth_cpu();
        return;
    }
    if args.iter().any(|a| a == "growth-control") {
        growth_control();
        return;
    }
    let only_growth = args.iter().any(|a| a == "growth");
    if only_growth {
        growth_and_churn();
        return;
    }
    let secs: f64 = std::env::var("PACE_TAIL_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let r = TAIL;
    println!(
        "## Latency of single reserves, 1M keys, sweeps running (load {})\n",
        loadavg()
    );
    println!(
        "Regime `tail` (10/s, burst 20, horizon 2 s, keys primed with 20 tokens), \
         {secs} s per line; times in µs (including two timer reads). Stalls of \
         several ms also come from preemption on a loaded 2-core machine.\n"
    );
    println!("| limiter | threads | M reserves/s | p50 | p99 | p99.9 | p99.99 | max | > 5 ms | reserves | rows (min..max) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for threads in [1, 2] {
        let p = PaceC::<u64, _>::new(&r, QuantaClock::new());
        let o = measure(&p, threads, secs, None);
        row("pace (sweeps inside reserve)", threads, secs, &o);
        drop(p);

        let g = Governor::<u64>::new(&r);
        let o = measure(&g, threads, secs, None);
        row("governor, no cleanup", threads, secs, &o);
        drop(g);

        let g = Governor::<u64>::new(&r);
        let retain = || g.0.retain_recent();
        let o = measure(&g, threads, secs, Some(&retain));
        row(
            "governor + retain_recent() every 1 s (extra thread)",
            threads,
            secs,
            &o,
        );
        drop(g);
    }

    // What one sweep costs the caller that runs it: 1M rows, manual clock.
    println!("\n| one sweep of pace's table ({KEYS} rows) | time |\n|---|---:|");
    let clock = ManualClock::new();
    let p = PaceC::<u64, _>::new(&r, clock.clone());
    for k in keys::<u64>(KEYS) {
        p.prime(&k, r.prime);
    }
    let t = Instant::now();
    let removed = p.0.sweep();
    println!(
        "| all rows live, nothing removed ({removed}) | {:.2?} |",
        t.elapsed()
    );
    clock.advance(p.0.horizon());
    let t = Instant::now();
    let removed = p.0.sweep();
    println!(
        "| all rows full, {removed} removed (+ shrink migration) | {:.2?} |",
        t.elapsed()
    );
    growth_and_churn();
}

/// Growth regime: one token per 100 s, capacity 100, no priming: each
/// reserve leaves 100 s of debt, so every row stays live through the run.
const GROW: Regime = Regime {
    name: "grow",
    interval_ns: 100_000_000_000,
    capacity: 100,
    prime: 0,
};

/// Churn regime: 1000/s, capacity 1: a row is full 1 ms after its reserve.
const CHURN: Regime = Regime {
    name: "churn",
    interval_ns: 1_000_000,
    capacity: 1,
    prime: 0,
};

/// The churn regime with `PACE_CHURN_CAPACITY` tokens (default 1; 1000 is
/// `Pace::new(Rate::per_second(1000))`'s default capacity, a 1 s horizon,
/// so a fresh key's row is full 1 ms after its reserve but the time-driven
/// sweep comes once a second).
fn churn_regime() -> Regime {
    let capacity = std::env::var("PACE_CHURN_CAPACITY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CHURN.capacity);
    Regime { capacity, ..CHURN }
}

/// Calls slower than `PACE_TAIL_SLOW_US` µs are listed (`None`: none).
fn slow_threshold_ns() -> Option<u64> {
    std::env::var("PACE_TAIL_SLOW_US")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(|us| us.saturating_mul(1000))
}

/// Most slow calls one run lists.
const SLOW_LISTED: usize = 1000;

/// One timed flood: every call in `h`, the slowest call before `split`
/// calls (`early`) and from `split` on (`late`), rows at the end.
struct Flood {
    h: Histogram<u64>,
    early: u64,
    late: u64,
    rows: usize,
    /// (call index, ns) of calls above the threshold, in order.
    slow: Vec<(u64, u64)>,
}

/// Control for growth (`-- growth-control`): no limiter, one 24-byte heap
/// allocation per key (what a u64 row's entry in pace asks for), kept, in a
/// process that has touched no other memory: what growing the heap into
/// memory the process never used costs a call by itself.
#[allow(clippy::vec_box)] // one heap allocation per call is the point
struct EntriesOnly(std::sync::Mutex<Vec<Box<[u64; 3]>>>);

impl Contender<u64> for EntriesOnly {
    fn reserve(&self, key: &u64) -> bool {
        let e = Box::new([*key, 0, 0]);
        self.0.lock().unwrap().push(e);
        true
    }
    fn churn(&self, key: &u64) {
        self.reserve(key);
    }
    fn prime(&self, key: &u64, _n: u32) {
        self.reserve(key);
    }
    fn rows(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// Reserves keys `0..n` once each, timing every call.
fn timed_flood<L: Contender<u64>>(lim: &L, n: u64, split: u64) -> Flood {
    let clock = QuantaClock::new();
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    let (mut early, mut late) = (0u64, 0u64);
    let threshold = slow_threshold_ns().unwrap_or(u64::MAX);
    // Allocated up front: the loop allocates nothing of its own.
    let mut slow = Vec::with_capacity(if threshold == u64::MAX {
        0
    } else {
        SLOW_LISTED
    });
    for k in 0..n {
        let a = clock.now_ns();
        std::hint::black_box(lim.reserve(&k));
        let d = clock.now_ns().saturating_sub(a).max(1);
        h.record(d).unwrap();
        if k < split {
            early = early.max(d);
        } else {
            late = late.max(d);
        }
        if d > threshold && slow.len() < SLOW_LISTED {
            slow.push((k, d));
        }
    }
    Flood {
        h,
        early,
        late,
        rows: lim.rows(),
        slow,
    }
}

fn flood_row(name: &str, who: &str, o: &Flood) {
    let Flood {
        h,
        early,
        late,
        rows,
        ..
    } = o;
    let us = |v: u64| format!("{:.2}", v as f64 / 1000.0);
    println!(
        "| {name} | {who} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} |",
        h.mean() / 1000.0,
        us(h.value_at_quantile(0.5)),
        us(h.value_at_quantile(0.99)),
        us(h.value_at_quantile(0.999)),
        us(h.value_at_quantile(0.9999)),
        us(h.max()),
        us(*early),
        us(*late),
        rows,
    );
}

/// Growth's keys through [`EntriesOnly`], alone in this process (pace and
/// governor, run first, would leave freed memory for it to reuse).
fn growth_control() {
    let n = grow_keys();
    let split = n / 10;
    println!(
        "\n## Growth control, {n} kept 24-byte allocations, each call timed (load {})\n",
        loadavg()
    );
    println!("| workload | limiter | mean | p50 | p99 | p99.9 | p99.99 | max | max < {split} | max ≥ {split} | rows at end |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let c = EntriesOnly(std::sync::Mutex::new(Vec::with_capacity(n as usize)));
    let f = timed_flood(&c, n, split);
    flood_row("growth control", "entries only", &f);
    print_slow(&[("growth control", "entries only", f.slow)]);
}

/// Keys of the growth and churn floods: `PACE_GROW`, 4M by default.
fn grow_keys() -> u64 {
    std::env::var("PACE_GROW")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4_000_000)
}

/// A flood's slow calls: workload, limiter, (call index, ns).
type SlowCalls<'a> = (&'a str, &'a str, Vec<(u64, u64)>);

/// Lists the slow calls of each flood, with `PACE_TAIL_SLOW_US`.
fn print_slow(slow: &[SlowCalls<'_>]) {
    if let Some(t) = slow_threshold_ns() {
        println!("\nCalls slower than {} µs, as call index: µs\n", t / 1000);
        for (name, who, list) in slow {
            let calls: Vec<String> = list
                .iter()
                .map(|(k, d)| format!("{k}: {:.0}", *d as f64 / 1000.0))
                .collect();
            println!("* {name}, {who} ({}): {}", list.len(), calls.join(", "));
        }
    }
}

fn growth_and_churn() {
    let n = grow_keys();
    let split = n / 10;
    let prefault = prefault();
    println!(
        "\n## Growth and churn, {n} distinct u64 keys, each call timed \
         ({prefault} MiB touched and freed first; load {})\n",
        loadavg()
    );
    println!(
        "Times in µs (including two timer reads); \"max < {split}\" is the slowest call \
         while the table held fewer than {split} rows, \"max ≥ {split}\" the slowest after.\n"
    );
    println!("| workload | limiter | mean | p50 | p99 | p99.9 | p99.99 | max | max < {split} | max ≥ {split} | rows at end |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut slow = Vec::new();
    let mut row = |name: &'static str, who: &'static str, f: Flood| {
        flood_row(name, who, &f);
        slow.push((name, who, f.slow));
    };
    let p = PaceC::<u64, _>::new(&GROW, QuantaClock::new());
    row(
        "growth (1/100 s, capacity 100)",
        "pace",
        timed_flood(&p, n, split),
    );
    drop(p);
    let g = Governor::<u64>::new(&GROW);
    row(
        "growth (1/100 s, capacity 100)",
        "governor",
        timed_flood(&g, n, split),
    );
    drop(g);
    let p = pace_entries::<u64, _>(&GROW, QuantaClock::new());
    row(
        "growth (1/100 s, capacity 100)",
        "pace-entries",
        timed_flood(&p, n, split),
    );
    drop(p);
    if std::env::var_os("PACE_TAIL_HUGE").is_some() {
        let p = pace_huge::<u64, _>(&GROW, QuantaClock::new());
        row(
            "growth (1/100 s, capacity 100)",
            "pace-huge",
            timed_flood(&p, n, split),
        );
        drop(p);
    }
    let churn = churn_regime();
    let churn_name: &'static str = if churn.capacity == 1 {
        "churn (1000/s, capacity 1)"
    } else {
        "churn (1000/s, capacity 1000)"
    };
    let p = PaceC::<u64, _>::new(&churn, QuantaClock::new());
    row(churn_name, "pace", timed_flood(&p, n, split));
    let churn_tables = vec![("pace", p.0.memory())];
    drop(p);
    let g = Governor::<u64>::new(&churn);
    row(churn_name, "governor", timed_flood(&g, n, split));
    drop(g);
    let p = pace_entries::<u64, _>(&churn, QuantaClock::new());
    row(churn_name, "pace-entries", timed_flood(&p, n, split));
    let mut churn_tables = churn_tables;
    churn_tables.push(("pace-entries", p.0.memory()));
    drop(p);
    println!("\nTables at the end of churn (governor keeps a row for each of the {n} keys):\n");
    for (who, m) in churn_tables {
        let bytes = m.array_bytes + m.entry_bytes + m.floor_bytes;
        println!(
            "* {who}: {} rows, {} slots or cells, {:.1} KiB (array {:.1} KiB, entries {:.1} KiB, floors {:.1} KiB), {:.0} B per row",
            m.rows,
            m.slots,
            bytes as f64 / 1024.0,
            m.array_bytes as f64 / 1024.0,
            m.entry_bytes as f64 / 1024.0,
            m.floor_bytes as f64 / 1024.0,
            bytes as f64 / m.rows.max(1) as f64,
        );
    }
    print_slow(&slow);
}

/// Touches and frees `PACE_TAIL_PREFAULT_MB` MiB (default 2048) and
/// returns that number: the pages the kernel hands out next are ones this
/// machine has used, so a flood's first touch of a page costs the guest's
/// fault alone, not the hypervisor's too, and the limiter that runs first
/// in the process pays no more for its memory than the ones after it,
/// which reuse its pages.
fn prefault() -> usize {
    let mb: usize = std::env::var("PACE_TAIL_PREFAULT_MB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2048);
    drop(std::hint::black_box(vec![1u8; mb << 20]));
    mb
}

/// A growth flood timed by wall clock and by the thread's CPU clock.
struct CpuFlood {
    /// Slowest wall time below / from `split` calls, ns.
    wall: (u64, u64),
    /// Slowest CPU time below / from `split` calls, ns.
    cpu: (u64, u64),
    /// Calls whose wall time exceeds their CPU time by more than 1 ms.
    off_cpu: u64,
    /// The slowest calls by wall time: (wall ns, call index, CPU ns).
    top: Vec<(u64, u64, u64)>,
}

/// Calls [`CpuFlood`] lists, slowest by wall time first.
const CPU_TOP: usize = 6;

/// Reserves keys `0..n` once each; every call is timed by quanta inside a
/// reading of the thread's CPU clock.
fn cpu_flood<L: Contender<u64>>(lim: &L, n: u64, split: u64) -> CpuFlood {
    let clock = QuantaClock::new();
    let mut f = CpuFlood {
        wall: (0, 0),
        cpu: (0, 0),
        off_cpu: 0,
        top: Vec::with_capacity(CPU_TOP + 1),
    };
    for k in 0..n {
        let c = cpu_time::ThreadTime::now();
        let a = clock.now_ns();
        std::hint::black_box(lim.reserve(&k));
        let d = clock.now_ns().saturating_sub(a);
        // The CPU clock's readings hold the wall clock's and one of their
        // own; an interrupt served in one of them (charged to the thread)
        // is not the call's, so a call's CPU time is at most its wall time.
        let cpu = u64::try_from(c.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .min(d);
        let (w, t) = if k < split {
            (&mut f.wall.0, &mut f.cpu.0)
        } else {
            (&mut f.wall.1, &mut f.cpu.1)
        };
        *w = (*w).max(d);
        *t = (*t).max(cpu);
        if d.saturating_sub(cpu) > 1_000_000 {
            f.off_cpu += 1;
        }
        if f.top.len() < CPU_TOP || d > f.top[CPU_TOP - 1].0 {
            let at = f.top.partition_point(|e| e.0 >= d);
            f.top.insert(at, (d, k, cpu));
            f.top.truncate(CPU_TOP);
        }
    }
    f
}

/// Growth of pace, governor and pace-entries, each call timed by wall
/// clock and by the thread's CPU clock (`-- growth-cpu`).
fn growth_cpu() {
    let n = grow_keys();
    let split = n / 10;
    let prefault = prefault();
    println!(
        "\n## Growth, {n} distinct u64 keys, each call's wall and CPU time \
         ({prefault} MiB touched and freed first; load {})\n",
        loadavg()
    );

    println!(
        "Milliseconds. Wall time is two quanta readings around the call; CPU time is \
         the thread's CPU clock read around those, at most the wall time. \
         \"off CPU > 1 ms\": calls whose wall time exceeds their CPU time by more \
         than 1 ms.\n"
    );
    println!(
        "| limiter | wall, max < {split} | wall, max ≥ {split} | CPU, max < {split} | \
         CPU, max ≥ {split} | off CPU > 1 ms | slowest by wall (call: wall / CPU) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    let ms = |v: u64| format!("{:.2}", v as f64 / 1e6);
    let line = |who: &str, f: CpuFlood| {
        let top: Vec<String> = f
            .top
            .iter()
            .map(|&(d, k, c)| format!("{k}: {} / {}", ms(d), ms(c)))
            .collect();
        println!(
            "| {who} | {} | {} | {} | {} | {} | {} |",
            ms(f.wall.0),
            ms(f.wall.1),
            ms(f.cpu.0),
            ms(f.cpu.1),
            f.off_cpu,
            top.join(", ")
        );
    };
    let p = PaceC::<u64, _>::new(&GROW, QuantaClock::new());
    line("pace", cpu_flood(&p, n, split));
    drop(p);
    let g = Governor::<u64>::new(&GROW);
    line("governor", cpu_flood(&g, n, split));
    drop(g);
    let p = pace_entries::<u64, _>(&GROW, QuantaClock::new());
    line("pace-entries", cpu_flood(&p, n, split));
}
