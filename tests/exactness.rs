//! The promise on a real clock: threads hammer a few hot keys while others
//! flood fresh keys (reserved and refunded, as a claimed-id flood does) and a
//! sweeper sweeps. Every kept admission (admitted, never refunded) is
//! recorded with the clock reading the limiter decided with, and the bound
//! `capacity + span / interval` is checked exactly over every window of
//! those readings (`pace_models::bound`).
//!
//! The clock is a recording wrapper around `StdClock`: it remembers each
//! thread's last reading (the one `reserve` decided with) and, now and then,
//! pauses the thread right after the reading, as a pre-emption between the
//! reading and the CAS would. Refunds are immediate, held and out of order,
//! or never; a quarter of the hot keys' admissions are holds
//! (`Pace::hold_n`), refunded or kept likewise.

use pace_models::bound;

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pace::{Clock, Hold, Pace, Rate, Reservation, StdClock};

/// An admission of either kind, resolved the same way.
enum Admission<'a> {
    Debit(Reservation<'a, u64, u64, RandomState, Recording>),
    Hold(Hold<'a, u64, u64, RandomState, Recording>),
}

impl Admission<'_> {
    fn refund(self) {
        match self {
            Admission::Debit(r) => drop(r.refund()),
            Admission::Hold(h) => drop(h.refund()),
        }
    }
    fn keep(self) {
        match self {
            Admission::Debit(r) => drop(r),
            Admission::Hold(h) => drop(h.keep()),
        }
    }
}

thread_local! {
    static LAST: Cell<u64> = const { Cell::new(0) };
    static SEED: Cell<u64> = const { Cell::new(0) };
}

/// A per-thread xorshift: cheap randomness inside the clock.
fn random() -> u64 {
    SEED.with(|s| {
        let mut x = s.get();
        if x == 0 {
            x = 0x9e37_79b9_7f4a_7c15 ^ (s as *const Cell<u64> as u64);
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    })
}

struct Recording {
    inner: StdClock,
}

impl Clock for Recording {
    fn now_ns(&self) -> u64 {
        let t = self.inner.now_ns();
        LAST.with(|c| c.set(t));
        // Pre-empted after the reading: a yield now and then, a pause of up
        // to 2 ms more rarely.
        let r = random();
        if r.is_multiple_of(16) {
            std::thread::yield_now();
        }
        if r % 1024 == 1 {
            std::thread::sleep(Duration::from_micros(50 + (r >> 20) % 2_000));
        }
        t
    }
}

const HOT: u64 = 4;

struct Config {
    threads: usize,
    capacity: u64,
    interval_ns: u64,
}

/// Runs one configuration; returns (worst excess in ns over the hot keys,
/// kept admissions).
fn run(c: &Config, run_for: Duration) -> (i128, usize) {
    let pace: Pace<u64, RandomState, Recording> =
        Pace::builder(Rate::new(1, Duration::from_nanos(c.interval_ns)).unwrap())
            .capacity(c.capacity)
            .clock(Recording {
                inner: StdClock::new(),
            })
            .build()
            .unwrap();
    let fresh = AtomicU64::new(1 << 32);
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + run_for;
    let kept: Vec<Vec<(u64, u64, u64)>> = std::thread::scope(|s| {
        let sweeper = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                pace.sweep();
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let workers: Vec<_> = (0..c.threads)
            .map(|_| {
                let (pace, fresh) = (&pace, &fresh);
                s.spawn(move || {
                    let keys: Vec<u64> = (0..HOT).collect();
                    let mut kept = Vec::new();
                    let mut held = Vec::new();
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        i += 1;
                        let r = random();
                        if i.is_multiple_of(8) {
                            let k = fresh.fetch_add(1, Ordering::Relaxed);
                            if let Ok(res) = pace.reserve(&k) {
                                res.refund();
                            }
                            continue;
                        }
                        let k = (r % HOT) as usize;
                        let n = if (r >> 8).is_multiple_of(8) {
                            c.capacity.min(2)
                        } else {
                            1
                        };
                        let admitted = if (r >> 48).is_multiple_of(4) {
                            pace.hold_n(&keys[k], n).map(Admission::Hold)
                        } else {
                            pace.reserve_n(&keys[k], n).map(Admission::Debit)
                        };
                        if let Ok(res) = admitted {
                            let now = LAST.with(Cell::get);
                            match (r >> 16) % 4 {
                                0 => {
                                    res.refund();
                                }
                                1 => held.push((res, k as u64, now, n)),
                                _ => kept.push((k as u64, now, n)),
                            }
                        }
                        if held.len() > 6 || (!held.is_empty() && (r >> 24).is_multiple_of(5)) {
                            let pick = ((r >> 32) as usize) % held.len();
                            let (res, k, now, n) = held.swap_remove(pick);
                            if (r >> 40).is_multiple_of(2) {
                                res.refund();
                            } else {
                                res.keep();
                                kept.push((k, now, n));
                            }
                        }
                    }
                    for (res, k, now, n) in held {
                        res.keep();
                        kept.push((k, now, n));
                    }
                    kept
                })
            })
            .collect();
        let kept = workers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        sweeper.join().unwrap();
        kept
    });
    let mut worst = i128::MIN;
    let mut total = 0;
    for key in 0..HOT {
        let mut mine: Vec<(u64, u64)> = kept
            .iter()
            .flatten()
            .filter(|&&(k, _, _)| k == key)
            .map(|&(_, now, n)| (now, n))
            .collect();
        total += mine.len();
        worst = worst.max(bound::worst_excess_ns(&mut mine, c.capacity, c.interval_ns));
    }
    (worst, total)
}

#[test]
fn kept_admissions_fit_the_bucket_on_a_real_clock() {
    let configs = [
        Config {
            threads: 3,
            capacity: 4,
            interval_ns: 20_000,
        },
        Config {
            threads: 4,
            capacity: 8,
            interval_ns: 20_000,
        },
        Config {
            threads: 8,
            capacity: 6,
            interval_ns: 50_000,
        },
    ];
    let run_for = Duration::from_millis(if cfg!(miri) { 20 } else { 700 });
    for c in &configs {
        let (worst, kept) = run(c, run_for);
        eprintln!(
            "threads {} capacity {} interval {} ns: {kept} kept, worst excess {worst} ns ({:.3} tokens; at most 0 holds the bound)",
            c.threads,
            c.capacity,
            c.interval_ns,
            worst as f64 / c.interval_ns as f64
        );
        assert!(kept as u64 > 4 * c.capacity, "too little traffic to judge");
        assert!(
            worst <= 0,
            "threads {}, capacity {}, interval {} ns: kept admissions exceed the bound by {worst} ns",
            c.threads,
            c.capacity,
            c.interval_ns
        );
    }
}

/// The bound under quotas: threads reserve under the default quota (which a
/// switcher flips between two quotas), under quotas of their own, and wait
/// for turns, on the recording clock. Each kept admission is checked with
/// the quota it was decided with (its cost tells which: the two intervals
/// differ) and, for a turn, at its slot: over every window the kept
/// admissions cost at most the span plus their largest horizon.
#[test]
fn kept_admissions_fit_under_quota_changes_and_turns_on_a_real_clock() {
    use pace::internals::ReservationInternals;
    use pace::Quota;
    let quotas = [
        Quota::new(Rate::new(1, Duration::from_nanos(20_000)).unwrap(), 4).unwrap(),
        Quota::new(Rate::new(1, Duration::from_nanos(50_000)).unwrap(), 3).unwrap(),
    ];
    let cost_of = |q: &Quota| q.interval().as_nanos() as u64;
    let horizon_of = |q: &Quota| q.horizon().as_nanos() as u64;
    let pace: Pace<u64, RandomState, Recording> = Pace::builder(quotas[0].rate())
        .quota(quotas[0])
        .clock(Recording {
            inner: StdClock::new(),
        })
        .build()
        .unwrap();
    let stop = AtomicBool::new(false);
    let run_for = Duration::from_millis(if cfg!(miri) { 20 } else { 700 });
    let deadline = Instant::now() + run_for;
    // (key, reading, cost, horizon) of each kept admission.
    let kept: Vec<(u64, u64, u64, u64)> = std::thread::scope(|s| {
        let switcher = s.spawn(|| {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                pace.set_quota(quotas[i % 2]);
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        let sweeper = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                pace.sweep();
                std::thread::sleep(Duration::from_micros(300));
            }
        });
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let pace = &pace;
                s.spawn(move || {
                    let mut kept = Vec::new();
                    while Instant::now() < deadline {
                        let r = random();
                        let key = r % HOT;
                        let n = 1 + (r >> 8) % 2;
                        match (r >> 16) % 4 {
                            // Under the default: its cost tells the quota.
                            0 | 1 => {
                                if let Ok(res) = pace.reserve_n(&key, n) {
                                    let now = LAST.with(Cell::get);
                                    let cost = res.debit_end_ns() - res.debit_prev_ns().max(now);
                                    let q = quotas
                                        .iter()
                                        .find(|q| cost_of(q) * n == cost)
                                        .expect("a debit costs one quota's tokens");
                                    if (r >> 24).is_multiple_of(4) {
                                        res.refund();
                                    } else {
                                        kept.push((key, now, cost, horizon_of(q)));
                                    }
                                }
                            }
                            // Under a quota of its own.
                            2 => {
                                let q = quotas[((r >> 24) % 2) as usize];
                                if let Ok(res) = pace.reserve_n_with(&key, n, q) {
                                    let now = LAST.with(Cell::get);
                                    kept.push((key, now, cost_of(&q) * n, horizon_of(&q)));
                                    drop(res);
                                }
                            }
                            // A turn up to 100 µs ahead, counted at its slot.
                            _ => {
                                let q = quotas[((r >> 24) % 2) as usize];
                                let wait = Duration::from_micros(100);
                                if let Ok(res) = pace.acquire_n_with_blocking(&key, n, q, wait) {
                                    let slot = res.debit_end_ns() - horizon_of(&q);
                                    assert!(pace.clock().inner.now_ns() >= slot, "through early");
                                    kept.push((key, slot, cost_of(&q) * n, horizon_of(&q)));
                                }
                            }
                        }
                    }
                    kept
                })
            })
            .collect();
        // Stop the helpers before a worker's panic (a failed check) is
        // passed on, so that a failure ends the test rather than hanging it.
        let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        stop.store(true, Ordering::Relaxed);
        switcher.join().unwrap();
        sweeper.join().unwrap();
        results
            .into_iter()
            .flat_map(|r| r.unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut worst = i128::MIN;
    for key in 0..HOT {
        let mine: Vec<(u64, u64, u64)> = kept
            .iter()
            .filter(|&&(k, ..)| k == key)
            .map(|&(_, now, c, h)| (now, c, h))
            .collect();
        if !mine.is_empty() {
            worst = worst.max(bound::worst_excess_mixed_ns(&mine));
        }
    }
    eprintln!(
        "quotas and turns: {} kept, worst excess {worst} ns",
        kept.len()
    );
    assert!(kept.len() > 100, "too little traffic to judge");
    assert!(worst <= 0, "kept admissions exceed the bound by {worst} ns");
}
