//! Throughput of `Pace` against governor and two baselines, per workload,
//! key type and thread count (the machine this was written for has 2 cores;
//! 4 and 8 threads show behaviour under preemption).
//!
//! Groups are named `<regime>/<workload>/<key>`, benchmarks
//! `<contender>/<threads>`; throughput is reserves per second across all
//! threads. `docs/bench/report.py` turns the results into a table and a plot.
//!
//! ```text
//! cargo bench -p pace-benches --bench throughput                 # everything (~8 min)
//! cargo bench -p pace-benches --bench throughput -- 'admit/hot'  # a filter
//! cargo bench -p pace-benches --features foldhash --bench throughput  # with the fast-hasher rows
//! ```
//!
//! Criterion times one contender after another, so a load that moves
//! during a group moves the ratios between them; `benches/warm.rs` times
//! the warm path in alternating slices instead (docs/bench/warm.md).

mod common;

use std::hint::black_box;
use std::time::Duration;

use common::*;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode,
    Throughput,
};
use pace::{CoarseClock, QuantaClock, StdClock};

const THREADS: [usize; 4] = [1, 2, 4, 8];
/// Length of the precomputed random access sequence (a power of two).
const PATTERN: usize = 1 << 20;

type Group<'a> = BenchmarkGroup<'a, criterion::measurement::WallTime>;

fn group<'a>(c: &'a mut Criterion, name: &str) -> Group<'a> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(900))
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements(1));
    g
}

/// Reserves over `keys` in the order `pattern`, every thread starting at its
/// own offset.
fn bench_keys<K: Key, L: Contender<K>>(
    g: &mut Group<'_>,
    name: &str,
    lim: &L,
    keys: &[K],
    pattern: &[u32],
) {
    for threads in THREADS {
        g.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &threads| {
            b.iter_custom(|iters| {
                run_threads(threads, iters, &|t, ops| {
                    let mask = pattern.len() - 1;
                    let mut i = t.wrapping_mul(pattern.len() / threads + 7919);
                    for _ in 0..ops {
                        let k = &keys[pattern[i & mask] as usize];
                        black_box(lim.reserve(k));
                        i = i.wrapping_add(1);
                    }
                })
            })
        });
    }
}

/// Every reserve names a key never named before and refunds it.
fn bench_churn<K: Key, L: Contender<K>>(g: &mut Group<'_>, name: &str, make: impl Fn() -> L) {
    for threads in THREADS {
        g.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &threads| {
            // A fresh limiter per sample; dropped outside the timed part.
            let mut base = 0u64;
            b.iter_custom(|iters| {
                let lim = make();
                let d = run_threads(threads, iters, &|t, ops| {
                    let mut k = K::empty();
                    let first = base + ((t as u64) << 40);
                    for i in first..first + ops {
                        K::churn_key(&mut k, i);
                        lim.churn(&k);
                    }
                });
                base += 1 << 44;
                drop(lim);
                d
            })
        });
    }
}

/// Builds each contender, fills it with `n` primed keys, and runs the thread
/// counts on it.
fn keyed<K: Key>(c: &mut Criterion, r: &Regime, workload: &str, n: usize, clocks: bool) {
    let keys: Vec<K> = keys(n);
    let pattern = access_pattern(n, PATTERN, 0x5eed ^ n as u64);
    let mut g = group(c, &format!("{}/{}/{}", r.name, workload, K::NAME));
    eprintln!(
        "[pace-bench] group {}/{}/{} load {}",
        r.name,
        workload,
        K::NAME,
        loadavg()
    );

    fn run<K: Key, L: Contender<K>>(
        g: &mut Group<'_>,
        name: &str,
        lim: L,
        r: &Regime,
        keys: &[K],
        pattern: &[u32],
    ) {
        for k in keys {
            lim.prime(k, r.prime);
        }
        // Under REAL, rows that refilled during priming may be swept already.
        if r.prime > 0 {
            assert_eq!(lim.rows(), keys.len(), "{name}: every key has a row");
        }
        bench_keys(g, name, &lim, keys, pattern);
    }

    run(
        &mut g,
        "pace",
        PaceC::new(r, QuantaClock::new()),
        r,
        &keys,
        &pattern,
    );
    if clocks {
        run(
            &mut g,
            "pace-std",
            PaceC::new(r, StdClock::new()),
            r,
            &keys,
            &pattern,
        );
        let lim = PaceC::new(r, CoarseClock::new());
        run(&mut g, "pace-coarse", lim, r, &keys, &pattern);
        #[cfg(feature = "foldhash")]
        {
            let lim = pace_fast(r, QuantaClock::new());
            run(&mut g, "pace-foldhash", lim, r, &keys, &pattern);
            let lim = pace_fast(r, CoarseClock::new());
            run(&mut g, "pace-foldhash-coarse", lim, r, &keys, &pattern);
        }
    }
    run(&mut g, "governor", Governor::new(r), r, &keys, &pattern);
    run(&mut g, "dashmap", DashAtomic::new(r), r, &keys, &pattern);
    run(&mut g, "mutex", MutexMap::new(r), r, &keys, &pattern);
    g.finish();
}

fn churn<K: Key>(c: &mut Criterion, clocks: bool) {
    let r = REAL;
    let mut g = group(c, &format!("churn/new/{}", K::NAME));
    eprintln!(
        "[pace-bench] group churn/new/{} load {}",
        K::NAME,
        loadavg()
    );
    bench_churn::<K, _>(&mut g, "pace", || PaceC::new(&r, QuantaClock::new()));
    if clocks {
        bench_churn::<K, _>(&mut g, "pace-std", || PaceC::new(&r, StdClock::new()));
        let coarse = CoarseClock::new();
        bench_churn::<K, _>(&mut g, "pace-coarse", || PaceC::new(&r, coarse.clone()));
        #[cfg(feature = "foldhash")]
        bench_churn::<K, _>(&mut g, "pace-foldhash", || {
            pace_fast(&r, QuantaClock::new())
        });
    }
    bench_churn::<K, _>(&mut g, "governor", || Governor::new(&r));
    bench_churn::<K, _>(&mut g, "dashmap", || DashAtomic::new(&r));
    bench_churn::<K, _>(&mut g, "mutex", || MutexMap::new(&r));
    g.finish();
}

fn admit(c: &mut Criterion) {
    keyed::<u64>(c, &ADMIT, "hot", 1, true);
    keyed::<u64>(c, &ADMIT, "1k", 1_000, true);
    keyed::<u64>(c, &ADMIT, "1M", 1_000_000, true);
    keyed::<String>(c, &ADMIT, "hot", 1, false);
    keyed::<String>(c, &ADMIT, "1k", 1_000, false);
    keyed::<String>(c, &ADMIT, "1M", 1_000_000, false);
}

fn real(c: &mut Criterion) {
    keyed::<u64>(c, &REAL, "hot", 1, false);
    keyed::<u64>(c, &REAL, "1k", 1_000, false);
    keyed::<u64>(c, &REAL, "1M", 1_000_000, false);
}

fn churns(c: &mut Criterion) {
    churn::<u64>(c, true);
    churn::<String>(c, false);
}

criterion_group!(benches, admit, churns, real);
criterion_main!(benches);
