//! All-or-nothing reservations over several limits (`pace::all`), on a
//! hand-moved clock, against exact integer outcomes.
//!
//! Known-wrong variants these tests catch (build with
//! `RUSTFLAGS='--cfg pace_mutant="NAME"' cargo test --test all`):
//! `all_no_refund` (a later denial keeps the earlier debits),
//! `all_refund_oldest_first` (earlier debits refunded oldest first, so a
//! plain pair named twice keeps a debit), `all_first_only` (denials after the
//! first pair are ignored: over-admission).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use pace::{Axis, Debit, Denied, DenyReason, ManualClock, Pace, Rate, Refunded};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type P<K> = Pace<K, RandomState, ManualClock>;

fn pace<K>(clock: &ManualClock, per_second: u64, capacity: u64) -> P<K> {
    Pace::builder(Rate::per_second(per_second).unwrap())
        .capacity(capacity)
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn admits_when_every_limit_admits_and_debits_each() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(5));
    let src: P<u32> = pace(&clock, 10, 10);
    let ids: P<String> = pace(&clock, 2, 2);
    let held = pace::all()
        .with(&src, &7)
        .with_n(&ids, "a", 2)
        .reserve()
        .unwrap();
    assert_eq!(held.len(), 2);
    assert_eq!((held.tokens(0), held.tokens(1), held.tokens(2)), (1, 2, 0));
    drop(held);
    assert_eq!(src.peek(&7), 9);
    assert_eq!(ids.peek("a"), 0);
}

#[test]
fn a_later_denial_refunds_the_earlier_pairs_and_leaves_later_ones_untouched() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(5));
    let src: P<u32> = pace(&clock, 10, 10);
    let ids: P<String> = pace(&clock, 4, 2);
    let third: P<u64> = pace(&clock, 10, 10);
    let _a = ids.reserve("a").unwrap().detach();
    let _b = ids.reserve("a").unwrap().detach();
    let denied = pace::all()
        .with(&src, &7)
        .with(&ids, "a")
        .with(&third, &1)
        .reserve()
        .unwrap_err();
    assert_eq!(denied.index, 1);
    assert_eq!(denied.denied.reason(), DenyReason::Exhausted);
    // Two tokens at 4/s: the next one in 250 ms exactly.
    assert_eq!(denied.denied.retry_after(), ms(250));
    // The source debit is undone: the bucket is full again and its row gone.
    assert_eq!(src.peek(&7), 10);
    assert_eq!(src.len(), 0);
    // The pair after the denial was never touched.
    assert_eq!(third.len(), 0);
    assert_eq!(third.peek(&1), 10);
}

#[test]
fn a_pair_named_twice_is_refunded_whole() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(5));
    let src: P<u32> = pace(&clock, 10, 10);
    let ids: P<String> = pace(&clock, 1, 1);
    let _spent = ids.reserve("a").unwrap().detach();
    let denied = pace::all()
        .with_n(&src, &7, 3)
        .with_n(&src, &7, 2)
        .with(&ids, "a")
        .reserve()
        .unwrap_err();
    assert_eq!(denied.index, 2);
    // Both are holds, returned exactly whatever the order.
    assert_eq!(src.peek(&7), 10);
    assert_eq!(src.len(), 0);
}

/// A pair whose holds are plain debits ([`Axis`]'s default `hold_n`), as a
/// caller's own limit may be: refunds follow the refund rule, so their
/// order matters.
struct Plain<'a>(&'a P<u32>, u32);

impl Axis for Plain<'_> {
    fn reserve_n(&self, n: u64) -> Result<Debit, Denied> {
        self.0.reserve_n(&self.1, n).map(|r| r.detach())
    }

    fn refund(&self, debit: Debit) -> Refunded {
        self.0.refund(&self.1, debit)
    }

    fn peek(&self) -> u64 {
        self.0.peek(&self.1)
    }
}

#[test]
fn plain_pairs_named_twice_are_refunded_newest_first() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(5));
    let src: P<u32> = pace(&clock, 10, 10);
    let ids: P<String> = pace(&clock, 1, 1);
    let _spent = ids.reserve("a").unwrap().detach();
    let denied = pace::all()
        .axis(Box::new(Plain(&src, 7)), 3)
        .axis(Box::new(Plain(&src, 7)), 2)
        .with(&ids, "a")
        .reserve()
        .unwrap_err();
    assert_eq!(denied.index, 2);
    // Newest first, each plain refund finds its own debit last and restores
    // the state before it; oldest first, the 3-token refund finds the
    // 2-token debit after it and returns nothing.
    assert_eq!(
        src.peek(&7),
        10,
        "a plain refund in the wrong order kept tokens"
    );
    assert_eq!(src.len(), 0);
}

#[test]
fn a_permanent_denial_reports_its_pair() {
    let clock = ManualClock::new();
    let src: P<u32> = pace(&clock, 10, 10);
    let ids: P<String> = pace(&clock, 2, 2);
    let denied = pace::all()
        .with(&src, &7)
        .with_n(&ids, "a", 3)
        .reserve()
        .unwrap_err();
    assert_eq!(denied.index, 1);
    assert!(denied.denied.is_permanent());
    assert_eq!(denied.denied.reason(), DenyReason::ExceedsCapacity);
    assert_eq!(denied.denied.retry_after(), Duration::MAX);
    assert_eq!(src.peek(&7), 10);
}

#[test]
fn no_pairs_always_admits() {
    let held = pace::all().reserve().unwrap();
    assert!(held.is_empty());
}

#[test]
fn refunds_are_chosen_per_pair_and_owned_pairs_work() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(5));
    let src: Arc<P<u32>> = Arc::new(pace(&clock, 10, 10));
    let ids: Arc<P<String>> = Arc::new(pace(&clock, 2, 2));
    let mut held = pace::all()
        .axis(Box::new((src.clone(), 7u32)), 1)
        .axis(Box::new((ids.clone(), "a".to_string())), 1)
        .reserve()
        .unwrap();
    assert!(held.refund(1));
    assert!(!held.refund(1), "a pair refunds once");
    assert!(!held.refund(9), "out of range");
    assert_eq!(held.tokens(1), 0);
    assert_eq!(
        (held.peek(0), held.peek(1), held.peek(2)),
        (Some(9), Some(2), None)
    );
    drop(held);
    assert_eq!(src.peek(&7), 9);
    assert_eq!(ids.peek("a"), 2);
    assert_eq!(ids.len(), 0);

    let held = pace::all()
        .axis(Box::new((src.clone(), 7u32)), 1)
        .axis(Box::new((ids.clone(), "a".to_string())), 1)
        .reserve()
        .unwrap();
    held.refund_where(|i| i == 0);
    assert_eq!(src.peek(&7), 9);
    assert_eq!(ids.peek("a"), 1);
}

/// A pair that lets another request debit `key` of `pace` while it is being
/// reserved, then denies: the race the refund rule exists for.
struct RacingDenial<'a> {
    pace: &'a P<u32>,
    key: u32,
}

impl Axis for RacingDenial<'_> {
    fn reserve_n(&self, _n: u64) -> Result<Debit, Denied> {
        let other = self.pace.reserve(&self.key).unwrap().detach();
        drop(other); // the other request keeps its debit
        Err(self.pace.reserve_n(&self.key, 1000).unwrap_err())
    }

    fn refund(&self, _debit: Debit) -> Refunded {
        unreachable!("a denying pair holds no debit")
    }

    fn peek(&self) -> u64 {
        self.pace.peek(&self.key)
    }
}

#[test]
fn a_refund_after_another_debit_of_the_same_key_is_exact() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(5));
    let src: P<u32> = pace(&clock, 10, 10);
    let denied = pace::all()
        .with(&src, &7)
        .axis(Box::new(RacingDenial { pace: &src, key: 7 }), 1)
        .reserve()
        .unwrap_err();
    assert_eq!(denied.index, 1);
    // The other request's debit stays; ours (a hold) is returned exactly.
    assert_eq!(src.peek(&7), 9);
}

const THREADS: usize = 4;

/// Several threads reserve random (source, client id) pairs sharing keys,
/// keep some and refund the client id of others (as a token endpoint does on
/// `invalid_client`). Time stands still within a round and moves between
/// rounds, so every kept admission has an exact time. On every key of every
/// limit, over every window of rounds [a, b], the kept admissions are at most
/// capacity + (t_b - t_a) / interval.
#[test]
fn threaded_no_limit_over_admits() {
    const ROUNDS: usize = if cfg!(miri) { 8 } else { 120 };
    const TRIES: usize = if cfg!(miri) { 4 } else { 24 };
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(1));
    // Intervals: 1/8 s and 1/5 s.
    let src: Arc<P<u32>> = Arc::new(pace(&clock, 8, 6));
    let ids: Arc<P<String>> = Arc::new(pace(&clock, 5, 3));
    let src_interval = 125_000_000u64;
    let ids_interval = 200_000_000u64;
    let barrier = Arc::new(Barrier::new(THREADS + 1));

    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (src, ids, barrier) = (src.clone(), ids.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(t as u64 + 100);
                let mut kept_src: Vec<(usize, u32)> = Vec::new();
                let mut kept_ids: Vec<(usize, String)> = Vec::new();
                let mut denials = 0u64;
                for round in 0..ROUNDS {
                    barrier.wait();
                    let mut held = Vec::new();
                    for _ in 0..TRIES {
                        let s: u32 = rng.gen_range(0..3);
                        let id = format!("id-{}", rng.gen_range(0..3));
                        match pace::all()
                            .axis(Box::new((src.clone(), s)), 1)
                            .axis(Box::new((ids.clone(), id.clone())), 1)
                            .reserve()
                        {
                            Ok(h) => held.push((h, s, id)),
                            Err(_) => denials += 1,
                        }
                        // Settle some held ones in a random order.
                        while !held.is_empty() && rng.gen_bool(0.5) {
                            let i = rng.gen_range(0..held.len());
                            let (h, s, id) = held.swap_remove(i);
                            if rng.gen_bool(0.3) {
                                // invalid_client: the id is refunded, the
                                // source never.
                                h.refund_where(|i| i == 1);
                                kept_src.push((round, s));
                            } else {
                                drop(h);
                                kept_src.push((round, s));
                                kept_ids.push((round, id));
                            }
                        }
                    }
                    for (h, s, id) in held {
                        drop(h);
                        kept_src.push((round, s));
                        kept_ids.push((round, id));
                    }
                    barrier.wait();
                }
                (kept_src, kept_ids, denials)
            })
        })
        .collect();

    let mut rng = StdRng::seed_from_u64(7);
    let mut times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        times.push(clock.now().as_nanos() as u64);
        barrier.wait(); // round starts
        barrier.wait(); // round ends
                        // 0 to 300 ms, often 0 so that rounds pile up in one instant.
        let step = if rng.gen_bool(0.3) {
            0
        } else {
            rng.gen_range(0..300)
        };
        clock.advance(ms(step));
    }

    let mut src_counts: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut id_counts: HashMap<String, Vec<u64>> = HashMap::new();
    let mut denials = 0;
    for w in workers {
        let (ks, ki, d) = w.join().unwrap();
        denials += d;
        for (r, k) in ks {
            src_counts.entry(k).or_insert_with(|| vec![0; ROUNDS])[r] += 1;
        }
        for (r, k) in ki {
            id_counts.entry(k).or_insert_with(|| vec![0; ROUNDS])[r] += 1;
        }
    }
    assert!(denials > 0, "the limits were never reached");

    let mut tight = 0;
    let mut check = |name: &str, per_round: &[u64], capacity: u64, interval: u64| {
        for a in 0..ROUNDS {
            let mut count = 0;
            for b in a..ROUNDS {
                count += per_round[b];
                let bound = capacity + (times[b] - times[a]) / interval;
                assert!(
                    count <= bound,
                    "{name}: {count} kept admissions in rounds {a}..={b} \
                     ({} ns), bound {bound}",
                    times[b] - times[a]
                );
                if count == bound {
                    tight += 1;
                }
            }
        }
    };
    for (k, c) in &src_counts {
        check(&format!("source {k}"), c, 6, src_interval);
    }
    for (k, c) in &id_counts {
        check(&format!("client {k}"), c, 3, ids_interval);
    }
    assert!(
        tight > 0,
        "no window reached its bound: the test is too weak"
    );
}

/// Without concurrent traffic on the same key, a denial leaves no debit
/// behind: each thread owns its keys, exhausts its client id, and keeps
/// trying; its source bucket shows exactly the kept admissions, and once the
/// kept ones are refunded newest first, every bucket is full and every row
/// gone.
#[test]
fn threaded_a_denial_leaves_no_debit_behind() {
    const TRIES: u64 = if cfg!(miri) { 10 } else { 200 };
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(3));
    let src: Arc<P<u32>> = Arc::new(pace(&clock, 50, 50));
    let ids: Arc<P<String>> = Arc::new(pace(&clock, 5, 5));
    let workers: Vec<_> = (0..THREADS as u32)
        .map(|t| {
            let (src, ids) = (src.clone(), ids.clone());
            std::thread::spawn(move || {
                let id = format!("id-{t}");
                let mut kept = Vec::new();
                let mut denied = 0;
                for _ in 0..TRIES {
                    match pace::all()
                        .axis(Box::new((src.clone(), t)), 1)
                        .axis(Box::new((ids.clone(), id.clone())), 1)
                        .reserve()
                    {
                        Ok(h) => kept.push(h),
                        Err(d) => {
                            assert_eq!(d.index, 1);
                            denied += 1;
                        }
                    }
                }
                assert_eq!(kept.len(), 5);
                assert_eq!(denied, TRIES - 5);
                assert_eq!(src.peek(&t), 45, "denials left a debit on the source");
                assert_eq!(ids.peek(&id), 0);
                for h in kept.into_iter().rev() {
                    h.refund_all();
                }
                assert_eq!(src.peek(&t), 50);
                assert_eq!(ids.peek(&id), 5);
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(src.len(), 0);
    assert_eq!(ids.len(), 0);
}
