//! Every rule of the keyed limiter, one test each, on a hand-moved clock.

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::time::Duration;

use pace::internals::PaceInternals;
use pace::{ConfigError, DenyReason, ManualClock, Pace, Rate};

type P<K> = Pace<K, RandomState, ManualClock>;

/// Loop sizes, smaller under Miri.
const MANY: u64 = if cfg!(miri) { 100 } else { 5_000 };
const CHURN: u64 = if cfg!(miri) { 100 } else { 50_000 };

fn pace<K>(per_second: u64) -> (P<K>, ManualClock) {
    let clock = ManualClock::new();
    let p = Pace::builder(Rate::per_second(per_second).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    (p, clock)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn capacity_is_one_second_and_the_wait_is_exact() {
    let (p, clock) = pace::<u64>(5);
    clock.set(Duration::from_secs(10));
    assert_eq!(p.capacity(), 5);
    for _ in 0..5 {
        let _ = p.reserve(&1).unwrap();
    }
    let denied = p.reserve(&1).unwrap_err();
    assert_eq!(denied.reason(), DenyReason::Exhausted);
    assert_eq!(denied.retry_after(), ms(200));
    assert!(!denied.is_permanent());
    clock.advance(ms(199));
    assert_eq!(p.reserve(&1).unwrap_err().retry_after(), ms(1));
    clock.advance(ms(1));
    let _ = p.reserve(&1).unwrap();
    assert_eq!(p.reserve(&1).unwrap_err().retry_after(), ms(200));
}

#[test]
fn refill_is_continuous_and_never_beyond_capacity() {
    let (p, clock) = pace::<u64>(10);
    for _ in 0..10 {
        let _ = p.reserve(&7).unwrap();
    }
    assert_eq!(p.peek(&7), 0);
    clock.advance(ms(350));
    assert_eq!(p.peek(&7), 3);
    clock.advance(Duration::from_secs(3600));
    assert_eq!(
        p.peek(&7),
        10,
        "an hour of silence buys one second, not an hour"
    );
    for _ in 0..10 {
        let _ = p.reserve(&7).unwrap();
    }
    assert!(p.reserve(&7).is_err());
}

#[test]
fn a_denial_writes_nothing_and_creates_no_row() {
    let (p, clock) = pace::<u64>(2);
    clock.set(ms(1_000));
    let _a = p.reserve(&1).unwrap();
    let _b = p.reserve(&1).unwrap();
    let before = p.reserve(&1).unwrap_err();
    let again = p.reserve(&1).unwrap_err();
    assert_eq!(before, again, "the denial did not debit");
    assert_eq!(p.len(), 1);
    let never = p.reserve_n(&2, 3).unwrap_err();
    assert_eq!(never.reason(), DenyReason::ExceedsCapacity);
    assert_eq!(never.retry_after(), Duration::MAX);
    assert!(never.is_permanent());
    assert_eq!(p.len(), 1, "no row for a denied key");
    assert_eq!(p.peek(&2), 2);
}

#[test]
fn reserve_n_is_all_or_nothing() {
    let (p, clock) = pace::<u64>(4);
    clock.set(ms(5));
    let r = p.reserve_n(&1, 3).unwrap();
    assert_eq!(r.tokens(), 3);
    let d = p.reserve_n(&1, 2).unwrap_err();
    assert_eq!(d.retry_after(), ms(250));
    assert_eq!(p.peek(&1), 1);
    let _ = p.reserve_n(&1, 1).unwrap();
    assert_eq!(p.peek(&1), 0);
    let zero = p.reserve_n(&9, 0).unwrap();
    assert_eq!(zero.tokens(), 0);
    zero.refund();
    assert_eq!(p.len(), 1, "n = 0 touches nothing");
    let _ = p.reserve_n(&2, 4).unwrap();
}

#[test]
fn a_refunded_lone_reservation_leaves_no_row() {
    let (p, clock) = pace::<String>(3);
    clock.set(ms(77));
    let r = p.reserve("someone-else").unwrap();
    assert_eq!(p.len(), 1);
    r.refund();
    assert_eq!(p.len(), 0);
    assert_eq!(p.peek("someone-else"), 3);
    // Also when part of it has drained before the refund.
    let r = p.reserve("someone-else").unwrap();
    clock.advance(ms(100));
    r.refund();
    assert_eq!(p.len(), 0);
}

#[test]
fn a_refund_returns_only_what_has_not_drained() {
    let (p, clock) = pace::<u64>(4); // one token per 250 ms
    let _a = p.reserve_n(&1, 2).unwrap(); // debit [0, 500ms)
    let b = p.reserve_n(&1, 2).unwrap(); // debit [500ms, 1000ms)
    assert_eq!(p.peek(&1), 0);
    clock.set(ms(600)); // a has drained; b has 400 ms left
    assert_eq!(p.peek(&1), 2, "600 ms of 1000 ms refilled: 2.4 tokens");
    b.refund();
    // 400 ms returned: debt 0, bucket full, row removed.
    assert_eq!(p.peek(&1), 4);
    assert_eq!(p.len(), 0);
}

#[test]
fn a_late_refund_mints_nothing() {
    let (p, clock) = pace::<u64>(2); // one token per 500 ms
    let early = p.reserve(&1).unwrap(); // debit ends at 500 ms
    clock.set(ms(500));
    let _late = p.reserve(&1).unwrap(); // from a bucket at 2 - 0 = 2... ends at 1000
    let _late2 = p.reserve(&1).unwrap(); // ends at 1500
    assert_eq!(p.peek(&1), 0);
    early.refund(); // its own debit ended at 500 ms: nothing left to return
    assert_eq!(p.peek(&1), 0);
    assert_eq!(p.reserve(&1).unwrap_err().retry_after(), ms(500));
}

#[test]
fn a_refund_onto_a_swept_row_creates_nothing() {
    let (p, clock) = pace::<u64>(2);
    let r = p.reserve(&5).unwrap();
    clock.advance(p.horizon());
    assert_eq!(p.sweep(), 1);
    assert_eq!(p.len(), 0);
    r.refund();
    assert_eq!(p.len(), 0);
    assert_eq!(p.peek(&5), 2);
}

#[test]
fn dropping_a_reservation_keeps_the_debit() {
    let (p, _clock) = pace::<u64>(2);
    drop(p.reserve(&1).unwrap());
    assert_eq!(p.peek(&1), 1);
    assert_eq!(p.len(), 1);
}

#[test]
fn a_clock_that_steps_back_mints_nothing() {
    let (p, clock) = pace::<u64>(2);
    clock.set(Duration::from_secs(100));
    let _ = p.reserve_n(&1, 2).unwrap(); // full again at 101 s
    clock.set(Duration::from_secs(50));
    assert_eq!(p.peek(&1), 0);
    let d = p.reserve(&1).unwrap_err();
    assert_eq!(d.retry_after(), Duration::from_millis(50_500));
    clock.set(Duration::ZERO);
    assert_eq!(p.peek(&1), 0);
    // Back at the original time, the bucket refills exactly as before.
    clock.set(Duration::from_millis(100_500));
    assert_eq!(p.peek(&1), 1);
}

#[test]
fn time_driven_sweeps_resume_after_the_clock_steps_back() {
    let (p, clock) = pace::<u64>(1);
    clock.set(Duration::from_secs(1_000));
    let _ = p.reserve(&1).unwrap(); // sweep due at 1_001 s
    clock.set(Duration::from_secs(10));
    let _ = p.reserve(&2).unwrap(); // due time far ahead: re-armed at 11 s
    clock.set(Duration::from_secs(12));
    let _ = p.reserve(&3).unwrap(); // sweeps: row 2 full since 11 s; row 1 is not
    let mut keys = p.row_keys();
    keys.sort_unstable();
    assert_eq!(keys, vec![1, 3]);
}

#[test]
fn a_clock_far_ahead_is_a_typed_permanent_denial() {
    let (p, clock) = pace::<u64>(2);
    clock.set(Duration::from_secs(147 * 365 * 86_400));
    let d = p.reserve(&1).unwrap_err();
    assert_eq!(d.reason(), DenyReason::TimeExhausted);
    assert!(d.is_permanent());
    assert_eq!(p.len(), 0);
    clock.set(Duration::MAX);
    assert_eq!(
        p.reserve(&1).unwrap_err().reason(),
        DenyReason::TimeExhausted
    );
    assert_eq!(p.peek(&1), 2);
}

#[test]
fn the_horizon_sweep_removes_rows_that_refilled() {
    let (p, clock) = pace::<u64>(10);
    for k in 0..100 {
        let _ = p.reserve(&k).unwrap();
    }
    assert_eq!(p.len(), 100);
    clock.advance(p.horizon());
    let _ = p.reserve(&1_000).unwrap(); // the first call past the horizon sweeps
    assert_eq!(p.row_keys(), vec![1_000]);
    assert_eq!(p.len(), 1);
}

#[test]
fn a_doubling_sweep_removes_full_rows_before_the_horizon() {
    let clock = ManualClock::new();
    // One token per 500 s, capacity 2: horizon 1000 s, a row is full 500 s
    // after a single reserve.
    let p: P<u64> = Pace::builder(Rate::new(1, Duration::from_secs(500)).unwrap())
        .capacity(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(p.horizon(), Duration::from_secs(1_000));
    for k in 0..100 {
        let _ = p.reserve(&k).unwrap();
    }
    clock.set(Duration::from_secs(500));
    for k in 100..200 {
        let _ = p.reserve(&k).unwrap();
    }
    // The row count reached 128 = 2 x 64 on key 127: that pass removed the
    // 100 full rows; no later pass was due.
    let mut keys = p.row_keys();
    keys.sort_unstable();
    assert_eq!(keys, (100..200).collect::<Vec<_>>());
    assert_eq!(p.len(), 100);
}

#[test]
fn the_table_grows_and_shrinks_back_without_losing_state() {
    let clock = ManualClock::new();
    let p: P<u64> = Pace::builder(Rate::per_second(4).unwrap())
        .clock(clock.clone())
        .min_slots(4)
        .build()
        .unwrap();
    assert_eq!(p.table_slots(), 4);
    for k in 0..MANY {
        let _ = p.reserve(&k).unwrap();
    }
    assert_eq!(p.len(), MANY as usize);
    // Grown to hold every row within its claim limit: 13/16 of an array of
    // 64 cells or more (DESIGN.md §2).
    assert!(
        p.table_slots() as u64 * 13 / 16 >= MANY,
        "{}",
        p.table_slots()
    );
    for k in 0..MANY {
        assert_eq!(p.peek(&k), 3, "key {k} kept its debit through migrations");
    }
    let keys: HashSet<u64> = p.row_keys().into_iter().collect();
    assert_eq!(keys.len(), MANY as usize);
    clock.advance(p.horizon());
    assert_eq!(p.sweep(), MANY as usize);
    assert_eq!(p.len(), 0);
    assert_eq!(p.table_slots(), 4, "shrinks back to the minimum");
}

#[test]
fn churn_of_refunded_keys_keeps_the_table_small() {
    let (p, _clock) = pace::<String>(3);
    let start = p.table_slots();
    for i in 0..CHURN {
        let key = format!("claimed-{i}");
        p.reserve(&key).unwrap().refund();
    }
    assert_eq!(p.len(), 0);
    assert_eq!(p.table_slots(), start, "tombstones are compacted in place");
}

#[test]
fn borrowed_keys_find_owned_rows() {
    let (p, _clock) = pace::<String>(2);
    let owned = String::from("client-1");
    let _ = p.reserve(owned.as_str()).unwrap();
    let _ = p.reserve(&owned).unwrap();
    assert_eq!(p.peek("client-1"), 0);
    assert_eq!(p.len(), 1);
}

#[test]
fn builder_errors_are_typed() {
    let r = Rate::per_second(10).unwrap();
    assert_eq!(
        Pace::<u64>::builder(r).capacity(0).build().err(),
        Some(ConfigError::ZeroCapacity)
    );
    let slow = Rate::new(1, Duration::from_secs(86_400 * 365)).unwrap();
    assert_eq!(
        Pace::<u64>::builder(slow).capacity(1_000).build().err(),
        Some(ConfigError::CapacityTooLarge)
    );
    assert!(Pace::<u64>::builder(slow).capacity(10).build().is_ok());
    let p = Pace::<u64>::builder(r).capacity(25).build().unwrap();
    assert_eq!(p.capacity(), 25);
    assert_eq!(p.horizon(), Duration::from_millis(2_500));
    assert_eq!(
        Pace::<u64>::new(Rate::new(100, Duration::from_secs(60)).unwrap()).capacity(),
        1
    );
}

/// A slot count no array can have is a typed error from `build`, not a
/// panic (or an abort) inside it.
#[test]
#[cfg(target_pointer_width = "64")]
fn min_slots_beyond_any_array_is_a_typed_error() {
    let r = Rate::per_second(10).unwrap();
    for slots in [
        usize::MAX,    // rounding up to a power of two overflows
        (1 << 59) + 1, // rounds to 2^60 slots: 2^63 bytes, beyond isize::MAX
        1 << 62,       // a power of two whose byte size overflows
        usize::MAX / 2 + 2,
    ] {
        assert_eq!(
            Pace::<u64>::builder(r).min_slots(slots).build().err(),
            Some(ConfigError::MinSlotsTooLarge),
            "min_slots({slots})"
        );
    }
    // An array the allocator refuses (2^59 slots, 4 EiB) is the same error
    // (Miri stops on such a request instead of refusing it).
    #[cfg(not(miri))]
    assert_eq!(
        Pace::<u64>::builder(r).min_slots(1 << 59).build().err(),
        Some(ConfigError::MinSlotsTooLarge)
    );
    assert!(!ConfigError::MinSlotsTooLarge.to_string().is_empty());
    for (slots, kept) in [(0, 4), (5, 8), (1 << 12, 1 << 12)] {
        let p = Pace::<u64>::builder(r).min_slots(slots).build().unwrap();
        assert_eq!(p.table_slots(), kept, "min_slots({slots})");
    }
}

#[test]
fn handles_are_thread_safe() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Pace<String>>();
    send_sync::<P<u64>>();
    send::<pace::Reservation<'static, String, str>>();
    let e: Box<dyn std::error::Error + Send + Sync> = Box::new(ConfigError::ZeroRate);
    assert!(!e.to_string().is_empty());
    let (p, _c) = pace::<u64>(1);
    let _ = p.reserve(&1).unwrap();
    let d: Box<dyn std::error::Error> = Box::new(p.reserve(&1).unwrap_err());
    assert!(d.to_string().contains("retry after"));
}
