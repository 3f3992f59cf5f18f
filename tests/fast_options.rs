//! The fast options: `Builder::fast_hasher` (feature `foldhash`) and
//! `CoarseClock`, against the same exact outcomes as the defaults.
#![cfg(all(feature = "foldhash", feature = "quanta"))]

use std::hash::BuildHasher;
use std::time::Duration;

use pace::{CoarseClock, ManualClock, Pace, Rate};

#[test]
fn fast_hasher_limiter_admits_exactly_its_capacity_per_key() {
    let clock = ManualClock::new();
    let p: Pace<String, _, _> = Pace::builder(Rate::per_second(10).unwrap())
        .clock(clock.clone())
        .fast_hasher()
        .build()
        .unwrap();
    // 1,000 keys x 12 reserves at one instant: exactly 10 kept per key.
    let mut admitted = 0;
    for i in 0..1_000 {
        let k = format!("client-{i}");
        for _ in 0..12 {
            if let Ok(r) = p.reserve(k.as_str()) {
                let _kept = r.detach();
                admitted += 1;
            }
        }
    }
    assert_eq!(admitted, 10_000);
    assert_eq!(p.len(), 1_000);
    // 250 ms later each key has refilled exactly 2 tokens (one per 100 ms).
    clock.advance(Duration::from_millis(250));
    assert_eq!(p.peek("client-3"), 2);
    assert_eq!(p.peek("client-999"), 2);
    assert_eq!(p.peek("never-seen"), 10);
}

#[test]
fn fast_hashers_are_seeded_per_limiter() {
    let a = Pace::<u64>::builder(Rate::per_second(1).unwrap()).fast_hasher();
    let b = Pace::<u64>::builder(Rate::per_second(1).unwrap()).fast_hasher();
    let (a, b) = (a.build().unwrap(), b.build().unwrap());
    // Built through the builder, the two limiters hash with different seeds:
    // the same keys land on different hashes (equal only with chance 2^-64
    // per key; 8 keys all equal would mean one seed).
    let (ha, hb) = (a.hasher(), b.hasher());
    let differ = (0u64..8)
        .filter(|k| ha.hash_one(k) != hb.hash_one(k))
        .count();
    assert_eq!(differ, 8);
}

#[test]
fn coarse_clock_and_fast_hasher_together_decide_exactly() {
    let p: Pace<u64, _, _> = Pace::builder(Rate::new(1, Duration::from_secs(3600)).unwrap())
        .capacity(100)
        .clock(CoarseClock::new())
        .fast_hasher()
        .build()
        .unwrap();
    let kept = (0..250)
        .filter(|_| p.reserve(&1).map(|r| r.detach()).is_ok())
        .count();
    assert_eq!(kept, 100);
    assert_eq!(p.peek(&1), 0);
    assert_eq!(p.len(), 1);
}
