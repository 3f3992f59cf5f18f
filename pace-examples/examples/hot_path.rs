//! Profiling aid: a tight loop of reserves on one warm key with each clock.
//! Run under `perf record` or `valgrind --tool=callgrind`; speed claims with
//! contenders are made in `benches/`, not here.
use std::hash::BuildHasher;
use std::time::Instant;

use pace::{Clock, ManualClock, Pace, QuantaClock, Rate, StdClock};

fn run<S: BuildHasher, C: Clock>(name: &str, pace: Pace<u64, S, C>, n: u64) {
    let start = Instant::now();
    let mut admitted = 0u64;
    for _ in 0..n {
        admitted += pace.reserve(&7).is_ok() as u64;
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    println!("{name:>8}: {ns:5.1} ns per reserve on a warm key ({admitted} admitted)");
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5_000_000);
    let rate = Rate::per_second(1_000_000_000).unwrap();
    let b = || Pace::builder(rate).capacity(u32::MAX as u64);
    run("quanta", b().clock(QuantaClock::new()).build().unwrap(), n);
    run("std", b().clock(StdClock::new()).build().unwrap(), n);
    run("manual", b().clock(ManualClock::new()).build().unwrap(), n);
}
