//! Waiting for a turn: `Pace::acquire` against governor's `until_key_ready`
//! on the same workload, in one process, rounds alternating.
//!
//! ```text
//! cargo bench -p pace-benches --features tokio --bench turns
//! ```
//!
//! Workload: 8 tasks on one key at 10 per second (capacity 10, one second),
//! each calling the limiter in a loop for 3 s (a tokio runtime with 2
//! workers). For each limiter it reports:
//! * calls let through, and calls that had to wait (took over 0.5 ms);
//! * sleeps, and wasted wake-ups: sleeps beyond one per waiting call. pace
//!   counts its sleeps (`pace::internals::turn_sleeps`); governor's are
//!   counted through its clock: each check reads it once, each denied check
//!   once more before it sleeps, so sleeps = (readings − calls) / 2;
//! * order: pairs of calls let through in the other order than they
//!   arrived (inversions; 0 is first come, first served);
//! * lateness: each admission's time against the ideal schedule of the
//!   bucket (the k-th admission of the run is due at `start + max(0, k −
//!   capacity + 1) × interval`), p50 / p99 / max; and the longest wait of a
//!   call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use governor::clock::{QuantaClock as GClock, ReasonablyRealtime};
use hdrhistogram::Histogram;
use pace::{Pace, Rate};

const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(3);
const PER_SECOND: u64 = 10;

/// governor's quanta clock, counting its readings.
#[derive(Clone, Default)]
struct Counting {
    inner: GClock,
    readings: Arc<AtomicU64>,
}

impl governor::clock::Clock for Counting {
    type Instant = <GClock as governor::clock::Clock>::Instant;
    fn now(&self) -> Self::Instant {
        self.readings.fetch_add(1, Ordering::Relaxed);
        governor::clock::Clock::now(&self.inner)
    }
}

impl ReasonablyRealtime for Counting {}

/// One call: when it arrived (sequence), when it was let through, how long
/// it took.
#[derive(Clone, Copy)]
struct Call {
    arrived: u64,
    through: Instant,
    took: Duration,
}

struct Report {
    calls: Vec<Call>,
    sleeps: u64,
}

fn summarise(name: &str, start: Instant, r: Report) {
    let mut calls = r.calls;
    calls.sort_by_key(|c| c.through);
    let waited = calls
        .iter()
        .filter(|c| c.took > Duration::from_micros(500))
        .count() as u64;
    let mut inversions = 0u64;
    for (i, a) in calls.iter().enumerate() {
        inversions += calls[i + 1..]
            .iter()
            .filter(|b| b.arrived < a.arrived)
            .count() as u64;
    }
    let interval = 1_000_000_000 / PER_SECOND;
    let mut late = Histogram::<u64>::new(3).unwrap();
    for (k, c) in calls.iter().enumerate() {
        let due = (k as u64 + 1).saturating_sub(PER_SECOND) * interval;
        let at = c.through.duration_since(start).as_nanos() as u64;
        late.record(at.saturating_sub(due) / 1_000).unwrap();
    }
    let longest = calls.iter().map(|c| c.took).max().unwrap_or_default();
    println!(
        "{name:9} through {:3}  waited {:3}  sleeps {:4}  wasted wake-ups {:4}  inversions {:4}  \
         lateness p50 {:6} µs p99 {:6} µs max {:6} µs  longest wait {:7.1} ms",
        calls.len(),
        waited,
        r.sleeps,
        r.sleeps.saturating_sub(waited),
        inversions,
        late.value_at_quantile(0.5),
        late.value_at_quantile(0.99),
        late.max(),
        longest.as_secs_f64() * 1e3,
    );
}

async fn run_pace(p: Arc<Pace<u64>>, start: Instant) -> Report {
    let seq = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let sleeps0 = pace::internals::turn_sleeps();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (p, seq, calls) = (p.clone(), seq.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < RUN {
                let arrived = seq.fetch_add(1, Ordering::SeqCst);
                let t = Instant::now();
                let r = p
                    .acquire(&7, Duration::from_secs(10))
                    .await
                    .expect("within 10 s");
                let through = Instant::now();
                drop(r);
                calls.lock().unwrap().push(Call {
                    arrived,
                    through,
                    took: through - t,
                });
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let calls = calls.lock().unwrap().clone();
    Report {
        calls,
        sleeps: pace::internals::turn_sleeps() - sleeps0,
    }
}

type Governor =
    governor::RateLimiter<u64, governor::state::keyed::DefaultKeyedStateStore<u64>, Counting>;

async fn run_governor(g: Arc<Governor>, clock: Counting, start: Instant) -> Report {
    let readings0 = clock.readings.load(Ordering::Relaxed);
    let seq = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (g, seq, calls) = (g.clone(), seq.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < RUN {
                let arrived = seq.fetch_add(1, Ordering::SeqCst);
                let t = Instant::now();
                g.until_key_ready(&7u64).await;
                let through = Instant::now();
                calls.lock().unwrap().push(Call {
                    arrived,
                    through,
                    took: through - t,
                });
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let calls = calls.lock().unwrap().clone();
    let readings = clock.readings.load(Ordering::Relaxed) - readings0;
    let sleeps = readings.saturating_sub(calls.len() as u64) / 2;
    Report { calls, sleeps }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let rounds: usize = std::env::var("PACE_TURN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    println!("{TASKS} tasks on one key at {PER_SECOND}/s (capacity {PER_SECOND}) for {RUN:?}, {rounds} rounds");
    for round in 0..rounds {
        println!("round {}", round + 1);
        for which in [round % 2, 1 - round % 2] {
            // Each limiter is built (and its clock calibrated) before its
            // run starts.
            if which == 0 {
                let p = Arc::new(Pace::new(Rate::per_second(PER_SECOND).unwrap()));
                p.peek(&7);
                let start = Instant::now();
                let r = rt.block_on(run_pace(p, start));
                summarise("pace", start, r);
            } else {
                let clock = Counting::default();
                let per = std::num::NonZeroU32::new(PER_SECOND as u32).unwrap();
                let q = governor::Quota::per_second(per);
                let g = Arc::new(governor::RateLimiter::dashmap_with_clock(q, clock.clone()));
                let _ = g.check_key(&8);
                let start = Instant::now();
                let r = rt.block_on(run_governor(g, clock, start));
                summarise("governor", start, r);
            }
        }
    }
}
