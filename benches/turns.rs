//! Waiting for a turn: `Pace::acquire` against governor's `until_key_ready`
//! on the same workload, in one process, rounds alternating.
//!
//! ```text
//! cargo bench -p pace-benches --features tokio --bench turns
//! ```
//!
//! Workload: 8 tasks on one key at 10 per second (capacity 10, one second),
//! each calling the limiter in a loop for 3 s, on a tokio runtime built as
//! `#[tokio::main]` builds one (multi-thread, timer and IO drivers), with 2
//! workers. For each limiter it reports:
//! * calls let through, and calls that slept (waited);
//! * sleeps, and wasted wake-ups: sleeps beyond one per call that slept.
//!   Each call's sleeps are counted around each poll of its future, on the
//!   thread running that poll: pace's with
//!   `pace::internals::turn_sleeps_here`, governor's through its clock
//!   (each check reads it once, each denied check once more before it
//!   sleeps, so a call's sleeps = (its clock readings − 1) / 2);
//! * order: pairs of calls let through in the other order than they
//!   arrived (inversions; 0 is first come, first served). A call arrives
//!   when the limiter first decides on it: pace's when its debit lands (the
//!   order of the debits' ends), governor's at its first check (the order of
//!   that check's clock reading). A number taken before the call would also
//!   count two calls swapping between taking it and reaching the limiter;
//! * lateness: each admission's time against the ideal schedule of the
//!   bucket, which starts full at the run's first admission `t1` (the k-th
//!   admission is due at `t1 + max(0, k − capacity + 1) × interval`; the
//!   time the tasks take to start before `t1` is no one's lateness), p50 /
//!   p99 / max; and the longest wait of a call. For pace, also each
//!   admission against its own slot on the limiter's clock (`max(the
//!   call's start, tat − τ)`, read right after the call returns). With
//!   under a hundred admissions a round, p99 is the largest admission's
//!   lateness.
//!
//! `acquire` sleeps on `futures-timer` (a timer thread with nanosecond
//! deadlines, as governor's `until_key_ready` does). With `PACE_TURN_EXP=1`
//! the same turns (`PaceInternals::reserve_turn_at`) also wait on tokio's
//! timer, to show what a runtime's millisecond timer costs:
//! * `tokio-timer`: tokio's timer aimed at the slot: tokio rounds a
//!   deadline up to its next 1 ms tick and parks in whole milliseconds, so
//!   a wake lands anywhere in the 2 ms after the slot;
//! * `tokio-early`: tokio's timer aimed 1 ms before the slot, the last
//!   ≤ 100 µs spun, a wake-up further off sleeps again (counted): aiming
//!   early trades lateness for wasted wake-ups;
//! * `pace-blocking`: `acquire_blocking` on 8 threads instead of 8 tasks:
//!   each thread sleeps itself (`std::thread::sleep`), one wake-up per
//!   turn where an async wait needs two (the timer thread's, then a
//!   worker's): what this machine's wake-ups cost without an executor.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use governor::clock::{QuantaClock as GClock, ReasonablyRealtime};
use hdrhistogram::Histogram;
use pace::internals::ReservationInternals;
use pace::{Pace, Rate};

const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(3);
const PER_SECOND: u64 = 10;

thread_local! {
    /// The number of the first governor clock reading on this thread since
    /// it was reset.
    static FIRST_READING: Cell<Option<u64>> = const { Cell::new(None) };
    /// governor clock readings on this thread.
    static READINGS_HERE: Cell<u64> = const { Cell::new(0) };
    /// Sleeps of the waits written here, on this thread.
    static EXP_SLEEPS_HERE: Cell<u64> = const { Cell::new(0) };
}

/// governor's quanta clock, counting its readings.
#[derive(Clone, Default)]
struct Counting {
    inner: GClock,
    readings: Arc<AtomicU64>,
}

impl governor::clock::Clock for Counting {
    type Instant = <GClock as governor::clock::Clock>::Instant;
    fn now(&self) -> Self::Instant {
        let n = self.readings.fetch_add(1, Ordering::SeqCst);
        FIRST_READING.with(|f| {
            if f.get().is_none() {
                f.set(Some(n));
            }
        });
        READINGS_HERE.with(|r| r.set(r.get() + 1));
        governor::clock::Clock::now(&self.inner)
    }
}

impl ReasonablyRealtime for Counting {}

/// A call's future, counting what each of its polls did on the thread
/// running it: turn sleeps (pace's and the waits written here), governor
/// clock readings, and the number of the first reading (a governor call's
/// first check, made in its first poll).
struct Counted<F> {
    inner: Pin<Box<F>>,
    polled: bool,
    first: Option<u64>,
    sleeps: u64,
    readings: u64,
}

/// What a counted call did.
struct Counts {
    first: Option<u64>,
    sleeps: u64,
    readings: u64,
}

fn counted<F: Future>(f: F) -> Counted<F> {
    Counted {
        inner: Box::pin(f),
        polled: false,
        first: None,
        sleeps: 0,
        readings: 0,
    }
}

fn sleeps_here() -> u64 {
    pace::internals::turn_sleeps_here() + EXP_SLEEPS_HERE.with(Cell::get)
}

impl<F: Future> Future for Counted<F> {
    type Output = (F::Output, Counts);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let first_poll = !this.polled;
        this.polled = true;
        if first_poll {
            FIRST_READING.with(|f| f.set(None));
        }
        let (sleeps, readings) = (sleeps_here(), READINGS_HERE.with(Cell::get));
        let r = this.inner.as_mut().poll(cx);
        this.sleeps += sleeps_here() - sleeps;
        this.readings += READINGS_HERE.with(Cell::get) - readings;
        if first_poll {
            this.first = FIRST_READING.with(Cell::get);
        }
        r.map(|out| {
            let counts = Counts {
                first: this.first,
                sleeps: this.sleeps,
                readings: this.readings,
            };
            (out, counts)
        })
    }
}

/// One call: when it arrived (its place in the limiter's order), when it
/// was let through, how long it took, how many times it slept.
#[derive(Clone, Copy)]
struct Call {
    arrived: u64,
    through: Instant,
    took: Duration,
    sleeps: u64,
    /// Lateness against the call's own slot (ns), where the limiter says it.
    behind_slot: Option<u64>,
}

/// Prints a run's figures; returns its lateness against the schedule and
/// against each call's own slot (µs).
fn summarise(name: &str, mut calls: Vec<Call>) -> (Histogram<u64>, Histogram<u64>) {
    calls.sort_by_key(|c| c.through);
    let Some(t1) = calls.first().map(|c| c.through) else {
        return (Histogram::new(3).unwrap(), Histogram::new(3).unwrap());
    };
    let mut behind = Histogram::<u64>::new(3).unwrap();
    for ns in calls.iter().filter_map(|c| c.behind_slot) {
        behind.record(ns / 1_000).unwrap();
    }
    let waited = calls.iter().filter(|c| c.sleeps > 0).count() as u64;
    let sleeps: u64 = calls.iter().map(|c| c.sleeps).sum();
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
        let at = c.through.duration_since(t1).as_nanos() as u64;
        late.record(at.saturating_sub(due) / 1_000).unwrap();
    }
    let longest = calls.iter().map(|c| c.took).max().unwrap_or_default();
    println!(
        "{name:13} through {:3}  waited {:3}  sleeps {:4}  wasted wake-ups {:4}  inversions {:4}  \
         lateness p50 {:6} µs p99 {:6} µs max {:6} µs  longest wait {:7.1} ms{}",
        calls.len(),
        waited,
        sleeps,
        sleeps - waited,
        inversions,
        late.value_at_quantile(0.5),
        late.value_at_quantile(0.99),
        late.max(),
        longest.as_secs_f64() * 1e3,
        if behind.is_empty() {
            String::new()
        } else {
            format!(
                "  behind own slot p50 {} µs p99 {} µs max {} µs",
                behind.value_at_quantile(0.5),
                behind.value_at_quantile(0.99),
                behind.max()
            )
        }
    );
    (late, behind)
}

/// How a turn waits for its slot.
#[derive(Clone, Copy, PartialEq)]
enum How {
    Acquire,
    /// `acquire_blocking` on threads of its own.
    Blocking,
    /// tokio's timer aimed `lead_us` before the slot, then a spin if at
    /// most `spin_us` is left, else another sleep.
    Early {
        lead_us: u64,
        spin_us: u64,
    },
}

/// Notes a sleep of a wait written here, on this thread.
fn note_exp_sleep() {
    EXP_SLEEPS_HERE.with(|c| c.set(c.get() + 1));
}

/// How far behind its own slot (ns) a turn went through at `seen`: the slot
/// is `max(called, tat − τ)`, `called` the clock when the call began and
/// `end` (`tat`) its debit's end (capacity `PER_SECOND`, so τ is 1 s).
fn behind_slot(seen: u64, called: u64, end: u64) -> u64 {
    seen.saturating_sub(end.saturating_sub(1_000_000_000).max(called))
}

/// One turn: the end of its debit (its place in the order) and how far
/// behind its own slot it went through (ns, on the limiter's clock).
async fn turn(p: &Pace<u64>, how: How) -> (u64, u64) {
    use pace::clock::Clock;
    use pace::internals::PaceInternals;
    let called = p.clock().now_ns();
    let behind = |end: u64| behind_slot(p.clock().now_ns(), called, end);
    match how {
        How::Acquire => {
            let r = p
                .acquire(&7, Duration::from_secs(10))
                .await
                .expect("within 10 s");
            let end = r.debit_end_ns();
            (end, behind(end))
        }
        How::Blocking => unreachable!("blocking turns run on threads: run_blocking"),
        How::Early { lead_us, spin_us } => {
            let now = p.clock().now_ns();
            let (r, slot) = p
                .reserve_turn_at(&7, 1, None, 10_000_000_000, now)
                .expect("within 10 s");
            loop {
                let now = p.clock().now_ns();
                if now >= slot {
                    break;
                }
                let rem = slot - now;
                if rem <= spin_us * 1000 {
                    while p.clock().now_ns() < slot {
                        std::hint::spin_loop();
                    }
                    break;
                }
                note_exp_sleep();
                tokio::time::sleep(Duration::from_nanos(rem.saturating_sub(lead_us * 1000))).await;
            }
            let end = r.debit_end_ns();
            (end, behind(end))
        }
    }
}

async fn run_pace(p: Arc<Pace<u64>>, start: Instant, how: How) -> Vec<Call> {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (p, calls) = (p.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < RUN {
                let t = Instant::now();
                let ((arrived, behind), counts) = counted(turn(&p, how)).await;
                let through = Instant::now();
                calls.lock().unwrap().push(Call {
                    arrived,
                    through,
                    took: through - t,
                    sleeps: counts.sleeps,
                    behind_slot: Some(behind),
                });
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let calls = calls.lock().unwrap().clone();
    calls
}

/// `acquire_blocking` on `TASKS` threads of their own.
fn run_blocking(p: Arc<Pace<u64>>, start: Instant) -> Vec<Call> {
    use pace::clock::Clock;
    let threads: Vec<_> = (0..TASKS)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut calls = Vec::new();
                while start.elapsed() < RUN {
                    let t = Instant::now();
                    let called = p.clock().now_ns();
                    let before = pace::internals::turn_sleeps_here();
                    let r = p
                        .acquire_blocking(&7, Duration::from_secs(10))
                        .expect("within 10 s");
                    let seen = p.clock().now_ns();
                    let through = Instant::now();
                    let end = r.debit_end_ns();
                    calls.push(Call {
                        arrived: end,
                        through,
                        took: through - t,
                        sleeps: pace::internals::turn_sleeps_here() - before,
                        behind_slot: Some(behind_slot(seen, called, end)),
                    });
                }
                calls
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

type Governor =
    governor::RateLimiter<u64, governor::state::keyed::DefaultKeyedStateStore<u64>, Counting>;

async fn run_governor(g: Arc<Governor>, start: Instant) -> Vec<Call> {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (g, calls) = (g.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < RUN {
                let t = Instant::now();
                let ((), counts) = counted(g.until_key_ready(&7u64)).await;
                let through = Instant::now();
                calls.lock().unwrap().push(Call {
                    arrived: counts.first.expect("a check reads the clock"),
                    through,
                    took: through - t,
                    sleeps: counts.readings.saturating_sub(1) / 2,
                    behind_slot: None,
                });
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let calls = calls.lock().unwrap().clone();
    calls
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let rounds: usize = std::env::var("PACE_TURN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let exp = std::env::var("PACE_TURN_EXP").is_ok();
    println!("{TASKS} tasks on one key at {PER_SECOND}/s (capacity {PER_SECOND}) for {RUN:?}, {rounds} rounds");
    let mut hows = vec![("pace", Some(How::Acquire)), ("governor", None)];
    if exp {
        hows.push((
            "tokio-early",
            Some(How::Early {
                lead_us: 1000,
                spin_us: 100,
            }),
        ));
        // Aimed at the slot: no lead, no spin.
        hows.push((
            "tokio-timer",
            Some(How::Early {
                lead_us: 0,
                spin_us: 0,
            }),
        ));
        hows.push(("pace-blocking", Some(How::Blocking)));
    }
    // Every admission's lateness over all rounds, per contender: with under
    // a hundred admissions a round, a round's p99 is its largest.
    let mut pooled: Vec<Histogram<u64>> = hows.iter().map(|_| Histogram::new(3).unwrap()).collect();
    let mut pooled_slot: Vec<Histogram<u64>> =
        hows.iter().map(|_| Histogram::new(3).unwrap()).collect();
    for round in 0..rounds {
        println!("round {}", round + 1);
        let mut order: Vec<usize> = (0..hows.len()).collect();
        order.rotate_left(round % hows.len());
        for which in order {
            let (name, how) = hows[which];
            // Each limiter is built (and its clock calibrated) before its
            // run starts.
            if let Some(how) = how {
                let p = Arc::new(Pace::new(Rate::per_second(PER_SECOND).unwrap()));
                p.peek(&7);
                let start = Instant::now();
                let r = if how == How::Blocking {
                    run_blocking(p, start)
                } else {
                    rt.block_on(run_pace(p, start, how))
                };
                let (late, behind) = summarise(name, r);
                pooled[which].add(late).unwrap();
                pooled_slot[which].add(behind).unwrap();
            } else {
                let clock = Counting::default();
                let per = std::num::NonZeroU32::new(PER_SECOND as u32).unwrap();
                let q = governor::Quota::per_second(per);
                let g = Arc::new(governor::RateLimiter::dashmap_with_clock(q, clock.clone()));
                let _ = g.check_key(&8);
                let start = Instant::now();
                let r = rt.block_on(run_governor(g, start));
                pooled[which].add(summarise(name, r).0).unwrap();
            }
        }
    }
    println!("all {rounds} rounds, lateness of every admission:");
    let line = |name: &str, what: &str, h: &Histogram<u64>| {
        let over = h.count_between(2_001, h.max().max(2_001));
        println!(
            "{name:13} {what:15} admissions {:4}  p50 {:6} µs  p99 {:6} µs  p99.9 {:6} µs  max {:6} µs  over 2 ms {:3}",
            h.len(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max(),
            over,
        );
    };
    for (i, (name, _)) in hows.iter().enumerate() {
        line(name, "vs schedule", &pooled[i]);
        if !pooled_slot[i].is_empty() {
            line(name, "vs own slot", &pooled_slot[i]);
        }
    }
}
