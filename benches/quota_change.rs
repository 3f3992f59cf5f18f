//! A live change of the default quota under traffic: what a call costs while
//! `set_quota` flips the default between 10/s and 100/s, against the same
//! traffic with no change, in one process.
//!
//! ```text
//! cargo bench -p pace-benches --bench quota_change
//! ```
//!
//! Two threads reserve random keys of 1,000 (every call timed by quanta into
//! an HDR histogram) for 2 s; in the `flips` phase a third thread replaces
//! the default quota every 10 ms, alternating 10/s and 100/s (both with a
//! capacity of one second). Reported per phase: calls, admitted, p50 / p99 /
//! p99.9 / p99.99 / max ns per call, and the rows held at the end. Every
//! key's debt survives each flip (tests/quotas.rs checks that exactly; the
//! bound under flips is checked on a real clock by tests/exactness.rs).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pace::{Pace, Quota};

const KEYS: u64 = 1_000;
const RUN: Duration = Duration::from_secs(2);

fn phase(name: &str, flips: bool) {
    let slow = Quota::per_second(10).unwrap();
    let fast = Quota::per_second(100).unwrap();
    let p: Pace<u64> = Pace::builder(slow.rate()).quota(slow).build().unwrap();
    let stop = AtomicBool::new(false);
    let changes = AtomicU64::new(0);
    let clock = quanta::Clock::new();
    let (hist, admitted, calls) = std::thread::scope(|s| {
        if flips {
            s.spawn(|| {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    p.set_quota(if i.is_multiple_of(2) { slow } else { fast });
                    changes.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
        }
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let (p, clock) = (&p, &clock);
                s.spawn(move || {
                    let mut h = Histogram::<u64>::new(3).unwrap();
                    let (mut admitted, mut calls) = (0u64, 0u64);
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                    let end = Instant::now() + RUN;
                    while Instant::now() < end {
                        for _ in 0..256 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let k = x % KEYS;
                            let t0 = clock.raw();
                            let ok = p.reserve(&k).is_ok();
                            let t1 = clock.raw();
                            h.record(clock.delta_as_nanos(t0, t1)).unwrap();
                            admitted += u64::from(ok);
                            calls += 1;
                        }
                    }
                    (h, admitted, calls)
                })
            })
            .collect();
        let mut hist = Histogram::<u64>::new(3).unwrap();
        let (mut admitted, mut calls) = (0, 0);
        for w in workers {
            let (h, a, c) = w.join().unwrap();
            hist.add(h).unwrap();
            admitted += a;
            calls += c;
        }
        stop.store(true, Ordering::Relaxed);
        (hist, admitted, calls)
    });
    println!(
        "{name:9} calls {calls:9}  admitted {admitted:7}  quota changes {:4}  ns p50 {:5} p99 {:6} p99.9 {:6} p99.99 {:7} max {:8}  rows {}",
        changes.load(Ordering::Relaxed),
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.99),
        hist.value_at_quantile(0.999),
        hist.value_at_quantile(0.9999),
        hist.max(),
        p.len(),
    );
}

fn main() {
    let rounds: usize = std::env::var("PACE_QUOTA_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for round in 0..rounds {
        println!("round {}", round + 1);
        if round % 2 == 0 {
            phase("steady", false);
            phase("flips", true);
        } else {
            phase("flips", true);
            phase("steady", false);
        }
    }
}
