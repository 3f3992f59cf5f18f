//! What a flood of overlapping reserve → check → refund cycles costs a key
//! (README: "Overlapping refunds"): a reserve's refund restores the key only
//! if nothing was debited since, so cycles that overlap lose tokens until
//! the bucket refills; a hold's refund is exact, so the same flood with
//! `hold` → check → `Hold::refund` leaves the key full. 1 token per hour
//! (no token comes back during a run), capacity 3; N tasks on one limiter
//! loop reserve (or hold) → 50 µs of checking (a spin) → refund on one key
//! until they made 200 cycles between them, or, with reserves and more than
//! one task, until a refund was superseded (an overlap: it returned
//! nothing), with a bound only a hang exceeds; then the key's tokens are
//! read on the server. (No run leans on time: a run ends on counts and
//! events, however slowly the machine runs it.)
//!
//! `cargo test -p pace-redis --test flood -- --nocapture` prints the table.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pace::Rate;
use pace_redis::{Error, RedisPace, Refunded};

const CAPACITY: u64 = 3;
const RUNS: usize = 5;
/// Cycles of a run that ends on its count.
const CYCLES: u64 = 200;
/// A bound only a hang exceeds.
const HANG: Duration = Duration::from_secs(120);

async fn flood(url: &str, tasks: usize, run: usize, holds: bool) -> (u64, u64) {
    let p = RedisPace::builder(Rate::new(1, Duration::from_secs(3600)).unwrap())
        .capacity(CAPACITY)
        .prefix(format!("flood{tasks}-{run}-{holds}:"))
        .timeout(HANG)
        .connect(url)
        .await
        .unwrap();
    // Cycles made and refunds superseded, by all the tasks.
    let made = Arc::new(AtomicU64::new(0));
    let superseded = Arc::new(AtomicU64::new(0));
    // Until 200 cycles, or, where refunds can be superseded (reserves,
    // overlapping tasks), until one was.
    let until_overlap = !holds && tasks > 1;
    let done = {
        let (made, superseded) = (made.clone(), superseded.clone());
        move || {
            if until_overlap {
                superseded.load(Ordering::Relaxed) > 0
            } else {
                made.load(Ordering::Relaxed) >= CYCLES
            }
        }
    };
    let deadline = Instant::now() + HANG;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (p, made, superseded, done) =
            (p.clone(), made.clone(), superseded.clone(), done.clone());
        handles.push(tokio::spawn(async move {
            let mut cycles = 0u64;
            while !done() {
                assert!(Instant::now() < deadline, "the flood hung");
                if holds {
                    match p.hold("victim").await {
                        Ok(h) => {
                            let t = Instant::now();
                            while t.elapsed() < Duration::from_micros(50) {
                                std::hint::spin_loop();
                            }
                            assert_eq!(h.refund().await.unwrap(), Refunded::Restored);
                            cycles += 1;
                            made.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(Error::Denied(_)) => tokio::task::yield_now().await,
                        Err(e) => panic!("{e}"),
                    }
                    continue;
                }
                match p.reserve("victim").await {
                    Ok(r) => {
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_micros(50) {
                            std::hint::spin_loop();
                        }
                        if p.refund(r).await.unwrap() == Refunded::Superseded {
                            superseded.fetch_add(1, Ordering::Relaxed);
                        }
                        cycles += 1;
                        made.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Error::Denied(_)) => tokio::task::yield_now().await,
                    Err(e) => panic!("{e}"),
                }
            }
            cycles
        }));
    }
    let mut cycles = 0;
    for h in handles {
        cycles += h.await.unwrap();
    }
    (p.peek("victim").await.unwrap().remaining(), cycles)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_refunds_lose_tokens_until_the_bucket_refills() {
    let server = common::RedisServer::start();
    println!("tasks  tokens left after each of {RUNS} floods (of {CAPACITY})  cycles");
    for tasks in [1usize, 2, 4, 8, 16] {
        let mut left = Vec::new();
        let mut cycles = Vec::new();
        for run in 0..RUNS {
            let (l, c) = flood(&server.url(), tasks, run, false).await;
            left.push(l);
            cycles.push(c);
        }
        println!("{tasks:>5}  {left:?}  {cycles:?}");
        // A refund never mints: the key never holds more than its capacity.
        assert!(left.iter().all(|&l| l <= CAPACITY));
        if tasks == 1 {
            // Cycles that never overlap: every refund restores the key.
            assert_eq!(left, vec![CAPACITY; RUNS], "one task lost tokens");
        } else {
            // Overlapping cycles: a refund superseded by another task's
            // debit returns nothing (README: "Overlapping refunds"). If this
            // fails, refunds became exact: update the README.
            assert!(
                left.iter().all(|&l| l < CAPACITY),
                "{tasks} tasks kept the whole capacity in some run: {left:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_hold_refunds_are_exact() {
    let server = common::RedisServer::start();
    println!("holds: tasks  tokens left after each of {RUNS} floods (of {CAPACITY})  cycles");
    for tasks in [1usize, 2, 4, 8, 16] {
        let mut left = Vec::new();
        let mut cycles = Vec::new();
        for run in 0..RUNS {
            let (l, c) = flood(&server.url(), tasks, run, true).await;
            left.push(l);
            cycles.push(c);
        }
        println!("holds: {tasks:>5}  {left:?}  {cycles:?}");
        // Every hold's refund returns exactly its token, in any order.
        assert_eq!(
            left,
            vec![CAPACITY; RUNS],
            "{tasks} tasks lost tokens with holds"
        );
        assert!(cycles.iter().all(|&c| c > 0));
    }
}
