//! A loop of reserves for profilers (callgrind, perf): instruction counts do
//! not depend on the machine's load, so they compare contenders robustly.
//!
//! ```text
//! cargo build --release -p pace-benches --example profile_reserve
//! B=target/release/examples/profile_reserve
//! # instructions per op = (Ir with N ops - Ir with 0 ops) / N
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.0 $B pace 0 1
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.n $B pace 200000 1
//! ```
//!
//! Modes: `pace`, `pace-sip0` (`pace` with SipHash under fixed keys: the
//! same cells in every run, for counts over many keys), `pace-check` (`check_key`: the reserve without its
//! reservation), `pace-with` (each reserve with its own quota),
//! `pace-foldhash`, `pace-foldhash-fixed` (foldhash and a
//! clock that is one relaxed load), `pace-coarse` (`CoarseClock`), and with
//! `--features foldhash` `pace-fast` and `pace-fast-coarse`
//! (`Builder::fast_hasher`, alone and with `CoarseClock`); `governor`
//! (regime `admit`: 1 µs per token, burst 2^32-1, keys primed with 2^31
//! tokens); and `pace-churn`,
//! `governor-churn` (a new key per op, refunded by pace); `pace-flood`,
//! `entries-flood` and `governor-flood`, the tails bench's churn at the
//! default capacity (a new key per op, kept, 1000/s with capacity 1000, on
//! a clock that advances 300 ns per op, so sweeps remove a row per op). `pace` keeps its
//! `u64` rows in cells; `entries`, `entries-foldhash-fixed` and
//! `entries-churn` are the same with rows in the slot table
//! (`Builder::boxed_keys`). `pace-returning`, `-returning-2s` and
//! `-returning-20ms` (and `governor-` ones) are the returning clients of
//! `benches/returning.rs` on fake clocks; `pace-returning-str`,
//! `-returning-str-2s` and `-returning-str-20ms` the same with `String` keys;
//! each with `-sip0` appended uses SipHash under fixed keys, as `pace-sip0`.
//! Arguments: mode, ops, keys (cycled in order).
//! Quanta's one-time calibration varies from run to run: subtract its
//! count (`callgrind_annotate --inclusive=yes`, the line
//! `once_cell::imp::OnceCell<T>::initialize`) from both totals.

use std::collections::hash_map::DefaultHasher;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pace::{Clock, Pace, Rate};

struct Fixed(AtomicU64);

impl Clock for Fixed {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn run<S: std::hash::BuildHasher, C: Clock>(p: &Pace<u64, S, C>, keys: &[u64], ops: u64) {
    for k in keys {
        let _kept = p.reserve_n(k, 1 << 31).expect("primed");
    }
    let n = keys.len() as u64;
    for i in 0..ops {
        black_box(p.reserve(&keys[(i % n) as usize]).is_ok());
    }
}

/// A `Pace<u64>` with hasher `h`, its keys held in the cells as their own
/// bits whatever the hasher.
fn inline_keys<S: BuildHasher>(rate: Rate, cap: u64, h: S) -> Pace<u64, S> {
    Pace::builder(rate)
        .capacity(cap)
        .hasher(h)
        .inline_keys_any_hasher()
        .build()
        .unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: profile_reserve MODE OPS KEYS";
    let mode = args.get(1).expect(usage).as_str();
    let ops: u64 = args.get(2).expect(usage).parse().expect(usage);
    let nkeys: u64 = args.get(3).map_or(1, |s| s.parse().expect(usage));
    let keys: Vec<u64> = (0..nkeys).map(key).collect();
    let rate = Rate::new(1, Duration::from_micros(1)).expect("rate");
    let cap = u64::from(u32::MAX);
    let t = Instant::now();
    match mode {
        "pace" => run(
            &Pace::builder(rate).capacity(cap).build().unwrap(),
            &keys,
            ops,
        ),
        "pace-hold-keep"
        | "pace-hold-refund"
        | "pace-reserve-refund"
        | "pace-hold-while-keep"
        | "pace-hold-while-refund" => {
            // One presentation at a time on warm keys: a hold kept or
            // refunded (`Pace::hold`, or `Pace::hold_while` deciding at
            // once), or a reserve refunded at once.
            let p = Pace::builder(rate).capacity(cap).build().unwrap();
            for k in &keys {
                let _kept = p.reserve_n(k, 1 << 31).expect("primed");
            }
            for i in 0..ops {
                let k = &keys[(i % nkeys) as usize];
                match mode {
                    "pace-hold-keep" => black_box(p.hold(k).map(|h| h.keep()).is_ok()),
                    "pace-hold-refund" => black_box(p.hold(k).map(|h| h.refund()).is_ok()),
                    "pace-hold-while-keep" => {
                        black_box(p.hold_while(k, 1, |_| Ok::<(), ()>(())).is_ok())
                    }
                    "pace-hold-while-refund" => {
                        black_box(p.hold_while(k, 1, |_| Err::<(), ()>(())).is_ok())
                    }
                    _ => black_box(p.reserve(k).map(|r| r.refund()).is_ok()),
                };
            }
        }
        "pace-check" => {
            // The warm reserve without its reservation (`check_key`).
            let p = Pace::builder(rate).capacity(cap).build().unwrap();
            for k in &keys {
                let _kept = p.reserve_n(k, 1 << 31).expect("primed");
            }
            for i in 0..ops {
                black_box(p.check_key(&keys[(i % nkeys) as usize]).is_ok());
            }
        }
        "pace-with" => {
            // The same, each reserve under a quota of its own (`reserve_with`).
            let p = Pace::builder(rate).capacity(cap).build().unwrap();
            let q = pace::Quota::new(rate, cap).unwrap();
            for k in &keys {
                let _kept = p.reserve_n(k, 1 << 31).expect("primed");
            }
            for i in 0..ops {
                black_box(p.reserve_with(&keys[(i % nkeys) as usize], q).is_ok());
            }
        }
        "pace-sip0" => {
            // `pace` with SipHash-1-3 under fixed (zero) keys instead of
            // random ones: the same cells from run to run, so counts over
            // many keys compare builds exactly.
            let h = BuildHasherDefault::<DefaultHasher>::default();
            run(&inline_keys(rate, cap, h), &keys, ops)
        }
        "pace-foldhash" => {
            let h = foldhash::fast::RandomState::default();
            run(&inline_keys(rate, cap, h), &keys, ops)
        }
        "pace-foldhash-fixed" => {
            let h = foldhash::fast::RandomState::default();
            let c = Fixed(AtomicU64::new(1));
            let b = Pace::builder(rate).capacity(cap).hasher(h).clock(c);
            let p = b.inline_keys_any_hasher().build();
            run(&p.unwrap(), &keys, ops)
        }
        "entries" => run(
            &Pace::builder(rate)
                .capacity(cap)
                .boxed_keys()
                .build()
                .unwrap(),
            &keys,
            ops,
        ),
        "entries-foldhash-fixed" => {
            let h = foldhash::fast::RandomState::default();
            let c = Fixed(AtomicU64::new(1));
            let b = Pace::builder(rate).capacity(cap).hasher(h).clock(c);
            run(&b.boxed_keys().build().unwrap(), &keys, ops)
        }
        "entries-churn" => {
            let p: Pace<u64> = Pace::builder(Rate::per_second(10).unwrap())
                .boxed_keys()
                .build()
                .unwrap();
            for i in 0..ops {
                if let Ok(r) = p.reserve(&key(i)) {
                    r.refund();
                }
            }
        }
        "governor" => {
            let q = governor::Quota::with_period(Duration::from_micros(1))
                .unwrap()
                .allow_burst(NonZeroU32::new(u32::MAX).unwrap());
            let g = governor::RateLimiter::keyed(q);
            for k in &keys {
                let _ = g.check_key_n(k, NonZeroU32::new(1 << 31).unwrap());
            }
            for i in 0..ops {
                black_box(g.check_key(&keys[(i % nkeys) as usize]).is_ok());
            }
        }
        #[cfg(feature = "foldhash")]
        "pace-fast" => {
            let b = Pace::builder(rate).capacity(cap).fast_hasher();
            run(&b.build().unwrap(), &keys, ops)
        }
        "pace-coarse" => {
            let b = Pace::builder(rate)
                .capacity(cap)
                .clock(pace::CoarseClock::new());
            run(&b.build().unwrap(), &keys, ops)
        }
        #[cfg(feature = "foldhash")]
        "pace-fast-coarse" => {
            let b = Pace::builder(rate).capacity(cap).fast_hasher();
            run(
                &b.clock(pace::CoarseClock::new()).build().unwrap(),
                &keys,
                ops,
            )
        }
        "pace-churn" => {
            let p: Pace<u64> = Pace::new(Rate::per_second(10).unwrap());
            for i in 0..ops {
                if let Ok(r) = p.reserve(&key(i)) {
                    r.refund();
                }
            }
        }
        "pace-flood" | "entries-flood" | "governor-flood" => {
            // The tails bench's churn at the default capacity: a new key per
            // op, kept, 1000/s with capacity 1000, on a clock that advances
            // 300 ns per op (a row is full again 3,334 ops after its reserve).
            let rate = Rate::per_second(1000).unwrap();
            let c = std::sync::Arc::new(Fixed(AtomicU64::new(1)));
            struct Shared(std::sync::Arc<Fixed>);
            impl Clock for Shared {
                fn now_ns(&self) -> u64 {
                    self.0.now_ns()
                }
            }
            if mode == "governor-flood" {
                let q = governor::Quota::per_second(NonZeroU32::new(1000).unwrap());
                let g = governor::RateLimiter::keyed(q);
                for i in 0..ops {
                    black_box(g.check_key(&key(i)).is_ok());
                }
            } else {
                let b = Pace::builder(rate).clock(Shared(c.clone()));
                let p = if mode == "pace-flood" {
                    b.build()
                } else {
                    b.boxed_keys().build()
                };
                let p = p.unwrap();
                for i in 0..ops {
                    c.0.fetch_add(300, Ordering::Relaxed);
                    black_box(p.reserve(&key(i)).is_ok());
                }
            }
        }
        m if m.starts_with("pace-returning") || m.starts_with("governor-returning") => {
            if m.contains("-str") {
                // `String` keys (`client-000000000042`), each call borrowing
                // its key as `&str`.
                let strs: Vec<String> = (0..nkeys).map(|i| format!("client-{i:012}")).collect();
                returning(mode, &strs, |k: &String| k.as_str(), ops);
            } else {
                returning(mode, &keys, |k: &u64| k, ops);
            }
        }
        "governor-churn" => {
            let q = governor::Quota::per_second(NonZeroU32::new(10).unwrap());
            let g = governor::RateLimiter::keyed(q);
            for i in 0..ops {
                black_box(g.check_key(&key(i)).is_ok());
            }
        }
        _ => panic!("{usage}"),
    }
    if ops > 0 {
        let ns = t.elapsed().as_nanos() as f64 / ops as f64;
        eprintln!("{mode}: {ns:.1} ns/op (wall, includes setup)");
    }
}

/// The returning modes (see `main`): `nkeys` clients asked in turn on fake
/// clocks, each call borrowing its key as `borrow` gives it.
fn returning<K, Q>(mode: &str, keys: &[K], borrow: impl Fn(&K) -> &Q, ops: u64)
where
    K: std::hash::Hash + Eq + Clone + std::borrow::Borrow<Q>,
    Q: ?Sized + std::hash::Hash + Eq + ToOwned<Owned = K>,
{
    let nkeys = keys.len() as u64;
    // Returning clients (benches/returning.rs's workloads, on fake
    // clocks): `nkeys` clients asked in turn, two warm-up turns
    // first. `-returning`: 1,000 per second, capacity 1, the clock
    // advanced 150 ns per op (20,000 clients come back every 3 ms,
    // three horizons); `-2s`: 10 per second, capacity 10, 100 µs
    // per op (every 2 s, two horizons); `-20ms`: the same, 1 µs per
    // op (every 20 ms: rows stay live, the live-row price).
    // `-sip0`: pace with SipHash under fixed (zero) keys, `u64` keys in
    // their cells, as `pace-sip0`: the same cells in every run, so that
    // counts compare builds exactly (the default hasher's random keys move
    // a run's count by a few instructions).
    let sip0 = mode.ends_with("-sip0");
    let mode = mode.trim_end_matches("-sip0");
    let (per_s, cap, step) = if mode.ends_with("-2s") {
        (10, 10, 100_000)
    } else if mode.ends_with("-20ms") {
        (10, 10, 1_000)
    } else {
        (1000, 1, 150)
    };
    let warm = 2 * nkeys;
    if mode.starts_with("governor") {
        let clock = governor::clock::FakeRelativeClock::default();
        let q = governor::Quota::per_second(NonZeroU32::new(per_s).unwrap())
            .allow_burst(NonZeroU32::new(cap).unwrap());
        let g = governor::RateLimiter::dashmap_with_clock(q, clock.clone());
        for i in 0..warm + ops {
            clock.advance(Duration::from_nanos(step));
            black_box(g.check_key(&keys[(i % nkeys) as usize]).is_ok());
        }
        return;
    }
    let clock = pace::ManualClock::new();
    let b = Pace::builder(Rate::per_second(u64::from(per_s)).unwrap())
        .capacity(u64::from(cap))
        .clock(clock.clone());
    if sip0 {
        let h = BuildHasherDefault::<DefaultHasher>::default();
        let p = b.hasher(h).inline_keys_any_hasher().build().unwrap();
        turns(&p, &clock, keys, &borrow, step, warm + ops);
    } else {
        turns(&b.build().unwrap(), &clock, keys, &borrow, step, warm + ops);
    }
}

/// `calls` calls of the returning modes, the keys in turn, the clock
/// advanced `step` ns before each.
fn turns<K, Q, S>(
    p: &Pace<K, S, pace::ManualClock>,
    clock: &pace::ManualClock,
    keys: &[K],
    borrow: &impl Fn(&K) -> &Q,
    step: u64,
    calls: u64,
) where
    K: std::hash::Hash + Eq + std::borrow::Borrow<Q>,
    Q: ?Sized + std::hash::Hash + Eq + ToOwned<Owned = K>,
    S: BuildHasher,
{
    let n = keys.len() as u64;
    for i in 0..calls {
        clock.advance(Duration::from_nanos(step));
        black_box(p.reserve(borrow(&keys[(i % n) as usize])).is_ok());
    }
}
