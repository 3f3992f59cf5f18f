//! The default clock, decided with evidence: the cost of one reading and the
//! backward steps seen across threads, for `StdClock`, `QuantaClock` and
//! `CoarseClock` (1 ms resolution) in
//! one run (a harness: `cargo bench -p pace-benches --bench clock`).
//!
//! Backward steps: threads publish every reading into a shared maximum and
//! count a step whenever their next reading is below the maximum they saw
//! just before it, i.e. below a reading another thread had already made. A
//! limiter reading such a clock sees a bucket as emptier by the step (never
//! fuller); DESIGN.md §5 says what that does to a contended bucket.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use pace::{Clock, CoarseClock, QuantaClock, StdClock};

const READS: u64 = 20_000_000;
const THREADS: usize = 2;
const STEP_READS: u64 = 5_000_000;

fn cost<C: Clock>(clock: &C) -> f64 {
    let start = Instant::now();
    let mut acc = 0u64;
    for _ in 0..READS {
        acc = acc.wrapping_add(clock.now_ns());
    }
    black_box(acc);
    start.elapsed().as_nanos() as f64 / READS as f64
}

/// (steps seen, largest step in ns) over `THREADS` x `STEP_READS` readings.
fn backward_steps<C: Clock>(clock: &C) -> (u64, u64) {
    let max_seen = AtomicU64::new(0);
    let results: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let max_seen = &max_seen;
                s.spawn(move || {
                    let (mut steps, mut largest) = (0u64, 0u64);
                    for _ in 0..STEP_READS {
                        let before = max_seen.load(Ordering::Acquire);
                        let t = clock.now_ns();
                        if t < before {
                            steps += 1;
                            largest = largest.max(before - t);
                        }
                        max_seen.fetch_max(t, Ordering::AcqRel);
                    }
                    (steps, largest)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    results
        .iter()
        .fold((0, 0), |(s, l), &(s2, l2)| (s + s2, l.max(l2)))
}

fn main() {
    // `cargo test --benches` runs bench binaries with `--bench` absent: stay quick.
    if !std::env::args().any(|a| a == "--bench") {
        println!("clock: run with `cargo bench -p pace-benches --bench clock`");
        return;
    }
    let std_clock = StdClock::new();
    let quanta = QuantaClock::new();
    let coarse = CoarseClock::new();
    println!(
        "clock      ns/read  backward steps / {} reads  largest step (ns)",
        THREADS as u64 * STEP_READS
    );
    for round in 0..3 {
        let (s_cost, q_cost) = (cost(&std_clock), cost(&quanta));
        let (s_steps, s_max) = backward_steps(&std_clock);
        let (q_steps, q_max) = backward_steps(&quanta);
        println!("StdClock   {s_cost:7.1}  {s_steps:>10}  {s_max:>10}   (round {round})");
        println!(
            "QuantaClock{q_cost:7.1}  {q_steps:>10}  {q_max:>10}   ratio std/quanta {:.2}",
            s_cost / q_cost
        );
        let c_cost = cost(&coarse);
        let (c_steps, c_max) = backward_steps(&coarse);
        println!(
            "CoarseClock{c_cost:7.1}  {c_steps:>10}  {c_max:>10}   ratio quanta/coarse {:.2}",
            q_cost / c_cost
        );
    }
}
